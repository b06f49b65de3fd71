//! The error kinds that may travel inside envelopes.
//!
//! [`WireErrorKind`] is the contract: its serialized names never change.
//! [`WireError::detail`] is human text and may change at any time.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::envelope::EnvelopeError;

/// What went wrong, as a stable snake_case name on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireErrorKind {
    /// The payload could not be decoded.
    Malformed,
    /// A required envelope field is absent.
    MissingField,
    /// `meta.to` is missing or not a valid identity.
    InvalidRecipient,
    /// The envelope exceeds the size limit.
    TooLarge,
    /// The `Content-Type` is not JSON or MessagePack.
    UnsupportedContentType,
    /// A replayed stored message was dropped by the replay guard.
    ReplayRejected,
    /// The sender may not do this.
    Unauthorized,
    /// No such task attempt.
    UnknownTaskAttempt,
    /// An answer to a question that is no longer pending.
    StaleAnswer,
    /// The result of a task exceeds the size limit.
    ResultTooLarge,
    /// The task was cancelled.
    Cancelled,
    /// The task's `expires_at` passed before a worker started it.
    Expired,
    /// The recipient's inbox holds as many DMs as it may; try again after `retry_after_secs`.
    InboxFull,
    /// The sender is over its rate (`sender_rate_per_min`); try again after `retry_after_secs`.
    RateLimited,
    /// The recipient was removed (`runtime agent remove`): a DM to it, or its attach, is
    /// refused until it is restored. Sending again does not help.
    RecipientDeleted,
    /// A bug or an infrastructure failure on the hub side.
    Internal,
    /// A kind this version does not know (sent by a newer peer). Serialized
    /// as `unknown`.
    #[serde(other)]
    Unknown,
}

impl WireErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [WireErrorKind; 17] = [
        WireErrorKind::Malformed,
        WireErrorKind::MissingField,
        WireErrorKind::InvalidRecipient,
        WireErrorKind::TooLarge,
        WireErrorKind::UnsupportedContentType,
        WireErrorKind::ReplayRejected,
        WireErrorKind::Unauthorized,
        WireErrorKind::UnknownTaskAttempt,
        WireErrorKind::StaleAnswer,
        WireErrorKind::ResultTooLarge,
        WireErrorKind::Cancelled,
        WireErrorKind::Expired,
        WireErrorKind::InboxFull,
        WireErrorKind::RateLimited,
        WireErrorKind::RecipientDeleted,
        WireErrorKind::Internal,
        WireErrorKind::Unknown,
    ];

    /// The wire name of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            WireErrorKind::Malformed => "malformed",
            WireErrorKind::MissingField => "missing_field",
            WireErrorKind::InvalidRecipient => "invalid_recipient",
            WireErrorKind::TooLarge => "too_large",
            WireErrorKind::UnsupportedContentType => "unsupported_content_type",
            WireErrorKind::ReplayRejected => "replay_rejected",
            WireErrorKind::Unauthorized => "unauthorized",
            WireErrorKind::UnknownTaskAttempt => "unknown_task_attempt",
            WireErrorKind::StaleAnswer => "stale_answer",
            WireErrorKind::ResultTooLarge => "result_too_large",
            WireErrorKind::Cancelled => "cancelled",
            WireErrorKind::Expired => "expired",
            WireErrorKind::InboxFull => "inbox_full",
            WireErrorKind::RateLimited => "rate_limited",
            WireErrorKind::RecipientDeleted => "recipient_deleted",
            WireErrorKind::Internal => "internal",
            WireErrorKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for WireErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as it travels in an envelope: a stable kind plus human text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{kind}: {detail}")]
pub struct WireError {
    /// What went wrong; match on this.
    pub kind: WireErrorKind,
    /// Human-readable detail; do not parse.
    #[serde(default)]
    pub detail: String,
}

