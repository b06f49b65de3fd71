//! The attempt actor: one per admitted task input, per resumed waiting attempt, and per cancel
//! of a waiting attempt; spawned linked to the worker (its supervisor). See [`Attempt`].

mod journal_ops;
mod publishing;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, AckKind};
use protocol::task::{
    build_result, expired_result, is_expired, is_rerun, judge_answer, on_delivery, Answer,
    AnswerVerdict, AttemptId, AttemptView, CancelStatus, ChannelState, ControlRequest,
    DeliveryPlan, JournalView, Outcome, QueryReply, StatusEvent, Suspend, TaskResult, TaskSpec,
    TaskState,
};
use protocol::{MessageId, WireError, WorkerId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{watch, OwnedSemaphorePermit};

pub(crate) use journal_ops::Parked;
pub use journal_ops::SavedResult;

use super::handler::{AttemptContext, TaskHandler};
use super::publish::PendingPublish;
use super::slots::Slots;
use super::WorkerCounters;
use crate::background::Owned;
use crate::fault::{self, FaultPoint};
use crate::journal::{Journal, JournalError};

/// How long a handler runs before its attempt sends the acceptance status on its own; an
/// attempt that changes state sooner sends the acceptance with that state change (one ingress
/// message for a short task).
pub const ACCEPTANCE_DELAY: Duration = Duration::from_millis(20);
/// The journal is compacted (rewritten with its open attempts only) once this many attempts
/// were forgotten since the last compaction, so that a long-running worker's log stays small.
pub const COMPACT_AFTER: usize = 4096;
/// How long a graceful shutdown gives a cancelled handler to end after its input was handed
/// back (then it is dropped: an `--exec` process group is killed).
pub const ABANDON_GRACE: Duration = Duration::from_secs(1);
/// Delay of the nak of an input whose task channel could not be read before running it.
pub const UNREAD_CHANNEL_RETRY: Duration = Duration::from_secs(2);

/// The attempt actor's configuration. The contract of a task input, in order:
///
/// 1. heartbeat: `+WPI` (progress) on the input every third of its consumer's ack wait, from
///    `pre_start` until the final ack;
/// 2. admission in the journal, keyed by the input's sequence and task id;
/// 3. unless the journal saved a result: a read of the task channel, the shared record of
///    every attempt ([`ChannelView`](protocol::task::ChannelView)); [`on_delivery`] decides:
///    republish a saved result, ack without running (a final result is stored, or another
///    attempt waits for an answer), re-run the same attempt flagged `rerun`, or start a fresh
///    one (flagged `rerun` when another attempt started it);
/// 4. a `task_accepted` status event (seq 0) through the ingress, once the handler has run for
///    [`ACCEPTANCE_DELAY`], or together with the first state change when that comes sooner;
/// 5. the handler runs (unless a result is saved, or `expires_at` passed: then the result is
///    `failed`, kind `expired`);
/// 6. the result is saved in the journal (fsync) *before* it is published (a too-large
///    result is replaced); a waiting result is parked with its task in the same fsync;
/// 7. the result is published with stable ids and its stream ack awaited; a publish whose
///    outcome is uncertain (no ack in time) is sent again with the same ids, not failed;
/// 8. only then the input is acked (double ack); a final result makes the journal forget the
///    attempt, a waiting one leaves it parked; the slot is freed and the actor stops.
///
/// A **resume** has the answer as its input (heartbeated and acked the same way) and a
/// [`Parked`] attempt: it takes a slot (before any new task), journals the answer, runs
/// [`TaskHandler::resume`] and goes on at step 6. A duplicate answer republishes the saved
/// result; an answer journalled by a resume that never finished re-runs the resume, flagged
/// `rerun`. A **cancel** of a parked attempt saves and publishes a `cancelled` result.
#[derive(Clone)]
pub(crate) struct Attempt {
    /// Actor name (`<worker name>.attempt.<task id>`), also the fault-injection key.
    pub name: String,
    /// The connection.
    pub client: async_nats::Client,
    /// This worker.
    pub worker_id: WorkerId,
    /// The shared journal.
    pub journal: Arc<Mutex<Journal>>,
    /// Runs the task.
    pub handler: Arc<dyn TaskHandler>,
    /// The ack wait of the consumer the input came from (the heartbeat runs at a third).
    pub ack_wait: Duration,
    /// The stream holding task channels.
    pub tasks_stream: String,
    /// Compact the journal once this many attempts were forgotten ([`COMPACT_AFTER`]).
    pub compact_after: usize,
    /// Counters shared with the worker.
    pub counters: Arc<WorkerCounters>,
    /// The worker's slots (a resume takes one).
    pub slots: Arc<Slots>,
}

/// What an attempt is started with.
pub(crate) enum AttemptArgs {
    /// A task input of the work stream.
    Task {
        /// The input (acked at the end).
        msg: jetstream::Message,
        /// Its stream sequence (the journal key, with the task id).
        seq: u64,
        /// The decoded task.
        task: TaskSpec,
        /// The slot the fetch loop took for it: released as soon as the input is acked.
        slot: OwnedSemaphorePermit,
    },
    /// An answer for a parked attempt.
    Resume {
        /// The answer message (acked at the end).
        msg: jetstream::Message,
        /// The parked attempt.
        parked: Box<Parked>,
        /// The decoded answer.
        answer: Answer,
    },
    /// A cancel of a parked attempt (no input message).
    CancelParked(Box<Parked>),
}

/// Messages of an attempt.
pub(crate) enum AttemptMsg {
    /// The handler (or a resume) returned.
    Finished(Outcome),
    /// The handler has run for [`ACCEPTANCE_DELAY`]: send the acceptance if still due.
    SendAcceptance,
    /// An answer arrived while this attempt runs: its verdict (a running attempt never takes
    /// an answer itself; the worker resumes parked attempts).
    Judge(Answer, RpcReplyPort<AnswerVerdict>),
    /// Cancel the attempt (replies with its state and the cancel status).
    Cancel(ControlRequest, RpcReplyPort<QueryReply>),
    /// The attempt's state; an error when the request does not name this attempt.
    Query(ControlRequest, RpcReplyPort<Result<QueryReply, WireError>>),
    /// A graceful shutdown: hand the input back (nak, no delay), cancel the handler, stop.
    Abandon,
}

/// What `post_start` does.
enum Start {
    Task,
    Resume(Answer),
    CancelParked,
}

/// Mutable state of an attempt.
pub(crate) struct AttemptState {
    /// The message heartbeated and acked at the end (none for a cancel of a parked attempt).
    input: Option<jetstream::Message>,
    /// The journal key.
    record_seq: u64,
    task: TaskSpec,
    attempt_id: AttemptId,
    rerun: bool,
    start: Option<Start>,
    saved: Option<SavedResult>,
    /// The sequence of the last result published (or due) for this attempt: each result gets
    /// the next one, so that a cancel of a waiting attempt does not reuse the waiting
    /// result's `Nats-Msg-Id`.
    last_seq: u32,
    heartbeat: Option<Owned>,
    /// The concurrency slot.
    slot: Option<OwnedSemaphorePermit>,
    /// The acceptance status while it is not sent yet (see [`ACCEPTANCE_DELAY`]).
    acceptance: Option<StatusEvent>,
    /// The acceptance status once sent, until its ack is awaited with the result's.
    accepted: Option<PendingPublish>,
    /// Whether the last state change went out in a bundle with the acceptance (a republish
    /// then sends the same bundle, so that the ingress deduplicates it).
    bundled_acceptance: bool,
    run: Option<Owned>,
    /// The attempt's span, a child of the task's trace (from the input's headers).
    span: tracing::Span,
    cancel: watch::Sender<bool>,
    state: TaskState,
    suspend: Option<Suspend>,
    answers: Vec<Answer>,
    answered: BTreeSet<MessageId>,
}

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The journal refused.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A publish or an ack was not confirmed; the input is left unacked.
    #[error("{what} not confirmed")]
    Unconfirmed {
        /// What was not confirmed.
        what: String,
        /// Why.
        #[source]
        source: super::publish::PublishError,
    },
    /// A fault injected by a test.
    #[error(transparent)]
    Fault(#[from] fault::FaultError),
}

/// A fresh random-enough attempt id (time, pid, a counter and a random hasher seed).
pub fn fresh_attempt_id() -> AttemptId {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(now_nanos());
    h.write_u32(std::process::id());
    let a = h.finish();
    h.write_u64(a);
    let b = h.finish();
    AttemptId::new(format!("{a:016x}{b:016x}")).expect("hex is a valid attempt id")
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    (now_nanos() / 1_000_000) as u64
}

/// The state-change sequence before the next result of an attempt that has journalled
/// `answers` and no saved result. An attempt's state changes are numbered: its first result
/// is 1; the resume by answer `k` publishes its `running` status as `2k` and its result as
/// `2k + 1`, so a resume interrupted and run again reuses the same ids.
fn seq_before_result(answers: usize) -> u32 {
    u32::try_from(answers)
        .map_or(u32::MAX / 2, |k| (2 * k).saturating_sub(1))
        .min(u32::MAX / 2)
}

#[ractor::async_trait]
impl Actor for Attempt {
    type Msg = AttemptMsg;
    type State = AttemptState;
    type Arguments = AttemptArgs;

    async fn pre_start(
        &self,
        _: ActorRef<AttemptMsg>,
        args: AttemptArgs,
    ) -> Result<AttemptState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let (input, record_seq, task, attempt_id, slot, start, saved, answers) = match args {
            AttemptArgs::Task {
                msg,
                seq,
                task,
                slot,
            } => (
                Some(msg),
                seq,
                task,
                fresh_attempt_id(),
                Some(slot),
                Start::Task,
                None,
                Vec::new(),
            ),
            AttemptArgs::Resume {
                msg,
                parked,
                answer,
            } => (
                Some(msg),
                parked.record_seq,
                parked.task,
                parked.attempt_id,
                None,
                Start::Resume(answer),
                parked.saved,
                parked.answers,
            ),
            AttemptArgs::CancelParked(parked) => (
                None,
                parked.record_seq,
                parked.task,
                parked.attempt_id,
                None,
                Start::CancelParked,
                parked.saved,
                parked.answers,
            ),
        };
        // (1) heartbeat from admission on.
        let heartbeat = input.clone().map(|msg| {
            let counters = self.counters.clone();
            let period = (self.ack_wait / 3).max(Duration::from_millis(50));
            Owned::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match msg.ack_with(AckKind::Progress).await {
                        Ok(()) => counters.heartbeats.bump(),
                        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                    }
                }
            })
        });
        let (cancel, _) = watch::channel(false);
        let state = saved
            .as_ref()
            .map_or(TaskState::Running, |s| s.result.state);
        Ok(AttemptState {
            span: tracing::Span::none(),
            input,
            record_seq,
            task,
            rerun: false,
            attempt_id,
            start: Some(start),
            last_seq: saved
                .as_ref()
                .map_or_else(|| seq_before_result(answers.len()), |s| s.seq),
            suspend: saved.as_ref().and_then(|s| s.result.suspend.clone()),
            saved,
            heartbeat,
            slot,
            acceptance: None,
            accepted: None,
            bundled_acceptance: false,
            run: None,
            cancel,
            state,
            answered: answers.iter().map(|a| a.message_id.clone()).collect(),
            answers,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), ActorProcessingErr> {
        match state.start.take() {
            Some(Start::Task) => self.start_task(&myself, state).await?,
            Some(Start::Resume(answer)) => self.start_resume(&myself, state, answer).await?,
            Some(Start::CancelParked) => {
                self.set_span(state);
                let result = build_result(
                    &state.task,
                    &state.attempt_id,
                    &self.worker_id,
                    Outcome::Cancelled,
                );
                self.save_and_publish(&myself, state, result).await?;
            }
            None => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), ActorProcessingErr> {
        state.heartbeat = None;
        let _ = state.cancel.send(true);
        state.run = None;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AttemptMsg>,
        msg: AttemptMsg,
        state: &mut AttemptState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AttemptMsg::Finished(outcome) => {
                state.run = None;
                // A cancel that raced with a normal finish: the handler's outcome stands.
                let result = build_result(&state.task, &state.attempt_id, &self.worker_id, outcome);
                self.save_and_publish(&myself, state, result).await?;
            }
            AttemptMsg::Judge(answer, reply) => {
                let _ = reply.send(judge_answer(Some(&self.view(state)), &answer));
            }
            AttemptMsg::SendAcceptance => {
                if let Some(event) = state.acceptance.take() {
                    state.accepted = Some(self.send_acceptance(state, event).await?);
                }
            }
            AttemptMsg::Cancel(request, reply) => {
                let ids_match = self.names_me(state, &request);
                let status = protocol::task::cancel_status(state.state, ids_match);
                if status == CancelStatus::Requested {
                    let _ = state.cancel.send(true);
                    if state.run.is_none() {
                        // Nothing runs to notice the flag (waiting, about to park).
                        let _ = myself.cast(AttemptMsg::Finished(Outcome::Cancelled));
                    }
                }
                let _ = reply.send(QueryReply {
                    state: state.state,
                    active: true,
                    suspend: state.suspend.clone(),
                    cancel: Some(status),
                });
            }
            AttemptMsg::Query(request, reply) => {
                let answer = if self.names_me(state, &request) {
                    Ok(QueryReply {
                        state: state.state,
                        active: true,
                        suspend: state.suspend.clone(),
                        cancel: None,
                    })
                } else {
                    Err(AnswerVerdict::UnknownAttempt
                        .error()
                        .expect("unknown attempt is an error"))
                };
                let _ = reply.send(answer);
            }
            AttemptMsg::Abandon => {
                state.heartbeat = None;
                if let Some(input) = state.input.take() {
                    // Another worker takes it at once (not after the ack wait).
                    if let Err(e) = input.ack_with(AckKind::Nak(None)).await {
                        tracing::warn!(error = %e, "cannot hand the input back; it is redelivered after the ack wait");
                    }
                    self.counters.handed_back.bump();
                }
                let _ = state.cancel.send(true);
                if let Some(run) = state.run.take() {
                    run.join_within(ABANDON_GRACE).await;
                }
                myself.stop(Some("handed back at shutdown".into()));
            }
        }
        Ok(())
    }
}

