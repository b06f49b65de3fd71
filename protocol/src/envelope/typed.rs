//! The fast path of [`decode`](super::decode): an envelope read straight into its types.
//!
//! Building a [`Value`] tree for the whole envelope and taking `meta` and its fields out of it
//! again cost a map node and a key string per field, most of a DM's decode in the inbox. This
//! path reads the top level and `meta` field by field instead, and only `body` and the fields
//! it does not know become [`Value`]s (decoded by [`Value`]'s own `Deserialize`, so they are
//! the same values).
//!
//! It takes only what the [`Value`] path would take, and makes the same envelope of it. It
//! gives up (`None`) on anything else, and [`decode`](super::decode) then decodes the payload
//! that way, which also says what is wrong:
//! - `meta` or `body` missing, `meta.id` missing or `null`, an id that is not a valid string;
//! - a field of the wrong type, a key that is not a string;
//! - a key that `serde_json` reads as a private marker (`$serde_json::private::…`);
//! - bytes that do not decode, or trailing bytes.
//!
//! A field named twice keeps its last value, as in the [`Value`] path; an earlier invalid one
//! gives up.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Codec, Envelope, Meta};
use crate::ids::{AgentId, MessageId};

/// `payload` decoded as an envelope in `codec`, or `None` when it is left to the [`Value`]
/// path (see the module's doc). The size is checked by the caller.
pub(super) fn decode(payload: &[u8], codec: Codec) -> Option<Envelope> {
    match codec {
        Codec::Json => {
            let mut de = serde_json::Deserializer::from_slice(payload);
            let env = de.deserialize_map(EnvelopeVisitor).ok()?;
            de.end().ok()?;
            Some(env)
        }
        Codec::MsgPack => {
            let mut rest = payload;
            let env = rmp_serde::Deserializer::new(&mut rest)
                .deserialize_map(EnvelopeVisitor)
                .ok()?;
            rest.is_empty().then_some(env)
        }
    }
}

/// A JSON `meta` object decoded as [`Meta::from_value`] would decode it, or `None` (see the
/// module's doc).
pub(super) fn meta_json(text: &str) -> Option<Meta> {
    let mut de = serde_json::Deserializer::from_str(text);
    let meta = de.deserialize_map(MetaVisitor).ok()?;
    de.end().ok()?;
    Some(meta)
}

/// The prefix of the keys `serde_json`'s [`Value`] reads as markers, not as fields.
pub(super) const PRIVATE_KEY: &str = "$serde_json::private::";

/// A map key: a string, as a [`Value`] map's keys are.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Key::checked(Cow::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Key::checked(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Key::checked(Cow::Owned(v))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Key<'de> {
    fn checked<E: de::Error>(key: Cow<'de, str>) -> Result<Key<'de>, E> {
        if key.starts_with(PRIVATE_KEY) {
            return Err(E::custom("a serde_json marker key"));
        }
        Ok(Key(key))
    }
}

/// An id field's value: a string, or `null`.
enum Text {
    Null,
    Str(String),
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl Visitor<'_> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or null")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::Str(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text::Str(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::Null)
            }
        }
        deserializer.deserialize_any(TextVisitor)
    }
}

/// `meta.from` or `meta.to`: `null` is none.
fn agent<E: de::Error>(text: Text) -> Result<Option<AgentId>, E> {
    match text {
        Text::Null => Ok(None),
        Text::Str(s) => AgentId::new(s).map(Some).map_err(E::custom),
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = Meta;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an envelope's meta")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Meta, A::Error> {
        let (mut id, mut from, mut to, mut extra) = (None, None, None, Map::new());
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "id" => match map.next_value()? {
                    Text::Str(s) => id = Some(MessageId::new(s).map_err(de::Error::custom)?),
                    Text::Null => return Err(de::Error::custom("meta.id is null")),
                },
                "from" => from = agent(map.next_value()?)?,
                "to" => to = agent(map.next_value()?)?,
                _ => {
                    extra.insert(key.into_owned(), map.next_value::<Value>()?);
                }
            }
        }
        Ok(Meta {
            id: id.ok_or_else(|| de::Error::missing_field("id"))?,
            from,
            to,
            extra,
        })
    }
}

impl<'de> DeserializeSeed<'de> for MetaVisitor {
    type Value = Meta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Meta, D::Error> {
        deserializer.deserialize_map(self)
    }
}

struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an envelope")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let (mut meta, mut body, mut extra) = (None, None, Map::new());
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "meta" => meta = Some(map.next_value_seed(MetaVisitor)?),
                // `null` counts as a body, as in the Value path.
                "body" => body = Some(map.next_value::<Value>()?),
                _ => {
                    extra.insert(key.into_owned(), map.next_value::<Value>()?);
                }
            }
        }
        Ok(Envelope {
            meta: meta.ok_or_else(|| de::Error::missing_field("meta"))?,
            body: body.ok_or_else(|| de::Error::missing_field("body"))?,
            extra,
        })
    }
}
