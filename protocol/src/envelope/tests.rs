use proptest::prelude::*;
use serde_json::json;

use super::*;

const PLAIN_DM: &str = r#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#;

fn decode_json(value: &Value) -> Result<Envelope, EnvelopeError> {
    decode(&serde_json::to_vec(value).unwrap(), Codec::Json)
}

#[test]
fn plain_nats_pub_example_decodes() {
    let env = decode(PLAIN_DM.as_bytes(), Codec::Json).unwrap();
    assert_eq!(env.meta.id.as_str(), "m1");
    assert_eq!(env.meta.to, Some(AgentId::new("bob").unwrap()));
    assert_eq!(env.meta.from, None);
    assert_eq!(env.body, json!("hi"));
    assert!(env.meta.extra.is_empty());
    assert!(env.extra.is_empty());
    let reencoded: Value = serde_json::from_slice(&encode(&env, Codec::Json).unwrap()).unwrap();
    assert_eq!(reencoded, serde_json::from_str::<Value>(PLAIN_DM).unwrap());
}

#[test]
fn unknown_fields_are_tolerated_and_preserved() {
    let input = json!({
        "meta": {"id": "m1", "from": "alice", "to": "bob", "thread": "t1", "ttl": {"secs": 5}},
        "body": {"text": "hi"},
        "sig": "abc",
        "v": 2,
    });
    let env = decode_json(&input).unwrap();
    assert_eq!(env.meta.extra["thread"], json!("t1"));
    assert_eq!(env.meta.extra["ttl"], json!({"secs": 5}));
    assert_eq!(env.extra["sig"], json!("abc"));
    assert_eq!(env.extra["v"], json!(2));
    for codec in [Codec::Json, Codec::MsgPack] {
        let bytes = encode(&env, codec).unwrap();
        assert_eq!(decode(&bytes, codec).unwrap(), env, "{codec}");
    }
    let json_out: Value = serde_json::from_slice(&encode(&env, Codec::Json).unwrap()).unwrap();
    assert_eq!(json_out, input);
}

#[test]
fn msgpack_round_trips_flattened_extra_fields() {
    let mut env = Envelope::new(
        MessageId::new("m-2").unwrap(),
        json!({"n": -3, "big": u64::MAX, "f": 0.5, "list": [null, true, "x"]}),
    );
    env.meta.to = Some(AgentId::new("bob").unwrap());
    env.meta
        .extra
        .insert("nested".into(), json!({"a": [1, 2, {"b": null}]}));
    env.extra.insert("top".into(), json!(1.25));
    let bytes = encode(&env, Codec::MsgPack).unwrap();
    assert_eq!(decode(&bytes, Codec::MsgPack).unwrap(), env);
    // Named fields: the keys are on the wire, not positions.
    assert!(bytes.windows(4).any(|w| w == b"meta"));
}

