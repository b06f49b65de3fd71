//! The error returned when an envelope cannot be decoded or encoded.

use thiserror::Error;

use super::Codec;
use crate::ids::IdError;

/// Why an envelope was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// The payload (or the encoded envelope) exceeds the size limit.
    #[error("envelope is {size} bytes, the maximum is {max}")]
    TooLarge {
        /// Size of the payload in bytes.
        size: usize,
        /// The limit, [`MAX_ENVELOPE_BYTES`](super::MAX_ENVELOPE_BYTES).
        max: usize,
    },
    /// The payload is not valid JSON or MessagePack.
    #[error("malformed {codec} envelope: {reason}")]
    Malformed {
        /// The codec the payload was decoded with.
        codec: Codec,
        /// The decoder's message.
        reason: String,
    },
    /// A required field is absent (or `null`).
    #[error("envelope is missing `{field}`")]
    MissingField {
        /// Dotted path of the field, e.g. `meta.id`.
        field: &'static str,
    },
    /// A known field has the wrong JSON type.
    #[error("envelope field `{field}` must be {expected}")]
    WrongType {
        /// Dotted path of the field; `envelope` for the top level.
        field: &'static str,
        /// The expected type, e.g. `a string`.
        expected: &'static str,
    },
    /// An id field is not a valid id.
    #[error("invalid envelope field `{field}`")]
    InvalidField {
        /// Dotted path of the field, e.g. `meta.to`.
        field: &'static str,
        /// What is wrong with the id.
        #[source]
        source: IdError,
    },
    /// The `Content-Type` header names a codec the hub does not speak.
    #[error("unsupported content type `{content_type}`")]
    UnsupportedContentType {
        /// The header value.
        content_type: String,
    },
    /// An `extra` map holds a key that is also a named field, so the encoded
    /// envelope would carry it twice.
    #[error("envelope extra fields contain `{field}`, which is a named field")]
    ConflictingField {
        /// Dotted path of the field, e.g. `meta.from`.
        field: &'static str,
    },
    /// The serializer failed.
    #[error("cannot encode envelope as {codec}: {reason}")]
    Encode {
        /// The codec the envelope was encoded with.
        codec: Codec,
        /// The serializer's message.
        reason: String,
    },
}
