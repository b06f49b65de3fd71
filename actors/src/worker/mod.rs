//! The worker role: joins a work queue, fetches one task per free concurrency slot, and runs each admitted task as an [`attempt::Attempt`] actor linked to the
//! [`Worker`] actor (its supervisor).
//!
//! - [`handler`]: the [`TaskHandler`] trait the tasks run through, and its [`Outcome`].
//! - [`exec`]: [`ExecHandler`], a handler that runs a shell command per attempt.
//! - [`attempt`]: the attempt actor and its delivery contract (heartbeat, journal, publish,
//!   ack).
//! - [`compat`]: the compatibility check of the consumers the worker binds.
//!
//! Start-up (`pre_start`): open the journal (a second process on the same journal directory
//! and worker id fails here with [`JournalError::Locked`](crate::journal::JournalError)),
//! send the join request to the router ([`subjects::join_request`]), bind the answer,
//! targeted and queue consumers it names after checking them with [`compat::check_consumer`],
//! subscribe to the control subjects, and start the fetch loop.
//!
//! Fetching: answers have their own waiting pull (they need no slot, so a task backlog never
//! starves them). Tasks: the loop holds a semaphore of `concurrency` slots; it waits for one
//! free slot, takes every other free slot, and pulls exactly that many messages (never more:
//! no prefetch), first from the targeted consumer (no wait), the rest from the queue consumer
//! (a waiting pull of up to [`FETCH_WAIT`] that hands over each task as it arrives). The slot
//! travels with the task and is released when its attempt actor stops or fails.
//!
//! Decisions:
//! - Bad input (undecodable envelope or task) is acked after publishing a failed result when
//!   a task id can be salvaged from the body, so it is never redelivered forever.
//! - A redelivery of the input of a running attempt (same stream sequence) is left alone:
//!   the running attempt acks it.
//! - A *different* input with the task id of a running attempt is an alias: it is acked and
//!   counted, and the running attempt's result serves both.
//! - Answers are routed by task id to the running attempt, which judges them
//!   ([`judge_answer`](protocol::task::judge_answer)). Resumed and duplicate answers are acked
//!   once journalled; stale or unknown ones are acked, logged and counted (no notice is sent
//!   back). An answer for an attempt that the journal knows but no actor runs (it is waiting
//!   to be redelivered after a crash) is nak'd with a delay so it comes back.

pub mod attempt;
pub mod compat;
pub mod exec;
pub mod handler;
pub mod publish;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, Consumer};
use async_nats::jetstream::{self, AckKind};
use async_nats::Client;
use futures::StreamExt;
use protocol::subjects::{self, ControlKind};
use protocol::task::{
    decode_task, result_msg_id, Answer, AnswerVerdict, ControlRequest, JoinReply, JoinRequest,
    JoinResponse, QueryReply, TaskChannelBody, TaskResult, TaskState,
};
use protocol::{QueueName, TaskId, WireError, WorkerId};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::fault::{self, FaultPoint};
use crate::journal::Journal;
use crate::pump_task::spawn_pump;
pub use attempt::{AbortOnDrop, Attempt, AttemptArgs, AttemptMsg, SavedResult};
pub use exec::ExecHandler;
pub use handler::{AttemptContext, Outcome, TaskHandler};

/// Default number of attempts run at once.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Largest accepted concurrency.
pub const MAX_CONCURRENCY: usize = 1024;
/// Default consumer ack wait assumed for heartbeats (the router's default).
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// Default join request timeout.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a journal locked by this same process is retried at start-up.
pub const JOURNAL_LOCK_RETRY: Duration = Duration::from_secs(1);
/// How long the worker waits for an attempt to take an answer or a control request.
pub const ATTEMPT_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// The nak delay of an answer whose attempt is not running yet.
pub const ANSWER_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Worker configuration (cloned into every incarnation).
#[derive(Clone)]
pub struct Worker {
    /// Actor name, also the fault-injection key; attempts are named
    /// `<name>.attempt.<task id>`.
    pub name: String,
    /// The connection.
    pub client: Client,
    /// This worker's identity.
    pub worker_id: WorkerId,
    /// The queue it joins.
    pub queue: QueueName,
    /// Attempts run at once (1..=[`MAX_CONCURRENCY`]).
    pub concurrency: usize,
    /// The journal root (the journal is `<journal_dir>/<worker_id>/`).
    pub journal_dir: PathBuf,
    /// Runs the tasks.
    pub handler: Arc<dyn TaskHandler>,
    /// The consumers' ack wait (heartbeats are sent every third of it).
    pub ack_wait: Duration,
    /// How long to wait for the router's join reply.
    pub join_timeout: Duration,
    /// The journal is compacted once this many attempts were forgotten since the last
    /// compaction (default [`attempt::COMPACT_AFTER`]).
    pub compact_after: usize,
}

