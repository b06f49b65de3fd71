//! The audit trail: one event per transition of a DM or a task, and the timeline
//! `runtime trace` prints from them.
//!
//! Every process that moves a message emits [`AuditEvent`]s. They are batched (an
//! [`AuditBatch`] per message, at most [`MAX_BATCH`] events) and published without waiting for a store ack on
//! `hub.audit.<role>.<name>` ([`crate::subjects::audit`]), which the `HUB_AUDIT` stream keeps;
//! emitting never makes the hot path wait, and an event that cannot be queued is dropped and
//! counted instead. [`timeline`] orders the events of one message or task.
//!
//! ```
//! use protocol::audit::{timeline, AuditEvent};
//!
//! let routed = AuditEvent::msg("routed", "m1", 1_005, "router:r1");
//! let accepted = AuditEvent::msg("accepted", "m1", 1_000, "router:r1");
//! let other = AuditEvent::msg("routed", "m2", 1_001, "router:r1");
//! let rows = timeline(&[routed, other, accepted], "m1");
//! assert_eq!(rows.iter().map(|r| (r.event.event.as_ref(), r.after_ms)).collect::<Vec<_>>(),
//!            [("accepted", 0), ("routed", 5)]);
//! ```

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

mod fast;
mod wire;

pub use wire::{BatchError, EncodedEvents, EVENTS};

/// Most events in one published batch.
pub const MAX_BATCH: usize = 1024;

/// What one audit message holds: the events of one emitter, in the order it emitted them.
/// The emitter is named once, here; [`AuditBatch::into_events`] puts it on each event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditBatch {
    /// `<role>:<name>` of the emitter.
    pub actor: String,
    /// Its events (their own `actor` left empty on the wire).
    pub events: Vec<AuditEvent>,
}

impl AuditBatch {
    /// The events, each naming the batch's actor.
    pub fn into_events(self) -> Vec<AuditEvent> {
        let actor = self.actor;
        self.events
            .into_iter()
            .map(|mut e| {
                if e.actor.is_empty() {
                    e.actor.clone_from(&actor);
                }
                e
            })
            .collect()
    }
}

/// One transition, as stored in `HUB_AUDIT` (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// What happened: `accepted`, `routed`, `fetched`, `delivered`, ... (docs/PROTOCOL.md).
    pub event: Cow<'static, str>,
    /// The DM's `meta.id`, for a DM's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_id: Option<String>,
    /// The task, for a task's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The W3C trace id the message carried, when it carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// When, unix ms (the emitter's clock; the ingress stream's for `accepted`).
    pub at: u64,
    /// Who: `<role>:<name>` of the emitting process (`router:<actor>`, `inbox:<agent>`, ...);
    /// on the wire it is the batch's ([`AuditBatch`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub actor: String,
    /// The delivery attempt (the broker's delivery count), where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    /// Whatever else the event says (sequences, kinds, delays, reasons).
    #[serde(default, skip_serializing_if = "Details::is_empty")]
    pub details: Details,
}

/// What an event says beyond its kind: each field only where it applies (docs/PROTOCOL.md,
/// "Audit trail"). Typed, so building one allocates nothing but its texts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Details {
    /// The stored message's sequence (`routed`, `deduplicated`, `result_published`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The ingress sequence (`accepted`, `rejected`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_seq: Option<u64>,
    /// The inbox stream sequence an inbox saw (`fetched`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_seq: Option<u64>,
    /// The DM's inbox sequence (`expired`, `dead_lettered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbox_seq: Option<u64>,
    /// A task input's work sequence (`dead_lettered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_seq: Option<u64>,
    /// The handler's retry delay (`nacked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// A limit's wait (`rejected`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    /// Items of a bundle (`result_published`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<u64>,
    /// The dead letter (`replayed`, `discarded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dlq_id: Option<u64>,
    /// The store was a duplicate (`result_published`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// The wire error kind (`rejected`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Why (`rejected` by a handler, `dead_lettered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A task's state (`state_changed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::task::TaskState>,
}

