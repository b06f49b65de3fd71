//! Fault injection: crash a named actor on purpose, at a chosen point, a chosen number of times.
//!
//! Actors call [`check`] at the top of `pre_start` and `handle`:
//!
//! ```ignore
//! async fn handle(&self, myself: ActorRef<Self::Msg>, msg: Self::Msg, state: &mut Self::State)
//!     -> Result<(), ActorProcessingErr>
//! {
//!     actors::fault::check(&self.name, FaultPoint::Handle)?;
//!     // ...
//! }
//! ```
//!
//! Tests (and crash tests of the `runtime` binary) then [`arm`] a fault for an actor name:
//! the next `times` checks of that name and point either panic ([`Fault::Panic`]) or return
//! [`FaultError::Injected`] ([`Fault::Error`]).
//!
//! The registry is process-global and keyed by actor name and point, so parallel tests that use
//! different actor names do not interfere with each other.
//!
//! The hook is compiled only under `cfg(test)` or with the `fault-injection` feature. Without
//! them, the same functions exist as inlined no-ops ([`check`] always returns `Ok(())`), so call
//! sites need no `cfg` of their own.

use std::fmt;

/// Where in an actor's life a fault is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPoint {
    /// At the top of `Actor::pre_start`: makes the (re)start itself fail.
    PreStart,
    /// At the top of `Actor::handle`: makes the handling of the next message fail.
    Handle,
    /// In an attempt, right after the stream confirmed its result and before its input is
    /// acked: the result is stored, its ack is not (as when a broker crash loses the ack).
    ResultConfirmed,
    /// In the expiry actor, once it took the advisory of a DM to dead-letter and before it
    /// copies the DM: the advisory is taken, nothing is stored yet.
    DeadLetter,
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultPoint::PreStart => "pre_start",
            FaultPoint::Handle => "handle",
            FaultPoint::ResultConfirmed => "result_confirmed",
            FaultPoint::DeadLetter => "dead_letter",
        })
    }
}

/// How an armed fault manifests when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// [`check`] panics (ractor turns the panic into an actor failure).
    Panic,
    /// [`check`] returns [`FaultError::Injected`].
    Error,
    /// The whole process aborts at once, as with `kill -9` (nothing is flushed): crash tests
    /// of the `runtime` binary arm it through [`arm_from_spec`].
    Exit,
}

/// The error returned by [`check`] when an armed [`Fault::Error`] fires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// A fault armed with [`arm`] fired.
    #[error("injected fault in actor '{actor}' at {point}")]
    Injected {
        /// Name of the actor the fault was armed for.
        actor: String,
        /// Point at which it fired.
        point: FaultPoint,
    },
}

#[cfg(any(test, feature = "fault-injection"))]
mod imp {
    use super::{Fault, FaultError, FaultPoint};
    use dashmap::DashMap;
    use std::sync::LazyLock;

    #[derive(Debug, Clone, Copy)]
    struct Armed {
        fault: Fault,
        remaining: u32,
    }

    static REGISTRY: LazyLock<DashMap<(String, FaultPoint), Armed>> = LazyLock::new(DashMap::new);

    pub fn arm(actor_name: &str, point: FaultPoint, fault: Fault, times: u32) {
        let key = (actor_name.to_owned(), point);
        if times == 0 {
            REGISTRY.remove(&key);
        } else {
            REGISTRY.insert(
                key,
                Armed {
                    fault,
                    remaining: times,
                },
            );
        }
    }

    pub fn disarm(actor_name: &str, point: FaultPoint) {
        REGISTRY.remove(&(actor_name.to_owned(), point));
    }

    pub fn disarm_all() {
        REGISTRY.clear();
    }

    pub fn remaining(actor_name: &str, point: FaultPoint) -> u32 {
        REGISTRY
            .get(&(actor_name.to_owned(), point))
            .map_or(0, |armed| armed.remaining)
    }

