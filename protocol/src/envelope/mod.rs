//! The envelope every agent message travels in, and its two codecs.
//!
//! An envelope is `{"meta": {...}, "body": ...}`. The hub reads `meta.id`,
//! `meta.from`, `meta.to` and `meta.expires_at` (kept in `meta.extra`: [`Meta::expires_at`];
//! the router validates it on DMs and broadcasts); every other field, in `meta` or at the top level, is kept in an
//! `extra` map and written back untouched, so a router republishes what it does not
//! understand.
//!
//! ```
//! use protocol::envelope::{decode, encode, Codec};
//!
//! let env = decode(br#"{"meta":{"id":"m1","to":"bob","thread":"t"},"body":"hi"}"#, Codec::Json)
//!     .unwrap();
//! assert_eq!(env.meta.to.as_ref().unwrap().as_str(), "bob");
//! assert_eq!(env.meta.extra["thread"], "t");
//!
//! let bytes = encode(&env, Codec::MsgPack).unwrap();
//! assert_eq!(decode(&bytes, Codec::MsgPack).unwrap(), env);
//! ```

mod codec;
mod error;
mod spliced;
mod typed;

pub use codec::Codec;
pub use error::EnvelopeError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
pub(crate) use spliced::Decoded;

use crate::ids::{AgentId, IdError, MessageId};

/// The largest envelope, encoded, that is decoded or encoded (1 MiB).
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

/// A message on the hub: routing metadata plus an opaque body.
///
/// Deserializing goes through the same checks as [`decode`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
pub struct Envelope {
    /// Routing metadata.
    pub meta: Meta,
    /// The payload; the hub never looks inside.
    pub body: Value,
    /// Unknown top-level fields, kept so they survive a republish. Never
    /// contains `meta` or `body`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The metadata of an [`Envelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Unique id of the message, used for dedupe.
    pub id: MessageId,
    /// The sender. A router overwrites it with the identity of the ingress
    /// subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<AgentId>,
    /// The recipient of a direct message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<AgentId>,
    /// Unknown metadata fields, kept so they survive a republish. Never
    /// contains `id`, `from` or `to`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Envelope {
    /// An envelope with only an id and a body.
    pub fn new(id: MessageId, body: Value) -> Envelope {
        Envelope {
            meta: Meta::new(id),
            body,
            extra: Map::new(),
        }
    }

    /// Checks that no `extra` map shadows a named field.
    fn check_extra(&self) -> Result<(), EnvelopeError> {
        let conflicts = [
            (self.extra.contains_key("meta"), "meta"),
            (self.extra.contains_key("body"), "body"),
            (self.meta.extra.contains_key("id"), "meta.id"),
            (self.meta.extra.contains_key("from"), "meta.from"),
            (self.meta.extra.contains_key("to"), "meta.to"),
        ];
        match conflicts.into_iter().find(|(conflict, _)| *conflict) {
            Some((_, field)) => Err(EnvelopeError::ConflictingField { field }),
            None => Ok(()),
        }
    }
}

/// The `meta` field of an envelope's expiry, in unix milliseconds ([`Meta::expires_at`]).
pub const EXPIRES_AT_FIELD: &str = "expires_at";

impl Meta {
    /// Metadata with only an id.
    pub fn new(id: MessageId) -> Meta {
        Meta {
            id,
            from: None,
            to: None,
            extra: Map::new(),
        }
    }

    /// When the message stops being worth delivering, in unix milliseconds (`meta.expires_at`,
    /// when it is an unsigned integer; the router refuses a DM or broadcast whose
    /// `meta.expires_at` is anything else: [`Meta::has_invalid_expires_at`]).
    pub fn expires_at(&self) -> Option<u64> {
        self.extra.get(EXPIRES_AT_FIELD).and_then(Value::as_u64)
    }

    /// Whether `meta.expires_at` is present (and not `null`) but not an unsigned integer.
    pub fn has_invalid_expires_at(&self) -> bool {
        self.extra
            .get(EXPIRES_AT_FIELD)
            .is_some_and(|v| !v.is_null() && v.as_u64().is_none())
    }

    /// Sets (or clears) `meta.expires_at`.
    pub fn set_expires_at(&mut self, at_ms: Option<u64>) {
        match at_ms {
            Some(at) => self.extra.insert(EXPIRES_AT_FIELD.to_owned(), at.into()),
            None => self.extra.remove(EXPIRES_AT_FIELD),
        };
    }
}

/// Builds an envelope from a decoded JSON value, with typed errors.
impl TryFrom<Value> for Envelope {
    type Error = EnvelopeError;

    fn try_from(value: Value) -> Result<Envelope, EnvelopeError> {
        let mut top = object(value, "envelope")?;
        let meta = Meta::from_value(required(top.remove("meta"), "meta")?)?;
        let body = top
            .remove("body")
            .ok_or(EnvelopeError::MissingField { field: "body" })?;
        Ok(Envelope {
            meta,
            body,
            extra: top,
        })
    }
}