impl Details {
    /// Whether it says nothing.
    pub fn is_empty(&self) -> bool {
        *self == Details::default()
    }
}

impl AuditEvent {
    /// An event of DM `msg_id`.
    pub fn msg(event: &'static str, msg_id: &str, at: u64, actor: &str) -> AuditEvent {
        AuditEvent {
            event: Cow::Borrowed(event),
            msg_id: Some(msg_id.to_owned()),
            task_id: None,
            trace_id: None,
            at,
            actor: actor.to_owned(),
            attempt: None,
            details: Details::default(),
        }
    }

    /// An event of task `task_id`.
    pub fn task(event: &'static str, task_id: &str, at: u64, actor: &str) -> AuditEvent {
        AuditEvent {
            task_id: Some(task_id.to_owned()),
            msg_id: None,
            ..AuditEvent::msg(event, "", at, actor)
        }
    }

    /// With the delivery attempt.
    #[must_use]
    pub fn attempt(mut self, attempt: u64) -> AuditEvent {
        self.attempt = Some(attempt);
        self
    }

    /// With `details`.
    #[must_use]
    pub fn details(mut self, details: Details) -> AuditEvent {
        self.details = details;
        self
    }

    /// With the trace id of a `traceparent` (`00-<trace id>-<span id>-<flags>`), if it is one.
    #[must_use]
    pub fn traced(mut self, traceparent: Option<&str>) -> AuditEvent {
        self.trace_id = trace_id_of(traceparent);
        self
    }

    /// The event borrowed, to encode ([`EncodedEvents::push`]).
    pub fn borrowed(&self) -> EventRef<'_> {
        EventRef {
            event: &self.event,
            msg_id: self.msg_id.as_deref(),
            task_id: self.task_id.as_deref(),
            trace_id: self.trace_id.as_deref(),
            at: self.at,
            attempt: self.attempt,
            details: &self.details,
        }
    }

    /// Whether this event is about `id` (a DM's `meta.id` or a task id).
    pub fn is_about(&self, id: &str) -> bool {
        self.msg_id.as_deref() == Some(id) || self.task_id.as_deref() == Some(id)
    }
}

/// An [`AuditEvent`] made of borrowed parts, with no actor (its batch names it): what a hot
/// path builds and an emitter encodes at once, allocating nothing.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    /// [`AuditEvent::event`].
    pub event: &'a str,
    /// [`AuditEvent::msg_id`].
    pub msg_id: Option<&'a str>,
    /// [`AuditEvent::task_id`].
    pub task_id: Option<&'a str>,
    /// [`AuditEvent::trace_id`].
    pub trace_id: Option<&'a str>,
    /// [`AuditEvent::at`].
    pub at: u64,
    /// [`AuditEvent::attempt`].
    pub attempt: Option<u64>,
    /// [`AuditEvent::details`].
    pub details: &'a Details,
}

/// No details: what most events say.
static NO_DETAILS: Details = Details {
    seq: None,
    ingress_seq: None,
    stream_seq: None,
    inbox_seq: None,
    work_seq: None,
    delay_ms: None,
    retry_after_secs: None,
    items: None,
    dlq_id: None,
    duplicate: None,
    kind: None,
    reason: None,
    state: None,
};

impl<'a> EventRef<'a> {
    /// An event of DM `msg_id` (or of task `task_id`, when `task` holds).
    pub fn of(event: &'a str, id: &'a str, task: bool, at: u64) -> EventRef<'a> {
        EventRef {
            event,
            msg_id: (!task).then_some(id),
            task_id: task.then_some(id),
            trace_id: None,
            at,
            attempt: None,
            details: &NO_DETAILS,
        }
    }

    /// With the trace id.
    #[must_use]
    pub fn traced(mut self, trace_id: Option<&'a str>) -> EventRef<'a> {
        self.trace_id = trace_id;
        self
    }

    /// With the delivery attempt.
    #[must_use]
    pub fn attempt(mut self, attempt: u64) -> EventRef<'a> {
        self.attempt = Some(attempt);
        self
    }

    /// With `details`.
    #[must_use]
    pub fn details(mut self, details: &'a Details) -> EventRef<'a> {
        self.details = details;
        self
    }
}

