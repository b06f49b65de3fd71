//! What travels on a task channel (`channel.task.<delegator>.<key>`) and the join reply.
//!
//! Results and status events are envelopes like any other (they go through the ingress, so the
//! router stamps the worker's identity into `meta.from`); their body is a [`TaskChannelBody`]:
//! `{"result": {...}}`, `{"status": {...}}` or, for an answer the worker refused,
//! `{"answer_refused": {...}}`.

use serde::{Deserialize, Serialize};

use super::{AttemptId, StatusEvent, TaskResult};
use crate::ids::{MessageId, TaskId, WorkerId};
use crate::WireError;

/// The body of an envelope on a task channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskChannelBody {
    /// An attempt's outcome (completed, failed, waiting or cancelled).
    Result(TaskResult),
    /// A state change (acceptance first).
    Status(StatusEvent),
    /// The error result of an answer the worker refused (stale, or for an attempt it does not
    /// own). It says nothing about the task's state: readers of that state skip it.
    AnswerRefused(AnswerRefusal),
}

impl TaskChannelBody {
    /// The task the body is about.
    pub fn task_id(&self) -> &TaskId {
        match self {
            TaskChannelBody::Result(r) => &r.task_id,
            TaskChannelBody::Status(s) => &s.task_id,
            TaskChannelBody::AnswerRefused(a) => &a.task_id,
        }
    }

    /// The worker that published it (its attempt's).
    pub fn worker_id(&self) -> &WorkerId {
        match self {
            TaskChannelBody::Result(r) => &r.worker_id,
            TaskChannelBody::Status(s) => &s.worker_id,
            TaskChannelBody::AnswerRefused(a) => &a.worker_id,
        }
    }

    /// Whether `sender` (the identity the router stamped into `meta.from`, or the one in the
    /// ingress subject) is the worker the body names: nothing else on a task channel is
    /// trusted (docs/SECURITY.md).
    pub fn is_from(&self, sender: Option<&str>) -> bool {
        sender == Some(self.worker_id().as_str())
    }
}

/// An answer the worker refused, published on the task channel so that the answerer (and any
/// tracker of the task) learns it: [`WireErrorKind::StaleAnswer`](crate::WireErrorKind) when
/// the attempt does not wait on that tool call (or is not waiting), and
/// [`WireErrorKind::UnknownTaskAttempt`](crate::WireErrorKind) when the worker owns no such
/// attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerRefusal {
    /// The task the answer named.
    pub task_id: TaskId,
    /// The attempt the answer named.
    pub attempt_id: AttemptId,
    /// The worker that refused it (the answer's addressee).
    pub worker_id: WorkerId,
    /// The refused answer's `message_id`.
    pub answer_id: MessageId,
    /// Why.
    pub error: WireError,
}

/// The router's answer to a worker's join request (`hub.work.<queue>.join.<worker>`): the consumers it
/// created or updated for that worker, which the worker then binds (workers never create
/// consumers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinReply {
    /// The work stream (`HUB_WORK`).
    pub work_stream: String,
    /// The queue's shared consumer (`queue-<queue>`).
    pub queue_consumer: String,
    /// This worker's targeted-task consumer (`worker-<worker>`).
    pub targeted_consumer: String,
    /// The answers stream (`HUB_ANSWERS`).
    pub answers_stream: String,
    /// This worker's answer consumer (`answers-<worker>`).
    pub answer_consumer: String,
    /// The stream that stores task channels (the router's `tasks.name`), where the worker
    /// reads a task's record before it runs the task.
    #[serde(default = "default_tasks_stream")]
    pub tasks_stream: String,
    /// The ingress stream (the router's `ingress.name`), where the worker looks for a result
    /// of the task stored but not routed yet.
    #[serde(default = "default_ingress_stream")]
    pub ingress_stream: String,
}

fn default_tasks_stream() -> String {
    crate::subjects::TASKS_STREAM.to_owned()
}

fn default_ingress_stream() -> String {
    crate::subjects::INGRESS_STREAM.to_owned()
}

/// A join reply or a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JoinResponse {
    /// The consumers exist.
    Joined(JoinReply),
    /// The router refused (invalid request, JetStream error).
    Refused {
        /// Why.
        error: WireError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskState;

    #[test]
    fn task_channel_bodies_are_externally_tagged() {
        let result = TaskResult {
            task_id: TaskId::new("t1").unwrap(),
            attempt_id: AttemptId::new("a1").unwrap(),
            worker_id: WorkerId::new("w1").unwrap(),
            state: TaskState::Completed,
            response: Some(serde_json::json!("ok")),
            error: None,
            suspend: None,
            answer_route: None,
        };
        let json = serde_json::to_value(TaskChannelBody::Result(result.clone())).unwrap();
        assert_eq!(json["result"]["state"], "completed");
        let back: TaskChannelBody = serde_json::from_value(json).unwrap();
        assert_eq!(back, TaskChannelBody::Result(result));
    }

    #[test]
    fn an_answer_refusal_is_its_own_body() {
        let refusal = AnswerRefusal {
            task_id: TaskId::new("t1").unwrap(),
            attempt_id: AttemptId::new("a1").unwrap(),
            worker_id: WorkerId::new("w1").unwrap(),
            answer_id: MessageId::new("ans-1").unwrap(),
            error: WireError::new(crate::WireErrorKind::StaleAnswer, "stale answer"),
        };
        let json = serde_json::to_value(TaskChannelBody::AnswerRefused(refusal.clone())).unwrap();
        assert_eq!(json["answer_refused"]["error"]["kind"], "stale_answer");
        assert_eq!(json["answer_refused"]["answer_id"], "ans-1");
        let back: TaskChannelBody = serde_json::from_value(json).unwrap();
        assert_eq!(back.task_id().as_str(), "t1");
        assert_eq!(back, TaskChannelBody::AnswerRefused(refusal));
    }

    #[test]
    fn join_responses_round_trip() {
        let joined = JoinResponse::Joined(JoinReply {
            work_stream: "HUB_WORK".into(),
            queue_consumer: "queue-q".into(),
            targeted_consumer: "worker-w".into(),
            answers_stream: "HUB_ANSWERS".into(),
            answer_consumer: "answers-w".into(),
            tasks_stream: "HUB_TASKS".into(),
            ingress_stream: "HUB_INGRESS".into(),
        });
        let text = serde_json::to_string(&joined).unwrap();
        assert_eq!(serde_json::from_str::<JoinResponse>(&text).unwrap(), joined);
        // A router of an earlier version names no tasks stream: the default.
        let old = r#"{"work_stream":"HUB_WORK","queue_consumer":"queue-q","targeted_consumer":"worker-w","answers_stream":"HUB_ANSWERS","answer_consumer":"answers-w"}"#;
        match serde_json::from_str::<JoinResponse>(old).unwrap() {
            JoinResponse::Joined(reply) => {
                assert_eq!(reply.tasks_stream, "HUB_TASKS");
                assert_eq!(reply.ingress_stream, "HUB_INGRESS");
            }
            other => panic!("{other:?}"),
        }
        let refused: JoinResponse =
            serde_json::from_str(r#"{"error":{"kind":"internal","detail":"x"}}"#).unwrap();
        assert!(matches!(refused, JoinResponse::Refused { .. }));
    }
}