impl Worker {
    /// A worker with the default concurrency, ack wait and join timeout.
    pub fn new(
        name: impl Into<String>,
        client: Client,
        worker_id: WorkerId,
        queue: QueueName,
        journal_dir: PathBuf,
        handler: Arc<dyn TaskHandler>,
    ) -> Worker {
        Worker {
            name: name.into(),
            client,
            worker_id,
            queue,
            concurrency: DEFAULT_CONCURRENCY,
            journal_dir,
            handler,
            ack_wait: DEFAULT_ACK_WAIT,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            compact_after: attempt::COMPACT_AFTER,
        }
    }
}

/// Counters shared by the worker and its attempts.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Attempts started (including re-runs and republishes).
    pub admitted: AtomicU64,
    /// Attempts finished completed.
    pub completed: AtomicU64,
    /// Attempts finished failed.
    pub failed: AtomicU64,
    /// Attempts finished cancelled.
    pub cancelled: AtomicU64,
    /// Inputs refused as undecodable (acked).
    pub bad_input: AtomicU64,
    /// Inputs admitted that the journal already knew (redeliveries).
    pub redelivered: AtomicU64,
    /// Progress acks sent.
    pub heartbeats: AtomicU64,
    /// Inputs acked as aliases of a running attempt's task id.
    pub aliased: AtomicU64,
    /// Attempt actors that failed (their input is redelivered).
    pub attempt_failures: AtomicU64,
    /// Answers that resumed an attempt (or were duplicates).
    pub answers: AtomicU64,
    /// Answers refused (stale, unknown, undecodable).
    pub answers_refused: AtomicU64,
    /// Journal compactions done while running.
    pub compactions: AtomicU64,
    /// Tasks not run because their `expires_at` had passed (failed, kind `expired`).
    pub expired: AtomicU64,
    /// Inputs the broker delivered again while their attempt was running here (its heartbeat
    /// did not keep the ack wait from expiring); the copy is left to the running attempt.
    pub redelivered_while_running: AtomicU64,
}

/// A copy of the [`WorkerCounters`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCountersSnapshot {
    /// See [`WorkerCounters::admitted`].
    pub admitted: u64,
    /// See [`WorkerCounters::completed`].
    pub completed: u64,
    /// See [`WorkerCounters::failed`].
    pub failed: u64,
    /// See [`WorkerCounters::cancelled`].
    pub cancelled: u64,
    /// See [`WorkerCounters::bad_input`].
    pub bad_input: u64,
    /// See [`WorkerCounters::redelivered`].
    pub redelivered: u64,
    /// See [`WorkerCounters::heartbeats`].
    pub heartbeats: u64,
    /// See [`WorkerCounters::aliased`].
    pub aliased: u64,
    /// See [`WorkerCounters::attempt_failures`].
    pub attempt_failures: u64,
    /// See [`WorkerCounters::answers`].
    pub answers: u64,
    /// See [`WorkerCounters::answers_refused`].
    pub answers_refused: u64,
    /// See [`WorkerCounters::compactions`].
    #[serde(default)]
    pub compactions: u64,
    /// See [`WorkerCounters::expired`].
    #[serde(default)]
    pub expired: u64,
    /// See [`WorkerCounters::redelivered_while_running`].
    #[serde(default)]
    pub redelivered_while_running: u64,
}

