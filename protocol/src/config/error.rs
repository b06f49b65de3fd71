//! The error returned when a delivery config is rejected.

use thiserror::Error;

/// Why a delivery config was rejected. Every variant but `Syntax` names the
/// offending key as a dotted path, e.g. `inbox.max_age_secs`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The text is not JSON, or not a JSON object.
    #[error("cannot parse delivery config: {reason}")]
    Syntax {
        /// The parser's message.
        reason: String,
    },
    /// A key that the config does not have.
    #[error("unknown key `{key}` in delivery config")]
    UnknownKey {
        /// Dotted path of the key.
        key: String,
    },
    /// A known key with a value of the wrong type.
    #[error("wrong type for `{key}` in delivery config: {reason}")]
    WrongType {
        /// Dotted path of the key.
        key: String,
        /// What was expected and found.
        reason: String,
    },
    /// A value of the right type that breaks a rule.
    #[error("invalid value for `{key}` in delivery config: {reason}")]
    Invalid {
        /// Dotted path of the key.
        key: String,
        /// The rule that is broken.
        reason: String,
    },
}
