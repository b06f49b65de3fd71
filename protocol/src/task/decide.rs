//! The pure decisions of a worker, and the stable ids it publishes under.

use std::collections::BTreeSet;

use super::{
    Answer, AttemptId, CancelStatus, Outcome, Suspend, TaskChannelBody, TaskResult, TaskSpec,
    TaskState,
};
use crate::ids::{AgentId, MessageId, TaskId, WorkerId};
use crate::wire_error::{WireError, WireErrorKind};

/// Room left under [`MAX_ENVELOPE_BYTES`](crate::MAX_ENVELOPE_BYTES) for the envelope meta
/// the router adds to a result.
pub const ENVELOPE_HEADROOM: usize = 4096;

pub use crate::subjects::{
    BUNDLE_MSG_ID_PREFIX, REFUSAL_MSG_ID_PREFIX, RESULT_MSG_ID_PREFIX, STATUS_MSG_ID_PREFIX,
    TASK_MSG_ID_PREFIX,
};
/// The error detail of a result that exceeded the size limit.
pub const RESULT_TOO_LARGE: &str = "result too large";

/// What the worker knows about one attempt it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptView {
    /// The task of the attempt.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// This worker.
    pub worker_id: WorkerId,
    /// The saved state.
    pub state: TaskState,
    /// The tool call the pending question waits on, when waiting.
    pub tool_call_id: Option<String>,
    /// The message ids of the answers already applied.
    pub answered: BTreeSet<MessageId>,
}

impl AttemptView {
    /// Whether `task_id`, `attempt_id` and `worker_id` name this attempt.
    pub fn is_named_by(&self, task_id: &TaskId, attempt_id: &AttemptId, worker: &WorkerId) -> bool {
        self.task_id == *task_id && self.attempt_id == *attempt_id && self.worker_id == *worker
    }
}

/// What to do with an [`Answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerVerdict {
    /// Journal the answer and resume the attempt.
    Resume,
    /// Already applied: republish the saved result, do not resume again.
    Duplicate,
    /// The attempt is not waiting on this tool call: error "stale answer".
    Stale,
    /// No owned attempt has these ids: error "unknown task attempt".
    UnknownAttempt,
    /// The answerer is not the task's delegator ([`may_control`]): error "unauthorized".
    NotDelegator,
}

impl AnswerVerdict {
    /// The error result to publish for this verdict, if any.
    pub fn error(self) -> Option<WireError> {
        match self {
            AnswerVerdict::Resume | AnswerVerdict::Duplicate => None,
            AnswerVerdict::Stale => {
                Some(WireError::new(WireErrorKind::StaleAnswer, "stale answer"))
            }
            AnswerVerdict::UnknownAttempt => Some(WireError::new(
                WireErrorKind::UnknownTaskAttempt,
                "unknown task attempt",
            )),
            AnswerVerdict::NotDelegator => {
                Some(WireError::new(WireErrorKind::Unauthorized, NOT_DELEGATOR))
            }
        }
    }
}

/// The error detail of a query, cancel or answer refused to someone other than the task's
/// delegator.
pub const NOT_DELEGATOR: &str =
    "only the task's delegator (or an admin) may query, cancel or answer it";

/// Who asks a worker to act on a task: the identity in the control subject or the stamped
/// sender of an answer, or an admin (the admin form of the control subject, which names no
/// requester: a rendered config grants it to admins only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester<'a> {
    /// An admin.
    Admin,
    /// This identity.
    Identity(&'a AgentId),
}

impl<'a> Requester<'a> {
    /// The requester of a control subject's requester token: none is the admin form.
    pub fn of_control(requester: Option<&'a AgentId>) -> Self {
        requester.map_or(Requester::Admin, Requester::Identity)
    }
}

/// Whether `requester` may query, cancel or answer a task delegated by `delegator`: the
/// delegator itself, or an admin. A task whose delegator is unknown (a journal record of an
/// earlier version) is served to admins only.
pub fn may_control(requester: Requester<'_>, delegator: Option<&AgentId>) -> bool {
    match requester {
        Requester::Admin => true,
        Requester::Identity(id) => delegator == Some(id),
    }
}

