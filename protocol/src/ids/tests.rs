use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

type Validate = fn(&str) -> Result<(), IdError>;

/// Every validator of a subject-safe token, as `(kind, validate)`.
fn token_validators() -> Vec<(&'static str, Validate)> {
    vec![
        (AgentId::KIND, AgentId::validate),
        (WorkerId::KIND, WorkerId::validate),
        (TaskId::KIND, TaskId::validate),
        (QueueName::KIND, QueueName::validate),
        (ChannelName::KIND, ChannelName::validate),
        (
            crate::subjects::TaskKey::KIND,
            crate::subjects::TaskKey::validate,
        ),
    ]
}

#[test]
fn accepts_token_chars() {
    let id = AgentId::new("Agent_7-b").unwrap();
    assert_eq!(id.as_str(), "Agent_7-b");
    assert_eq!(id.to_string(), "Agent_7-b");
    assert_eq!("Agent_7-b".parse::<AgentId>().unwrap(), id);
    assert_eq!(AsRef::<str>::as_ref(&id), "Agent_7-b");
    assert_eq!(String::from(id), "Agent_7-b");
}

#[test]
fn rejects_empty() {
    assert_eq!(AgentId::new(""), Err(IdError::Empty { kind: "agent id" }));
    assert_eq!(
        MessageId::new(""),
        Err(IdError::Empty { kind: "message id" })
    );
}

#[test]
fn rejects_too_long() {
    assert!(AgentId::new("a".repeat(MAX_TOKEN_LEN)).is_ok());
    assert_eq!(
        AgentId::new("a".repeat(MAX_TOKEN_LEN + 1)),
        Err(IdError::TooLong {
            kind: "agent id",
            max: MAX_TOKEN_LEN,
            len: MAX_TOKEN_LEN + 1,
        })
    );
    assert!(MessageId::new("m".repeat(MAX_MESSAGE_ID_LEN)).is_ok());
    assert!(matches!(
        MessageId::new("m".repeat(MAX_MESSAGE_ID_LEN + 1)),
        Err(IdError::TooLong {
            max: MAX_MESSAGE_ID_LEN,
            ..
        })
    ));
}

#[test]
fn rejects_subject_syntax_in_tokens() {
    for (input, ch, index) in [
        ("bo.b", '.', 2),
        ("*", '*', 0),
        ("a>", '>', 1),
        ("a b", ' ', 1),
        ("a\tb", '\t', 1),
        ("a\u{0}", '\u{0}', 1),
        ("a:b", ':', 1),
        ("é", 'é', 0),
    ] {
        assert_eq!(
            TaskId::new(input),
            Err(IdError::InvalidChar {
                kind: "task id",
                ch,
                index
            }),
            "{input:?}"
        );
    }
}

#[test]
fn message_id_allows_printable_ascii() {
    let id = MessageId::new("hub-router:alice:01J.x*>@").unwrap();
    assert_eq!(id.as_str(), "hub-router:alice:01J.x*>@");
    assert!(matches!(
        MessageId::new("a b"),
        Err(IdError::InvalidChar {
            ch: ' ',
            index: 1,
            ..
        })
    ));
    assert!(matches!(
        MessageId::new("a\u{7f}"),
        Err(IdError::InvalidChar { ch: '\u{7f}', .. })
    ));
}

#[test]
fn channel_name_rejects_reserved() {
    for reserved in ["inbox", "task"] {
        assert_eq!(
            ChannelName::new(reserved),
            Err(IdError::Reserved {
                kind: "channel name",
                value: reserved.to_owned(),
            })
        );
    }
    assert!(ChannelName::new("Inbox").is_ok());
    assert!(ChannelName::new("general").is_ok());
    // Only channel names reserve these words.
    assert!(AgentId::new("inbox").is_ok());
}

