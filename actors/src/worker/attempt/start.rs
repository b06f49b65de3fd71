//! How an attempt starts. A task input republishes a saved result, or reads its task's record
//! (task channel, then ingress) off the mailbox and acts on the plan; a resume journals its
//! answer and waits for a slot off the mailbox; a settle publishes a parked attempt's final
//! result.

use std::time::Duration;

use async_nats::jetstream;
use protocol::error_chain::ErrorChain;
use protocol::task::{
    expired_result, is_expired, is_rerun, on_delivery, Answer, AttemptId, ChannelState,
    DeliveryPlan, JournalView, Outcome, TaskState,
};
use ractor::ActorRef;

use super::{
    journal_ops, now_ms, seq_before_result, Attempt, AttemptError, AttemptMsg, AttemptState, Phase,
    Streams, RETRY_DELAY,
};

/// How many times a parked attempt's settle publish is tried (it has no input to come back
/// with: a worker restart tries again, see the worker's start-up sweep).
const SETTLE_TRIES: u32 = 5;
/// The pause after the `n`-th failed settling try: 0.5 s, doubling.
const SETTLE_BACKOFF: crate::supervision::Backoff = crate::supervision::Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(8),
    factor: 2,
    reset_after: None,
};

impl Attempt {
    /// (3) for a task input: a saved result is republished; otherwise the task's record is
    /// read off the mailbox, and [`AttemptMsg::Planned`] brings the plan.
    pub(super) async fn start_task(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        new: bool,
    ) -> Result<(), AttemptError> {
        state.fresh_admission = new;
        if !new {
            self.counters.redelivered.bump();
        }
        if let Some(saved) = state.saved.clone() {
            return self.publish_saved(myself, state, saved).await;
        }
        let input = state.input.as_ref();
        let info = input.and_then(|m| m.info().ok());
        let facts = protocol::task::InputFacts {
            fresh_admission: new,
            delivered: info
                .as_ref()
                .map_or(1, |i| u64::try_from(i.delivered).unwrap_or(1)),
            flagged: input
                .and_then(|m| m.headers.as_ref())
                .is_some_and(|h| h.get(protocol::headers::HUB_CHECK).is_some()),
            seq: info.map_or(state.record_seq, |i| i.stream_sequence),
            baseline_last_seq: self.baseline.current().map(|mark| mark.last_seq),
        };
        if !protocol::task::must_read_channel(&facts) {
            // A first delivery of an input stored after the baseline: nothing of it can have
            // run before, and its channel holds nothing of another attempt.
            self.counters.unread.bump();
            return self
                .on_planned(myself, state, Some(ChannelState::Untouched))
                .await;
        }
        // A first delivery of a fresh admission has no earlier attempt whose result could be
        // waiting in the ingress, unless the channel shows one started.
        let redelivered = !facts.fresh_admission || facts.delivered > 1;
        self.spawn_read(myself, state, redelivered);
        Ok(())
    }

    /// Reads the task's record off the mailbox ([`read_record`]); [`AttemptMsg::Planned`]
    /// brings it.
    pub(super) fn spawn_read(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        redelivered: bool,
    ) {
        state.record_read = true;
        let js = jetstream::new(self.client.clone());
        let streams = self.streams.clone();
        let (task_id, mine) = (state.task.task_id.clone(), state.attempt_id.clone());
        let delegator = state.channel.delegator.clone();
        let me = myself.clone();
        state.pending = Some(crate::background::spawn(async move {
            let channel =
                read_record(&js, &streams, &delegator, &task_id, &mine, redelivered).await;
            let _ = me.cast(AttemptMsg::Planned(channel));
        }));
    }

