//! The router's audit events ([`protocol::audit`]): `accepted` when it takes an envelope from
//! the ingress (at the ingress's own store time, with its sequence), then `routed` (with the
//! stored sequence), `deduplicated` (the store was a duplicate) or `rejected` (with the kind).
//! A task input's events name its task; a worker's result or status stored on a task channel
//! is `result_published`. Emitted without waiting ([`crate::audit`]).

use async_nats::jetstream::Message;
use protocol::audit::{subject_of, AuditEvent, Details, Subject};
use protocol::routing::RouteDecision;

use super::durable::{Done, DurablePump, Pending};

/// What one envelope's events are about, and its trace.
pub(super) struct Trail {
    about: Subject,
    trace: Option<String>,
}

impl DurablePump {
    /// Emits `accepted` (or `rejected`) for `msg` and what the router decided; the [`Trail`]
    /// follows its store to [`Self::audited`]. `None` when audit events are off or the trail
    /// does not follow this message.
    pub(super) fn accepted(
        &self,
        msg: &Message,
        seq: u64,
        decision: &RouteDecision,
    ) -> Option<Trail> {
        if !self.audit.is_on() {
            return None;
        }
        let trace = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("traceparent"))
            .map(|v| v.as_str().to_owned());
        let (info_at, attempt) = msg
            .info()
            .map(|i| {
                let ms = i.published.unix_timestamp_nanos() / 1_000_000;
                (u64::try_from(ms).ok(), i.delivered as u64)
            })
            .unwrap_or((None, 1));
        let at = info_at.unwrap_or_else(protocol::expiry::now_ms);
        let about = match decision {
            RouteDecision::Store {
                subject,
                msg_id,
                id,
                ..
            } => subject_of(subject, msg_id, id.as_str())?,
            RouteDecision::StoreAll { subject, id, .. } => subject_of(subject, "", id.as_str())?,
            RouteDecision::Reject {
                rejected_id: Some(id),
                error,
                ..
            } => {
                let event = AuditEvent::msg("rejected", id.as_str(), at, "")
                    .attempt(attempt)
                    .traced(trace.as_deref())
                    .details(Details {
                        ingress_seq: Some(seq),
                        kind: Some(error.kind.as_str().to_owned()),
                        ..Details::default()
                    });
                self.audit.emit(event);
                return None;
            }
            _ => return None,
        };
        let event = match &about {
            Subject::Msg(id) => AuditEvent::msg("accepted", id, at, ""),
            Subject::Task { channel: true, .. } => return Some(Trail { about, trace }),
            Subject::Task { task_id, .. } => AuditEvent::task("accepted", task_id, at, ""),
        };
        self.audit.emit(
            event
                .attempt(attempt)
                .traced(trace.as_deref())
                .details(Details {
                    ingress_seq: Some(seq),
                    ..Details::default()
                }),
        );
        Some(Trail { about, trace })
    }

    /// `stored`, emitting `routed`, `deduplicated` or `result_published` once it resolves as
    /// stored. The event is dated when the store was sent (now: `stored` was made after its
    /// publish went out), not when its ack is read: the recipient may fetch it before that.
    pub(super) fn audited(&self, stored: Pending, trail: Option<Trail>) -> Pending {
        let Some(trail) = trail else {
            return stored;
        };
        let audit = self.audit.clone();
        let sent_at = protocol::expiry::now_ms();
        Box::pin(async move {
            let done = stored.await;
            let (event, details) = match (&done, &trail.about) {
                (
                    Done::Stored {
                        terminate: true, ..
                    },
                    _,
                ) => return done,
                (Done::Stored { duplicate, seq, .. }, Subject::Task { channel: true, .. }) => (
                    "result_published",
                    Details {
                        seq: Some(*seq),
                        duplicate: Some(*duplicate),
                        ..Details::default()
                    },
                ),
                (
                    Done::Stored {
                        duplicate: true,
                        seq,
                        ..
                    },
                    _,
                ) => (
                    "deduplicated",
                    Details {
                        seq: Some(*seq),
                        ..Details::default()
                    },
                ),
                (Done::Stored { seq, .. }, _) => (
                    "routed",
                    Details {
                        seq: Some(*seq),
                        ..Details::default()
                    },
                ),
                (Done::StoredAll { stored, .. }, _) => (
                    "result_published",
                    Details {
                        items: Some(*stored),
                        ..Details::default()
                    },
                ),
                _ => return done,
            };
            let event = match &trail.about {
                Subject::Msg(id) => AuditEvent::msg(event, id, sent_at, ""),
                Subject::Task { task_id, .. } => AuditEvent::task(event, task_id, sent_at, ""),
            };
            audit.emit(event.traced(trail.trace.as_deref()).details(details));
            done
        })
    }
}
