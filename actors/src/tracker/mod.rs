//! The task trackers of one connection (delegator side): one actor follows every tracked task's
//! channel (`channel.task.<delegator>.<task_id>`) until its final result arrives, and hands
//! that result to its caller exactly once.
//!
//! A tracked task costs an entry in a shared table ([`TrackerTable`]), not an actor, a task or
//! a subscription of its own (docs/CAPACITY.md). Two kinds of pump feed the entries:
//!
//! - one **live** pump per delegator with a task tracked reads a core subscription of all its
//!   task channels (`channel.task.<delegator>.>`, which a delegator is granted), made before the
//!   delegator's first task is read from the store or submitted (so nothing falls between the
//!   two); each message goes to the task its subject names;
//! - one **reader** reads the stored channels (`HUB_TASKS`, through a router as each task's
//!   delegator by default: [`ReadAs::Delegator`]): a task's channel at once when it is tracked
//!   (unless it is fresh, see below), then again while no final result was delivered, on its
//!   [`RereadSchedule`]: by default 3 s after a read that found something, twice as long after
//!   each that found nothing, at most 30 s, and within 3 s of a reconnect (the connection's
//!   connect count is looked at every 3 s, which costs the broker nothing). At most
//!   [`READS_IN_FLIGHT`] reads run at once, and a reconnect abandons the reads in flight (their
//!   replies may be lost) and makes them again. A re-read continues after the last stream sequence
//!   this incarnation saw (`ByStartSequence`), which finds exactly what a re-read from the start
//!   would find that is new, for less. A read is a chain of direct gets (`next_by_subj` from the
//!   next sequence; the stream must allow direct gets, as `HUB_TASKS` does): no consumer is
//!   created, and a read that finds nothing new costs one request.
//!
//! The live pumps take only what the router published on a channel's subject: a JetStream
//! delivery or get aimed at a subscription through the unchecked reply subject of someone's
//! API request is ignored and counted (`replayed`).
//!
//! So a result published while nobody listened is still found, and so is one published while
//! the connection was being replaced (the client re-subscribes by itself; the next re-read
//! catches up whatever the live subscription missed). A failed stored read is retried at the
//! next tick, it does not fail the actor; it is reported to the task's caller as
//! [`TrackerEvent::StoredReadFailed`] (once per run of failures) and counted, so a caller knows
//! it relies on the live subscription alone meanwhile (a wrong tasks stream name, missing
//! permissions). When a live subscription ends, or a pump fails or panics (an injected fault, a stored read that panicked),
//! the actor fails, so that its supervisor restarts it: the new incarnation subscribes again
//! and re-reads every tracked task's stored channel from the start.
//!
//! The table is the actor's configuration, so it outlives every incarnation: each task's final
//! result (completed, failed or cancelled) is delivered through its oneshot exactly once,
//! whatever the number of restarts and of copies (live and stored) seen. Status events and
//! non-final results (`waiting`) are progress, sent through its [`TrackerEvent`] channel, each
//! once (status events by `event_id`, results by attempt, state and pending question). Once
//! the final result is delivered, or the caller dropped its receiver, the task's entry goes,
//! and a delegator with no task left loses its subscription. Untracking never cancels a task.
//!
//! ```ignore
//! let trackers = Trackers::new("sys/trackers", client);
//! let (actor, _join) = ractor::Actor::spawn(Some(trackers.name.clone()), trackers, ()).await?;
//! let (result, mut progress) = track(&actor, &alice, &task_id, false).await?;
//! let outcome = tokio::time::timeout(limit, result).await; // Err: resume timeout, task goes on
//! ```

