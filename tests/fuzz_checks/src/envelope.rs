//! The envelope codecs (`protocol::envelope`): the typed fast path against the [`serde_json::Value`] path,
//! round trips through both codecs, and the router's spliced re-encoding of a DM or broadcast.

use protocol::envelope::{decode, encode, Codec, Envelope, EnvelopeError, MAX_ENVELOPE_BYTES};
use protocol::routing::{route, DropReason, IngressView, RouteDecision};
use protocol::AgentId;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// A JSON payload read as an envelope ([`decode`] with [`Codec::Json`]).
///
/// Asserts that the typed fast path reads what the [`serde_json::Value`] path reads (same envelope, same
/// error), as does `Envelope`'s own `Deserialize`; that a decoded envelope names no field twice
/// (no `extra` key shadows `meta`, `body`, `meta.id`, `meta.from` or `meta.to`); and that it
/// encodes, in either codec, to bytes that decode to the same envelope and encode again to the
/// same bytes.
pub fn check_envelope_json(data: &[u8]) {
    check_envelope(data, Codec::Json);
    if let Ok(env) = decode(data, Codec::Json) {
        let derived: Envelope =
            serde_json::from_slice(data).expect("Envelope's Deserialize reads what decode reads");
        assert_eq!(derived, env, "Envelope's Deserialize and decode differ");
    }
}

/// A MessagePack payload read as an envelope ([`decode`] with [`Codec::MsgPack`]): the same
/// assertions as [`check_envelope_json`], except that an envelope nested deeper than JSON's
/// 128 levels (MessagePack takes 1024) need not read back from its JSON.
pub fn check_envelope_msgpack(data: &[u8]) {
    check_envelope(data, Codec::MsgPack);
}

fn check_envelope(data: &[u8], codec: Codec) {
    let decoded = decode(data, codec);
    assert_eq!(
        decoded,
        decode_by_value(data, codec),
        "the typed decode and the Value decode differ"
    );
    let Ok(env) = decoded else { return };
    for field in ["meta", "body"] {
        assert!(!env.extra.contains_key(field), "extra holds `{field}`");
    }
    for field in ["id", "from", "to"] {
        assert!(
            !env.meta.extra.contains_key(field),
            "meta.extra holds `{field}`"
        );
    }
    for out in [Codec::Json, Codec::MsgPack] {
        let bytes = match encode(&env, out) {
            Ok(bytes) => bytes,
            // Spellings grow (`1e5` is `100000.0` again): only a payload near the limit may.
            Err(EnvelopeError::TooLarge { .. }) if data.len() * 8 > MAX_ENVELOPE_BYTES => continue,
            Err(e) => panic!("a decoded envelope does not encode as {out}: {e}"),
        };
        let again = match decode(&bytes, out) {
            Ok(again) => again,
            // MessagePack nests deeper (rmp-serde: 1024 levels) than JSON does (128).
            Err(EnvelopeError::Malformed { reason, .. })
                if codec == Codec::MsgPack
                    && out == Codec::Json
                    && reason.starts_with("recursion limit exceeded") =>
            {
                continue
            }
            Err(e) => panic!("an encoded envelope does not decode as {out}: {e}"),
        };
        assert_eq!(again, env, "the envelope changed through {out}");
        assert_eq!(
            encode(&again, out).expect("it encoded once"),
            bytes,
            "encoding is not stable through {out}"
        );
    }
}

/// [`decode`] as the module documents it: the payload read as a [`serde_json::Value`], then
/// `Envelope::try_from`.
fn decode_by_value(payload: &[u8], codec: Codec) -> Result<Envelope, EnvelopeError> {
    if payload.len() > MAX_ENVELOPE_BYTES {
        return Err(EnvelopeError::TooLarge {
            size: payload.len(),
            max: MAX_ENVELOPE_BYTES,
        });
    }
    protocol::envelope::decode_value(payload, codec)
}

