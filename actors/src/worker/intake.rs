//! How a worker takes a task input: the redelivery and alias checks, the admission in the
//! journal, the attempt it starts, and the refusal of bad input.

use async_nats::jetstream::{self, AckKind};
use protocol::error_chain::ErrorChain;
use protocol::subjects::TaskChannel;
use protocol::task::{decode_task, failed_result, result_msg_id, AttemptId, TaskChannelBody};
use protocol::{AgentId, TaskId, WireError, WireErrorKind};
use ractor::{Actor, ActorRef};
use tokio::sync::OwnedSemaphorePermit;

use super::ack_waits::AckWait;
use super::attempt::{fresh_attempt_id, Attempt, AttemptArgs, RETRY_DELAY};
use super::publish;
use super::running::Input;
use super::{Worker, WorkerMsg, WorkerState, REFUSAL_RETRY_DELAY};

impl Worker {
    pub(super) async fn on_task(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        msg: jetstream::Message,
        ack_wait: AckWait,
        permit: OwnedSemaphorePermit,
    ) {
        let Ok((seq, delivered)) = msg.info().map(|i| (i.stream_sequence, i.delivered)) else {
            tracing::warn!(subject = %msg.subject, "task message without JetStream info; dropped");
            return;
        };
        // A redelivery is a second delivery or later: the running attempt heartbeats and acks
        // this input itself. A first delivery at a sequence a running attempt holds is judged
        // once decoded (below).
        if delivered > 1 && state.running.holds(Input::Task(seq)) {
            state.counters.redelivered_while_running.bump();
            tracing::warn!(
                input_seq = seq,
                "redelivery of a running attempt's input (a heartbeat came too late)"
            );
            return;
        }
        if state.draining {
            // Fetched before the drain: handed back at once, for another worker; unless a
            // running attempt holds it (it hands its input back itself).
            drop(permit);
            if state.running.holds(Input::Task(seq)) {
                return;
            }
            state.requests.spawn(async move {
                let _ = msg.ack_with(AckKind::Nak(None)).await;
            });
            return;
        }
        let (task, delegator) = match decode_input(&msg) {
            Ok(decoded) => decoded,
            Err((channel, error)) => {
                drop(permit);
                self.refuse_input(state, msg, seq, channel, error);
                return;
            }
        };
        if state.audit.is_on() {
            let event = state.audit.task("fetched", task.task_id.as_str());
            state.audit.emit(
                event
                    .attempt(u64::try_from(delivered).unwrap_or(1))
                    .traced(
                        msg.headers
                            .as_ref()
                            .and_then(|h| h.get(crate::header_names::TRACEPARENT))
                            .map(|v| v.as_str()),
                    )
                    .details(protocol::audit::Details {
                        work_seq: Some(seq),
                        ..protocol::audit::Details::default()
                    }),
            );
        }
        // A first delivery at a sequence a running attempt holds: of that attempt's own task,
        // it is its input again, handed out by a broker that forgot the delivery (a kill -9,
        // the consumer made again); acked as an alias, it would leave the work stream while
        // the attempt may still fail. Of another task, the work stream was deleted and made
        // again, its sequences starting over, while that attempt still acks its old input.
        if state.running.holds(Input::Task(seq)) {
            let own = state
                .running
                .by_task(&delegator, &task.task_id)
                .is_some_and(|r| r.input == Some(Input::Task(seq)));
            if own {
                state.counters.redelivered_while_running.bump();
                tracing::warn!(
                    input_seq = seq,
                    "a running attempt's input delivered again as a first delivery (the broker forgot the delivery)"
                );
                return;
            }
            tracing::warn!(
                input_seq = seq,
                "a first delivery at a sequence a running attempt holds: the work stream was made again"
            );
        }
        if state.running.by_task(&delegator, &task.task_id).is_some() {
            state.counters.aliased.bump();
            tracing::info!(task_id = %task.task_id, input_seq = seq, "task id already running: input acked as an alias");
            state.requests.spawn(async move {
                if let Err(e) = publish::ack_confirmed(&msg).await {
                    tracing::warn!(error = %ErrorChain(&e), "cannot ack an aliased input");
                }
            });
            return;
        }
        // (1) admission, keyed by (sequence, task id): an input admitted before gets its
        // attempt back (a re-run, or the republish of its saved result).
        let admitted = {
            let mut journal = state.journal.lock().unwrap_or_else(|e| e.into_inner());
            journal.admit(
                seq,
                task.task_id.as_str(),
                fresh_attempt_id().as_str(),
                Some(delegator.as_str()),
            )
        };
        let admission = match admitted {
            Ok(admission) => admission,
            Err(e) => {
                tracing::warn!(input_seq = seq, error = %ErrorChain(&e), "the journal refused an admission; the input is nak'd");
                drop(permit);
                state.requests.spawn(async move {
                    let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                });
                return;
            }
        };
        let attempt_id =
            AttemptId::new(&admission.attempt_id).unwrap_or_else(|_| fresh_attempt_id());
        let task_id = task.task_id.clone();
        let args = AttemptArgs::Task {
            msg,
            seq,
            task,
            delegator,
            attempt_id: attempt_id.clone(),
            admission,
            slot: permit,
        };
        self.spawn_attempt(
            myself,
            state,
            &task_id,
            attempt_id,
            Some((Input::Task(seq), ack_wait)),
            args,
        )
        .await;
    }

