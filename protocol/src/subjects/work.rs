//! Subjects, streams and consumer names of the worker channel.
//!
//! | What                         | Subject / name                          |
//! |------------------------------|-----------------------------------------|
//! | submit a task (any worker)   | `hub.pub.<me>.work.<queue>`             |
//! | submit a targeted task       | `hub.pub.<me>.work.<queue>.<worker>`    |
//! | answer a waiting attempt     | `hub.pub.<me>.answer.<worker>`          |
//! | stored task                  | `work.<queue>` on [`WORK_STREAM`]       |
//! | stored targeted task         | `work.<queue>.<worker>` on [`WORK_STREAM`] |
//! | stored answer                | `answer.<worker>` on [`ANSWERS_STREAM`] |
//! | shared queue consumer        | `queue-<queue>`                         |
//! | targeted-task consumer       | `worker-<worker>` (filter `work.*.<worker>`) |
//! | answer consumer              | `answers-<worker>`                      |
//! | query / cancel (core req/rep)| `hub.ctl.<worker>.<query\|cancel>.<requester>` |
//! | query / cancel by an admin   | `hub.ctl.<worker>.<query\|cancel>`     |
//! | worker join request          | `hub.work.<queue>.join.<worker>`        |
//!
//! Answers live in their own stream, [`ANSWERS_STREAM`] under `answer.>`,
//! rather than under `work.answers.<worker>` in [`WORK_STREAM`]: that would
//! collide with a queue named `answers` (whose targeted tasks are
//! `work.answers.<worker>` too) and would need a reserved queue name that
//! [`QueueName`] does not have. A separate prefix keeps every builder
//! infallible and lets operators size answer retention separately.
//!
//! The existing [`Channel`](super::Channel) does not know `work` or
//! `answer`: [`parse_ingress`](super::parse_ingress) rejects
//! `hub.pub.<me>.work.<queue>`, so a router tries [`parse_work_ingress`] and
//! [`parse_answer_ingress`] first. `hub.pub.<me>.work` and
//! `hub.pub.<me>.answer` alone (one token) are broadcast channels named
//! `work` / `answer` and yield `Ok(None)`.

use std::fmt;

use super::parse::{strip, token, token_count, unexpected};
use super::{SubjectError, INGRESS_PREFIX};
use crate::ids::{AgentId, QueueName, WorkerId};

/// The stream that stores submitted tasks, untargeted and targeted.
pub const WORK_STREAM: &str = "HUB_WORK";
/// The subjects captured by [`WORK_STREAM`].
pub const WORK_FILTER: &str = "work.>";
/// The stream that stores answers, one subject per worker.
pub const ANSWERS_STREAM: &str = "HUB_ANSWERS";
/// The subjects captured by [`ANSWERS_STREAM`].
pub const ANSWERS_FILTER: &str = "answer.>";
/// The subject filter routers subscribe to for worker join requests.
pub const JOIN_FILTER: &str = "hub.work.*.join.*";
/// Every queue's change notices ([`queue_changed`]).
pub const QUEUE_CHANGED_FILTER: &str = "hub.work.*.changed";

const WORK_TOKEN: &str = "work";
const ANSWER_TOKEN: &str = "answer";
const WORK_PREFIX: &str = "work.";
const ANSWER_PREFIX: &str = "answer.";
const CONTROL_PREFIX: &str = "hub.ctl.";
const JOIN_PREFIX: &str = "hub.work.";
const JOIN_TOKEN: &str = "join";
const QUEUE_CONSUMER_PREFIX: &str = "queue-";
const TARGETED_CONSUMER_PREFIX: &str = "worker-";
const ANSWER_CONSUMER_PREFIX: &str = "answers-";

/// A core request/reply control operation on a worker's own subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlKind {
    /// Ask for the state of an attempt. Token `query`.
    Query,
    /// Ask to cancel an attempt. Token `cancel`.
    Cancel,
}

