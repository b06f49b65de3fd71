//! Dead letters of tasks: a task input whose deliveries to workers ran out
//! (`task_max_deliver`: workers kept failing it, or kept handing it back), and an answer no
//! worker took within `answer_max_wait_secs` (its worker is gone), leave their work-queue
//! stream for the dead-letter stream instead of staying there until their max age.
//!
//! An input is found from the broker's max-deliveries advisory of a work consumer, an answer
//! from the wait check the router scheduled when it stored it. Either is read back by
//! sequence, copied to `dlq.work.<queue>` / `dlq.answer.<worker>` (with its original subject,
//! sequence, reason and delivery count, under `hub-dlq-<work|answer>:<seq>`), removed from its
//! stream (so a worker that comes later does not take it), and its sender (the task's
//! delegator) gets a notice of kind `task_undeliverable` / `answer_undeliverable`. Each step is
//! idempotent, and the advisory or check is acked only after the last, so a router that dies
//! in between has it redelivered and finishes.

use async_nats::jetstream::{self, consumer::pull, message::StreamMessage};
use protocol::error_chain::ErrorChain;
use protocol::expiry::AnswerCheck;
use protocol::rejection::{TaskNotice, ANSWER_UNDELIVERABLE_KIND, TASK_UNDELIVERABLE_KIND};
use protocol::subjects;

use super::{Advisory, ExpiryPump, Handled};
use crate::fault::{self, FaultPoint};

/// Where a dead letter of a task comes from and goes.
struct Copy<'a> {
    stream: &'a str,
    seq: u64,
    dlq_subject: String,
    kind: &'a str,
    reason: &'a str,
    deliveries: u64,
}

impl ExpiryPump {
    /// The task input of advisory `a` (a work consumer's max-deliveries) is dead-lettered.
    pub(super) async fn dead_letter_task(&self, a: &Advisory) -> Handled {
        let stored = match self.read(subjects::WORK_STREAM, a.stream_seq).await {
            Ok(stored) => stored,
            Err(handled) => return handled,
        };
        let Ok((queue, _)) = subjects::parse_work(&stored.subject) else {
            return Handled::Malformed;
        };
        let copy = Copy {
            stream: subjects::WORK_STREAM,
            seq: a.stream_seq,
            dlq_subject: subjects::dlq_work(&queue),
            kind: "work",
            reason: "max_deliver",
            deliveries: a.deliveries,
        };
        if let Err(handled) = self.copy_out(&stored, &copy).await {
            return handled;
        }
        tracing::warn!(%queue, work_seq = a.stream_seq, deliveries = a.deliveries, "task input dead-lettered");
        let env = crate::decode::envelope(Some(&stored.headers), &stored.payload);
        let Some((env, task)) = env.ok().and_then(|env| {
            let task = protocol::task::decode_task(&env.body).ok()?;
            Some((env, task))
        }) else {
            return Handled::Done;
        };
        self.audit.emit(
            self.audit
                .task("dead_lettered", task.task_id.as_str())
                .attempt(a.deliveries)
                .details(protocol::audit::Details {
                    work_seq: Some(a.stream_seq),
                    reason: Some(copy.reason.to_owned()),
                    ..Default::default()
                }),
        );
        let Some(delegator) = env.meta.from else {
            return Handled::Done;
        };
        let notice = TaskNotice {
            kind: TASK_UNDELIVERABLE_KIND.into(),
            message_id: env.meta.id,
            task_id: task.task_id,
            queue: Some(queue),
            worker: None,
            stream_seq: a.stream_seq,
            reason: copy.reason.into(),
        };
        let (subject, msg_id, notice) = notice.envelope(&delegator);
        self.store_notice(subject, msg_id, &notice).await
    }