impl Attempt {
    /// The acceptance status event of this attempt (seq 0; its id is stable).
    fn acceptance_event(&self, state: &AttemptState) -> StatusEvent {
        StatusEvent::new(
            state.task.task_id.clone(),
            state.attempt_id.clone(),
            self.worker_id.clone(),
            0,
            TaskState::Running,
            now_ms(),
        )
    }

    fn names_me(&self, state: &AttemptState, request: &ControlRequest) -> bool {
        request.task_id == state.task.task_id
            && request.attempt_id == state.attempt_id
            && request.worker_id == self.worker_id
    }

    fn view(&self, state: &AttemptState) -> AttemptView {
        AttemptView {
            task_id: state.task.task_id.clone(),
            attempt_id: state.attempt_id.clone(),
            worker_id: self.worker_id.clone(),
            state: state.state,
            tool_call_id: state.suspend.as_ref().map(|s| s.tool_call_id.clone()),
            answered: state.answered.clone(),
        }
    }

    fn context(&self, state: &AttemptState) -> AttemptContext {
        AttemptContext {
            task_id: state.task.task_id.clone(),
            attempt_id: state.attempt_id.clone(),
            worker_id: self.worker_id.clone(),
            rerun: state.rerun,
            cancelled: state.cancel.subscribe(),
        }
    }