/// The trace id (32 hex digits) of a `traceparent` header value, if it is one: what an event
/// names as its `trace_id` (parse it once for all the events of a message).
pub fn trace_id_of(traceparent: Option<&str>) -> Option<String> {
    traceparent
        .and_then(|t| t.parse::<crate::trace::TraceParent>().ok())
        .map(|t| t.trace_id_hex())
}

/// What a stored message's events are about, from where the router stores it
/// ([`Dest::about`](crate::routing::Dest::about)): a DM (its `meta.id`), a task (its id: a task
/// input's, or a task channel's key), or nothing the trail follows (`None`: broadcasts,
/// answers, notices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum About {
    /// A DM to an inbox.
    Msg(String),
    /// A task input (`work.>`) or a message on its task channel (`channel.task.>`).
    Task {
        /// The task id.
        task_id: String,
        /// A task channel message (a worker's result or status), not the input.
        channel: bool,
    },
}

/// The task events a message on a task's channel stands for, in order: every status or
/// result is `state_changed` (with its state); a status `running` is also `started`, a result
/// is `result_published` (and `cancelled` when it is one); an answer's refusal is none.
pub fn channel_events(
    body: &crate::task::TaskChannelBody,
) -> Vec<(&'static str, Option<crate::task::TaskState>)> {
    use crate::task::{TaskChannelBody, TaskState};
    match body {
        TaskChannelBody::Status(s) => {
            let mut out = vec![("state_changed", Some(s.state))];
            if s.state == TaskState::Running {
                out.push(("started", None));
            }
            out
        }
        TaskChannelBody::Result(r) => {
            let mut out = vec![("state_changed", Some(r.state)), ("result_published", None)];
            if r.state == TaskState::Cancelled {
                out.push(("cancelled", None));
            }
            out
        }
        TaskChannelBody::AnswerRefused(_) => Vec::new(),
    }
}

/// One row of a timeline: the event and how long after the first one it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineRow {
    /// Milliseconds after the first event of the timeline.
    pub after_ms: u64,
    /// The event.
    #[serde(flatten)]
    pub event: AuditEvent,
}

/// Where an event falls among others of the same millisecond (clocks have 1 ms steps, and
/// different processes emit them): the order a message goes through them.
fn rank(event: &str) -> u8 {
    match event {
        "accepted" => 0,
        "routed" | "deduplicated" | "rejected" => 1,
        "fetched" => 2,
        "redelivered" => 3,
        "nacked" | "delivered" | "expired" => 4,
        "state_changed" | "started" => 5,
        "read" | "result_published" | "answered" | "cancelled" => 6,
        _ => 7,
    }
}