#[test]
fn serde_deserialize_uses_the_same_checks() {
    let env: Envelope = serde_json::from_str(PLAIN_DM).unwrap();
    assert_eq!(env, decode(PLAIN_DM.as_bytes(), Codec::Json).unwrap());
    let err = serde_json::from_str::<Envelope>(r#"{"meta":{},"body":1}"#).unwrap_err();
    assert!(err.to_string().contains("meta.id"), "{err}");
}

#[test]
fn oversize_is_rejected_both_ways() {
    let payload = vec![b' '; MAX_ENVELOPE_BYTES + 1];
    for codec in [Codec::Json, Codec::MsgPack] {
        assert_eq!(
            decode(&payload, codec),
            Err(EnvelopeError::TooLarge {
                size: MAX_ENVELOPE_BYTES + 1,
                max: MAX_ENVELOPE_BYTES,
            })
        );
        let env = Envelope::new(
            MessageId::new("m").unwrap(),
            json!("x".repeat(MAX_ENVELOPE_BYTES)),
        );
        assert!(matches!(
            encode(&env, codec),
            Err(EnvelopeError::TooLarge {
                max: MAX_ENVELOPE_BYTES,
                ..
            })
        ));
    }
}

#[test]
fn missing_fields_are_distinct_from_syntax_errors() {
    assert_eq!(
        decode_json(&json!({"meta": {"to": "bob"}, "body": "hi"})),
        Err(EnvelopeError::MissingField { field: "meta.id" })
    );
    assert_eq!(
        decode_json(&json!({"meta": {"id": null}, "body": "hi"})),
        Err(EnvelopeError::MissingField { field: "meta.id" })
    );
    assert_eq!(
        decode_json(&json!({"body": "hi"})),
        Err(EnvelopeError::MissingField { field: "meta" })
    );
    assert_eq!(
        decode_json(&json!({"meta": {"id": "m1"}})),
        Err(EnvelopeError::MissingField { field: "body" })
    );
    assert!(matches!(
        decode(b"{\"meta\":", Codec::Json),
        Err(EnvelopeError::Malformed {
            codec: Codec::Json,
            ..
        })
    ));
    assert!(matches!(
        decode(&[0xc1], Codec::MsgPack),
        Err(EnvelopeError::Malformed {
            codec: Codec::MsgPack,
            ..
        })
    ));
}

#[test]
fn trailing_bytes_are_malformed() {
    let mut bytes = encode(
        &decode(PLAIN_DM.as_bytes(), Codec::Json).unwrap(),
        Codec::MsgPack,
    )
    .unwrap();
    bytes.push(0xc0);
    assert!(matches!(
        decode(&bytes, Codec::MsgPack),
        Err(EnvelopeError::Malformed {
            codec: Codec::MsgPack,
            ..
        })
    ));
    assert!(matches!(
        decode(format!("{PLAIN_DM} x").as_bytes(), Codec::Json),
        Err(EnvelopeError::Malformed { .. })
    ));
}

#[test]
fn invalid_ids_name_the_field() {
    let err = decode_json(&json!({"meta": {"id": "m1", "to": "bo.b"}, "body": "hi"})).unwrap_err();
    assert!(matches!(
        err,
        EnvelopeError::InvalidField {
            field: "meta.to",
            source: IdError::InvalidChar {
                ch: '.',
                index: 2,
                ..
            },
        }
    ));
    assert_eq!(
        crate::error_chain::ErrorChain(&err).to_string(),
        "invalid envelope field `meta.to`: agent id contains invalid character '.' at byte 2"
    );
    assert!(matches!(
        decode_json(&json!({"meta": {"id": "m 1"}, "body": "hi"})),
        Err(EnvelopeError::InvalidField {
            field: "meta.id",
            ..
        })
    ));
    assert!(matches!(
        decode_json(&json!({"meta": {"id": "m1", "from": ""}, "body": "hi"})),
        Err(EnvelopeError::InvalidField {
            field: "meta.from",
            source: IdError::Empty { .. }
        })
    ));
}

#[test]
fn wrong_types_name_the_field() {
    assert_eq!(
        decode_json(&json!({"meta": {"id": 7}, "body": "hi"})),
        Err(EnvelopeError::WrongType {
            field: "meta.id",
            expected: "a string"
        })
    );
    assert_eq!(
        decode_json(&json!({"meta": {"id": "m", "to": ["bob"]}, "body": "hi"})),
        Err(EnvelopeError::WrongType {
            field: "meta.to",
            expected: "a string"
        })
    );
    assert_eq!(
        decode_json(&json!({"meta": "m1", "body": "hi"})),
        Err(EnvelopeError::WrongType {
            field: "meta",
            expected: "an object"
        })
    );
    assert_eq!(
        decode_json(&json!(["meta"])),
        Err(EnvelopeError::WrongType {
            field: "envelope",
            expected: "an object"
        })
    );
}

#[test]
fn extra_fields_cannot_shadow_named_fields() {
    let mut env = Envelope::new(MessageId::new("m").unwrap(), json!(null));
    env.meta.extra.insert("from".into(), json!("mallory"));
    assert_eq!(
        encode(&env, Codec::Json),
        Err(EnvelopeError::ConflictingField { field: "meta.from" })
    );
    let mut env = Envelope::new(MessageId::new("m").unwrap(), json!(null));
    env.extra.insert("body".into(), json!(1));
    assert_eq!(
        encode(&env, Codec::MsgPack),
        Err(EnvelopeError::ConflictingField { field: "body" })
    );
}

#[test]
fn codec_from_content_type() {
    assert_eq!(Codec::from_content_type(None), Ok(Codec::Json));
    assert_eq!(
        Codec::from_content_type(Some("application/json")),
        Ok(Codec::Json)
    );
    assert_eq!(
        Codec::from_content_type(Some("Application/JSON; charset=utf-8")),
        Ok(Codec::Json)
    );
    assert_eq!(
        Codec::from_content_type(Some("application/msgpack")),
        Ok(Codec::MsgPack)
    );
    assert_eq!(
        Codec::from_content_type(Some("text/plain")),
        Err(EnvelopeError::UnsupportedContentType {
            content_type: "text/plain".into()
        })
    );
    assert!(Codec::from_content_type(Some("")).is_err());
    for codec in [Codec::Json, Codec::MsgPack] {
        assert_eq!(
            Codec::from_content_type(Some(codec.content_type())),
            Ok(codec)
        );
    }
    assert_eq!(Codec::default(), Codec::Json);
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // At most 15 significant digits: serde_json without its
        // `float_roundtrip` feature parses longer decimals up to 1 ulp off.
        any::<i32>().prop_map(|n| Value::from(f64::from(n) / 8.0)),
        ".{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn extra(reserved: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(".{1,8}", json_value(), 0..4).prop_map(move |map| {
        map.into_iter()
            .filter(|(key, _)| !reserved.contains(&key.as_str()))
            .collect()
    })
}

