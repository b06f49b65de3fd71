//! Delegating tasks through an [`ActorSystem`].

use protocol::task::{TaskSpec, TASK_VERSION};
use protocol::{subjects, AgentId, Codec, Envelope, Meta, QueueName, TaskId, WorkerId};
use serde::{Deserialize, Serialize};

use super::messaging::new_message_id;
use super::{ActorSystem, SystemError};

/// Proof that a task was submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReceipt {
    /// The task id (for an idempotency key seen before: the first submission's task id).
    pub task_id: TaskId,
    /// Ingress sequence of this submission; `None` when an earlier submission with the same
    /// idempotency key already created the task (nothing was sent).
    pub ingress_seq: Option<u64>,
    /// True when the idempotency key named an existing task.
    pub existing: bool,
}

/// A task spec with a fresh task id.
pub fn new_task(text: impl Into<String>, context: Vec<String>) -> TaskSpec {
    TaskSpec {
        version: TASK_VERSION,
        task_id: TaskId::new(new_message_id().as_str().replace(['-'], "_"))
            .expect("generated ids are valid task ids"),
        text: text.into(),
        context,
        idempotency_key: None,
        expires_at: None,
    }
}

impl ActorSystem {
    /// Submits `spec` to `queue` (or to one `worker` of it) through the ingress, as `from`.
    ///
    /// With an idempotency key, a create-only KV entry `(queue, key) -> task_id` is made first;
    /// when it exists, nothing is sent and the receipt names the existing task.
    ///
    /// # Errors
    /// [`SystemError::Publish`] when the ingress or the KV bucket refuses or does not answer.
    ///
    /// # Cancel safety
    /// Not cancel safe; submit again with the same task id (the work stream dedupes it within
    /// the duplicate window) or the same idempotency key.
    pub async fn delegate(
        &self,
        from: &AgentId,
        queue: &QueueName,
        worker: Option<&WorkerId>,
        spec: &TaskSpec,
    ) -> Result<TaskReceipt, SystemError> {
        let subject = subjects::work_ingress(from, queue, worker);
        let fail = |reason: String| SystemError::Publish {
            subject: subject.clone(),
            reason,
        };
        let js = async_nats::jetstream::new(self.client.clone());
        if let Some(key) = &spec.idempotency_key {
            let kv = js
                .get_key_value(actors::streams::IDEMPOTENCY_BUCKET)
                .await
                .map_err(|e| fail(format!("idempotency bucket: {e}")))?;
            let entry = idempotency_entry(queue, key);
            match kv
                .create(&entry, spec.task_id.as_str().to_string().into())
                .await
            {
                Ok(_) => {}
                Err(e) if e.kind() == async_nats::jetstream::kv::CreateErrorKind::AlreadyExists => {
                    let existing = kv
                        .get(&entry)
                        .await
                        .map_err(|e| fail(e.to_string()))?
                        .ok_or_else(|| fail("idempotency entry vanished".into()))?;
                    let task_id = TaskId::new(String::from_utf8_lossy(&existing).to_string())
                        .map_err(|e| fail(e.to_string()))?;
                    return Ok(TaskReceipt {
                        task_id,
                        ingress_seq: None,
                        existing: true,
                    });
                }
                Err(e) => return Err(fail(format!("idempotency key: {e}"))),
            }
        }
        let envelope = Envelope {
            meta: Meta::new(new_message_id()),
            body: serde_json::to_value(spec).map_err(|e| fail(e.to_string()))?,
            extra: Default::default(),
        };
        let payload = protocol::encode(&envelope, Codec::Json).map_err(|e| fail(e.to_string()))?;
        let ack = self
            .publish_ingress(&subject, &format!("{from}:task:{}", spec.task_id), payload)
            .await?;
        Ok(TaskReceipt {
            task_id: spec.task_id.clone(),
            ingress_seq: Some(ack.sequence),
            existing: false,
        })
    }
}

/// The KV key of an idempotency key: `<queue>.<hex of the key>` (KV keys allow fewer
/// characters than idempotency keys).
fn idempotency_entry(queue: &QueueName, key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{queue}.{hex}")
}

/// A running task tracker: the final result arrives once on `result`; status events and
/// waiting results on `events`.
pub struct Tracking {
    /// The final result (completed, failed or cancelled), exactly once.
    pub result: tokio::sync::oneshot::Receiver<protocol::task::TaskResult>,
    /// Status events and non-final results, deduplicated.
    pub events: tokio::sync::mpsc::UnboundedReceiver<actors::tracker::TrackerEvent>,
}

