//! Finding a task and acting on it through an [`ActorSystem`]: its task channel's view, a query
//! or cancel to the worker holding it, and an answer to its question.
//!
//! Each acts as an identity, the task's delegator: the view is of the delegator's own channel
//! of the task (`channel.task.<delegator>.<task id>`, read through a router), which only the
//! router writes, with what the worker holding the task published (each body stamped by the
//! worker it names); the query or cancel names the delegator as its requester
//! (`hub.ctl.<worker>.<kind>.<delegator>`), and the answer is sent as the delegator. The
//! worker serves them only for the task's delegator.

use std::time::Duration;

use protocol::subjects::{self, ControlKind};
use protocol::task::{Answer, CancelStatus, ChannelView, ControlRequest};
use protocol::{AgentId, Envelope, Meta, TaskId};

use super::messaging::new_message_id;
use super::{ActorSystem, SystemError};

/// How long a control request may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Who queries or cancels a task ([`ActorSystem::control_task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActingAs<'a> {
    /// The task's delegator: it reads its own channel of the task through a router and names
    /// itself as the requester (`hub.ctl.<worker>.<kind>.<delegator>`).
    Delegator(&'a AgentId),
    /// An admin, on a task `delegator` delegated: it reads the channel with direct gets on the
    /// tasks stream (which an admin's grant allows, and an agent's does not) and uses the
    /// worker's admin control subject (`hub.ctl.<worker>.<kind>`, granted to admins only).
    Admin {
        /// Who delegated the task.
        delegator: &'a AgentId,
    },
}

impl ActingAs<'_> {
    fn delegator(&self) -> &AgentId {
        match self {
            ActingAs::Delegator(d) | ActingAs::Admin { delegator: d } => d,
        }
    }
}

impl ActorSystem {
    /// What the stored channel of `task_id`, delegated by `delegator`, says: read through a
    /// router, as `delegator`.
    ///
    /// # Errors
    /// [`SystemError::Request`] when the channel cannot be read (no router answers).
    pub async fn task_view(
        &self,
        delegator: &AgentId,
        task_id: &TaskId,
    ) -> Result<ChannelView, SystemError> {
        let js = async_nats::jetstream::new(self.client.clone());
        let reader = actors::task_channel::Reader::Routed(delegator.clone());
        actors::task_channel::view(&js, &reader, delegator, task_id)
            .await
            .map_err(|e| SystemError::request(&self.delivery.tasks.name, e))
    }

    /// Sends a query or cancel, as `who` ([`ActingAs`]), to the worker of the latest attempt
    /// of `task_id`, as its task channel names it, and returns the JSON reply. A finished task
    /// is answered from the channel (the worker has forgotten it): its state, `active: false`,
    /// and for a cancel `not_active`.
    ///
    /// # Errors
    /// [`SystemError::Task`] when nothing of the task is stored yet (unknown, or no worker
    /// took it yet); [`SystemError::Request`] / [`SystemError::Timeout`] when the worker does
    /// not answer.
    pub async fn control_task(
        &self,
        who: ActingAs<'_>,
        task_id: &TaskId,
        kind: ControlKind,
    ) -> Result<serde_json::Value, SystemError> {
        let delegator = who.delegator();
        let view = match who {
            ActingAs::Delegator(_) => self.task_view(delegator, task_id).await?,
            ActingAs::Admin { .. } => {
                let js = async_nats::jetstream::new(self.client.clone());
                let stream = &self.delivery.tasks.name;
                let reader = actors::task_channel::Reader::Direct(stream.clone());
                actors::task_channel::view(&js, &reader, delegator, task_id)
                    .await
                    .map_err(|e| SystemError::request(stream, e))?
            }
        };
        if let Some(result) = &view.final_result {
            let mut reply = serde_json::json!({"state": result.state, "active": false});
            if kind == ControlKind::Cancel {
                reply["cancel"] = serde_json::json!(CancelStatus::NotActive);
            }
            return Ok(reply);
        }
        let at = view.latest.ok_or_else(|| SystemError::Task {
            task_id: task_id.clone(),
            what: "nothing on its task channel yet: unknown task, or no worker took it yet".into(),
        })?;
        let request = ControlRequest {
            task_id: task_id.clone(),
            attempt_id: at.attempt_id,
            worker_id: at.worker_id.clone(),
        };
        let subject = match who {
            ActingAs::Delegator(_) => subjects::control_as(&at.worker_id, kind, delegator),
            ActingAs::Admin { .. } => subjects::control(&at.worker_id, kind),
        };
        let body = serde_json::to_vec(&request).expect("a control request serializes");
        let reply = tokio::time::timeout(
            CONTROL_TIMEOUT,
            self.client.request(subject.clone(), body.into()),
        )
        .await
        .map_err(|_| SystemError::Timeout {
            what: format!("worker {} to answer", at.worker_id),
        })?
        .map_err(|e| SystemError::request(&subject, e))?;
        serde_json::from_slice(&reply.payload).map_err(|e| SystemError::request(&subject, e))
    }

    /// Answers the question `task_id` (delegated by `from`) waits on with `responses`, as
    /// `from`: the answer names
    /// the waiting attempt and its tool call, and goes to the route of the waiting result
    /// (checked against the worker it names) through `from`'s ingress.
    ///
    /// # Errors
    /// [`SystemError::Task`] when the task is not waiting; [`SystemError::Publish`] when the
    /// ingress refuses.
    pub async fn answer_task(
        &self,
        from: &AgentId,
        task_id: &TaskId,
        responses: Vec<serde_json::Value>,
    ) -> Result<Answer, SystemError> {
        let view = self.task_view(from, task_id).await?;
        let not_waiting = || SystemError::Task {
            task_id: task_id.clone(),
            what: "not waiting for an answer".into(),
        };
        let waiting = view.waiting().ok_or_else(not_waiting)?;
        let suspend = waiting.suspend.clone().ok_or_else(not_waiting)?;
        let subject = match &waiting.answer_route {
            Some(route) => subjects::answer_ingress_from_route(from, route, &waiting.worker_id)
                .map_err(|e| SystemError::Task {
                    task_id: task_id.clone(),
                    what: format!("its answer route is not usable: {e}"),
                })?,
            None => subjects::answer_ingress(from, &waiting.worker_id),
        };
        let message_id = new_message_id();
        let answer = Answer {
            message_id: message_id.clone(),
            task_id: waiting.task_id.clone(),
            attempt_id: waiting.attempt_id.clone(),
            worker_id: waiting.worker_id.clone(),
            tool_call_id: suspend.tool_call_id,
            responses,
        };
        let envelope = Envelope {
            meta: Meta::new(message_id),
            body: serde_json::to_value(&answer).expect("an answer serializes"),
            extra: Default::default(),
        };
        let msg_id = format!("{from}:{}", envelope.meta.id);
        self.publish_envelope(&subject, &msg_id, &envelope, super::messaging::Retry::No)
            .await?;
        Ok(answer)
    }
}