impl ControlKind {
    /// Both kinds.
    pub const ALL: [ControlKind; 2] = [ControlKind::Query, ControlKind::Cancel];

    /// The subject token of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Query => "query",
            ControlKind::Cancel => "cancel",
        }
    }
}

impl fmt::Display for ControlKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ingress subject a delegator submits a task on:
/// `hub.pub.<from>.work.<queue>`, or `hub.pub.<from>.work.<queue>.<worker>`
/// for a task targeted at one worker of the queue.
pub fn work_ingress(from: &AgentId, queue: &QueueName, worker: Option<&WorkerId>) -> String {
    format!("{INGRESS_PREFIX}{from}.{}", work(queue, worker))
}

/// The ingress subject `from` answers a waiting attempt of `worker` on:
/// `hub.pub.<from>.answer.<worker>`.
pub fn answer_ingress(from: &AgentId, worker: &WorkerId) -> String {
    format!("{INGRESS_PREFIX}{from}.{}", answer(worker))
}

/// The answer route of a waiting result of `worker`: `answer.<worker>`, the channel an
/// answerer appends to its *own* ingress prefix (`hub.pub.<me>.answer.<worker>`). It names no
/// sender, so any answerer can use it as given; see [`answer_ingress_from_route`].
pub fn answer_route(worker: &WorkerId) -> String {
    answer(worker)
}

/// The ingress subject `me` answers on, from the `answer_route` of a waiting result owned by
/// `worker`: `hub.pub.<me>.<route>`. The route is checked, never trusted: it must be exactly
/// [`answer_route`] of the worker the result names (a result is data from the network).
///
/// # Errors
///
/// Returns a [`SubjectError`] when `route` is not `answer.<worker>`.
pub fn answer_ingress_from_route(
    me: &AgentId,
    route: &str,
    worker: &WorkerId,
) -> Result<String, SubjectError> {
    let named = parse_answer(route)?;
    if &named != worker {
        return Err(SubjectError::UnexpectedToken {
            subject: route.to_owned(),
            expected: "the worker the result names",
            found: named.to_string(),
        });
    }
    Ok(answer_ingress(me, worker))
}

/// The stored task subject: `work.<queue>` or `work.<queue>.<worker>`.
pub fn work(queue: &QueueName, worker: Option<&WorkerId>) -> String {
    match worker {
        None => format!("{WORK_PREFIX}{queue}"),
        Some(worker) => format!("{WORK_PREFIX}{queue}.{worker}"),
    }
}

/// The filter of the targeted-task consumer of `worker`, across queues:
/// `work.*.<worker>`.
pub fn targeted_filter(worker: &WorkerId) -> String {
    format!("{WORK_PREFIX}*.{worker}")
}

/// The stored answer subject of `worker`: `answer.<worker>`.
pub fn answer(worker: &WorkerId) -> String {
    format!("{ANSWER_PREFIX}{worker}")
}

/// The durable name of the shared consumer of `queue`: `queue-<queue>`.
pub fn queue_consumer(queue: &QueueName) -> String {
    format!("{QUEUE_CONSUMER_PREFIX}{queue}")
}

/// The durable name of the targeted-task consumer of `worker`:
/// `worker-<worker>`.
pub fn targeted_consumer(worker: &WorkerId) -> String {
    format!("{TARGETED_CONSUMER_PREFIX}{worker}")
}

/// The durable name of the answer consumer of `worker`: `answers-<worker>`.
pub fn answer_consumer(worker: &WorkerId) -> String {
    format!("{ANSWER_CONSUMER_PREFIX}{worker}")
}

/// The admin form of the core request/reply control subject of `worker`:
/// `hub.ctl.<worker>.query` or `hub.ctl.<worker>.cancel`. It names no requester, so the worker
/// serves it for any task: a rendered config grants it to admins only.
pub fn control(worker: &WorkerId, kind: ControlKind) -> String {
    format!("{CONTROL_PREFIX}{worker}.{kind}")
}