/// A JSON payload routed as a broadcast and as a DM from `alice`, where the router splices it
/// (decodes only `meta` and copies the rest as written: `protocol::envelope::spliced`).
///
/// Asserts that the router takes exactly what the whole decode takes, and that what it stores
/// decodes to the envelope the whole decode read, with `meta.from` the sender: no field of the
/// payload is lost, changed or added by the splice, and the stored `meta` names `from` once,
/// so readers that keep the first or the last of a key named twice read the same sender.
pub fn check_envelope_spliced(data: &[u8]) {
    let sender = AgentId::new("alice").expect("a valid agent id");
    let whole = decode(data, Codec::Json);
    for (subject, stored_subject) in [
        ("hub.pub.alice.news", "channel.news"),
        ("hub.pub.alice.inbox", ""),
    ] {
        let decision = route(&IngressView {
            subject,
            headers: &[],
            payload: data,
            ingress_seq: 1,
            status: None,
            now_ms: 0,
        });
        let mut env = match &whole {
            Ok(env) => env.clone(),
            Err(e) => {
                assert!(
                    matches!(
                        decision,
                        RouteDecision::Reject { .. }
                            | RouteDecision::Drop {
                                reason: DropReason::ApiReply
                            }
                    ),
                    "the whole decode refuses ({e}) what the router took on {subject}: {decision:?}"
                );
                continue;
            }
        };
        env.meta.from = Some(sender.clone());
        let dm = stored_subject.is_empty();
        let refused = env.meta.has_invalid_expires_at()
            || env.meta.expires_at() == Some(0)
            || (dm && env.meta.to.is_none());
        let (payload, codec, from, id) = match decision {
            RouteDecision::Broadcast {
                subject,
                payload,
                codec,
                from,
                id,
            } if !dm => {
                assert_eq!(subject, stored_subject);
                (payload, codec, from, id)
            }
            RouteDecision::Store {
                subject,
                payload,
                codec,
                from,
                id,
                ..
            } if dm => {
                let to = env.meta.to.as_ref().expect("a stored DM has a recipient");
                assert_eq!(subject, protocol::subjects::inbox(to));
                (payload, codec, from, id)
            }
            RouteDecision::Reject { .. } if refused => continue,
            other => panic!("routed on {subject} as {other:?}, refused: {refused}"),
        };
        assert!(!refused, "routed on {subject} what the router refuses");
        assert_eq!((codec, &from, &id), (Codec::Json, &sender, &env.meta.id));
        let stored = decode(&payload, Codec::Json)
            .unwrap_or_else(|e| panic!("the stored payload does not decode: {e}"));
        assert_eq!(stored, env, "the splice changed the envelope");
        let shape: Shape = serde_json::from_slice(&payload).expect("the stored payload is JSON");
        for (i, key) in shape.top.iter().enumerate() {
            assert!(!shape.top[..i].contains(key), "`{key}` stored twice");
        }
        let froms = shape.meta.iter().filter(|k| *k == "from").count();
        assert_eq!(froms, 1, "the stored meta names `from` {froms} times");
    }
}

/// The keys of a JSON object, unescaped and in order, and those of its `meta` object.
struct Shape {
    top: Vec<String>,
    meta: Vec<String>,
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        struct Top;
        impl<'de> Visitor<'de> for Top {
            type Value = Shape;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                let mut shape = Shape {
                    top: Vec::new(),
                    meta: Vec::new(),
                };
                while let Some(key) = map.next_key::<String>()? {
                    if key == "meta" {
                        shape.meta.extend(map.next_value::<Keys>()?.0);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                    shape.top.push(key);
                }
                Ok(shape)
            }
        }
        deserializer.deserialize_map(Top)
    }
}

/// The keys of a JSON object, unescaped and in order.
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Keys, D::Error> {
        struct Of;
        impl<'de> Visitor<'de> for Of {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        deserializer.deserialize_map(Of)
    }
}