    pub fn check(actor_name: &str, point: FaultPoint) -> Result<(), FaultError> {
        let key = (actor_name.to_owned(), point);
        // Decrement under the shard lock, but act (possibly panic) only after releasing it.
        let fired = REGISTRY.remove_if_mut(&key, |_, armed| {
            armed.remaining = armed.remaining.saturating_sub(1);
            armed.remaining == 0
        });
        let fault = match fired {
            // The last remaining shot: the entry was removed.
            Some((_, armed)) => Some(armed.fault),
            // Either not armed, or armed with shots left (then it was decremented above).
            None => REGISTRY.get(&key).map(|armed| armed.fault),
        };
        match fault {
            None => Ok(()),
            Some(Fault::Panic) => panic!("injected panic in actor '{actor_name}' at {point}"),
            Some(Fault::Exit) => {
                eprintln!("injected exit in actor '{actor_name}' at {point}");
                std::process::abort()
            }
            Some(Fault::Error) => Err(FaultError::Injected {
                actor: actor_name.to_owned(),
                point,
            }),
        }
    }
}

#[cfg(not(any(test, feature = "fault-injection")))]
mod imp {
    use super::{Fault, FaultError, FaultPoint};

    #[inline]
    pub fn arm(_actor_name: &str, _point: FaultPoint, _fault: Fault, _times: u32) {}

    #[inline]
    pub fn disarm(_actor_name: &str, _point: FaultPoint) {}

    #[inline]
    pub fn disarm_all() {}

    #[inline]
    pub fn remaining(_actor_name: &str, _point: FaultPoint) -> u32 {
        0
    }

    #[inline]
    pub fn check(_actor_name: &str, _point: FaultPoint) -> Result<(), FaultError> {
        Ok(())
    }
}

/// The environment variable the `runtime` binary arms faults from (builds with the hook only):
/// see [`arm_from_spec`].
pub const FAULTS_ENV: &str = "RUNTIME_FAULTS";

/// A fault spec that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault spec {entry:?}: {reason} (expected <actor name>@<point>=<fault>[*<times>])")]
pub struct FaultSpecError {
    /// The entry that does not parse.
    pub entry: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a fault spec: entries separated by `;`, each `<actor name>@<point>=<fault>` with an
/// optional `*<times>` (default 1); points `pre_start`, `handle`, `result_confirmed`,
/// `dead_letter`; faults
/// `panic`, `error`, `exit`. For example `sys1/worker-w1.attempt.alice.t1@result_confirmed=exit`.
///
/// # Errors
/// [`FaultSpecError`] naming the first entry that does not parse.
pub fn parse_spec(spec: &str) -> Result<Vec<(String, FaultPoint, Fault, u32)>, FaultSpecError> {
    let mut out = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let fail = |reason| FaultSpecError {
            entry: entry.to_owned(),
            reason,
        };
        let (name, rest) = entry.rsplit_once('@').ok_or_else(|| fail("no @<point>"))?;
        let (point, fault) = rest.split_once('=').ok_or_else(|| fail("no =<fault>"))?;
        let (fault, times) = match fault.split_once('*') {
            Some((fault, times)) => (fault, times.parse().map_err(|_| fail("bad *<times>"))?),
            None => (fault, 1),
        };
        // The names are the enums' serde names (snake case).
        let point = by_name::<FaultPoint>(point).ok_or_else(|| fail("unknown point"))?;
        let fault = by_name::<Fault>(fault).ok_or_else(|| fail("unknown fault"))?;
        if name.is_empty() {
            return Err(fail("no actor name"));
        }
        out.push((name.to_owned(), point, fault, times));
    }
    Ok(out)
}

/// The unit variant of `T` whose serde name is `name`.
fn by_name<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    use serde::de::IntoDeserializer;
    T::deserialize(IntoDeserializer::<serde::de::value::Error>::into_deserializer(name)).ok()
}

/// Arms every fault of `spec` (see [`parse_spec`]). A no-op, after parsing, when the hook is
/// not compiled in.
///
/// # Errors
/// As [`parse_spec`].
pub fn arm_from_spec(spec: &str) -> Result<(), FaultSpecError> {
    for (name, point, fault, times) in parse_spec(spec)? {
        arm(&name, point, fault, times);
    }
    Ok(())
}

/// Whether the hook is compiled in (`cfg(test)` or the `fault-injection` feature).
///
/// When `false`, every function of this module is a no-op.
pub const ENABLED: bool = cfg!(any(test, feature = "fault-injection"));

/// Arms `fault` for the actor named `actor_name` at `point`, for the next `times` checks.
///
/// Replaces any fault already armed for that name and point; `times == 0` disarms it.
/// A no-op when the hook is not compiled in (see [`ENABLED`]).
#[inline]
pub fn arm(actor_name: &str, point: FaultPoint, fault: Fault, times: u32) {
    imp::arm(actor_name, point, fault, times);
}

