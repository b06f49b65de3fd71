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

/// What a system read lately of its recipients: their presence states and whether they are
/// removed. A send reads each at most once per `ttl` (a fifth of the beat, at most 5 s), so a
/// stream of sends costs no read each.
#[derive(Debug)]
pub(crate) struct PresenceCache {
    ttl: Duration,
    seen: Recent<PresenceState>,
    removed: Recent<bool>,
}

/// Values read at most once per ttl, for at most [`Recent::MAX`] agents.
#[derive(Debug)]
struct Recent<V>(Mutex<HashMap<AgentId, (Instant, V)>>);

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent(Mutex::default())
    }
}

impl<V: Copy> Recent<V> {
    /// Agents remembered at most (the whole cache is dropped past it).
    const MAX: usize = 10_000;

    fn get(&self, to: &AgentId, ttl: Duration) -> Option<V> {
        let seen = self.0.lock().expect("presence lock");
        seen.get(to)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, v)| *v)
    }

    fn put(&self, to: &AgentId, value: V) {
        let mut seen = self.0.lock().expect("presence lock");
        if seen.len() > Self::MAX {
            seen.clear();
        }
        seen.insert(to.clone(), (Instant::now(), value));
    }
}

impl PresenceCache {
    /// A cache for a hub whose inboxes beat every `beat`.
    pub fn new(beat: Duration) -> PresenceCache {
        PresenceCache {
            ttl: (beat / 5).min(Duration::from_secs(5)),
            seen: Recent::default(),
            removed: Recent::default(),
        }
    }

    /// `to`'s state now: from the cache, else one direct get of its record.
    pub async fn state(&self, client: &async_nats::Client, to: &AgentId) -> PresenceState {
        if let Some(state) = self.seen.get(to, self.ttl) {
            return state;
        }
        let state = match tokio::time::timeout(READ_TIMEOUT, read(client, to)).await {
            Ok(record) => state_of(record.as_ref(), protocol::expiry::now_ms()),
            Err(_) => PresenceState::Unknown,
        };
        self.seen.put(to, state);
        state
    }

    /// Whether `to` is removed (a tombstone in `HUB_REMOVED`): from the cache, else one
    /// direct get of its key. A read that fails says no: the routers refuse its DMs anyway.
    pub async fn is_removed(&self, client: &async_nats::Client, to: &AgentId) -> bool {
        if let Some(removed) = self.removed.get(to, self.ttl) {
            return removed;
        }
        // A read that fails is remembered too: a hub without the bucket costs no read per send.
        let js = jetstream::new(client.clone());
        let read = tokio::time::timeout(READ_TIMEOUT, actors::removed::is_removed(&js, to));
        let removed = matches!(read.await, Ok(Ok(true)));
        self.removed.put(to, removed);
        removed
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