impl WorkerCounters {
    /// A copy of the counters.
    pub fn snapshot(&self) -> WorkerCountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerCountersSnapshot {
            admitted: get(&self.admitted),
            completed: get(&self.completed),
            failed: get(&self.failed),
            cancelled: get(&self.cancelled),
            bad_input: get(&self.bad_input),
            redelivered: get(&self.redelivered),
            heartbeats: get(&self.heartbeats),
            aliased: get(&self.aliased),
            attempt_failures: get(&self.attempt_failures),
            answers: get(&self.answers),
            answers_refused: get(&self.answers_refused),
            compactions: get(&self.compactions),
            expired: get(&self.expired),
            redelivered_while_running: get(&self.redelivered_while_running),
        }
    }
}

/// A snapshot of a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    /// The actor's name.
    pub name: String,
    /// The worker's identity.
    pub worker_id: String,
    /// Its queue.
    pub queue: String,
    /// Its concurrency.
    pub concurrency: usize,
    /// Attempts running now (including waiting ones).
    pub running: usize,
    /// Counters of this incarnation.
    pub counters: WorkerCountersSnapshot,
    /// Milliseconds since this incarnation started.
    pub uptime_ms: u64,
}

/// Worker messages.
pub enum WorkerMsg {
    /// A task input fetched with a concurrency slot.
    Task {
        /// The input.
        msg: jetstream::Message,
        /// The slot, released when the input's attempt ends.
        permit: OwnedSemaphorePermit,
    },
    /// An answer input.
    Answer(jetstream::Message),
    /// A control request (core request/reply).
    Control {
        /// Query or cancel.
        kind: ControlKind,
        /// The request.
        msg: async_nats::Message,
    },
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<WorkerSnapshot>),
    /// Snapshot for a remote caller (`runtime status`): published to this reply subject.
    StatusRequest(async_nats::Subject),
    /// The fetch loop or a subscription failed: fail so that the supervisor restarts.
    PumpFailed(String),
}

struct Running {
    actor: ActorRef<AttemptMsg>,
    task_id: TaskId,
    seq: u64,
}

/// Mutable state of one incarnation.
pub struct WorkerState {
    journal: Arc<Mutex<Journal>>,
    _join: JoinReply,
    fetch: Option<AbortOnDrop>,
    control: Vec<AbortOnDrop>,
    stop: watch::Sender<bool>,
    running: HashMap<ActorId, Running>,
    by_task: HashMap<TaskId, ActorId>,
    counters: Arc<WorkerCounters>,
    started: Instant,
}

/// Worker failures.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The configuration is invalid.
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// The journal could not be opened (e.g. locked by another process).
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The join request failed or was refused.
    #[error("join of queue {queue} failed: {reason}")]
    Join {
        /// The queue.
        queue: String,
        /// Why.
        reason: String,
    },
    /// A consumer could not be bound.
    #[error("consumer {consumer}: {reason}")]
    Consumer {
        /// Its name.
        consumer: String,
        /// Why.
        reason: String,
    },
    /// A consumer has settings the worker refuses.
    #[error("consumer {consumer}: {source}")]
    Incompatible {
        /// Its name.
        consumer: String,
        /// The refused setting.
        #[source]
        source: compat::IncompatibleConsumer,
    },
    /// A control subscription could not be made.
    #[error("cannot subscribe to {subject}: {reason}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// Why.
        reason: String,
    },
    /// The fetch loop failed.
    #[error("worker fetch loop failed: {0}")]
    Pump(String),
}

