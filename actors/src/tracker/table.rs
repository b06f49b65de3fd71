//! The tracked tasks of one [`Trackers`](super::Trackers) actor: one small entry per task,
//! keyed by its task channel's subject, shared by the actor, its live pumps and its reader, and
//! kept across the actor's restarts (the actor's configuration holds it).
//!
//! An entry is what one task costs: its ids, where its final result and progress go, the
//! progress already passed on, and when its stored channel is read next. No actor, task or
//! subscription is made per task (docs/CAPACITY.md).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use protocol::dedupe::SeenSet;
use protocol::subjects::TaskChannel;
use protocol::task::{RereadSchedule, TaskChannelBody, TaskResult};
use protocol::{AgentId, TaskId};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::TrackerEvent;

/// Counters of one tracked task (kept across the actor's restarts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounters {
    /// Bodies handled from the live subscription.
    pub live_seen: u64,
    /// Bodies handled from the stored channel.
    pub stored_seen: u64,
    /// Reads of the stored channel after the first one of an incarnation.
    pub rereads: u64,
    /// Messages on the channel that are not task channel envelopes of this task.
    pub malformed: u64,
    /// Task channel bodies of this task not published by the worker they name (`meta.from`
    /// is not their `worker_id`: a forgery): ignored.
    pub unstamped: u64,
    /// Stored reads that failed.
    pub read_errors: u64,
}

/// When a task's stored channel is read next (reset by a restart of the actor: a new
/// incarnation reads every channel from the start).
#[derive(Debug, Clone)]
pub(super) struct ReadState {
    /// The stream sequence the next read starts from.
    pub next_seq: u64,
    /// Reads in a row that found nothing.
    pub quiet: u32,
    /// When the last read was scheduled (a tick's own time).
    pub last_read: Instant,
    /// The connection's connect count at the last read.
    pub connects: u64,
    /// The last read failed: the next tick reads again.
    pub failing: bool,
    /// A read is queued or in flight.
    pub reading: bool,
    /// This incarnation made (or skipped) its first read.
    pub started: bool,
}

impl ReadState {
    fn new(skip_first: bool, connects: u64) -> ReadState {
        ReadState {
            next_seq: 1,
            quiet: 0,
            last_read: Instant::now(),
            connects,
            failing: false,
            reading: false,
            started: skip_first,
        }
    }

    /// Whether a read is due at the tick `at` with the connection's `connects`; when it is, the
    /// read is marked as started. `Some(true)` for a re-read, `Some(false)` for an
    /// incarnation's first read.
    pub fn take_due(
        &mut self,
        at: Instant,
        connects: u64,
        schedule: &RereadSchedule,
    ) -> Option<bool> {
        if self.reading {
            return None;
        }
        let reread = if self.started {
            let reconnected = connects != self.connects;
            let since = at.saturating_duration_since(self.last_read);
            if !(self.failing || schedule.due(self.quiet, since, reconnected)) {
                return None;
            }
            if reconnected {
                self.quiet = 0;
            }
            true
        } else {
            false
        };
        self.started = true;
        self.reading = true;
        self.last_read = at;
        self.connects = connects;
        Some(reread)
    }
}

/// The most progress events a tracked task holds for a reader that has not taken them: past
/// it, progress is dropped (counted, `progress_dropped`) until the reader takes some. The final
/// result never is: it has its own channel.
pub const MAX_PROGRESS_HELD: usize = 256;
/// The most keys of progress passed on a tracked task remembers (each status event, waiting
/// result and refusal once): past it, the oldest is forgotten, and a copy of it read again (a
/// restart of the trackers reads every channel from the start) is passed on again.
pub const MAX_PROGRESS_KEYS: usize = 256;

/// One tracked task.
pub(super) struct Entry {
    /// Which tracking of the task this is: a read made for an earlier entry of the same
    /// subject (one that was done and replaced) is not applied to this one.
    pub generation: u64,
    pub delegator: AgentId,
    pub task_id: TaskId,
    result: Option<oneshot::Sender<TaskResult>>,
    events: mpsc::Sender<TrackerEvent>,
    /// Keys of the progress already passed on (each status event, waiting result and refusal
    /// once; the last [`MAX_PROGRESS_KEYS`]).
    seen: SeenSet,
    /// The table's count of progress dropped for readers that did not take it.
    dropped: Arc<AtomicU64>,
    pub read: ReadState,
    pub counters: TaskCounters,
}

impl Entry {
    /// Whether the final result was delivered, or can no longer be (the caller dropped its
    /// receiver): the entry can go.
    pub fn is_done(&self) -> bool {
        self.result.as_ref().is_none_or(|tx| tx.is_closed())
    }

