//! The checks the router schedules for what it stores (nats-server message schedules in
//! `HUB_SCHEDULES`), before it acks the ingress message: a DM's deadline check
//! ([`protocol::expiry::ExpiryCheck`], at its `meta.expires_at`) and an answer's wait check
//! ([`protocol::expiry::AnswerCheck`], `answer_max_wait_secs` after it is stored). A router that
//! dies in between has the ingress message redelivered, the store deduplicated (its ack names
//! the stored sequence again) and the schedule made again under the same id.

use std::future::IntoFuture;
use std::sync::Arc;

use async_nats::jetstream;
use protocol::error_chain::ErrorChain;
use protocol::subjects;

use super::counters::RouterCounters;
use super::outcome::{Done, Pending};
use crate::PUBLISH_ACK_TIMEOUT;

/// What a check will name, before the stored sequence is known.
pub enum Planned {
    /// A DM's deadline check.
    Expiry {
        /// The DM's sender.
        from: protocol::AgentId,
        /// Its recipient.
        to: protocol::AgentId,
        /// Its `meta.id`.
        id: protocol::MessageId,
        /// Its deadline (unix ms).
        expires_at: u64,
    },
    /// An answer's wait check, fired at `at_ms`.
    Answer {
        /// The answer's sender.
        from: protocol::AgentId,
        /// The worker it is for.
        worker: protocol::WorkerId,
        /// Its `meta.id`.
        id: protocol::MessageId,
        /// Its task.
        task_id: protocol::TaskId,
        /// When the check fires (unix ms).
        at_ms: u64,
    },
}

impl Planned {
    /// The schedule of the check of the message stored at `seq`: its subject in
    /// `HUB_SCHEDULES`, its headers (`Nats-Msg-Id`, `Nats-Schedule`, `Nats-Schedule-Target`)
    /// and its body. The same check made twice has the same id.
    pub fn schedule(self, seq: u64) -> (String, async_nats::HeaderMap, Vec<u8>) {
        let (subject, msg_id, at_ms, target, payload) = self.parts(seq);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(protocol::headers::NATS_MSG_ID, msg_id.as_str());
        headers.insert(
            "Nats-Schedule",
            format!("@at {}", protocol::expiry::rfc3339_utc(at_ms)).as_str(),
        );
        headers.insert("Nats-Schedule-Target", target);
        (subject, headers, payload)
    }

    /// `(schedule subject, msg id, fire at (unix ms), target, body)` of the check of the
    /// message stored at `seq`.
    fn parts(self, seq: u64) -> (String, String, u64, &'static str, Vec<u8>) {
        match self {
            Planned::Expiry {
                from,
                to,
                id,
                expires_at,
            } => {
                let body = protocol::expiry::ExpiryCheck {
                    from,
                    to,
                    id,
                    inbox_seq: seq,
                    expires_at,
                };
                (
                    subjects::expiry_schedule(seq),
                    subjects::schedule_msg_id("expiry", seq),
                    expires_at,
                    subjects::EXPIRY_DUE_SUBJECT,
                    serde_json::to_vec(&body).expect("a check serializes"),
                )
            }
            Planned::Answer {
                from,
                worker,
                id,
                task_id,
                at_ms,
            } => {
                let body = protocol::expiry::AnswerCheck {
                    from,
                    worker,
                    id,
                    task_id,
                    answers_seq: seq,
                };
                (
                    subjects::answer_schedule(seq),
                    subjects::schedule_msg_id("answer", seq),
                    at_ms,
                    subjects::ANSWER_DUE_SUBJECT,
                    serde_json::to_vec(&body).expect("a check serializes"),
                )
            }
        }
    }
}

impl Planned {
    /// Once `stored` resolves as stored, schedules this check of it (counted in `counters`)
    /// before the ingress message is acked.
    pub(super) fn once_stored(
        self,
        js: &jetstream::Context,
        counters: &Arc<RouterCounters>,
        stored: Pending,
    ) -> Pending {
        let (js, counters, planned) = (js.clone(), counters.clone(), self);
        Box::pin(async move {
            // The duplicate ack of a re-stored message names the original's sequence too.
            let (duplicate, seq) = match stored.await {
                Done::Stored { duplicate, seq, .. } => (duplicate, seq),
                other => return other,
            };
            let (subject, headers, payload) = planned.schedule(seq);
            let sent = js
                .publish_with_headers(subject, headers, payload.into())
                .await;
            let acked = match sent {
                Ok(ack) => tokio::time::timeout(PUBLISH_ACK_TIMEOUT, ack.into_future()).await,
                Err(e) => return Done::Failed(format!("check not sent: {e}")),
            };
            match acked {
                Ok(Ok(_)) => counters.expiry_checks_scheduled.bump(),
                // Lost on the way (no ack, a dropped connection, the stream not there yet):
                // tried again with the ingress message.
                Ok(Err(e)) if crate::streams::is_transient(&e) => {
                    return Done::Failed(format!("check not stored: {e}"));
                }
                // Refused: retrying cannot help; the message is stored and delivered as usual.
                Ok(Err(e)) => {
                    counters.expiry_checks_failed.bump();
                    tracing::warn!(error = %ErrorChain(&e), seq, "the broker refused a check; its sender may not be told");
                }
                Err(_) => return Done::Failed("no ack of the check in time".into()),
            }
            Done::Stored {
                duplicate,
                terminate: false,
                seq,
            }
        })
    }
}
