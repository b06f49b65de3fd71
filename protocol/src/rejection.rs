//! The system envelope that tells a sender why the router refused its
//! envelope.
//!
//! A rejection is stored in the sender's own inbox, like a DM. It is marked
//! `"system": true` in `meta` and has no `meta.from`: every envelope the
//! router routes has a `meta.from` (the router sets it from the subject), so
//! an agent cannot forge a system envelope by adding `"system": true`
//! itself. [`is_system`] checks both.
//!
//! ```
//! use protocol::rejection::{is_system, parse_rejection, rejection};
//! use protocol::{AgentId, MessageId, WireError, WireErrorKind};
//!
//! let alice = AgentId::new("alice")?;
//! let error = WireError::new(WireErrorKind::InvalidRecipient, "a direct message needs meta.to");
//! let (subject, msg_id, env) = rejection(&alice, Some(&MessageId::new("m1")?), &error, 42);
//! assert_eq!(subject, "channel.inbox.alice");
//! assert_eq!(msg_id, "hub-system:reject:42");
//! assert!(is_system(&env));
//! assert_eq!(parse_rejection(&env).unwrap().error, error);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::envelope::Envelope;
use crate::ids::{AgentId, MessageId, QueueName, TaskId, WorkerId};
use crate::subjects;
use crate::wire_error::WireError;

pub use crate::subjects::{REJECTION_ID_PREFIX, SYSTEM_MSG_ID_PREFIX};
/// The `meta` field marking a system envelope (value `true`).
pub const SYSTEM_FIELD: &str = "system";
/// The `body.kind` of a rejection.
pub const REJECTED_KIND: &str = "rejected";

/// The body of a rejection, as a client reads it back (see
/// [`parse_rejection`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Why the envelope was refused.
    pub error: WireError,
    /// `meta.id` of the refused envelope, when the router could read it.
    pub rejected_id: Option<MessageId>,
    /// The ingress sequence of the refused message.
    pub ingress_seq: u64,
    /// For a limit (`inbox_full`, `rate_limited`): do not send again before this many
    /// seconds (see [`backpressure`](crate::backpressure)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    /// For a full inbox: whose (a client holds back its DMs to that recipient only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<AgentId>,
}

/// The `Nats-Msg-Id` of the rejection of ingress message `ingress_seq`:
/// `hub-system:reject:<ingress_seq>`.
pub fn rejection_msg_id(ingress_seq: u64) -> String {
    format!("{SYSTEM_MSG_ID_PREFIX}reject:{ingress_seq}")
}

/// Builds the rejection notice for `sender`.
///
/// Returns `(subject, msg_id, envelope)`: the sender's inbox
/// (`channel.inbox.<sender>`), the `Nats-Msg-Id` to store it under
/// ([`rejection_msg_id`]) and the envelope, whose `meta.id` is
/// `hub-reject-<ingress_seq>`, `meta.to` the sender, `meta.from` absent,
/// `meta.system` `true` and body
/// `{"kind":"rejected","error":{...},"rejected_id":...,"ingress_seq":n}`.
pub fn rejection(
    sender: &AgentId,
    rejected_id: Option<&MessageId>,
    error: &WireError,
    ingress_seq: u64,
) -> (String, String, Envelope) {
    refusal(sender, rejected_id, error, ingress_seq, None, None)
}

/// [`rejection`] for a limit: the body also carries `retry_after_secs` and the refused DM's
/// recipient `to` when they are `Some`.
pub fn refusal(
    sender: &AgentId,
    rejected_id: Option<&MessageId>,
    error: &WireError,
    ingress_seq: u64,
    retry_after_secs: Option<u64>,
    to: Option<&AgentId>,
) -> (String, String, Envelope) {
    let id = MessageId::new(format!("{REJECTION_ID_PREFIX}{ingress_seq}"))
        .expect("`hub-reject-<u64>` is printable ASCII and far below the id length limit");
    let mut body = json!({
        "kind": REJECTED_KIND,
        "error": error,
        "rejected_id": rejected_id,
        "ingress_seq": ingress_seq,
    });
    if let Some(secs) = retry_after_secs {
        body["retry_after_secs"] = json!(secs);
    }
    if let Some(to) = to {
        body["to"] = json!(to);
    }
    let mut env = Envelope::new(id, body);
    env.meta.to = Some(sender.clone());
    env.meta
        .extra
        .insert(SYSTEM_FIELD.into(), Value::Bool(true));
    (subjects::inbox(sender), rejection_msg_id(ingress_seq), env)
}

/// The `body.kind` of the notice that a DM expired before its recipient read it.
pub const EXPIRED_KIND: &str = "expired";

/// The `body.kind` of the notice that a DM was dead-lettered.
pub const UNDELIVERABLE_KIND: &str = "undeliverable";