/// The events about `id`, in time order (within a millisecond, in the order a message goes
/// through them; then as read), each with its time after the first.
pub fn timeline(events: &[AuditEvent], id: &str) -> Vec<TimelineRow> {
    let mut about: Vec<&AuditEvent> = events.iter().filter(|e| e.is_about(id)).collect();
    about.sort_by_key(|e| (e.at, rank(&e.event)));
    let first = about.first().map(|e| e.at).unwrap_or(0);
    about
        .into_iter()
        .map(|e| TimelineRow {
            after_ms: e.at.saturating_sub(first),
            event: e.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_have_a_stable_shape() {
        let e = AuditEvent::msg("fetched", "m1", 7, "inbox:bob")
            .attempt(2)
            .details(Details {
                stream_seq: Some(4),
                ..Details::default()
            })
            .traced(Some(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ));
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"event": "fetched", "msg_id": "m1",
                "trace_id": "0af7651916cd43dd8448eb211c80319c", "at": 7,
                "actor": "inbox:bob", "attempt": 2, "details": {"stream_seq": 4}})
        );
        let t = AuditEvent::task("started", "t1", 9, "worker:w1");
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!({"event": "started", "task_id": "t1", "at": 9, "actor": "worker:w1"})
        );
        assert_eq!(
            AuditEvent::msg("x", "m", 0, "a")
                .traced(Some("junk"))
                .trace_id,
            None
        );
    }

    #[test]
    fn a_batch_round_trips_in_about_half_its_json() {
        let events: Vec<AuditEvent> = (0..100)
            .map(|n| {
                AuditEvent::msg(
                    "fetched",
                    &format!("18d2f3a4b5c-{n:x}-1f"),
                    1_764_612_345_678 + n,
                    "",
                )
                .attempt(1)
                .details(Details {
                    stream_seq: Some(1000 + n),
                    ..Details::default()
                })
            })
            .collect();
        let batch = AuditBatch {
            actor: "inbox:bob".into(),
            events,
        };
        let bytes = batch.encode();
        let json = serde_json::to_vec(&batch).unwrap();
        assert!(
            bytes.len() * 10 < json.len() * 7,
            "{} vs {}",
            bytes.len(),
            json.len()
        );
        let back = AuditBatch::decode(&bytes).unwrap();
        let events = back.clone().into_events();
        assert_eq!(events.len(), 100);
        assert!(events.iter().all(|e| e.actor == "inbox:bob"));
        assert_eq!(events[7].at, 1_764_612_345_685);
        assert_eq!(events[7].details.stream_seq, Some(1007));
        assert!(AuditBatch::decode(b"not msgpack").is_err());
    }

    #[test]
    fn a_task_channel_message_stands_for_its_task_events() {
        use crate::task::{StatusEvent, TaskChannelBody, TaskResult, TaskState};
        use crate::{AttemptId, TaskId, WorkerId};
        let (task, attempt, worker) = (
            TaskId::new("t").unwrap(),
            AttemptId::new("a").unwrap(),
            WorkerId::new("w").unwrap(),
        );
        let running = TaskChannelBody::Status(StatusEvent::new(
            task.clone(),
            attempt.clone(),
            worker.clone(),
            1,
            TaskState::Running,
            0,
        ));
        assert_eq!(
            channel_events(&running),
            [
                ("state_changed", Some(TaskState::Running)),
                ("started", None)
            ]
        );
        let cancelled = TaskChannelBody::Result(TaskResult {
            task_id: task,
            attempt_id: attempt,
            worker_id: worker,
            state: TaskState::Cancelled,
            response: None,
            error: None,
            suspend: None,
            answer_route: None,
        });
        assert_eq!(
            channel_events(&cancelled),
            [
                ("state_changed", Some(TaskState::Cancelled)),
                ("result_published", None),
                ("cancelled", None)
            ]
        );
    }

    proptest! {
        /// A timeline holds exactly the events about its id, in time order, from 0.
        #[test]
        fn a_timeline_is_ordered_and_complete(ats in proptest::collection::vec((0u64..10_000, any::<bool>()), 0..50)) {
            let events: Vec<AuditEvent> = ats
                .iter()
                .map(|(at, mine)| AuditEvent::msg("e", if *mine { "m1" } else { "m2" }, *at, "a"))
                .collect();
            let rows = timeline(&events, "m1");
            prop_assert_eq!(rows.len(), ats.iter().filter(|(_, m)| *m).count());
            prop_assert!(rows.windows(2).all(|w| w[0].event.at <= w[1].event.at));
            if let Some(first) = rows.first() {
                prop_assert_eq!(first.after_ms, 0);
            }
        }
    }
}
