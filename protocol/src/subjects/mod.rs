//! Every NATS subject, stream name and consumer name of the hub, built and
//! parsed in one place.
//!
//! | What                 | Subject / name                     |
//! |----------------------|------------------------------------|
//! | agent publishes      | `hub.pub.<id>.inbox`, `hub.pub.<id>.<name>` |
//! | worker publishes     | `hub.pub.<worker>.task.<delegator>.<key>` |
//! | inbox of an agent    | `channel.inbox.<id>`               |
//! | task channel         | `channel.task.<delegator>.<key>`   |
//! | task channel read    | `hub.delivery.<id>.task` (a delegator reads its own, through a router) |
//! | broadcast channel    | `channel.<name>`                   |
//! | attach request       | `hub.delivery.<id>.inbox`          |
//! | inbox consumer       | `inbox-<id>` on [`INBOX_STREAM`]   |
//! | router consumer      | [`ROUTER_CONSUMER`] on [`INGRESS_STREAM`] |
//!
//! Builders take validated ids, whose characters are `[A-Za-z0-9_-]`, so a
//! built subject never contains a wildcard or an empty token, and the
//! identity token of one agent can never reach into another's subjects.
//! Parsers are the inverse of the builders and reject anything else.
//!
//! ```
//! use protocol::ids::AgentId;
//! use protocol::subjects::{self, Channel};
//!
//! let alice = AgentId::new("alice").unwrap();
//! let subject = subjects::ingress(&alice, &Channel::Inbox);
//! assert_eq!(subject, "hub.pub.alice.inbox");
//! assert_eq!(subjects::parse_ingress(&subject).unwrap(), (alice, Channel::Inbox));
//! ```

mod ack;
mod channel;
mod error;
mod msg_id;
mod names;
mod parse;
mod work;

pub use ack::{parse_ack_consumer, parse_ack_info, AckInfo};
pub use channel::{Channel, TaskChannel, TaskKey};
pub use error::SubjectError;
pub use msg_id::*;
pub use names::{validate_durable_name, validate_stream_name, MAX_NAME_LEN};
pub use parse::{
    is_ingress_subject, parse_attach_request, parse_broadcast, parse_inbox, parse_inbox_consumer,
    parse_ingress, parse_router_msg_id, parse_task, parse_task_read_request,
};
pub use work::*;

use crate::ids::{AgentId, ChannelName, MessageId};

/// The stream that captures everything agents publish.
pub const INGRESS_STREAM: &str = "HUB_INGRESS";
/// The stream that stores direct messages, one subject per recipient.
pub const INBOX_STREAM: &str = "HUB_INBOX";
/// The stream that stores task channels.
pub const TASKS_STREAM: &str = "HUB_TASKS";

/// The subjects captured by [`INGRESS_STREAM`].
pub const INGRESS_FILTER: &str = "hub.pub.>";
/// The subjects captured by [`INBOX_STREAM`].
pub const INBOX_FILTER: &str = "channel.inbox.>";
/// The subjects captured by [`TASKS_STREAM`].
pub const TASKS_FILTER: &str = "channel.task.>";

