//! The router's decision for one ingress message, as a pure function.
//!
//! [`route`] applies, in order:
//!
//! 1. the replay guard: a non-ingress subject, a replay header
//!    ([`headers::REPLAY_HEADERS`]) or a router `Nats-Msg-Id`
//!    ([`subjects::is_router_msg_id`]) gives [`RouteDecision::Drop`];
//! 2. the sender identity and channel from the subject;
//! 3. the codec from the `Content-Type` header (JSON when absent);
//! 4. decoding (size limit first); what does not decode and is a broker's reply (JSON with a
//!    `type` of `io.nats.jetstream.api.…`, or a publish ack, aimed at an ingress subject
//!    through the unchecked reply subject of a request or publish) gives
//!    [`RouteDecision::Drop`], no notice;
//! 5. `meta.from` := the identity in the subject (it is authoritative);
//! 6. the destination, typed ([`Dest`]): `meta.to`'s inbox, the task channel (a
//!    [bundle](bundle_items) there is stored as its items, [`RouteDecision::StoreAll`]), the
//!    work stream, a worker's answers, or a broadcast (not stored, [`RouteDecision::Broadcast`]);
//! 7. re-encoding with the same codec.
//!
//! A failure in steps 3 to 7 is the sender's fault and gives
//! [`RouteDecision::Reject`]; see [`rejection`](mod@crate::rejection) for the notice sent
//! back.
//!
//! ```
//! use protocol::routing::{route, IngressView, RouteDecision};
//!
//! let view = IngressView {
//!     subject: "hub.pub.alice.inbox",
//!     headers: &[],
//!     payload: br#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#,
//!     ingress_seq: 1,
//!     status: None,
//!     now_ms: 0,
//! };
//! let RouteDecision::Store { subject, msg_id, .. } = route(&view) else { panic!() };
//! assert_eq!(subject, "channel.inbox.bob");
//! assert_eq!(msg_id, "hub-router:alice:m1");
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::envelope::{encode, Codec, Decoded, EnvelopeError, MAX_ENVELOPE_BYTES};
use crate::expiry::{expiry, Expiry};
use crate::headers::{self, CONTENT_TYPE, NATS_MSG_ID};
use crate::ids::{AgentId, MessageId, QueueName, WorkerId};
use crate::subjects::{self, Channel, TaskChannel};
use crate::task;
use crate::wire_error::{WireError, WireErrorKind};

mod bundle;
mod dest;
pub use bundle::{bundle_body, bundle_items, StoredItem, BUNDLE_KEY, MAX_BUNDLE_ITEMS};
pub use dest::Dest;

/// Detail of the rejection of a direct message without `meta.to`.
pub const MISSING_RECIPIENT_DETAIL: &str = "a direct message needs meta.to";
/// The detail of the rejection of a message whose `meta.expires_at` had come when it was
/// routed.
pub const EXPIRED_DETAIL: &str = "the message expired before it was routed (meta.expires_at)";

/// One ingress message as the router sees it.
#[derive(Debug, Clone, Copy)]
pub struct IngressView<'a> {
    /// The stored message's subject (a pull delivery keeps the original
    /// subject, so this is what the replay guard checks).
    pub subject: &'a str,
    /// All headers of the message as (name, value) pairs; may be empty. A
    /// header with several values appears once per value.
    pub headers: &'a [(&'a str, &'a str)],
    /// The raw payload.
    pub payload: &'a [u8],
    /// Stream sequence in durable mode; a local counter in core mode. Not
    /// used by [`route`]; the caller passes it to
    /// [`rejection`](crate::rejection::rejection).
    pub ingress_seq: u64,
    /// The NATS status of a status message (a JetStream pull's `404 No Messages`, `408`,
    /// `409`): no client publishes one, so one in the ingress is an API reply aimed there.
    pub status: Option<u16>,
    /// The router's clock, unix milliseconds: a DM or broadcast whose `meta.expires_at` has
    /// come is refused ([`crate::expiry`]).
    pub now_ms: u64,
}