    /// The wait of an answer is over: dead-lettered unless its worker's consumer took it.
    pub(super) async fn answer_check(&self, check: AnswerCheck) -> Handled {
        self.counters.checks.bump();
        let consumer = subjects::answer_consumer(&check.worker);
        let delivered = match self
            .js
            .get_consumer_from_stream::<pull::Config, _, _>(&consumer, subjects::ANSWERS_STREAM)
            .await
        {
            Ok(mut c) => match c.info().await {
                Ok(info) => Some(info.delivered.stream_sequence),
                Err(_) => return Handled::Retry,
            },
            Err(e) if crate::consumers::is_consumer_not_found(&e) => None,
            Err(_) => return Handled::Retry,
        };
        if delivered.is_some_and(|d| d >= check.answers_seq) {
            // Its worker took it (and judges it).
            self.counters.fetched.bump();
            return Handled::Done;
        }
        let stored = match self.read(subjects::ANSWERS_STREAM, check.answers_seq).await {
            Ok(stored) => stored,
            Err(handled) => return handled,
        };
        let copy = Copy {
            stream: subjects::ANSWERS_STREAM,
            seq: check.answers_seq,
            dlq_subject: subjects::dlq_answer(&check.worker),
            kind: "answer",
            reason: "no_worker",
            deliveries: 0,
        };
        if let Err(handled) = self.copy_out(&stored, &copy).await {
            return handled;
        }
        tracing::warn!(worker = %check.worker, task_id = %check.task_id, "answer dead-lettered: no worker took it");
        let notice = TaskNotice {
            kind: ANSWER_UNDELIVERABLE_KIND.into(),
            message_id: check.id,
            task_id: check.task_id,
            queue: None,
            worker: Some(check.worker),
            stream_seq: check.answers_seq,
            reason: copy.reason.into(),
        };
        let (subject, msg_id, notice) = notice.envelope(&check.from);
        self.store_notice(subject, msg_id, &notice).await
    }

    /// The message at `seq` of `stream`; `Err(Done)` when it is gone (taken after all, or
    /// dead-lettered and removed before).
    async fn read(&self, stream: &str, seq: u64) -> Result<StreamMessage, Handled> {
        if fault::check(&self.name, FaultPoint::DeadLetter).is_err() {
            return Err(Handled::Retry);
        }
        let handle = self
            .js
            .get_stream_no_info(stream)
            .await
            .map_err(|_| Handled::Retry)?;
        match handle.direct_get(seq).await {
            Ok(stored) => Ok(stored),
            Err(e) if e.kind() == jetstream::stream::DirectGetErrorKind::NotFound => {
                Err(Handled::Done)
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), stream, seq, "cannot read a dead letter; tried again");
                Err(Handled::Retry)
            }
        }
    }

    /// Copies `stored` to its dead-letter subject, then removes it from its stream.
    async fn copy_out(&self, stored: &StreamMessage, copy: &Copy<'_>) -> Result<(), Handled> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            protocol::headers::NATS_MSG_ID,
            subjects::dead_letter_msg_id(copy.kind, copy.seq).as_str(),
        );
        headers.insert(
            protocol::headers::DLQ_ORIGINAL_SUBJECT,
            stored.subject.as_str(),
        );
        headers.insert(
            protocol::headers::DLQ_ORIGINAL_SEQ,
            copy.seq.to_string().as_str(),
        );
        headers.insert(protocol::headers::DLQ_REASON, copy.reason);
        headers.insert(
            protocol::headers::DLQ_DELIVERIES,
            copy.deliveries.to_string().as_str(),
        );
        if let Some(ct) = stored.headers.get(protocol::headers::CONTENT_TYPE) {
            headers.insert(protocol::headers::CONTENT_TYPE, ct.as_str());
        }
        crate::streams::publish_acked(
            &self.js,
            copy.dlq_subject.clone(),
            headers,
            stored.payload.clone(),
            crate::PUBLISH_ACK_TIMEOUT,
        )
        .await
        .map_err(|_| Handled::Retry)?;
        let handle = self
            .js
            .get_stream_no_info(copy.stream)
            .await
            .map_err(|_| Handled::Retry)?;
        if let Err(e) = handle.delete_message(copy.seq).await {
            let gone = matches!(e.kind(), jetstream::stream::DeleteMessageErrorKind::JetStream(err)
                if err.error_code() == jetstream::ErrorCode::SEQUENCE_NOT_FOUND);
            if !gone {
                tracing::warn!(error = %ErrorChain(&e), stream = copy.stream, seq = copy.seq, "cannot remove a dead letter from its stream; tried again");
                return Err(Handled::Retry);
            }
        }
        self.counters.dead_lettered.bump();
        Ok(())
    }
}