    /// The task's record has been read: run it, settle it, expire it, or leave it (unread).
    pub(super) async fn on_planned(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        channel: Option<ChannelState>,
    ) -> Result<(), AttemptError> {
        let Some(channel) = channel else {
            // Cannot tell whether the task ran elsewhere: neither run it nor drop it.
            self.counters.fetch_errors.bump();
            self.stand_down(myself, state, RETRY_DELAY * 2, "task channel unreadable")
                .await;
            return Ok(());
        };
        if state.cancel_requested() {
            return self.finish(myself, state, Outcome::Cancelled).await;
        }
        let admitted = (!state.fresh_admission).then(|| state.attempt_id.clone());
        let plan = on_delivery(JournalView {
            admitted: admitted.clone(),
            saved_result: false,
            expired: is_expired(state.task.expires_at, now_ms()),
            channel,
        });
        let delivered = state
            .input
            .as_ref()
            .and_then(|m| m.info().ok())
            .map(|i| u64::try_from(i.delivered).unwrap_or(1))
            .unwrap_or(1);
        state.rerun = is_rerun(
            admitted.is_some(),
            delivered,
            channel == ChannelState::StartedElsewhere,
        );
        self.act_on(myself, state, plan).await
    }

    /// Acts on `plan`: a run or an expired result waits for the claim first
    /// ([`Attempt::take_claim`]).
    pub(super) async fn act_on(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        plan: DeliveryPlan,
    ) -> Result<(), AttemptError> {
        match plan {
            DeliveryPlan::RerunSameAttempt { .. }
            | DeliveryPlan::FreshAttempt
            | DeliveryPlan::Expire
                if !state.claimed =>
            {
                self.take_claim(myself, state, plan);
                Ok(())
            }
            DeliveryPlan::Settled(why) => {
                tracing::info!(task_id = %state.task.task_id, ?why, "task settled by another attempt: acked without running");
                self.counters.settled.bump();
                self.ack_and_stop(myself, state, true).await
            }
            DeliveryPlan::RerunSameAttempt { .. } | DeliveryPlan::FreshAttempt => {
                state.acceptance = Some(self.acceptance_event(state));
                self.begin_run(myself, state).await
            }
            DeliveryPlan::Expire => {
                // Saved and published like any result; the handler never sees the task.
                self.counters.expired.bump();
                state.acceptance = Some(self.acceptance_event(state));
                let result = expired_result(
                    state.task.task_id.clone(),
                    state.attempt_id.clone(),
                    self.worker_id.clone(),
                    state.task.expires_at.unwrap_or_default(),
                );
                self.save_and_publish(myself, state, result).await
            }
            DeliveryPlan::RepublishSaved => {
                // Not planned here: a saved result is republished before any read.
                myself.stop(Some("nothing to do".into()));
                Ok(())
            }
        }
    }

    /// Starts the handler. A run with answers (a resume, or one interrupted and run again) is
    /// a state change of its own: its `running` status goes out first (its ack is awaited
    /// with the result's), under the sequence numbering of [`seq_before_result`].
    pub(super) async fn begin_run(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), AttemptError> {
        if !state.answers.is_empty() {
            let seq = seq_before_result(state.answers.len()).saturating_add(1);
            state.last_seq = seq;
            state.acceptance = None;
            let resumed = self.status_event(state, seq, TaskState::Running);
            state.accepted = Some(self.send_status(state, resumed).await?);
        }
        self.spawn_run(myself, state);
        Ok(())
    }

    /// A resume: the answer journalled, then a slot (off the mailbox: [`AttemptMsg::SlotReady`]
    /// starts the handler). A duplicate answer republishes the saved result instead.
    pub(super) async fn start_resume(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        answer: Answer,
    ) -> Result<(), AttemptError> {
        let payload = serde_json::to_value(&answer).unwrap_or_default();
        let (record_seq, task_id, id) = (
            state.record_seq,
            state.task.task_id.to_string(),
            answer.message_id.to_string(),
        );
        let fresh = journal_ops::durable(&self.journal, move |j| {
            j.record_answer(record_seq, &task_id, &id, &payload)
        })
        .await?;
        self.counters.answers.bump();
        if !fresh {
            if let Some(saved) = state.saved.clone() {
                // A duplicate: the saved result goes out again (same ids: deduplicated). A
                // final one (its first ack was lost) closes the record now.
                state.phase = Phase::Settling;
                self.send_state_change(state, &saved, None, None).await?;
                let final_state = saved.result.state.is_final();
                return self.ack_and_stop(myself, state, final_state).await;
            }
            // Journalled by a resume that never finished (this worker crashed): resume again.
            state.rerun = true;
        } else {
            state.answered.insert(answer.message_id.clone());
            state.answers.push(answer);
        }
        self.counters.resumed.bump();
        state.saved = None;
        state.suspend = None;
        state.state = TaskState::Running;
        let (slots, me) = (self.slots.clone(), myself.clone());
        state.pending = Some(crate::background::spawn(async move {
            if let Ok(slot) = slots.for_resume().await {
                let _ = me.cast(AttemptMsg::SlotReady(slot));
            }
        }));
        Ok(())
    }

