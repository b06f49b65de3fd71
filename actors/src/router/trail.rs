//! The router's audit events ([`protocol::audit`]): `accepted` when it takes an envelope from
//! the ingress (at the ingress's own store time, with its sequence), then `routed` (with the
//! stored sequence), `deduplicated` (the store was a duplicate) or `rejected` (with the kind).
//! A task input's events name its task; a worker's status or result stored on its task channel
//! is `state_changed` (and `started`, `result_published`, `cancelled`:
//! [`protocol::audit::channel_events`]), and an answer routed to a worker is `answered`.
//! Emitted without waiting ([`crate::audit`]), and only where the pump finishes the ingress
//! message: `accepted` and what its store became go out together, under one lock, and no
//! future wraps the store ack to emit them.

use async_nats::jetstream::Message;
use protocol::audit::{About, AuditEvent, Details, EventRef};
use protocol::routing::{Dest, RouteDecision};

use super::outcome::Done;

/// What one envelope's events are about, and its trace: made when the pump takes it, emitted
/// when the pump finishes it ([`finish`]).
pub(super) struct Trail {
    about: About,
    /// The W3C trace id of its `traceparent` (parsed once for all its events).
    trace_id: Option<String>,
    /// A task channel message's events (decoded only with audit events on).
    channel: Vec<(&'static str, Option<protocol::task::TaskState>)>,
    /// `accepted` (a DM's or a task input's), dated at the ingress's store time.
    accepted: Option<Accepted>,
    /// When its store was sent: what `routed` is dated (the recipient may fetch it before
    /// the store ack is read).
    sent_at: u64,
}

/// What a held `accepted` says (kept small: one is held per message in flight).
#[derive(Debug, Clone, Copy)]
struct Accepted {
    /// The ingress's store time, unix ms.
    at: u64,
    /// The broker's delivery count.
    attempt: u64,
    /// Its ingress sequence.
    ingress_seq: u64,
}

impl Trail {
    /// The id its events name, and whether that is a task's.
    fn id(&self) -> (&str, bool) {
        match &self.about {
            About::Msg(id) => (id, false),
            About::Task { task_id, .. } => (task_id, true),
        }
    }
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

impl Trail {
    /// Dated now: its store has just been sent.
    pub(super) fn sent_now(mut self) -> Trail {
        self.sent_at = protocol::expiry::now_ms();
        self
    }
}

/// The [`Trail`] of `msg` and what the router decided, `accepted` in it; a rejection's
/// `rejected` is emitted now. `None` when audit events are off or the trail does not
/// follow this message. [`Trail::sent_now`] dates it once its store is sent.
pub(super) fn accepted(
    audit: &crate::audit::Auditor,
    msg: &Message,
    pulled: super::outcome::Pulled,
    decision: &RouteDecision,
) -> Option<Trail> {
    let seq = pulled.seq;
    if !audit.is_on() {
        return None;
    }
    let trace = protocol::audit::trace_id_of(
        msg.headers
            .as_ref()
            .and_then(|h| h.get(crate::header_names::TRACEPARENT))
            .map(|v| v.as_str()),
    );
    let (info_at, attempt) = pulled
        .info
        .map(|i| (u64::try_from(i.stored_ns / 1_000_000).ok(), i.delivered))
        .unwrap_or((None, 1));
    let at = info_at.unwrap_or_else(protocol::expiry::now_ms);
    let trail = |about, trace_id, channel, accepted| {
        Some(Trail {
            about,
            trace_id,
            channel,
            accepted,
            sent_at: 0,
        })
    };
    let mut channel = Vec::new();
    let about = match decision {
        RouteDecision::Store {
            dest,
            id,
            payload,
            codec,
            ..
        } => match dest.about(id) {
            Some(about) => {
                if matches!(about, About::Task { channel: true, .. }) {
                    channel = channel_events(payload, *codec);
                }
                about
            }
            None => {
                // An answer to a worker: `answered`, once stored.
                let Dest::Answer { task_id, .. } = dest else {
                    return None;
                };
                channel.push(("answered", None));
                let about = About::Task {
                    task_id: task_id.to_string(),
                    channel: true,
                };
                return trail(about, trace, channel, None);
            }
        },
        RouteDecision::StoreAll {
            channel: task,
            items,
            codec,
            ..
        } => {
            for item in items {
                channel.extend(channel_events(&item.payload, *codec));
            }
            About::Task {
                task_id: task.key.to_string(),
                channel: true,
            }
        }
        RouteDecision::Reject {
            rejected_id: Some(id),
            error,
            ..
        } => {
            let mut event = AuditEvent::msg("rejected", id.as_str(), at, "")
                .attempt(attempt)
                .details(Details {
                    ingress_seq: Some(seq),
                    kind: Some(error.kind.as_str().to_owned()),
                    ..Details::default()
                });
            event.trace_id = trace;
            audit.emit(event);
            return None;
        }
        _ => return None,
    };
    if matches!(about, About::Task { channel: true, .. }) {
        return trail(about, trace, channel, None);
    }
    let accepted = Accepted {
        at,
        attempt,
        ingress_seq: seq,
    };
    trail(about, trace, channel, Some(accepted))
}

/// Emits what `trail` says and its store came to, as the pump finishes its ingress
/// message: `accepted`, then `routed` or `deduplicated` (with the stored sequence) or a
/// task channel message's own events (`state_changed`, ...) when it was stored; `accepted`
/// alone when it was not (`None`: it never resolved).
pub(super) fn finish(audit: &crate::audit::Auditor, trail: Option<Trail>, done: Option<&Done>) {
    let Some(trail) = trail else {
        return;
    };
    let stored = match done {
        Some(Done::Stored {
            terminate: false,
            duplicate,
            seq,
        }) => Some((Some(*seq), *duplicate)),
        Some(Done::StoredAll { .. }) => Some((None, false)),
        _ => None,
    };
    let (id, task) = trail.id();
    let trace_id = trail.trace_id.as_deref();
    let accepted_details = Details {
        ingress_seq: trail.accepted.map(|a| a.ingress_seq),
        ..Details::default()
    };
    let accepted = trail.accepted.map(|a| {
        EventRef::of("accepted", id, task, a.at)
            .traced(trace_id)
            .attempt(a.attempt)
            .details(&accepted_details)
    });
    let Some((seq, duplicate)) = stored else {
        audit.emit_refs(accepted);
        return;
    };
    let event = |name: &'static str, details| {
        EventRef::of(name, id, task, trail.sent_at)
            .traced(trace_id)
            .details(details)
    };
    if matches!(trail.about, About::Task { channel: true, .. }) {
        let events: Vec<(&str, Details)> = trail
            .channel
            .iter()
            .map(|(name, state)| {
                let details = Details {
                    seq,
                    state: *state,
                    ..Details::default()
                };
                (*name, details)
            })
            .collect();
        let events = events.iter().map(|(name, details)| event(name, details));
        audit.emit_refs(accepted.into_iter().chain(events));
    } else {
        let name = if duplicate { "deduplicated" } else { "routed" };
        let details = Details {
            seq,
            ..Details::default()
        };
        audit.emit_refs(accepted.into_iter().chain([event(name, &details)]));
    }
}
