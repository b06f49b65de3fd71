//! The router's store-ack reader (`protocol::store_ack`) against async-nats's.

use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::response::Response;
use protocol::store_ack::{parse_store_ack, StoreAck};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The fields of a store ack [`parse_store_ack`] reads; the broker's other fields (`domain`,
/// `val`, ...) it does not check.
const READ: [&str; 4] = ["error", "stream", "seq", "duplicate"];

/// A reply to a JetStream publish, read by [`parse_store_ack`] and by async-nats
/// (`Response<PublishAck>` with `serde_json`, the untagged `{"error": ...}` or ack).
///
/// Asserts that where both read the reply they read the same (sequence and duplicate flag, or
/// status code, error code and description); that where only ours reads it, async-nats refuses
/// it for a field ours does not read (without those fields, async-nats reads what ours reads);
/// and that where only async-nats reads it, the reply is one the module's doc names as
/// malformed: an `error` beside a stored sequence, or a field of the ack beside an `error`.
///
/// One disagreement is let through: a JSON array, which the broker never sends. serde's derive
/// reads a struct from an array of its fields in order, so ours reads `[null, "S", 5]` as
/// stored at 5, where async-nats's untagged enum refuses it, and async-nats reads `["S", 5]`,
/// which ours refuses (docs/RELIABILITY.md, "Fuzzing"). A forged array says no more than a
/// forged object could.
///
/// Nor is a reply compared that is no JSON text only in a field ours does not read (bytes that
/// are not UTF-8, a lone surrogate, a broken escape): `serde_json` skips such a field without
/// checking its string, where async-nats reads every field and refuses it. The broker writes
/// JSON.
pub fn check_store_ack(data: &[u8]) {
    let ours = parse_store_ack(data);
    let theirs = serde_json::from_slice::<Response<PublishAck>>(data);
    match (&ours, theirs) {
        (Ok(ours), Ok(theirs)) => agree(ours, &theirs),
        (Err(_), Err(_)) => {}
        // An array read as a struct by one and not the other (see above).
        _ if serde_json::from_slice::<Vec<IgnoredAny>>(data).is_ok() => {}
        // No JSON text (bytes that are not UTF-8, a lone surrogate, a broken escape) in a field
        // ours skips unchecked, where async-nats copies every field first, which checks it.
        (Ok(_), Err(_)) if serde_json::from_slice::<serde_json::Value>(data).is_err() => {}
        (Ok(ours), Err(e)) => {
            // Only a field we do not read may make async-nats refuse it.
            let mut value: serde_json::Value =
                serde_json::from_slice(data).expect("a store ack we read is JSON");
            let object = value
                .as_object_mut()
                .unwrap_or_else(|| panic!("we read a store ack that is no object: {ours:?}"));
            object.retain(|k, _| READ.contains(&k.as_str()));
            let without = serde_json::to_vec(&value).expect("a value serializes");
            match serde_json::from_slice::<Response<PublishAck>>(&without) {
                Ok(theirs) => agree(ours, &theirs),
                Err(e2) => panic!("we read {ours:?}, async-nats refuses it ({e}; {e2})"),
            }
        }
        (Err(e), Ok(theirs)) => {
            let keys = top_keys(data)
                .unwrap_or_else(|| panic!("async-nats reads a store ack that is no object ({e})"));
            let has = |k: &str| keys.iter().any(|key| key == k);
            let malformed = match &theirs {
                Response::Ok(_) => has("error"),
                Response::Err { .. } => has("stream") || has("seq") || has("duplicate"),
            };
            assert!(
                malformed,
                "async-nats reads {theirs:?} of a well-formed reply we refuse ({e})"
            );
        }
    }
}

fn agree(ours: &StoreAck, theirs: &Response<PublishAck>) {
    match (ours, theirs) {
        (StoreAck::Stored { seq, duplicate }, Response::Ok(ack)) => {
            assert_eq!((*seq, *duplicate), (ack.sequence, ack.duplicate));
        }
        (
            StoreAck::Refused {
                code,
                err_code,
                description,
            },
            Response::Err { error },
        ) => {
            assert_eq!(*code, error.code() as u64);
            assert_eq!(*err_code, error.error_code().0);
            // async-nats shows the description (or "unknown") before the codes.
            let shown = format!(
                "{} (code {code}, error code {err_code})",
                description.as_deref().unwrap_or("unknown")
            );
            assert_eq!(error.to_string(), shown);
        }
        (ours, theirs) => panic!("we read {ours:?}, async-nats {theirs:?}"),
    }
}

/// The keys of a JSON object, unescaped, each as often as it is named; `None` when `data` is
/// no JSON object.
fn top_keys(data: &[u8]) -> Option<Vec<String>> {
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
    serde_json::from_slice::<Keys>(data).ok().map(|k| k.0)
}