/// Judges an answer against the owned attempt it names (`None`: the worker
/// owns no attempt with that attempt id).
///
/// In order: ids that do not all match → [`UnknownAttempt`]; a
/// `message_id` already applied → [`Duplicate`]; not waiting, or another
/// tool call → [`Stale`]; else [`Resume`].
///
/// [`UnknownAttempt`]: AnswerVerdict::UnknownAttempt
/// [`Duplicate`]: AnswerVerdict::Duplicate
/// [`Stale`]: AnswerVerdict::Stale
/// [`Resume`]: AnswerVerdict::Resume
pub fn judge_answer(attempt: Option<&AttemptView>, answer: &Answer) -> AnswerVerdict {
    let Some(attempt) =
        attempt.filter(|a| a.is_named_by(&answer.task_id, &answer.attempt_id, &answer.worker_id))
    else {
        return AnswerVerdict::UnknownAttempt;
    };
    if attempt.answered.contains(&answer.message_id) {
        return AnswerVerdict::Duplicate;
    }
    let waits_on_it = attempt.tool_call_id.as_deref() == Some(answer.tool_call_id.as_str());
    if attempt.state != TaskState::Waiting || !waits_on_it {
        return AnswerVerdict::Stale;
    }
    AnswerVerdict::Resume
}

/// What the task channel — the shared record of every attempt at a task, whatever worker ran
/// it — says about a task when one of its inputs is delivered (see
/// [`ChannelView::state_for`](super::ChannelView::state_for)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelState {
    /// Nothing of the task is stored (or only what the delivered attempt itself published).
    Untouched,
    /// Another attempt published something (an acceptance, a status) but no result: it may
    /// have run, or may still run.
    StartedElsewhere,
    /// The latest result is another attempt's `waiting` one: that attempt owns the task until
    /// it is answered (its worker resumes it from its journal).
    Parked,
    /// A final result is stored.
    Finished,
}

/// What the worker knows about a delivered task: its journal and the task channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalView {
    /// The attempt admitted for this delivery, if any.
    pub admitted: Option<AttemptId>,
    /// Whether a result of that attempt is saved.
    pub saved_result: bool,
    /// Whether the task's `expires_at` has passed (see [`is_expired`]).
    pub expired: bool,
    /// What the task channel holds.
    pub channel: ChannelState,
}

/// Why a delivered task is acked without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Settled {
    /// The task has a final result already (e.g. a stored result whose ack a broker crash
    /// lost, or a task stored twice).
    Finished,
    /// Another attempt of the task waits for an answer: it owns the task.
    Parked,
}

/// What to do with a (re)delivered task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryPlan {
    /// A result is saved: republish it without running anything.
    RepublishSaved,
    /// The task channel shows the task settled by another attempt: publish nothing, run
    /// nothing, ack the input.
    Settled(Settled),
    /// Admitted but no result saved: run the same attempt again, flagged as
    /// a re-run (its effects may repeat).
    RerunSameAttempt {
        /// The attempt to re-run.
        attempt_id: AttemptId,
    },
    /// Nothing journalled: start a fresh attempt.
    FreshAttempt,
    /// No result saved and the task expired: do not run it; publish
    /// [`expired_result`] instead.
    Expire,
}

/// Whether an attempt must be told it is a re-run (its effects may repeat): the journal holds
/// its admission without a result (this worker crashed mid-run), the broker delivered the
/// input before (`delivered > 1`), or the task channel shows another attempt started it (the
/// delivery count starts again at 1 after a broker crash, so the channel is the record that
/// survives).
pub fn is_rerun(admitted_without_result: bool, delivered: u64, started_elsewhere: bool) -> bool {
    admitted_without_result || delivered > 1 || started_elsewhere
}

