//! The pure task protocol of the worker channel.
//!
//! A delegator submits a [`TaskSpec`] on
//! [`work_ingress`](crate::subjects::work_ingress); the router decodes it
//! strictly with [`decode_task`], stores it on
//! [`work`](crate::subjects::work()) under [`task_msg_id`], and a worker
//! runs it as an attempt ([`AttemptId`]). The worker publishes
//! [`TaskResult`]s and [`StatusEvent`]s on the task channel
//! `channel.task.<delegator>.<key>` (key from
//! [`TaskKey::from_task_id`](crate::subjects::TaskKey::from_task_id)),
//! receives [`Answer`]s on its answer consumer and serves
//! [`ControlRequest`]s on its control subjects.
//!
//! The decisions a worker takes are pure functions here:
//! [`judge_answer`], [`on_delivery`] (with the task channel's [`ChannelView`]),
//! [`build_result`], [`cancel_status`], [`result_too_large`] and [`claim_step`] (the task
//! claim, [`Claim`]); [`idempotency`] holds the
//! records and decisions of idempotency keys.
//!
//! ```
//! use protocol::task::{decode_task, TASK_VERSION};
//!
//! let body = serde_json::json!({
//!     "version": 1, "task_id": "review-42", "text": "Review the plan.",
//!     "context": ["Do not deploy."],
//! });
//! let task = decode_task(&body)?;
//! assert_eq!(task.version, TASK_VERSION);
//! assert_eq!(task.context, ["Do not deploy."]);
//! # Ok::<(), protocol::task::TaskError>(())
//! ```

mod channel;
mod claim;
mod decide;
mod decode;
mod error;
mod fresh;
pub mod idempotency;
mod reread;
mod types;
mod wire;

pub use channel::{ChannelView, Whereabouts};
pub use claim::{
    claim_step, claim_ttl, stand_down_delay, ttl_header, Claim, ClaimStep, Stored, LAPSE_MARGIN,
    MIN_STAND_DOWN,
};
pub use decide::{
    build_result, bundle_msg_id, cancel_status, expired_result, failed_result, is_expired,
    is_rerun, judge_answer, may_control, on_delivery, refusal_msg_id, result_msg_id,
    result_too_large, status_event_id, status_msg_id, task_msg_id, too_large_result, AnswerVerdict,
    AttemptView, ChannelState, DeliveryPlan, JournalView, Requester, Settled, ENVELOPE_HEADROOM,
    EXPIRED, NOT_DELEGATOR, REFUSAL_MSG_ID_PREFIX, RESULT_MSG_ID_PREFIX, RESULT_TOO_LARGE,
    STATUS_MSG_ID_PREFIX, TASK_MSG_ID_PREFIX,
};
pub use decode::{decode_task, decode_task_json};
pub use error::TaskError;
pub use fresh::{must_read_channel, router_flags, IngressBaseline, IngressFacts, InputFacts};
pub use reread::RereadSchedule;
pub use types::{
    Answer, CancelStatus, ControlRequest, JoinRequest, Outcome, QueryReply, StatusEvent,
    StatusKind, Suspend, TaskResult, TaskSpec, TaskState,
};
pub use wire::{AnswerRefusal, JoinReply, JoinResponse, TaskChannelBody};

use crate::ids::{validated_id, MAX_TOKEN_LEN};

/// The only task protocol version this crate speaks.
pub const TASK_VERSION: u32 = 1;

validated_id! {
    /// The id of one attempt at running a task. Same rules as
    /// [`TaskId`](crate::ids::TaskId): subject-safe `[A-Za-z0-9_-]`, at most
    /// 128 bytes. Chosen by the worker (e.g. random); an answer resumes the
    /// same attempt.
    AttemptId { kind: "attempt id", max: MAX_TOKEN_LEN, charset: Token, reserved: [] }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
