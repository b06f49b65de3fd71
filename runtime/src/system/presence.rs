//! Presence as a client sees it ([`protocol::presence`]): the state a send's receipt names
//! for its recipient, and the list `runtime presence` and `runtime status` print.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use protocol::presence::{state_of, PresenceRecord, PresenceState};
use protocol::{subjects, AgentId};
use serde::{Deserialize, Serialize};

use super::SystemError;

/// How long one presence read may take before the receipt says `unknown`.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The recipients' states a system read lately: a send reads a recipient's record at most once
/// per `ttl` (a fifth of the beat, at most 5 s), so a stream of sends costs no read each.
#[derive(Debug)]
pub(crate) struct PresenceCache {
    ttl: Duration,
    seen: Mutex<HashMap<AgentId, (Instant, PresenceState)>>,
}

impl PresenceCache {
    /// A cache for a hub whose inboxes beat every `beat`.
    pub fn new(beat: Duration) -> PresenceCache {
        PresenceCache {
            ttl: (beat / 5).min(Duration::from_secs(5)),
            seen: Mutex::default(),
        }
    }

    /// `to`'s state now: from the cache, else one direct get of its record.
    pub async fn state(&self, client: &async_nats::Client, to: &AgentId) -> PresenceState {
        if let Some((at, state)) = self.seen.lock().expect("presence lock").get(to) {
            if at.elapsed() < self.ttl {
                return *state;
            }
        }
        let state = match tokio::time::timeout(READ_TIMEOUT, read(client, to)).await {
            Ok(record) => state_of(record.as_ref(), protocol::expiry::now_ms()),
            Err(_) => PresenceState::Unknown,
        };
        let mut seen = self.seen.lock().expect("presence lock");
        if seen.len() > 10_000 {
            seen.clear();
        }
        seen.insert(to.clone(), (Instant::now(), state));
        state
    }
}

/// `id`'s record: one subject-suffixed direct get (what every agent may read).
async fn read(client: &async_nats::Client, id: &AgentId) -> Option<PresenceRecord> {
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream_no_info(subjects::kv_stream(subjects::PRESENCE_BUCKET))
        .await
        .ok()?;
    let message = stream
        .direct_get_last_for_subject(subjects::kv_subject(subjects::PRESENCE_BUCKET, id.as_str()))
        .await
        .ok()?;
    serde_json::from_slice(&message.payload).ok()
}

/// One agent's presence, as `runtime presence` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresenceEntry {
    /// The agent.
    pub agent: String,
    /// What its last record says now.
    pub state: PresenceState,
    /// When it was last seen (its last record), unix ms.
    pub last_seen_ms: u64,
    /// Seconds since then.
    pub seen_secs_ago: u64,
}

/// Every agent's presence, by name: the keys of the presence bucket and their records (an
/// operator's read: listing keys takes a consumer, which only admins may make).
///
/// # Errors
/// [`SystemError::Request`] when the bucket cannot be listed.
pub async fn list(client: &async_nats::Client) -> Result<Vec<PresenceEntry>, SystemError> {
    let subject = subjects::kv_subject(subjects::PRESENCE_BUCKET, ">");
    let js = jetstream::new(client.clone());
    let kv = js
        .get_key_value(subjects::PRESENCE_BUCKET)
        .await
        .map_err(|e| SystemError::request(&subject, e))?;
    let mut keys = kv
        .keys()
        .await
        .map_err(|e| SystemError::request(&subject, e))?;
    let now = protocol::expiry::now_ms();
    let mut out = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| SystemError::request(&subject, e))?;
        let Ok(Some(value)) = kv.get(&key).await else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<PresenceRecord>(&value) else {
            continue;
        };
        out.push(PresenceEntry {
            agent: key,
            state: state_of(Some(&record), now),
            last_seen_ms: record.at_ms,
            seen_secs_ago: now.saturating_sub(record.at_ms) / 1000,
        });
    }
    out.sort_by(|a, b| a.agent.cmp(&b.agent));
    Ok(out)
}
