//! `runtime task status|cancel` and `runtime answer`: find a task's worker and attempt from the
//! last message on its stored channel, then use the worker's control subjects or the answer
//! ingress.

use std::time::Duration;

use async_nats::HeaderMap;
use protocol::subjects::{self, ControlKind};
use protocol::task::{Answer, ControlRequest, TaskChannelBody, TaskResult, TaskState};
use protocol::{headers, AgentId, Codec, Envelope, Meta, TaskId, TaskKey, WorkerId};

use crate::SystemError;

/// How long a control request may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Who runs a task, as the last message on its channel says.
#[derive(Debug, Clone)]
pub struct TaskWhereabouts {
    /// The task.
    pub task_id: TaskId,
    /// The attempt.
    pub attempt_id: protocol::task::AttemptId,
    /// Its worker.
    pub worker_id: WorkerId,
    /// The last state reported.
    pub state: TaskState,
    /// The last result, when the last message was one.
    pub result: Option<TaskResult>,
}

/// Reads the last message of `task_id`'s stored channel.
///
/// # Errors
/// [`SystemError::Request`] when the task channel holds nothing readable (unknown task, or not
/// accepted by a worker yet).
pub async fn whereabouts(
    client: &async_nats::Client,
    task_id: &TaskId,
) -> Result<TaskWhereabouts, SystemError> {
    let js = async_nats::jetstream::new(client.clone());
    let subject = subjects::task(&TaskKey::from_task_id(task_id));
    let missing = || {
        SystemError::Request(format!(
            "nothing on {subject} yet: unknown task, or no worker has accepted it"
        ))
    };
    let stream = js
        .get_stream(protocol::config::DeliveryConfig::default().tasks.name)
        .await
        .map_err(|e| SystemError::Request(e.to_string()))?;
    let raw = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .map_err(|_| missing())?;
    let envelope = protocol::decode(&raw.payload, Codec::Json).map_err(|_| missing())?;
    match serde_json::from_value::<TaskChannelBody>(envelope.body).map_err(|_| missing())? {
        TaskChannelBody::Result(r) => Ok(TaskWhereabouts {
            task_id: r.task_id.clone(),
            attempt_id: r.attempt_id.clone(),
            worker_id: r.worker_id.clone(),
            state: r.state,
            result: Some(r),
        }),
        TaskChannelBody::Status(s) => Ok(TaskWhereabouts {
            task_id: s.task_id,
            attempt_id: s.attempt_id,
            worker_id: s.worker_id,
            state: s.state,
            result: None,
        }),
    }
}

/// Sends a query or cancel to the worker running `task_id` and returns its JSON reply.
///
/// # Errors
/// [`SystemError::Request`] when the task is unknown or the worker does not answer.
pub async fn control(
    client: &async_nats::Client,
    task_id: &TaskId,
    kind: ControlKind,
) -> Result<serde_json::Value, SystemError> {
    let at = whereabouts(client, task_id).await?;
    if at.state.is_final() {
        // The worker has forgotten a finished attempt; the task channel is the record.
        let mut reply = serde_json::json!({"state": at.state, "active": false});
        if kind == ControlKind::Cancel {
            reply["cancel"] = serde_json::json!(protocol::task::CancelStatus::NotActive);
        }
        return Ok(reply);
    }
    let request = ControlRequest {
        task_id: at.task_id,
        attempt_id: at.attempt_id,
        worker_id: at.worker_id.clone(),
    };
    let body = serde_json::to_vec(&request).map_err(|e| SystemError::Request(e.to_string()))?;
    let reply = tokio::time::timeout(
        CONTROL_TIMEOUT,
        client.request(subjects::control(&at.worker_id, kind), body.into()),
    )
    .await
    .map_err(|_| SystemError::Timeout {
        what: format!("worker {} to answer", at.worker_id),
    })?
    .map_err(|e| SystemError::Request(format!("worker {}: {e}", at.worker_id)))?;
    serde_json::from_slice(&reply.payload).map_err(|e| SystemError::Request(e.to_string()))
}

/// Answers the waiting attempt of `task_id` with `responses`, as `from`, through the ingress.
///
/// # Errors
/// [`SystemError::Request`] when the task is not waiting; publish errors.
pub async fn answer(
    client: &async_nats::Client,
    from: &AgentId,
    task_id: &TaskId,
    responses: Vec<serde_json::Value>,
) -> Result<Answer, SystemError> {
    let at = whereabouts(client, task_id).await?;
    let suspend = at
        .result
        .as_ref()
        .filter(|r| r.state == TaskState::Waiting)
        .and_then(|r| r.suspend.clone())
        .ok_or_else(|| {
            SystemError::Request(format!("task {task_id} is not waiting for an answer"))
        })?;
    let message_id = crate::system::messaging::new_message_id();
    let answer = Answer {
        message_id: message_id.clone(),
        task_id: at.task_id,
        attempt_id: at.attempt_id,
        worker_id: at.worker_id.clone(),
        tool_call_id: suspend.tool_call_id,
        responses,
    };
    let envelope = Envelope {
        meta: Meta::new(message_id),
        body: serde_json::to_value(&answer).map_err(|e| SystemError::Request(e.to_string()))?,
        extra: Default::default(),
    };
    let subject = subjects::answer_ingress(from, &at.worker_id);
    let fail = |reason: String| SystemError::Publish {
        subject: subject.clone(),
        reason,
    };
    let payload = protocol::encode(&envelope, Codec::Json).map_err(|e| fail(e.to_string()))?;
    let mut h = HeaderMap::new();
    h.insert(
        headers::NATS_MSG_ID,
        format!("{from}:{}", envelope.meta.id).as_str(),
    );
    let js = async_nats::jetstream::new(client.clone());
    let ack = js
        .publish_with_headers(subject.clone(), h, payload.into())
        .await
        .map_err(|e| fail(e.to_string()))?;
    tokio::time::timeout(CONTROL_TIMEOUT, ack)
        .await
        .map_err(|_| fail("no ingress ack".into()))?
        .map_err(|e| fail(e.to_string()))?;
    Ok(answer)
}