/// The durable name of the shared router consumer on [`INGRESS_STREAM`].
pub const ROUTER_CONSUMER: &str = "router";
/// The queue group hub-servers answer attach requests in.
pub const ATTACH_QUEUE_GROUP: &str = "hub-delivery";
/// The subject filter hub-servers subscribe to for attach requests.
pub const ATTACH_FILTER: &str = "hub.delivery.*.inbox";
/// The subject filter of hub info requests ([`hub_info_request`]).
pub const HUB_INFO_FILTER: &str = "hub.delivery.*.hub";
/// The subject filter of task channel read requests ([`task_read_request`]).
pub const TASK_READ_FILTER: &str = "hub.delivery.*.task";
/// Core request/reply subject; a router answers with a JSON status snapshot.
pub const STATUS_SUBJECT: &str = "hub.admin.status";
/// Core scatter-gather subject: every worker answers a request with its JSON snapshot (no
/// queue group; `runtime status` collects the answers for a short window).
pub const WORKER_STATUS_SUBJECT: &str = "hub.admin.workers";
/// The default root of every reply subject the runtime's connections use (`_INBOX.<...>`;
/// per-identity prefixes such as `_INBOX.<id>.` are under it). Services answer requests only
/// on replies under their configured root: a reply subject is chosen by the requester and is
/// not permission-checked, so a reply aimed at, say, `hub.pub.<other>.inbox` would be stored
/// as `<other>`'s message.
pub const DEFAULT_REPLY_PREFIX: &str = "_INBOX";
/// The stream of the hub's scheduled checks (nats-server message schedules): a schedule on
/// `hub.sched.expiry.<inbox seq>` (one per DM with a deadline) fires at the DM's deadline as a
/// message on [`EXPIRY_DUE_SUBJECT`], which the routers' expiry consumer takes.
pub const SCHEDULES_STREAM: &str = "HUB_SCHEDULES";
/// The subjects of [`SCHEDULES_STREAM`].
pub const SCHEDULES_FILTER: &str = "hub.sched.>";
/// Where an expiry schedule fires (in [`SCHEDULES_STREAM`]).
pub const EXPIRY_DUE_SUBJECT: &str = "hub.sched.due.expiry";
/// Where an answer's check fires (in [`SCHEDULES_STREAM`]).
pub const ANSWER_DUE_SUBJECT: &str = "hub.sched.due.answer";
/// Every subject a schedule fires on: what the routers' shared `expiry` consumer takes.
pub const DUE_FILTER: &str = "hub.sched.due.>";
/// The durable name of the routers' shared consumer of [`DUE_FILTER`].
pub const EXPIRY_CONSUMER: &str = "expiry";
/// The stream capturing the broker's advisories about inbox deliveries the hub acts on (a DM
/// an inbox terminated as expired).
pub const ADVISORIES_STREAM: &str = "HUB_ADVISORIES";
/// The durable name of the routers' shared consumer of [`ADVISORIES_STREAM`].
pub const ADVISORIES_CONSUMER: &str = "advisories";

/// The dead-letter stream: a copy of each DM its inbox could not take (its deliveries ran out,
/// or its handler rejected it), on `dlq.<recipient>`.
pub const DLQ_STREAM: &str = "HUB_DLQ";
/// The subjects of [`DLQ_STREAM`].
pub const DLQ_FILTER: &str = "dlq.>";

/// The dead-letter subject of `to`'s DMs: `dlq.<to>`.
pub fn dlq(to: &AgentId) -> String {
    format!("dlq.{to}")
}

/// The dead-letter subject of the task inputs of `queue`: `dlq.work.<queue>` (three tokens, so
/// never an agent's `dlq.<to>`).
pub fn dlq_work(queue: &crate::ids::QueueName) -> String {
    format!("dlq.work.{queue}")
}

/// The advisories of DMs of `inbox_stream` whose deliveries ran out:
/// `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<inbox stream>.*`.
pub fn max_deliveries_advisories(inbox_stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{inbox_stream}.*")
}

/// The schedule subject of the expiry check of the DM stored at `inbox_seq`:
/// `hub.sched.expiry.<inbox seq>` (one schedule per subject, so one per DM).
pub fn expiry_schedule(inbox_seq: u64) -> String {
    format!("hub.sched.expiry.{inbox_seq}")
}

/// The schedule subject of the check of the answer stored at `answers_seq`:
/// `hub.sched.answer.<answers_seq>`.
pub fn answer_schedule(answers_seq: u64) -> String {
    format!("hub.sched.answer.{answers_seq}")
}

/// The dead-letter subject of the answers to `worker`: `dlq.answer.<worker>`.
pub fn dlq_answer(worker: &crate::ids::WorkerId) -> String {
    format!("dlq.answer.{worker}")
}

/// The advisories of terminated deliveries of every consumer of `inbox_stream`:
/// `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<inbox stream>.*`.
pub fn terminated_advisories(inbox_stream: &str) -> String {
    format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{inbox_stream}.*")
}

/// The KV bucket of task idempotency keys (see [`crate::task::idempotency`]).
pub const IDEMPOTENCY_BUCKET: &str = "HUB_IDEMPOTENCY";

/// The KV bucket of broker incarnations: one create-only entry per nats-server run (its
/// `server_id`, new at every start), written by the first router that connects to it, whose
/// value says whether the work stream held messages then (`"1"`) or not (`"0"`). Routers use
/// it to tell a broker that just restarted (and may have forgotten the dedupe ids of consumed
/// tasks) from one long up.
pub const BROKERS_BUCKET: &str = "HUB_BROKERS";
/// The KV bucket of the senders' token buckets (`sender_rate_per_min`), one entry per sender
/// identity, shared by all routers.
pub const RATE_BUCKET: &str = "HUB_RATE";
/// The KV bucket of the holds the router tells senders of ([`crate::backpressure::Hold`]),
/// keyed [`crate::backpressure::HoldScope::key`]; a one-shot client reads its own there.
pub const HOLDS_BUCKET: &str = "HUB_HOLDS";
/// The KV bucket of task claims ([`crate::task::Claim`]): one entry per task an attempt runs,
/// keyed [`claim_key`], written with a compare-and-set before the handler runs and renewed
/// with the input's heartbeats under a per-message TTL, so that a second delivery of a task
/// running elsewhere stands down.
pub const CLAIMS_BUCKET: &str = "HUB_CLAIMS";