/// A notice about a DM the hub could not deliver, as a client reads it back
/// ([`parse_notice`]): `{"kind": "expired" | "undeliverable", "message_id", "to", "inbox_seq",
/// "reason"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// Why: [`EXPIRED_KIND`] or [`UNDELIVERABLE_KIND`].
    pub kind: String,
    /// The `meta.id` of the DM.
    pub message_id: MessageId,
    /// Its recipient.
    pub to: AgentId,
    /// Its sequence in the inbox stream.
    pub inbox_seq: u64,
    /// Why it was dead-lettered (`max_deliver`, or the handler's `rejected: <reason>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Builds the notice telling `sender` that its DM `message_id` to `to` (stored at `inbox_seq`)
/// expired before `to` read it: `(subject, msg_id, envelope)` as [`rejection`], stored under
/// `hub-system:expired:<inbox_seq>` (so the two places that may tell it store it once within
/// the duplicate window), `meta.id` `hub-expired-<inbox_seq>`.
pub fn expired_notice(
    sender: &AgentId,
    to: &AgentId,
    message_id: &MessageId,
    inbox_seq: u64,
) -> (String, String, Envelope) {
    notice(sender, EXPIRED_KIND, to, message_id, inbox_seq, None)
}

/// Builds the notice telling `sender` that its DM `message_id` to `to` (stored at `inbox_seq`)
/// was dead-lettered for `reason`: as [`expired_notice`], kind [`UNDELIVERABLE_KIND`], stored
/// under `hub-system:undeliverable:<inbox_seq>`, `meta.id` `hub-undeliverable-<inbox_seq>`.
pub fn undeliverable_notice(
    sender: &AgentId,
    to: &AgentId,
    message_id: &MessageId,
    inbox_seq: u64,
    reason: &str,
) -> (String, String, Envelope) {
    notice(
        sender,
        UNDELIVERABLE_KIND,
        to,
        message_id,
        inbox_seq,
        Some(reason),
    )
}

/// A [`Notice`] of `kind` for `sender`, as `(subject, msg_id, envelope)`.
fn notice(
    sender: &AgentId,
    kind: &str,
    to: &AgentId,
    message_id: &MessageId,
    inbox_seq: u64,
    reason: Option<&str>,
) -> (String, String, Envelope) {
    let id = MessageId::new(subjects::notice_id(kind, inbox_seq))
        .expect("`hub-<kind>-<u64>` is a valid id");
    let mut body = json!({
        "kind": kind,
        "message_id": message_id,
        "to": to,
        "inbox_seq": inbox_seq,
    });
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    let mut env = Envelope::new(id, body);
    env.meta.to = Some(sender.clone());
    env.meta
        .extra
        .insert(SYSTEM_FIELD.into(), Value::Bool(true));
    (
        subjects::inbox(sender),
        format!("{SYSTEM_MSG_ID_PREFIX}{kind}:{inbox_seq}"),
        env,
    )
}

/// The `body.kind` of the notice that a task input was dead-lettered.
pub const TASK_UNDELIVERABLE_KIND: &str = "task_undeliverable";
/// The `body.kind` of the notice that an answer was dead-lettered (no worker took it).
pub const ANSWER_UNDELIVERABLE_KIND: &str = "answer_undeliverable";

/// A notice about a task input or an answer the hub could not deliver to a worker, as its
/// sender (the task's delegator) reads it back ([`parse_task_notice`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskNotice {
    /// [`TASK_UNDELIVERABLE_KIND`] or [`ANSWER_UNDELIVERABLE_KIND`].
    pub kind: String,
    /// The `meta.id` of the task's or the answer's envelope.
    pub message_id: MessageId,
    /// The task.
    pub task_id: TaskId,
    /// A task input's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueName>,
    /// An answer's worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerId>,
    /// Its sequence in the work stream (an input) or the answers stream (an answer).
    pub stream_seq: u64,
    /// Why: `max_deliver` (an input), `no_worker` (an answer no worker took in time).
    pub reason: String,
}

impl TaskNotice {
    /// Builds the notice for `recipient`: `(subject, msg_id, envelope)` as [`rejection`],
    /// stored under `hub-system:<kind>:<stream_seq>`, `meta.id` `hub-<kind>-<stream_seq>`.
    pub fn envelope(&self, recipient: &AgentId) -> (String, String, Envelope) {
        let (kind, seq) = (self.kind.as_str(), self.stream_seq);
        let id = MessageId::new(format!("hub-{kind}-{seq}")).expect("a valid id");
        let body = serde_json::to_value(self).expect("a notice serializes");
        let mut env = Envelope::new(id, body);
        env.meta.to = Some(recipient.clone());
        env.meta
            .extra
            .insert(SYSTEM_FIELD.into(), Value::Bool(true));
        (
            subjects::inbox(recipient),
            format!("{SYSTEM_MSG_ID_PREFIX}{kind}:{seq}"),
            env,
        )
    }
}

