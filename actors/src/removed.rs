//! The routers' set of removed agents ([`protocol::removal::RemovedSet`]), kept in memory and
//! fed by a watch of the tombstones in [`REMOVED_BUCKET`](protocol::subjects::REMOVED_BUCKET),
//! so that refusing a DM to a removed agent is a lookup, never a KV read.
//!
//! The watch is what a KV watch is (an ordered consumer on the bucket's stream, delivering the
//! last entry of every key, then every change), made as an ordered *pull* consumer: routers
//! make pull consumers only (docs/SECURITY.md). [`watch`] reads every tombstone before it
//! returns, so a router that starts knows them all before it routes; the task it returns keeps
//! the set current, and reads it again from scratch after a reconnect or a failed pull (a
//! tombstone deleted meanwhile is forgotten then). The task is owned by the router's state and
//! ends with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::{self, Message};
use async_nats::Client;
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::removal::{change_of, Change, RemovedSet};
use protocol::subjects::{kv_stream, kv_subject, REMOVED_BUCKET};
use protocol::AgentId;

use crate::background::Owned;
use crate::streams::STREAM_API_TIMEOUT;

/// How often the watch checks whether the connection was re-established.
const RECONNECT_CHECK: Duration = Duration::from_secs(1);
/// The pause after a failed read of the bucket before the next.
const RETRY: Duration = Duration::from_secs(1);

/// Why the removed agents could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The bucket's stream could not be read.
    #[error("cannot watch the removed agents ({REMOVED_BUCKET})")]
    Watch(#[source] async_nats::Error),
    /// It did not answer in time.
    #[error("the removed agents ({REMOVED_BUCKET}) were not read within {0:?}")]
    Timeout(Duration),
}

/// A handle on the set (cheap to clone): what the router looks up per DM.
#[derive(Clone, Default)]
pub struct RemovedAgents {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    set: RwLock<RemovedSet>,
    /// The set's size: most hubs have no removed agent, and then a lookup takes no lock.
    len: AtomicUsize,
}

impl RemovedAgents {
    /// Whether `agent` is removed.
    pub fn contains(&self, agent: &AgentId) -> bool {
        self.shared.len.load(Ordering::Acquire) > 0
            && self
                .shared
                .set
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains(agent)
    }

