use proptest::prelude::*;

use super::*;
use crate::ids::{IdError, TaskId};

pub(super) fn agent(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn key(s: &str) -> TaskKey {
    TaskKey::new(s).unwrap()
}

fn chan(delegator: &str, k: &str) -> TaskChannel {
    TaskChannel {
        delegator: agent(delegator),
        key: key(k),
    }
}

fn name(s: &str) -> ChannelName {
    ChannelName::new(s).unwrap()
}

/// No wildcard, no whitespace, no empty token.
pub(super) fn is_well_formed(subject: &str) -> bool {
    !subject.contains(['*', '>'])
        && !subject.chars().any(char::is_whitespace)
        && subject.split('.').all(|token| !token.is_empty())
}

#[test]
fn builders_produce_the_documented_subjects() {
    let alice = agent("alice");
    assert_eq!(ingress(&alice, &Channel::Inbox), "hub.pub.alice.inbox");
    assert_eq!(
        ingress(&alice, &Channel::Task(chan("bob", "01JABC"))),
        "hub.pub.alice.task.bob.01JABC"
    );
    assert_eq!(
        ingress(&alice, &Channel::Broadcast(name("general"))),
        "hub.pub.alice.general"
    );
    assert_eq!(inbox(&alice), "channel.inbox.alice");
    assert_eq!(task(&chan("bob", "01JABC")), "channel.task.bob.01JABC");
    assert_eq!(tasks_of(&alice), "channel.task.alice.>");
    assert_eq!(task_read_request(&alice), "hub.delivery.alice.task");
    assert_eq!(broadcast(&name("general")), "channel.general");
    assert_eq!(attach_request(&alice), "hub.delivery.alice.inbox");
    assert_eq!(inbox_consumer(&alice), "inbox-alice");
    assert_eq!(
        router_msg_id(&alice, &MessageId::new("m-1").unwrap()),
        "hub-router:alice:m-1"
    );
}

#[test]
fn constants_are_valid_names_and_filters() {
    for stream in [INGRESS_STREAM, INBOX_STREAM, TASKS_STREAM] {
        validate_stream_name(stream).unwrap();
    }
    validate_durable_name(ROUTER_CONSUMER).unwrap();
    validate_durable_name(ATTACH_QUEUE_GROUP).unwrap();
    let alice = agent("alice");
    assert!(ingress(&alice, &Channel::Inbox).starts_with(INGRESS_FILTER.trim_end_matches('>')));
    assert!(inbox(&alice).starts_with(INBOX_FILTER.trim_end_matches('>')));
    assert!(task(&chan("a", "t")).starts_with(TASKS_FILTER.trim_end_matches('>')));
    assert_eq!(
        TASK_READ_FILTER.replace('*', "alice"),
        task_read_request(&alice)
    );
    assert_eq!(ATTACH_FILTER.replace('*', "alice"), attach_request(&alice));
    assert_eq!(STATUS_SUBJECT, "hub.admin.status");
    assert_eq!(WORKER_STATUS_SUBJECT, "hub.admin.workers");
    assert_eq!(ROUTER_MSG_ID_PREFIX, "hub-router:");
}

#[test]
fn task_key_is_the_full_task_id() {
    let a = TaskId::new("01JABCDEFGH0000000000000001").unwrap();
    let b = TaskId::new("01JABCDEFGH0000000000000002").unwrap();
    assert_eq!(TaskKey::from_task_id(&a).as_str(), a.as_str());
    assert_ne!(TaskKey::from_task_id(&a), TaskKey::from(&b));
}

#[test]
fn channel_knows_what_is_stored() {
    assert!(Channel::Inbox.is_stored());
    assert!(Channel::Task(chan("a", "t")).is_stored());
    assert!(!Channel::Broadcast(name("general")).is_stored());
}

#[test]
fn parse_ingress_accepts_each_channel() {
    assert_eq!(
        parse_ingress("hub.pub.alice.inbox").unwrap(),
        (agent("alice"), Channel::Inbox)
    );
    assert_eq!(
        parse_ingress("hub.pub.alice.task.bob.k1").unwrap(),
        (agent("alice"), Channel::Task(chan("bob", "k1")))
    );
    assert_eq!(
        parse_ingress("hub.pub.alice.general").unwrap(),
        (agent("alice"), Channel::Broadcast(name("general")))
    );
    assert!(is_ingress_subject("hub.pub.alice.inbox"));
}

#[test]
fn parse_ingress_rejects_malformed_subjects() {
    assert!(matches!(
        parse_ingress("channel.inbox.alice"),
        Err(SubjectError::WrongPrefix {
            expected: "hub.pub.",
            ..
        })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice"),
        Err(SubjectError::WrongTokenCount { found: 1, .. })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice.task.b.k.extra"),
        Err(SubjectError::WrongTokenCount { found: 5, .. })
    ));
    // The form before delegators were in the subject.
    assert!(matches!(
        parse_ingress("hub.pub.alice.task.k1"),
        Err(SubjectError::WrongTokenCount { found: 3, .. })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice.session.b.k"),
        Err(SubjectError::UnexpectedToken { expected: "task", ref found, .. }) if found == "session"
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice.task"),
        Err(SubjectError::InvalidToken {
            source: IdError::Reserved { .. },
            ..
        })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.*.inbox"),
        Err(SubjectError::InvalidToken {
            source: IdError::InvalidChar { ch: '*', .. },
            ..
        })
    ));
    assert!(matches!(
        parse_ingress("hub.pub..inbox"),
        Err(SubjectError::InvalidToken {
            source: IdError::Empty { kind: "agent id" },
            ..
        })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice."),
        Err(SubjectError::InvalidToken {
            source: IdError::Empty {
                kind: "channel name"
            },
            ..
        })
    ));
    assert!(matches!(
        parse_ingress("hub.pub.alice.>"),
        Err(SubjectError::InvalidToken { .. })
    ));
    assert!(!is_ingress_subject("channel.inbox.bob"));
    assert!(!is_ingress_subject("hub.pub.alice.task.>"));
}

#[test]
fn parse_stored_subjects() {
    assert_eq!(parse_inbox("channel.inbox.bob").unwrap(), agent("bob"));
    assert_eq!(
        parse_task("channel.task.bob.k1").unwrap(),
        chan("bob", "k1")
    );
    assert!(matches!(
        parse_task("channel.task.k1"),
        Err(SubjectError::WrongTokenCount { found: 1, .. })
    ));
    assert_eq!(
        parse_task_read_request("hub.delivery.bob.task").unwrap(),
        agent("bob")
    );
    assert!(parse_task_read_request("hub.delivery.bob.inbox").is_err());
    assert!(parse_task_read_request("hub.delivery.*.task").is_err());
    assert_eq!(parse_broadcast("channel.general").unwrap(), name("general"));
    assert!(matches!(
        parse_inbox("channel.inbox.bob.x"),
        Err(SubjectError::WrongTokenCount {
            expected: "1",
            found: 2,
            ..
        })
    ));
    assert!(matches!(
        parse_task("channel.inbox.bob"),
        Err(SubjectError::WrongPrefix {
            expected: "channel.task.",
            ..
        })
    ));
    // Stored channels are never broadcasts.
    assert!(matches!(
        parse_broadcast("channel.inbox.bob"),
        Err(SubjectError::WrongTokenCount { .. })
    ));
    assert!(matches!(
        parse_broadcast("channel.inbox"),
        Err(SubjectError::InvalidToken {
            source: IdError::Reserved { .. },
            ..
        })
    ));
}

#[test]
fn parse_attach_and_consumer_names() {
    assert_eq!(
        parse_attach_request("hub.delivery.bob.inbox").unwrap(),
        agent("bob")
    );
    assert!(matches!(
        parse_attach_request("hub.delivery.bob.task"),
        Err(SubjectError::UnexpectedToken {
            expected: "inbox",
            ..
        })
    ));
    assert!(matches!(
        parse_attach_request("hub.delivery.bob"),
        Err(SubjectError::WrongTokenCount { found: 1, .. })
    ));
    assert_eq!(parse_inbox_consumer("inbox-bob-2").unwrap(), agent("bob-2"));
    assert!(matches!(
        parse_inbox_consumer("router"),
        Err(SubjectError::WrongPrefix {
            expected: "inbox-",
            ..
        })
    ));
    assert!(matches!(
        parse_inbox_consumer("inbox-"),
        Err(SubjectError::InvalidToken {
            source: IdError::Empty { .. },
            ..
        })
    ));
}

#[test]
fn router_msg_ids() {
    let id = MessageId::new("a:b.c").unwrap();
    let msg_id = router_msg_id(&agent("alice"), &id);
    assert!(is_router_msg_id(&msg_id));
    assert!(!is_router_msg_id("m-1"));
    assert_eq!(parse_router_msg_id(&msg_id).unwrap(), (agent("alice"), id));
    assert!(matches!(
        parse_router_msg_id("hub-router:alice"),
        Err(SubjectError::InvalidToken {
            source: IdError::Empty { kind: "message id" },
            ..
        })
    ));
}

#[test]
fn durable_and_stream_names() {
    validate_durable_name("inbox-bob").unwrap();
    validate_stream_name("HUB_INBOX").unwrap();
    for bad in [
        "", "a.b", "a*", "a>", "a b", "a\tb", "a/b", "a\\b", "a\u{1}",
    ] {
        assert!(
            matches!(
                validate_durable_name(bad),
                Err(SubjectError::InvalidDurableName { .. })
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                validate_stream_name(bad),
                Err(SubjectError::InvalidStreamName { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(validate_durable_name(&"d".repeat(MAX_NAME_LEN)).is_ok());
    assert!(matches!(
        validate_stream_name(&"s".repeat(MAX_NAME_LEN + 1)),
        Err(SubjectError::InvalidStreamName {
            source: IdError::TooLong { .. },
            ..
        })
    ));
    assert_eq!(
        crate::error_chain::ErrorChain(&validate_durable_name("in.box").unwrap_err()).to_string(),
        "invalid durable name `in.box`: durable name contains invalid character '.' at byte 2"
    );
}

fn token_string() -> impl Strategy<Value = String> {
    crate::ids::strategies::token(128)
}

fn agent_id() -> impl Strategy<Value = AgentId> {
    token_string().prop_map(|s| AgentId::new(s).unwrap())
}

fn task_key() -> impl Strategy<Value = TaskKey> {
    token_string().prop_map(|s| TaskKey::new(s).unwrap())
}

fn task_channel() -> impl Strategy<Value = TaskChannel> {
    (agent_id(), task_key()).prop_map(|(delegator, key)| TaskChannel { delegator, key })
}

fn channel_name() -> impl Strategy<Value = ChannelName> {
    token_string().prop_filter_map("reserved", |s| ChannelName::new(s).ok())
}

fn channel() -> impl Strategy<Value = Channel> {
    prop_oneof![
        Just(Channel::Inbox),
        task_channel().prop_map(Channel::Task),
        channel_name().prop_map(Channel::Broadcast),
    ]
}

/// Strings that are often almost valid: token chars mixed with subject syntax.
fn messy() -> impl Strategy<Value = String> {
    prop_oneof!["[a-c_.*> \t-]{0,8}", ".{0,8}", token_string()]
}

/// Subject-like strings to feed the parsers.
fn messy_subject() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "hub.pub.",
        "channel.",
        "channel.inbox.",
        "channel.task.",
        "hub.delivery.",
        "inbox-",
        "",
    ]);
    (prefix, "[a-c.*>]{0,4}", "(inbox|task|)", "[a-c.]{0,4}")
        .prop_map(|(p, a, b, c)| format!("{p}{a}{b}{c}"))
}

proptest! {
    #[test]
    fn ingress_round_trips(from in agent_id(), channel in channel()) {
        let subject = ingress(&from, &channel);
        prop_assert!(is_well_formed(&subject), "{}", subject);
        prop_assert_eq!(parse_ingress(&subject).unwrap(), (from, channel));
    }

    #[test]
    fn stored_and_broadcast_subjects_round_trip(
        id in agent_id(),
        key in task_channel(),
        name in channel_name(),
    ) {
        let subjects = [inbox(&id), task(&key), broadcast(&name), attach_request(&id)];
        for subject in &subjects {
            prop_assert!(is_well_formed(subject), "{}", subject);
        }
        prop_assert_eq!(parse_inbox(&subjects[0]).unwrap(), id.clone());
        prop_assert_eq!(parse_task(&subjects[1]).unwrap(), key);
        prop_assert_eq!(parse_broadcast(&subjects[2]).unwrap(), name);
        prop_assert_eq!(parse_attach_request(&subjects[3]).unwrap(), id.clone());
        prop_assert!(parse_broadcast(&subjects[0]).is_err());
        prop_assert!(parse_broadcast(&subjects[1]).is_err());
    }

    #[test]
    fn consumer_names_are_valid_durable_names(id in agent_id()) {
        let name = inbox_consumer(&id);
        prop_assert!(!name.contains('.'));
        prop_assert!(validate_durable_name(&name).is_ok());
        prop_assert_eq!(parse_inbox_consumer(&name).unwrap(), id);
    }

    #[test]
    fn router_msg_ids_round_trip(from in agent_id(), id in "[!-~]{1,256}") {
        let id = MessageId::new(id).unwrap();
        let msg_id = router_msg_id(&from, &id);
        prop_assert!(is_router_msg_id(&msg_id));
        prop_assert_eq!(parse_router_msg_id(&msg_id).unwrap(), (from, id));
    }

    #[test]
    fn accepted_inputs_never_build_wildcards_or_empty_tokens(
        a in messy(),
        b in messy(),
    ) {
        let (Ok(id), Ok(key), Ok(name)) = (AgentId::new(a.clone()), TaskKey::new(b.clone()), ChannelName::new(b)) else {
            return Ok(());
        };
        for subject in [
            ingress(&id, &Channel::Inbox),
            ingress(&id, &Channel::Task(TaskChannel { delegator: id.clone(), key: key.clone() })),
            ingress(&id, &Channel::Broadcast(name.clone())),
            inbox(&id),
            task(&TaskChannel { delegator: id.clone(), key: key.clone() }),
            broadcast(&name),
            attach_request(&id),
        ] {
            prop_assert!(is_well_formed(&subject), "{}", subject);
        }
        prop_assert!(validate_durable_name(&inbox_consumer(&id)).is_ok());
    }

    #[test]
    fn one_identity_never_reaches_into_another(
        a in agent_id(),
        suffix in "[A-Za-z0-9_-]{0,4}",
        other in agent_id(),
        channel in channel(),
    ) {
        // `b` is often `a` plus a suffix, the case a naive prefix check gets wrong.
        let extended = format!("{a}{suffix}");
        for b in [AgentId::new(extended).ok(), Some(other)].into_iter().flatten() {
            if a == b {
                continue;
            }
            let subject = ingress(&a, &channel);
            let b_space = format!("hub.pub.{b}.");
            prop_assert!(!subject.starts_with(&b_space), "{} in {}", subject, b_space);
            prop_assert_eq!(parse_ingress(&subject).unwrap().0, a.clone());
            prop_assert_ne!(inbox(&a), inbox(&b));
            let a_inbox = format!("{}.", inbox(&a));
            prop_assert!(!inbox(&b).starts_with(&a_inbox));
            prop_assert_ne!(attach_request(&a), attach_request(&b));
            prop_assert_ne!(inbox_consumer(&a), inbox_consumer(&b));
        }
    }

    #[test]
    fn parsers_accept_only_what_builders_produce(subject in messy_subject()) {
        if let Ok((from, channel)) = parse_ingress(&subject) {
            prop_assert_eq!(ingress(&from, &channel), subject.clone());
        }
        if let Ok(id) = parse_inbox(&subject) {
            prop_assert_eq!(inbox(&id), subject.clone());
        }
        if let Ok(key) = parse_task(&subject) {
            prop_assert_eq!(task(&key), subject.clone());
        }
        if let Ok(name) = parse_broadcast(&subject) {
            prop_assert_eq!(broadcast(&name), subject.clone());
        }
        if let Ok(id) = parse_attach_request(&subject) {
            prop_assert_eq!(attach_request(&id), subject.clone());
        }
        if let Ok(id) = parse_inbox_consumer(&subject) {
            prop_assert_eq!(inbox_consumer(&id), subject.clone());
        }
    }

    #[test]
    fn subject_syntax_is_rejected_in_every_token(
        prefix in "[a-z]{0,4}",
        bad in prop::sample::select(vec!['.', '*', '>', ' ', '\t', '\n']),
        suffix in "[a-z]{0,4}",
    ) {
        let input = format!("{prefix}{bad}{suffix}");
        prop_assert!(AgentId::new(input.as_str()).is_err());
        prop_assert!(TaskKey::new(input.as_str()).is_err());
        prop_assert!(ChannelName::new(input.as_str()).is_err());
        prop_assert!(validate_durable_name(&input).is_err());
        prop_assert!(validate_stream_name(&input).is_err());
    }
}

#[test]
fn the_task_ingress_filter_matches_every_senders_publish_to_the_channel() {
    let channel = TaskChannel::of(&agent("alice"), &crate::TaskId::new("t-1").unwrap());
    assert_eq!(task_ingress_filter(&channel), "hub.pub.*.task.alice.t-1");
}

#[test]
fn a_pulled_message_names_its_consumer_in_either_form_of_its_ack_subject() {
    assert_eq!(
        parse_ack_consumer("$JS.ACK.HUB_INBOX.inbox-bob.1.2.3.4.5"),
        Some("inbox-bob")
    );
    assert_eq!(
        parse_ack_consumer("$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.1.2.3.4.5.tok"),
        Some("inbox-bob")
    );
    assert_eq!(
        parse_ack_consumer("$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.1.2.3.4.5"),
        Some("inbox-bob")
    );
    assert_eq!(parse_ack_consumer("$JS.ACK.HUB_INBOX.inbox-bob.1.2"), None);
    assert_eq!(parse_ack_consumer("_INBOX.x.inbox-bob.1"), None);
}

#[test]
fn a_pull_reply_subject_round_trips_and_other_shapes_do_not_parse() {
    let prefix = "_INBOX.abc";
    let subject = pull_reply(prefix, "inbox-bob", 3, 7);
    assert_eq!(subject, "_INBOX.abc.inbox-bob.3.7");
    assert_eq!(
        parse_pull_reply(&subject, prefix.len()),
        Some((
            "inbox-bob",
            Some(PullId {
                incarnation: 3,
                pull: 7
            })
        ))
    );
    assert_eq!(
        parse_pull_reply("_INBOX.abc.inbox-bob.3.x", prefix.len()),
        Some(("inbox-bob", None))
    );
    assert_eq!(parse_pull_reply("_INBOX.abc.a.b.7.1", prefix.len()), None);
    assert_eq!(
        parse_pull_reply("_INBOX.abc.inbox-bob.7", prefix.len()),
        None
    );
    assert_eq!(parse_pull_reply("_INBOX.abcd", prefix.len()), None);
    assert_eq!(
        consumer_next_request("HUB_INBOX", "inbox-bob"),
        "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob"
    );
}

proptest! {
    #[test]
    fn an_ingress_msg_id_gives_back_its_logical_id(logical in "[ -~]{0,80}", seal in any::<u64>()) {
        let id = ingress_msg_id(&logical, seal);
        let seal = format!("~{seal:016x}");
        prop_assert_eq!(id.strip_suffix(seal.as_str()), Some(logical.as_str()));
        prop_assert!(!is_router_msg_id(&id) || is_router_msg_id(&logical));
    }
}
