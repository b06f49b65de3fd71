//! The attempt actor: one per admitted task input, spawned linked to the worker (its
//! supervisor). See [`Attempt`] for the contract.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, AckKind};
use protocol::subjects;
use protocol::task::{
    bundle_msg_id, expired_result, is_expired, is_rerun, judge_answer, on_delivery, result_msg_id,
    status_msg_id, too_large_result, Answer, AnswerVerdict, AttemptId, AttemptView, CancelStatus,
    ControlRequest, DeliveryPlan, JournalView, QueryReply, StatusEvent, Suspend, TaskChannelBody,
    TaskResult, TaskSpec, TaskState,
};
use protocol::{AgentId, MessageId, WireError, WireErrorKind, WorkerId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::handler::{AttemptContext, Outcome, TaskHandler};
use super::publish::{start_publish, start_publish_bundle, PendingPublish};
use super::WorkerCounters;
use crate::fault::{self, FaultPoint};
use crate::journal::Journal;

/// How long a handler runs before its attempt sends the acceptance status on its own; an
/// attempt that changes state sooner sends the acceptance with that state change (one ingress
/// message for a short task).
pub const ACCEPTANCE_DELAY: Duration = Duration::from_millis(20);
/// How long a result or status publish may wait for its stream ack.
pub const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// The journal is compacted (rewritten with its open attempts only) once this many attempts
/// were forgotten since the last compaction, so that a long-running worker's log stays small.
pub const COMPACT_AFTER: usize = 4096;
/// Room left under [`protocol::MAX_ENVELOPE_BYTES`] for the envelope meta the router adds.
pub const ENVELOPE_HEADROOM: usize = 4096;

/// The attempt actor's configuration. The contract, in order:
///
/// 1. heartbeat: `+WPI` (progress) on the input every `ack_wait / 3` from `pre_start` until
///    the final ack (stopped in `post_stop`);
/// 2. journal admission of the input sequence ([`on_delivery`] decides: republish a saved
///    result, re-run the same attempt flagged `rerun`, or start a fresh attempt);
/// 3. a `task_accepted` status event (seq 0) through the ingress, once the handler has run for
///    [`ACCEPTANCE_DELAY`], or together with the first state change when that comes sooner;
/// 4. the handler runs (unless a result is saved, or the task's `expires_at` has passed: then
///    the result is `failed` with error kind `expired` and the handler never sees the task);
/// 5. the result is saved in the journal (fsync) *before* it is published (a too-large
///    result is replaced by [`too_large_result`]); the fault point `Handle` of the attempt's
///    name is checked right after saving;
/// 6. the result envelope is published to `hub.pub.<worker>.task.<key>` with
///    `Nats-Msg-Id` = [`result_msg_id`] and its stream ack awaited (a duplicate counts);
/// 7. only then `mark_published`, the input is acked (double ack), the journal forgets the
///    attempt and the actor stops. A failed publish fails the actor *without* acking: the
///    input is redelivered after `ack_wait` and the saved result republished.
///
/// Waiting: the `waiting` result is published (steps 5–6) but the input stays unacked and
/// heartbeated while the attempt waits for its answer, so that a crash of this process
/// redelivers the input and the journal (admission + answers) restores the attempt. The cost
/// is one unacked input (and one concurrency slot) per waiting attempt.
#[derive(Clone)]
pub struct Attempt {
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
    /// The consumer's ack wait (the heartbeat runs at a third of it).
    pub ack_wait: Duration,
    /// Compact the journal once this many attempts were forgotten ([`COMPACT_AFTER`]).
    pub compact_after: usize,
    /// Counters shared with the worker.
    pub counters: Arc<WorkerCounters>,
}

/// What an attempt is started with.
pub struct AttemptArgs {
    /// The input message (acked at the end).
    pub msg: jetstream::Message,
    /// Its stream sequence (the journal key).
    pub seq: u64,
    /// The decoded task.
    pub task: TaskSpec,
    /// The worker's concurrency slot this attempt holds: released as soon as the input is
    /// acked (or the attempt ends otherwise), so that the next task is fetched without
    /// waiting for this actor to stop.
    pub slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Messages of an attempt.
pub enum AttemptMsg {
    /// The handler (or a resume) returned.
    Finished(Outcome),
    /// An answer for this attempt; replies with the verdict once it is journalled (the
    /// answer message can then be acked).
    Answer(Answer, RpcReplyPort<AnswerVerdict>),
    /// The handler has run for [`ACCEPTANCE_DELAY`]: send the acceptance if still due.
    SendAcceptance,
    /// Cancel the attempt (replies with its state and the cancel status).
    Cancel(ControlRequest, RpcReplyPort<QueryReply>),
    /// The attempt's state; an error when the request does not name this attempt.
    Query(ControlRequest, RpcReplyPort<Result<QueryReply, WireError>>),
}

/// What the journal holds as an attempt's saved result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedResult {
    /// The state-change sequence the result was published under ([`result_msg_id`]).
    pub seq: u32,
    /// The result.
    pub result: TaskResult,
}

/// Mutable state of an attempt.
pub struct AttemptState {
    msg: jetstream::Message,
    seq: u64,
    task: TaskSpec,
    attempt_id: AttemptId,
    rerun: bool,
    plan: DeliveryPlan,
    saved: Option<SavedResult>,
    /// The sequence of the last result published (or due) for this attempt: each result gets
    /// the next one, so that a cancel of a waiting attempt does not reuse the waiting
    /// result's `Nats-Msg-Id`.
    last_seq: u32,
    heartbeat: Option<AbortOnDrop>,
    /// The concurrency slot (see [`AttemptArgs::slot`]).
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The acceptance status while it is not sent yet (see [`ACCEPTANCE_DELAY`]).
    acceptance: Option<StatusEvent>,
    /// The acceptance status once sent, until its ack is awaited with the result's.
    accepted: Option<PendingPublish>,
    /// Whether the last state change went out in a bundle with the acceptance (a republish
    /// then sends the same bundle, so that the ingress deduplicates it).
    bundled_acceptance: bool,
    run: Option<AbortOnDrop>,
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
    #[error("journal: {0}")]
    Journal(String),
    /// A publish was not confirmed; the input is left unacked.
    #[error("publish of {what} not confirmed: {reason}")]
    Publish {
        /// What was published.
        what: String,
        /// Why.
        reason: String,
    },
    /// An id could not be built.
    #[error("invalid id: {0}")]
    Id(String),
}

/// A task aborted when this guard is dropped: an actor's state is dropped however the
/// actor ends (a failed actor gets no `post_stop`), so its tasks never outlive it.
#[derive(Debug)]
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A fresh random-enough attempt id (time, pid, a counter and a random hasher seed).
pub fn fresh_attempt_id() -> AttemptId {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64;
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

/// Runs a journal operation: its appends are written here, under the journal's lock (a
/// `write` into the page cache each), and its durable records are fsync'd by the journal's
/// syncer thread after the lock is released, so that attempts finishing together share one
/// fsync (group commit). The records are durable when this returns.
pub(crate) async fn with_journal<T>(
    journal: &Arc<Mutex<Journal>>,
    op: impl FnOnce(&mut Journal) -> Result<T, crate::journal::JournalError>,
) -> Result<T, AttemptError> {
    let (out, token, dir) = {
        let mut guard = journal.lock().unwrap_or_else(|e| e.into_inner());
        let (out, token) = guard.deferring(op);
        (out, token, guard.dir().to_path_buf())
    };
    if let Some(token) = token {
        token.synced().await.map_err(|source| {
            AttemptError::Journal(
                crate::journal::JournalError::Io { path: dir, source }.to_string(),
            )
        })?;
    }
    out.map_err(|e| AttemptError::Journal(e.to_string()))
}

/// Runs a journal operation that appends no durable record (`published`, `done`) right here:
/// such an append is one `write` into the page cache, cheaper than a trip to the blocking pool.
pub(crate) fn journal_lazy<T>(
    journal: &Arc<Mutex<Journal>>,
    op: impl FnOnce(&mut Journal) -> Result<T, crate::journal::JournalError>,
) -> Result<T, AttemptError> {
    let mut guard = journal.lock().unwrap_or_else(|e| e.into_inner());
    op(&mut guard).map_err(|e| AttemptError::Journal(e.to_string()))
}

/// The result of `outcome`, replaced by [`too_large_result`] when its envelope would exceed
/// [`protocol::MAX_ENVELOPE_BYTES`] minus [`ENVELOPE_HEADROOM`].
pub fn build_result(
    task: &TaskSpec,
    attempt_id: &AttemptId,
    worker: &WorkerId,
    outcome: Outcome,
) -> TaskResult {
    let mut result = TaskResult {
        task_id: task.task_id.clone(),
        attempt_id: attempt_id.clone(),
        worker_id: worker.clone(),
        state: TaskState::Completed,
        response: None,
        error: None,
        suspend: None,
        answer_route: None,
    };
    match outcome {
        Outcome::Completed(response) => result.response = Some(response),
        Outcome::Failed(reason) => {
            result.state = TaskState::Failed;
            result.error = Some(WireError::new(WireErrorKind::Internal, reason));
        }
        Outcome::Waiting {
            question,
            tool_call_id,
        } => {
            result.state = TaskState::Waiting;
            result.suspend = Some(Suspend {
                question,
                tool_call_id,
            });
            result.answer_route = AgentId::new(worker.as_str())
                .ok()
                .map(|me| subjects::answer_ingress(&me, worker));
        }
        Outcome::Cancelled => result.state = TaskState::Cancelled,
    }
    let size = serde_json::to_vec(&TaskChannelBody::Result(result.clone()))
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if protocol::task::result_too_large(
        size,
        protocol::MAX_ENVELOPE_BYTES.saturating_sub(ENVELOPE_HEADROOM),
    ) {
        return too_large_result(task.task_id.clone(), attempt_id.clone(), worker.clone());
    }
    result
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
        let AttemptArgs {
            msg,
            seq,
            task,
            slot,
        } = args;
        // (a) heartbeat from admission on.
        let heartbeat = {
            let msg = msg.clone();
            let counters = self.counters.clone();
            let period = (self.ack_wait / 3).max(Duration::from_millis(50));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match msg.ack_with(AckKind::Progress).await {
                        Ok(()) => {
                            counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                    }
                }
            })
        };
        // (b) admission happens in `post_start`, off the worker's critical path (spawning an
        // actor waits for its `pre_start`; the journal's fsync must not serialize admissions).
        let (cancel, _) = watch::channel(false);
        Ok(AttemptState {
            span: tracing::Span::none(),
            msg,
            seq,
            task,
            rerun: false,
            attempt_id: fresh_attempt_id(),
            plan: DeliveryPlan::FreshAttempt,
            last_seq: 0,
            saved: None,
            heartbeat: Some(AbortOnDrop(heartbeat)),
            slot,
            acceptance: None,
            accepted: None,
            bundled_acceptance: false,
            run: None,
            cancel,
            state: TaskState::Running,
            suspend: None,
            answers: Vec::new(),
            answered: BTreeSet::new(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), ActorProcessingErr> {
        self.admit(state).await?;
        // (c) acceptance: due now, sent once the handler has run for ACCEPTANCE_DELAY, or with
        // the first state change if that comes sooner (one ingress message for a short task).
        state.acceptance = Some(self.acceptance_event(state));
        match &state.plan {
            DeliveryPlan::RepublishSaved => {
                let saved = state.saved.clone().expect("plan says a result is saved");
                self.publish_saved(&myself, state, saved).await?;
            }
            DeliveryPlan::RerunSameAttempt { .. } | DeliveryPlan::FreshAttempt => {
                self.spawn_run(&myself, state);
            }
            DeliveryPlan::Expire => {
                // Saved and published like any result; the handler never sees the task.
                self.counters.expired.fetch_add(1, Ordering::Relaxed);
                let result = expired_result(
                    state.task.task_id.clone(),
                    state.attempt_id.clone(),
                    self.worker_id.clone(),
                    state.task.expires_at.unwrap_or_default(),
                );
                self.save_and_publish(&myself, state, result).await?;
            }
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
            AttemptMsg::Answer(answer, reply) => {
                let view = AttemptView {
                    task_id: state.task.task_id.clone(),
                    attempt_id: state.attempt_id.clone(),
                    worker_id: self.worker_id.clone(),
                    state: state.state,
                    tool_call_id: state.suspend.as_ref().map(|s| s.tool_call_id.clone()),
                    answered: state.answered.clone(),
                };
                let mut verdict = judge_answer(Some(&view), &answer);
                if verdict == AnswerVerdict::Resume {
                    let payload = serde_json::to_value(&answer)?;
                    let (input_seq, id) = (state.seq, answer.message_id.to_string());
                    let fresh = with_journal(&self.journal, move |j| {
                        j.record_answer(input_seq, &id, &payload)
                    })
                    .await?;
                    if fresh {
                        state.answered.insert(answer.message_id.clone());
                        state.answers.push(answer);
                        state.state = TaskState::Running;
                        state.suspend = None;
                        self.spawn_run(&myself, state);
                    } else {
                        verdict = AnswerVerdict::Duplicate;
                    }
                }
                if verdict == AnswerVerdict::Duplicate {
                    // Republish the saved state change (same ids: the streams deduplicate).
                    if let Some(saved) = state.saved.clone() {
                        let acceptance = state
                            .bundled_acceptance
                            .then(|| self.acceptance_event(state));
                        self.send_state_change(state, &saved, acceptance, None)
                            .await?;
                    }
                }
                let _ = reply.send(verdict);
            }
            AttemptMsg::SendAcceptance => {
                if let Some(event) = state.acceptance.take() {
                    let msg_id = status_msg_id(&event.event_id);
                    state.accepted = Some(
                        start_publish(
                            &self.client,
                            &self.worker_id,
                            &state.task.task_id,
                            &msg_id,
                            &TaskChannelBody::Status(event),
                            Some(&state.span),
                        )
                        .await?,
                    );
                }
            }
            AttemptMsg::Cancel(request, reply) => {
                let ids_match = self.names_me(state, &request);
                let status = protocol::task::cancel_status(state.state, ids_match);
                if status == CancelStatus::Requested {
                    let _ = state.cancel.send(true);
                    if state.run.is_none() {
                        // Waiting: nothing runs to notice the flag.
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

    /// Compacts the journal on the blocking pool once `compact_after` attempts were
    /// forgotten (checked again under the lock, so concurrent finishers compact once).
    fn compact_when_due(&self) {
        let every = self.compact_after.max(1);
        let due = journal_lazy(&self.journal, |j| {
            Ok(j.forgotten_since_compaction() >= every)
        })
        .unwrap_or(false);
        if !due {
            return;
        }
        let (journal, counters) = (self.journal.clone(), self.counters.clone());
        tokio::task::spawn_blocking(move || {
            let mut j = journal.lock().unwrap_or_else(|e| e.into_inner());
            if j.forgotten_since_compaction() < every {
                return;
            }
            match j.compact() {
                Ok(()) => {
                    counters.compactions.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "journal compaction failed; retried later"),
            }
        });
    }

    fn names_me(&self, state: &AttemptState, request: &ControlRequest) -> bool {
        request.task_id == state.task.task_id
            && request.attempt_id == state.attempt_id
            && request.worker_id == self.worker_id
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

    /// (d) runs the handler (or resumes it with the answers so far) on a task; the outcome
    /// comes back as [`AttemptMsg::Finished`].
    fn spawn_run(&self, myself: &ActorRef<AttemptMsg>, state: &mut AttemptState) {
        let handler = self.handler.clone();
        let task = state.task.clone();
        let ctx = self.context(state);
        let answers = state.answers.clone();
        let me = myself.clone();
        state.state = TaskState::Running;
        state.run = Some(AbortOnDrop(tokio::spawn(async move {
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
        })));
    }

    /// (b) Records the admission in the journal (or finds the earlier one) and decides what to
    /// do with this delivery.
    async fn admit(&self, state: &mut AttemptState) -> Result<(), AttemptError> {
        let seq = state.seq;
        let fresh = state.attempt_id.clone();
        let task_id = state.task.task_id.to_string();
        // Appended here without a trip to the blocking pool: an admission is not fsync'd on its
        // own (the result's fsync covers it; see the journal's module docs).
        let (admission, journalled_answers) = journal_lazy(&self.journal, move |j| {
            let admission = j.admit(seq, &task_id, fresh.as_str())?;
            let answers = j.lookup(seq).map(|r| r.answers.clone()).unwrap_or_default();
            Ok((admission, answers))
        })?;
        let saved: Option<SavedResult> = admission
            .result
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let attempt_id =
            AttemptId::new(&admission.attempt_id).map_err(|e| AttemptError::Id(e.to_string()))?;
        let plan = on_delivery(JournalView {
            admitted: (!admission.new).then(|| attempt_id.clone()),
            saved_result: saved.is_some(),
            expired: is_expired(state.task.expires_at, now_ms()),
        });
        if !admission.new {
            self.counters.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        let answers: Vec<Answer> = journalled_answers
            .iter()
            .filter_map(|a| serde_json::from_value(a.payload.clone()).ok())
            .collect();
        state.answered = answers.iter().map(|a| a.message_id.clone()).collect();
        let span = tracing::info_span!(
            "attempt",
            task_id = %state.task.task_id,
            attempt_id = %attempt_id,
            worker_id = %self.worker_id
        );
        crate::trace_context::set_parent_from(&span, state.msg.headers.as_ref());
        state.span = span;
        let delivered = state
            .msg
            .info()
            .map(|i| u64::try_from(i.delivered).unwrap_or(1))
            .unwrap_or(1);
        state.rerun = is_rerun(admission.is_rerun(), delivered);
        state.last_seq = saved.as_ref().map_or_else(
            || u32::try_from(answers.len()).unwrap_or(u32::MAX / 2),
            |s| s.seq,
        );
        state.attempt_id = attempt_id;
        state.plan = plan;
        state.saved = saved;
        state.answers = answers;
        Ok(())
    }

    /// (e) saves `result` under the next state-change sequence (fsync) *before* publishing it,
    /// then (f)+(g).
    async fn save_and_publish(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        result: TaskResult,
    ) -> Result<(), ActorProcessingErr> {
        let seq = state.last_seq.saturating_add(1);
        let saved = SavedResult { seq, result };
        let value = serde_json::to_value(&saved)?;
        let input_seq = state.seq;
        with_journal(&self.journal, move |j| j.save_result(input_seq, &value)).await?;
        fault::check(&self.name, FaultPoint::Handle)?;
        self.publish_saved(myself, state, saved).await?;
        Ok(())
    }

    /// Sends the status event of the state change of `saved` and `saved` itself (one bundle,
    /// or two messages for a result too large to share an envelope), and awaits their stream
    /// acks together with `accepted`'s (the acceptance sent before the handler ran). The ids
    /// are stable, so sending the same state change again is deduplicated.
    async fn send_state_change(
        &self,
        state: &AttemptState,
        saved: &SavedResult,
        acceptance: Option<StatusEvent>,
        accepted: Option<PendingPublish>,
    ) -> Result<(), AttemptError> {
        // One status event per state change, with a stable id (the result's seq), stored
        // before the result so that a tracker that stops at the final result has seen it.
        let event = StatusEvent::new(
            state.task.task_id.clone(),
            state.attempt_id.clone(),
            self.worker_id.clone(),
            saved.seq.max(1),
            saved.result.state,
            now_ms(),
        );
        let msg_id = result_msg_id(&state.task.task_id, &state.attempt_id, saved.seq);
        let (task_id, worker, span) = (&state.task.task_id, &self.worker_id, &state.span);
        let status_id = status_msg_id(&event.event_id);
        let status = TaskChannelBody::Status(event);
        let result = TaskChannelBody::Result(saved.result.clone());
        // The acceptance, when still due, goes first.
        let acceptance = acceptance.map(|event| {
            (
                status_msg_id(&event.event_id),
                TaskChannelBody::Status(event),
            )
        });
        let mut items: Vec<(&str, &TaskChannelBody)> = Vec::with_capacity(3);
        if let Some((id, body)) = &acceptance {
            items.push((id, body));
        }
        items.push((&status_id, &status));
        items.push((&msg_id, &result));
        // One ingress message (a bundle the router stores as separate messages), or one per
        // item when the result is too large to share an envelope.
        let bundle = start_publish_bundle(
            &self.client,
            worker,
            task_id,
            &bundle_msg_id(task_id, &state.attempt_id, saved.seq, acceptance.is_some()),
            &items,
            Some(span),
        )
        .await?;
        let mut pending = Vec::with_capacity(items.len());
        match bundle {
            Some(bundle) => pending.push(bundle),
            None => {
                for (id, body) in &items {
                    pending.push(
                        start_publish(&self.client, worker, task_id, id, body, Some(span)).await?,
                    );
                }
            }
        }
        if let Some(accepted) = accepted {
            accepted.confirmed().await?;
        }
        for publish in pending {
            publish.confirmed().await?;
        }
        Ok(())
    }

    /// (f)+(g): publishes a saved result; on a final one, marks it published, acks the input,
    /// forgets the attempt and stops.
    async fn publish_saved(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        saved: SavedResult,
    ) -> Result<(), AttemptError> {
        let (acceptance, accepted) = (state.acceptance.take(), state.accepted.take());
        state.bundled_acceptance = acceptance.is_some();
        let confirmed = self
            .send_state_change(state, &saved, acceptance, accepted)
            .await;
        if let Err(e) = confirmed {
            // Not acked: the input comes back after ack_wait and the saved result (and the
            // status events, same ids) are published again.
            state.heartbeat = None;
            return Err(e);
        }
        // Crash tests: the result is stored, its input not acked yet.
        fault::check(&self.name, FaultPoint::ResultConfirmed).map_err(|e| {
            AttemptError::Publish {
                what: "result".into(),
                reason: e.to_string(),
            }
        })?;
        let input_seq = state.seq;
        state.state = saved.result.state;
        state.suspend = saved.result.suspend.clone();
        let final_state = saved.result.state.is_final();
        state.last_seq = state.last_seq.max(saved.seq);
        state.saved = Some(saved);
        if !final_state {
            // A hint (no fsync of its own); a final result is followed by `forget` instead.
            journal_lazy(&self.journal, |j| j.mark_published(input_seq))?;
            return Ok(());
        }
        match state.state {
            TaskState::Completed => &self.counters.completed,
            TaskState::Cancelled => &self.counters.cancelled,
            _ => &self.counters.failed,
        }
        .fetch_add(1, Ordering::Relaxed);
        state.heartbeat = None;
        if let Err(e) = state.msg.double_ack().await {
            // Not acked: the input comes back and the saved result is republished (dedup).
            return Err(AttemptError::Publish {
                what: "input ack".into(),
                reason: e.to_string(),
            });
        }
        // Acked: the slot is free for the next task while this actor winds down.
        state.slot = None;
        journal_lazy(&self.journal, |j| j.forget(input_seq).map(|_| ()))?;
        self.compact_when_due();
        myself.stop(Some("finished".into()));
        Ok(())
    }
}
