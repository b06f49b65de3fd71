//! What a worker does with answers and control requests.
//!
//! **Answers.** The worker that published a waiting result owns that attempt: the result
//! names it, its journal parks the attempt with its task, and its answer consumer gets the
//! answers. An answer is judged ([`judge_answer`]) against the attempt it names:
//!
//! - the running attempt it names judges it itself; an answer it cannot take (it is not
//!   waiting) is stale, and a redelivery of the answer a resume holds as its input is left to
//!   that resume; an answer for a parked attempt while another attempt of the same task runs
//!   here is judged again shortly;
//! - a parked attempt: a fresh answer (or a duplicate) starts a resume attempt with the
//!   answer as its input;
//! - a stale answer, or one for an attempt this worker does not own, is refused with an error
//!   result on the task channel ([`AnswerRefusal`]) and acked; never nak'd in a loop. When the
//!   task has a final result already, the refusal is not published (the task channel ends with
//!   its final result) and the answer is acked.
//!
//! **Control requests** (query, cancel) are answered by the running attempt, else from the
//! journal: a parked attempt reports `waiting`, `active: false`, and a cancel of it publishes
//! a `cancelled` result. Answers, queries and cancels are routed by (task id, attempt id).
//! Replies go only to reply subjects under the worker's reply prefix (`_INBOX` by default),
//! or to those the broker made for a request from another account
//! ([`subjects::is_answerable_reply`]).
//!
//! **Who may act.** Only the task's delegator, or an admin ([`may_control`]): a query or
//! cancel names its requester in its subject (`hub.ctl.<worker>.<kind>.<requester>`, which
//! only the requester may publish on a rendered config; the admin form names none), and an
//! answer's requester is its stamped sender. Anyone else gets an `unauthorized` error: a
//! control reply, or for an answer a refusal on the answerer's own channel of the task
//! (`channel.task.<answerer>.<task id>`), never on the delegator's.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use protocol::error_chain::ErrorChain;
use protocol::subjects::{self, ControlKind};
use protocol::task::{
    judge_answer, may_control, Answer, AnswerRefusal, AnswerVerdict, AttemptView, ControlRequest,
    QueryReply, Requester, TaskState, NOT_DELEGATOR,
};
use protocol::{AgentId, WireError, WireErrorKind};
use ractor::ActorRef;

use super::attempt::{AttemptArgs, AttemptMsg, Parked};
use super::publish;
use super::running::Input;
use super::{Worker, WorkerMsg, WorkerState, ATTEMPT_CALL_TIMEOUT};

/// The nak delay of an answer for an attempt about to park (it is judged again then).
pub const ANSWER_RETRY_DELAY: Duration = Duration::from_millis(250);

