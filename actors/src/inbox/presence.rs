//! The presence beats of an attached inbox ([`protocol::presence`]): a record `online` in the
//! presence bucket under the agent's identity every beat, and `offline` when the inbox stops
//! cleanly. A beat that cannot be written is counted and tried again at the next one.

use std::time::Duration;

use async_nats::jetstream;
use protocol::presence::PresenceRecord;
use protocol::{subjects, AgentId};

use super::InboxCounters;

/// How long one write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes `record` as `id`'s presence.
///
/// # Errors
/// [`AckedError`](crate::streams::AckedError) when the broker did not store it in time.
pub(super) async fn write(
    js: &jetstream::Context,
    id: &AgentId,
    record: &PresenceRecord,
) -> Result<(), crate::streams::AckedError> {
    let subject = subjects::kv_subject(subjects::PRESENCE_BUCKET, id.as_str());
    let payload = serde_json::to_vec(record).expect("a presence record serializes");
    crate::streams::publish_acked(
        js,
        subject,
        async_nats::HeaderMap::new(),
        payload.into(),
        WRITE_TIMEOUT,
    )
    .await
    .map(|_| ())
}

/// Beats `online` for `id` every `every`, the first at once, until dropped (its owner, the
/// inbox's state, aborts it).
pub(super) async fn beat(
    js: jetstream::Context,
    id: AgentId,
    every: Duration,
    counters: std::sync::Arc<InboxCounters>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let record = PresenceRecord::online(protocol::expiry::now_ms(), every.as_secs());
        // Boxed: between beats the task holds only its timer.
        match Box::pin(write(&js, &id, &record)).await {
            Ok(()) => counters.presence_beats.bump(),
            Err(e) => {
                counters.presence_failures.bump();
                tracing::warn!(id = %id, error = %e, "presence beat not stored");
            }
        }
    }
}
