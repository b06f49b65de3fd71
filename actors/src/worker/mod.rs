//! The worker role: joins a work queue, fetches one task per free concurrency slot, and runs
//! each admitted task as an attempt actor linked to the [`Worker`] actor (its supervisor).
//!
//! - [`handler`]: the [`TaskHandler`] trait the tasks run through, and its [`Outcome`].
//! - [`exec`]: [`ExecHandler`], a handler that runs a shell command per attempt.
//! - `attempt`: the attempt actor and its delivery contract (heartbeat, journal, task channel
//!   check, publish, ack).
//! - `startup`: journal, join and binding (again after a consumer is found gone); `sweep`:
//!   the start-up sweep of the journal's open attempts; `intake`: admission of a task input.
//! - `fetch`: the fetch loops; `slots`: the concurrency slots; `running`: the running
//!   attempts; `control`: answers, query and cancel; `compat`: the consumer checks.
//!
//! Start-up (`pre_start`): open the journal (a second process on the same journal directory
//! and worker id fails here with [`JournalError::Locked`](crate::journal::JournalError)),
//! send the join request to the router ([`subjects::join_request`]), bind the answer,
//! targeted and queue consumers it names after checking them, subscribe to the control
//! subjects, and start the fetch loops. The heartbeat of an attempt runs at a third of the ack
//! wait *of the consumer its input came from*, read from that consumer.
//!
//! Decisions:
//! - Bad input (undecodable envelope or task): when a task id can be salvaged from the body, a
//!   failed result is published first and the input is acked only once it is confirmed (else
//!   nak'd with a delay); without one it is terminated. It is never redelivered forever.
//! - A redelivery of the input of a running attempt (same stream sequence) is left alone: the
//!   running attempt acks it.
//! - A *different* input with the task id of a running attempt is an alias: it is acked and
//!   counted, and the running attempt's result serves both.
//! - A waiting result completes its input's delivery: the attempt is parked in the journal,
//!   its input acked and its slot freed. Answers are handled in `control` (see there).
//! - A consumer found gone (deleted, or its stream recreated) makes the worker re-join its
//!   queue through the router, in the background, while its running attempts go on.
//! - A graceful stop: [`WorkerMsg::Drain`] first (no more fetches; what was fetched and not
//!   started is handed back), then the actor's stop: running attempts get
//!   [`Worker::shutdown_grace`] to finish and publish; the rest have their handlers cancelled
//!   and, once those ended (bounded), hand their inputs back (nak without delay, so another
//!   worker takes them at once).

mod ack_waits;
mod attempt;
mod compat;
mod control;
mod counters;
mod error;
mod exec;
mod fetch;
pub mod handler;
mod intake;
mod publish;
mod running;
mod slots;
mod startup;
mod sweep;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::Client;
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::subjects::{self, ControlKind};
use protocol::{QueueName, WorkerId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, OwnedSemaphorePermit};

use ack_waits::{AckWait, AckWaits};
pub use attempt::SavedResult;
use attempt::{AttemptMsg, Streams};
pub use compat::{IncompatibleConsumer, MIN_ACK_WAIT};
pub use counters::{WorkerCounters, WorkerCountersSnapshot};
pub use error::{JoinError, WorkerError};
pub use exec::{ExecHandler, RunAs, RunAsError};
pub use fetch::FETCH_WAIT;
use fetch::{FetchError, Fetcher};
pub use handler::{AttemptContext, Outcome, TaskHandler};
use intake::decode_envelope;
use running::RunningSet;
use slots::Slots;
use startup::Bound;

use crate::background::Owned;
use crate::epoch::{Baseline, WorkMark, WORK_MARK_AGE};
use crate::fault::{self, FaultPoint};
use crate::journal::Journal;

/// Default number of attempts run at once.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Largest accepted concurrency.
pub const MAX_CONCURRENCY: usize = 1024;
/// Default join request timeout: the router's own budget for the JetStream calls a join makes
/// ([`crate::streams::STREAM_API_TIMEOUT`]) and 5 s more, so a join a busy cluster is slow to
/// serve is answered (joined, or refused with why) rather than abandoned and sent again while
/// the router still works on the first.
pub const DEFAULT_JOIN_TIMEOUT: Duration =
    Duration::from_secs(crate::streams::STREAM_API_TIMEOUT.as_secs() + 5);
