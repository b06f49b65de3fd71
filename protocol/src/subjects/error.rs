//! The error returned when a subject, stream or consumer name is rejected.

use thiserror::Error;

use crate::ids::IdError;

/// Why a subject or a JetStream name could not be parsed or validated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubjectError {
    /// The subject (or consumer name) does not start with the expected prefix.
    #[error("subject `{subject}` does not start with `{expected}`")]
    WrongPrefix {
        /// The prefix that was expected.
        expected: &'static str,
        /// The subject or name that was parsed.
        subject: String,
    },
    /// The subject has the wrong number of tokens after its prefix.
    #[error("subject `{subject}` has {found} tokens after its prefix, expected {expected}")]
    WrongTokenCount {
        /// The subject that was parsed.
        subject: String,
        /// The expected number of tokens, e.g. `"1"` or `"2 or 3"`.
        expected: &'static str,
        /// The number of tokens found.
        found: usize,
    },
    /// A fixed token of the subject has the wrong value.
    #[error("subject `{subject}` has `{found}` where `{expected}` was expected")]
    UnexpectedToken {
        /// The subject that was parsed.
        subject: String,
        /// The token that was expected.
        expected: &'static str,
        /// The token found instead.
        found: String,
    },
    /// A variable token (an identity, a key, a channel name) is invalid.
    #[error("invalid token in subject `{subject}`")]
    InvalidToken {
        /// The subject or name that was parsed.
        subject: String,
        /// What is wrong with the token.
        #[source]
        source: IdError,
    },
    /// A durable consumer name is invalid.
    #[error("invalid durable name `{name}`")]
    InvalidDurableName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: IdError,
    },
    /// A stream name is invalid.
    #[error("invalid stream name `{name}`")]
    InvalidStreamName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: IdError,
    },
}