impl WireError {
    /// A wire error of `kind` with `detail`.
    pub fn new(kind: WireErrorKind, detail: impl Into<String>) -> WireError {
        WireError {
            kind,
            detail: detail.into(),
        }
    }
}

impl From<&EnvelopeError> for WireError {
    fn from(error: &EnvelopeError) -> WireError {
        let kind = match error {
            EnvelopeError::TooLarge { .. } => WireErrorKind::TooLarge,
            EnvelopeError::MissingField { .. } => WireErrorKind::MissingField,
            EnvelopeError::InvalidField {
                field: "meta.to", ..
            } => WireErrorKind::InvalidRecipient,
            EnvelopeError::Malformed { .. }
            | EnvelopeError::WrongType { .. }
            | EnvelopeError::InvalidField { .. } => WireErrorKind::Malformed,
            EnvelopeError::UnsupportedContentType { .. } => WireErrorKind::UnsupportedContentType,
            EnvelopeError::ConflictingField { .. } | EnvelopeError::Encode { .. } => {
                WireErrorKind::Internal
            }
        };
        WireError::new(kind, crate::error_chain::ErrorChain(error).to_string())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::envelope::{decode, Codec};

    #[test]
    fn serialized_names_are_stable() {
        let expected = [
            "malformed",
            "missing_field",
            "invalid_recipient",
            "too_large",
            "unsupported_content_type",
            "replay_rejected",
            "unauthorized",
            "unknown_task_attempt",
            "stale_answer",
            "result_too_large",
            "cancelled",
            "expired",
            "inbox_full",
            "rate_limited",
            "recipient_deleted",
            "internal",
            "unknown",
        ];
        for (kind, name) in WireErrorKind::ALL.into_iter().zip(expected) {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(name));
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(
                serde_json::from_value::<WireErrorKind>(json!(name)).unwrap(),
                kind
            );
        }
    }

    #[test]
    fn unknown_kinds_deserialize_to_unknown() {
        let error: WireError =
            serde_json::from_value(json!({"kind": "quota_exceeded", "detail": "x", "extra": 1}))
                .unwrap();
        assert_eq!(error.kind, WireErrorKind::Unknown);
        assert_eq!(error.detail, "x");
        assert!(serde_json::from_value::<WireErrorKind>(json!(3)).is_err());
    }

    #[test]
    fn wire_error_shape() {
        let error = WireError::new(WireErrorKind::StaleAnswer, "question q1 was answered");
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            json!({"kind": "stale_answer", "detail": "question q1 was answered"})
        );
        assert_eq!(error.to_string(), "stale_answer: question q1 was answered");
    }

    #[test]
    fn envelope_errors_map_to_kinds() {
        let kind = |payload: &str| {
            WireError::from(&decode(payload.as_bytes(), Codec::Json).unwrap_err()).kind
        };
        assert_eq!(kind("{"), WireErrorKind::Malformed);
        assert_eq!(kind(r#"{"meta":{},"body":1}"#), WireErrorKind::MissingField);
        assert_eq!(
            kind(r#"{"meta":{"id":"m","to":"bo.b"},"body":1}"#),
            WireErrorKind::InvalidRecipient
        );
        assert_eq!(
            kind(r#"{"meta":{"id":"m","from":"a b"},"body":1}"#),
            WireErrorKind::Malformed
        );
        assert_eq!(
            kind(r#"{"meta":{"id":1},"body":1}"#),
            WireErrorKind::Malformed
        );
        let too_large = decode(
            &vec![b' '; crate::envelope::MAX_ENVELOPE_BYTES + 1],
            Codec::Json,
        )
        .unwrap_err();
        assert_eq!(WireError::from(&too_large).kind, WireErrorKind::TooLarge);
        let unsupported = Codec::from_content_type(Some("text/plain")).unwrap_err();
        let wire = WireError::from(&unsupported);
        assert_eq!(wire.kind, WireErrorKind::UnsupportedContentType);
        assert_eq!(wire.detail, "unsupported content type `text/plain`");
    }
}
