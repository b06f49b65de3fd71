//! The error returned when a string is not a valid id or name.

use thiserror::Error;

/// Why a string was rejected as an id, a name or a subject token.
///
/// `kind` names what was being validated (`"agent id"`, `"channel name"`,
/// `"durable name"`, ...), so the message reads well on its own.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    /// The string is empty.
    #[error("{kind} is empty")]
    Empty {
        /// What was being validated.
        kind: &'static str,
    },
    /// The string is longer than `max` bytes.
    #[error("{kind} is {len} bytes long, the maximum is {max}")]
    TooLong {
        /// What was being validated.
        kind: &'static str,
        /// The maximum length in bytes.
        max: usize,
        /// The actual length in bytes.
        len: usize,
    },
    /// The string contains a character that is not allowed.
    #[error("{kind} contains invalid character {ch:?} at byte {index}")]
    InvalidChar {
        /// What was being validated.
        kind: &'static str,
        /// The first offending character.
        ch: char,
        /// Its byte offset in the string.
        index: usize,
    },
    /// The string is a reserved word for this kind.
    #[error("{kind} `{value}` is reserved")]
    Reserved {
        /// What was being validated.
        kind: &'static str,
        /// The rejected value.
        value: String,
    },
    /// The string starts with a prefix reserved for the hub's own ids
    /// ([`SYSTEM_ID_PREFIX`](crate::ids::SYSTEM_ID_PREFIX)).
    #[error("{kind} `{value}` starts with the reserved prefix `{prefix}`")]
    ReservedPrefix {
        /// What was being validated.
        kind: &'static str,
        /// The reserved prefix it starts with.
        prefix: &'static str,
        /// The rejected value.
        value: String,
    },
}

impl IdError {
    /// What was being validated, e.g. `"agent id"`.
    pub fn kind(&self) -> &'static str {
        match self {
            IdError::Empty { kind }
            | IdError::TooLong { kind, .. }
            | IdError::InvalidChar { kind, .. }
            | IdError::Reserved { kind, .. }
            | IdError::ReservedPrefix { kind, .. } => kind,
        }
    }
}
