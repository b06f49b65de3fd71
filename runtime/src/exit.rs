//! The exit codes of the `runtime` binary (BSD `sysexits`), shared with the examples so that
//! every program of the project means the same by each.

/// A usage or configuration error (`EX_USAGE`).
pub const USAGE: i32 = 64;
/// `runtime send`: the recipient was removed from the hub (`EX_NOUSER`: addressee unknown);
/// nothing was sent.
pub const NO_USER: i32 = 67;
/// NATS cannot be reached or refuses a request (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: i32 = 69;
/// An internal failure (`EX_SOFTWARE`).
pub const SOFTWARE: i32 = 70;
/// An output file cannot be written (`EX_CANTCREAT`): `runtime render-config`.
pub const CANT_CREATE: i32 = 73;
/// `runtime delegate --wait`/`--resume`: the task waits for an answer; its waiting result was
/// printed, and the line on stderr says how to answer (`EX_TEMPFAIL`: the task is not
/// finished; resume it after answering).
/// `runtime send`: a refusal for a limit (`inbox_full`, `rate_limited`) holds the DM back for
/// the seconds the line on stderr names; nothing was sent.
pub const WAITING: i32 = 75;
