//! Why a task body was refused.

use thiserror::Error;

use crate::wire_error::{WireError, WireErrorKind};

/// Why [`decode_task`](super::decode_task) refused a task body.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TaskError {
    /// The body is not valid JSON, or not a single JSON object.
    #[error("malformed task: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The body has a field this version does not know.
    #[error("unknown task field `{field}`")]
    UnknownField {
        /// The unknown field.
        field: String,
    },
    /// A required field is absent.
    #[error("missing task field `{field}`")]
    MissingField {
        /// The missing field.
        field: &'static str,
    },
    /// `version` is not [`TASK_VERSION`](super::TASK_VERSION).
    #[error("unsupported task version {found}")]
    WrongVersion {
        /// The version found.
        found: u64,
    },
    /// `text` is empty or only whitespace.
    #[error("task text is blank")]
    BlankText,
    /// A field has the wrong type or an invalid value.
    #[error("invalid task field `{field}`: {reason}")]
    InvalidField {
        /// The invalid field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl TaskError {
    /// The wire error to report this refusal with.
    pub fn to_wire(&self) -> WireError {
        let kind = match self {
            TaskError::MissingField { .. } => WireErrorKind::MissingField,
            _ => WireErrorKind::Malformed,
        };
        WireError::new(kind, self.to_string())
    }
}