#[ractor::async_trait]
impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<WorkerMsg>,
        _: (),
    ) -> Result<WorkerState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        if !(1..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(WorkerError::Config(format!(
                "concurrency {} is outside 1..={MAX_CONCURRENCY}",
                self.concurrency
            ))
            .into());
        }
        let journal = Arc::new(Mutex::new(self.open_journal().await?));
        let join = self.join().await?;
        let js = jetstream::new(self.client.clone());
        let answers = bind(
            &js,
            &join.answers_stream,
            &join.answer_consumer,
            &subjects::answer(&self.worker_id),
        )
        .await?;
        let targeted = bind(
            &js,
            &join.work_stream,
            &join.targeted_consumer,
            &subjects::targeted_filter(&self.worker_id),
        )
        .await?;
        let queue = bind(
            &js,
            &join.work_stream,
            &join.queue_consumer,
            &subjects::work(&self.queue, None),
        )
        .await?;
        let mut control = Vec::new();
        for kind in ControlKind::ALL {
            let subject = subjects::control(&self.worker_id, kind);
            let mut sub = self.client.subscribe(subject.clone()).await.map_err(|e| {
                WorkerError::Subscribe {
                    subject: subject.clone(),
                    reason: e.to_string(),
                }
            })?;
            let me = myself.clone();
            control.push(AbortOnDrop(tokio::spawn(async move {
                while let Some(msg) = sub.next().await {
                    if me.cast(WorkerMsg::Control { kind, msg }).is_err() {
                        break;
                    }
                }
            })));
        }
        // Every worker answers the scatter-gather status request of `runtime status`.
        let mut status = self
            .client
            .subscribe(subjects::WORKER_STATUS_SUBJECT)
            .await
            .map_err(|e| WorkerError::Subscribe {
                subject: subjects::WORKER_STATUS_SUBJECT.into(),
                reason: e.to_string(),
            })?;
        let me = myself.clone();
        control.push(AbortOnDrop(tokio::spawn(async move {
            while let Some(msg) = status.next().await {
                if let Some(reply) = msg.reply {
                    if me.cast(WorkerMsg::StatusRequest(reply)).is_err() {
                        break;
                    }
                }
            }
        })));
        let (stop, stop_rx) = watch::channel(false);
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let me = myself.clone();
        let fetch = spawn_pump(
            fetch_loop(myself.clone(), answers, targeted, queue, slots, stop_rx),
            move |e| {
                let _ = me.cast(WorkerMsg::PumpFailed(e));
            },
        );
        tracing::info!(name = %self.name, worker = %self.worker_id, queue = %self.queue, "worker started");
        Ok(WorkerState {
            journal,
            _join: join,
            fetch: Some(AbortOnDrop(fetch)),
            control,
            stop,
            running: HashMap::new(),
            by_task: HashMap::new(),
            counters: Arc::new(WorkerCounters::default()),
            started: Instant::now(),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<WorkerMsg>,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop.send(true);
        state.fetch = None;
        state.control.clear();
        // Attempts stop without acking: their inputs are redelivered after ack_wait.
        for (_, running) in state.running.drain() {
            let _ = running
                .actor
                .stop_and_wait(Some("worker stopping".into()), Some(Duration::from_secs(5)))
                .await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            WorkerMsg::Task { msg, permit } => self.on_task(&myself, state, msg, permit).await,
            WorkerMsg::Answer(msg) => self.on_answer(state, msg).await,
            WorkerMsg::Control { kind, msg } => self.on_control(state, kind, msg).await,
            WorkerMsg::Snapshot(port) => {
                let _ = port.send(self.snapshot(state));
            }
            WorkerMsg::StatusRequest(reply) => {
                let body = serde_json::to_value(self.snapshot(state))?;
                if let Err(e) = publish_json(&self.client, reply, &body).await {
                    tracing::debug!(error = %e, "status reply not sent");
                }
            }
            WorkerMsg::PumpFailed(reason) => return Err(WorkerError::Pump(reason).into()),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<WorkerMsg>,
        event: SupervisionEvent,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failure) = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, None),
            SupervisionEvent::ActorFailed(cell, err) => (cell, Some(err)),
            _ => return Ok(()),
        };
        if let Some(running) = state.running.remove(&cell.get_id()) {
            state.by_task.remove(&running.task_id);
            if let Some(err) = failure {
                state
                    .counters
                    .attempt_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    task_id = %running.task_id,
                    input_seq = running.seq,
                    error = %err,
                    "attempt failed; its input will be redelivered"
                );
            }
        }
        Ok(())
    }
}

impl Worker {
    /// Opens the journal. A lock held by this very process is retried for up to
    /// [`JOURNAL_LOCK_RETRY`]: the attempts of a previous incarnation of this worker (killed
    /// with it) may still be dropping their handle when a supervisor restarts the worker.
    async fn open_journal(&self) -> Result<Journal, WorkerError> {
        let deadline = Instant::now() + JOURNAL_LOCK_RETRY;
        loop {
            let (dir, id) = (self.journal_dir.clone(), self.worker_id.to_string());
            let opened = tokio::task::spawn_blocking(move || Journal::open(&dir, &id))
                .await
                .map_err(|e| WorkerError::Config(format!("journal open panicked: {e}")))?;
            match opened {
                Err(crate::journal::JournalError::Locked {
                    holder: Some(pid), ..
                }) if pid == std::process::id() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return Ok(other?),
            }
        }
    }