impl ActorSystem {
    /// The actor name of the tracker of `task_id` (fault-injection key).
    pub fn tracker_name(&self, task_id: &TaskId) -> String {
        format!("{}/tracker-{task_id}", self.id)
    }

    /// Starts a supervised tracker (transient: restarted after a crash, not after it delivered)
    /// that follows `task_id`'s channel live and reads its stored channel from the start, so a
    /// result published while nobody listened is still found.
    ///
    /// Every tracker of the system is a child of one dynamic supervisor (started by the first
    /// call): each is restarted on its own with backoff, at most 5 times within 10 s, after which
    /// it is given up (its `result` receiver then reports the sender dropped). A tracker that
    /// delivered leaves the supervisor, so the system keeps no trace of finished tasks.
    ///
    /// # Errors
    /// [`SystemError::Spawn`] when the supervisor cannot be started or refuses the tracker
    /// (e.g. the task is already tracked by this system).
    pub async fn track(&self, task_id: &TaskId) -> Result<Tracking, SystemError> {
        self.start_tracker(task_id, false).await
    }

    /// Submits `spec` like [`delegate`](Self::delegate) and tracks it like
    /// [`track`](Self::track), subscribing to the task channel *before* submitting. A task
    /// without an idempotency key is new (its id was never submitted), so its tracker skips the
    /// initial stored read: one request less per task. With an idempotency key the task may
    /// exist already; it is then tracked after the submission, reading the stored channel.
    ///
    /// # Errors
    /// As [`delegate`](Self::delegate) and [`track`](Self::track).
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`delegate`](Self::delegate)).
    pub async fn delegate_tracked(
        &self,
        from: &AgentId,
        queue: &QueueName,
        worker: Option<&WorkerId>,
        spec: &TaskSpec,
    ) -> Result<(TaskReceipt, Tracking), SystemError> {
        if spec.idempotency_key.is_some() {
            let receipt = self.delegate(from, queue, worker, spec).await?;
            let tracking = self.track(&receipt.task_id).await?;
            return Ok((receipt, tracking));
        }
        let tracking = self.start_tracker(&spec.task_id, true).await?;
        let receipt = self.delegate(from, queue, worker, spec).await?;
        Ok((receipt, tracking))
    }

    async fn start_tracker(&self, task_id: &TaskId, fresh: bool) -> Result<Tracking, SystemError> {
        use actors::supervision::{dynamic, ChildSpec, Restart};
        let (tracker, result, events) = actors::tracker::TaskTracker::new(
            self.tracker_name(task_id),
            self.client.clone(),
            task_id.clone(),
        );
        let mut tracker = tracker.with_tasks_stream(self.delivery.tasks.name.clone());
        if fresh {
            tracker = tracker.fresh();
        }
        let supervisor = &self.trackers_supervisor().await?;
        let child = ChildSpec::actor(self.tracker_name(task_id), tracker, || ())
            .with_restart(Restart::Transient);
        dynamic::add_child(supervisor, child)
            .await
            .map_err(|e| SystemError::Spawn {
                what: self.tracker_name(task_id),
                reason: e.to_string(),
            })?;
        Ok(Tracking { result, events })
    }

    /// The trackers' dynamic supervisor, started on first use, and again if it ever stopped.
    async fn trackers_supervisor(&self) -> Result<actors::supervision::DynamicRef, SystemError> {
        use actors::supervision::{DynamicSupervisor, Intensity};
        let mut slot = self.trackers.lock().await;
        if let Some((sup, _)) = slot.as_ref() {
            // Alive: starting (a fresh spawn may not be `Running` yet), running or upgrading.
            if sup.get_status() < ractor::ActorStatus::Draining {
                return Ok(sup.clone());
            }
        }
        let name = format!("{}/trackers", self.id);
        // A stopped supervisor may still hold its registry name for a moment.
        if let Some((old, join)) = slot.take() {
            old.stop(None);
            let _ = join.await;
        }
        let (sup, join) = DynamicSupervisor::spawn(name.clone(), Intensity::default())
            .await
            .map_err(|e| SystemError::Spawn {
                what: name,
                reason: e.to_string(),
            })?;
        *slot = Some((sup.clone(), join));
        Ok(sup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_entries_are_valid_kv_keys_per_queue() {
        let q = QueueName::new("builds").unwrap();
        let entry = idempotency_entry(&q, "order #42/α");
        assert!(entry.starts_with("builds."));
        assert!(entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'));
        assert_ne!(
            entry,
            idempotency_entry(&QueueName::new("other").unwrap(), "order #42/α")
        );
    }
}