    /// How many agents are removed.
    pub fn len(&self) -> usize {
        self.shared.len.load(Ordering::Acquire)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn update(&self, f: impl FnOnce(&mut RemovedSet)) {
        let mut set = self.shared.set.write().unwrap_or_else(|e| e.into_inner());
        f(&mut set);
        self.shared.len.store(set.len(), Ordering::Release);
    }
}

/// Reads every tombstone, then returns the set and the task that keeps it current (owned by
/// the caller; the watch ends when it is dropped).
///
/// # Errors
/// [`WatchError`] when the bucket cannot be read within [`STREAM_API_TIMEOUT`].
pub async fn watch(client: Client) -> Result<(RemovedAgents, Owned), WatchError> {
    let js = jetstream::new(client.clone());
    let connects = connects(&client);
    let (set, messages) = open(&js).await?;
    let removed = RemovedAgents::default();
    removed.update(|s| *s = set);
    tracing::info!(removed = removed.len(), "removed agents read");
    let task = crate::background::spawn(keep(client, js, removed.clone(), messages, connects));
    Ok((removed, task))
}

fn connects(client: &Client) -> u64 {
    client.statistics().connects.load(Ordering::Acquire)
}

/// Makes the watch and reads the current tombstones: the set as of now, and the messages of
/// every later change.
async fn open(js: &jetstream::Context) -> Result<(RemovedSet, pull::Ordered), WatchError> {
    let read = async {
        let consumer = js
            .create_consumer_on_stream(
                pull::OrderedConfig {
                    filter_subject: kv_subject(REMOVED_BUCKET, ">"),
                    deliver_policy: DeliverPolicy::LastPerSubject,
                    description: Some("routers' watch of the removed agents".into()),
                    ..Default::default()
                },
                kv_stream(REMOVED_BUCKET),
            )
            .await?;
        let mut left = consumer.cached_info().num_pending;
        let mut messages = consumer.messages().await?;
        let mut set = RemovedSet::default();
        while left > 0 {
            let msg = messages.next().await.ok_or("the watch ended")??;
            apply(&mut set, &msg);
            left = msg.info()?.pending;
        }
        Ok::<_, async_nats::Error>((set, messages))
    };
    tokio::time::timeout(STREAM_API_TIMEOUT, read)
        .await
        .map_err(|_| WatchError::Timeout(STREAM_API_TIMEOUT))?
        .map_err(WatchError::Watch)
}

/// The change a message of the removed bucket's stream makes, from its headers.
fn change_of_headers(headers: Option<&async_nats::HeaderMap>) -> Change {
    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    change_of(
        header(protocol::headers::KV_OPERATION),
        header(protocol::headers::NATS_MARKER_REASON),
    )
}

/// Whether `id` has a tombstone now: one subject-suffixed direct get of its key (what routers,
/// agents and workers are granted), within [`STREAM_API_TIMEOUT`]. A key deleted by `runtime
/// agent restore` reads as its delete marker, or as nothing once purged: not removed.
///
/// # Errors
/// Why the key could not be read (no bucket, no answer in time, no permission).
pub async fn is_removed(js: &jetstream::Context, id: &AgentId) -> Result<bool, async_nats::Error> {
    use async_nats::jetstream::stream::DirectGetErrorKind;
    let read = async {
        let stream = js.get_stream_no_info(kv_stream(REMOVED_BUCKET)).await?;
        match stream
            .direct_get_last_for_subject(kv_subject(REMOVED_BUCKET, id.as_str()))
            .await
        {
            Ok(message) => Ok(change_of_headers(Some(&message.headers)) == Change::Put),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    };
    tokio::time::timeout(STREAM_API_TIMEOUT, read)
        .await
        .map_err(|_| format!("no answer within {STREAM_API_TIMEOUT:?}"))?
}

fn apply(set: &mut RemovedSet, msg: &Message) {
    let prefix = kv_subject(REMOVED_BUCKET, "");
    let Some(key) = msg.subject.as_str().strip_prefix(&prefix) else {
        return;
    };
    let change = change_of_headers(msg.headers.as_ref());
    if set.apply(key, change) {
        tracing::info!(agent = key, ?change, "removed agents changed");
    }
}

/// Applies every change as it comes; after a reconnect or a failed pull, reads the whole
/// bucket again and replaces the set (the old one stays in use until then).
async fn keep(
    client: Client,
    js: jetstream::Context,
    removed: RemovedAgents,
    mut messages: pull::Ordered,
    mut seen_connects: u64,
) {
    let mut tick = tokio::time::interval(RECONNECT_CHECK);
    loop {
        let again = tokio::select! {
            next = messages.next() => match next {
                Some(Ok(msg)) => {
                    removed.update(|set| apply(set, &msg));
                    false
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %ErrorChain(&e), "the watch of the removed agents failed; reading them again");
                    true
                }
                None => true,
            },
            _ = tick.tick() => connects(&client) != seen_connects,
        };
        if !again {
            continue;
        }
        loop {
            let now = connects(&client);
            match open(&js).await {
                Ok((set, fresh)) => {
                    removed.update(|s| *s = set);
                    messages = fresh;
                    seen_connects = now;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %ErrorChain(&e), "cannot read the removed agents; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker with the hub's streams and buckets, a client of it and its context.
    async fn broker() -> (harness::NatsServer, async_nats::Client, jetstream::Context) {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let js = jetstream::new(client.clone());
        crate::streams::ensure_streams(&js, &protocol::DeliveryConfig::default())
            .await
            .unwrap();
        (server, client, js)
    }

    async fn put(js: &jetstream::Context, key: &str) {
        let kv = js.get_key_value(REMOVED_BUCKET).await.unwrap();
        kv.put(key, "{}".into()).await.unwrap();
    }

    #[tokio::test]
    async fn a_watch_knows_the_existing_tombstones_and_follows_changes() {
        let (_server, client, js) = broker().await;
        put(&js, "bob").await;
        put(&js, "carol").await;
        let kv = js.get_key_value(REMOVED_BUCKET).await.unwrap();
        kv.delete("carol").await.unwrap();
        let (removed, _task) = watch(client.clone()).await.unwrap();
        let (bob, carol) = (AgentId::new("bob").unwrap(), AgentId::new("carol").unwrap());
        // Known before `watch` returns.
        assert!(removed.contains(&bob));
        assert!(!removed.contains(&carol));
        assert_eq!(removed.len(), 1);
        put(&js, "carol").await;
        kv.delete("bob").await.unwrap();
        harness::wait_until("the watch follows", Duration::from_secs(10), || {
            removed.contains(&carol) && !removed.contains(&bob)
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn the_watch_is_made_again_after_the_broker_restarts() {
        let (mut server, client, js) = broker().await;
        put(&js, "bob").await;
        let (removed, _task) = watch(client.clone()).await.unwrap();
        let before = connects(&client);
        server.restart().await.unwrap();
        harness::wait_until("reconnected", Duration::from_secs(10), || {
            connects(&client) > before
        })
        .await
        .unwrap();
        let kv = js.get_key_value(REMOVED_BUCKET).await.unwrap();
        kv.delete("bob").await.unwrap();
        put(&js, "carol").await;
        let (bob, carol) = (AgentId::new("bob").unwrap(), AgentId::new("carol").unwrap());
        harness::wait_until("the watch follows again", Duration::from_secs(20), || {
            removed.contains(&carol) && !removed.contains(&bob)
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn an_empty_bucket_is_read_at_once() {
        let (_server, client, js) = broker().await;
        let (removed, _task) = watch(client).await.unwrap();
        assert!(removed.is_empty());
        put(&js, "bob").await;
        harness::wait_until("a put is seen", Duration::from_secs(10), || {
            removed.contains(&AgentId::new("bob").unwrap())
        })
        .await
        .unwrap();
    }
}