    async fn join(&self) -> Result<JoinReply, WorkerError> {
        let fail = |reason: String| WorkerError::Join {
            queue: self.queue.to_string(),
            reason,
        };
        let body = serde_json::to_vec(&JoinRequest {
            worker_id: self.worker_id.clone(),
        })
        .map_err(|e| fail(e.to_string()))?;
        let request = self
            .client
            .request(subjects::join_request(&self.queue), body.into());
        let reply = match tokio::time::timeout(self.join_timeout, request).await {
            Err(_) => return Err(fail(format!("no reply within {:?}", self.join_timeout))),
            Ok(Err(e)) => {
                return Err(fail(match e.kind() {
                    async_nats::RequestErrorKind::NoResponders => {
                        "no responders (is a durable router running?)".into()
                    }
                    _ => e.to_string(),
                }))
            }
            Ok(Ok(reply)) => reply,
        };
        match serde_json::from_slice::<JoinResponse>(&reply.payload) {
            Ok(JoinResponse::Joined(join)) => Ok(join),
            Ok(JoinResponse::Refused { error }) => Err(fail(format!(
                "refused: {}: {}",
                error.kind.as_str(),
                error.detail
            ))),
            Err(e) => Err(fail(format!("unreadable join reply: {e}"))),
        }
    }

    fn snapshot(&self, state: &WorkerState) -> WorkerSnapshot {
        WorkerSnapshot {
            name: self.name.clone(),
            worker_id: self.worker_id.to_string(),
            queue: self.queue.to_string(),
            concurrency: self.concurrency,
            running: state.running.len(),
            counters: state.counters.snapshot(),
            uptime_ms: state.started.elapsed().as_millis() as u64,
        }
    }

