//! The router's audit events ([`protocol::audit`]): `accepted` when it takes an envelope from
//! the ingress (at the ingress's own store time, with its sequence), then `routed` (with the
//! stored sequence), `deduplicated` (the store was a duplicate) or `rejected` (with the kind).
//! A task input's events name its task; a worker's status or result stored on its task channel
//! is `state_changed` (and `started`, `result_published`, `cancelled`:
//! [`protocol::audit::channel_events`]), and an answer routed to a worker is `answered`.
//! Emitted without waiting ([`crate::audit`]).

use async_nats::jetstream::Message;
use protocol::audit::{subject_of, About, AuditEvent, Details};
use protocol::routing::RouteDecision;

use super::durable::{Done, DurablePump, Pending};

/// What one envelope's events are about, and its trace.
pub(super) struct Trail {
    about: About,
    trace: Option<String>,
    /// A task channel message's events (decoded only with audit events on).
    channel: Vec<(&'static str, Option<protocol::task::TaskState>)>,
}

/// The task channel events of a stored item (`payload` in `codec`).
fn channel_events(
    payload: &[u8],
    codec: protocol::Codec,
) -> Vec<(&'static str, Option<protocol::task::TaskState>)> {
    protocol::decode(payload, codec)
        .ok()
        .and_then(|env| serde_json::from_value::<protocol::task::TaskChannelBody>(env.body).ok())
        .map(|body| protocol::audit::channel_events(&body))
        .unwrap_or_default()
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
        let mut channel = Vec::new();
        let about = match decision {
            RouteDecision::Store {
                subject,
                msg_id,
                id,
                payload,
                codec,
                ..
            } => match subject_of(subject, msg_id, id.as_str()) {
                Some(about) => {
                    if matches!(about, About::Task { channel: true, .. }) {
                        channel = channel_events(payload, *codec);
                    }
                    about
                }
                None => {
                    // An answer to a worker: `answered`, once stored.
                    if !protocol::subjects::is_answer(subject) {
                        return None;
                    }
                    let env = protocol::decode(payload, *codec).ok()?;
                    let answer: protocol::task::Answer = serde_json::from_value(env.body).ok()?;
                    channel.push(("answered", None));
                    let about = About::Task {
                        task_id: answer.task_id.to_string(),
                        channel: true,
                    };
                    return Some(Trail {
                        about,
                        trace,
                        channel,
                    });
                }
            },
            RouteDecision::StoreAll {
                subject,
                id,
                items,
                codec,
                ..
            } => {
                let about = subject_of(subject, "", id.as_str())?;
                for item in items {
                    channel.extend(channel_events(&item.payload, *codec));
                }
                about
            }
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
            About::Msg(id) => AuditEvent::msg("accepted", id, at, ""),
            About::Task { channel: true, .. } => {
                return Some(Trail {
                    about,
                    trace,
                    channel,
                })
            }
            About::Task { task_id, .. } => AuditEvent::task("accepted", task_id, at, ""),
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
        Some(Trail {
            about,
            trace,
            channel,
        })
    }

    /// `stored`, emitting once it resolves as stored: `routed` or `deduplicated` (with the
    /// stored sequence), or a task channel message's own events (`state_changed`, ...). The
    /// events are dated when the store was sent (now: `stored` was made after its publish went
    /// out), not when its ack is read: the recipient may fetch it before that.
    pub(super) fn audited(&self, stored: Pending, trail: Option<Trail>) -> Pending {
        let Some(trail) = trail else {
            return stored;
        };
        let audit = self.audit.clone();
        let sent_at = protocol::expiry::now_ms();
        Box::pin(async move {
            let done = stored.await;
            let (seq, duplicate) = match &done {
                Done::Stored {
                    terminate: false,
                    duplicate,
                    seq,
                } => (Some(*seq), *duplicate),
                Done::StoredAll { .. } => (None, false),
                _ => return done,
            };
            let emit = |event: &'static str, details: Details| {
                let event = match &trail.about {
                    About::Msg(id) => AuditEvent::msg(event, id, sent_at, ""),
                    About::Task { task_id, .. } => AuditEvent::task(event, task_id, sent_at, ""),
                };
                audit.emit(event.traced(trail.trace.as_deref()).details(details));
            };
            if matches!(trail.about, About::Task { channel: true, .. }) {
                for (event, state) in &trail.channel {
                    emit(
                        event,
                        Details {
                            seq,
                            state: *state,
                            ..Details::default()
                        },
                    );
                }
            } else {
                let event = if duplicate { "deduplicated" } else { "routed" };
                emit(
                    event,
                    Details {
                        seq,
                        ..Details::default()
                    },
                );
            }
            done
        })
    }
}