/// The claim key of the task on `channel` taken from `queue`'s work: `<queue>.<delegator>.<key>`
/// (a worker's grants cover its own queues' claims only).
pub fn claim_key(queue: &crate::ids::QueueName, channel: &TaskChannel) -> String {
    format!("{queue}.{channel}")
}

/// The KV bucket of the agents' presence records ([`crate::presence::PresenceRecord`]), one
/// entry per agent identity, written by its attached inbox.
pub const PRESENCE_BUCKET: &str = "HUB_PRESENCE";

/// The JetStream API request for the info of `consumer` on `stream`: what an inbox reads the
/// server's clock from (its reply's `ts`, [`crate::clock`]), within its own grants.
pub fn consumer_info_request(stream: &str, consumer: &str) -> String {
    format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}")
}

/// The JetStream API request for the next messages of `consumer` on `stream`: an inbox's pull
/// ([`crate::pull`]), within its own grants.
pub fn consumer_next_request(stream: &str, consumer: &str) -> String {
    format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}")
}

/// The JetStream API request that resets `consumer` on `stream` to deliver again from a
/// stream sequence (nats-server 2.14+; the consumer watchdog, [`crate::watchdog`]).
pub fn consumer_reset_request(stream: &str, consumer: &str) -> String {
    format!("$JS.API.CONSUMER.RESET.{stream}.{consumer}")
}

/// The reply subject of pull number `pull` of registration `incarnation` of `consumer` under
/// the shared root `prefix` (a connection's inbox): `<prefix>.<consumer>.<incarnation>.<pull>`.
/// Consumer names have no dots. Pull numbers start again at every registration, so the
/// incarnation tells a late status of an earlier one's pull from the current one's.
pub fn pull_reply(prefix: &str, consumer: &str, incarnation: u64, pull: u64) -> String {
    format!("{prefix}.{consumer}.{incarnation}.{pull}")
}

/// The pull a status on [`pull_reply`]'s subject belongs to: its registration and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullId {
    /// The registration that issued it.
    pub incarnation: u64,
    /// Its number within that registration.
    pub pull: u64,
}

/// The consumer and pull of a status on [`pull_reply`]'s subject (a heartbeat, a pull's end),
/// given the length of its prefix; `None` for a subject of another shape (the pull is `None`
/// when its tokens are not numbers).
pub fn parse_pull_reply(subject: &str, prefix_len: usize) -> Option<(&str, Option<PullId>)> {
    let rest = subject.get(prefix_len..)?.strip_prefix('.')?;
    let (consumer, rest) = rest.split_once('.')?;
    let (incarnation, pull) = rest.split_once('.')?;
    if consumer.is_empty() || pull.contains('.') {
        return None;
    }
    let id = incarnation
        .parse()
        .ok()
        .zip(pull.parse().ok())
        .map(|(incarnation, pull)| PullId { incarnation, pull });
    Some((consumer, id))
}

/// The JetStream API request for the info of `stream`: what `runtime doctor` reads the
/// server's clock from as an operator.
pub fn stream_info_request(stream: &str) -> String {
    format!("$JS.API.STREAM.INFO.{stream}")
}

/// The JetStream API subject of a direct get from `stream` (its request names what to get):
/// `$JS.API.DIRECT.GET.<stream>`.
pub fn direct_get_request(stream: &str) -> String {
    format!("$JS.API.DIRECT.GET.{stream}")
}

/// The KV bucket of removed agents: one [`crate::removal::Tombstone`] per agent removed with
/// `runtime agent remove`, written by admins, watched by routers (a DM to a removed agent is
/// refused `recipient_deleted`); `runtime agent restore` deletes it. Kept for ever.
pub const REMOVED_BUCKET: &str = "HUB_REMOVED";

/// The stream of the audit trail ([`crate::audit`]).
pub const AUDIT_STREAM: &str = "HUB_AUDIT";
/// The subjects of [`AUDIT_STREAM`].
pub const AUDIT_FILTER: &str = "hub.audit.>";