    async fn on_task(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        msg: jetstream::Message,
        permit: OwnedSemaphorePermit,
    ) {
        let Ok(seq) = msg.info().map(|i| i.stream_sequence) else {
            tracing::warn!(subject = %msg.subject, "task message without JetStream info; dropped");
            return;
        };
        let task = match decode_input(&msg) {
            Ok(task) => task,
            Err((task_id, error)) => {
                self.refuse_input(state, &msg, seq, task_id, error).await;
                return;
            }
        };
        if state.running.values().any(|r| r.seq == seq) {
            // The running attempt heartbeats and acks this input itself.
            state
                .counters
                .redelivered_while_running
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                input_seq = seq,
                "redelivery of a running attempt's input (a heartbeat came too late)"
            );
            return;
        }
        if state.by_task.contains_key(&task.task_id) {
            state.counters.aliased.fetch_add(1, Ordering::Relaxed);
            tracing::info!(task_id = %task.task_id, input_seq = seq, "task id already running: input acked as an alias");
            if let Err(e) = msg.double_ack().await {
                tracing::warn!(error = %e, "cannot ack an aliased input");
            }
            return;
        }
        let attempt = Attempt {
            name: format!("{}.attempt.{}", self.name, task.task_id),
            client: self.client.clone(),
            worker_id: self.worker_id.clone(),
            journal: state.journal.clone(),
            handler: self.handler.clone(),
            ack_wait: self.ack_wait,
            compact_after: self.compact_after,
            counters: state.counters.clone(),
        };
        let task_id = task.task_id.clone();
        let name = attempt.name.clone();
        match Actor::spawn_linked(
            Some(name),
            attempt,
            AttemptArgs {
                msg,
                seq,
                task,
                slot: Some(permit),
            },
            myself.get_cell(),
        )
        .await
        {
            Ok((actor, _)) => {
                state.counters.admitted.fetch_add(1, Ordering::Relaxed);
                let id = actor.get_id();
                state.by_task.insert(task_id.clone(), id);
                state.running.insert(
                    id,
                    Running {
                        actor,
                        task_id,
                        seq,
                    },
                );
            }
            Err(e) => {
                state
                    .counters
                    .attempt_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%task_id, input_seq = seq, error = %e, "attempt did not start; input left for redelivery");
            }
        }
    }

    /// Publishes a failed result for bad input when a task id can be salvaged, then acks it.
    async fn refuse_input(
        &self,
        state: &WorkerState,
        msg: &jetstream::Message,
        seq: u64,
        task_id: Option<TaskId>,
        error: WireError,
    ) {
        state.counters.bad_input.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(input_seq = seq, kind = error.kind.as_str(), detail = %error.detail, "bad task input refused");
        if let Some(task_id) = task_id {
            let attempt_id = attempt::fresh_attempt_id();
            let result = TaskResult {
                task_id: task_id.clone(),
                attempt_id: attempt_id.clone(),
                worker_id: self.worker_id.clone(),
                state: TaskState::Failed,
                response: None,
                error: Some(error),
                suspend: None,
                answer_route: None,
            };
            if let Err(e) = publish::publish_task_channel(
                &self.client,
                &self.worker_id,
                &task_id,
                &result_msg_id(&task_id, &attempt_id, 1),
                &TaskChannelBody::Result(result),
                None,
            )
            .await
            {
                tracing::warn!(error = %e, "cannot publish the refusal of bad input");
            }
        }
        if let Err(e) = msg.double_ack().await {
            tracing::warn!(error = %e, "cannot ack bad input");
        }
    }

    async fn on_answer(&self, state: &WorkerState, msg: jetstream::Message) {
        let answer = protocol::decode(&msg.payload, codec_of(&msg))
            .map_err(|e| e.to_string())
            .and_then(|env| serde_json::from_value::<Answer>(env.body).map_err(|e| e.to_string()));
        let answer = match answer {
            Ok(answer) => answer,
            Err(reason) => {
                state
                    .counters
                    .answers_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%reason, "undecodable answer acked and dropped");
                let _ = msg.ack().await;
                return;
            }
        };
        let running = state
            .by_task
            .get(&answer.task_id)
            .and_then(|id| state.running.get(id))
            .map(|r| r.actor.clone());
        let Some(actor) = running else {
            let task_id = answer.task_id.to_string();
            let journal = state.journal.clone();
            let known = tokio::task::spawn_blocking(move || {
                let journal = journal.lock().unwrap_or_else(|e| e.into_inner());
                journal.lookup_by_task(&task_id).is_some()
            })
            .await
            .unwrap_or(false);
            if known {
                // The attempt is journalled but not running yet (redelivery pending).
                let _ = msg.ack_with(AckKind::Nak(Some(ANSWER_RETRY_DELAY))).await;
            } else {
                state
                    .counters
                    .answers_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(task_id = %answer.task_id, "answer for an unknown task attempt acked and dropped");
                let _ = msg.ack().await;
            }
            return;
        };
        let counters = state.counters.clone();
        tokio::spawn(async move {
            let verdict = actor
                .call(
                    |reply| AttemptMsg::Answer(answer, reply),
                    Some(ATTEMPT_CALL_TIMEOUT),
                )
                .await;
            match verdict {
                Ok(ractor::rpc::CallResult::Success(verdict)) => {
                    if matches!(verdict, AnswerVerdict::Resume | AnswerVerdict::Duplicate) {
                        counters.answers.fetch_add(1, Ordering::Relaxed);
                    } else {
                        counters.answers_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(?verdict, "answer refused");
                    }
                    let _ = msg.ack().await;
                }
                _ => {
                    // The attempt went away or is busy: try again later.
                    let _ = msg.ack_with(AckKind::Nak(Some(ANSWER_RETRY_DELAY))).await;
                }
            }
        });
    }

    async fn on_control(&self, state: &WorkerState, kind: ControlKind, msg: async_nats::Message) {
        let Some(reply) = msg.reply.clone() else {
            return;
        };
        let client = self.client.clone();
        let request = match serde_json::from_slice::<ControlRequest>(&msg.payload) {
            Ok(request) => request,
            Err(e) => {
                let error = WireError::new(protocol::WireErrorKind::Malformed, e.to_string());
                let _ = publish_json(&client, reply, &serde_json::json!({ "error": error })).await;
                return;
            }
        };
        let running = state
            .by_task
            .get(&request.task_id)
            .and_then(|id| state.running.get(id))
            .map(|r| r.actor.clone())
            .filter(|_| request.worker_id == self.worker_id);
        let unknown = || serde_json::json!({ "error": AnswerVerdict::UnknownAttempt.error() });
        let Some(actor) = running else {
            // Not running here: answer from the journal (interrupted work), else unknown.
            let journal = state.journal.clone();
            let (task_id, attempt_id) = (request.task_id.to_string(), request.attempt_id.clone());
            let saved = tokio::task::spawn_blocking(move || {
                let journal = journal.lock().unwrap_or_else(|e| e.into_inner());
                journal
                    .lookup_by_task(&task_id)
                    .filter(|r| r.attempt_id == attempt_id.as_str())
                    .map(|r| r.result.clone())
            })
            .await
            .ok()
            .flatten();
            let body = match saved.filter(|_| request.worker_id == self.worker_id) {
                Some(result) => {
                    let saved: Option<SavedResult> =
                        result.and_then(|v| serde_json::from_value(v).ok());
                    let state = saved
                        .as_ref()
                        .map_or(TaskState::Running, |s| s.result.state);
                    let reply = QueryReply {
                        state,
                        active: false,
                        suspend: saved.and_then(|s| s.result.suspend),
                        cancel: (kind == ControlKind::Cancel)
                            .then(|| protocol::task::cancel_status(state, true)),
                    };
                    serde_json::to_value(reply).unwrap_or_else(|_| unknown())
                }
                None => unknown(),
            };
            let _ = publish_json(&client, reply, &body).await;
            return;
        };
        tokio::spawn(async move {
            let body = match kind {
                ControlKind::Query => actor
                    .call(
                        |port| AttemptMsg::Query(request, port),
                        Some(ATTEMPT_CALL_TIMEOUT),
                    )
                    .await
                    .ok()
                    .and_then(|r| match r {
                        ractor::rpc::CallResult::Success(r) => Some(r),
                        _ => None,
                    })
                    .map(|r| match r {
                        Ok(reply) => serde_json::to_value(reply).ok(),
                        Err(error) => Some(serde_json::json!({ "error": error })),
                    }),
                ControlKind::Cancel => actor
                    .call(
                        |port| AttemptMsg::Cancel(request, port),
                        Some(ATTEMPT_CALL_TIMEOUT),
                    )
                    .await
                    .ok()
                    .and_then(|r| match r {
                        ractor::rpc::CallResult::Success(r) => serde_json::to_value(r).ok(),
                        _ => None,
                    })
                    .map(Some),
            }
            .flatten()
            .unwrap_or_else(|| {
                serde_json::json!({ "error": WireError::new(protocol::WireErrorKind::Internal, "the attempt did not answer") })
            });
            let _ = publish_json(&client, reply, &body).await;
        });
    }
}

