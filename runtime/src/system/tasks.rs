//! Delegating tasks through an [`ActorSystem`].

use std::time::Duration;

use protocol::error_chain::ErrorChain;
use protocol::task::idempotency::{self, Existing, IdempotencyRecord, Submission};
use protocol::task::{TaskSpec, TASK_VERSION};
use protocol::{subjects, AgentId, Envelope, Meta, QueueName, TaskId, WorkerId};
use ractor::ActorRef;
use serde::{Deserialize, Serialize};

use super::idempotency::{Created, Entry};
use super::messaging::{new_message_id, Retry};
use super::{ActorSystem, SystemError};

/// Proof that a task was submitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReceipt {
    /// The task id (for an idempotency key seen before: the first submission's task id).
    pub task_id: TaskId,
    /// Ingress sequence of what this submission published: its task, or — for an idempotency
    /// key whose earlier submission was never confirmed stored — that task again (the ingress
    /// dedupes it when the first publish did arrive). `None` when an earlier submission with
    /// the same key had its task stored already (nothing was sent).
    pub ingress_seq: Option<u64>,
    /// True when the idempotency key named an existing task.
    pub existing: bool,
}

/// A fresh task id: 128 random bits, as 32 lowercase hex digits. Unguessable, so nobody can
/// squat on a task's id (or its task channel) before its delegator uses it.
///
/// # Panics
/// When the operating system has no randomness to give.
pub fn new_task_id() -> TaskId {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the operating system gives random bytes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    TaskId::new(hex).expect("32 hex digits are a valid task id")
}

/// A task spec with a fresh task id ([`new_task_id`]).
pub fn new_task(text: impl Into<String>, context: Vec<String>) -> TaskSpec {
    TaskSpec {
        version: TASK_VERSION,
        task_id: new_task_id(),
        text: text.into(),
        context,
        idempotency_key: None,
        expires_at: None,
    }
}

impl ActorSystem {
    /// Submits `spec` to `queue` (or to one `worker` of it) through the ingress, as `from`.
    ///
    /// The whole task is checked first, as the router checks it (its idempotency key
    /// included): an invalid task is refused before anything is written or sent.
    ///
    /// With an idempotency key, a create-only KV entry `(from, queue, key)` binds the key to the task
    /// *and* records whether the ingress stored it (see [`protocol::task::idempotency`]): the
    /// entry is created as pending with the envelope to publish, the envelope is published, and
    /// the entry is then marked stored. A submission that finds the entry names its task
    /// (`existing: true`); when the entry is still pending (the first publish failed or timed
    /// out, or its submitter died), it publishes that same task again, under the same
    /// `Nats-Msg-Id`, before answering. So the key and the stored task agree whatever fails
    /// between the two steps, and the task runs once (a task already run is recognised by its
    /// worker from the task channel).
    ///
    /// # Errors
    /// [`SystemError::InvalidTask`] for a task the router would refuse (nothing is written);
    /// [`SystemError::Publish`] when the ingress or the KV bucket refuses or does not answer
    /// (retry with the same idempotency key, or the same task id).
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
        let body = serde_json::to_value(spec).expect("a task spec serializes");
        protocol::task::decode_task(&body).map_err(SystemError::InvalidTask)?;
        let subject = subjects::work_ingress(from, queue, worker);
        let msg_id = task_ingress_msg_id(from, &spec.task_id);
        let envelope = Envelope {
            meta: Meta::new(new_message_id()),
            body,
            extra: Default::default(),
        };
        let Some(key) = &spec.idempotency_key else {
            let ack = self
                .publish_envelope(&subject, &msg_id, &envelope, Retry::No)
                .await?;
            return Ok(TaskReceipt {
                task_id: spec.task_id.clone(),
                ingress_seq: Some(ack.sequence),
                existing: false,
            });
        };
        let entry = Entry::new(&self.client, &idempotency::entry_key(from, queue, key));
        let record = IdempotencyRecord {
            task_id: spec.task_id.clone(),
            state: Submission::Pending,
            subject,
            msg_id,
            envelope: idempotency::recorded_envelope(&envelope),
        };
        let value = serde_json::to_vec(&record).expect("an idempotency record serializes");
        if let Created::Revision(revision) = entry.create(value).await? {
            let ack = self
                .publish_envelope(&record.subject, &record.msg_id, &envelope, Retry::No)
                .await?;
            mark_stored(&entry, record, revision).await;
            return Ok(TaskReceipt {
                task_id: spec.task_id.clone(),
                ingress_seq: Some(ack.sequence),
                existing: false,
            });
        }
        let bucket = subjects::IDEMPOTENCY_BUCKET;
        let (value, revision) = entry
            .read()
            .await?
            .ok_or_else(|| SystemError::publish(bucket, "idempotency entry vanished"))?;
        let existing =
            idempotency::on_existing(&value).map_err(|e| SystemError::publish(bucket, e))?;
        let mut record = match existing {
            Existing::Stored(task_id) => {
                self.audit_deduplicated(from, &task_id, key).await;
                return Ok(TaskReceipt {
                    task_id,
                    ingress_seq: None,
                    existing: true,
                });
            }
            Existing::Republish(record) => record,
        };
        // Published as the caller: a sender may publish only as itself (on a broker without
        // rendered permissions, anyone may have written the entry).
        let same_sender = subjects::parse_work_ingress(&record.subject)
            .ok()
            .flatten()
            .is_some_and(|(sender, _, _)| &sender == from);
        if !same_sender {
            record.subject = subjects::work_ingress(from, queue, worker);
            record.msg_id = task_ingress_msg_id(from, &record.task_id);
        }
        tracing::info!(task_id = %record.task_id, "idempotency key pending: publishing its task again");
        // A record too large to keep its envelope: this caller's task, under the recorded
        // task id.
        let again = record.envelope.clone().unwrap_or_else(|| Envelope {
            meta: Meta::new(new_message_id()),
            body: idempotency::republished_body(&record, &envelope.body),
            extra: Default::default(),
        });
        let ack = self
            .publish_envelope(
                &record.subject,
                &record.msg_id,
                &again,
                Retry::OutcomeUnknown,
            )
            .await?;
        let task_id = record.task_id.clone();
        mark_stored(&entry, *record, revision).await;
        self.audit_deduplicated(from, &task_id, key).await;
        Ok(TaskReceipt {
            task_id,
            ingress_seq: Some(ack.sequence),
            existing: true,
        })
    }
}