/// Where the process `name` of `role` (`router`, `inbox`, `worker`, `admin`) publishes its audit
/// events: `hub.audit.<role>.<name>`, the name's dots, wildcards and spaces made `_`.
pub fn audit(role: &str, name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' | ' ' | '\t' | '\r' | '\n' => '_',
            c => c,
        })
        .collect();
    format!("hub.audit.{role}.{name}")
}

/// The subject a KV `key` of `bucket` is stored on: `$KV.<bucket>.<key>`.
pub fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// The stream behind KV `bucket`: `KV_<bucket>`.
pub fn kv_stream(bucket: &str) -> String {
    format!("KV_{bucket}")
}

pub(crate) const INGRESS_PREFIX: &str = "hub.pub.";
pub(crate) const INBOX_PREFIX: &str = "channel.inbox.";

/// Whether `subject` is an inbox subject (`channel.inbox.…`): a prefix test, no allocation.
pub fn is_inbox(subject: &str) -> bool {
    subject.starts_with(INBOX_PREFIX)
}
pub(crate) const TASK_PREFIX: &str = "channel.task.";
pub(crate) const BROADCAST_PREFIX: &str = "channel.";
pub(crate) const ATTACH_PREFIX: &str = "hub.delivery.";
pub(crate) const INBOX_CONSUMER_PREFIX: &str = "inbox-";
pub(crate) const INBOX_TOKEN: &str = "inbox";
pub(crate) const TASK_TOKEN: &str = "task";

/// The subject `from` publishes to on `channel`:
/// `hub.pub.<id>.inbox`, `hub.pub.<id>.task.<delegator>.<key>` or `hub.pub.<id>.<name>`.
pub fn ingress(from: &AgentId, channel: &Channel) -> String {
    format!("{INGRESS_PREFIX}{from}.{channel}")
}

/// The stored inbox subject of `id`: `channel.inbox.<id>`.
pub fn inbox(id: &AgentId) -> String {
    // Concatenated, not formatted: once per routed DM.
    [INBOX_PREFIX, id.as_str()].concat()
}

/// The stored task channel subject: `channel.task.<delegator>.<key>`.
pub fn task(channel: &TaskChannel) -> String {
    format!("{TASK_PREFIX}{channel}")
}

/// The filter of every task channel of `delegator`: `channel.task.<delegator>.>` (what a
/// delegator may subscribe to).
pub fn tasks_of(delegator: &AgentId) -> String {
    format!("{TASK_PREFIX}{delegator}.>")
}

/// The filter of everything any sender publishes to task channel `channel` through the
/// ingress, not routed yet: `hub.pub.*.task.<delegator>.<key>` (a worker reads it for a result
/// stored in the ingress but not in the task channel yet).
pub fn task_ingress_filter(channel: &TaskChannel) -> String {
    format!("{INGRESS_PREFIX}*.{TASK_TOKEN}.{channel}")
}

/// The subject an identity requests a read of one of its own task channels on:
/// `hub.delivery.<id>.task`. A router answers it with a direct get of
/// `channel.task.<id>.<key>` only (the request body names the key and the sequence), so the
/// requester reads the channels of the tasks it delegated and no others, with no direct-get
/// grant of its own (a bare `DIRECT.GET` cannot be limited to subjects).
pub fn task_read_request(id: &AgentId) -> String {
    format!("{ATTACH_PREFIX}{id}.{TASK_TOKEN}")
}

/// The live broadcast subject: `channel.<name>`.
pub fn broadcast(name: &ChannelName) -> String {
    format!("{BROADCAST_PREFIX}{name}")
}

/// Every broadcast channel (`channel.<name>`, one token: never an inbox's or a task's
/// channel), what an agent may receive.
pub const BROADCAST_FILTER: &str = "channel.*";

/// The subject an agent requests to attach to its inbox consumer:
/// `hub.delivery.<id>.inbox`.
pub fn attach_request(id: &AgentId) -> String {
    format!("{ATTACH_PREFIX}{id}.{INBOX_TOKEN}")
}

/// The subject an identity requests to learn whether the hub is durable, and its stream
/// names: `hub.delivery.<id>.hub` (answered by a durable hub's routers; nobody answers on a
/// core hub). Clients need no stream info for it.
pub fn hub_info_request(id: &AgentId) -> String {
    format!("{ATTACH_PREFIX}{id}.hub")
}

/// The durable name of the inbox consumer of `id`: `inbox-<id>`.
pub fn inbox_consumer(id: &AgentId) -> String {
    format!("{INBOX_CONSUMER_PREFIX}{id}")
}