async fn publish_json(
    client: &Client,
    subject: async_nats::Subject,
    body: &serde_json::Value,
) -> Result<(), String> {
    let payload = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    client
        .publish(subject, payload.into())
        .await
        .map_err(|e| e.to_string())
}

fn codec_of(msg: &jetstream::Message) -> protocol::Codec {
    let content_type = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(protocol::headers::CONTENT_TYPE))
        .map(|v| v.as_str().to_owned());
    protocol::Codec::from_content_type(content_type.as_deref()).unwrap_or(protocol::Codec::Json)
}

/// Decodes a task input; on failure returns the salvageable task id and the error.
fn decode_input(
    msg: &jetstream::Message,
) -> Result<protocol::task::TaskSpec, (Option<TaskId>, WireError)> {
    let env = protocol::decode(&msg.payload, codec_of(msg)).map_err(|e| {
        (
            None,
            WireError::new(protocol::WireErrorKind::Malformed, e.to_string()),
        )
    })?;
    decode_task(&env.body).map_err(|e| {
        let task_id = env
            .body
            .get("task_id")
            .and_then(|v| v.as_str())
            .and_then(|s| TaskId::new(s).ok());
        (task_id, e.to_wire())
    })
}

/// Looks a consumer up, checks its configuration, and binds it as a pull consumer.
async fn bind(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    filter: &str,
) -> Result<Consumer<pull::Config>, WorkerError> {
    let fail = |reason: String| WorkerError::Consumer {
        consumer: name.to_owned(),
        reason,
    };
    let stream = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(format!("stream {stream}: {e}")))?;
    let info = stream
        .consumer_info(name)
        .await
        .map_err(|e| fail(e.to_string()))?;
    compat::check_consumer(&info.config, filter).map_err(|source| WorkerError::Incompatible {
        consumer: name.to_owned(),
        source,
    })?;
    stream
        .get_consumer::<pull::Config>(name)
        .await
        .map_err(|e| fail(e.to_string()))
}

