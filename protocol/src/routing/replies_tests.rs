//! A broker's reply aimed at an ingress subject (the unchecked reply subject of a publish or
//! an API request) is dropped, never rejected as its "sender's" malformed envelope.

use super::tests::{rejected, run, PLAIN_DM};
use super::*;

#[test]
fn a_publish_ack_aimed_at_an_ingress_subject_is_dropped_not_rejected() {
    // What the broker sends to the (unchecked) reply subject of a publish that a stream
    // stored: within one account, any identity's publish can name `hub.pub.alice.inbox`.
    for ack in [
        r#"{"stream":"KV_HUB_PRESENCE","seq":7}"#,
        r#"{"stream":"HUB_INGRESS","seq":1,"duplicate":true}"#,
        r#"{"stream":"HUB_INGRESS","domain":"hub","seq":12}"#,
    ] {
        assert_eq!(
            run("hub.pub.alice.inbox", &[], ack.as_bytes()),
            RouteDecision::Drop {
                reason: DropReason::ApiReply
            },
            "{ack}"
        );
    }
    // A JSON object with more than an ack holds is still the sender's fault.
    for bad in [
        r#"{"stream":"X","seq":1,"note":"hi"}"#,
        r#"{"stream":"X"}"#,
        r#"{"stream":"X","seq":"1"}"#,
    ] {
        let (sender, _, _) = rejected(run("hub.pub.alice.inbox", &[], bad.as_bytes()));
        assert_eq!(sender.as_str(), "alice", "{bad}");
    }
}

#[test]
fn a_jetstream_api_reply_aimed_at_an_ingress_subject_is_dropped_not_rejected() {
    // What `$JS.API.CONSUMER.INFO` and `$JS.API.STREAM.MSG.GET` answer, published by the
    // server on the (unchecked) reply subject `hub.pub.alice.inbox`.
    for reply in [
        r#"{"type":"io.nats.jetstream.api.v1.consumer_info_response","stream_name":"HUB_INBOX","name":"inbox-bob"}"#,
        r#"{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"channel.inbox.bob","seq":1,"data":"e30="}}"#,
        r#"{"type":"io.nats.jetstream.api.v1.consumer_info_response","error":{"code":404,"description":"consumer not found"}}"#,
    ] {
        assert_eq!(
            run("hub.pub.alice.inbox", &[], reply.as_bytes()),
            RouteDecision::Drop {
                reason: DropReason::ApiReply
            },
            "{reply}"
        );
    }
    // Anything else that does not decode is still the sender's fault, and told so.
    for bad in [
        r#"{"type":"note","x":1}"#,
        r#"{"type":7}"#,
        "[1]",
        "not json",
    ] {
        let (sender, _, _) = rejected(run("hub.pub.alice.inbox", &[], bad.as_bytes()));
        assert_eq!(sender.as_str(), "alice", "{bad}");
    }
    // An envelope is routed whatever else it carries.
    let env = r#"{"type":"io.nats.jetstream.api.v1.x","meta":{"id":"m1","to":"bob"},"body":1}"#;
    assert!(matches!(
        run("hub.pub.alice.inbox", &[], env.as_bytes()),
        RouteDecision::Store { .. }
    ));
}

#[test]
fn a_status_message_in_the_ingress_is_an_api_reply_and_dropped() {
    let view = IngressView {
        subject: "hub.pub.alice.inbox",
        headers: &[],
        payload: b"",
        ingress_seq: 1,
        status: Some(404),
        now_ms: 0,
    };
    assert_eq!(
        route(&view),
        RouteDecision::Drop {
            reason: DropReason::ApiReply
        }
    );
}

#[test]
fn a_stored_pull_status_is_an_api_reply_and_dropped() {
    let drop = RouteDecision::Drop {
        reason: DropReason::ApiReply,
    };
    // `404 No Messages`, stored: nothing left of it.
    assert_eq!(run("hub.pub.alice.inbox", &[], b""), drop);
    // `408 Request Timeout`, stored: the pending counts.
    let pending = [("Nats-Pending-Messages", "1"), ("Nats-Pending-Bytes", "0")];
    assert_eq!(run("hub.pub.alice.inbox", &pending, b""), drop);
    assert_eq!(
        run("hub.pub.alice.inbox", &pending[..1], PLAIN_DM.as_bytes()),
        drop
    );
}