#[test]
fn error_messages_name_the_problem() {
    assert_eq!(
        AgentId::new("age.t").unwrap_err().to_string(),
        "agent id contains invalid character '.' at byte 3"
    );
    assert_eq!(
        AgentId::new("a\nb").unwrap_err().to_string(),
        "agent id contains invalid character '\\n' at byte 1"
    );
    assert_eq!(
        WorkerId::new("").unwrap_err().to_string(),
        "worker id is empty"
    );
    assert_eq!(
        QueueName::new("q".repeat(130)).unwrap_err().to_string(),
        "queue name is 130 bytes long, the maximum is 128"
    );
    assert_eq!(
        ChannelName::new("task").unwrap_err().to_string(),
        "channel name `task` is reserved"
    );
    assert_eq!(ChannelName::new("task").unwrap_err().kind(), "channel name");
}

/// Every prefix of a `Nats-Msg-Id` or `meta.id` the hub itself stores under.
fn system_id_prefixes() -> Vec<&'static str> {
    vec![
        crate::subjects::ROUTER_MSG_ID_PREFIX,
        crate::rejection::SYSTEM_MSG_ID_PREFIX,
        crate::rejection::REJECTION_ID_PREFIX,
        crate::task::TASK_MSG_ID_PREFIX,
        crate::task::RESULT_MSG_ID_PREFIX,
        crate::task::STATUS_MSG_ID_PREFIX,
        crate::task::REFUSAL_MSG_ID_PREFIX,
        // Not exported: the prefix of a built bundle id, up to its first `:`.
        bundle_prefix(),
    ]
}

fn bundle_prefix() -> &'static str {
    let id = crate::task::bundle_msg_id(
        &TaskId::new("t").unwrap(),
        &crate::task::AttemptId::new("a").unwrap(),
        1,
        false,
    );
    let end = id.find(':').map_or(id.len(), |i| i + 1);
    Box::leak(id[..end].to_owned().into_boxed_str())
}

#[test]
fn agent_and_worker_ids_reject_the_reserved_system_prefix() {
    for value in ["hub-router", "hub-system", "hub-task", "hub-", "hub-x_1"] {
        let err = AgentId::new(value).expect_err(value);
        assert_eq!(
            err.to_string(),
            format!("agent id `{value}` starts with the reserved prefix `hub-`")
        );
        assert_eq!(err.kind(), "agent id");
        assert_eq!(
            err,
            IdError::ReservedPrefix {
                kind: "agent id",
                prefix: SYSTEM_ID_PREFIX,
                value: value.to_owned(),
            }
        );
        let err = WorkerId::new(value).expect_err(value);
        assert_eq!(
            err.to_string(),
            format!("worker id `{value}` starts with the reserved prefix `hub-`")
        );
        assert_eq!(err.kind(), "worker id");
    }
    // Only that exact prefix: the msg-id prefixes are case-sensitive.
    for value in [
        "hub",
        "hubby",
        "hub_router",
        "Hub-router",
        "HUB-x",
        "x-hub-router",
    ] {
        assert!(AgentId::new(value).is_ok(), "{value}");
        assert!(WorkerId::new(value).is_ok(), "{value}");
    }
}

#[test]
fn other_ids_do_not_reserve_the_system_prefix() {
    // Their values never start an ingress `Nats-Msg-Id`, so no collision is possible.
    assert!(TaskId::new("hub-router").is_ok());
    assert!(QueueName::new("hub-router").is_ok());
    assert!(ChannelName::new("hub-router").is_ok());
    assert!(MessageId::new("hub-router:a:b").is_ok());
}

#[test]
fn every_system_id_prefix_starts_with_the_reserved_prefix() {
    for prefix in system_id_prefixes() {
        assert!(prefix.starts_with(SYSTEM_ID_PREFIX), "{prefix}");
    }
}

#[test]
fn serde_is_a_plain_validated_string() {
    let id = AgentId::new("bob").unwrap();
    assert_eq!(serde_json::to_string(&id).unwrap(), "\"bob\"");
    assert_eq!(serde_json::from_str::<AgentId>("\"bob\"").unwrap(), id);
    let err = serde_json::from_str::<AgentId>("\"bo.b\"").unwrap_err();
    assert!(err.to_string().contains("invalid character '.'"), "{err}");
    assert!(serde_json::from_str::<ChannelName>("\"inbox\"").is_err());
    assert!(serde_json::from_str::<AgentId>("7").is_err());
}

