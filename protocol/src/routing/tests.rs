//! Example-based tests of [`route`](super::route), one per rule.

use serde_json::{json, Value};

use super::*;
use crate::envelope::{decode, Envelope};
use crate::headers::REPLAY_HEADERS;

pub(super) const PLAIN_DM: &str = r#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#;

pub(super) fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

pub(super) fn mid(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

pub(super) fn run(subject: &str, headers: &[(&str, &str)], payload: &[u8]) -> RouteDecision {
    route(&IngressView {
        subject,
        headers,
        payload,
        ingress_seq: 7,
        status: None,
        now_ms: 0,
    })
}

/// `(sender, rejected_id, kind)` of a rejection; panics otherwise.
pub(super) fn rejected(decision: RouteDecision) -> (AgentId, Option<MessageId>, WireErrorKind) {
    match decision {
        RouteDecision::Reject {
            sender,
            rejected_id,
            error,
        } => (sender, rejected_id, error.kind),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

pub(super) fn decoded(payload: &[u8], codec: Codec) -> Envelope {
    decode(payload, codec).unwrap()
}

#[test]
fn plain_json_dm_is_stored_in_the_recipient_inbox() {
    let forged = r#"{"meta":{"id":"m1","to":"bob","from":"mallory"},"body":"hi"}"#;
    for payload in [PLAIN_DM, forged] {
        let RouteDecision::Store {
            dest:
                Dest::Inbox {
                    to,
                    ttl_secs: None,
                    expires_at: None,
                },
            subject,
            msg_id,
            payload,
            codec,
            from,
            id,
        } = run("hub.pub.alice.inbox", &[], payload.as_bytes())
        else {
            panic!("not stored: {payload}");
        };
        assert_eq!((subject.as_str(), to), ("channel.inbox.bob", agent("bob")));
        assert_eq!(msg_id, "hub-router:alice:m1");
        assert_eq!((codec, from, id), (Codec::Json, agent("alice"), mid("m1")));
        let env = decoded(&payload, Codec::Json);
        assert_eq!(env.meta.from, Some(agent("alice")));
        assert_eq!(env.meta.to, Some(agent("bob")));
        assert_eq!(env.body, json!("hi"));
    }
}

#[test]
fn unknown_fields_survive_routing() {
    let input =
        json!({"meta": {"id": "m1", "to": "bob", "thread": "t1"}, "body": {"x": 1}, "sig": "s"});
    let decision = run(
        "hub.pub.alice.inbox",
        &[],
        &serde_json::to_vec(&input).unwrap(),
    );
    let RouteDecision::Store { payload, .. } = decision else {
        panic!("{decision:?}")
    };
    let out: Value = serde_json::from_slice(&payload).unwrap();
    let mut expected = input;
    expected["meta"]["from"] = json!("alice");
    assert_eq!(out, expected);
}

#[test]
fn task_channel_is_stored_under_its_key() {
    let payload = br#"{"meta":{"id":"r1"},"body":{"status":{"worker_id":"worker-1"}}}"#;
    let decision = run("hub.pub.worker-1.task.alice.01JABC", &[], payload);
    assert_eq!(decision.subject(), Some("channel.task.alice.01JABC"));
    assert_eq!(decision.msg_id(), Some("hub-router:worker-1:r1"));
    let RouteDecision::Store {
        dest,
        payload,
        from,
        ..
    } = decision
    else {
        panic!()
    };
    let channel = crate::subjects::parse_task("channel.task.alice.01JABC").unwrap();
    assert_eq!(dest, Dest::TaskChannel(channel));
    assert_eq!(from, agent("worker-1"));
    assert_eq!(decoded(&payload, Codec::Json).meta.from, Some(from));
}

#[test]
fn broadcast_is_published_live() {
    let payload = br#"{"meta":{"id":"b1","from":"eve"},"body":"hello all"}"#;
    let decision = run("hub.pub.alice.general", &[], payload);
    assert_eq!(decision.msg_id(), None);
    let RouteDecision::Broadcast {
        subject,
        payload,
        codec,
        from,
        id,
    } = decision
    else {
        panic!("{decision:?}")
    };
    assert_eq!(subject, "channel.general");
    assert_eq!((codec, from, id), (Codec::Json, agent("alice"), mid("b1")));
    assert_eq!(
        decoded(&payload, Codec::Json).meta.from,
        Some(agent("alice"))
    );
}

#[test]
fn msgpack_dm_round_trips_in_msgpack() {
    let mut env = Envelope::new(mid("m9"), json!({"n": [1, 2]}));
    env.meta.to = Some(agent("bob"));
    env.meta.extra.insert("thread".into(), json!("t"));
    let bytes = encode(&env, Codec::MsgPack).unwrap();
    for name in ["Content-Type", "content-type"] {
        let headers = [(name, "Application/MsgPack; x=y")];
        let decision = run("hub.pub.alice.inbox", &headers, &bytes);
        let RouteDecision::Store { payload, codec, .. } = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(codec, Codec::MsgPack);
        let mut expected = env.clone();
        expected.meta.from = Some(agent("alice"));
        assert_eq!(decoded(&payload, Codec::MsgPack), expected);
    }
    // The same bytes without the header are not JSON.
    let (_, id, kind) = rejected(run("hub.pub.alice.inbox", &[], &bytes));
    assert_eq!((id, kind), (None, WireErrorKind::Malformed));
}

#[test]
fn direct_get_replay_is_dropped() {
    let all: Vec<(&str, &str)> = REPLAY_HEADERS.iter().map(|name| (*name, "1")).collect();
    let drop = RouteDecision::Drop {
        reason: DropReason::ReplayHeader,
    };
    assert_eq!(run("hub.pub.bob.inbox", &all, PLAIN_DM.as_bytes()), drop);
    for name in REPLAY_HEADERS {
        let lower = name.to_ascii_lowercase();
        for name in [name, lower.as_str()] {
            let headers = [("traceparent", "x"), (name, "HUB_INBOX")];
            assert_eq!(
                run("hub.pub.bob.inbox", &headers, PLAIN_DM.as_bytes()),
                drop
            );
        }
    }
}

#[test]
fn router_message_id_is_dropped() {
    let drop = RouteDecision::Drop {
        reason: DropReason::RouterMessageId,
    };
    for name in ["Nats-Msg-Id", "nats-msg-id"] {
        let headers = [(name, "hub-router:bob:m1")];
        assert_eq!(
            run("hub.pub.bob.inbox", &headers, PLAIN_DM.as_bytes()),
            drop
        );
    }
    // A second Nats-Msg-Id value is checked too.
    let headers = [("Nats-Msg-Id", "mine"), ("Nats-Msg-Id", "hub-router:a:b")];
    assert_eq!(
        run("hub.pub.bob.inbox", &headers, PLAIN_DM.as_bytes()),
        drop
    );
    // Every id the router stores under is: a stored task or notice pulled back at the ingress
    // (a pull's reply subject is not checked) is a replay too.
    for value in ["hub-task:bob:t1", "hub-system:reject:3"] {
        let headers = [("Nats-Msg-Id", value)];
        assert_eq!(
            run("hub.pub.bob.inbox", &headers, PLAIN_DM.as_bytes()),
            drop,
            "{value}"
        );
    }
    // An agent's own msg id, or a worker's, is not a router id.
    for value in [
        "m1",
        "alice:task:t1",
        "hub-result:t:a:1",
        "x-hub-router:a:b",
    ] {
        let headers = [("Nats-Msg-Id", value)];
        let decision = run("hub.pub.bob.inbox", &headers, PLAIN_DM.as_bytes());
        assert!(matches!(decision, RouteDecision::Store { .. }), "{value}");
    }
}

#[test]
fn non_ingress_subjects_are_dropped() {
    for subject in [
        "channel.inbox.bob",
        "channel.task.alice.t1",
        "channel.general",
        "hub.pub.alice",
        "hub.pub.bo b.inbox",
        "hub.pub.alice.task",
        "hub.pub.alice.a.b.c",
        "hub.delivery.alice.inbox",
        "",
    ] {
        assert_eq!(
            run(subject, &[], PLAIN_DM.as_bytes()),
            RouteDecision::Drop {
                reason: DropReason::NotIngressSubject
            },
            "{subject}"
        );
    }
}

#[test]
fn guard_runs_before_decoding() {
    let drop = |reason| RouteDecision::Drop { reason };
    assert_eq!(
        run("channel.inbox.bob", &[("Nats-Stream", "X")], b"\xff"),
        drop(DropReason::NotIngressSubject)
    );
    assert_eq!(
        run("hub.pub.bob.inbox", &[("Nats-Sequence", "1")], b"\xff"),
        drop(DropReason::ReplayHeader)
    );
    let headers = [("Nats-Msg-Id", "hub-router:a:b"), ("Content-Type", "x/y")];
    assert_eq!(
        run("hub.pub.bob.inbox", &headers, b"\xff"),
        drop(DropReason::RouterMessageId)
    );
}

#[test]
fn bad_envelopes_are_rejected_with_the_right_kind() {
    let cases: [(&[u8], Option<&str>, WireErrorKind); 6] = [
        (b"\x00garbage", None, WireErrorKind::Malformed),
        (b"[1,2]", None, WireErrorKind::Malformed),
        (
            br#"{"meta":{"to":"bob"},"body":1}"#,
            None,
            WireErrorKind::MissingField,
        ),
        (
            br#"{"meta":{"id":"m1","to":"bob"}}"#,
            Some("m1"),
            WireErrorKind::MissingField,
        ),
        (
            br#"{"meta":{"id":"m1","to":"bo.b"},"body":1}"#,
            Some("m1"),
            WireErrorKind::InvalidRecipient,
        ),
        (
            br#"{"meta":{"id":"m1","from":5},"body":1}"#,
            Some("m1"),
            WireErrorKind::Malformed,
        ),
    ];
    for (payload, id, kind) in cases {
        let decision = run("hub.pub.alice.inbox", &[], payload);
        assert_eq!(decision.subject(), None);
        assert_eq!(
            rejected(decision),
            (agent("alice"), id.map(mid), kind),
            "{}",
            String::from_utf8_lossy(payload)
        );
    }
}

/// A DM's or a broadcast's body is not decoded (it is spliced), yet one that no reader could
/// decode is refused to its sender as the whole decode refuses it.
#[test]
fn a_dm_or_broadcast_no_reader_could_decode_is_rejected() {
    let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
    for body in ["157e308", "-1e400", r#"["\ud800x"]"#, &deep] {
        let payload = format!(r#"{{"meta":{{"id":"m1","to":"bob"}},"body":{body}}}"#);
        for subject in ["hub.pub.alice.inbox", "hub.pub.alice.news"] {
            assert_eq!(
                rejected(run(subject, &[], payload.as_bytes())),
                (agent("alice"), Some(mid("m1")), WireErrorKind::Malformed),
                "{payload} on {subject}"
            );
        }
    }
}

#[test]
fn direct_message_without_recipient_is_rejected() {
    let payload = br#"{"meta":{"id":"m1"},"body":"hi"}"#;
    let decision = run("hub.pub.alice.inbox", &[], payload);
    assert_eq!(
        decision,
        RouteDecision::Reject {
            sender: agent("alice"),
            rejected_id: Some(mid("m1")),
            error: WireError::new(WireErrorKind::InvalidRecipient, MISSING_RECIPIENT_DETAIL),
        }
    );
    assert_eq!(MISSING_RECIPIENT_DETAIL, "a direct message needs meta.to");
}

#[test]
fn oversize_payload_is_rejected_before_parsing() {
    let mut payload = PLAIN_DM.as_bytes().to_vec();
    payload.resize(MAX_ENVELOPE_BYTES + 1, b' ');
    let decision = run("hub.pub.alice.inbox", &[], &payload);
    assert_eq!(
        rejected(decision),
        (agent("alice"), None, WireErrorKind::TooLarge)
    );
}

#[test]
fn reencoding_over_the_limit_is_rejected_with_the_id() {
    let skeleton = r#"{"meta":{"id":"m1","to":"bob"},"body":""}"#;
    let fill = MAX_ENVELOPE_BYTES - skeleton.len() - 3;
    let payload = format!(
        r#"{{"meta":{{"id":"m1","to":"bob"}},"body":"{}"}}"#,
        "x".repeat(fill)
    );
    assert!(decode(payload.as_bytes(), Codec::Json).is_ok());
    // `"from":"alice",` adds 15 bytes.
    let decision = run("hub.pub.alice.inbox", &[], payload.as_bytes());
    assert_eq!(
        rejected(decision),
        (agent("alice"), Some(mid("m1")), WireErrorKind::TooLarge)
    );
}

#[test]
fn unsupported_content_type_is_rejected() {
    let headers = [("content-type", "text/plain")];
    let decision = run("hub.pub.alice.inbox", &headers, PLAIN_DM.as_bytes());
    assert_eq!(
        rejected(decision),
        (
            agent("alice"),
            Some(mid("m1")),
            WireErrorKind::UnsupportedContentType
        )
    );
    let headers = [("Content-Type", "text/plain")];
    let (_, id, _) = rejected(run("hub.pub.alice.inbox", &headers, b"\x81"));
    assert_eq!(id, None);
}

#[test]
fn drop_reason_names_are_snake_case() {
    for (reason, name) in DropReason::ALL.into_iter().zip([
        "not_ingress_subject",
        "replay_header",
        "router_message_id",
    ]) {
        assert_eq!(reason.as_str(), name);
        assert_eq!(reason.to_string(), name);
        assert_eq!(serde_json::to_value(reason).unwrap(), json!(name));
    }
}

#[test]
fn a_valid_task_is_stored_in_the_work_stream_under_its_task_id() {
    let body = r#"{"meta":{"id":"m-task"},"body":{"version":1,"task_id":"t-1","text":"do it"}}"#;
    for (subject, stored, target) in [
        ("hub.pub.alice.work.builds", "work.builds", None),
        ("hub.pub.alice.work.builds.w1", "work.builds.w1", Some("w1")),
    ] {
        let decision = route(&IngressView {
            subject,
            headers: &[],
            payload: body.as_bytes(),
            ingress_seq: 1,
            status: None,
            now_ms: 0,
        });
        match decision {
            RouteDecision::Store {
                dest,
                subject,
                msg_id,
                from,
                ..
            } => {
                let worker = target.map(|w| WorkerId::new(w).unwrap());
                let task_id = "t-1".parse().unwrap();
                let queue = QueueName::new("builds").unwrap();
                assert_eq!(
                    dest,
                    Dest::Work {
                        queue,
                        worker,
                        task_id
                    }
                );
                assert_eq!(subject, stored);
                assert_eq!(msg_id, "hub-task:alice:t-1");
                assert_eq!(from.as_str(), "alice");
            }
            other => panic!("expected Store, got {other:?}"),
        }
    }
}

#[test]
fn an_invalid_task_is_rejected_to_its_sender() {
    let body = r#"{"meta":{"id":"m-task"},"body":{"version":2,"task_id":"t-1","text":"x"}}"#;
    let decision = route(&IngressView {
        subject: "hub.pub.alice.work.builds",
        headers: &[],
        payload: body.as_bytes(),
        ingress_seq: 1,
        status: None,
        now_ms: 0,
    });
    assert!(
        matches!(decision, RouteDecision::Reject { ref sender, .. } if sender.as_str() == "alice"),
        "{decision:?}"
    );
}

#[test]
fn an_answer_is_stored_for_its_worker_only() {
    let answer = |worker: &str| {
        format!(
            r#"{{"meta":{{"id":"a-1"}},"body":{{"message_id":"a-1","task_id":"t","attempt_id":"x","worker_id":"{worker}","tool_call_id":"c","responses":["yes"]}}}}"#
        )
    };
    let ok = answer("w1");
    let decision = route(&IngressView {
        subject: "hub.pub.alice.answer.w1",
        headers: &[],
        payload: ok.as_bytes(),
        ingress_seq: 1,
        status: None,
        now_ms: 0,
    });
    assert_eq!(decision.subject(), Some("answer.w1"));
    let RouteDecision::Store { dest, .. } = decision else {
        panic!("{decision:?}")
    };
    let (worker, task_id) = (WorkerId::new("w1").unwrap(), "t".parse().unwrap());
    assert_eq!(dest, Dest::Answer { worker, task_id });
    let wrong = answer("w2");
    let decision = route(&IngressView {
        subject: "hub.pub.alice.answer.w1",
        headers: &[],
        payload: wrong.as_bytes(),
        ingress_seq: 1,
        status: None,
        now_ms: 0,
    });
    assert!(
        matches!(decision, RouteDecision::Reject { .. }),
        "{decision:?}"
    );
}

#[test]
fn only_the_worker_named_in_a_task_channel_message_may_publish_it() {
    let forged = [
        // An agent forging w1's result.
        (
            "alice",
            r#"{"result":{"worker_id":"w1","state":"completed"}}"#,
        ),
        // A worker forging another's status.
        ("w2", r#"{"status":{"worker_id":"w1"}}"#),
        // Not a task channel body at all.
        ("alice", r#""chatter""#),
        ("w1", r#"{"result":{"state":"completed"}}"#),
        (
            "w1",
            r#"{"result":{"worker_id":"w1"},"status":{"worker_id":"w1"}}"#,
        ),
    ];
    for (from, body) in forged {
        let payload = format!(r#"{{"meta":{{"id":"x1"}},"body":{body}}}"#);
        let (sender, id, kind) = rejected(run(
            &format!("hub.pub.{from}.task.alice.t1"),
            &[],
            payload.as_bytes(),
        ));
        assert_eq!(
            (sender.as_str(), kind),
            (from, WireErrorKind::Unauthorized),
            "{body}"
        );
        assert_eq!(id, Some(mid("x1")));
    }
    // In a bundle, every item must be the sender's.
    let bundle = r#"{"meta":{"id":"b1"},"body":{"bundle":[
        {"meta":{"id":"i1"},"body":{"status":{"worker_id":"w1"}}},
        {"meta":{"id":"i2"},"body":{"result":{"worker_id":"w2"}}}]}}"#;
    let (_, _, kind) = rejected(run("hub.pub.w1.task.alice.t1", &[], bundle.as_bytes()));
    assert_eq!(kind, WireErrorKind::Unauthorized);
    for body in [
        r#"{"result":{"worker_id":"w1"}}"#,
        r#"{"status":{"worker_id":"w1"}}"#,
        r#"{"answer_refused":{"worker_id":"w1"}}"#,
    ] {
        let payload = format!(r#"{{"meta":{{"id":"x1"}},"body":{body}}}"#);
        assert_eq!(
            run("hub.pub.w1.task.alice.t1", &[], payload.as_bytes()).subject(),
            Some("channel.task.alice.t1"),
            "{body}"
        );
    }
}

#[test]
fn a_task_id_reused_by_another_sender_is_not_a_repeat_of_the_first() {
    let body = r#"{"meta":{"id":"m-task"},"body":{"version":1,"task_id":"t-1","text":"do it"}}"#;
    let msg_id = |from: &str| {
        run(&format!("hub.pub.{from}.work.q"), &[], body.as_bytes())
            .msg_id()
            .map(str::to_owned)
    };
    assert_eq!(
        msg_id("alice"),
        msg_id("alice"),
        "the same sender's repeat dedupes"
    );
    assert_ne!(
        msg_id("alice"),
        msg_id("bob"),
        "another sender's is its own task"
    );
}

fn run_at(subject: &str, payload: &str, now_ms: u64) -> RouteDecision {
    route(&IngressView {
        subject,
        headers: &[],
        payload: payload.as_bytes(),
        ingress_seq: 7,
        status: None,
        now_ms,
    })
}

#[test]
fn a_dm_or_broadcast_past_its_deadline_is_refused_as_expired() {
    let dm = r#"{"meta":{"id":"m1","to":"bob","expires_at":5000},"body":"hi"}"#;
    for now in [5_000, 9_999] {
        let (sender, id, kind) = rejected(run_at("hub.pub.alice.inbox", dm, now));
        assert_eq!(
            (sender, id, kind),
            (agent("alice"), Some(mid("m1")), WireErrorKind::Expired)
        );
    }
    let news = r#"{"meta":{"id":"n1","expires_at":5000},"body":"hi"}"#;
    let (_, _, kind) = rejected(run_at("hub.pub.alice.news", news, 6_000));
    assert_eq!(kind, WireErrorKind::Expired);
}

#[test]
fn a_live_dm_is_stored_with_the_seconds_it_has_left() {
    let dm = r#"{"meta":{"id":"m1","to":"bob","expires_at":5000},"body":"hi"}"#;
    let RouteDecision::Store {
        dest: Dest::Inbox {
            ttl_secs,
            expires_at,
            ..
        },
        payload,
        ..
    } = run_at("hub.pub.alice.inbox", dm, 1_500)
    else {
        panic!("not stored")
    };
    assert_eq!((ttl_secs, expires_at), (Some(4), Some(5_000)));
    // The deadline travels with the stored envelope, for the inbox consumer's own check.
    assert_eq!(
        decoded(&payload, Codec::Json).meta.expires_at(),
        Some(5_000)
    );
    let RouteDecision::Store {
        dest: Dest::Inbox { ttl_secs, .. },
        ..
    } = run_at("hub.pub.alice.inbox", PLAIN_DM, 1_500)
    else {
        panic!("not stored")
    };
    assert_eq!(ttl_secs, None, "no deadline, no TTL");
}

#[test]
fn an_expires_at_that_is_not_an_unsigned_integer_is_malformed() {
    for bad in [r#""soon""#, "-1", "1.5", "{}"] {
        let dm = format!(r#"{{"meta":{{"id":"m1","to":"bob","expires_at":{bad}}},"body":"hi"}}"#);
        let (_, _, kind) = rejected(run_at("hub.pub.alice.inbox", &dm, 0));
        assert_eq!(kind, WireErrorKind::Malformed, "{bad}");
    }
}