/// What the router does with one ingress message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteDecision {
    /// Store in a stream ([`Dest`]: an inbox, a task channel, the work stream or an answer)
    /// with a JetStream publish carrying `Nats-Msg-Id` = `msg_id`.
    Store {
        /// Where it goes, typed.
        dest: Dest,
        /// The stored subject, [`Dest::subject`] (built once).
        subject: String,
        /// `hub-router:<from>:<meta.id>`, or a task input's
        /// [`task_msg_id`](crate::task::task_msg_id).
        msg_id: String,
        /// The re-encoded envelope, with `meta.from` set to the sender.
        payload: Vec<u8>,
        /// The codec of `payload` (set `Content-Type` when not JSON).
        codec: Codec,
        /// The sender, from the ingress subject.
        from: AgentId,
        /// `meta.id` of the envelope.
        id: MessageId,
    },
    /// Store several messages, in order, on one task channel (a [bundle](bundle_items)); the
    /// ingress message is acked once all are stored.
    StoreAll {
        /// The task channel.
        channel: TaskChannel,
        /// `channel.task.<delegator>.<key>`.
        subject: String,
        /// The items, in bundle order.
        items: Vec<StoredItem>,
        /// The codec of every item's payload.
        codec: Codec,
        /// The sender, from the ingress subject.
        from: AgentId,
        /// `meta.id` of the bundle envelope.
        id: MessageId,
    },
    /// Publish live with core NATS (broadcast `channel.<name>`).
    Broadcast {
        /// `channel.<name>`.
        subject: String,
        /// The re-encoded envelope, with `meta.from` set to the sender.
        payload: Vec<u8>,
        /// The codec of `payload`.
        codec: Codec,
        /// The sender, from the ingress subject.
        from: AgentId,
        /// `meta.id` of the envelope.
        id: MessageId,
    },
    /// Bad input from a known sender: terminate, count, and tell the sender
    /// (see [`rejection`](crate::rejection::rejection)).
    Reject {
        /// The sender, from the ingress subject.
        sender: AgentId,
        /// `meta.id` of the refused envelope, when it could be salvaged.
        rejected_id: Option<MessageId>,
        /// Why it was refused.
        error: WireError,
    },
    /// Replay guard or unparseable subject: terminate and count; nobody is
    /// told.
    Drop {
        /// Which guard rule matched.
        reason: DropReason,
    },
}

impl RouteDecision {
    /// The subject to publish to; `None` for [`Reject`](Self::Reject) and
    /// [`Drop`](Self::Drop).
    pub fn subject(&self) -> Option<&str> {
        match self {
            RouteDecision::Store { subject, .. }
            | RouteDecision::StoreAll { subject, .. }
            | RouteDecision::Broadcast { subject, .. } => Some(subject),
            RouteDecision::Reject { .. } | RouteDecision::Drop { .. } => None,
        }
    }

    /// The `Nats-Msg-Id` to publish with; only [`Store`](Self::Store) has
    /// one.
    pub fn msg_id(&self) -> Option<&str> {
        match self {
            RouteDecision::Store { msg_id, .. } => Some(msg_id),
            _ => None,
        }
    }
}

/// Why the router dropped a message without telling anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The subject is not `hub.pub.<id>.<channel>` (e.g. a replayed pull
    /// delivery keeps its stored subject).
    NotIngressSubject,
    /// A direct/message get header ([`headers::REPLAY_HEADERS`]) is present.
    ReplayHeader,
    /// The `Nats-Msg-Id` is one the router stored (`hub-router:`).
    RouterMessageId,
    /// A broker's reply: a pull's status (a status code; or, stored, an empty message or
    /// one with [`headers::PULL_STATUS_HEADERS`] — no envelope is empty), a JSON object
    /// whose `type` is `io.nats.jetstream.api.…`, or a publish ack (both checked only for what
    /// does not decode as an envelope). The reply subject of a request or publish is not
    /// permission-checked, so within one account an identity can aim one at another's
    /// ingress subject.
    ApiReply,
}

