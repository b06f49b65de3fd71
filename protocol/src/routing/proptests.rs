//! Property tests of [`route`](super::route).

use proptest::prelude::*;
use serde_json::json;

use super::tests::{decoded, run, PLAIN_DM};
use super::*;
use crate::envelope::Envelope;
use crate::headers::{CONTENT_TYPE_MSGPACK, REPLAY_HEADERS};
use crate::ids::{ChannelName, MAX_TOKEN_LEN};
use crate::subjects::{TaskChannel, TaskKey};

fn agent_id() -> impl Strategy<Value = AgentId> {
    crate::ids::strategies::token(MAX_TOKEN_LEN).prop_map(|s| AgentId::new(s).unwrap())
}

fn message_id() -> impl Strategy<Value = MessageId> {
    "[!-~]{1,64}".prop_map(|s| MessageId::new(s).unwrap())
}

fn codec() -> impl Strategy<Value = Codec> {
    prop_oneof![Just(Codec::Json), Just(Codec::MsgPack)]
}

/// Mostly valid ingress subjects, sometimes anything.
fn any_subject() -> impl Strategy<Value = String> {
    let channel = prop_oneof![
        Just(Channel::Inbox),
        ("[a-z0-9]{1,6}", "[a-z0-9]{1,6}").prop_map(|(d, k)| Channel::Task(TaskChannel {
            delegator: AgentId::new(d).unwrap(),
            key: TaskKey::new(k).unwrap(),
        })),
        "[a-z]{1,6}"
            .prop_filter_map("reserved", |n| ChannelName::new(n).ok())
            .prop_map(Channel::Broadcast),
    ];
    prop_oneof![
        4 => (agent_id(), channel).prop_map(|(a, c)| subjects::ingress(&a, &c)),
        1 => "(hub\\.pub\\.|channel\\.)[a-z.*> ]{0,12}",
        1 => ".{0,24}",
    ]
}

fn any_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        proptest::sample::select(&REPLAY_HEADERS[..]).prop_map(str::to_owned),
        proptest::sample::select(&headers::PULL_STATUS_HEADERS[..]).prop_map(str::to_owned),
        Just("Nats-Msg-Id".to_owned()),
        Just("content-type".to_owned()),
        "[A-Za-z-]{1,12}",
    ];
    let value = prop_oneof![
        "hub-router:[a-z]{1,4}:[a-z0-9]{1,4}",
        Just(CONTENT_TYPE_MSGPACK.to_owned()),
        ".{0,12}",
    ];
    prop_oneof![
        2 => Just(Vec::new()),
        1 => proptest::collection::vec((name, value), 1..3),
    ]
}

fn any_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..48),
        3 => ("[a-z]{1,4}|[a-z.]{0,5}", "[!-~]{0,6}", any::<bool>()).prop_map(|(to, id, body)| {
            serde_json::to_vec(&json!({"meta": {"id": id, "to": to}, "body": body})).unwrap()
        }),
    ]
}

proptest! {
    #[test]
    fn dm_is_stored_in_the_recipient_inbox_under_the_sender_identity(
        from in agent_id(),
        to in agent_id(),
        id in message_id(),
        claimed in proptest::option::of(agent_id()),
        codec in codec(),
    ) {
        let mut env = Envelope::new(id.clone(), json!("hi"));
        env.meta.to = Some(to.clone());
        env.meta.from = claimed;
        let bytes = encode(&env, codec).unwrap();
        let headers = [(CONTENT_TYPE, codec.content_type())];
        let subject = subjects::ingress(&from, &Channel::Inbox);
        let decision = run(&subject, &headers, &bytes);
        let RouteDecision::Store { subject, msg_id, payload, codec: out, from: sender, id: out_id, .. } =
            decision else { return Err(TestCaseError::fail("not stored")) };
        prop_assert_eq!(subject, subjects::inbox(&to));
        prop_assert_eq!(msg_id, subjects::router_msg_id(&from, &id));
        prop_assert_eq!((out, &sender, &out_id), (codec, &from, &id));
        let routed = decoded(&payload, codec);
        prop_assert_eq!(routed.meta.from, Some(from));
        prop_assert_eq!(routed.meta.to, Some(to));
        prop_assert_eq!(routed.meta.id, id);
    }

    #[test]
    fn any_replay_header_in_any_case_drops(
        from in agent_id(),
        index in 0..REPLAY_HEADERS.len(),
        upper in proptest::collection::vec(any::<bool>(), 20),
    ) {
        let name: String = REPLAY_HEADERS[index].chars().zip(upper.iter().cycle())
            .map(|(c, &u)| if u { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() })
            .collect();
        let subject = subjects::ingress(&from, &Channel::Inbox);
        let decision = run(&subject, &[(name.as_str(), "1")], PLAIN_DM.as_bytes());
        prop_assert_eq!(decision, RouteDecision::Drop { reason: DropReason::ReplayHeader });
    }

    #[test]
    fn route_never_panics_and_only_delivers_to_delivery_subjects(
        subject in any_subject(),
        owned in any_headers(),
        payload in any_payload(),
    ) {
        let pairs: Vec<(&str, &str)> =
            owned.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let decision = run(&subject, &pairs, &payload);
        let parsed = subjects::parse_ingress(&subject).ok();
        let guarded = parsed.is_none()
            || pairs.iter().any(|(n, _)| headers::is_replay_header(n))
            || pairs.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case(NATS_MSG_ID) && subjects::is_router_msg_id(v.trim())
            })
            // A JetStream API reply (no generated payload carries a JSON `type`).
            || payload.is_empty()
            || pairs.iter().any(|(n, _)| headers::is_pull_status_header(n));
        prop_assert_eq!(guarded, matches!(decision, RouteDecision::Drop { .. }));
        match &decision {
            RouteDecision::Drop { .. } | RouteDecision::Reject { .. } => {
                prop_assert_eq!(decision.subject(), None);
                prop_assert_eq!(decision.msg_id(), None);
                if let RouteDecision::Reject { sender, .. } = &decision {
                    prop_assert_eq!(Some(sender), parsed.as_ref().map(|(from, _)| from));
                }
            }
            RouteDecision::Store { subject, msg_id, payload, codec, from, id, .. } => {
                prop_assert!(subjects::parse_inbox(subject).is_ok()
                    || subjects::parse_task(subject).is_ok());
                prop_assert_eq!(msg_id, &subjects::router_msg_id(from, id));
                prop_assert_eq!(Some(from), parsed.as_ref().map(|(from, _)| from));
                let routed = decoded(payload, *codec);
                prop_assert_eq!(routed.meta.from.as_ref(), Some(from));
            }
            RouteDecision::StoreAll { subject, items, codec, from, .. } => {
                prop_assert!(subjects::parse_task(subject).is_ok());
                prop_assert_eq!(Some(from), parsed.as_ref().map(|(from, _)| from));
                for item in items {
                    prop_assert_eq!(&item.msg_id, &subjects::router_msg_id(from, &item.id));
                    let routed = decoded(&item.payload, *codec);
                    prop_assert_eq!(routed.meta.from.as_ref(), Some(from));
                }
            }
            RouteDecision::Broadcast { subject, payload, codec, from, .. } => {
                prop_assert!(subjects::parse_broadcast(subject).is_ok());
                prop_assert_eq!(Some(from), parsed.as_ref().map(|(from, _)| from));
                let routed = decoded(payload, *codec);
                prop_assert_eq!(routed.meta.from.as_ref(), Some(from));
            }
        }
        if let Some(subject) = decision.subject() {
            prop_assert!(!subjects::is_ingress_subject(subject));
        }
    }
}