impl Worker {
    pub(super) async fn on_answer(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        msg: jetstream::Message,
        ack_wait: super::ack_waits::AckWait,
    ) {
        let (seq, delivered) = msg
            .info()
            .map(|i| (i.stream_sequence, i.delivered))
            .unwrap_or((0, 1));
        // A first delivery at a held sequence is another answer (the stream made again).
        if state.running.holds(Input::Answer(seq)) && delivered > 1 {
            // The resume holding this answer heartbeats and acks it.
            state.counters.redelivered_while_running.bump();
            return;
        }
        if state.draining {
            // Left for the next incarnation (the answer consumer is this worker's own).
            state.requests.spawn(async move {
                let _ = msg.ack_with(AckKind::Nak(None)).await;
            });
            return;
        }
        let answer = super::decode_envelope(&msg)
            .map_err(|e| ErrorChain(&e).to_string())
            .and_then(|env| match env.meta.from {
                Some(from) => serde_json::from_value::<Answer>(env.body)
                    .map(|answer| (from, answer))
                    .map_err(|e| e.to_string()),
                None => Err("an answer without its sender's stamp".to_owned()),
            });
        let (answerer, answer) = match answer {
            Ok(decoded) => decoded,
            Err(reason) => {
                state.counters.answers_refused.bump();
                tracing::warn!(%reason, "undecodable answer terminated");
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            }
        };
        // Answers are routed by (task, attempt): the attempt running now, a parked one, or none.
        let running = state
            .running
            .by_attempt(&answer.task_id, &answer.attempt_id)
            .map(|r| (r.actor.clone(), r.delegator.clone()));
        let parked = {
            let journal = state.journal.lock().unwrap_or_else(|e| e.into_inner());
            Parked::find(
                &journal,
                answer.task_id.as_str(),
                answer.attempt_id.as_str(),
            )
        };
        // Only the task's delegator answers it (answers carry no admin form).
        let delegator = match (&running, &parked) {
            (Some((_, delegator)), _) => Some(delegator),
            (_, Some(parked)) => Some(&parked.delegator),
            _ => None,
        };
        if delegator.is_some_and(|d| !may_control(Requester::Identity(&answerer), Some(d))) {
            state.counters.unauthorized.bump();
            state.counters.answers_refused.bump();
            let (client, worker) = (self.client.clone(), self.worker_id.clone());
            state.requests.spawn(async move {
                refuse(
                    &client,
                    &worker,
                    &answerer,
                    &msg,
                    &answer,
                    AnswerVerdict::NotDelegator,
                )
                .await;
            });
            return;
        }
        // Another attempt of the parked attempt's task runs here now (its actor has the task's
        // name).
        let other_runs = parked.as_ref().is_some_and(|p| {
            state
                .running
                .by_task(&p.delegator, &answer.task_id)
                .is_some()
        });
        match (running.map(|(actor, _)| actor), parked) {
            (Some(actor), _) => self.judge_running(state, actor, msg, answerer, answer),
            (None, Some(_)) if other_runs => {
                // Another attempt of the task runs here now (its actor has the task's name):
                // the parked one is resumed once it is done.
                let _ = msg.ack_with(AckKind::Nak(Some(ANSWER_RETRY_DELAY))).await;
            }
            (_, parked) => {
                let verdict = judge_answer(
                    parked.as_ref().map(|p| self.parked_view(p)).as_ref(),
                    &answer,
                );
                match (verdict, parked) {
                    (AnswerVerdict::Resume | AnswerVerdict::Duplicate, Some(parked)) => {
                        let input = Input::Answer(seq);
                        let args = AttemptArgs::Resume {
                            msg,
                            parked: Box::new(parked.clone()),
                            answer,
                        };
                        self.spawn_attempt(
                            myself,
                            state,
                            &parked.task.task_id,
                            parked.attempt_id.clone(),
                            Some((input, ack_wait)),
                            args,
                        )
                        .await;
                    }
                    (verdict, _) => self.refuse_answer(state, msg, answerer, answer, verdict),
                }
            }
        }
    }

    /// Asks the running attempt `actor` to judge an answer it is named by: a duplicate is
    /// acked, a stale one refused; one it would take (it is waiting, about to park) is judged
    /// again shortly.
    fn judge_running(
        &self,
        state: &mut WorkerState,
        actor: ActorRef<AttemptMsg>,
        msg: jetstream::Message,
        answerer: AgentId,
        answer: Answer,
    ) {
        let (client, worker) = (self.client.clone(), self.worker_id.clone());
        let counters = state.counters.clone();
        state.requests.spawn(async move {
            let verdict = actor
                .call(
                    |reply| AttemptMsg::Judge(answer.clone(), reply),
                    Some(ATTEMPT_CALL_TIMEOUT),
                )
                .await;
            match verdict {
                Ok(ractor::rpc::CallResult::Success(AnswerVerdict::Duplicate)) => {
                    counters.answers.bump();
                    let _ = publish::ack_confirmed(&msg).await;
                }
                Ok(ractor::rpc::CallResult::Success(
                    verdict @ (AnswerVerdict::Stale | AnswerVerdict::UnknownAttempt),
                )) => {
                    counters.answers_refused.bump();
                    refuse(&client, &worker, &answerer, &msg, &answer, verdict).await;
                }
                // Resume: it is waiting and about to park; or it went away meanwhile.
                _ => {
                    let _ = msg.ack_with(AckKind::Nak(Some(ANSWER_RETRY_DELAY))).await;
                }
            }
        });
    }

    /// Refuses an answer on the answerer's channel of its task (unless that channel has a
    /// final result: then the answer is only acked), in a request task.
    fn refuse_answer(
        &self,
        state: &mut WorkerState,
        msg: jetstream::Message,
        answerer: AgentId,
        answer: Answer,
        verdict: AnswerVerdict,
    ) {
        state.counters.answers_refused.bump();
        let (client, worker) = (self.client.clone(), self.worker_id.clone());
        let refused = if verdict == AnswerVerdict::Stale {
            AnswerVerdict::Stale
        } else {
            AnswerVerdict::UnknownAttempt
        };
        let tasks_stream = state.streams.tasks.clone();
        state.requests.spawn(async move {
            // Nothing follows a final result on a task channel: a late answer to a finished
            // task is only acked.
            let js = jetstream::new(client.clone());
            let reader = crate::task_channel::Reader::Direct(tasks_stream);
            let finished = crate::task_channel::view(&js, &reader, &answerer, &answer.task_id)
                .await
                .is_ok_and(|v| v.final_result.is_some());
            if finished {
                tracing::info!(task_id = %answer.task_id, "answer for a finished task acked");
                let _ = publish::ack_confirmed(&msg).await;
            } else {
                refuse(&client, &worker, &answerer, &msg, &answer, refused).await;
            }
        });
    }

