//! An envelope read for routing: a router that never reads a DM's or a broadcast's body
//! decodes only its `meta` and writes every other part back as it was written (JSON only).
//! Building the body as a [`Value`] and encoding it again was most of a DM's routing cost.
//!
//! What is kept is the same JSON, field for field: a reader sees the envelope that
//! [`decode`](super::decode) and [`encode`](super::encode) would have made, except that the
//! body's own text (its spacing, its number spellings) is untouched. Anything out of the
//! ordinary (a field named twice, an escaped field name, a `meta` that does not decode) is
//! left to the whole decode, which also says what is wrong with it. So is anything the whole
//! decode refuses that a [`RawValue`] takes (`serde_json` only skips over it): a number out
//! of `f64`'s range, nesting deeper than 128 levels, a lone surrogate; see [`Checked`].

use std::borrow::Cow;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{check_size, Codec, Envelope, EnvelopeError, Meta, MAX_ENVELOPE_BYTES};
use crate::ids::AgentId;

/// An envelope as a router holds it: whole, or spliced (its `meta` decoded, the rest as
/// written).
#[derive(Debug)]
pub(crate) enum Decoded<'a> {
    Whole(Envelope),
    Spliced(Spliced<'a>),
}

impl<'a> Decoded<'a> {
    /// `payload` in `codec`: spliced when `opaque` (its body is not read) and the payload
    /// allows it, else whole ([`super::decode`], whose error this returns).
    pub(crate) fn decode(
        payload: &'a [u8],
        codec: Codec,
        opaque: bool,
    ) -> Result<Decoded<'a>, EnvelopeError> {
        if opaque && codec == Codec::Json {
            if let Some(spliced) = Spliced::decode(payload) {
                return Ok(Decoded::Spliced(spliced));
            }
        }
        super::decode(payload, codec).map(Decoded::Whole)
    }

    pub(crate) fn meta(&self) -> &Meta {
        match self {
            Decoded::Whole(env) => &env.meta,
            Decoded::Spliced(s) => &s.meta,
        }
    }

    /// Names `from` as its sender (the router's, from the ingress subject): the only change
    /// a router makes to a `meta`.
    pub(crate) fn set_from(&mut self, from: AgentId) {
        match self {
            Decoded::Whole(env) => env.meta.from = Some(from),
            Decoded::Spliced(s) => s.meta.from = Some(from),
        }
    }

    /// The body (a spliced one decoded now; `null` if it does not decode, which cannot be:
    /// it was read as a [`Value`] reads it, [`Checked`]).
    pub(crate) fn body(&self) -> Cow<'_, Value> {
        match self {
            Decoded::Whole(env) => Cow::Borrowed(&env.body),
            Decoded::Spliced(s) => Cow::Owned(
                s.field("body")
                    .and_then(|raw| serde_json::from_str(raw.get()).ok())
                    .unwrap_or(Value::Null),
            ),
        }
    }

    /// Encoded in `codec` (a spliced envelope is JSON; [`super::encode`]'s errors).
    pub(crate) fn encode(&self, codec: Codec) -> Result<Vec<u8>, EnvelopeError> {
        match self {
            Decoded::Whole(env) => super::encode(env, codec),
            Decoded::Spliced(s) => s.encode(),
        }
    }
}

/// A JSON envelope's `meta`, decoded, and every top-level field as written, in order.
#[derive(Debug)]
pub(crate) struct Spliced<'a> {
    /// Changed only by [`Decoded::set_from`].
    meta: Meta,
    /// The `meta` as written, when no key of it can be `from`: it holds no `"from"` and no
    /// escape. Encoded, the router's `from` is then written first and the rest copied as it
    /// came, not encoded again (that was a fifth of a DM's routing).
    meta_as_written: Option<&'a str>,
    fields: Vec<(&'a str, &'a RawValue)>,
}

/// More top-level fields than this go to the whole decode (a router's check for a field
/// named twice is quadratic).
const MAX_FIELDS: usize = 16;