/// Reads a task notice back; `None` when `env` is not a system envelope whose body is one.
pub fn parse_task_notice(env: &Envelope) -> Option<TaskNotice> {
    let kind = env.body.get("kind")?;
    if !is_system(env)
        || (kind != &json!(TASK_UNDELIVERABLE_KIND) && kind != &json!(ANSWER_UNDELIVERABLE_KIND))
    {
        return None;
    }
    serde_json::from_value(env.body.clone()).ok()
}

/// Reads a notice back; `None` when `env` is not a system envelope whose body is one.
pub fn parse_notice(env: &Envelope) -> Option<Notice> {
    let kind = env.body.get("kind")?;
    if !is_system(env) || (kind != &json!(EXPIRED_KIND) && kind != &json!(UNDELIVERABLE_KIND)) {
        return None;
    }
    serde_json::from_value(env.body.clone()).ok()
}

/// Whether `env` is a system envelope: `meta.system` is `true` and there is
/// no `meta.from` (routed envelopes always have one).
pub fn is_system(env: &Envelope) -> bool {
    env.meta.from.is_none() && env.meta.extra.get(SYSTEM_FIELD) == Some(&Value::Bool(true))
}

/// Reads a rejection notice back; `None` when `env` is not a system
/// envelope whose body is a well-formed rejection.
pub fn parse_rejection(env: &Envelope) -> Option<Rejection> {
    if !is_system(env) || env.body.get("kind") != Some(&json!(REJECTED_KIND)) {
        return None;
    }
    serde_json::from_value(env.body.clone()).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::envelope::{decode, encode, Codec};
    use crate::routing::{route, IngressView, RouteDecision};
    use crate::wire_error::WireErrorKind;

    fn agent(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    fn error() -> WireError {
        WireError::new(WireErrorKind::Malformed, "malformed json envelope: eof")
    }

    #[test]
    fn rejection_has_the_documented_shape() {
        let id = MessageId::new("m1").unwrap();
        let (subject, msg_id, env) = rejection(&agent("alice"), Some(&id), &error(), 42);
        assert_eq!(subject, "channel.inbox.alice");
        assert_eq!(msg_id, "hub-system:reject:42");
        let wire: Value = serde_json::from_slice(&encode(&env, Codec::Json).unwrap()).unwrap();
        assert_eq!(
            wire,
            json!({
                "meta": {"id": "hub-reject-42", "to": "alice", "system": true},
                "body": {
                    "kind": "rejected",
                    "error": {"kind": "malformed", "detail": "malformed json envelope: eof"},
                    "rejected_id": "m1",
                    "ingress_seq": 42,
                },
            })
        );
        let (_, _, env) = rejection(&agent("alice"), None, &error(), u64::MAX);
        assert_eq!(env.meta.id.as_str(), format!("hub-reject-{}", u64::MAX));
        assert_eq!(env.body["rejected_id"], Value::Null);
        assert_eq!(env.body["ingress_seq"], json!(u64::MAX));
    }

    #[test]
    fn a_task_notice_round_trips() {
        let notice = TaskNotice {
            kind: TASK_UNDELIVERABLE_KIND.into(),
            message_id: MessageId::new("m1").unwrap(),
            task_id: TaskId::new("t1").unwrap(),
            queue: Some(QueueName::new("q").unwrap()),
            worker: None,
            stream_seq: 9,
            reason: "max_deliver".into(),
        };
        let (subject, msg_id, env) = notice.envelope(&agent("alice"));
        assert_eq!(subject, "channel.inbox.alice");
        assert_eq!(msg_id, "hub-system:task_undeliverable:9");
        assert_eq!(env.meta.id.as_str(), "hub-task_undeliverable-9");
        assert_eq!(parse_task_notice(&env), Some(notice));
        assert_eq!(parse_notice(&env), None);
        assert!(env.body.get("worker").is_none());
    }

    #[test]
    fn a_refusal_for_a_limit_carries_its_retry_after() {
        let id = MessageId::new("m1").unwrap();
        let full = WireError::new(WireErrorKind::InboxFull, "the inbox of bob is full");
        let (_, _, env) = refusal(
            &agent("alice"),
            Some(&id),
            &full,
            7,
            Some(30),
            Some(&agent("bob")),
        );
        assert_eq!(env.body["retry_after_secs"], json!(30));
        assert_eq!(env.body["to"], json!("bob"));
        assert_eq!(env.body["error"]["kind"], json!("inbox_full"));
        let back = parse_rejection(&env).unwrap();
        assert_eq!(back.retry_after_secs, Some(30));
        assert_eq!(back.to, Some(agent("bob")));
        assert_eq!(back.error.kind, WireErrorKind::InboxFull);
        // Without a limit there is no such field.
        let (_, _, env) = rejection(&agent("alice"), Some(&id), &error(), 7);
        assert!(env.body.get("retry_after_secs").is_none());
    }

    #[test]
    fn an_expired_notice_has_the_documented_shape() {
        let id = MessageId::new("m1").unwrap();
        let (subject, msg_id, env) = expired_notice(&agent("alice"), &agent("bob"), &id, 9);
        assert_eq!(subject, "channel.inbox.alice");
        assert_eq!(msg_id, "hub-system:expired:9");
        assert!(subjects::is_router_msg_id(&msg_id));
        let wire: Value = serde_json::from_slice(&encode(&env, Codec::Json).unwrap()).unwrap();
        assert_eq!(
            wire,
            json!({
                "meta": {"id": "hub-expired-9", "to": "alice", "system": true},
                "body": {"kind": "expired", "message_id": "m1", "to": "bob", "inbox_seq": 9},
            })
        );
        let notice = parse_notice(&env).unwrap();
        assert_eq!((notice.message_id, notice.inbox_seq), (id, 9));
        assert_eq!(parse_rejection(&env), None);
        let mut forged = env;
        forged.meta.from = Some(agent("mallory"));
        assert_eq!(parse_notice(&forged), None);
    }

    #[test]
    fn a_notice_pulled_back_at_the_ingress_is_dropped_by_the_replay_guard() {
        assert_eq!(SYSTEM_MSG_ID_PREFIX, "hub-system:");
        assert!(!SYSTEM_MSG_ID_PREFIX.starts_with(subjects::ROUTER_MSG_ID_PREFIX));
        // The router stores notices under it: one replayed at the ingress is dropped.
        assert!(subjects::is_router_msg_id(&rejection_msg_id(1)));
        assert!(rejection_msg_id(1).starts_with(SYSTEM_MSG_ID_PREFIX));
    }

    #[test]
    fn is_system_needs_the_flag_and_no_sender() {
        let (_, _, env) = rejection(&agent("bob"), None, &error(), 1);
        assert!(is_system(&env));
        let mut forged = env.clone();
        forged.meta.from = Some(agent("mallory"));
        assert!(!is_system(&forged));
        assert_eq!(parse_rejection(&forged), None);
        let mut unflagged = env.clone();
        unflagged
            .meta
            .extra
            .insert(SYSTEM_FIELD.into(), json!("true"));
        assert!(!is_system(&unflagged));
        let plain = decode(br#"{"meta":{"id":"m1"},"body":1}"#, Codec::Json).unwrap();
        assert!(!is_system(&plain));
        assert_eq!(parse_rejection(&plain), None);
    }

    #[test]
    fn an_agent_cannot_forge_a_system_envelope_through_the_router() {
        let payload = br#"{"meta":{"id":"hub-reject-1","to":"bob","system":true},"body":{"kind":"rejected"}}"#;
        let decision = route(&IngressView {
            subject: "hub.pub.mallory.inbox",
            headers: &[],
            payload,
            ingress_seq: 1,
            status: None,
            now_ms: 0,
        });
        let RouteDecision::Store { payload, .. } = decision else {
            panic!("{decision:?}")
        };
        assert!(!is_system(&decode(&payload, Codec::Json).unwrap()));
    }

    proptest! {
        #[test]
        fn rejection_round_trips_through_both_codecs(
            sender in crate::ids::strategies::token(32),
            id in proptest::option::of("[!-~]{1,32}"),
            seq in any::<u64>(),
            detail in ".{0,40}",
        ) {
            let sender = agent(&sender);
            let id = id.map(|id| MessageId::new(id).unwrap());
            let error = WireError::new(WireErrorKind::TooLarge, detail);
            let (subject, msg_id, env) = rejection(&sender, id.as_ref(), &error, seq);
            prop_assert_eq!(subjects::parse_inbox(&subject).unwrap(), sender.clone());
            prop_assert!(subjects::is_router_msg_id(&msg_id));
            for codec in [Codec::Json, Codec::MsgPack] {
                let back = decode(&encode(&env, codec).unwrap(), codec).unwrap();
                prop_assert!(is_system(&back));
                prop_assert_eq!(back.meta.to.as_ref(), Some(&sender));
                let expected = Rejection { error: error.clone(), rejected_id: id.clone(), ingress_seq: seq, retry_after_secs: None, to: None };
                prop_assert_eq!(parse_rejection(&back), Some(expected));
            }
        }
    }
}