/// Whether a task with `expires_at` (unix milliseconds) has expired at `now_ms`: the deadline
/// itself is already too late. A task without `expires_at` never expires.
pub fn is_expired(expires_at: Option<u64>, now_ms: u64) -> bool {
    expires_at.is_some_and(|deadline| now_ms >= deadline)
}

/// The error detail of an expired task's result.
pub const EXPIRED: &str = "task expired before it started";

/// The `failed` result of a task whose `expires_at` passed before it ran.
pub fn expired_result(
    task_id: TaskId,
    attempt_id: AttemptId,
    worker_id: WorkerId,
    expires_at: u64,
) -> TaskResult {
    failed_result(
        task_id,
        attempt_id,
        worker_id,
        WireError::new(
            WireErrorKind::Expired,
            format!("{EXPIRED} (expires_at {expires_at})"),
        ),
    )
}

/// A `failed` result carrying `error`, with no response, suspension or answer route.
pub fn failed_result(
    task_id: TaskId,
    attempt_id: AttemptId,
    worker_id: WorkerId,
    error: WireError,
) -> TaskResult {
    TaskResult {
        task_id,
        attempt_id,
        worker_id,
        state: TaskState::Failed,
        response: None,
        error: Some(error),
        suspend: None,
        answer_route: None,
    }
}

/// Plans a task delivery, in this order: a saved result is always republished (even after the
/// deadline: the work was done); a task the channel shows finished, or parked on another
/// attempt's question, is acked without running; an expired task is not run; an admitted
/// one is run again as the same attempt; anything else is a fresh attempt.
pub fn on_delivery(view: JournalView) -> DeliveryPlan {
    match view {
        JournalView {
            saved_result: true, ..
        } => DeliveryPlan::RepublishSaved,
        JournalView {
            channel: ChannelState::Finished,
            ..
        } => DeliveryPlan::Settled(Settled::Finished),
        JournalView {
            channel: ChannelState::Parked,
            ..
        } => DeliveryPlan::Settled(Settled::Parked),
        JournalView { expired: true, .. } => DeliveryPlan::Expire,
        JournalView {
            admitted: Some(attempt_id),
            ..
        } => DeliveryPlan::RerunSameAttempt { attempt_id },
        JournalView { admitted: None, .. } => DeliveryPlan::FreshAttempt,
    }
}

/// The result of `outcome` for an attempt of `task` on `worker`, replaced by
/// [`too_large_result`] when its envelope would exceed
/// [`MAX_ENVELOPE_BYTES`](crate::MAX_ENVELOPE_BYTES) minus [`ENVELOPE_HEADROOM`]. A waiting
/// result carries the worker's [`answer_route`](crate::subjects::answer_route).
pub fn build_result(
    task: &TaskSpec,
    attempt_id: &AttemptId,
    worker: &WorkerId,
    outcome: Outcome,
) -> TaskResult {
    let mut result = TaskResult {
        task_id: task.task_id.clone(),
        attempt_id: attempt_id.clone(),
        worker_id: worker.clone(),
        state: TaskState::Completed,
        response: None,
        error: None,
        suspend: None,
        answer_route: None,
    };
    match outcome {
        Outcome::Completed(response) => result.response = Some(response),
        Outcome::Failed(reason) => {
            result.state = TaskState::Failed;
            result.error = Some(WireError::new(WireErrorKind::Internal, reason));
        }
        Outcome::Waiting {
            question,
            tool_call_id,
        } => {
            result.state = TaskState::Waiting;
            result.suspend = Some(Suspend {
                question,
                tool_call_id,
            });
            result.answer_route = Some(crate::subjects::answer_route(worker));
        }
        Outcome::Cancelled => result.state = TaskState::Cancelled,
    }
    let size = serde_json::to_vec(&TaskChannelBody::Result(result.clone()))
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if result_too_large(
        size,
        crate::MAX_ENVELOPE_BYTES.saturating_sub(ENVELOPE_HEADROOM),
    ) {
        return too_large_result(task.task_id.clone(), attempt_id.clone(), worker.clone());
    }
    result
}