impl<'a> Spliced<'a> {
    /// `payload` spliced, or `None` when it is to be decoded whole (see the module's doc).
    fn decode(payload: &'a [u8]) -> Option<Spliced<'a>> {
        if payload.len() > MAX_ENVELOPE_BYTES {
            return None;
        }
        let TopLevel(fields) = serde_json::from_slice(payload).ok()?;
        let named_twice = fields
            .iter()
            .enumerate()
            .any(|(i, (name, _))| fields[..i].iter().any(|(other, _)| other == name));
        if fields.len() > MAX_FIELDS || named_twice {
            return None;
        }
        let find = |name: &str| fields.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let (meta, _body) = (find("meta")?, find("body")?);
        let meta_as_written = Some(meta.get())
            .filter(|m| m.starts_with('{') && !m.contains('\\') && !m.contains("\"from\""));
        let meta = super::typed::meta_json(meta.get())?;
        // Last: the one pass that reads every value.
        serde_json::from_slice::<Checked>(payload).ok()?;
        Some(Spliced {
            meta,
            meta_as_written,
            fields,
        })
    }

    fn field(&self, name: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// `{"meta": <meta>, ...the other fields as written}`.
    fn encode(&self) -> Result<Vec<u8>, EnvelopeError> {
        let encode_error = |e: serde_json::Error| EnvelopeError::Encode {
            codec: Codec::Json,
            reason: e.to_string(),
        };
        let room: usize = self
            .fields
            .iter()
            .map(|(n, v)| n.len() + v.get().len() + 4)
            .sum();
        let mut out = Vec::with_capacity(room + 64);
        out.extend_from_slice(br#"{"meta":"#);
        match (self.meta_as_written, &self.meta.from) {
            (Some(written), Some(from)) => {
                // `{"from":<from>`, then what followed the sender's `{` (`,` between them
                // unless that is the closing brace).
                let rest = &written[1..];
                out.extend_from_slice(br#"{"from":"#);
                serde_json::to_writer(&mut out, from.as_str()).map_err(encode_error)?;
                if !rest.trim_start().starts_with('}') {
                    out.push(b',');
                }
                out.extend_from_slice(rest.as_bytes());
            }
            (Some(written), None) => out.extend_from_slice(written.as_bytes()),
            (None, _) => serde_json::to_writer(&mut out, &self.meta).map_err(encode_error)?,
        }
        for (name, value) in self.fields.iter().filter(|(n, _)| *n != "meta") {
            out.push(b',');
            serde_json::to_writer(&mut out, name).map_err(encode_error)?;
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        out.push(b'}');
        check_size(out.len())?;
        Ok(out)
    }
}

/// A JSON object's fields, borrowed: a field whose name has an escape fails (`&str`).
struct TopLevel<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::with_capacity(4);
                while let Some(field) = map.next_entry::<&'de str, &'de RawValue>()? {
                    fields.push(field);
                }
                Ok(TopLevel(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// A JSON text read as [`Value`]'s `Deserialize` reads it, without building it: every value
/// through `deserialize_any`, so that `serde_json` parses each number (refusing one out of
/// `f64`'s range) and each string and key (refusing a lone surrogate), and counts the depth.
/// A [`RawValue`] is only skipped over, which takes all three.
///
/// The whole payload is read, not each field on its own: a field read alone would have 128
/// levels to itself, one more than it has in the envelope. A key that `serde_json` reads as a
/// private marker (`$serde_json::private::…`: a [`Value`] then reads the string that follows
/// as JSON text) is refused, which leaves the envelope to the whole decode. No scalar is
/// allocated: a string with escapes is read into the deserializer's own buffer.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<CheckedKey>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// A key of an object [`Checked`] reads: a string, and no `serde_json` marker.
struct CheckedKey;

impl<'de> Deserialize<'de> for CheckedKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(CheckedKey)
    }
}

impl<'de> Visitor<'de> for CheckedKey {
    type Value = CheckedKey;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<CheckedKey, E> {
        if key.starts_with(super::typed::PRIVATE_KEY) {
            return Err(E::custom("a serde_json marker key"));
        }
        Ok(CheckedKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{decode, encode};

    /// What the whole decode and re-encode would have stored, and what the splice stores,
    /// read back alike.
    fn same_as_whole(payload: &str) {
        let mut spliced = Decoded::Spliced(Spliced::decode(payload.as_bytes()).expect("spliced"));
        let mut whole = decode(payload.as_bytes(), Codec::Json).unwrap();
        let from = crate::AgentId::new("alice").unwrap();
        spliced.set_from(from.clone());
        whole.meta.from = Some(from);
        let stored = spliced.encode(Codec::Json).unwrap();
        assert_eq!(
            decode(&stored, Codec::Json).unwrap(),
            decode(&encode(&whole, Codec::Json).unwrap(), Codec::Json).unwrap(),
            "{payload}"
        );
    }

    #[test]
    fn a_spliced_envelope_reads_back_as_the_whole_one_would() {
        same_as_whole(r#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#);
        // The sender's own `from` is replaced; unknown fields and their order survive.
        same_as_whole(
            r#"{"x":[1,2,{"y":null}],"meta":{"thread":"t","from":"mallory","id":"m2","to":"bob","expires_at":17},"body":{"a":1.5,"b":[true]},"z":"\u00e9"}"#,
        );
        same_as_whole(r#" { "body" : null , "meta" : { "id" : "m3" } } "#);
    }

    /// `payload` routed (spliced, sent by alice) and encoded again.
    fn routed(payload: &str) -> String {
        let mut decoded = Decoded::decode(payload.as_bytes(), Codec::Json, true).unwrap();
        assert!(matches!(decoded, Decoded::Spliced(_)), "{payload}");
        decoded.set_from(crate::AgentId::new("alice").unwrap());
        String::from_utf8(decoded.encode(Codec::Json).unwrap()).unwrap()
    }

    #[test]
    fn a_meta_with_no_from_is_copied_as_written_after_the_router_s_from() {
        assert_eq!(
            routed(r#"{"meta":{ "id":"m1","to":"bob","thread":"t 1" },"body":"hi"}"#),
            r#"{"meta":{"from":"alice", "id":"m1","to":"bob","thread":"t 1" },"body":"hi"}"#
        );
        assert_eq!(
            routed(r#"{"body":1,"meta":{"id":"m1"}}"#),
            r#"{"meta":{"from":"alice","id":"m1"},"body":1}"#
        );
    }

    #[test]
    fn a_meta_that_may_name_a_from_is_written_anew_with_only_the_router_s() {
        for payload in [
            r#"{"meta":{"id":"m1","from":"mallory"},"body":1}"#,
            r#"{"meta":{"id":"m1","from":null},"body":1}"#,
            r#"{"meta":{"id":"m1","\u0066rom":"mallory"},"body":1}"#,
            r#"{"meta":{"id":"m1","x":"\"from\""},"body":1}"#,
            r#"{"meta":{"id":"m1","x":"\u00e9"},"body":1}"#,
        ] {
            let out = routed(payload);
            let value: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(value["meta"]["from"], "alice", "{payload}");
            // One `from` only: a reader that keeps the first of a key named twice, and one that
            // keeps the last, read the same sender.
            assert_eq!(out.matches(r#""from":"#).count(), 1, "{out}");
            assert!(
                out.starts_with(r#"{"meta":{"id":"m1","from":"alice""#),
                "{out}"
            );
        }
    }

    #[test]
    fn anything_unusual_is_left_to_the_whole_decode() {
        for payload in [
            // A field named twice, at the top or escaped.
            r#"{"meta":{"id":"m1"},"body":1,"body":2}"#,
            r#"{"meta":{"id":"m1"},"bod\u0079":1}"#,
            // No body, no meta, a meta that does not decode, not an object.
            r#"{"meta":{"id":"m1"}}"#,
            r#"{"body":1}"#,
            r#"{"meta":{"id":""},"body":1}"#,
            r#"{"meta":null,"body":1}"#,
            r#"[1,2]"#,
            r#"{"meta":{"id":"m1"},"body":1"#,
            // A key `serde_json` reads as its marker: a `Value` reads the string as JSON text.
            r#"{"meta":{"id":"m1"},"body":{"$serde_json::private::RawValue":"[1]"}}"#,
        ] {
            assert!(Spliced::decode(payload.as_bytes()).is_none(), "{payload}");
        }
    }

    /// Asserts that the router's decode of `payload` (a DM's or a broadcast's, spliced) refuses
    /// it exactly when the whole decode does, with the whole decode's error, and that what it
    /// takes it splices and stores as the whole decode reads it. Whether it took it.
    fn splices_as_the_whole_decode_reads(payload: &str) -> bool {
        let routed = Decoded::decode(payload.as_bytes(), Codec::Json, true);
        match decode(payload.as_bytes(), Codec::Json) {
            Ok(_) => {
                assert!(
                    matches!(routed, Ok(Decoded::Spliced(_))),
                    "not spliced: {payload}"
                );
                same_as_whole(payload);
                true
            }
            Err(whole) => {
                assert!(
                    matches!(
                        whole,
                        EnvelopeError::Malformed {
                            codec: Codec::Json,
                            ..
                        }
                    ),
                    "{whole:?}: {payload}"
                );
                match routed {
                    Err(error @ EnvelopeError::Malformed { .. }) => assert_eq!(error, whole),
                    other => panic!(
                        "the whole decode refuses ({whole}) what the splice takes: {other:?}: {payload}"
                    ),
                }
                false
            }
        }
    }

    #[test]
    fn a_splice_refuses_what_the_whole_decode_refuses() {
        let arrays = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = |depth: usize| format!("{}1{}", r#"{"k":"#.repeat(depth), "}".repeat(depth));
        let envelope = |body: &str| format!(r#"{{"meta":{{"id":"m"}},"body":{body}}}"#);
        let refused = [
            // A number out of f64's range, in the body, deep in it, or in another kept field.
            envelope("157e308"),
            envelope("1e400"),
            envelope("-1.8e308"),
            envelope(r#"[1,{"a":1e400}]"#),
            r#"{"meta":{"id":"m"},"body":1,"x":1e400}"#.to_owned(),
            r#"{"x":[1e400],"meta":{"id":"m"},"body":1}"#.to_owned(),
            // Deeper than 128 levels, the envelope's own object counted.
            envelope(&arrays(127)),
            envelope(&arrays(200)),
            envelope(&objects(127)),
            format!(r#"{{"meta":{{"id":"m"}},"body":1,"x":{}}}"#, arrays(127)),
            format!(r#"{{"meta":{{"id":"m","x":{}}},"body":1}}"#, arrays(126)),
            // A lone surrogate, high or low, in a string or in a key.
            envelope(r#""\ud800x""#),
            envelope(r#""\udc00""#),
            envelope(r#""\ud800\u0041""#),
            envelope(r#"{"a\ud800":1}"#),
            r#"{"meta":{"id":"m"},"body":1,"x":["\udfff"]}"#.to_owned(),
            // What `Value` reads as a `RawValue`'s text, here no JSON number.
            envelope(r#"{"$serde_json::private::RawValue":"1e400"}"#),
        ];
        for payload in &refused {
            assert!(
                !splices_as_the_whole_decode_reads(payload),
                "taken: {payload}"
            );
        }
        let taken = [
            envelope(&arrays(100)),
            envelope(&arrays(126)),
            envelope(&objects(126)),
            format!(r#"{{"meta":{{"id":"m","x":{}}},"body":1}}"#, arrays(125)),
            envelope("1.7976931348623157e308"),
            envelope("[-1.7976931348623157e308,5e-324,1e-400,18446744073709551616]"),
            envelope(r#""\ud83d\ude00""#),
            envelope(r#"{"\ud83d\ude00":["\u00e9\n"]}"#),
            r#"{"meta":{"id":"m"},"body":1,"x":"\udbff\udfff"}"#.to_owned(),
        ];
        for payload in &taken {
            assert!(
                splices_as_the_whole_decode_reads(payload),
                "refused: {payload}"
            );
        }
    }

    #[test]
    fn a_spliced_envelope_still_has_its_body() {
        let payload = br#"{"meta":{"id":"m1"},"body":{"k":[1,"two"]}}"#;
        let decoded = Decoded::decode(payload, Codec::Json, true).unwrap();
        assert!(matches!(decoded, Decoded::Spliced(_)));
        assert_eq!(
            decoded.body().into_owned(),
            serde_json::json!({"k": [1, "two"]})
        );
        // Not opaque, or MessagePack: whole.
        let whole = Decoded::decode(payload, Codec::Json, false).unwrap();
        assert!(matches!(whole, Decoded::Whole(_)));
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[ -~\\u{e9}\\u{1f600}]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z\"\\\\]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn any_envelope_spliced_reads_back_as_the_whole_one_would(
            body in any_json(),
            meta_extra in any_json(),
            top_extra in any_json(),
            claimed in proptest::option::of("[a-z]{1,4}"),
        ) {
            let mut env = serde_json::json!({"meta": {"id": "m1", "to": "bob"}, "body": body});
            if let (Value::Object(extra), Some(meta)) = (meta_extra, env["meta"].as_object_mut()) {
                meta.extend(extra.into_iter().filter(|(k, _)| !["id", "from", "to"].contains(&k.as_str())));
            }
            if let Some(from) = claimed {
                env["meta"]["from"] = Value::from(from);
            }
            if let (Value::Object(extra), Some(top)) = (top_extra, env.as_object_mut()) {
                top.extend(extra.into_iter().filter(|(k, _)| k != "meta" && k != "body"));
            }
            let text = serde_json::to_string(&env).unwrap();
            // Only a top-level field name with an escape is left to the whole decode.
            match Spliced::decode(text.as_bytes()) {
                Some(_) => same_as_whole(&text),
                None => proptest::prop_assert!(text.contains('\\'), "not spliced: {}", text),
            }
        }
    }
}