impl ActorSystem {
    /// The `deduplicated` event of a submission whose idempotency key named an existing task,
    /// as the delegating agent (`hub.audit.agent.<from>`), when audit events are on.
    async fn audit_deduplicated(&self, from: &AgentId, task_id: &TaskId, key: &str) {
        if !self.delivery.audit_events {
            return;
        }
        let event = protocol::audit::AuditEvent::task(
            "deduplicated",
            task_id.as_str(),
            protocol::expiry::now_ms(),
            "",
        )
        .details(protocol::audit::Details {
            reason: Some(format!("idempotency key {key}")),
            ..protocol::audit::Details::default()
        });
        actors::audit::emit_one(&self.client, "agent", from.as_str(), event).await;
    }
}

/// The ingress `Nats-Msg-Id` of a task submission: `<from>:task:<task_id>`.
fn task_ingress_msg_id(from: &AgentId, task_id: &TaskId) -> String {
    format!("{from}:task:{task_id}")
}

/// Marks an idempotency entry stored (compare-and-set on `revision`). A failure is harmless:
/// the entry stays pending and the next submission with the key publishes the task again
/// under the same `Nats-Msg-Id`.
async fn mark_stored(entry: &Entry, mut record: IdempotencyRecord, revision: u64) {
    record.state = Submission::Stored;
    let value = serde_json::to_vec(&record).expect("an idempotency record serializes");
    if let Err(e) = entry.update(value, revision).await {
        tracing::warn!(error = %ErrorChain(&e), "cannot mark an idempotency entry stored; a retry publishes its task again");
    }
}

/// A tracked task: the final result arrives once on `result`; status events and waiting
/// results on `events`.
pub struct Tracking {
    /// The final result (completed, failed or cancelled), exactly once.
    pub result: tokio::sync::oneshot::Receiver<protocol::task::TaskResult>,
    /// Status events and non-final results, deduplicated.
    pub events: tokio::sync::mpsc::Receiver<actors::tracker::TrackerEvent>,
}

/// How long a track waits for the trackers' actor to be up (it may be restarting) and to
/// answer, in all.
const TRACKERS_UP: Duration = Duration::from_secs(10);

impl ActorSystem {
    /// The fault-injection key of the tracking of `delegator`'s task `task_id`
    /// ([`actors::tracker::fault_key`]).
    pub fn tracker_name(&self, delegator: &AgentId, task_id: &TaskId) -> String {
        actors::tracker::fault_key(&self.trackers_name(), delegator, task_id)
    }

    /// The name of the actor that tracks every task of this system.
    fn trackers_name(&self) -> String {
        format!("{}/trackers/all", self.id)
    }

    /// Follows the channel of `task_id`, delegated by `delegator`, live and reads its stored
    /// channel from the start (through a router, as `delegator`: an identity reads only the
    /// channels of the tasks it delegated), so a result published while nobody listened is
    /// still found.
    ///
    /// Every task the system tracks is an entry of one trackers actor
    /// ([`actors::tracker::Trackers`]), with one subscription per delegator: a tracked task
    /// costs about 2 kB, no actor or task of its own (docs/CAPACITY.md). That actor is the
    /// one child of a dynamic supervisor, started by the first call: it is restarted with
    /// backoff, at most 5 times within 10 s, and each restart reads every tracked task again
    /// from the start. Given up, it is started again by the next call, and the tasks still
    /// tracked are followed again. A task whose result was delivered, or whose caller dropped
    /// its `result` receiver, is no longer tracked: the system keeps no trace of finished
    /// tasks.
    ///
    /// # Errors
    /// [`SystemError::Spawn`] when the supervisor cannot be started or the task is already
    /// tracked by this system; [`SystemError::Timeout`] when the trackers' actor is not up, or
    /// does not answer, within about 10 s (a call begun just before may take 10 s more).
    pub async fn track(
        &self,
        delegator: &AgentId,
        task_id: &TaskId,
    ) -> Result<Tracking, SystemError> {
        self.start_tracker(delegator, task_id, false).await
    }