    /// The attempt's span, a child of the trace in the input's headers.
    fn set_span(&self, state: &mut AttemptState) {
        let span = tracing::info_span!(
            "attempt",
            task_id = %state.task.task_id,
            attempt_id = %state.attempt_id,
            worker_id = %self.worker_id
        );
        crate::trace_context::set_parent_from(
            &span,
            state.input.as_ref().and_then(|m| m.headers.as_ref()),
        );
        state.span = span;
    }

    /// (2)–(5) for a task input: admission, the task channel, the plan.
    async fn start_task(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), AttemptError> {
        let seq = state.record_seq;
        let fresh = state.attempt_id.clone();
        let task_id = state.task.task_id.to_string();
        // Appended without a trip to the blocking pool: an admission is not fsync'd on its own
        // (the result's fsync covers it; see the journal's module docs).
        let (admission, journalled_answers) = journal_ops::lazy(&self.journal, move |j| {
            let admission = j.admit(seq, &task_id, fresh.as_str())?;
            let answers = j.lookup(seq).map(|r| r.answers.clone()).unwrap_or_default();
            Ok((admission, answers))
        })?;
        let saved: Option<SavedResult> = admission
            .result
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        state.attempt_id =
            AttemptId::new(&admission.attempt_id).unwrap_or(state.attempt_id.clone());
        let admitted = (!admission.new).then(|| state.attempt_id.clone());
        if !admission.new {
            self.counters.redelivered.bump();
        }
        // The task channel is the record every attempt writes to: read it before running.
        let channel = if saved.is_some() {
            ChannelState::Untouched
        } else {
            match self.read_channel(state, admitted.as_ref()).await {
                Some(channel) => channel,
                None => {
                    // Cannot tell whether the task ran elsewhere: neither run it nor drop it.
                    self.counters.fetch_errors.bump();
                    state.heartbeat = None;
                    if let Some(input) = state.input.take() {
                        let _ = input
                            .ack_with(AckKind::Nak(Some(UNREAD_CHANNEL_RETRY)))
                            .await;
                    }
                    myself.stop(Some("task channel unreadable".into()));
                    return Ok(());
                }
            }
        };
        let plan = on_delivery(JournalView {
            admitted: admitted.clone(),
            saved_result: saved.is_some(),
            expired: is_expired(state.task.expires_at, now_ms()),
            channel,
        });
        let answers: Vec<Answer> = journalled_answers
            .iter()
            .filter_map(|a| serde_json::from_value(a.payload.clone()).ok())
            .collect();
        state.answered = answers.iter().map(|a| a.message_id.clone()).collect();
        self.set_span(state);
        let delivered = state
            .input
            .as_ref()
            .and_then(|m| m.info().ok())
            .map(|i| u64::try_from(i.delivered).unwrap_or(1))
            .unwrap_or(1);
        state.rerun = is_rerun(
            admission.is_rerun(),
            delivered,
            channel == ChannelState::StartedElsewhere,
        );
        state.last_seq = saved
            .as_ref()
            .map_or_else(|| seq_before_result(answers.len()), |s| s.seq);
        state.saved = saved;
        state.answers = answers;
        state.acceptance = Some(self.acceptance_event(state));
        match plan {
            DeliveryPlan::RepublishSaved => {
                let saved = state.saved.clone().expect("plan says a result is saved");
                self.publish_saved(myself, state, saved).await?;
            }
            DeliveryPlan::Settled(why) => {
                tracing::info!(task_id = %state.task.task_id, ?why, "task settled by another attempt: acked without running");
                self.counters.settled.bump();
                state.acceptance = None;
                self.ack_and_stop(myself, state, true).await?;
            }
            DeliveryPlan::RerunSameAttempt { .. } | DeliveryPlan::FreshAttempt => {
                self.spawn_run(myself, state);
            }
            DeliveryPlan::Expire => {
                // Saved and published like any result; the handler never sees the task.
                self.counters.expired.bump();
                let result = expired_result(
                    state.task.task_id.clone(),
                    state.attempt_id.clone(),
                    self.worker_id.clone(),
                    state.task.expires_at.unwrap_or_default(),
                );
                self.save_and_publish(myself, state, result).await?;
            }
        }
        Ok(())
    }

