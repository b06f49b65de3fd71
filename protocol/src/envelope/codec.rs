//! The two wire encodings of an envelope.

use std::fmt;

use super::EnvelopeError;
use crate::headers::{CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK};

/// How an envelope is encoded on the wire, chosen by the `Content-Type`
/// header. JSON is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    /// `application/json`, or no `Content-Type` header.
    #[default]
    Json,
    /// `application/msgpack`, with named fields.
    MsgPack,
}

impl Codec {
    /// Picks the codec for a `Content-Type` header value.
    ///
    /// `None` and `application/json` give [`Codec::Json`];
    /// `application/msgpack` gives [`Codec::MsgPack`]. The media type is
    /// compared case-insensitively and parameters (`; charset=utf-8`) are
    /// ignored.
    ///
    /// # Errors
    ///
    /// Returns [`EnvelopeError::UnsupportedContentType`] for any other value.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Codec, EnvelopeError> {
        let Some(content_type) = content_type else {
            return Ok(Codec::Json);
        };
        let media_type = content_type.split(';').next().unwrap_or_default().trim();
        if media_type.eq_ignore_ascii_case(CONTENT_TYPE_JSON) {
            Ok(Codec::Json)
        } else if media_type.eq_ignore_ascii_case(CONTENT_TYPE_MSGPACK) {
            Ok(Codec::MsgPack)
        } else {
            Err(EnvelopeError::UnsupportedContentType {
                content_type: content_type.to_owned(),
            })
        }
    }

    /// The `Content-Type` header value of this codec.
    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Json => CONTENT_TYPE_JSON,
            Codec::MsgPack => CONTENT_TYPE_MSGPACK,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Codec::Json => "json",
            Codec::MsgPack => "msgpack",
        })
    }
}
