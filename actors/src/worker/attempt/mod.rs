//! The attempt actor: one per admitted task input, per resumed waiting attempt, and per parked
//! attempt to settle (cancel, or republish a final result); spawned linked to the worker (its
//! supervisor). See [`Attempt`]. `start`: how it starts; `publishing`: its publishes;
//! `ending`: how it saves, publishes, acks and stops (or hands its input back).

mod claiming;
mod ending;
mod journal_ops;
mod publishing;
mod start;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, AckKind};
use protocol::error_chain::ErrorChain;
use protocol::subjects::TaskChannel;
use protocol::task::{
    judge_answer, Answer, AnswerVerdict, AttemptId, AttemptView, CancelStatus, ChannelState,
    ControlRequest, Outcome, QueryReply, StatusEvent, Suspend, TaskSpec, TaskState,
};
use protocol::{AgentId, MessageId, WireError, WorkerId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{watch, OwnedSemaphorePermit};

pub use journal_ops::SavedResult;
pub(crate) use journal_ops::{saved_of, Parked};

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
/// Delay of the nak of an input that could not be settled here (its task channel unreadable,
/// its result not confirmed): it comes back soon, here or on another worker.
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// The attempt actor's configuration. The contract of a task input, in order:
///
/// 1. (the worker) admission in the journal, keyed by the input's sequence and task id;
/// 2. heartbeat: `+WPI` (progress) on the input every third of its consumer's ack wait, from
///    `pre_start` until the ack is confirmed;
/// 3. unless the journal saved a result: a read of the task channel, the shared record of
///    every attempt, and of the ingress for results not routed yet
///    ([`ChannelView`](protocol::task::ChannelView)), off the actor's mailbox (queries and
///    cancels are answered meanwhile); [`on_delivery`](protocol::task::on_delivery) decides:
///    republish a saved result, ack without running (a final result is stored, or another
///    attempt waits for an answer), re-run the same attempt flagged `rerun`, or start a fresh
///    one (flagged `rerun` when another attempt started it); the read is skipped for an
///    input that is provably fresh ([`must_read_channel`](protocol::task::must_read_channel));
/// 4. before it runs the handler (or publishes an expired result), the claim: the attempt
///    takes the task in `HUB_CLAIMS` ([`crate::task_claim`]), off the mailbox, and renews it
///    with the heartbeats; a claim held by another attempt makes it stand down (after one
///    read of the task channel, if it was skipped): the input is nak'd until the claim lapses;
/// 5. a `task_accepted` status event (seq 0), once the handler has run for
///    [`ACCEPTANCE_DELAY`], or together with the first state change when that comes sooner;
/// 6. the handler runs (unless a result is saved, or `expires_at` passed: then the result is
///    `failed`, kind `expired`; or a cancel came first: then it is `cancelled`);
/// 7. the result is saved in the journal (fsync) *before* it is published (a too-large
///    result is replaced); a waiting result is parked with its task in the same fsync;
/// 8. the result is published with stable ids and its stream acks awaited; a publish that is
///    not confirmed is sent again with the same ids (four tries, each waiting up to 2.5 s per
///    stream ack); one that never
///    is fails the attempt *without* acking, after a nak with a short delay;
/// 9. only then the input is acked (double ack, while still heartbeating); a final result
///    makes the journal forget the attempt, a waiting one leaves it parked; the slot is freed
///    and the actor stops.
///
/// A **resume** has the answer as its input (heartbeated and acked the same way) and a
/// [`Parked`] attempt: it journals the answer, waits for a slot (before any new task; off the
/// mailbox), publishes a `running` status and runs [`TaskHandler::resume`], then goes on at
/// step 7. A duplicate answer republishes the saved result; an answer journalled by a resume
/// that never finished re-runs the resume, flagged `rerun`. A **settle** of a parked attempt
/// (no input) publishes its `cancelled` result, or republishes a final result saved earlier,
/// and forgets it.
#[derive(Clone)]
pub(crate) struct Attempt {
    /// Actor name (`<worker name>.attempt.<delegator>.<task id>`), also the fault-injection
    /// key.
    pub name: String,
    /// The connection.
    pub client: async_nats::Client,
    /// This worker.
    pub worker_id: WorkerId,
    /// The shared journal.
    pub journal: Arc<Mutex<Journal>>,
    /// Runs the task.
    pub handler: Arc<dyn TaskHandler>,
    /// The current ack wait of the consumer the input came from (the heartbeat runs at a
    /// third of it and follows its changes); none without an input.
    pub ack_wait: Option<super::ack_waits::AckWait>,
    /// The streams the task's record is read from before it runs.
    pub streams: Streams,
    /// Compact the journal once this many attempts were forgotten ([`COMPACT_AFTER`]).
    pub compact_after: usize,
    /// Counters shared with the worker.
    pub counters: Arc<WorkerCounters>,
    /// The worker's slots (a resume takes one).
    pub slots: Arc<Slots>,
    /// The worker's work stream baseline: an input stored after it, delivered once, runs
    /// without its task channel being read; a refused input ack drops it.
    pub baseline: Arc<crate::epoch::Baseline<crate::epoch::WorkMark>>,
}

/// The streams an attempt reads a task's record from.
#[derive(Debug, Clone)]
pub(crate) struct Streams {
    /// The task channels (the router's `tasks.name`).
    pub tasks: String,
    /// The ingress (results published but not routed yet).
    pub ingress: String,
}

/// What an attempt is started with.
pub(crate) enum AttemptArgs {
    /// A task input of the work stream, admitted by the worker.
    Task {
        /// The input (acked at the end).
        msg: jetstream::Message,
        /// Its stream sequence (the journal key, with the task id).
        seq: u64,
        /// The decoded task.
        task: TaskSpec,
        /// Who delegated it (the router's stamp on the input): its task channel's owner.
        delegator: AgentId,
        /// The attempt (the admission's, as the worker's running set knows it).
        attempt_id: AttemptId,
        /// The journal's admission of it.
        admission: crate::journal::Admission,
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
    /// Settle a parked attempt (no input message): publish its `cancelled` result (`cancel`),
    /// or republish the final result it saved.
    Settle {
        /// The parked attempt.
        parked: Box<Parked>,
        /// Cancel it (else only a final result saved earlier is republished).
        cancel: bool,
    },
}

impl AttemptArgs {
    /// Who delegated the task the attempt runs.
    pub fn delegator(&self) -> &AgentId {
        match self {
            AttemptArgs::Task { delegator, .. } => delegator,
            AttemptArgs::Resume { parked, .. } | AttemptArgs::Settle { parked, .. } => {
                &parked.delegator
            }
        }
    }
}

/// Messages of an attempt.
pub(crate) enum AttemptMsg {
    /// What the task channel (and the ingress) say about the task: `None` when unreadable.
    Planned(Option<ChannelState>),
    /// Whether the task's claim was taken ([`crate::task_claim::take`]).
    Claimed(Result<crate::task_claim::Taken, crate::task_claim::ClaimError>),
    /// The resume got its slot.
    SlotReady(OwnedSemaphorePermit),
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
    /// A graceful shutdown: cancel the handler, let it end (bounded), then hand the input back
    /// (nak, no delay) and stop.
    Abandon(Duration),
    /// Settle again after a failed try (see `settle_parked`).
    Settle {
        /// Cancel it (else only republish a final result saved earlier).
        cancel: bool,
    },
}

/// Where an attempt is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the task's record, or waiting for a slot.
    Starting,
    /// The handler runs.
    Running,
    /// A result is being saved, published or acked (or the actor is stopping).
    Settling,
}

/// What `post_start` does.
enum Start {
    Task { new: bool },
    Resume(Answer),
    Settle { cancel: bool },
}

/// Mutable state of an attempt.
pub(crate) struct AttemptState {
    /// The message heartbeated and acked at the end (none when settling a parked attempt).
    input: Option<jetstream::Message>,
    /// The journal key: the sequence of the task input that started the attempt (with the
    /// task id).
    record_seq: u64,
    task: TaskSpec,
    /// The task's channel, `channel.task.<delegator>.<task id>` (the delegator is the
    /// router's stamp on the input).
    channel: TaskChannel,
    attempt_id: AttemptId,
    rerun: bool,
    start: Option<Start>,
    /// An answer resumes a parked attempt (it waits for a slot while `Starting`).
    resume: bool,
    /// The worker's admission of this input was new (nothing journalled before).
    fresh_admission: bool,
    phase: Phase,
    saved: Option<SavedResult>,
    /// The sequence of the last state change published (or due) for this attempt: each result
    /// gets the next one, so that a cancel of a waiting attempt does not reuse the waiting
    /// result's `Nats-Msg-Id`.
    last_seq: u32,
    heartbeat: Option<Owned>,
    /// The concurrency slot.
    slot: Option<OwnedSemaphorePermit>,
    /// The acceptance status while it is not sent yet (see [`ACCEPTANCE_DELAY`]).
    acceptance: Option<StatusEvent>,
    /// A status sent on its own (the acceptance, or a resume's `running`), until its ack is
    /// awaited with the result's.
    accepted: Option<PendingPublish>,
    /// The task's record being read, or the slot waited for (off the mailbox).
    pending: Option<Owned>,
    run: Option<Owned>,
    /// The attempt's span, a child of the task's trace (from the input's headers).
    span: tracing::Span,
    cancel: watch::Sender<bool>,
    state: TaskState,
    suspend: Option<Suspend>,
    answers: Vec<Answer>,
    answered: BTreeSet<MessageId>,
    /// Tries of a settle so far.
    settle_tries: u32,
    /// The task channel was read for this delivery (not skipped as provably fresh).
    record_read: bool,
    /// The plan acted on once the claim is taken.
    planned: Option<protocol::task::DeliveryPlan>,
    /// The claim is this attempt's.
    claimed: bool,
    /// The claim's renewals (with the input's heartbeats).
    lease: Option<Owned>,
    /// The claim's revision as last written by this attempt; 0 when it holds none (not
    /// taken, or lost to another attempt). Shared with the renewals.
    claim_revision: Arc<std::sync::atomic::AtomicU64>,
}

impl AttemptState {
    fn cancel_requested(&self) -> bool {
        *self.cancel.borrow()
    }
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

/// What an attempt starts from, whatever brought it: its input (none when settling a parked
/// attempt), the journal record it is kept under, its task and ids, its slot (a new task's),
/// how it starts, and what the journal saved of it.
struct Admitted {
    input: Option<jetstream::Message>,
    record_seq: u64,
    task: TaskSpec,
    delegator: AgentId,
    attempt_id: AttemptId,
    slot: Option<OwnedSemaphorePermit>,
    start: Start,
    saved: Option<SavedResult>,
    answers: Vec<Answer>,
}

impl Attempt {
    /// What `args` start the attempt from (a new task's answers and saved result are read from
    /// its journal record).
    fn admitted(&self, args: AttemptArgs) -> Admitted {
        match args {
            AttemptArgs::Task {
                msg,
                seq,
                task,
                delegator,
                attempt_id,
                admission,
                slot,
            } => {
                let answers = {
                    let journal = self.journal.lock().unwrap_or_else(|e| e.into_inner());
                    journal
                        .lookup(seq, task.task_id.as_str())
                        .map(journal_ops::answers_of)
                        .unwrap_or_default()
                };
                let saved = admission
                    .result
                    .as_ref()
                    .and_then(|v| serde_json::from_value(v.clone()).ok());
                Admitted {
                    input: Some(msg),
                    record_seq: seq,
                    task,
                    delegator,
                    attempt_id,
                    slot: Some(slot),
                    start: Start::Task { new: admission.new },
                    saved,
                    answers,
                }
            }
            AttemptArgs::Resume {
                msg,
                parked,
                answer,
            } => Admitted {
                input: Some(msg),
                record_seq: parked.record_seq,
                task: parked.task,
                delegator: parked.delegator,
                attempt_id: parked.attempt_id,
                slot: None,
                start: Start::Resume(answer),
                saved: parked.saved,
                answers: parked.answers,
            },
            AttemptArgs::Settle { parked, cancel } => Admitted {
                input: None,
                record_seq: parked.record_seq,
                task: parked.task,
                delegator: parked.delegator,
                attempt_id: parked.attempt_id,
                slot: None,
                start: Start::Settle { cancel },
                saved: parked.saved,
                answers: parked.answers,
            },
        }
    }
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
        let Admitted {
            input,
            record_seq,
            task,
            delegator,
            attempt_id,
            slot,
            start,
            saved,
            answers,
        } = self.admitted(args);
        // (2) heartbeat from admission on.
        let heartbeat = input
            .clone()
            .zip(self.ack_wait.clone())
            .map(|(msg, ack_wait)| {
                let counters = self.counters.clone();
                crate::background::spawn(super::ack_waits::heartbeat(ack_wait, move || {
                    let (msg, counters) = (msg.clone(), counters.clone());
                    async move {
                        match msg.ack_with(AckKind::Progress).await {
                            Ok(()) => counters.heartbeats.bump(),
                            Err(e) => tracing::warn!(error = %ErrorChain(&*e), "heartbeat failed"),
                        }
                    }
                }))
            });
        let (cancel, _) = watch::channel(false);
        let state = saved
            .as_ref()
            .map_or(TaskState::Running, |s| s.result.state);
        let resume = matches!(start, Start::Resume(_));
        Ok(AttemptState {
            resume,
            fresh_admission: false,
            span: tracing::Span::none(),
            input,
            record_seq,
            channel: TaskChannel::of(&delegator, &task.task_id),
            task,
            rerun: false,
            attempt_id,
            start: Some(start),
            phase: Phase::Starting,
            last_seq: saved
                .as_ref()
                .map_or_else(|| seq_before_result(answers.len()), |s| s.seq),
            suspend: saved.as_ref().and_then(|s| s.result.suspend.clone()),
            saved,
            heartbeat,
            slot,
            acceptance: None,
            accepted: None,
            pending: None,
            run: None,
            cancel,
            state,
            answered: answers.iter().map(|a| a.message_id.clone()).collect(),
            answers,
            settle_tries: 0,
            record_read: false,
            planned: None,
            claimed: false,
            lease: None,
            claim_revision: Arc::default(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AttemptMsg>,
        state: &mut AttemptState,
    ) -> Result<(), ActorProcessingErr> {
        self.set_span(state);
        match state.start.take() {
            Some(Start::Task { new }) => self.start_task(&myself, state, new).await?,
            Some(Start::Resume(answer)) => self.start_resume(&myself, state, answer).await?,
            Some(Start::Settle { cancel }) => self.settle_parked(&myself, state, cancel).await?,
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
        state.lease = None;
        let _ = state.cancel.send(true);
        state.pending = None;
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
            AttemptMsg::Planned(channel) => {
                state.pending = None;
                if state.phase == Phase::Starting {
                    self.on_planned(&myself, state, channel).await?;
                }
            }
            AttemptMsg::Claimed(taken) => {
                state.pending = None;
                if state.phase == Phase::Starting {
                    self.on_claimed(&myself, state, taken).await?;
                }
            }
            AttemptMsg::SlotReady(slot) => {
                state.pending = None;
                state.slot = Some(slot);
                if state.phase == Phase::Starting {
                    if state.cancel_requested() {
                        self.finish(&myself, state, Outcome::Cancelled).await?;
                    } else {
                        self.begin_run(&myself, state).await?;
                    }
                }
            }
            AttemptMsg::Finished(outcome) => {
                state.run = None;
                state.pending = None;
                if state.phase != Phase::Settling {
                    self.finish(&myself, state, outcome).await?;
                }
            }
            AttemptMsg::Judge(answer, reply) => {
                let _ = reply.send(judge_answer(Some(&self.view(state)), &answer));
            }
            AttemptMsg::SendAcceptance => {
                if let Some(event) = state.acceptance.take() {
                    state.accepted = Some(self.send_status(state, event).await?);
                }
            }
            AttemptMsg::Cancel(request, reply) => {
                let ids_match = self.names_me(state, &request);
                let status = protocol::task::cancel_status(state.state, ids_match);
                if status == CancelStatus::Requested {
                    let _ = state.cancel.send(true);
                    // A resume waiting for its slot is cancelled without running; a running
                    // handler sees the cancel and returns.
                    if state.phase == Phase::Starting && state.resume {
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
            AttemptMsg::Abandon(grace) => self.abandon(&myself, state, grace).await,
            AttemptMsg::Settle { cancel } => {
                state.pending = None;
                self.settle_parked(&myself, state, cancel).await?;
            }
        }
        Ok(())
    }
}

impl Attempt {
    /// The acceptance status event of this attempt (seq 0; its id is stable).
    fn acceptance_event(&self, state: &AttemptState) -> StatusEvent {
        self.status_event(state, 0, TaskState::Running)
    }

    fn status_event(&self, state: &AttemptState, seq: u32, to: TaskState) -> StatusEvent {
        StatusEvent::new(
            state.task.task_id.clone(),
            state.attempt_id.clone(),
            self.worker_id.clone(),
            seq,
            to,
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

    /// (5) runs the handler (or resumes it with the answers so far); the outcome comes back
    /// as [`AttemptMsg::Finished`].
    fn spawn_run(&self, myself: &ActorRef<AttemptMsg>, state: &mut AttemptState) {
        let handler = self.handler.clone();
        let task = state.task.clone();
        let ctx = self.context(state);
        let answers = state.answers.clone();
        let me = myself.clone();
        state.state = TaskState::Running;
        state.phase = Phase::Running;
        state.run = Some(crate::background::spawn(async move {
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
}