/// How long a waiting pull on the queue (or answers) consumer stays open when nothing comes.
pub const FETCH_WAIT: Duration = Duration::from_millis(500);

/// The fetch loop: answers on their own (they need no slot), tasks one per free slot.
async fn fetch_loop(
    me: ActorRef<WorkerMsg>,
    answers: Consumer<pull::Config>,
    targeted: Consumer<pull::Config>,
    queue: Consumer<pull::Config>,
    slots: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let answer_side = answer_loop(me.clone(), answers, stop.clone());
    let task_side = task_loop(me, targeted, queue, slots, stop);
    tokio::try_join!(answer_side, task_side).map(|_| ())
}

/// Answers are fetched by their own waiting pull, so a backlog of tasks never delays them.
async fn answer_loop(
    me: ActorRef<WorkerMsg>,
    answers: Consumer<pull::Config>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        let mut batch = answers
            .batch()
            .max_messages(16)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(|e| WorkerError::Pump(e.to_string()))?;
        loop {
            let next = tokio::select! {
                _ = stop.changed() => return Ok(()),
                next = batch.next() => next,
            };
            match next {
                Some(Ok(msg)) => {
                    if me.cast(WorkerMsg::Answer(msg)).is_err() {
                        return Ok(());
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "answer fetch error; pulling again");
                    break;
                }
                None => break,
            }
        }
    }
}

/// Tasks: wait for a free slot, take every other free slot, then pull exactly that many
/// messages: first from the targeted consumer (no wait), the rest from the queue consumer (a
/// waiting pull that hands over each task as it arrives). Never more than the free slots: no
/// prefetch.
async fn task_loop(
    me: ActorRef<WorkerMsg>,
    targeted: Consumer<pull::Config>,
    queue: Consumer<pull::Config>,
    slots: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let pump = |e: &dyn std::fmt::Display| WorkerError::Pump(e.to_string());
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        let first = tokio::select! {
            _ = stop.changed() => return Ok(()),
            permit = slots.clone().acquire_owned() => permit.map_err(|e| pump(&e))?,
        };
        let mut permits = vec![first];
        while let Ok(permit) = slots.clone().try_acquire_owned() {
            permits.push(permit);
        }
        let mut targeted_batch = targeted
            .fetch()
            .max_messages(permits.len())
            .messages()
            .await
            .map_err(|e| pump(&e))?;
        while let Some(next) = targeted_batch.next().await {
            match next {
                Ok(msg) => {
                    let permit = permits.pop().expect("at most one message per permit");
                    if me.cast(WorkerMsg::Task { msg, permit }).is_err() {
                        return Ok(());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "targeted fetch error"),
            }
        }
        if permits.is_empty() {
            continue;
        }
        let mut queue_batch = queue
            .batch()
            .max_messages(permits.len())
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(|e| pump(&e))?;
        loop {
            let next = tokio::select! {
                _ = stop.changed() => return Ok(()),
                next = queue_batch.next() => next,
            };
            match next {
                Some(Ok(msg)) => {
                    let permit = permits.pop().expect("at most one message per permit");
                    if me.cast(WorkerMsg::Task { msg, permit }).is_err() {
                        return Ok(());
                    }
                    if permits.is_empty() {
                        break;
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "queue fetch error; pulling again");
                    break;
                }
                None => break,
            }
        }
    }
}
