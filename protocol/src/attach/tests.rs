use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::wire_error::WireErrorKind;

use DurableInboxMode::{Auto, Off, On};

fn bob() -> AgentId {
    AgentId::new("bob").unwrap()
}

fn reply() -> AttachReply {
    AttachReply {
        stream: "HUB_INBOX".into(),
        consumer: "inbox-bob".into(),
    }
}

fn refusal() -> WireError {
    WireError::new(WireErrorKind::Internal, "cannot create consumer")
}

fn outcomes() -> [AttachOutcome; 4] {
    [
        AttachOutcome::Attached(reply()),
        AttachOutcome::NoResponders,
        AttachOutcome::Timeout,
        AttachOutcome::Refused(refusal()),
    ]
}

fn durable() -> InboxPlan {
    InboxPlan::BindDurable {
        stream: "HUB_INBOX".into(),
        consumer: "inbox-bob".into(),
    }
}

fn existing() -> InboxPlan {
    InboxPlan::BindExisting {
        consumer: subjects::inbox_consumer(&bob()),
    }
}

fn is_fail(plan: &InboxPlan) -> bool {
    matches!(plan, InboxPlan::Fail(_))
}

#[test]
fn attach_reply_json_round_trip() {
    let response = AttachResponse::Attached(reply());
    let value = serde_json::to_value(&response).unwrap();
    assert_eq!(
        value,
        json!({"stream": "HUB_INBOX", "consumer": "inbox-bob"})
    );
    assert_eq!(
        serde_json::from_value::<AttachResponse>(value).unwrap(),
        response
    );
    assert_eq!(
        serde_json::from_value::<AttachReply>(json!({"stream": "S", "consumer": "C"})).unwrap(),
        AttachReply {
            stream: "S".into(),
            consumer: "C".into()
        }
    );
}

#[test]
fn refusal_json_round_trip() {
    let response = AttachResponse::Refused { error: refusal() };
    let value = serde_json::to_value(&response).unwrap();
    assert_eq!(
        value,
        json!({"error": {"kind": "internal", "detail": "cannot create consumer"}})
    );
    assert_eq!(
        serde_json::from_value::<AttachResponse>(value).unwrap(),
        response
    );
}

#[test]
fn responses_tolerate_extra_fields_and_reject_nonsense() {
    let with_extra = json!({"stream": "S", "consumer": "C", "version": 2});
    assert!(matches!(
        serde_json::from_value::<AttachResponse>(with_extra).unwrap(),
        AttachResponse::Attached(_)
    ));
    let future_kind = json!({"error": {"kind": "quota_exceeded"}});
    let AttachResponse::Refused { error } = serde_json::from_value(future_kind).unwrap() else {
        panic!("not a refusal")
    };
    assert_eq!(error.kind, WireErrorKind::Unknown);
    for nonsense in [json!({}), json!({"stream": "S"}), json!([]), json!("ok")] {
        assert!(serde_json::from_value::<AttachResponse>(nonsense).is_err());
    }
}

#[test]
fn response_converts_to_outcome() {
    assert_eq!(
        AttachOutcome::from(AttachResponse::Attached(reply())),
        AttachOutcome::Attached(reply())
    );
    assert_eq!(
        AttachOutcome::from(AttachResponse::Refused { error: refusal() }),
        AttachOutcome::Refused(refusal())
    );
}

#[test]
fn request_body_is_empty_json() {
    assert_eq!(ATTACH_REQUEST_BODY, b"{}");
    assert_eq!(subjects::attach_request(&bob()), "hub.delivery.bob.inbox");
}

#[test]
fn off_always_subscribes_core() {
    for outcome in outcomes() {
        assert_eq!(
            attach_fallback(Off, &bob(), outcome),
            InboxPlan::CoreSubscribe
        );
    }
    assert_eq!(when_consumer_missing(Off), InboxPlan::CoreSubscribe);
}

#[test]
fn on_table() {
    let [attached, none, timeout, refused] = outcomes();
    assert_eq!(attach_fallback(On, &bob(), attached), durable());
    assert_eq!(attach_fallback(On, &bob(), none), existing());
    assert_eq!(attach_fallback(On, &bob(), timeout), existing());
    let plan = attach_fallback(On, &bob(), refused);
    let InboxPlan::Fail(message) = plan else {
        panic!("{plan:?}")
    };
    assert_eq!(
        message.to_string(),
        "durable inbox attach for `bob` refused: internal: cannot create consumer"
    );
    assert!(is_fail(&when_consumer_missing(On)));
}

#[test]
fn auto_table() {
    let [attached, none, timeout, refused] = outcomes();
    assert_eq!(attach_fallback(Auto, &bob(), attached), durable());
    assert_eq!(
        attach_fallback(Auto, &bob(), none),
        InboxPlan::CoreSubscribe
    );
    assert_eq!(attach_fallback(Auto, &bob(), timeout), existing());
    assert!(is_fail(&attach_fallback(Auto, &bob(), refused)));
    assert_eq!(when_consumer_missing(Auto), InboxPlan::CoreSubscribe);
}

