//! The audit emitter of one actor ([`protocol::audit`]): events are queued without waiting
//! and published in batches, so emitting never makes the hot path wait.
//!
//! [`Auditor::spawn`] returns the handle the actor (and its pumps) emit through, and the
//! flusher task, which the actor's state owns. The flusher publishes up to
//! [`MAX_BATCH`](protocol::audit::MAX_BATCH) events as one JSON array on
//! `hub.audit.<role>.<name>`, at the latest [`FLUSH_EVERY`] after the first of them, with a
//! core publish (no store ack is awaited: the audit trail is best effort). An event that
//! finds the queue full is dropped and counted ([`Auditor::dropped`]); once every handle is
//! dropped the flusher publishes what is left and ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::audit::{AuditEvent, MAX_BATCH};
use tokio::sync::mpsc;

use crate::background::Owned;

/// The longest an event waits in the queue before its batch is published.
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Events queued at most (a burst beyond it is dropped and counted).
pub const QUEUE: usize = 16 * MAX_BATCH;

/// A cheap handle to emit audit events through (clone it into every pump).
#[derive(Clone)]
pub struct Auditor {
    tx: Option<mpsc::Sender<AuditEvent>>,
    actor: Arc<str>,
    dropped: Arc<AtomicU64>,
}

impl Auditor {
    /// An emitter that emits nothing (audit events off, or core mode).
    pub fn off() -> Auditor {
        Auditor {
            tx: None,
            actor: Arc::from(""),
            dropped: Arc::default(),
        }
    }

    /// An emitter for the actor `name` of `role` on `client`, and its flusher task.
    pub fn spawn(client: async_nats::Client, role: &str, name: &str) -> (Auditor, Owned) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let subject = protocol::subjects::audit(role, name);
        let flusher = Owned::spawn(flush(client, subject, rx));
        let auditor = Auditor {
            tx: Some(tx),
            actor: Arc::from(format!("{role}:{name}")),
            dropped: Arc::default(),
        };
        (auditor, flusher)
    }

    /// Whether events go anywhere (builders can skip their work when not).
    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// `<role>:<name>`: what events name as their actor.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Queues `event`, never waiting: a full queue drops it (counted).
    pub fn emit(&self, event: AuditEvent) {
        if let Some(tx) = &self.tx {
            if tx.try_send(event).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A DM event of this actor, now.
    pub fn msg(&self, event: &str, msg_id: &str) -> AuditEvent {
        AuditEvent::msg(event, msg_id, protocol::expiry::now_ms(), &self.actor)
    }

    /// A task event of this actor, now.
    pub fn task(&self, event: &str, task_id: &str) -> AuditEvent {
        AuditEvent::task(event, task_id, protocol::expiry::now_ms(), &self.actor)
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Publishes the queued events in batches until every sender is gone.
async fn flush(client: async_nats::Client, subject: String, mut rx: mpsc::Receiver<AuditEvent>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + FLUSH_EVERY;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(event)) => batch.push(event),
                Ok(None) | Err(_) => break,
            }
        }
        let payload = serde_json::to_vec(&batch).expect("audit events serialize");
        batch.clear();
        if let Err(e) = client.publish(subject.clone(), payload.into()).await {
            tracing::debug!(error = %e, "audit batch not published");
        }
    }
}

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
        for n in 0..300 {
            auditor.emit(auditor.msg("routed", &format!("m{n}")));
        }
        let mut seen = Vec::new();
        while seen.len() < 300 {
            let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(msg.subject.as_str(), "hub.audit.router.sys1/router_a");
            let events: Vec<AuditEvent> = serde_json::from_slice(&msg.payload).unwrap();
            assert!(events.len() <= MAX_BATCH);
            seen.extend(events);
        }
        let ids: Vec<_> = seen.iter().map(|e| e.msg_id.clone().unwrap()).collect();
        assert_eq!(ids, (0..300).map(|n| format!("m{n}")).collect::<Vec<_>>());
        assert!(seen.iter().all(|e| e.actor == "router:sys1/router.a"));
        assert_eq!(auditor.dropped(), 0);
        drop(auditor);
        flusher.join_within(Duration::from_secs(1)).await;
        let off = Auditor::off();
        off.emit(off.msg("x", "y"));
        assert!(!off.is_on());
    }
}