impl DropReason {
    /// Every reason, in declaration order.
    pub const ALL: [DropReason; 4] = [
        DropReason::NotIngressSubject,
        DropReason::ReplayHeader,
        DropReason::RouterMessageId,
        DropReason::ApiReply,
    ];

    /// The snake_case name, as serialized (usable as a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::NotIngressSubject => "not_ingress_subject",
            DropReason::ReplayHeader => "replay_header",
            DropReason::RouterMessageId => "router_message_id",
            DropReason::ApiReply => "api_reply",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides what to do with one ingress message. Never panics.
///
/// See the [module docs](self) for the rules and their order. Header names
/// are compared case-insensitively; when `Content-Type` appears several
/// times the first one counts, while every `Nats-Msg-Id` is checked by the
/// replay guard.
pub fn route(view: &IngressView<'_>) -> RouteDecision {
    let Some((from, target)) = parse_target(view.subject) else {
        return dropped(DropReason::NotIngressSubject);
    };
    if let Some(reason) = header_guard(view.headers) {
        return dropped(reason);
    }
    // A pull's status aimed at an ingress subject: live (core mode) it has a status; stored,
    // it has lost its status line and is empty, or carries the server's pending counts.
    if view.status.is_some()
        || view.payload.is_empty()
        || view
            .headers
            .iter()
            .any(|(n, _)| headers::is_pull_status_header(n))
    {
        return dropped(DropReason::ApiReply);
    }
    let codec = match Codec::from_content_type(header(view.headers, CONTENT_TYPE)) {
        Ok(codec) => codec,
        // The payload may still be JSON; worth a try for the id.
        Err(err) => return reject(from, salvage_id(view.payload, Codec::Json), &err),
    };
    // A DM's or a broadcast's body is never read here: it is kept as written, and only its
    // `meta` decoded (`envelope::Decoded`).
    let opaque = matches!(
        &target,
        Target::Channel(Channel::Inbox | Channel::Broadcast(_))
    );
    let mut env = match Decoded::decode(view.payload, codec, opaque) {
        Ok(env) => env,
        Err(_) if is_api_reply(view.payload) => return dropped(DropReason::ApiReply),
        Err(err) => return reject(from, salvage_id(view.payload, codec), &err),
    };
    env.set_from(from.clone());
    let id = env.meta().id.clone();
    let refuse = |error: WireError| RouteDecision::Reject {
        sender: from.clone(),
        rejected_id: Some(id.clone()),
        error,
    };
    // A DM or broadcast past its deadline is never delivered (tasks carry their own
    // `expires_at`, which the worker checks; other envelopes' `meta.expires_at` is theirs).
    let timed = matches!(
        &target,
        Target::Channel(Channel::Inbox | Channel::Broadcast(_))
    );
    if timed && env.meta().has_invalid_expires_at() {
        return refuse(WireError::new(
            WireErrorKind::Malformed,
            "envelope field `meta.expires_at` must be an unsigned integer (unix milliseconds)",
        ));
    }
    let ttl_secs = match (&target, expiry(env.meta().expires_at(), view.now_ms)) {
        (Target::Channel(Channel::Inbox | Channel::Broadcast(_)), Expiry::Expired) => {
            return refuse(WireError::new(WireErrorKind::Expired, EXPIRED_DETAIL))
        }
        (Target::Channel(Channel::Inbox), Expiry::Live { ttl_secs }) => Some(ttl_secs),
        _ => None,
    };
    let expires_at = ttl_secs.and(env.meta().expires_at());
    // (destination, stable Nats-Msg-Id); a broadcast is not stored.
    let (dest, msg_id) = match target {
        Target::Channel(Channel::Inbox) => match &env.meta().to {
            Some(to) => (
                Dest::Inbox {
                    to: to.clone(),
                    ttl_secs,
                    expires_at,
                },
                subjects::router_msg_id(&from, &id),
            ),
            None => {
                return refuse(WireError::new(
                    WireErrorKind::InvalidRecipient,
                    MISSING_RECIPIENT_DETAIL,
                ))
            }
        },
        Target::Channel(Channel::Task(channel)) => {
            let body = env.body();
            if let Some(items) = bundle_items(&body) {
                let items = match items {
                    Ok(items) => items,
                    Err(error) => return refuse(error),
                };
                let mut stored = Vec::with_capacity(items.len());
                for mut item in items {
                    if let Err(error) = from_its_worker(&item.body, &from) {
                        return refuse(error);
                    }
                    item.meta.from = Some(from.clone());
                    let payload = match encode(&item, codec) {
                        Ok(payload) => payload,
                        Err(err) => return reject(from, Some(id), &err),
                    };
                    stored.push(StoredItem {
                        msg_id: subjects::router_msg_id(&from, &item.meta.id),
                        payload,
                        id: item.meta.id,
                    });
                }
                return RouteDecision::StoreAll {
                    subject: channel.subject(),
                    channel,
                    items: stored,
                    codec,
                    from,
                    id,
                };
            }
            if let Err(error) = from_its_worker(&body, &from) {
                return refuse(error);
            }
            let msg_id = subjects::router_msg_id(&from, &id);
            (Dest::TaskChannel(channel), msg_id)
        }
        Target::Channel(Channel::Broadcast(name)) => {
            return match env.encode(codec) {
                Ok(payload) => RouteDecision::Broadcast {
                    subject: subjects::broadcast(&name),
                    payload,
                    codec,
                    from,
                    id,
                },
                Err(err) => reject(from, Some(id), &err),
            };
        }
        // A task is validated strictly here; its Nats-Msg-Id is derived from the task id, so
        // the same task submitted twice within the duplicate window is stored once.
        Target::Work { queue, worker } => match task::decode_task(&env.body()) {
            Ok(spec) => (
                Dest::Work {
                    queue,
                    worker,
                    task_id: spec.task_id.clone(),
                },
                task::task_msg_id(&from, &spec.task_id),
            ),
            Err(err) => return refuse(err.to_wire()),
        },
        Target::Answer { worker } => {
            match serde_json::from_value::<task::Answer>(env.body().into_owned()) {
                Ok(answer) if answer.worker_id == worker => (
                    Dest::Answer {
                        worker,
                        task_id: answer.task_id,
                    },
                    subjects::router_msg_id(&from, &id),
                ),
                Ok(_) => {
                    return refuse(WireError::new(
                        WireErrorKind::InvalidRecipient,
                        "the answer's worker_id does not match the answer subject",
                    ))
                }
                Err(e) => return refuse(WireError::new(WireErrorKind::Malformed, e.to_string())),
            }
        }
    };
    match env.encode(codec) {
        Ok(payload) => RouteDecision::Store {
            subject: dest.subject(),
            dest,
            msg_id,
            payload,
            codec,
            from,
            id,
        },
        Err(err) => reject(from, Some(id), &err),
    }
}

/// Where an ingress subject points.
enum Target {
    /// `inbox`, `task.<delegator>.<key>` or a broadcast channel.
    Channel(Channel),
    /// `work.<queue>[.<worker>]`: a task for a queue (or one worker of it).
    Work {
        queue: QueueName,
        worker: Option<WorkerId>,
    },
    /// `answer.<worker>`: an answer for a waiting attempt of that worker.
    Answer { worker: WorkerId },
}

/// The sender identity and target of an ingress subject; work and answer subjects first (the
/// plain channel parser does not know them).
fn parse_target(subject: &str) -> Option<(AgentId, Target)> {
    if let Ok(Some((from, queue, worker))) = subjects::parse_work_ingress(subject) {
        return Some((from, Target::Work { queue, worker }));
    }
    if let Ok(Some((from, worker))) = subjects::parse_answer_ingress(subject) {
        return Some((from, Target::Answer { worker }));
    }
    let (from, channel) = subjects::parse_ingress(subject).ok()?;
    Some((from, Target::Channel(channel)))
}

fn dropped(reason: DropReason) -> RouteDecision {
    RouteDecision::Drop { reason }
}

fn reject(sender: AgentId, rejected_id: Option<MessageId>, err: &EnvelopeError) -> RouteDecision {
    RouteDecision::Reject {
        sender,
        rejected_id,
        error: WireError::from(err),
    }
}

/// A task channel message is a worker's: a result, a status or an answer refusal
/// (`{"result"|"status"|"answer_refused": {..}}`) whose `worker_id` is its sender, the identity
/// in the ingress subject. Anything else there (an agent's, or a worker's naming another
/// worker) is refused, kind `unauthorized`: the task channel is the record every attempt and
/// tracker trusts (docs/SECURITY.md).
fn from_its_worker(body: &serde_json::Value, from: &AgentId) -> Result<(), WireError> {
    let unauthorized = |detail: String| Err(WireError::new(WireErrorKind::Unauthorized, detail));
    let Some((kind, inner)) = body
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
        .filter(|(k, _)| matches!(k.as_str(), "result" | "status" | "answer_refused"))
    else {
        return unauthorized(
            "a task channel takes a worker's results, statuses and answer refusals only".into(),
        );
    };
    match inner.get("worker_id").and_then(|w| w.as_str()) {
        Some(worker) if worker == from.as_str() => Ok(()),
        Some(worker) => unauthorized(format!(
            "a {kind} of worker {worker} published by {from}: only the worker that holds the attempt publishes on its task channel"
        )),
        None => unauthorized(format!("a {kind} without a worker_id")),
    }
}

/// Whether `payload` is a broker's reply: a JetStream API reply (a JSON object whose `type`
/// starts with `io.nats.jetstream.api.`), or a publish ack (an object of `stream` and `seq`,
/// maybe `domain` and `duplicate`, and nothing else).
fn is_api_reply(payload: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<&'a str>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct PublishAck<'a> {
        #[serde(borrow)]
        stream: &'a str,
        seq: u64,
        #[serde(borrow, default)]
        domain: Option<&'a str>,
        #[serde(default)]
        duplicate: bool,
    }
    serde_json::from_slice::<Typed<'_>>(payload)
        .ok()
        .and_then(|t| t.kind)
        .is_some_and(|kind| kind.starts_with("io.nats.jetstream.api."))
        || serde_json::from_slice::<PublishAck<'_>>(payload).is_ok()
}

/// The replay guard's header rules.
fn header_guard(pairs: &[(&str, &str)]) -> Option<DropReason> {
    if pairs
        .iter()
        .any(|(name, _)| headers::is_replay_header(name))
    {
        return Some(DropReason::ReplayHeader);
    }
    let router_id = pairs.iter().any(|(name, value)| {
        name.eq_ignore_ascii_case(NATS_MSG_ID) && subjects::is_router_msg_id(value.trim())
    });
    router_id.then_some(DropReason::RouterMessageId)
}

/// The first value of header `name`, compared case-insensitively.
fn header<'a>(pairs: &[(&str, &'a str)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, value)| value)
}

#[derive(Deserialize)]
struct SalvageEnvelope {
    meta: SalvageMeta,
}

#[derive(Deserialize)]
struct SalvageMeta {
    id: MessageId,
}

/// Best effort: `meta.id` of an envelope that did not decode, if the
/// payload is a map with a `meta` map whose `id` is a valid [`MessageId`].
/// Payloads over [`MAX_ENVELOPE_BYTES`] are not parsed at all.
fn salvage_id(payload: &[u8], codec: Codec) -> Option<MessageId> {
    if payload.len() > MAX_ENVELOPE_BYTES {
        return None;
    }
    let salvaged: SalvageEnvelope = match codec {
        Codec::Json => serde_json::from_slice(payload).ok()?,
        Codec::MsgPack => rmp_serde::from_slice(payload).ok()?,
    };
    Some(salvaged.meta.id)
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod replies_tests;
#[cfg(test)]
mod tests;