/// The outcome of a cancel request: [`Stale`](CancelStatus::Stale) when its
/// ids do not name the attempt, [`NotActive`](CancelStatus::NotActive) when
/// the attempt is final, else [`Requested`](CancelStatus::Requested).
pub fn cancel_status(state: TaskState, ids_match: bool) -> CancelStatus {
    if !ids_match {
        CancelStatus::Stale
    } else if state.is_final() {
        CancelStatus::NotActive
    } else {
        CancelStatus::Requested
    }
}

/// Whether an encoded result of `encoded_len` bytes exceeds `limit`.
pub fn result_too_large(encoded_len: usize, limit: usize) -> bool {
    encoded_len > limit
}

/// The result published instead of one that was too large: state failed,
/// error "result too large", no response, suspension or answer route.
pub fn too_large_result(task_id: TaskId, attempt_id: AttemptId, worker_id: WorkerId) -> TaskResult {
    failed_result(
        task_id,
        attempt_id,
        worker_id,
        WireError::new(WireErrorKind::ResultTooLarge, RESULT_TOO_LARGE),
    )
}

/// The stable id of state change `seq` of an attempt:
/// `<task_id>:<attempt_id>:0:accepted` for acceptance (`seq` zero, whatever
/// `state`), else `<task_id>:<attempt_id>:<seq>:<state>`.
pub fn status_event_id(
    task_id: &TaskId,
    attempt_id: &AttemptId,
    seq: u32,
    state: TaskState,
) -> String {
    let what = if seq == 0 { "accepted" } else { state.as_str() };
    format!("{task_id}:{attempt_id}:{seq}:{what}")
}

/// The `Nats-Msg-Id` a task of `from` is stored under: `hub-task:<from>:<task_id>`. The
/// sender is part of it, so another sender reusing the id within the duplicate window is not
/// taken for a repeat and cannot swallow the task.
pub fn task_msg_id(from: &AgentId, task_id: &TaskId) -> String {
    format!("{TASK_MSG_ID_PREFIX}{from}:{task_id}")
}

/// The `Nats-Msg-Id` of the result of state change `seq` of an attempt:
/// `hub-result:<task_id>:<attempt_id>:<seq>`.
pub fn result_msg_id(task_id: &TaskId, attempt_id: &AttemptId, seq: u32) -> String {
    format!("{RESULT_MSG_ID_PREFIX}{task_id}:{attempt_id}:{seq}")
}

/// The `meta.id` and ingress `Nats-Msg-Id` of the bundle carrying the state change and the
/// result `seq` of an attempt: `hub-bundle:<task_id>:<attempt_id>:<seq>`, with `:a` when it
/// also carries the acceptance. The id names the contents, so a bundle with the acceptance is
/// never deduplicated against one without it (the acceptance would be lost).
pub fn bundle_msg_id(
    task_id: &TaskId,
    attempt_id: &AttemptId,
    seq: u32,
    with_acceptance: bool,
) -> String {
    let suffix = if with_acceptance { ":a" } else { "" };
    format!("{BUNDLE_MSG_ID_PREFIX}{task_id}:{attempt_id}:{seq}{suffix}")
}

/// The `Nats-Msg-Id` of the error result of the refused answer `answer_id` of `answerer` (to
/// `worker`, on `task_id`): `hub-refusal:<task_id>:<worker>:<answerer>:<answer_id>`, so a
/// redelivered answer refused again is stored once, and a refusal on one answerer's channel
/// never stands for another's.
pub fn refusal_msg_id(
    task_id: &TaskId,
    worker: &WorkerId,
    answerer: &AgentId,
    answer_id: &MessageId,
) -> String {
    format!("{REFUSAL_MSG_ID_PREFIX}{task_id}:{worker}:{answerer}:{answer_id}")
}

/// The `Nats-Msg-Id` of a status event: `hub-status:<event_id>`.
pub fn status_msg_id(event_id: &str) -> String {
    format!("{STATUS_MSG_ID_PREFIX}{event_id}")
}