/// Default grace of a graceful stop (the CLI's `--shutdown-grace-secs`).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a journal locked by this same process is retried at start-up.
pub const JOURNAL_LOCK_RETRY: Duration = Duration::from_secs(1);
/// How long the worker waits for an attempt to judge an answer or answer a control request.
pub const ATTEMPT_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// The nak delay of an input (or answer) whose refusal could not be published.
pub const REFUSAL_RETRY_DELAY: Duration = Duration::from_secs(1);
/// The most a graceful stop keeps of its grace to hand back what did not finish.
const HAND_BACK_MARGIN: Duration = Duration::from_secs(2);

/// Worker configuration (cloned into every incarnation).
#[derive(Clone)]
pub struct Worker {
    /// Actor name, also the fault-injection key; attempts are named
    /// `<name>.attempt.<delegator>.<task id>`.
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
    /// How long to wait for the router's join reply.
    pub join_timeout: Duration,
    /// The journal is compacted once this many attempts were forgotten since the last
    /// compaction (default `COMPACT_AFTER`, 4,096).
    pub compact_after: usize,
    /// How long a graceful stop lets running attempts finish (minus up to 2 s kept to hand
    /// back what did not).
    pub shutdown_grace: Duration,
    /// The root of the reply subjects control and status requests may be answered on
    /// (default [`subjects::DEFAULT_REPLY_PREFIX`], `_INBOX`): the requesters' connections'
    /// inbox prefix. A request aimed elsewhere is counted (`replies_refused`) and ignored.
    pub reply_prefix: String,
    /// Whether it emits audit events (`fetched`) on `hub.audit.worker.<id>` (default true,
    /// the delivery config's `audit_events`).
    pub audit_events: bool,
}

impl Worker {
    /// A worker with the default concurrency, join timeout and shutdown grace.
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
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            compact_after: attempt::COMPACT_AFTER,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            reply_prefix: subjects::DEFAULT_REPLY_PREFIX.to_owned(),
            audit_events: true,
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
    /// Attempts running now (handlers, publishes, resumes).
    pub running: usize,
    /// Attempts parked waiting for an answer (inputs acked, kept in the journal).
    #[serde(default)]
    pub parked: usize,
    /// Whether its consumers are bound (false while it re-joins its queue).
    #[serde(default = "yes")]
    pub bound: bool,
    /// Counters of this incarnation.
    pub counters: WorkerCountersSnapshot,
    /// Milliseconds since this incarnation started.
    pub uptime_ms: u64,
}

fn yes() -> bool {
    true
}

/// Worker messages.
pub enum WorkerMsg {
    /// A task input fetched with a concurrency slot.
    Task {
        /// The input.
        msg: jetstream::Message,
        /// The current ack wait of the consumer it came from (its heartbeat runs at a third).
        ack_wait: AckWait,
        /// The slot, released when the input's attempt acks it (or ends).
        permit: OwnedSemaphorePermit,
    },
    /// An answer input.
    Answer {
        /// The answer.
        msg: jetstream::Message,
        /// The current ack wait of the answer consumer.
        ack_wait: AckWait,
    },
    /// A control request (core request/reply).
    Control {
        /// Query or cancel.
        kind: ControlKind,
        /// The request.
        msg: async_nats::Message,
    },
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<WorkerSnapshot>),
    /// Snapshot for a remote caller (`runtime status`): published to this request's reply.
    StatusRequest(async_nats::Message),
    /// A router changed the queue's shared consumer: read its ack wait again.
    QueueChanged,
    /// A consumer was found gone: re-join the queue.
    ConsumersLost(String),
    /// The re-join bound these consumers.
    Rejoined(Box<Bound>),
    /// The fetch loop or a subscription failed: fail so that the supervisor restarts.
    PumpFailed(crate::background::PumpFailure),
    /// A finding of the start-up sweep of the journal (see `sweep`).
    Swept(sweep::Found),
    /// The first step of a graceful stop: fetch no more input, hand back what was fetched
    /// and not started (nak, no delay). Running attempts go on.
    Drain(RpcReplyPort<()>),
}

