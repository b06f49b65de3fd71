//! The audit trail: one event per transition of a DM or a task, and the timeline
//! `runtime trace` prints from them.
//!
//! Every process that moves a message emits [`AuditEvent`]s. They are batched (an array of
//! events per message, at most [`MAX_BATCH`]) and published without waiting for a store ack on
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
//! assert_eq!(rows.iter().map(|r| (r.event.event.as_str(), r.after_ms)).collect::<Vec<_>>(),
//!            [("accepted", 0), ("routed", 5)]);
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most events in one published batch.
pub const MAX_BATCH: usize = 256;

/// One transition, as stored in `HUB_AUDIT` (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// What happened: `accepted`, `routed`, `fetched`, `delivered`, ... (docs/PROTOCOL.md).
    pub event: String,
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
    /// Who: `<role>:<name>` of the emitting process (`router:<actor>`, `inbox:<agent>`, ...).
    pub actor: String,
    /// The delivery attempt (the broker's delivery count), where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    /// Whatever else the event says (sequences, kinds, delays, reasons).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

impl AuditEvent {
    /// An event of DM `msg_id`.
    pub fn msg(event: &str, msg_id: &str, at: u64, actor: &str) -> AuditEvent {
        AuditEvent {
            event: event.to_owned(),
            msg_id: Some(msg_id.to_owned()),
            task_id: None,
            trace_id: None,
            at,
            actor: actor.to_owned(),
            attempt: None,
            details: Value::Null,
        }
    }

    /// An event of task `task_id`.
    pub fn task(event: &str, task_id: &str, at: u64, actor: &str) -> AuditEvent {
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
    pub fn details(mut self, details: Value) -> AuditEvent {
        self.details = details;
        self
    }

    /// With the trace id of a `traceparent` (`00-<trace id>-<span id>-<flags>`), if it is one.
    #[must_use]
    pub fn traced(mut self, traceparent: Option<&str>) -> AuditEvent {
        self.trace_id = traceparent
            .and_then(|t| t.parse::<crate::trace::TraceParent>().ok())
            .map(|t| t.trace_id_hex());
        self
    }

    /// Whether this event is about `id` (a DM's `meta.id` or a task id).
    pub fn is_about(&self, id: &str) -> bool {
        self.msg_id.as_deref() == Some(id) || self.task_id.as_deref() == Some(id)
    }
}

/// What a stored message's events are about, from where the router stores it: a DM (its
/// `meta.id`), a task (its id: a task input's, from its `Nats-Msg-Id`, or a task channel's
/// key), or nothing the trail follows (`None`: broadcasts, answers, notices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
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

/// [`Subject`] of a message the router stores on `subject` under `msg_id`, with `meta.id` `id`.
pub fn subject_of(subject: &str, msg_id: &str, id: &str) -> Option<Subject> {
    if subject.starts_with(crate::subjects::INBOX_PREFIX) {
        return Some(Subject::Msg(id.to_owned()));
    }
    if crate::subjects::is_work(subject) {
        let rest = msg_id.strip_prefix(crate::task::TASK_MSG_ID_PREFIX)?;
        let (_, task_id) = rest.split_once(':')?;
        return Some(Subject::Task {
            task_id: task_id.to_owned(),
            channel: false,
        });
    }
    let channel = crate::subjects::parse_task(subject).ok()?;
    Some(Subject::Task {
        task_id: channel.key.to_string(),
        channel: true,
    })
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

/// The events about `id`, in time order (ties keep the order they were read in), each with its
/// time after the first.
pub fn timeline(events: &[AuditEvent], id: &str) -> Vec<TimelineRow> {
    let mut about: Vec<&AuditEvent> = events.iter().filter(|e| e.is_about(id)).collect();
    about.sort_by_key(|e| e.at);
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
            .details(serde_json::json!({"stream_seq": 4}))
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
    fn the_router_knows_what_a_stored_message_is_about() {
        assert_eq!(
            subject_of("channel.inbox.bob", "hub-router:alice:m1", "m1"),
            Some(Subject::Msg("m1".into()))
        );
        assert_eq!(
            subject_of("work.q", "hub-task:alice:t1", "e1"),
            Some(Subject::Task {
                task_id: "t1".into(),
                channel: false
            })
        );
        assert_eq!(
            subject_of("channel.task.alice.t1", "hub-router:w1:r1", "r1"),
            Some(Subject::Task {
                task_id: "t1".into(),
                channel: true
            })
        );
        assert_eq!(subject_of("answer.w1", "hub-router:alice:a1", "a1"), None);
        assert_eq!(subject_of("channel.news", "", "b1"), None);
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