    /// Passes `body` on: a final result once, through the oneshot; progress once per key.
    /// Returns `true` when the final result was delivered (the entry can go).
    pub fn on_body(&mut self, body: TaskChannelBody) -> bool {
        match body {
            TaskChannelBody::Result(result) if result.state.is_final() => {
                let state = result.state;
                if let Some(tx) = self.result.take() {
                    if tx.send(result).is_ok() {
                        tracing::info!(task_id = %self.task_id, state = state.as_str(), "task result delivered");
                    }
                }
                true
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
                self.progress(key, TrackerEvent::Progress(Box::new(result)));
                false
            }
            TaskChannelBody::Status(event) => {
                let key = format!("status\u{0}{}", event.event_id);
                self.progress(key, TrackerEvent::Status(Box::new(event)));
                false
            }
            TaskChannelBody::AnswerRefused(refusal) => {
                let key = format!(
                    "refused\u{0}{}\u{0}{}",
                    refusal.worker_id, refusal.answer_id
                );
                self.progress(key, TrackerEvent::AnswerRefused(Box::new(refusal)));
                false
            }
        }
    }

    /// Sends a progress event the first time its key is seen; dropped (and counted) when the
    /// reader holds [`MAX_PROGRESS_HELD`] it has not taken.
    pub fn progress(&mut self, key: String, event: TrackerEvent) {
        if self.seen.first_time_text(&key) {
            if let Err(mpsc::error::TrySendError::Full(_)) = self.events.try_send(event) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a caller of [`TrackerTable::insert`] receives: the final result once, and progress.
pub type Receivers = (oneshot::Receiver<TaskResult>, mpsc::Receiver<TrackerEvent>);

/// The task is tracked already (by this table).
#[derive(Debug, thiserror::Error)]
#[error("task {task_id} of {delegator} is tracked already")]
pub struct AlreadyTracked {
    /// The delegator.
    pub delegator: AgentId,
    /// The task.
    pub task_id: TaskId,
}

/// The tracked tasks, by task channel subject.
#[derive(Default)]
pub struct TrackerTable {
    pub(super) tasks: DashMap<String, Entry>,
    /// The last entry's generation.
    generations: std::sync::atomic::AtomicU64,
    /// Entries removed so far (delivered, or their callers gone): the reader looks at it to
    /// know when a delegator may have lost its last task.
    removed: std::sync::atomic::AtomicU64,
    /// Progress events dropped because their readers held [`MAX_PROGRESS_HELD`] untaken.
    progress_dropped: Arc<AtomicU64>,
}

impl TrackerTable {
    /// Progress events dropped so far because their readers did not take them in time.
    pub fn progress_dropped(&self) -> u64 {
        self.progress_dropped.load(Ordering::Relaxed)
    }

    /// Tasks tracked now: not delivered, and their callers there at the last re-read tick (an
    /// entry whose caller left goes at the next tick).
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no task is tracked.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Drops every entry: each caller's result receiver then reports its sender gone (a system
    /// that shuts down).
    pub fn clear(&self) {
        self.tasks.clear();
    }

    /// Adds `task_id` of `delegator`; `skip_first_read` when it is submitted only after its
    /// delegator's subscription was made (nothing can be stored yet).
    pub(super) fn insert(
        &self,
        delegator: &AgentId,
        task_id: &TaskId,
        skip_first_read: bool,
        connects: u64,
    ) -> Result<(String, Receivers), AlreadyTracked> {
        let subject = TaskChannel::of(delegator, task_id).subject();
        let (result_tx, result_rx) = oneshot::channel();
        let (events_tx, events_rx) = mpsc::channel(MAX_PROGRESS_HELD);
        match self.tasks.entry(subject.clone()) {
            dashmap::Entry::Occupied(e) if !e.get().is_done() => Err(AlreadyTracked {
                delegator: delegator.clone(),
                task_id: task_id.clone(),
            }),
            entry => {
                let generation = self
                    .generations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                entry.insert(Entry {
                    generation,
                    delegator: delegator.clone(),
                    task_id: task_id.clone(),
                    result: Some(result_tx),
                    events: events_tx,
                    seen: SeenSet::new(MAX_PROGRESS_KEYS),
                    dropped: self.progress_dropped.clone(),
                    read: ReadState::new(skip_first_read, connects),
                    counters: TaskCounters::default(),
                });
                Ok((subject, (result_rx, events_rx)))
            }
        }
    }

    /// Removes the entries that are done; returns how many went.
    pub(super) fn prune(&self) -> usize {
        let before = self.tasks.len();
        self.tasks.retain(|_, e| !e.is_done());
        let gone = before.saturating_sub(self.tasks.len());
        self.removed
            .fetch_add(gone as u64, std::sync::atomic::Ordering::Relaxed);
        gone
    }

    /// Removes `subject`'s entry if it is done (delivered): not one that replaced it.
    pub(super) fn remove_done(&self, subject: &str) {
        if self.tasks.remove_if(subject, |_, e| e.is_done()).is_some() {
            self.removed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Entries removed so far.
    pub(super) fn removed(&self) -> u64 {
        self.removed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new incarnation reads every channel from the start, at once.
    pub(super) fn restart_reads(&self, connects: u64) {
        for mut e in self.tasks.iter_mut() {
            e.read = ReadState::new(false, connects);
        }
    }

    /// The delegators with a task tracked.
    pub(super) fn delegators(&self) -> HashSet<AgentId> {
        self.tasks.iter().map(|e| e.delegator.clone()).collect()
    }
}