#[test]
fn borrow_allows_str_lookups() {
    let mut map = HashMap::new();
    map.insert(AgentId::new("bob").unwrap(), 1);
    assert_eq!(map.get("bob"), Some(&1));
}

proptest! {
    #[test]
    fn valid_tokens_are_accepted(s in "[A-Za-z0-9_-]{1,128}") {
        let system = s.starts_with(SYSTEM_ID_PREFIX);
        prop_assert_eq!(AgentId::new(s.as_str()).is_ok(), !system);
        prop_assert_eq!(WorkerId::new(s.as_str()).is_ok(), !system);
        prop_assert!(TaskId::new(s.as_str()).is_ok());
        prop_assert!(QueueName::new(s.as_str()).is_ok());
        prop_assert!(MessageId::new(s.as_str()).is_ok());
        prop_assert_eq!(ChannelName::new(s.as_str()).is_ok(), s != "inbox" && s != "task");
    }

    #[test]
    fn valid_message_ids_are_accepted(s in "[!-~]{1,256}") {
        let id = MessageId::new(s.as_str()).unwrap();
        prop_assert_eq!(id.as_str(), s.as_str());
    }

    #[test]
    fn subject_syntax_is_rejected_by_every_validator(
        prefix in ".{0,20}",
        bad in prop::sample::select(vec!['.', '*', '>', ' ', '\t', '\n', '\r', '\u{0}', '\u{a0}']),
        suffix in ".{0,20}",
    ) {
        let input = format!("{prefix}{bad}{suffix}");
        for (kind, validate) in token_validators() {
            prop_assert!(validate(&input).is_err(), "{} accepted {:?}", kind, input);
        }
    }

    #[test]
    fn whitespace_and_controls_are_rejected_in_message_ids(
        prefix in ".{0,20}",
        bad in prop::sample::select(vec![' ', '\t', '\n', '\r', '\u{0}', '\u{7f}', '\u{a0}']),
        suffix in ".{0,20}",
    ) {
        let input = format!("{prefix}{bad}{suffix}");
        prop_assert!(MessageId::validate(&input).is_err(), "accepted {:?}", input);
    }

    #[test]
    fn accepted_tokens_only_contain_token_chars(s in ".{0,40}") {
        if AgentId::validate(&s).is_ok() {
            prop_assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
        }
        if MessageId::validate(&s).is_ok() {
            prop_assert!(s.bytes().all(|b| b.is_ascii_graphic()));
        }
    }

    #[test]
    fn ingress_msg_ids_of_valid_senders_never_carry_a_system_prefix(
        system in prop::sample::select(system_id_prefixes()),
        rest in "[A-Za-z0-9_-]{0,8}",
        id in "[!-~]{1,16}",
    ) {
        // A sender named like a system prefix, e.g. `hub-router`: its ingress msg id
        // `<from>:<meta.id>` would be `hub-router:...`.
        let candidate = format!("{}{rest}", system.trim_end_matches(':'));
        for validate in [AgentId::validate as Validate, WorkerId::validate] {
            if validate(&candidate).is_ok() {
                let ingress = format!("{candidate}:{id}");
                prop_assert!(
                    !system_id_prefixes().iter().any(|p| ingress.starts_with(p)),
                    "{} is a valid sender but its ingress msg id {} looks like the hub's",
                    candidate,
                    ingress
                );
            }
        }
    }

    #[test]
    fn serde_round_trips(s in "[A-Za-z0-9_-]{1,128}") {
        let id = TaskId::new(s).unwrap();
        let json = serde_json::to_string(&id).unwrap();
        prop_assert_eq!(serde_json::from_str::<TaskId>(&json).unwrap(), id);
    }
}
