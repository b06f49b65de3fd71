//! How an attempt ends: (6) the result saved, (7) published, (8) the input acked and the
//! attempt forgotten (a waiting one stays parked); or, at a graceful stop, its input handed
//! back.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use protocol::error_chain::ErrorChain;
use protocol::task::{build_result, Outcome, TaskResult, TaskState};
use ractor::ActorRef;

use super::{
    journal_ops, Attempt, AttemptError, AttemptMsg, AttemptState, Phase, SavedResult, RETRY_DELAY,
};
use crate::fault::{self, FaultPoint};

impl Attempt {
    /// The handler ended with `outcome` (a cancel requested while it still returned a
    /// question stands: the result is `cancelled`): (6)–(8).
    pub(super) async fn finish(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        outcome: Outcome,
    ) -> Result<(), AttemptError> {
        let outcome = match outcome {
            Outcome::Waiting { .. } if state.cancel_requested() => Outcome::Cancelled,
            other => other,
        };
        let result = build_result(&state.task, &state.attempt_id, &self.worker_id, outcome);
        self.save_and_publish(myself, state, result).await
    }

    /// (6) saves `result` under the next state-change sequence (fsync; a waiting one parked
    /// with its task in the same fsync) *before* publishing it, then (7) and (8).
    pub(super) async fn save_and_publish(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        result: TaskResult,
    ) -> Result<(), AttemptError> {
        state.phase = Phase::Settling;
        let seq = state.last_seq.saturating_add(1);
        let waiting = result.state == TaskState::Waiting;
        let saved = SavedResult { seq, result };
        let value = serde_json::to_value(&saved).unwrap_or_default();
        let task = waiting.then(|| serde_json::to_value(&state.task).unwrap_or_default());
        let (record_seq, task_id) = (state.record_seq, state.task.task_id.to_string());
        journal_ops::durable(&self.journal, move |j| {
            j.save_result(record_seq, &task_id, &value)?;
            match task {
                Some(task) => j.park(record_seq, &task_id, &task),
                None => Ok(()),
            }
        })
        .await?;
        fault::check(&self.name, FaultPoint::Handle)?;
        self.publish_saved(myself, state, saved).await
    }

    /// (7)+(8): publishes a saved result, then acks the input, forgets a final attempt (a
    /// waiting one stays parked) and stops.
    pub(super) async fn publish_saved(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        saved: SavedResult,
    ) -> Result<(), AttemptError> {
        state.phase = Phase::Settling;
        let (acceptance, accepted) = (state.acceptance.take(), state.accepted.take());
        if let Err(e) = self
            .send_state_change(state, &saved, acceptance, accepted)
            .await
        {
            // Not confirmed: the input comes back soon (here: the saved result is republished;
            // elsewhere: the task channel tells), without waiting out the ack wait.
            state.heartbeat = None;
            if let Some(input) = &state.input {
                let _ = input.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            }
            return Err(e);
        }
        // Crash tests: the result is stored, its input not acked yet.
        fault::check(&self.name, FaultPoint::ResultConfirmed)?;
        state.state = saved.result.state;
        state.suspend = saved.result.suspend.clone();
        let final_state = saved.result.state.is_final();
        state.last_seq = state.last_seq.max(saved.seq);
        state.saved = Some(saved);
        if final_state {
            match state.state {
                TaskState::Completed => &self.counters.completed,
                TaskState::Cancelled => &self.counters.cancelled,
                _ => &self.counters.failed,
            }
            .bump();
        }
        self.ack_and_stop(myself, state, final_state).await
    }

    /// Acks the input (a waiting result completes its delivery too; the heartbeat goes on
    /// until the ack is confirmed), frees the slot, forgets the attempt when `forget`, and
    /// stops.
    pub(super) async fn ack_and_stop(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        forget: bool,
    ) -> Result<(), AttemptError> {
        state.phase = Phase::Settling;
        if let Some(input) = &state.input {
            crate::worker::publish::ack_confirmed(input)
                .await
                .map_err(|source| {
                    // Its consumer may be gone (and made again, its delivery counts started
                    // over): inputs are checked until a new baseline is taken.
                    self.baseline.invalidate();
                    AttemptError::Unconfirmed {
                        what: "input ack".into(),
                        source,
                    }
                })?;
        }
        state.heartbeat = None;
        // Acked: the slot is free for the next task while this actor winds down.
        state.slot = None;
        if forget {
            self.forget(state)?;
        }
        myself.stop(Some("finished".into()));
        Ok(())
    }

    /// Forgets the attempt's record (compacting the journal when due).
    pub(super) fn forget(&self, state: &AttemptState) -> Result<(), AttemptError> {
        let (record_seq, task_id) = (state.record_seq, state.task.task_id.to_string());
        journal_ops::lazy(&self.journal, |j| {
            j.forget(record_seq, &task_id).map(|_| ())
        })?;
        let counters = self.counters.clone();
        journal_ops::compact_when_due(&self.journal, self.compact_after, move || {
            counters.compactions.bump()
        });
        Ok(())
    }

    /// Forgets the record of a task attempt that is not parked (a parked attempt lives on
    /// until it is answered or cancelled).
    pub(super) fn forget_unless_parked(&self, state: &AttemptState) {
        let (record_seq, task_id) = (state.record_seq, state.task.task_id.to_string());
        let parked = journal_ops::lazy(&self.journal, |j| {
            Ok(j.lookup(record_seq, &task_id)
                .is_some_and(|r| r.task.is_some()))
        })
        .unwrap_or(true);
        if !parked {
            let _ = self.forget(state);
        }
    }

    /// A graceful shutdown's hand-back: the handler is cancelled and given `grace` to end
    /// (then dropped: an `--exec` process group is killed), and only then the input is nak'd
    /// without delay, so no other worker runs the task while this handler still does; its
    /// claim is released before the nak, so the worker that gets it runs it at once. The
    /// journal keeps the attempt: should the input come back here, the same attempt re-runs
    /// (flagged `rerun`); should another worker finish it, the next start-up's sweep forgets
    /// it. A resume's attempt stays parked (its answer comes back here).
    pub(super) async fn abandon(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        grace: Duration,
    ) {
        let _ = state.cancel.send(true);
        state.pending = None;
        if let Some(run) = state.run.take() {
            crate::background::join_within(run, grace).await;
        }
        state.heartbeat = None;
        self.release_claim(state).await;
        if let Some(input) = state.input.take() {
            if let Err(e) = input.ack_with(AckKind::Nak(None)).await {
                tracing::warn!(error = %ErrorChain(&*e), "cannot hand the input back; it is redelivered after the ack wait");
            }
            self.counters.handed_back.bump();
        }
        myself.stop(Some("handed back at shutdown".into()));
    }
}
