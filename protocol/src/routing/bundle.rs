//! Bundles: several task channel envelopes in one ingress message.
//!
//! A worker finishing an attempt publishes its state-change status and its result together; as
//! one ingress message (`{"bundle": [<envelope>, ...]}` on `hub.pub.<worker>.task.<delegator>.<key>`) they
//! cost the ingress stream, the router's consumer and the worker's publish ack one message
//! instead of two. The router stores every item as its own message on the task channel, in
//! order, each with `meta.from` stamped and `Nats-Msg-Id: hub-router:<from>:<item meta.id>`,
//! and acks the ingress message only after every item was stored, so readers of the channel
//! never see a bundle. Only task channels take bundles.

use serde_json::Value;

use crate::envelope::{Envelope, EnvelopeError};
use crate::ids::MessageId;
use crate::wire_error::{WireError, WireErrorKind};

/// The only key of a bundle body.
pub const BUNDLE_KEY: &str = "bundle";
/// Most items in one bundle.
pub const MAX_BUNDLE_ITEMS: usize = 8;

/// One message of a bundle, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredItem {
    /// `hub-router:<from>:<item meta.id>`.
    pub msg_id: String,
    /// The item envelope, re-encoded with `meta.from` set to the sender.
    pub payload: Vec<u8>,
    /// The item's `meta.id`.
    pub id: MessageId,
}

/// The body of a bundle of `items` (what a worker publishes).
pub fn bundle_body(items: &[Envelope]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
        .collect();
    serde_json::json!({ BUNDLE_KEY: items })
}

/// `None` when `body` is not a bundle (not an object whose only key is `bundle`); else its
/// items, or why the bundle is refused: not an array, empty, more than
/// [`MAX_BUNDLE_ITEMS`], or an item that is no valid envelope.
pub fn bundle_items(body: &Value) -> Option<Result<Vec<Envelope>, WireError>> {
    let object = body.as_object()?;
    if object.len() != 1 {
        return None;
    }
    let items = object.get(BUNDLE_KEY)?;
    let malformed = |detail: String| WireError::new(WireErrorKind::Malformed, detail);
    let Some(items) = items.as_array() else {
        return Some(Err(malformed("bundle is not an array".into())));
    };
    if items.is_empty() || items.len() > MAX_BUNDLE_ITEMS {
        return Some(Err(malformed(format!(
            "a bundle holds 1 to {MAX_BUNDLE_ITEMS} envelopes, not {}",
            items.len()
        ))));
    }
    Some(
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                Envelope::try_from(item.clone()).map_err(|e: EnvelopeError| {
                    let error = WireError::from(&e);
                    WireError::new(error.kind, format!("bundle item {i}: {}", error.detail))
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::envelope::{decode, Codec};
    use crate::routing::{route, IngressView, RouteDecision};

    fn run(payload: &Value) -> RouteDecision {
        let payload = serde_json::to_vec(payload).unwrap();
        route(&IngressView {
            subject: "hub.pub.w1.task.alice.t1",
            headers: &[],
            payload: &payload,
            ingress_seq: 3,
            status: None,
            now_ms: 0,
        })
    }

    fn item(id: &str, body: Value) -> Value {
        json!({ "meta": { "id": id, "from": "mallory" }, "body": body })
    }

    /// A body of worker `w1` (the bundles' sender): `{kind: {"worker_id": "w1", "n": n}}`.
    fn of_w1(kind: &str, n: Value) -> Value {
        json!({ kind: { "worker_id": "w1", "n": n } })
    }

    fn bundle(items: Vec<Value>) -> Value {
        json!({ "meta": { "id": "b1" }, "body": { "bundle": items } })
    }

    #[test]
    fn a_bundle_on_a_task_channel_is_stored_as_its_items_in_order_stamped_with_the_sender() {
        let decision = run(&bundle(vec![
            item("s1", of_w1("status", json!(1))),
            item("r1", of_w1("result", json!(2))),
        ]));
        let RouteDecision::StoreAll {
            channel,
            subject,
            items,
            codec,
            from,
            id,
        } = decision
        else {
            panic!("not stored as a bundle: {decision:?}");
        };
        assert_eq!(subject, "channel.task.alice.t1");
        assert_eq!(channel.subject(), subject);
        assert_eq!(
            (codec, from.as_str(), id.as_str()),
            (Codec::Json, "w1", "b1")
        );
        let ids: Vec<_> = items.iter().map(|i| i.msg_id.as_str()).collect();
        assert_eq!(ids, ["hub-router:w1:s1", "hub-router:w1:r1"]);
        for (stored, body) in items
            .iter()
            .zip([of_w1("status", json!(1)), of_w1("result", json!(2))])
        {
            let env = decode(&stored.payload, Codec::Json).unwrap();
            assert_eq!(
                env.meta.from.unwrap().as_str(),
                "w1",
                "the subject identity wins"
            );
            assert_eq!(env.body, body);
        }
    }

    #[test]
    fn bad_bundles_are_rejected_to_the_sender() {
        let too_many: Vec<Value> = (0..=MAX_BUNDLE_ITEMS)
            .map(|i| item(&format!("i{i}"), json!(i)))
            .collect();
        for bad in [
            bundle(vec![]),
            bundle(too_many),
            bundle(vec![item("ok", json!(1)), json!({ "body": 2 })]),
            json!({ "meta": { "id": "b1" }, "body": { "bundle": "nope" } }),
        ] {
            let RouteDecision::Reject {
                sender,
                rejected_id,
                error,
            } = run(&bad)
            else {
                panic!("accepted: {bad}");
            };
            assert_eq!(sender.as_str(), "w1");
            assert_eq!(rejected_id.unwrap().as_str(), "b1");
            assert!(
                matches!(
                    error.kind,
                    WireErrorKind::Malformed | WireErrorKind::MissingField
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn a_body_with_other_keys_beside_bundle_is_a_plain_message() {
        // Not a bundle: a plain message, which a task channel takes only as a worker's body.
        let plain = json!({ "meta": { "id": "p1" }, "body": { "bundle": [], "x": 1 } });
        assert!(matches!(
            run(&plain),
            RouteDecision::Reject { error, .. } if error.kind == WireErrorKind::Unauthorized
        ));
    }

    #[test]
    fn bundles_elsewhere_than_task_channels_are_plain_messages() {
        let payload = serde_json::to_vec(&json!({
            "meta": { "id": "m1", "to": "bob" }, "body": { "bundle": [item("x", json!(1))] }
        }))
        .unwrap();
        let decision = route(&IngressView {
            subject: "hub.pub.alice.inbox",
            headers: &[],
            payload: &payload,
            ingress_seq: 1,
            status: None,
            now_ms: 0,
        });
        assert!(
            matches!(decision, RouteDecision::Store { .. }),
            "{decision:?}"
        );
    }

    proptest! {
        #[test]
        fn every_item_of_a_valid_bundle_is_stored_once_in_order(n in 1..=MAX_BUNDLE_ITEMS) {
            let items: Vec<Value> =
                (0..n).map(|i| item(&format!("m{i}"), of_w1("status", json!(i)))).collect();
            let RouteDecision::StoreAll { items: stored, .. } = run(&bundle(items)) else {
                panic!("not stored");
            };
            prop_assert_eq!(stored.len(), n);
            for (i, s) in stored.iter().enumerate() {
                let expected = format!("m{i}");
                prop_assert_eq!(s.id.as_str(), expected.as_str());
                prop_assert_eq!(decode(&s.payload, Codec::Json).unwrap().body, of_w1("status", json!(i)));
            }
        }
    }
}
