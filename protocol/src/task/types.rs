//! The wire types of the worker channel (JSON, snake_case).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AttemptId;
use crate::ids::{MessageId, TaskId, WorkerId};
use crate::wire_error::WireError;

/// A task as submitted by a delegator. Decode it with
/// [`decode_task`](super::decode_task), which is strict: unknown fields,
/// a wrong version, a blank text or an invalid id are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Always [`TASK_VERSION`](super::TASK_VERSION).
    pub version: u32,
    /// The caller's id of the task; also its task channel key.
    pub task_id: TaskId,
    /// What to do; never blank.
    pub text: String,
    /// Extra context, kept apart from the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// A caller key to deduplicate submissions with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// When the task stops being worth running, in unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

/// The state of a task attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Stored and accepted, not yet running.
    Queued,
    /// Being executed.
    Running,
    /// Parked on a question; an [`Answer`] resumes it.
    Waiting,
    /// Finished with a response.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled on request.
    Cancelled,
}

impl TaskState {
    /// Every state, in declaration order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Queued,
        TaskState::Running,
        TaskState::Waiting,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    /// Whether no further state change follows (completed, failed,
    /// cancelled).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// The wire name of this state.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Waiting => "waiting",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

/// The question a waiting attempt asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suspend {
    /// The question or approval request, as text.
    pub question: String,
    /// The tool call an [`Answer`] must name to resume the attempt.
    pub tool_call_id: String,
}

/// The outcome of an attempt at a state boundary, published on the task
/// channel. Check `error` as well as `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskResult {
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The worker that owns the attempt.
    pub worker_id: WorkerId,
    /// Completed, failed, waiting or cancelled.
    pub state: TaskState,
    /// The response, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Value>,
    /// Why the attempt failed or the input was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    /// The pending question, when waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<Suspend>,
    /// Where to answer, when waiting: the channel an answerer appends to its own ingress
    /// prefix, `answer.<worker>` ([`answer_route`](crate::subjects::answer_route); see
    /// [`answer_ingress_from_route`](crate::subjects::answer_ingress_from_route)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_route: Option<String>,
}

/// How a handler's run (or resume) of an attempt ended; [`build_result`](super::build_result)
/// turns it into the attempt's [`TaskResult`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished with a response.
    Completed(Value),
    /// Finished with an error.
    Failed(String),
    /// Parked on a question; an [`Answer`] naming `tool_call_id` resumes it.
    Waiting {
        /// The question, as text.
        question: String,
        /// The tool call the answer must name.
        tool_call_id: String,
    },
    /// Stopped on a cancel request.
    Cancelled,
}

/// What a [`StatusEvent`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusKind {
    /// The worker admitted the attempt (sequence zero).
    TaskAccepted,
    /// The attempt changed state.
    StateChanged,
}

/// A state change of an attempt, published on the task channel with a
/// stable [`event_id`](StatusEvent::event_id); deduplicate by it. Carries no
/// prompt, response or question text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusEvent {
    /// [`status_event_id`](super::status_event_id) of the fields below.
    pub event_id: String,
    /// Acceptance or a state change.
    #[serde(rename = "type")]
    pub kind: StatusKind,
    /// The state-change sequence; zero is acceptance.
    pub seq: u32,
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The owning worker.
    pub worker_id: WorkerId,
    /// The state after the change.
    pub state: TaskState,
    /// When, in unix milliseconds.
    pub at_ms: u64,
}

impl StatusEvent {
    /// The event for state change `seq` (zero: acceptance) of an attempt,
    /// with its stable id.
    pub fn new(
        task_id: TaskId,
        attempt_id: AttemptId,
        worker_id: WorkerId,
        seq: u32,
        state: TaskState,
        at_ms: u64,
    ) -> StatusEvent {
        let kind = if seq == 0 {
            StatusKind::TaskAccepted
        } else {
            StatusKind::StateChanged
        };
        StatusEvent {
            event_id: super::status_event_id(&task_id, &attempt_id, seq, state),
            kind,
            seq,
            task_id,
            attempt_id,
            worker_id,
            state,
            at_ms,
        }
    }
}

/// An answer to a waiting attempt, sent through
/// [`answer_ingress`](crate::subjects::answer_ingress).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// Stable id of this logical answer; retry with the same id.
    pub message_id: MessageId,
    /// The task.
    pub task_id: TaskId,
    /// The waiting attempt.
    pub attempt_id: AttemptId,
    /// The worker that owns the attempt.
    pub worker_id: WorkerId,
    /// Must match the pending [`Suspend::tool_call_id`].
    pub tool_call_id: String,
    /// The responses to the question.
    pub responses: Vec<Value>,
}

/// A query or cancel request on a worker's control subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The worker addressed.
    pub worker_id: WorkerId,
}

/// What a cancel request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    /// Cancellation was requested; it is not yet completion.
    Requested,
    /// The attempt is already final.
    NotActive,
    /// The request does not name this worker's attempt.
    Stale,
}

/// The reply to a [`ControlRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryReply {
    /// The saved state of the attempt.
    pub state: TaskState,
    /// Whether this process is executing it now; `running` with
    /// `active: false` means interrupted work.
    pub active: bool,
    /// The pending question, when waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<Suspend>,
    /// The outcome of a cancel request (absent on a query).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelStatus>,
}

/// The body of a worker's join request on
/// [`join_request`](crate::subjects::join_request): the router creates the
/// queue, targeted and answer consumers of `worker_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    /// The worker that joins.
    pub worker_id: WorkerId,
}