/// Disarms the fault armed for `actor_name` at `point`, if any.
#[inline]
pub fn disarm(actor_name: &str, point: FaultPoint) {
    imp::disarm(actor_name, point);
}

/// Disarms every armed fault, for every actor name.
///
/// Beware in tests that run in parallel: this also disarms the faults of the other tests.
/// Prefer [`disarm`] with the names a test owns.
#[inline]
pub fn disarm_all() {
    imp::disarm_all();
}

/// How many more times the fault armed for `actor_name` at `point` will fire (0 if none is armed).
#[inline]
#[must_use]
pub fn remaining(actor_name: &str, point: FaultPoint) -> u32 {
    imp::remaining(actor_name, point)
}

/// Fires the fault armed for `actor_name` at `point`, if any shot remains, after using one up.
///
/// Always `Ok(())` when nothing is armed or when the hook is not compiled in.
///
/// # Errors
///
/// Returns [`FaultError::Injected`] when a [`Fault::Error`] is armed for this name and point.
///
/// # Panics
///
/// Panics when a [`Fault::Panic`] is armed for this name and point.
#[inline]
pub fn check(actor_name: &str, point: FaultPoint) -> Result<(), FaultError> {
    imp::check(actor_name, point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unarmed_check_is_ok() {
        assert_eq!(check("fault-test-unarmed", FaultPoint::Handle), Ok(()));
        assert_eq!(remaining("fault-test-unarmed", FaultPoint::Handle), 0);
    }

    #[test]
    fn error_fires_exactly_the_armed_number_of_times() {
        let name = "fault-test-error";
        arm(name, FaultPoint::PreStart, Fault::Error, 2);
        assert_eq!(remaining(name, FaultPoint::PreStart), 2);
        // Another point of the same actor is not affected.
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
        let expected = Err(FaultError::Injected {
            actor: name.to_owned(),
            point: FaultPoint::PreStart,
        });
        assert_eq!(check(name, FaultPoint::PreStart), expected);
        assert_eq!(remaining(name, FaultPoint::PreStart), 1);
        assert_eq!(check(name, FaultPoint::PreStart), expected);
        assert_eq!(remaining(name, FaultPoint::PreStart), 0);
        assert_eq!(check(name, FaultPoint::PreStart), Ok(()));
    }

    #[test]
    fn panic_fault_panics_then_is_used_up() {
        let name = "fault-test-panic";
        arm(name, FaultPoint::Handle, Fault::Panic, 1);
        let caught = std::panic::catch_unwind(|| check(name, FaultPoint::Handle));
        assert!(caught.is_err(), "an armed panic fault must panic");
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
    }

    #[test]
    fn arming_zero_times_and_disarm_remove_the_fault() {
        let name = "fault-test-disarm";
        arm(name, FaultPoint::Handle, Fault::Error, 3);
        arm(name, FaultPoint::Handle, Fault::Error, 0);
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
        arm(name, FaultPoint::Handle, Fault::Error, 3);
        disarm(name, FaultPoint::Handle);
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
    }

    #[test]
    fn specs_parse_and_bad_ones_are_named() {
        let parsed =
            parse_spec("sys1/worker-w.attempt.t1@result_confirmed=exit; a@handle=error*3").unwrap();
        assert_eq!(
            parsed,
            [
                (
                    "sys1/worker-w.attempt.t1".to_string(),
                    FaultPoint::ResultConfirmed,
                    Fault::Exit,
                    1
                ),
                ("a".to_string(), FaultPoint::Handle, Fault::Error, 3),
            ]
        );
        for bad in [
            "a",
            "a@handle",
            "a@nowhere=error",
            "a@handle=boom",
            "@handle=error",
            "a@handle=error*x",
        ] {
            let err = parse_spec(bad).unwrap_err();
            assert_eq!(err.entry, bad);
        }
    }

    #[test]
    fn error_message_is_lowercase_and_names_actor_and_point() {
        let err = FaultError::Injected {
            actor: "a".into(),
            point: FaultPoint::PreStart,
        };
        assert_eq!(err.to_string(), "injected fault in actor 'a' at pre_start");
    }
}
