//! The start-up sweep of the journal's open attempts, which no input may ever bring back:
//!
//! - a parked attempt with a **final** result saved (a cancel, or a resume's result, whose
//!   publish was not confirmed before the worker stopped) is settled: the result is
//!   republished (same ids, so the stream drops a copy it already has) and the attempt
//!   forgotten;
//! - an attempt whose task channel already ends with a final result, or that another attempt
//!   owns now (its `waiting` result is the latest), is forgotten: its input, if it comes back,
//!   is acked without running, and an answer for it is refused.
//!
//! Everything else stays: a parked attempt waits for its answer; an attempt admitted but not
//! finished gets its input back. The sweep reads one task channel per open attempt, off the
//! worker's mailbox, and hands its findings to the worker, which acts only on attempts not
//! running again meanwhile. A task channel that cannot be read leaves its attempt alone.

use async_nats::jetstream;
use protocol::error_chain::ErrorChain;
use protocol::task::{AttemptId, ChannelState};
use protocol::TaskId;
use ractor::ActorRef;

use super::attempt::{Parked, Streams};
use super::{Worker, WorkerMsg, WorkerState};
use crate::background::Owned;
use crate::journal::AttemptRecord;

/// What the sweep found about one open attempt.
pub struct Found(Finding);

enum Finding {
    /// Settle this parked attempt (republish its saved final result).
    Settle(Box<Parked>),
    /// Forget this attempt: its task is finished or owned by another attempt.
    Forget {
        /// The journal key: input sequence.
        seq: u64,
        /// The journal key: task id.
        task_id: TaskId,
        /// Who delegated the task.
        delegator: protocol::AgentId,
        /// The attempt.
        attempt_id: AttemptId,
    },
}

impl Worker {
    /// Starts the sweep of the open attempts journalled when the worker started.
    pub(super) fn spawn_sweep(&self, me: ActorRef<WorkerMsg>, state: &WorkerState) -> Owned {
        let records = state
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open_attempts();
        let js = jetstream::new(self.client.clone());
        let streams = state.streams.clone();
        crate::background::spawn(async move {
            for record in records {
                if let Some(found) = judge(&js, &streams, &record).await {
                    if me.cast(WorkerMsg::Swept(found)).is_err() {
                        return;
                    }
                }
            }
        })
    }

    /// Acts on a finding of the sweep, unless the attempt runs again meanwhile.
    pub(super) async fn on_swept(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        Found(found): Found,
    ) {
        let (delegator, task_id) = match &found {
            Finding::Settle(parked) => (&parked.delegator, &parked.task.task_id),
            Finding::Forget {
                delegator, task_id, ..
            } => (delegator, task_id),
        };
        if state.draining || state.running.by_task(delegator, task_id).is_some() {
            return;
        }
        match found {
            Finding::Settle(parked) => self.settle_parked(myself, state, *parked, false).await,
            Finding::Forget {
                seq,
                task_id,
                attempt_id,
                ..
            } => {
                let mut journal = state.journal.lock().unwrap_or_else(|e| e.into_inner());
                // Only the very attempt judged: the key may hold a newer admission now.
                let same = journal
                    .lookup(seq, task_id.as_str())
                    .is_some_and(|r| r.attempt_id == attempt_id.as_str());
                if same {
                    match journal.forget(seq, task_id.as_str()) {
                        Ok(_) => {
                            state.counters.swept.bump();
                            tracing::info!(%task_id, %attempt_id, input_seq = seq, "journalled attempt of a task finished elsewhere forgotten");
                        }
                        Err(e) => {
                            tracing::warn!(%task_id, error = %ErrorChain(&e), "cannot forget a swept attempt")
                        }
                    }
                }
            }
        }
    }
}

/// What to do with one open attempt, if anything.
async fn judge(
    js: &jetstream::Context,
    streams: &Streams,
    record: &AttemptRecord,
) -> Option<Found> {
    let task_id = TaskId::new(&record.task_id).ok()?;
    let attempt_id = AttemptId::new(&record.attempt_id).ok()?;
    // A record of an earlier version does not know its delegator, so neither its channel: left
    // alone (its input, if it comes back, tells).
    let delegator = protocol::AgentId::new(record.delegator.as_deref()?).ok()?;
    let reader = crate::task_channel::Reader::Direct(streams.tasks.clone());
    let view = match crate::task_channel::view(js, &reader, &delegator, &task_id).await {
        Ok(view) => view,
        Err(e) => {
            tracing::warn!(%task_id, error = %ErrorChain(&e), "start-up sweep: cannot read the task channel; the attempt is kept");
            return None;
        }
    };
    let parked = Parked::of(record);
    let saved_final = parked
        .as_ref()
        .and_then(|p| p.saved.as_ref())
        .is_some_and(|s| s.result.state.is_final());
    match view.state_for(Some(&attempt_id)) {
        ChannelState::Finished | ChannelState::Parked => Some(Found(Finding::Forget {
            seq: record.input_seq,
            task_id,
            delegator,
            attempt_id,
        })),
        _ if saved_final => parked.map(|p| Found(Finding::Settle(Box::new(p)))),
        _ => None,
    }
}