impl Meta {
    /// `meta`, checked as [`decode`] checks it.
    fn from_value(value: Value) -> Result<Meta, EnvelopeError> {
        let mut meta = object(value, "meta")?;
        let id = required(meta.remove("id"), "meta.id")?;
        let id = id_field(id, "meta.id", MessageId::new)?;
        let from = optional(meta.remove("from"), "meta.from")?;
        let to = optional(meta.remove("to"), "meta.to")?;
        Ok(Meta {
            id,
            from,
            to,
            extra: meta,
        })
    }
}

/// Decodes an envelope whose codec its `Content-Type` header value names: JSON when absent,
/// MessagePack for `application/msgpack`, and anything else refused with
/// [`EnvelopeError::UnsupportedContentType`]. Every reader of stored envelopes (router, inbox,
/// worker, tracker) uses this one rule.
///
/// # Errors
///
/// As [`Codec::from_content_type`] and [`decode`].
pub fn decode_with_content_type(
    payload: &[u8],
    content_type: Option<&str>,
) -> Result<Envelope, EnvelopeError> {
    decode(payload, Codec::from_content_type(content_type)?)
}

/// Decodes an envelope from a message payload.
///
/// # Errors
///
/// - [`EnvelopeError::TooLarge`] if `payload` exceeds
///   [`MAX_ENVELOPE_BYTES`] (checked before parsing);
/// - [`EnvelopeError::Malformed`] if it is not valid JSON / MessagePack;
/// - [`EnvelopeError::MissingField`], [`EnvelopeError::WrongType`] or
///   [`EnvelopeError::InvalidField`] if `meta`, `meta.id` or `body` is
///   missing, or a known field is not what it should be.
pub fn decode(payload: &[u8], codec: Codec) -> Result<Envelope, EnvelopeError> {
    check_size(payload.len())?;
    // Read straight into its types; anything out of the ordinary is read as a `Value`,
    // which also says what is wrong with it.
    match typed::decode(payload, codec) {
        Some(env) => Ok(env),
        None => decode_value(payload, codec),
    }
}

/// [`decode`] through a [`Value`]: what the typed path leaves, and the errors. Public for the
/// fuzz checks (`tests/fuzz_checks`), which hold the typed path to it; hosts call [`decode`].
///
/// # Errors
/// As [`decode`], but the size is not checked.
#[doc(hidden)]
pub fn decode_value(payload: &[u8], codec: Codec) -> Result<Envelope, EnvelopeError> {
    let malformed = |reason: String| EnvelopeError::Malformed { codec, reason };
    let value: Value = match codec {
        Codec::Json => serde_json::from_slice(payload).map_err(|e| malformed(e.to_string()))?,
        Codec::MsgPack => {
            let mut rest = payload;
            let value = rmp_serde::from_read(&mut rest).map_err(|e| malformed(e.to_string()))?;
            if !rest.is_empty() {
                return Err(malformed(format!("{} trailing bytes", rest.len())));
            }
            value
        }
    };
    Envelope::try_from(value)
}

/// Encodes an envelope as a message payload.
///
/// # Errors
///
/// - [`EnvelopeError::TooLarge`] if the encoded envelope exceeds
///   [`MAX_ENVELOPE_BYTES`];
/// - [`EnvelopeError::ConflictingField`] if an `extra` map holds the name of
///   a named field;
/// - [`EnvelopeError::Encode`] if the serializer fails.
pub fn encode(env: &Envelope, codec: Codec) -> Result<Vec<u8>, EnvelopeError> {
    env.check_extra()?;
    let encoded = match codec {
        Codec::Json => serde_json::to_vec(env).map_err(|e| e.to_string()),
        Codec::MsgPack => rmp_serde::to_vec_named(env).map_err(|e| e.to_string()),
    };
    let bytes = encoded.map_err(|reason| EnvelopeError::Encode { codec, reason })?;
    check_size(bytes.len())?;
    Ok(bytes)
}

fn check_size(size: usize) -> Result<(), EnvelopeError> {
    if size > MAX_ENVELOPE_BYTES {
        return Err(EnvelopeError::TooLarge {
            size,
            max: MAX_ENVELOPE_BYTES,
        });
    }
    Ok(())
}

fn object(value: Value, field: &'static str) -> Result<Map<String, Value>, EnvelopeError> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(EnvelopeError::WrongType {
            field,
            expected: "an object",
        }),
    }
}

/// A present, non-null value; `null` counts as missing.
fn required(value: Option<Value>, field: &'static str) -> Result<Value, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Err(EnvelopeError::MissingField { field }),
        Some(value) => Ok(value),
    }
}

fn optional(value: Option<Value>, field: &'static str) -> Result<Option<AgentId>, EnvelopeError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => id_field(value, field, AgentId::new).map(Some),
    }
}

fn id_field<T>(
    value: Value,
    field: &'static str,
    parse: fn(String) -> Result<T, IdError>,
) -> Result<T, EnvelopeError> {
    let Value::String(value) = value else {
        return Err(EnvelopeError::WrongType {
            field,
            expected: "a string",
        });
    };
    parse(value).map_err(|source| EnvelopeError::InvalidField { field, source })
}

#[cfg(test)]
mod tests;
