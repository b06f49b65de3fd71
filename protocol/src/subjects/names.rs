//! Validation of JetStream stream and durable consumer names.

use super::SubjectError;
use crate::ids::rules::{check, Charset};

/// Maximum length in bytes of a stream or durable consumer name.
pub const MAX_NAME_LEN: usize = 255;

/// Checks that `name` can be used as a durable consumer name.
///
/// A name must be non-empty, at most [`MAX_NAME_LEN`] bytes, and contain
/// no `.`, `*`, `>`, `/`, `\`, whitespace or control characters.
///
/// # Errors
///
/// Returns [`SubjectError::InvalidDurableName`] naming the first rule
/// `name` breaks.
pub fn validate_durable_name(name: &str) -> Result<(), SubjectError> {
    check(name, "durable name", MAX_NAME_LEN, Charset::NatsName, &[]).map_err(|source| {
        SubjectError::InvalidDurableName {
            name: name.to_owned(),
            source,
        }
    })
}

/// Checks that `name` can be used as a stream name.
///
/// Same rules as [`validate_durable_name`].
///
/// # Errors
///
/// Returns [`SubjectError::InvalidStreamName`] naming the first rule `name`
/// breaks.
pub fn validate_stream_name(name: &str) -> Result<(), SubjectError> {
    check(name, "stream name", MAX_NAME_LEN, Charset::NatsName, &[]).map_err(|source| {
        SubjectError::InvalidStreamName {
            name: name.to_owned(),
            source,
        }
    })
}