#[test]
fn bound_consumer_is_the_attach_reply_not_a_guess() {
    let other = AttachReply {
        stream: "TENANT_INBOX".into(),
        consumer: "custom".into(),
    };
    for mode in [Auto, On] {
        assert_eq!(
            attach_fallback(mode, &bob(), AttachOutcome::Attached(other.clone())),
            InboxPlan::BindDurable {
                stream: "TENANT_INBOX".into(),
                consumer: "custom".into()
            }
        );
    }
}

#[test]
fn mode_parses_case_insensitively() {
    for (text, mode) in [
        ("auto", Auto),
        ("AUTO", Auto),
        ("On", On),
        ("oN", On),
        ("off", Off),
        (" OFF\n", Off),
    ] {
        assert_eq!(text.parse::<DurableInboxMode>().unwrap(), mode, "{text}");
    }
    for mode in DurableInboxMode::ALL {
        assert_eq!(mode.to_string().parse::<DurableInboxMode>().unwrap(), mode);
    }
    assert_eq!(DurableInboxMode::default(), Auto);
    assert_eq!(ENV_DURABLE_INBOX, "NATS_HUB_DURABLE_INBOX");
}

#[test]
fn invalid_mode_names_the_accepted_values() {
    for text in ["", "yes", "1", "true", "durable", "of"] {
        let err = text.parse::<DurableInboxMode>().unwrap_err();
        assert_eq!(err.value, text);
        assert_eq!(
            err.to_string(),
            format!("invalid durable inbox mode `{text}`, expected one of auto, on, off")
        );
    }
}

#[test]
fn env_value_defaults_when_unset_or_blank() {
    assert_eq!(DurableInboxMode::from_env_value(None).unwrap(), Auto);
    assert_eq!(DurableInboxMode::from_env_value(Some("")).unwrap(), Auto);
    assert_eq!(DurableInboxMode::from_env_value(Some("  ")).unwrap(), Auto);
    assert_eq!(DurableInboxMode::from_env_value(Some("off")).unwrap(), Off);
    assert!(DurableInboxMode::from_env_value(Some("maybe")).is_err());
}

proptest! {
    #[test]
    fn bind_existing_always_names_the_identitys_consumer(
        id in crate::ids::strategies::token(64),
        mode_index in 0usize..3,
        outcome_index in 0usize..4,
    ) {
        let id = AgentId::new(id).unwrap();
        let mode = DurableInboxMode::ALL[mode_index];
        let outcome = outcomes()[outcome_index].clone();
        if let InboxPlan::BindExisting { consumer } = attach_fallback(mode, &id, outcome) {
            prop_assert_eq!(subjects::parse_inbox_consumer(&consumer).unwrap(), id);
        }
    }
}

#[test]
fn auto_on_a_known_durable_hub_binds_the_existing_consumer_when_nobody_answers() {
    use super::attach_fallback_on_durable_hub as on_durable;
    let bob = AgentId::new("bob").unwrap();
    assert_eq!(
        on_durable(DurableInboxMode::Auto, &bob, AttachOutcome::NoResponders),
        InboxPlan::BindExisting {
            consumer: "inbox-bob".into()
        }
    );
    // Everything else is as without the hint.
    assert_eq!(
        on_durable(DurableInboxMode::Off, &bob, AttachOutcome::NoResponders),
        InboxPlan::CoreSubscribe
    );
    assert_eq!(
        on_durable(DurableInboxMode::On, &bob, AttachOutcome::Timeout),
        InboxPlan::BindExisting {
            consumer: "inbox-bob".into()
        }
    );
}

mod task_read {
    use crate::attach::{task_read_direct_get, TaskRead};
    use crate::subjects::TaskKey;
    use crate::AgentId;

    fn body(requester: &str, read: &TaskRead) -> serde_json::Value {
        serde_json::from_slice(&task_read_direct_get(
            &AgentId::new(requester).unwrap(),
            read,
        ))
        .unwrap()
    }

    #[test]
    fn a_read_names_only_the_requesters_own_channel() {
        let key = TaskKey::new("t1").unwrap();
        let next = TaskRead {
            key: key.clone(),
            from_seq: Some(7),
        };
        assert_eq!(
            body("alice", &next),
            serde_json::json!({"seq": 7, "next_by_subj": "channel.task.alice.t1"})
        );
        let last = TaskRead {
            key,
            from_seq: None,
        };
        assert_eq!(
            body("bob", &last),
            serde_json::json!({"last_by_subj": "channel.task.bob.t1"})
        );
    }

    #[test]
    fn a_read_request_with_a_wildcard_key_or_an_unknown_field_is_refused() {
        for bad in [
            r#"{"key": "*"}"#,
            r#"{"key": ">"}"#,
            r#"{"key": "a.b"}"#,
            r#"{"key": "t1", "next_by_subj": "channel.task.bob.t1"}"#,
            r#"{"key": "t1", "stream": "HUB_INBOX"}"#,
        ] {
            assert!(
                serde_json::from_str::<TaskRead>(bad).is_err(),
                "{bad} was accepted"
            );
        }
        let ok: TaskRead = serde_json::from_str(r#"{"key": "t1", "from_seq": 3}"#).unwrap();
        assert_eq!(ok.from_seq, Some(3));
    }
}