fn agent_id() -> impl Strategy<Value = Option<AgentId>> {
    prop::option::of(crate::ids::strategies::token(32).prop_map(|s| AgentId::new(s).unwrap()))
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        "[!-~]{1,64}",
        agent_id(),
        agent_id(),
        extra(&["id", "from", "to"]),
        json_value(),
        extra(&["meta", "body"]),
    )
        .prop_map(|(id, from, to, meta_extra, body, extra)| Envelope {
            meta: Meta {
                id: MessageId::new(id).unwrap(),
                from,
                to,
                extra: meta_extra,
            },
            body,
            extra,
        })
}

/// A field's value as the wild sends it: often right, often not.
fn wild_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => crate::ids::strategies::token(12).prop_map(Value::from),
        1 => Just(Value::Null),
        1 => Just(Value::from("has space")),
        1 => Just(Value::from("")),
        1 => json_value(),
    ]
}

/// A key as the wild sends it: the known ones often, twice at times, and odd ones.
fn wild_key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(known).prop_map(str::to_owned),
        1 => "[a-z]{1,4}",
        1 => Just("$serde_json::private::RawValue".to_owned()),
        1 => Just("ex\\u0063aped".to_owned()),
    ]
}

/// A JSON object written field by field (a key may come twice; `\u` escapes are kept).
fn object_text(fields: &[(String, String)]) -> String {
    let fields: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", fields.join(","))
}

/// Envelopes as the wild writes them, as JSON text: `meta` and `body` there or not, fields
/// named twice, `null`s, wrong types, invalid ids, marker and escaped keys.
fn wild_envelope() -> impl Strategy<Value = String> {
    let meta = prop::collection::vec((wild_key(&["id", "from", "to"]), wild_value()), 0..5)
        .prop_map(|fields| {
            let fields: Vec<_> = fields
                .into_iter()
                .map(|(k, v)| (k, v.to_string()))
                .collect();
            object_text(&fields)
        });
    let field = prop_oneof![
        3 => meta.prop_map(|m| ("meta".to_owned(), m)),
        2 => wild_value().prop_map(|v| ("body".to_owned(), v.to_string())),
        1 => (wild_key(&["meta", "body"]), wild_value()).prop_map(|(k, v)| (k, v.to_string())),
    ];
    prop::collection::vec(field, 0..5).prop_map(|fields| object_text(&fields))
}

#[test]
fn the_typed_path_leaves_what_the_value_path_must_judge() {
    let cases = [
        // A marker key that serde_json's Value reads as something else.
        r#"{"meta":{"$serde_json::private::RawValue":"1","id":"m"},"body":1}"#,
        // An earlier invalid id, a valid one last: the Value path keeps the last.
        r#"{"meta":{"id":"bad id","id":"m"},"body":1}"#,
        r#"{"meta":{"id":null},"body":1}"#,
        r#"{"meta":{"id":"m"}}"#,
        r#"{"meta":{"id":"m","to":7},"body":1}"#,
        r#"{"meta":{"id":"m"},"body":1} x"#,
    ];
    for case in cases {
        assert_eq!(typed::decode(case.as_bytes(), Codec::Json), None, "{case}");
    }
    // Decoded all the same, as the Value path decodes them.
    let env = decode(cases[1].as_bytes(), Codec::Json).unwrap();
    assert_eq!(env.meta.id.as_str(), "m");
    assert_eq!(
        decode(cases[4].as_bytes(), Codec::Json),
        Err(EnvelopeError::WrongType {
            field: "meta.to",
            expected: "a string"
        })
    );
}

proptest! {
    #[test]
    fn encode_decode_round_trips(env in envelope()) {
        for codec in [Codec::Json, Codec::MsgPack] {
            let bytes = encode(&env, codec).unwrap();
            prop_assert_eq!(&decode(&bytes, codec).unwrap(), &env, "{}", codec);
            // A well-formed envelope takes the typed path.
            prop_assert_eq!(typed::decode(&bytes, codec), Some(env.clone()), "{}", codec);
        }
    }

    #[test]
    fn the_typed_path_decodes_what_the_value_path_decodes_and_nothing_else(text in wild_envelope()) {
        let json = text.as_bytes();
        if let Some(env) = typed::decode(json, Codec::Json) {
            prop_assert_eq!(decode_value(json, Codec::Json), Ok(env));
        }
        // The same fields in MessagePack (a field named twice is kept once there).
        if let Ok(value) = serde_json::from_str::<Value>(&text) {
            let packed = rmp_serde::to_vec_named(&value).unwrap();
            if let Some(env) = typed::decode(&packed, Codec::MsgPack) {
                prop_assert_eq!(decode_value(&packed, Codec::MsgPack), Ok(env));
            }
        }
        // And either way, decode says what the Value path says.
        prop_assert_eq!(decode(json, Codec::Json), decode_value(json, Codec::Json));
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes, Codec::Json);
        let _ = decode(&bytes, Codec::MsgPack);
    }
}