    /// Starts an attempt linked to the worker; `input` is the message it holds, with the ack
    /// wait of the consumer it came from.
    pub(super) async fn spawn_attempt(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        task_id: &TaskId,
        attempt_id: AttemptId,
        input: Option<(Input, AckWait)>,
        args: AttemptArgs,
    ) {
        let (input, ack_wait) = input.unzip();
        let delegator = args.delegator().clone();
        let attempt = Attempt {
            name: format!("{}.attempt.{delegator}.{task_id}", self.name),
            client: self.client.clone(),
            worker_id: self.worker_id.clone(),
            journal: state.journal.clone(),
            handler: self.handler.clone(),
            ack_wait,
            streams: state.streams.clone(),
            compact_after: self.compact_after,
            counters: state.counters.clone(),
            slots: state.slots.clone(),
            baseline: state.baseline.clone(),
        };
        let name = attempt.name.clone();
        match Actor::spawn_linked(Some(name), attempt, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                state.counters.admitted.bump();
                state
                    .running
                    .insert(actor, task_id.clone(), delegator, attempt_id, input);
            }
            Err(e) => {
                state.counters.attempt_failures.bump();
                tracing::warn!(%task_id, ?input, error = %ErrorChain(&e), "attempt did not start; its input is left for redelivery");
            }
        }
    }

    /// Refuses bad input: with a task id salvaged from the body (and the delegator's stamp), a
    /// failed result is published on its channel and the input acked only once the stream
    /// confirmed it (else nak'd with a delay, so the refusal is tried again); without one, the
    /// input is terminated.
    fn refuse_input(
        &self,
        state: &mut WorkerState,
        msg: jetstream::Message,
        seq: u64,
        channel: Option<TaskChannel>,
        error: WireError,
    ) {
        state.counters.bad_input.bump();
        tracing::warn!(input_seq = seq, kind = error.kind.as_str(), detail = %error.detail, "bad task input refused");
        let (client, worker_id) = (self.client.clone(), self.worker_id.clone());
        state.requests.spawn(async move {
            let Some(channel) = channel else {
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            };
            let Ok(task_id) = TaskId::new(channel.key.as_str()) else {
                let _ = msg.ack_with(AckKind::Term).await;
                return;
            };
            // A stable attempt id: a redelivered bad input publishes the same refusal again.
            let attempt_id = AttemptId::new(format!("refused-{seq}")).expect("a valid id");
            let msg_id = result_msg_id(&task_id, &attempt_id, 1);
            let result = failed_result(task_id.clone(), attempt_id, worker_id.clone(), error);
            let refusal = TaskChannelBody::Result(result);
            match publish::publish_task_channel(&client, &worker_id, &channel, &msg_id, &refusal)
                .await
            {
                Ok(_) => {
                    if let Err(e) = publish::ack_confirmed(&msg).await {
                        tracing::warn!(error = %ErrorChain(&e), "cannot ack refused input");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %ErrorChain(&e), "the refusal of bad input was not published; the input is nak'd for another try");
                    let _ = msg.ack_with(AckKind::Nak(Some(REFUSAL_RETRY_DELAY))).await;
                }
            }
        });
    }
}

/// Decodes the envelope of a stored input ([`crate::decode::envelope`]).
pub(super) fn decode_envelope(
    msg: &jetstream::Message,
) -> Result<protocol::Envelope, protocol::EnvelopeError> {
    crate::decode::envelope(msg.headers.as_ref(), &msg.payload)
}

/// Decodes a task input and its delegator (the router's stamp, `meta.from`); on failure
/// returns the salvageable task channel and the error.
fn decode_input(
    msg: &jetstream::Message,
) -> Result<(protocol::task::TaskSpec, AgentId), (Option<TaskChannel>, WireError)> {
    let env = decode_envelope(msg).map_err(|e| (None, WireError::from(&e)))?;
    let Some(delegator) = env.meta.from.clone() else {
        // Every stored task carries the router's stamp: one without has no channel to answer.
        return Err((
            None,
            WireError::new(
                WireErrorKind::Malformed,
                "a task input without its sender's stamp",
            ),
        ));
    };
    let task = decode_task(&env.body).map_err(|e| {
        let channel = env
            .body
            .get("task_id")
            .and_then(|v| v.as_str())
            .and_then(|s| TaskId::new(s).ok())
            .map(|id| TaskChannel::of(&delegator, &id));
        (channel, e.to_wire())
    })?;
    Ok((task, delegator))
}
