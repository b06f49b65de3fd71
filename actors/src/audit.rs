//! The audit emitter of one actor ([`protocol::audit`]): events are queued without waiting
//! and published in batches, so emitting never makes the hot path wait.
//!
//! [`Auditor::spawn`] returns the handle the actor (and its pumps) emit through, and the
//! flusher task, which the actor's state owns. An emit pushes the event on a shared buffer
//! (an uncontended lock, no wake-up); every [`FLUSH_EVERY`] the flusher takes the buffer and
//! publishes it as batches of up to [`MAX_BATCH`](protocol::audit::MAX_BATCH) events
//! ([`AuditBatch::encode`]) on `hub.audit.<role>.<name>`, with core publishes (no store ack is
//! awaited: the audit trail is best effort). An event that finds [`QUEUE`] events waiting is
//! dropped and counted ([`Auditor::dropped`]); once every handle is dropped the flusher
//! publishes what is left and ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::audit::{AuditBatch, AuditEvent, MAX_BATCH};

use crate::background::Owned;

/// The longest an event waits before its batch is published.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// Events held at most between two flushes (a burst beyond it is dropped and counted): a
/// window's worth at several hundred thousand events a second.
pub const QUEUE: usize = 32 * MAX_BATCH;

/// What the handles and the flusher share: the events since the last flush.
#[derive(Default)]
struct Shared {
    pending: Mutex<Vec<AuditEvent>>,
    dropped: AtomicU64,
}

/// A cheap handle to emit audit events through (clone it into every pump).
#[derive(Clone)]
pub struct Auditor {
    shared: Option<Arc<Shared>>,
    actor: Arc<str>,
}

impl Auditor {
    /// An emitter that emits nothing (audit events off, or core mode).
    pub fn off() -> Auditor {
        Auditor {
            shared: None,
            actor: Arc::from(""),
        }
    }

    /// An emitter for the actor `name` of `role` on `client`, and its flusher task.
    pub fn spawn(client: async_nats::Client, role: &str, name: &str) -> (Auditor, Owned) {
        let shared = Arc::new(Shared::default());
        let subject = protocol::subjects::audit(role, name);
        let actor: Arc<str> = Arc::from(format!("{role}:{name}"));
        let flusher = Owned::spawn(flush(client, subject, actor.clone(), shared.clone()));
        let auditor = Auditor {
            shared: Some(shared),
            actor,
        };
        (auditor, flusher)
    }

    /// Whether events go anywhere (builders can skip their work when not).
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// `<role>:<name>`: what events name as their actor.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Keeps `event` for the next flush, never waiting on I/O: when [`QUEUE`] events are
    /// already waiting it is dropped (counted).
    pub fn emit(&self, event: AuditEvent) {
        if let Some(shared) = &self.shared {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() < QUEUE {
                pending.push(event);
            } else {
                shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A DM event of this actor, now (its batch names the actor).
    pub fn msg(&self, event: &'static str, msg_id: &str) -> AuditEvent {
        AuditEvent::msg(event, msg_id, protocol::expiry::now_ms(), "")
    }

    /// A task event of this actor, now (its batch names the actor).
    pub fn task(&self, event: &'static str, task_id: &str) -> AuditEvent {
        AuditEvent::task(event, task_id, protocol::expiry::now_ms(), "")
    }

    /// Events dropped because too many were waiting.
    pub fn dropped(&self) -> u64 {
        self.shared
            .as_ref()
            .map_or(0, |s| s.dropped.load(Ordering::Relaxed))
    }
}

/// Publishes `event` alone as process `name` of `role` (`hub.audit.<role>.<name>`) and flushes:
/// for a command or client whose events are rare (`runtime dlq`, an idempotency key's hit).
/// Best effort, as every audit event: a failure is a gap in `runtime trace`, not an error.
pub async fn emit_one(client: &async_nats::Client, role: &str, name: &str, event: AuditEvent) {
    let payload =
        AuditBatch::encode_events(&format!("{role}:{name}"), std::slice::from_ref(&event));
    let subject = protocol::subjects::audit(role, name);
    if let Err(e) = client.publish(subject, payload.into()).await {
        tracing::debug!(error = %e, "audit event not published");
    }
    let _ = client.flush().await;
}

/// Every [`FLUSH_EVERY`], takes what was emitted meanwhile and publishes it in batches of at
/// most [`MAX_BATCH`] (core publishes: no store ack is awaited); ends, after a last flush, once
/// every handle is gone. Emitters only take an uncontended lock to push: nothing wakes the
/// flusher per event. The two buffers swap and keep their room, so a steady stream of events
/// allocates nothing per flush.
async fn flush(client: async_nats::Client, subject: String, actor: Arc<str>, shared: Arc<Shared>) {
    let mut taken: Vec<AuditEvent> = Vec::new();
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let last = Arc::strong_count(&shared) == 1;
        {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut *pending, &mut taken);
        }
        for events in taken.chunks(MAX_BATCH) {
            let batch = AuditBatch::encode_events(&actor, events);
            if let Err(e) = client.publish(subject.clone(), batch.into()).await {
                tracing::debug!(error = %e, "audit batch not published");
            }
        }
        let taken_now = taken.len();
        taken.clear();
        // A burst's room is given back once it is over (an idle emitter holds little).
        if taken_now < KEEP && taken.capacity() > KEEP {
            taken.shrink_to(KEEP);
        }
        if last {
            return;
        }
    }
}

/// The room a buffer keeps between bursts.
const KEEP: usize = MAX_BATCH;

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn events_are_published_in_batches_on_the_actors_subject() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let mut sub = client.subscribe("hub.audit.>").await.unwrap();
        client.flush().await.unwrap();
        let (auditor, flusher) = Auditor::spawn(client.clone(), "router", "sys1/router.a");
        for n in 0..1300 {
            auditor.emit(auditor.msg("routed", &format!("m{n}")));
        }
        let mut seen = Vec::new();
        while seen.len() < 1300 {
            let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(msg.subject.as_str(), "hub.audit.router.sys1/router_a");
            let batch = AuditBatch::decode(&msg.payload).unwrap();
            assert!(batch.events.len() <= MAX_BATCH);
            seen.extend(batch.into_events());
        }
        let ids: Vec<_> = seen.iter().map(|e| e.msg_id.clone().unwrap()).collect();
        assert_eq!(ids, (0..1300).map(|n| format!("m{n}")).collect::<Vec<_>>());
        assert!(seen.iter().all(|e| e.actor == "router:sys1/router.a"));
        assert_eq!(auditor.dropped(), 0);
        // What was emitted just before the last handle went is still published.
        auditor.emit(auditor.msg("delivered", "m-last"));
        drop(auditor);
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .unwrap()
            .unwrap();
        let last = AuditBatch::decode(&msg.payload).unwrap().into_events();
        assert_eq!(last[0].msg_id.as_deref(), Some("m-last"));
        flusher.join_within(Duration::from_secs(1)).await;
        let off = Auditor::off();
        off.emit(off.msg("x", "y"));
        assert!(!off.is_on());
    }
}