    /// Submits `spec` like [`delegate`](Self::delegate) and tracks it like
    /// [`track`](Self::track), subscribing to the task channel *before* submitting. A task
    /// without an idempotency key is new (its id was never submitted), so its first stored
    /// read is skipped: one request less per task. With an idempotency key the task may exist
    /// already; it is then tracked after the submission, reading the stored channel.
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
            let tracking = self.track(from, &receipt.task_id).await?;
            return Ok((receipt, tracking));
        }
        let tracking = self.start_tracker(from, &spec.task_id, true).await?;
        let receipt = self.delegate(from, queue, worker, spec).await?;
        Ok((receipt, tracking))
    }

    /// The number of tasks tracked now.
    pub fn tracked_tasks(&self) -> usize {
        self.tracker_table.len()
    }

    /// The trackers' actor's snapshot, while it runs.
    pub(super) async fn trackers_snapshot(&self) -> Option<actors::tracker::TrackersSnapshot> {
        let actor: ActorRef<actors::tracker::TrackersMsg> =
            ractor::registry::where_is(self.trackers_name())?.into();
        ractor::call_t!(
            actor,
            actors::tracker::TrackersMsg::Snapshot,
            super::SNAPSHOT_TIMEOUT.as_millis() as u64
        )
        .ok()
    }

    async fn start_tracker(
        &self,
        delegator: &AgentId,
        task_id: &TaskId,
        fresh: bool,
    ) -> Result<Tracking, SystemError> {
        use actors::tracker::{Track, TrackError};
        let track = Track {
            delegator: delegator.clone(),
            task_id: task_id.clone(),
            fresh,
        };
        let deadline = tokio::time::Instant::now() + TRACKERS_UP;
        loop {
            // Not up (being restarted), stopping, or its subscription failed: tried again.
            let failure = match self.trackers_actor().await? {
                Some(actor) => match actors::tracker::track(&actor, track.clone()).await {
                    Ok((result, events)) => return Ok(Tracking { result, events }),
                    Err(TrackError::AlreadyTracked(e)) => {
                        return Err(SystemError::spawn(
                            &self.tracker_name(delegator, task_id),
                            e,
                        ))
                    }
                    Err(e) => ErrorChain(&e).to_string(),
                },
                None => "its actor is not up".to_owned(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(SystemError::Timeout {
                    what: format!("the trackers to track {task_id}: {failure}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The trackers' actor: the child of the trackers' supervisor, added by the first call and
    /// again after it was given up; `None` while it is being restarted.
    async fn trackers_actor(
        &self,
    ) -> Result<Option<ActorRef<actors::tracker::TrackersMsg>>, SystemError> {
        use actors::supervision::dynamic::{self, DynamicError};
        use actors::supervision::{ChildSpec, Restart};
        let name = self.trackers_name();
        if ractor::registry::where_is(name.clone()).is_none() {
            let supervisor = self.trackers_supervisor().await?;
            let trackers = actors::tracker::Trackers::new(name.clone(), self.client.clone())
                .with_table(self.tracker_table.clone());
            let child =
                ChildSpec::actor(name.clone(), trackers, || ()).with_restart(Restart::Permanent);
            match dynamic::add_child(&supervisor, child).await {
                // Added, or added by a concurrent call, or waiting for its restart.
                Ok(()) | Err(DynamicError::Duplicate(_)) => {}
                Err(e) => return Err(SystemError::spawn(&name, e)),
            }
        }
        Ok(ractor::registry::where_is(name).map(Into::into))
    }

    /// The trackers' dynamic supervisor, started on first use, and again if it ever stopped.
    async fn trackers_supervisor(&self) -> Result<actors::supervision::DynamicRef, SystemError> {
        super::dynamic_supervisor(&self.trackers, format!("{}/trackers", self.id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_128_random_bits() {
        let ids: std::collections::BTreeSet<String> =
            (0..1000).map(|_| new_task_id().to_string()).collect();
        assert_eq!(ids.len(), 1000, "no repeats");
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                "{id}"
            );
        }
        // Not a clock and a counter: ids made one after the other share no long prefix.
        let (a, b) = (new_task_id().to_string(), new_task_id().to_string());
        assert!(a[..8] != b[..8], "{a} {b}");
    }
}