    /// The view of a parked attempt for [`judge_answer`].
    fn parked_view(&self, parked: &Parked) -> AttemptView {
        let waiting = parked
            .saved
            .as_ref()
            .filter(|s| s.result.state == TaskState::Waiting);
        AttemptView {
            task_id: parked.task.task_id.clone(),
            attempt_id: parked.attempt_id.clone(),
            worker_id: self.worker_id.clone(),
            // A parked attempt without a saved result had its resume interrupted: only the
            // answer that resumed it (a duplicate) goes on with it.
            state: waiting.map_or(TaskState::Running, |s| s.result.state),
            tool_call_id: waiting
                .and_then(|s| s.result.suspend.as_ref())
                .map(|s| s.tool_call_id.clone()),
            answered: parked
                .answers
                .iter()
                .map(|a| a.message_id.clone())
                .collect(),
        }
    }

    pub(super) async fn on_control(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        kind: ControlKind,
        msg: async_nats::Message,
    ) {
        let Some(reply) = self.checked_reply(&msg, state) else {
            return;
        };
        // The requester is in the subject (`hub.ctl.<me>.<kind>.<requester>`); the admin form
        // names none.
        let requester = match subjects::parse_control(msg.subject.as_str()) {
            Ok((_, _, requester)) => requester,
            Err(_) => return,
        };
        let requester = Requester::of_control(requester.as_ref());
        let unauthorized = || serde_json::json!({ "error": WireError::new(WireErrorKind::Unauthorized, NOT_DELEGATOR) });
        let client = self.client.clone();
        let request = match serde_json::from_slice::<ControlRequest>(&msg.payload) {
            Ok(request) => request,
            Err(e) => {
                let error = WireError::new(WireErrorKind::Malformed, e.to_string());
                publish_json(&client, reply, &serde_json::json!({ "error": error })).await;
                return;
            }
        };
        let unknown = || serde_json::json!({ "error": AnswerVerdict::UnknownAttempt.error() });
        if request.worker_id != self.worker_id {
            publish_json(&client, reply, &unknown()).await;
            return;
        }
        // Routed by (task, attempt): the attempt running now, else the journal.
        let running = state
            .running
            .by_attempt(&request.task_id, &request.attempt_id)
            .map(|r| (r.actor.clone(), r.delegator.clone()));
        if let Some((_, delegator)) = &running {
            if !may_control(requester, Some(delegator)) {
                state.counters.unauthorized.bump();
                publish_json(&client, reply, &unauthorized()).await;
                return;
            }
        }
        let Some((actor, _)) = running else {
            // Not running here: answer from the journal (parked or interrupted work).
            let record = {
                let journal = state.journal.lock().unwrap_or_else(|e| e.into_inner());
                journal
                    .lookup_attempt(request.task_id.as_str(), request.attempt_id.as_str())
                    .map(|r| {
                        let delegator = r.delegator.as_deref().and_then(|d| AgentId::new(d).ok());
                        (super::attempt::saved_of(r), Parked::of(r), delegator)
                    })
            };
            let Some((saved, parked, delegator)) = record else {
                publish_json(&client, reply, &unknown()).await;
                return;
            };
            if !may_control(requester, delegator.as_ref()) {
                state.counters.unauthorized.bump();
                publish_json(&client, reply, &unauthorized()).await;
                return;
            }
            let task_state = saved
                .as_ref()
                .map_or(TaskState::Running, |s| s.result.state);
            let mut cancel = None;
            if kind == ControlKind::Cancel {
                let mut status = protocol::task::cancel_status(task_state, true);
                if status == protocol::task::CancelStatus::Requested {
                    match parked {
                        Some(parked)
                            if state
                                .running
                                .by_task(&parked.delegator, &request.task_id)
                                .is_none() =>
                        {
                            self.settle_parked(myself, state, parked, true).await;
                        }
                        // Another attempt of the task runs here now, or the work was
                        // interrupted (its input comes back): nothing to cancel now.
                        _ => status = protocol::task::CancelStatus::NotActive,
                    }
                }
                cancel = Some(status);
            }
            let body = QueryReply {
                state: task_state,
                active: false,
                suspend: saved.and_then(|s| s.result.suspend),
                cancel,
            };
            publish_json(
                &client,
                reply,
                &serde_json::to_value(body).unwrap_or_else(|_| unknown()),
            )
            .await;
            return;
        };
        state.requests.spawn(async move {
            let body = match kind {
                ControlKind::Query => actor
                    .call(
                        |port| AttemptMsg::Query(request, port),
                        Some(ATTEMPT_CALL_TIMEOUT),
                    )
                    .await
                    .ok()
                    .and_then(|r| match r {
                        ractor::rpc::CallResult::Success(r) => Some(r),
                        _ => None,
                    })
                    .map(|r| match r {
                        Ok(reply) => serde_json::to_value(reply).ok(),
                        Err(error) => Some(serde_json::json!({ "error": error })),
                    }),
                ControlKind::Cancel => actor
                    .call(
                        |port| AttemptMsg::Cancel(request, port),
                        Some(ATTEMPT_CALL_TIMEOUT),
                    )
                    .await
                    .ok()
                    .and_then(|r| match r {
                        ractor::rpc::CallResult::Success(r) => serde_json::to_value(r).ok(),
                        _ => None,
                    })
                    .map(Some),
            }
            .flatten()
            .unwrap_or_else(|| {
                serde_json::json!({ "error": WireError::new(WireErrorKind::Internal, "the attempt did not answer") })
            });
            publish_json(&client, reply, &body).await;
        });
    }