/// The control subject `requester` sends a query or cancel to `worker` on:
/// `hub.ctl.<worker>.<kind>.<requester>`. The worker serves it only for tasks `requester`
/// delegated; a rendered config lets each identity publish only with itself as requester.
pub fn control_as(worker: &WorkerId, kind: ControlKind, requester: &AgentId) -> String {
    format!("{CONTROL_PREFIX}{worker}.{kind}.{requester}")
}

/// The filter of the requester form of `kind` on `worker`: `hub.ctl.<worker>.<kind>.*`.
pub fn control_as_filter(worker: &WorkerId, kind: ControlKind) -> String {
    format!("{CONTROL_PREFIX}{worker}.{kind}.*")
}

/// The subject `worker` asks the router to create its consumers on:
/// `hub.work.<queue>.join.<worker>`. The worker's identity is in the subject, which the broker
/// grants to that worker alone (docs/SECURITY.md); the router refuses a join whose body names
/// another worker.
pub fn join_request(queue: &QueueName, worker: &WorkerId) -> String {
    format!("{JOIN_PREFIX}{queue}.{JOIN_TOKEN}.{worker}")
}

/// Where a router says it changed the shared consumer of `queue` (its ack wait): the core
/// notice `hub.work.<queue>.changed`, on which the queue's workers read the consumer again,
/// so that their running attempts heartbeat at the new pace.
pub fn queue_changed(queue: &QueueName) -> String {
    format!("{JOIN_PREFIX}{queue}.changed")
}

/// The ingress work subject, if `subject` is one.
///
/// Returns `Ok(None)` when the channel after the identity is not
/// `work.<…>` (another ingress channel, including a broadcast named `work`).
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` does not start with `hub.pub.`,
/// or is `hub.pub.<id>.work.…` with a wrong token count or invalid token.
pub fn parse_work_ingress(
    subject: &str,
) -> Result<Option<(AgentId, QueueName, Option<WorkerId>)>, SubjectError> {
    let Some((from, rest)) = ingress_channel(subject, WORK_TOKEN)? else {
        return Ok(None);
    };
    let (queue, worker) = work_tokens(subject, rest)?;
    Ok(Some((from, queue, worker)))
}

/// The ingress answer subject, if `subject` is one.
///
/// Returns `Ok(None)` when the channel after the identity is not
/// `answer.<…>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` does not start with `hub.pub.`,
/// or is `hub.pub.<id>.answer.…` with a wrong token count or invalid token.
pub fn parse_answer_ingress(subject: &str) -> Result<Option<(AgentId, WorkerId)>, SubjectError> {
    let Some((from, rest)) = ingress_channel(subject, ANSWER_TOKEN)? else {
        return Ok(None);
    };
    match rest.split('.').count() {
        1 => Ok(Some((from, token(subject, WorkerId::new(rest))?))),
        found => Err(token_count(subject, "3", found + 2)),
    }
}

/// Whether `subject` is under `work.` (a stored task, maybe malformed): a prefix test, for
/// hot paths that parse only when it holds.
pub fn is_work(subject: &str) -> bool {
    subject.starts_with(WORK_PREFIX)
}

/// Whether `subject` is an answer subject (`answer.…`): a prefix test, no allocation (a
/// router's hot path asks it of every store).
pub fn is_answer(subject: &str) -> bool {
    subject.starts_with(ANSWER_PREFIX)
}

/// Parses `work.<queue>` or `work.<queue>.<worker>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a stored work subject.
pub fn parse_work(subject: &str) -> Result<(QueueName, Option<WorkerId>), SubjectError> {
    let rest = strip(subject, WORK_PREFIX)?;
    work_tokens(subject, rest)
}