    /// The channel's state for this attempt, read a few times if the read fails; `None` when
    /// it cannot be read.
    async fn read_channel(
        &self,
        state: &AttemptState,
        mine: Option<&AttemptId>,
    ) -> Option<ChannelState> {
        let js = jetstream::new(self.client.clone());
        for pause in [200, 400, 800] {
            match crate::task_channel::view(&js, &self.tasks_stream, &state.task.task_id).await {
                Ok(view) => return Some(view.state_for(mine)),
                Err(e) => {
                    tracing::warn!(task_id = %state.task.task_id, error = %e, "cannot read the task channel before running the task");
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            }
        }
        None
    }

    /// A resume: a slot first, then the answer journalled, then the handler.
    async fn start_resume(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        answer: Answer,
    ) -> Result<(), AttemptError> {
        self.set_span(state);
        self.counters.admitted.bump();
        let payload = serde_json::to_value(&answer).unwrap_or_default();
        let (record_seq, id) = (state.record_seq, answer.message_id.to_string());
        let fresh = journal_ops::durable(&self.journal, move |j| {
            j.record_answer(record_seq, &id, &payload)
        })
        .await?;
        if !fresh {
            if let Some(saved) = state.saved.clone() {
                // A duplicate: the saved result goes out again (same ids: deduplicated).
                self.counters.answers.bump();
                self.send_state_change(state, &saved, None, None).await?;
                return self.ack_and_stop(myself, state, false).await;
            }
            // Journalled by a resume that never finished (this worker crashed): resume again.
            state.rerun = true;
        } else {
            state.answers.push(answer.clone());
            state.answered.insert(answer.message_id.clone());
            self.counters.answers.bump();
        }
        self.counters.resumed.bump();
        // A resume runs a handler: it takes a slot, before any new task does.
        match self.slots.for_resume().await {
            Ok(slot) => state.slot = Some(slot),
            Err(_) => {
                myself.stop(Some("worker stopping".into()));
                return Ok(());
            }
        }
        // The resume is a state change of its own (`running`): readers of the task channel see
        // the question answered at once. Its ack is awaited with the result's.
        state.last_seq = seq_before_result(state.answers.len()).saturating_add(1);
        let resumed = StatusEvent::new(
            state.task.task_id.clone(),
            state.attempt_id.clone(),
            self.worker_id.clone(),
            state.last_seq,
            TaskState::Running,
            now_ms(),
        );
        state.accepted = Some(self.send_acceptance(state, resumed).await?);
        state.saved = None;
        state.suspend = None;
        self.spawn_run(myself, state);
        Ok(())
    }

    /// (5) runs the handler (or resumes it with the answers so far); the outcome comes back
    /// as [`AttemptMsg::Finished`].
    fn spawn_run(&self, myself: &ActorRef<AttemptMsg>, state: &mut AttemptState) {
        let handler = self.handler.clone();
        let task = state.task.clone();
        let ctx = self.context(state);
        let answers = state.answers.clone();
        let me = myself.clone();
        state.state = TaskState::Running;
        state.run = Some(Owned::spawn(async move {
            let run = async {
                if answers.is_empty() {
                    handler.run(task, ctx).await
                } else {
                    handler.resume(task, answers, ctx).await
                }
            };
            let mut run = std::pin::pin!(futures::FutureExt::catch_unwind(
                std::panic::AssertUnwindSafe(run)
            ));
            let finished = tokio::select! {
                finished = &mut run => finished,
                () = tokio::time::sleep(ACCEPTANCE_DELAY) => {
                    let _ = me.cast(AttemptMsg::SendAcceptance);
                    run.await
                }
            };
            let outcome = match finished {
                Ok(outcome) => outcome,
                Err(_) => Outcome::Failed("the task handler panicked".into()),
            };
            let _ = me.cast(AttemptMsg::Finished(outcome));
        }));
    }

    /// (6) saves `result` under the next state-change sequence (fsync; a waiting one parked
    /// with its task in the same fsync) *before* publishing it, then (7) and (8).
    async fn save_and_publish(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        result: TaskResult,
    ) -> Result<(), AttemptError> {
        let seq = state.last_seq.saturating_add(1);
        let waiting = result.state == TaskState::Waiting;
        let saved = SavedResult { seq, result };
        let value = serde_json::to_value(&saved).unwrap_or_default();
        let task = waiting.then(|| serde_json::to_value(&state.task).unwrap_or_default());
        let record_seq = state.record_seq;
        journal_ops::durable(&self.journal, move |j| {
            j.save_result(record_seq, &value)?;
            match task {
                Some(task) => j.park(record_seq, &task),
                None => Ok(()),
            }
        })
        .await?;
        fault::check(&self.name, FaultPoint::Handle)?;
        self.publish_saved(myself, state, saved).await
    }

    /// (7)+(8): publishes a saved result, then acks the input, forgets a final attempt (a
    /// waiting one stays parked) and stops. A publish not confirmed after its retries fails
    /// the actor *without* acking: the input is redelivered and the saved result republished.
    async fn publish_saved(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        saved: SavedResult,
    ) -> Result<(), AttemptError> {
        let (acceptance, accepted) = (state.acceptance.take(), state.accepted.take());
        state.bundled_acceptance = acceptance.is_some();
        if let Err(e) = self
            .send_state_change(state, &saved, acceptance, accepted)
            .await
        {
            state.heartbeat = None;
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
        } else {
            // A hint (no fsync of its own): lost, it only republishes a deduplicated result.
            let record_seq = state.record_seq;
            journal_ops::lazy(&self.journal, |j| j.mark_published(record_seq))?;
        }
        self.ack_and_stop(myself, state, final_state).await
    }

    /// Acks the input (a waiting result completes its delivery too), frees the slot, forgets
    /// the attempt when `forget`, and stops.
    async fn ack_and_stop(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        forget: bool,
    ) -> Result<(), AttemptError> {
        state.heartbeat = None;
        if let Some(input) = &state.input {
            super::publish::ack_confirmed(input)
                .await
                .map_err(|source| AttemptError::Unconfirmed {
                    what: "input ack".into(),
                    source,
                })?;
        }
        // Acked: the slot is free for the next task while this actor winds down.
        state.slot = None;
        if forget {
            let record_seq = state.record_seq;
            journal_ops::lazy(&self.journal, |j| j.forget(record_seq).map(|_| ()))?;
            let counters = self.counters.clone();
            journal_ops::compact_when_due(&self.journal, self.compact_after, move || {
                counters.compactions.bump()
            });
        }
        myself.stop(Some("finished".into()));
        Ok(())
    }
}