mod pumps;
mod table;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use protocol::task::{AnswerRefusal, RereadSchedule, StatusEvent, TaskResult};
use protocol::{AgentId, TaskId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::background::{Owned, PumpFailure};
use crate::fault::{self, FaultPoint};

pub use pumps::{fault_key, ReadAs, READS_IN_FLIGHT};
pub use table::{AlreadyTracked, Receivers, TaskCounters, TrackerTable};

/// Default schedule of the reads of the stored channel: 3 s, doubled after each read that found
/// nothing, at most 30 s.
pub const DEFAULT_REREAD: RereadSchedule = RereadSchedule {
    base: Duration::from_secs(3),
    cap: Duration::from_secs(30),
};

/// Progress seen on a task channel (each item once). The bodies are boxed: a tracked task's
/// progress channel holds room for a block of these from the start.
#[derive(Debug, Clone, PartialEq)]
pub enum TrackerEvent {
    /// A status event (acceptance, state change).
    Status(Box<StatusEvent>),
    /// A non-final result, typically `waiting` with its question.
    Progress(Box<TaskResult>),
    /// A refused answer's error result (stale, or for an attempt the worker does not own).
    AnswerRefused(Box<AnswerRefusal>),
    /// The stored channel could not be read (the reason): until a read works again, only the
    /// live subscription feeds the tracker. Sent once per run of failed reads.
    StoredReadFailed(String),
}

/// Where a message was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The core subscription.
    Live,
    /// The stored channel.
    Stored,
}

/// The trackers' configuration (cloned into every incarnation; the table is shared by all).
#[derive(Clone)]
pub struct Trackers {
    /// Actor name, also the fault-injection key of the actor ([`fault_key`] names each task's).
    pub name: String,
    /// The connection.
    pub client: Client,
    /// How the stored channels are read.
    pub read_as: ReadAs,
    /// When a stored channel is read again while no final result arrived.
    pub reread: RereadSchedule,
    /// The tracked tasks.
    pub table: Arc<TrackerTable>,
}

impl Trackers {
    /// Trackers named `name` on `client` that read stored channels through a router, as each
    /// task's delegator, on [`DEFAULT_REREAD`], with an empty table.
    pub fn new(name: impl Into<String>, client: Client) -> Trackers {
        Trackers {
            name: name.into(),
            client,
            read_as: ReadAs::Delegator,
            reread: DEFAULT_REREAD,
            table: Arc::default(),
        }
    }

    /// Reads the stored channels again every `every`, found something or not.
    #[must_use]
    pub fn with_reread_every(mut self, every: Duration) -> Self {
        self.reread = RereadSchedule::fixed(every);
        self
    }

    /// Sets when the stored channels are read again.
    #[must_use]
    pub fn with_reread(mut self, schedule: RereadSchedule) -> Self {
        self.reread = schedule;
        self
    }

    /// Sets how the stored channels are read.
    #[must_use]
    pub fn with_read_as(mut self, read_as: ReadAs) -> Self {
        self.read_as = read_as;
        self
    }

    /// Keeps the tasks in `table` (one that outlives these trackers, e.g. an `ActorSystem`'s).
    #[must_use]
    pub fn with_table(mut self, table: Arc<TrackerTable>) -> Self {
        self.table = table;
        self
    }
}

/// One task to track.
#[derive(Debug, Clone)]
pub struct Track {
    /// Who delegated it (its channel is under this identity).
    pub delegator: AgentId,
    /// The task.
    pub task_id: TaskId,
    /// The task is submitted only after this track returns, so its first read is skipped
    /// (nothing can be stored yet; the live subscription sees everything). The re-reads still
    /// run, and a restarted incarnation reads its stored channel from the start as always.
    pub fresh: bool,
}

/// Messages of the trackers.
pub enum TrackersMsg {
    /// Tracks a task: makes its delegator's subscription if there is none, adds its entry, and
    /// (unless fresh) reads its stored channel at once; answers its receivers.
    Track(Track, RpcReplyPort<Result<Receivers, TrackError>>),
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<TrackersSnapshot>),
    /// One task's snapshot (`None`: not tracked, or delivered; a task whose caller left is
    /// still there until the next re-read tick).
    Task(String, RpcReplyPort<Option<TrackerSnapshot>>),
    /// Drops the subscriptions of delegators with no task left.
    Prune,
    /// A pump stopped with an error: fail so that the supervisor restarts the actor.
    PumpFailed(PumpFailure),
}