    /// Starts the attempt that settles a parked attempt: its `cancelled` result (`cancel`), or
    /// the final result it saved earlier.
    pub(super) async fn settle_parked(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        parked: Parked,
        cancel: bool,
    ) {
        let (task_id, attempt_id) = (parked.task.task_id.clone(), parked.attempt_id.clone());
        self.spawn_attempt(
            myself,
            state,
            &task_id,
            attempt_id,
            None,
            AttemptArgs::Settle {
                parked: Box::new(parked),
                cancel,
            },
        )
        .await;
    }

    /// The reply subject of a request, when it is one a service may answer on (under this
    /// worker's reply prefix); a request aimed elsewhere is counted and ignored.
    pub(super) fn checked_reply(
        &self,
        msg: &async_nats::Message,
        state: &WorkerState,
    ) -> Option<async_nats::Subject> {
        crate::reply::answerable(
            msg.reply.as_ref(),
            &self.reply_prefix,
            msg.subject.as_str(),
            || state.counters.replies_refused.bump(),
        )
    }
}

/// Publishes the error result of a refused answer on `answerer`'s channel of its task, then
/// acks the answer; when the refusal cannot be published the answer is nak'd with a delay, so
/// it is judged again later.
async fn refuse(
    client: &async_nats::Client,
    worker: &protocol::WorkerId,
    answerer: &AgentId,
    msg: &jetstream::Message,
    answer: &Answer,
    verdict: AnswerVerdict,
) {
    let error = verdict
        .error()
        .unwrap_or_else(|| WireError::new(WireErrorKind::Internal, "refused"));
    tracing::warn!(task_id = %answer.task_id, kind = error.kind.as_str(), "answer refused");
    let refusal = AnswerRefusal {
        task_id: answer.task_id.clone(),
        attempt_id: answer.attempt_id.clone(),
        // The refusing worker: it publishes the refusal as itself.
        worker_id: worker.clone(),
        answer_id: answer.message_id.clone(),
        error,
    };
    match publish::publish_refusal(client, answerer, refusal).await {
        Ok(_) => {
            let _ = publish::ack_confirmed(msg).await;
        }
        Err(e) => {
            tracing::warn!(error = %ErrorChain(&e), "cannot publish an answer's refusal; judged again later");
            let _ = msg
                .ack_with(AckKind::Nak(Some(super::REFUSAL_RETRY_DELAY)))
                .await;
        }
    }
}

/// Publishes `body` as JSON to a reply subject (best effort: a lost reply is the requester's
/// timeout).
pub(super) async fn publish_json(
    client: &async_nats::Client,
    subject: async_nats::Subject,
    body: &serde_json::Value,
) {
    let Ok(payload) = serde_json::to_vec(body) else {
        return;
    };
    if let Err(e) = client.publish(subject, payload.into()).await {
        tracing::debug!(error = %ErrorChain(&e), "reply not sent");
    }
}
