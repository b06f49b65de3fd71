//! `runtime trace`: the timeline of one DM or task from the audit trail
//! ([`protocol::audit`]).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures::StreamExt;
use protocol::audit::{timeline, AuditBatch, AuditEvent, TimelineRow};
use protocol::subjects;

use super::SystemError;

/// How long the read waits for the next batch before it takes the trail as read.
const IDLE: Duration = Duration::from_secs(1);

/// The timeline of `id` (a DM's `meta.id` or a task id): every event about it in `HUB_AUDIT`,
/// in time order, each with its time after the first. Reads the whole trail with an ordered
/// consumer (an operator's read: only admins may make one).
///
/// # Errors
/// [`SystemError::Request`] when the audit stream cannot be read.
pub async fn trace(client: &async_nats::Client, id: &str) -> Result<Vec<TimelineRow>, SystemError> {
    let subject = subjects::AUDIT_FILTER;
    let failed = |e: async_nats::Error| SystemError::request(subject, e);
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream(subjects::AUDIT_STREAM)
        .await
        .map_err(|e| failed(e.into()))?;
    if stream.cached_info().state.messages == 0 {
        return Ok(Vec::new());
    }
    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .map_err(|e| failed(e.into()))?;
    let mut messages = consumer.messages().await.map_err(|e| failed(e.into()))?;
    let mut events: Vec<AuditEvent> = Vec::new();
    loop {
        let msg = match tokio::time::timeout(IDLE, messages.next()).await {
            Ok(Some(Ok(msg))) => msg,
            Ok(Some(Err(e))) => return Err(failed(e.into())),
            Ok(None) | Err(_) => break,
        };
        if let Ok(batch) = AuditBatch::decode(&msg.payload) {
            events.extend(batch.into_events().into_iter().filter(|e| e.is_about(id)));
        }
        if msg.info().map(|i| i.pending == 0).unwrap_or(false) {
            break;
        }
    }
    Ok(timeline(&events, id))
}