crate::counters! {
    /// Counters of one trackers incarnation (each task's own are in the table, kept across them).
    pub struct TrackersCounters => TrackersCountersSnapshot {
        /// Messages on a live subscription that the router did not publish there (a JetStream
        /// delivery or get aimed at it through an API request's reply subject).
        replayed,
        /// Messages of a task channel whose task is not tracked (delivered, or its caller
        /// left).
        untracked,
        /// Stored reads made (first reads and re-reads, all tasks), by this incarnation.
        reads,
        /// Incarnations started (the first one included).
        incarnations,
    }
}

/// Snapshot of the trackers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackersSnapshot {
    /// Tasks tracked now.
    pub tracked: usize,
    /// Delegators subscribed to (those with a task tracked, until the next prune).
    pub delegators: usize,
    /// Counters.
    pub counters: TrackersCountersSnapshot,
    /// Progress events dropped (kept across incarnations): their readers held
    /// [`MAX_PROGRESS_HELD`](table::MAX_PROGRESS_HELD) they had not taken.
    #[serde(default)]
    pub progress_dropped: u64,
}

/// Snapshot of one tracked task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerSnapshot {
    /// The task followed.
    pub task_id: String,
    /// Its counters.
    pub counters: TaskCounters,
}

/// State of one incarnation.
pub struct TrackersState {
    ctx: Arc<pumps::Ctx>,
    stop: watch::Sender<bool>,
    /// One live pump per delegator.
    live: HashMap<AgentId, Owned>,
    /// Tasks to read at once.
    read_now: mpsc::UnboundedSender<String>,
    reader: Option<Owned>,
}

/// Tracker failures.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// The delegator's live subscription could not be made.
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        /// The task channels' filter.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The task is tracked already.
    #[error(transparent)]
    AlreadyTracked(#[from] AlreadyTracked),
    /// An injected fault.
    #[error(transparent)]
    Fault(#[from] fault::FaultError),
    /// A pump failed.
    #[error("tracker pump failed")]
    Pump(#[source] PumpFailure),
    /// The actor did not answer within [`TRACK_TIMEOUT`] (stopped, restarting, or stuck
    /// subscribing).
    #[error("the trackers did not answer: {0}")]
    NoAnswer(String),
}

/// How long [`track`] waits for the actor's answer.
pub const TRACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Tracks `track` with the trackers `actor`: returns the task's final result receiver and its
/// progress.
///
/// # Errors
/// [`TrackError`] from the actor; [`TrackError::NoAnswer`] when it did not answer within
/// [`TRACK_TIMEOUT`].
pub async fn track(actor: &ActorRef<TrackersMsg>, track: Track) -> Result<Receivers, TrackError> {
    ractor::call_t!(
        actor,
        TrackersMsg::Track,
        TRACK_TIMEOUT.as_millis() as u64,
        track
    )
    .map_err(|e| TrackError::NoAnswer(e.to_string()))?
}

impl Trackers {
    fn on_fail(myself: &ActorRef<TrackersMsg>) -> impl FnOnce(PumpFailure) + Send + 'static {
        let myself = myself.clone();
        move |e| {
            let _ = myself.cast(TrackersMsg::PumpFailed(e));
        }
    }

    /// Subscribes to `delegator`'s task channels and starts its live pump.
    async fn subscribe(
        &self,
        myself: &ActorRef<TrackersMsg>,
        state: &mut TrackersState,
        delegator: &AgentId,
    ) -> Result<(), TrackError> {
        if state.live.contains_key(delegator) {
            return Ok(());
        }
        let subject = protocol::subjects::tasks_of(delegator);
        let sub = self
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|source| TrackError::Subscribe { subject, source })?;
        let pump = pumps::live(
            state.ctx.clone(),
            delegator.clone(),
            sub,
            state.stop.subscribe(),
        );
        state.live.insert(
            delegator.clone(),
            crate::background::spawn_pump(pump, Self::on_fail(myself)),
        );
        Ok(())
    }

    async fn on_track(
        &self,
        myself: &ActorRef<TrackersMsg>,
        state: &mut TrackersState,
        track: Track,
    ) -> Result<Receivers, TrackError> {
        // Subscribed before the entry exists and before the task is read or submitted:
        // whatever is published from now on is seen live, whatever was before is in the store.
        self.subscribe(myself, state, &track.delegator).await?;
        let connects = self.client.statistics().connects.load(Ordering::Acquire);
        let (subject, receivers) =
            self.table
                .insert(&track.delegator, &track.task_id, track.fresh, connects)?;
        if !track.fresh {
            let _ = state.read_now.send(subject);
        }
        tracing::debug!(task_id = %track.task_id, delegator = %track.delegator, "tracking the task channel");
        Ok(receivers)
    }
}