/// The `Nats-Msg-Id` the router stores a message under:
/// `hub-router:<from>:<id>`.
pub fn router_msg_id(from: &AgentId, id: &MessageId) -> String {
    // Concatenated, not formatted: once per routed message.
    [ROUTER_MSG_ID_PREFIX, from.as_str(), ":", id.as_str()].concat()
}

/// Whether `prefix` can root reply subjects: dot-separated, non-empty tokens without wildcards
/// or whitespace (`_INBOX`, `_INBOX.alice`).
pub fn is_valid_reply_prefix(prefix: &str) -> bool {
    is_literal_subject(prefix)
}

/// Dot-separated, non-empty tokens without wildcards or whitespace.
fn is_literal_subject(subject: &str) -> bool {
    !subject.is_empty()
        && subject
            .split('.')
            .all(|t| !t.is_empty() && t != "*" && t != ">" && !t.contains(char::is_whitespace))
}

/// The root of an inbox prefix, its first token: `_INBOX` for `_INBOX` and for a per-identity
/// `_INBOX.alice`. A service answers requests whose reply is under the root of its own prefix,
/// since every identity of a deployment has a prefix `<root>.<identity>` (`render-config`).
pub fn reply_root(prefix: &str) -> &str {
    prefix.split('.').next().unwrap_or(prefix)
}

/// The root of the reply subjects nats-server gives a request that crossed from one account
/// into another through a service import (`_R_.<token>.<token>`): on a rendered hub, every
/// request of an agent or a worker reaches a router or a worker with such a reply, which the
/// broker maps back into the requester's own account (docs/SECURITY.md, "Accounts").
pub const SERVICE_REPLY_ROOT: &str = "_R_";

/// Whether a service whose inbox prefix is `prefix` answers on `reply`: a reply under the
/// root of its own prefix ([`reply_root`]), or one the broker made for a request from another
/// account ([`SERVICE_REPLY_ROOT`]). Anything else was aimed by the requester and is refused.
pub fn is_answerable_reply(reply: &str, prefix: &str) -> bool {
    is_reply_subject_under(reply, reply_root(prefix))
        || is_reply_subject_under(reply, SERVICE_REPLY_ROOT)
}

/// The reply subject of a workers' status request ([`WORKER_STATUS_SUBJECT`]) tagged `token`:
/// `hub.admin.workers.<token>`. Each worker answers on [`worker_status_answer`] of it, a subject
/// of its own under it, which the requester subscribes to as `<reply>.*`.
pub fn worker_status_reply(token: &str) -> String {
    format!("{WORKER_STATUS_SUBJECT}.{token}")
}

/// Where `worker` answers a status request whose reply subject is `reply`:
/// `hub.admin.workers.<token>.<worker>`, when `reply` has the shape of
/// [`worker_status_reply`] (one literal token after the root); `None` for any other reply.
///
/// A status request reaches a worker's own account through a stream import, whose reply
/// subject the broker does not map back: the worker publishes its answer, which its account
/// imports from the hub's as a service ([`WORKER_STATUS_ANSWERS`]).
pub fn worker_status_answer(reply: &str, worker: &crate::ids::WorkerId) -> Option<String> {
    let token = reply
        .strip_prefix(WORKER_STATUS_SUBJECT)?
        .strip_prefix('.')?;
    (is_literal_subject(token) && !token.contains('.')).then(|| format!("{reply}.{worker}"))
}

/// Every worker's answers to status requests ([`worker_status_answer`]).
pub const WORKER_STATUS_ANSWERS: &str = "hub.admin.workers.*.*";

/// Whether `reply` is a reply subject under the root `prefix` (e.g. `_INBOX`): `<prefix>.`
/// followed by at least one token, and a literal subject (no wildcard, whitespace or empty
/// token).
pub fn is_reply_subject_under(reply: &str, prefix: &str) -> bool {
    reply
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|rest| is_literal_subject(prefix) && is_literal_subject(rest))
}

/// Whether a `Nats-Msg-Id` was set by the router on what it stored (`hub-router:` on inbox
/// and task channel messages, `hub-task:` on tasks, `hub-system:` on notices): the replay
/// guard drops such messages when they come back through the ingress (a pull or get whose
/// reply subject names an ingress subject).
pub fn is_router_msg_id(msg_id: &str) -> bool {
    [
        ROUTER_MSG_ID_PREFIX,
        TASK_MSG_ID_PREFIX,
        SYSTEM_MSG_ID_PREFIX,
    ]
    .iter()
    .any(|prefix| msg_id.starts_with(prefix))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod work_tests;