/// Parses `answer.<worker>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a stored answer subject.
pub fn parse_answer(subject: &str) -> Result<WorkerId, SubjectError> {
    let rest = strip(subject, ANSWER_PREFIX)?;
    match rest.split('.').count() {
        1 => token(subject, WorkerId::new(rest)),
        found => Err(token_count(subject, "1", found)),
    }
}

/// Parses the queue consumer name `queue-<queue>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `name` is not a queue consumer name.
pub fn parse_queue_consumer(name: &str) -> Result<QueueName, SubjectError> {
    token(name, QueueName::new(strip(name, QUEUE_CONSUMER_PREFIX)?))
}

/// Parses the targeted-task consumer name `worker-<worker>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `name` is not a targeted consumer name.
pub fn parse_targeted_consumer(name: &str) -> Result<WorkerId, SubjectError> {
    token(name, WorkerId::new(strip(name, TARGETED_CONSUMER_PREFIX)?))
}

/// Parses the answer consumer name `answers-<worker>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `name` is not an answer consumer name.
pub fn parse_answer_consumer(name: &str) -> Result<WorkerId, SubjectError> {
    token(name, WorkerId::new(strip(name, ANSWER_CONSUMER_PREFIX)?))
}

/// Parses `hub.ctl.<worker>.<kind>` (the admin form: no requester) or
/// `hub.ctl.<worker>.<kind>.<requester>`, kind `query` or `cancel`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a control subject.
pub fn parse_control(
    subject: &str,
) -> Result<(WorkerId, ControlKind, Option<AgentId>), SubjectError> {
    let rest = strip(subject, CONTROL_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    let (worker, kind, requester) = match tokens.as_slice() {
        [worker, kind] => (*worker, *kind, None),
        [worker, kind, requester] => (*worker, *kind, Some(*requester)),
        _ => return Err(token_count(subject, "2 or 3", tokens.len())),
    };
    let kind = ControlKind::ALL
        .into_iter()
        .find(|k| k.as_str() == kind)
        .ok_or_else(|| unexpected(subject, "query` or `cancel", kind))?;
    let requester = requester
        .map(|r| token(subject, AgentId::new(r)))
        .transpose()?;
    Ok((token(subject, WorkerId::new(worker))?, kind, requester))
}

/// Parses `hub.work.<queue>.join.<worker>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a join request subject.
pub fn parse_join_request(subject: &str) -> Result<(QueueName, WorkerId), SubjectError> {
    let rest = strip(subject, JOIN_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        [queue, JOIN_TOKEN, worker] => Ok((
            token(subject, QueueName::new(*queue))?,
            token(subject, WorkerId::new(*worker))?,
        )),
        [_, found, _] => Err(unexpected(subject, JOIN_TOKEN, found)),
        _ => Err(token_count(subject, "3", tokens.len())),
    }
}

/// Splits `hub.pub.<id>.<channel>.<rest>`; `None` unless the channel token
/// is `channel` followed by at least one more token.
fn ingress_channel<'a>(
    subject: &'a str,
    channel: &str,
) -> Result<Option<(AgentId, &'a str)>, SubjectError> {
    let rest = strip(subject, INGRESS_PREFIX)?;
    let Some((id, after)) = rest.split_once('.') else {
        return Ok(None);
    };
    let Some((found, rest)) = after.split_once('.') else {
        return Ok(None);
    };
    if found != channel {
        return Ok(None);
    }
    Ok(Some((token(subject, AgentId::new(id))?, rest)))
}

fn work_tokens(subject: &str, rest: &str) -> Result<(QueueName, Option<WorkerId>), SubjectError> {
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        [queue] => Ok((token(subject, QueueName::new(*queue))?, None)),
        [queue, worker] => Ok((
            token(subject, QueueName::new(*queue))?,
            Some(token(subject, WorkerId::new(*worker))?),
        )),
        _ => Err(token_count(subject, "1 or 2", tokens.len())),
    }
}