#[ractor::async_trait]
impl Actor for Trackers {
    type Msg = TrackersMsg;
    type State = TrackersState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<TrackersMsg>,
        _: (),
    ) -> Result<TrackersState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let counters = Arc::new(TrackersCounters::default());
        counters.incarnations.bump();
        let ctx = Arc::new(pumps::Ctx {
            name: self.name.clone(),
            client: self.client.clone(),
            read_as: self.read_as.clone(),
            reread: self.reread,
            table: self.table.clone(),
            counters,
        });
        let (stop, _) = watch::channel(false);
        let (read_now, now_rx) = mpsc::unbounded_channel();
        let mut state = TrackersState {
            ctx: ctx.clone(),
            stop,
            live: HashMap::new(),
            read_now,
            reader: None,
        };
        // A restart: every task still tracked is followed again, subscribed first, then read
        // from the start (what the last incarnation saw may have been lost with it).
        self.table.prune();
        for delegator in self.table.delegators() {
            self.subscribe(&myself, &mut state, &delegator).await?;
        }
        let connects = self.client.statistics().connects.load(Ordering::Acquire);
        self.table.restart_reads(connects);
        let reader = pumps::reader(ctx, myself.clone(), now_rx, state.stop.subscribe());
        state.reader = Some(crate::background::spawn_pump(
            reader,
            Self::on_fail(&myself),
        ));
        Ok(state)
    }

    async fn post_stop(
        &self,
        _: ActorRef<TrackersMsg>,
        state: &mut TrackersState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop.send(true);
        if let Some(reader) = state.reader.take() {
            // Reads in progress end with it (each bounded by its timeout); be brief.
            crate::background::join_within(reader, Duration::from_secs(2)).await;
        }
        for (_, pump) in state.live.drain() {
            crate::background::join_within(pump, Duration::from_secs(2)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<TrackersMsg>,
        msg: TrackersMsg,
        state: &mut TrackersState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            TrackersMsg::Track(track, port) => {
                let _ = port.send(self.on_track(&myself, state, track).await);
            }
            TrackersMsg::Snapshot(port) => {
                let _ = port.send(TrackersSnapshot {
                    tracked: self.table.len(),
                    delegators: state.live.len(),
                    counters: state.ctx.counters.snapshot(),
                    progress_dropped: self.table.progress_dropped(),
                });
            }
            TrackersMsg::Task(subject, port) => {
                let _ = port.send(self.table.tasks.get(&subject).map(|e| TrackerSnapshot {
                    task_id: e.task_id.to_string(),
                    counters: e.counters.clone(),
                }));
            }
            TrackersMsg::Prune => {
                if !state.live.is_empty() {
                    let wanted = self.table.delegators();
                    state.live.retain(|delegator, _| wanted.contains(delegator));
                }
            }
            TrackersMsg::PumpFailed(reason) => return Err(TrackError::Pump(reason).into()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
