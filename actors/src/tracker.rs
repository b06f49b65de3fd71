//! The task tracker actor (delegator side): follows one task channel
//! (`channel.task.<delegator>.<task_id>`)
//! until the task's final result arrives, and hands that result to the caller exactly once.
//!
//! Two pumps feed one handler (the actor's `handle`):
//!
//! - the **live** pump reads a core subscription of the task channel, made in `pre_start`
//!   before anything is read from the store (so nothing falls between the two);
//! - the **stored** pump reads the stored channel (`HUB_TASKS`, through a router by default:
//!   [`Reader::Routed`]) from the start at once, then again while no final result was
//!   delivered, on its [`RereadSchedule`]: by default 3 s after a read that found something,
//!   twice as long after each that found nothing, at most 30 s, and within 3 s of a reconnect
//!   (the connection's connect count is looked at every 3 s, which costs the broker nothing).
//!   A re-read continues after the last stream sequence this incarnation saw
//!   (`ByStartSequence`), which finds exactly what a re-read from the start would find that
//!   is new, for less. A read is
//!   a chain of direct gets (`next_by_subj` from the next sequence; the stream must allow
//!   direct gets, as `HUB_TASKS` does): no consumer is created, and a read that finds nothing
//!   new costs one request.
//!
//! The live pump takes only what the router published on the channel's subject: a JetStream
//! delivery or get aimed at the subscription through the unchecked reply subject of someone's
//! API request is ignored and counted (`replayed`).
//!
//! So a result published while nobody listened is still found, and so is one published while
//! the connection was being replaced (the client re-subscribes by itself; the next re-read
//! catches up whatever the live subscription missed). A failed stored read is retried at the
//! next tick, it does not fail the actor; it is reported as [`TrackerEvent::StoredReadFailed`]
//! (once per run of failures) and counted, so a caller knows it relies on the live
//! subscription alone meanwhile (a wrong tasks stream name, missing permissions). When the live subscription ends, or a pump
//! panics, the actor fails, so that its supervisor restarts it: the new incarnation subscribes
//! again and re-reads the stored channel from the start.
//!
//! The [`TrackerSink`] is shared by every incarnation: the final result (completed, failed or
//! cancelled) is delivered through its oneshot exactly once, whatever the number of restarts and
//! of copies (live and stored) seen. Status events and non-final results (`waiting`) are
//! progress, sent through its [`TrackerEvent`] channel, each once (status events by `event_id`,
//! results by attempt, state and pending question). Once the final result is delivered, or the
//! caller dropped its receiver, the actor stops normally: a `Transient` child is then not
//! restarted. Stopping never cancels the task.
//!
//! ```ignore
//! let (tracker, result, mut progress) = TaskTracker::new("tracker-t1", client, alice, task_id);
//! let (tracker_ref, _join) = ractor::Actor::spawn(Some(tracker.name.clone()), tracker, ()).await?;
//! // or, supervised: ChildSpec::actor(name, tracker, || ()).with_restart(Restart::Transient)
//! let outcome = tokio::time::timeout(limit, result).await; // Err: resume timeout, task goes on
//! ```

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{Client, HeaderMap, Subscriber};
use futures::StreamExt;
use protocol::subjects::TaskChannel;
use protocol::task::{AnswerRefusal, RereadSchedule, StatusEvent, TaskChannelBody, TaskResult};
use protocol::{AgentId, TaskId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::background::Owned;
use crate::fault::{self, FaultPoint};
use crate::task_channel::Reader;

/// Default schedule of the reads of the stored channel: 3 s, doubled after each read that found
/// nothing, at most 30 s.
pub const DEFAULT_REREAD: RereadSchedule = RereadSchedule {
    base: Duration::from_secs(3),
    cap: Duration::from_secs(30),
};

/// Progress seen on the task channel (each item once).
#[derive(Debug, Clone, PartialEq)]
pub enum TrackerEvent {
    /// A status event (acceptance, state change).
    Status(StatusEvent),
    /// A non-final result, typically `waiting` with its question.
    Progress(TaskResult),
    /// A refused answer's error result (stale, or for an attempt the worker does not own).
    AnswerRefused(AnswerRefusal),
    /// The stored channel could not be read (the reason): until a read works again, only the
    /// live subscription feeds the tracker. Sent once per run of failed reads.
    StoredReadFailed(String),
}

/// Where the tracker delivers: shared by all incarnations of one tracker.
#[derive(Clone)]
pub struct TrackerSink {
    result: Arc<Mutex<Option<oneshot::Sender<TaskResult>>>>,
    events: Option<mpsc::UnboundedSender<TrackerEvent>>,
    seen: Arc<Mutex<HashSet<String>>>,
    /// Incarnations started so far (the first one of a fresh task may skip its first read).
    incarnations: Arc<AtomicU64>,
}

impl TrackerSink {
    /// A sink delivering the final result to `result` and progress to `events` (if any).
    pub fn new(
        result: oneshot::Sender<TaskResult>,
        events: Option<mpsc::UnboundedSender<TrackerEvent>>,
    ) -> Self {
        Self {
            result: Arc::new(Mutex::new(Some(result))),
            events,
            seen: Arc::new(Mutex::new(HashSet::new())),
            incarnations: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether the final result was delivered (or can no longer be: the receiver is gone).
    pub fn is_done(&self) -> bool {
        lock(&self.result).as_ref().is_none_or(|tx| tx.is_closed())
    }

    /// Delivers the final result; `true` the first time only.
    fn deliver(&self, result: TaskResult) -> bool {
        match lock(&self.result).take() {
            Some(tx) => tx.send(result).is_ok(),
            None => false,
        }
    }

    /// Sends a progress event the first time its key is seen.
    fn progress(&self, key: String, event: TrackerEvent) -> bool {
        if !lock(&self.seen).insert(key) {
            return false;
        }
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
        true
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Task tracker configuration (cloned into every incarnation).
#[derive(Clone)]
pub struct TaskTracker {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The connection.
    pub client: Client,
    /// Who delegated the task (its channel is under this identity).
    pub delegator: AgentId,
    /// The task followed.
    pub task_id: TaskId,
    /// How the stored channel is read.
    pub reader: Reader,
    /// When the stored channel is read again while no final result arrived.
    pub reread: RereadSchedule,
    /// The task was not submitted before this tracker subscribed (see [`TaskTracker::fresh`]).
    pub fresh: bool,
    /// Where results and progress go.
    pub sink: TrackerSink,
}

impl TaskTracker {
    /// A tracker of `task_id`, delegated by `delegator`, that reads the stored channel through
    /// a router as `delegator` and re-reads it every 3 s, with the receivers of its final result
    /// and of its progress events.
    pub fn new(
        name: impl Into<String>,
        client: Client,
        delegator: AgentId,
        task_id: TaskId,
    ) -> (
        TaskTracker,
        oneshot::Receiver<TaskResult>,
        mpsc::UnboundedReceiver<TrackerEvent>,
    ) {
        let (result_tx, result_rx) = oneshot::channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let tracker = TaskTracker {
            name: name.into(),
            client,
            reader: Reader::Routed(delegator.clone()),
            delegator,
            task_id,
            reread: DEFAULT_REREAD,
            fresh: false,
            sink: TrackerSink::new(result_tx, Some(events_tx)),
        };
        (tracker, result_rx, events_rx)
    }

    /// Reads the stored channel again every `every`, found something or not.
    #[must_use]
    pub fn with_reread_every(mut self, every: Duration) -> Self {
        self.reread = RereadSchedule::fixed(every);
        self
    }

    /// Sets when the stored channel is read again.
    #[must_use]
    pub fn with_reread(mut self, schedule: RereadSchedule) -> Self {
        self.reread = schedule;
        self
    }

    /// Marks the task as fresh: it is submitted only after this tracker subscribed, so the
    /// first incarnation skips its initial stored read (nothing can be stored yet; the live
    /// subscription sees everything). The periodic re-reads still run, and a restarted
    /// incarnation reads the stored channel from the start as always.
    #[must_use]
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }

    /// Sets how the stored channel is read.
    #[must_use]
    pub fn with_reader(mut self, reader: Reader) -> Self {
        self.reader = reader;
        self
    }

    fn subject(&self) -> String {
        TaskChannel::of(&self.delegator, &self.task_id).subject()
    }
}

/// Where a message was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The core subscription.
    Live,
    /// The stored channel.
    Stored,
}

/// Messages of the tracker.
pub enum TrackerMsg {
    /// A task channel body read by a pump, with the span it is handled in (for a result: a
    /// `tracker.result` span, child of the context in the message's headers, so that the
    /// task's trace ends at the delegator; else no span).
    Seen(Box<TaskChannelBody>, Source, tracing::Span),
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<TrackerSnapshot>),
    /// The caller dropped its result receiver: stop (the task is not cancelled).
    CallerGone,
    /// A pump stopped with an error: fail so that the supervisor restarts the actor.
    PumpFailed(crate::background::PumpFailure),
}

crate::counters! {
    /// Counters of one tracker incarnation.
    pub struct TrackerCounters => TrackerCountersSnapshot {
        /// Bodies handled from the live subscription.
        live_seen,
        /// Bodies handled from the stored channel.
        stored_seen,
        /// Reads of the stored channel after the first one.
        rereads,
        /// Messages on the channel that are not task channel envelopes of this task.
        malformed,
        /// Task channel bodies of this task not published by the worker they name (`meta.from`
        /// is not their `worker_id`: a forgery): ignored.
        unstamped,
        /// Stored reads that failed.
        read_errors,
        /// Messages on the live subscription that the router did not publish there (a
        /// JetStream delivery or get aimed at it through an API request's reply subject).
        replayed,
    }
}

/// Snapshot of a tracker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerSnapshot {
    /// The task followed.
    pub task_id: String,
    /// Counters of this incarnation.
    pub counters: TrackerCountersSnapshot,
    /// Whether the final result was delivered (by any incarnation).
    pub delivered: bool,
}

/// State of one incarnation.
pub struct TrackerState {
    counters: Arc<TrackerCounters>,
    stop: watch::Sender<bool>,
    pumps: Vec<Owned>,
}

/// Tracker failures.
#[derive(Debug, thiserror::Error)]
pub enum TrackerError {
    /// The live subscription could not be made.
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        /// The task channel.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// A pump failed.
    #[error("tracker pump failed: {0}")]
    Pump(#[source] crate::background::PumpFailure),
}

#[ractor::async_trait]
impl Actor for TaskTracker {
    type Msg = TrackerMsg;
    type State = TrackerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<TrackerMsg>,
        _: (),
    ) -> Result<TrackerState, ActorProcessingErr> {
        // Counted before anything can fail: a first incarnation that failed to start does not
        // leave the "first" (read-skipping) role to its successor.
        let first_incarnation = self.sink.incarnations.fetch_add(1, Ordering::Relaxed) == 0;
        fault::check(&self.name, FaultPoint::PreStart)?;
        let counters = Arc::new(TrackerCounters::default());
        let (stop, stop_rx) = watch::channel(false);
        if self.sink.is_done() {
            // A restart after delivery (or after the caller left): nothing to follow.
            myself.stop(Some("already delivered".into()));
            return Ok(TrackerState {
                counters,
                stop,
                pumps: Vec::new(),
            });
        }
        let subject = self.subject();
        // Subscribe before the first stored read: whatever is published from now on is seen
        // live, whatever was published before is in the store.
        let live = self
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|source| TrackerError::Subscribe {
                subject: subject.clone(),
                source,
            })?;
        let pump = TrackerPump {
            skip_first_read: self.fresh && first_incarnation,
            client: self.client.clone(),
            delegator: self.delegator.clone(),
            task_id: self.task_id.clone(),
            reader: self.reader.clone(),
            reread: self.reread,
            counters: counters.clone(),
            sink: self.sink.clone(),
            myself: myself.clone(),
        };
        let on_fail = |myself: ActorRef<TrackerMsg>| {
            move |e| {
                let _ = myself.cast(TrackerMsg::PumpFailed(e));
            }
        };
        let live_pump = crate::background::spawn_pump(
            pump.clone().live(live, stop_rx.clone()),
            on_fail(myself.clone()),
        );
        let stored_pump = crate::background::spawn_pump(pump.stored(stop_rx), on_fail(myself));
        tracing::info!(task_id = %self.task_id, "tracking the task channel");
        Ok(TrackerState {
            counters,
            stop,
            pumps: vec![live_pump, stored_pump],
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<TrackerMsg>,
        state: &mut TrackerState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop.send(true);
        for pump in state.pumps.drain(..) {
            // A stored read in progress finishes (bounded by its timeout); be brief.
            pump.join_within(Duration::from_secs(2)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<TrackerMsg>,
        msg: TrackerMsg,
        state: &mut TrackerState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            TrackerMsg::Seen(body, source, span) => {
                match source {
                    Source::Live => state.counters.live_seen.bump(),
                    Source::Stored => state.counters.stored_seen.bump(),
                }
                let _entered = span.enter();
                self.on_body(&myself, *body);
            }
            TrackerMsg::Snapshot(port) => {
                let _ = port.send(TrackerSnapshot {
                    task_id: self.task_id.to_string(),
                    counters: state.counters.snapshot(),
                    delivered: lock(&self.sink.result).is_none(),
                });
            }
            TrackerMsg::CallerGone => {
                tracing::info!(task_id = %self.task_id, "result receiver dropped; tracker stops");
                myself.stop(Some("caller gone".into()));
            }
            TrackerMsg::PumpFailed(reason) => return Err(TrackerError::Pump(reason).into()),
        }
        Ok(())
    }
}

impl TaskTracker {
    fn on_body(&self, myself: &ActorRef<TrackerMsg>, body: TaskChannelBody) {
        match body {
            TaskChannelBody::Result(result) if result.state.is_final() => {
                let state = result.state;
                if self.sink.deliver(result) {
                    tracing::info!(task_id = %self.task_id, state = state.as_str(), "task result delivered");
                }
                myself.stop(Some("final result delivered".into()));
            }
            TaskChannelBody::Result(result) => {
                let question = result
                    .suspend
                    .as_ref()
                    .map(|s| s.tool_call_id.as_str())
                    .unwrap_or("");
                let key = format!(
                    "result\u{0}{}\u{0}{}\u{0}{question}",
                    result.attempt_id,
                    result.state.as_str()
                );
                self.sink.progress(key, TrackerEvent::Progress(result));
            }
            TaskChannelBody::Status(event) => {
                let key = format!("status\u{0}{}", event.event_id);
                self.sink.progress(key, TrackerEvent::Status(event));
            }
            TaskChannelBody::AnswerRefused(refusal) => {
                let key = format!(
                    "refused\u{0}{}\u{0}{}",
                    refusal.worker_id, refusal.answer_id
                );
                self.sink
                    .progress(key, TrackerEvent::AnswerRefused(refusal));
            }
        }
    }
}

/// What the pumps need.
#[derive(Clone)]
struct TrackerPump {
    skip_first_read: bool,
    client: Client,
    delegator: AgentId,
    task_id: TaskId,
    reader: Reader,
    reread: RereadSchedule,
    counters: Arc<TrackerCounters>,
    sink: TrackerSink,
    myself: ActorRef<TrackerMsg>,
}

/// Whether a message of the live subscription is one the router published on `subject`: its
/// subject is the channel's, it has no ack reply (a JetStream delivery) and no replay headers
/// (a direct or message get). Anything else reached the subscription through the reply
/// subject of someone's JetStream API request, which nats-server does not permission-check.
fn is_published_here(msg: &async_nats::Message, subject: &str) -> bool {
    msg.subject.as_str() == subject
        && !msg
            .reply
            .as_ref()
            .is_some_and(|r| r.as_str().starts_with("$JS.ACK."))
        && !msg.headers.as_ref().is_some_and(|h| {
            h.iter()
                .any(|(name, _)| protocol::headers::is_replay_header(name.as_ref()))
        })
}

/// The live subscription of the task channel ended (the connection closed): the tracker fails
/// and is restarted.
#[derive(Debug, thiserror::Error)]
#[error("the live subscription of the task channel ended")]
pub struct LiveEnded;

impl TrackerPump {
    async fn live(
        self,
        mut sub: Subscriber,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), LiveEnded> {
        let subject = TaskChannel::of(&self.delegator, &self.task_id).subject();
        loop {
            let msg = tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return Ok(());
                    }
                    continue;
                }
                next = sub.next() => next.ok_or(LiveEnded)?,
            };
            if !is_published_here(&msg, &subject) {
                // A JetStream delivery or get aimed at this subscription through the unchecked
                // reply subject of an API request (a pull keeps its stored subject; a get
                // carries replay headers): not a message the router stored here.
                self.counters.replayed.bump();
                tracing::warn!(task_id = %self.task_id, subject = %msg.subject, "ignored a message replayed into the task channel subscription");
                continue;
            }
            let body = match crate::task_channel::decode_checked(
                &self.task_id,
                msg.headers.as_ref(),
                &msg.payload,
            ) {
                Ok(body) => Some(body),
                Err(crate::task_channel::Undecoded::Unstamped) => {
                    self.unstamped();
                    continue;
                }
                Err(crate::task_channel::Undecoded::Other) => None,
            };
            if !self.forward(msg.headers.as_ref(), body, Source::Live) {
                return Ok(());
            }
        }
    }

    async fn stored(self, mut stop: watch::Receiver<bool>) -> Result<(), std::convert::Infallible> {
        let js = jetstream::new(self.client.clone());
        let mut next_seq = 1;
        // Whether a read is due is looked at every base interval; a read is made when the
        // schedule says (`quiet` reads in a row found nothing since `last_read`), or when the
        // connection was replaced since (`connects` moved).
        let mut tick = tokio::time::interval(self.reread.base);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let connects = || self.client.statistics().connects.load(Ordering::Acquire);
        // Times are the ticks' own (their deadlines), so the waits are whole ticks whatever
        // the wake-up delays.
        let (mut last_read, mut last_connects, mut quiet) =
            (tokio::time::Instant::now(), connects(), 0u32);
        let mut first = true;
        let mut failing = false;
        loop {
            let at = tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return Ok(());
                    }
                    continue;
                }
                at = tick.tick() => at,
            };
            if self.sink.is_done() {
                let _ = self.myself.cast(TrackerMsg::CallerGone);
                return Ok(());
            }
            if first && self.skip_first_read {
                first = false;
                last_read = at;
                continue;
            }
            if !first {
                let now_connects = connects();
                let reconnected = now_connects != last_connects;
                // A failed read is tried again at the next tick.
                let since = at.saturating_duration_since(last_read);
                if !(failing || self.reread.due(quiet, since, reconnected)) {
                    continue;
                }
                if reconnected {
                    quiet = 0;
                }
                last_connects = now_connects;
                self.counters.rereads.bump();
            }
            first = false;
            last_read = at;
            let read = crate::task_channel::read(
                &js,
                &self.reader,
                &self.delegator,
                &self.task_id,
                next_seq,
            );
            match read.await {
                Ok(stored) => {
                    failing = false;
                    quiet = if stored.is_empty() {
                        quiet.saturating_add(1)
                    } else {
                        0
                    };
                    for msg in stored {
                        next_seq = next_seq.max(msg.seq + 1);
                        if msg.unstamped {
                            self.unstamped();
                            continue;
                        }
                        if !self.forward(Some(&msg.headers), msg.body, Source::Stored) {
                            return Ok(());
                        }
                    }
                }
                Err(e) => {
                    self.counters.read_errors.bump();
                    tracing::warn!(task_id = %self.task_id, error = %e, "stored task channel read failed; relying on the live subscription until the next read");
                    if !failing {
                        failing = true;
                        let key = format!("read-failed\u{0}{}", self.counters.read_errors.get());
                        self.sink
                            .progress(key, TrackerEvent::StoredReadFailed(e.to_string()));
                    }
                }
            }
        }
    }

    /// Counts and logs a body that its named worker did not publish.
    fn unstamped(&self) {
        self.counters.unstamped.bump();
        tracing::warn!(task_id = %self.task_id, "ignored a task channel body not published by the worker it names");
    }

    /// Hands one decoded message to the actor (`None`: not a task channel body of this task);
    /// `false` when the actor is gone.
    fn forward(
        &self,
        msg_headers: Option<&HeaderMap>,
        body: Option<TaskChannelBody>,
        source: Source,
    ) -> bool {
        match body {
            Some(body) => {
                let span = match &body {
                    TaskChannelBody::Result(result) => {
                        let span = tracing::info_span!(
                            "tracker.result",
                            task_id = %self.task_id,
                            state = result.state.as_str(),
                            source = ?source,
                        );
                        crate::trace_context::set_parent_from(&span, msg_headers);
                        span
                    }
                    _ => tracing::Span::none(),
                };
                self.myself
                    .cast(TrackerMsg::Seen(Box::new(body), source, span))
                    .is_ok()
            }
            None => {
                self.counters.malformed.bump();
                tracing::debug!(task_id = %self.task_id, "ignored a message that is no task channel envelope of this task");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests;