/// Mutable state of one incarnation.
pub struct WorkerState {
    journal: Arc<Mutex<Journal>>,
    /// The consumers bound now (`None` while re-joining).
    bound: Option<Bound>,
    /// Their current ack waits, which the attempts' heartbeats follow.
    ack_waits: Arc<AckWaits>,
    /// The streams attempts read a task's record from (from the last join).
    streams: Streams,
    /// A graceful stop began ([`WorkerMsg::Drain`]): no new input is started.
    draining: bool,
    /// The start-up sweep of the journal's open attempts.
    sweep: Option<Owned>,
    fetch: Option<Owned>,
    rejoin: Option<Owned>,
    subscriptions: Vec<Owned>,
    /// Short tasks on behalf of requests (acks, refusals, calls to attempts), aborted with the
    /// state.
    requests: tokio::task::JoinSet<()>,
    stop: watch::Sender<bool>,
    slots: Arc<Slots>,
    running: RunningSet,
    counters: Arc<WorkerCounters>,
    started: Instant,
    /// The work stream's last sequence when the current connection and consumers began: an
    /// input stored after it and delivered once is a first delivery, and runs without its
    /// task channel being read ([`protocol::task::must_read_channel`]).
    baseline: Arc<Baseline<WorkMark>>,
    /// Takes the baseline again when it is dropped.
    baseline_task: Option<Owned>,
    /// Where its audit events go, and their flusher.
    audit: crate::audit::Auditor,
    audit_flusher: Option<Owned>,
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
        let bound = self.join_and_bind().await.inspect_err(|e| {
            // The supervisor logs only the error's first line; the cause is in its chain.
            tracing::warn!(worker = %self.worker_id, error = %ErrorChain(e), "cannot join the queue");
        })?;
        let mut subscriptions = Vec::new();
        // Both forms of each kind: the admin form, and the one naming its requester.
        for kind in ControlKind::ALL {
            for subject in [
                subjects::control(&self.worker_id, kind),
                subjects::control_as_filter(&self.worker_id, kind),
            ] {
                subscriptions.push(
                    self.forward(&subject, &myself, move |msg| WorkerMsg::Control {
                        kind,
                        msg,
                    })
                    .await?,
                );
            }
        }
        // A router changed the queue's consumer: its ack wait is read again.
        subscriptions.push(
            self.forward(&subjects::queue_changed(&self.queue), &myself, |_| {
                WorkerMsg::QueueChanged
            })
            .await?,
        );
        // Every worker answers the scatter-gather status request of `runtime status`.
        subscriptions.push(
            self.forward(
                subjects::WORKER_STATUS_SUBJECT,
                &myself,
                WorkerMsg::StatusRequest,
            )
            .await?,
        );
        let (stop, _) = watch::channel(false);
        let (audit, audit_flusher) = if self.audit_events {
            let (audit, flusher) = crate::audit::Auditor::spawn(
                self.client.clone(),
                "worker",
                self.worker_id.as_str(),
            );
            (audit, Some(flusher))
        } else {
            (crate::audit::Auditor::off(), None)
        };
        let mut state = WorkerState {
            journal,
            streams: bound.streams.clone(),
            ack_waits: Arc::new(AckWaits::of(&bound.consumers)),
            draining: false,
            sweep: None,
            bound: None,
            fetch: None,
            rejoin: None,
            subscriptions,
            requests: tokio::task::JoinSet::new(),
            stop,
            slots: Slots::new(self.concurrency),
            running: RunningSet::default(),
            counters: Arc::new(WorkerCounters::default()),
            started: Instant::now(),
            baseline: Baseline::new(self.client.clone(), Some(WORK_MARK_AGE)),
            baseline_task: None,
            audit,
            audit_flusher,
        };
        self.keep_baseline(&mut state, &bound).await;
        self.start_fetch(&myself, &mut state, bound);
        state.sweep = Some(self.spawn_sweep(myself.clone(), &state));
        tracing::info!(name = %self.name, worker = %self.worker_id, queue = %self.queue, "worker started");
        Ok(state)
    }

    async fn post_stop(
        &self,
        _: ActorRef<WorkerMsg>,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        // Admission stops.
        let _ = state.stop.send(true);
        state.fetch = None;
        state.rejoin = None;
        state.sweep = None;
        state.subscriptions.clear();
        state.requests.abort_all();
        // Its last audit events out (the state's handle was the only one).
        state.audit = crate::audit::Auditor::off();
        if let Some(flusher) = state.audit_flusher.take() {
            crate::background::join_within(flusher, Duration::from_secs(1)).await;
        }
        // Running attempts get the grace to finish; the rest hand their inputs back.
        let attempts = state.running.actors();
        if attempts.is_empty() {
            return Ok(());
        }
        let margin = HAND_BACK_MARGIN.min(self.shutdown_grace / 4);
        let deadline = tokio::time::Instant::now() + self.shutdown_grace.saturating_sub(margin);
        tracing::info!(running = attempts.len(), grace = ?self.shutdown_grace, "worker stopping: running attempts may finish");
        for attempt in &attempts {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let _ = attempt.wait(Some(left)).await;
        }
        let left: Vec<_> = attempts
            .into_iter()
            .filter(|a| a.get_status() < ractor::ActorStatus::Stopping)
            .collect();
        for attempt in &left {
            let _ = attempt.cast(AttemptMsg::Abandon(margin / 2));
        }
        for attempt in &left {
            if attempt.wait(Some(margin)).await.is_err() {
                attempt.kill();
            }
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
        while state.requests.try_join_next().is_some() {}
        match msg {
            WorkerMsg::Task {
                msg,
                ack_wait,
                permit,
            } => self.on_task(&myself, state, msg, ack_wait, permit).await,
            WorkerMsg::Answer { msg, ack_wait } => {
                self.on_answer(&myself, state, msg, ack_wait).await
            }
            WorkerMsg::Control { kind, msg } => self.on_control(&myself, state, kind, msg).await,
            WorkerMsg::Snapshot(port) => {
                let _ = port.send(self.snapshot(state));
            }
            WorkerMsg::StatusRequest(msg) => {
                // Answered on a subject of its own under the request's reply
                // (`subjects::worker_status_answer`), which a worker's account may publish
                // into the hub's; a request of any other shape is counted and ignored.
                let answer = msg
                    .reply
                    .as_ref()
                    .and_then(|r| subjects::worker_status_answer(r, &self.worker_id));
                match answer {
                    Some(subject) => {
                        let body = serde_json::to_value(self.snapshot(state))?;
                        control::publish_json(&self.client, subject.into(), &body).await;
                    }
                    None => state.counters.replies_refused.bump(),
                }
            }
            WorkerMsg::QueueChanged => {
                // Read again from the consumer itself (a notice says only that it changed);
                // while re-joining, the next bind reads it.
                if let Some(bound) = &state.bound {
                    let mut queue = bound.consumers.queue.clone();
                    let ack_waits = state.ack_waits.clone();
                    state.requests.spawn(async move {
                        match queue.info().await {
                            Ok(info) => ack_waits
                                .set_queue(crate::consumers::effective_ack_wait(&info.config)),
                            Err(e) => {
                                tracing::warn!(error = %ErrorChain(&e), "cannot read the queue consumer again")
                            }
                        }
                    });
                }
            }
            WorkerMsg::ConsumersLost(consumer) => {
                tracing::warn!(worker = %self.worker_id, %consumer, "a consumer is gone: re-joining the queue");
                state.counters.rejoins.bump();
                let _ = state.stop.send(true);
                state.fetch = None;
                state.bound = None;
                if !state.draining {
                    state.rejoin = Some(self.spawn_rejoin(myself.clone()));
                }
            }
            WorkerMsg::Rejoined(bound) => {
                state.rejoin = None;
                if state.draining {
                    return Ok(());
                }
                tracing::info!(worker = %self.worker_id, "re-joined the queue");
                // The consumers may be new: their delivery counts started over.
                state.baseline.invalidate();
                self.keep_baseline(state, &bound).await;
                self.start_fetch(&myself, state, *bound);
            }
            WorkerMsg::PumpFailed(reason) => return Err(WorkerError::Pump(reason).into()),
            WorkerMsg::Swept(found) => self.on_swept(&myself, state, found).await,
            WorkerMsg::Drain(port) => {
                state.draining = true;
                let _ = state.stop.send(true);
                state.fetch = None;
                state.rejoin = None;
                state.sweep = None;
                tracing::info!(worker = %self.worker_id, running = state.running.len(), "worker draining: no new input");
                let _ = port.send(());
            }
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
        if let Some(running) = state.running.remove(cell.get_id()) {
            if let Some(err) = failure {
                state.counters.attempt_failures.bump();
                tracing::warn!(
                    task_id = %running.task_id,
                    input = ?running.input,
                    error = %ErrorChain(&*err),
                    "attempt failed; its input will be redelivered"
                );
            }
        }
        Ok(())
    }
}

impl Worker {
    /// Subscribes to `subject` and casts each message to the worker as `wrap(msg)`, in a task
    /// owned by the worker's state.
    async fn forward(
        &self,
        subject: &str,
        myself: &ActorRef<WorkerMsg>,
        wrap: impl Fn(async_nats::Message) -> WorkerMsg + Send + 'static,
    ) -> Result<Owned, WorkerError> {
        let mut sub = self
            .client
            .subscribe(subject.to_owned())
            .await
            .map_err(|source| WorkerError::Subscribe {
                subject: subject.to_owned(),
                source,
            })?;
        let me = myself.clone();
        Ok(crate::background::spawn(async move {
            while let Some(msg) = sub.next().await {
                if me.cast(wrap(msg)).is_err() {
                    break;
                }
            }
        }))
    }

    /// Takes the work stream baseline of `bound` now (a failure leaves it to the background
    /// task) and keeps it taken: [`crate::epoch::Baseline::keep_fresh`], owned by the state.
    async fn keep_baseline(&self, state: &mut WorkerState, bound: &Bound) {
        let js = jetstream::new(self.client.clone());
        let stream = bound.work_stream.clone();
        let consumers = [
            bound.consumers.queue.clone(),
            bound.consumers.targeted.clone(),
        ];
        let counters = state.counters.clone();
        let read = move |previous| {
            let (js, stream, consumers, counters) = (
                js.clone(),
                stream.clone(),
                consumers.clone(),
                counters.clone(),
            );
            async move {
                crate::epoch::work_mark(&js, &stream, &consumers, previous, || {
                    counters.consumers_remade.bump();
                    tracing::warn!("a task consumer was deleted and made again; inputs stored before now are checked");
                })
                .await
            }
        };
        if let Err(e) = state.baseline.refresh(&read).await {
            tracing::warn!(error = %ErrorChain(&e), "no work stream baseline yet; every input's task channel is read");
        }
        state.baseline_task = Some(crate::background::spawn(
            state.baseline.clone().keep_fresh(read),
        ));
    }

    /// Starts the fetch loops on `bound`'s consumers.
    fn start_fetch(&self, myself: &ActorRef<WorkerMsg>, state: &mut WorkerState, bound: Bound) {
        let (stop, stop_rx) = watch::channel(false);
        state.stop = stop;
        state.streams = bound.streams.clone();
        // Every bind reads the consumers' ack waits again.
        state.ack_waits.rebind(&bound.consumers);
        let fetcher = Fetcher {
            me: myself.clone(),
            client: self.client.clone(),
            counters: state.counters.clone(),
            slots: state.slots.clone(),
            baseline: state.baseline.clone(),
            ack_waits: state.ack_waits.clone(),
        };
        let consumers = bound.consumers.clone();
        let (me, lost) = (myself.clone(), myself.clone());
        // A consumer gone makes the worker re-join; any other end is a failure.
        let fetch = async move {
            match fetcher.run(consumers, stop_rx).await {
                Err(FetchError::ConsumerGone { consumer }) => {
                    let _ = lost.cast(WorkerMsg::ConsumersLost(consumer));
                    Ok(())
                }
                other => other,
            }
        };
        state.fetch = Some(crate::background::spawn_pump(fetch, move |reason| {
            let _ = me.cast(WorkerMsg::PumpFailed(reason));
        }));
        state.bound = Some(bound);
    }

    fn snapshot(&self, state: &WorkerState) -> WorkerSnapshot {
        let parked = state
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .parked_count();
        WorkerSnapshot {
            name: self.name.clone(),
            worker_id: self.worker_id.to_string(),
            queue: self.queue.to_string(),
            concurrency: self.concurrency,
            running: state.running.len(),
            parked,
            bound: state.bound.is_some(),
            counters: state.counters.snapshot(),
            uptime_ms: state.started.elapsed().as_millis() as u64,
        }
    }
}