    /// Settles a parked attempt (no input): republishes a final result it saved earlier, or
    /// publishes its `cancelled` result, and forgets it. A try that fails is tried again after
    /// a pause (0.5 s, doubling; [`SETTLE_TRIES`] in all) brought by
    /// [`AttemptMsg::Settle`], so that the mailbox (queries, cancels) is served meanwhile; no
    /// input brings it back otherwise (the next start-up's sweep does).
    pub(super) async fn settle_parked(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        cancel: bool,
    ) -> Result<(), AttemptError> {
        state.settle_tries += 1;
        // A try that saved the cancelled result and failed to publish it is tried again with
        // the same state-change sequence, so the same ids.
        let saved_final = state.saved.clone().filter(|s| s.result.state.is_final());
        let settled = match saved_final {
            Some(saved) => self.publish_saved(myself, state, saved).await,
            None if cancel => self.finish(myself, state, Outcome::Cancelled).await,
            None => {
                myself.stop(Some("nothing to settle".into()));
                return Ok(());
            }
        };
        match settled {
            Err(e) if state.settle_tries < SETTLE_TRIES => {
                let pause = SETTLE_BACKOFF.delay(state.settle_tries);
                tracing::warn!(task_id = %state.task.task_id, error = %ErrorChain(&e), ?pause, "settling a parked attempt failed; trying again");
                let me = myself.clone();
                state.pending = Some(crate::background::spawn(async move {
                    tokio::time::sleep(pause).await;
                    let _ = me.cast(AttemptMsg::Settle { cancel });
                }));
                Ok(())
            }
            other => other,
        }
    }
}

/// What the task's record says for a delivery to attempt `mine`: the task channel, and — when
/// it shows no final result nor another attempt's question, and either the input was
/// delivered before (`redelivered`) or the channel shows another attempt started — the task
/// channel messages still in the ingress (a result stored but not routed yet). Read a few
/// times when a read fails; `None` when it cannot be read.
async fn read_record(
    js: &jetstream::Context,
    streams: &Streams,
    delegator: &protocol::AgentId,
    task_id: &protocol::TaskId,
    mine: &AttemptId,
    redelivered: bool,
) -> Option<ChannelState> {
    let direct = crate::task_channel::Reader::Direct(streams.tasks.clone());
    // Pauses before the second and third tries.
    for pause in [0, 200, 400] {
        if pause > 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        // Most tasks arrive to an empty channel: a probe of its last message says so more
        // cheaply than a read.
        let read = match crate::task_channel::is_empty(js, &streams.tasks, delegator, task_id).await
        {
            Ok(true) => Ok(protocol::task::ChannelView::default()),
            Ok(false) => crate::task_channel::view(js, &direct, delegator, task_id).await,
            Err(e) => Err(e),
        };
        match read {
            Ok(mut view) => {
                let state = view.state_for(Some(mine));
                let earlier_attempt = redelivered || state == ChannelState::StartedElsewhere;
                if matches!(state, ChannelState::Finished | ChannelState::Parked)
                    || !earlier_attempt
                {
                    return Some(state);
                }
                match crate::task_channel::unrouted(js, &streams.ingress, delegator, task_id).await
                {
                    Ok(bodies) => {
                        for body in &bodies {
                            view.observe(body);
                        }
                        return Some(view.state_for(Some(mine)));
                    }
                    Err(e) => {
                        tracing::warn!(%task_id, error = %ErrorChain(&e), "cannot read the ingress for the task's unrouted results")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%task_id, error = %ErrorChain(&e), "cannot read the task channel before running the task")
            }
        }
    }
    None
}
