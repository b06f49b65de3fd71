//! What travels on a task channel (`channel.task.<key>`) and the join reply.
//!
//! Results and status events are envelopes like any other (they go through the ingress, so the
//! router stamps the worker's identity into `meta.from`); their body is a [`TaskChannelBody`]:
//! `{"result": {...}}` or `{"status": {...}}`.

use serde::{Deserialize, Serialize};

use super::{StatusEvent, TaskResult};
use crate::WireError;

/// The body of an envelope on a task channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskChannelBody {
    /// An attempt's outcome (completed, failed, waiting or cancelled).
    Result(TaskResult),
    /// A state change (acceptance first).
    Status(StatusEvent),
}

/// The router's answer to a worker's join request (`hub.work.<queue>.join`): the consumers it
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
    use crate::task::{AttemptId, TaskState};
    use crate::{TaskId, WorkerId};

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
    fn join_responses_round_trip() {
        let joined = JoinResponse::Joined(JoinReply {
            work_stream: "HUB_WORK".into(),
            queue_consumer: "queue-q".into(),
            targeted_consumer: "worker-w".into(),
            answers_stream: "HUB_ANSWERS".into(),
            answer_consumer: "answers-w".into(),
        });
        let text = serde_json::to_string(&joined).unwrap();
        assert_eq!(serde_json::from_str::<JoinResponse>(&text).unwrap(), joined);
        let refused: JoinResponse =
            serde_json::from_str(r#"{"error":{"kind":"internal","detail":"x"}}"#).unwrap();
        assert!(matches!(refused, JoinResponse::Refused { .. }));
    }
}
