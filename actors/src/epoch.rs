//! Baselines: what a stream held when the current connection (and consumer) began, so that an
//! input stored after it, delivered once, is known to be a first delivery
//! (`protocol::task::must_read_channel`, `protocol::task::router_flags`).
//!
//! A baseline belongs to one connection: it is dropped when the client's connect count moves
//! (a reconnect, which a broker restart always causes) or when its owner says so
//! ([`Baseline::invalidate`]: a consumer found gone, an ack refused), and taken again in the
//! background by [`Baseline::keep_fresh`], which the owner runs as one of its own tasks. While
//! there is none, every input is suspect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use async_nats::Client;
use tokio::sync::Notify;

/// How long the refresher waits after a failed refresh.
const RETRY: Duration = Duration::from_secs(1);

/// A baseline of some facts `M`, taken on connection number `connects`.
pub struct Baseline<M: Copy> {
    client: Client,
    cell: Mutex<Cell<M>>,
    wake: Notify,
}

struct Cell<M> {
    /// Bumped by every invalidation: a refresh that began before one is not kept.
    generation: u64,
    mark: Option<(u64, M)>,
}

impl<M: Copy> Baseline<M> {
    /// An empty baseline (everything suspect) for `client`'s connections.
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Baseline {
            client,
            cell: Mutex::new(Cell {
                generation: 0,
                mark: None,
            }),
            wake: Notify::new(),
        })
    }

    fn connects(&self) -> u64 {
        self.client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cell<M>> {
        self.cell.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The baseline of the current connection, if one was taken on it. A baseline of an
    /// earlier connection is dropped (and a refresh asked for).
    pub fn current(&self) -> Option<M> {
        let now = self.connects();
        let mut cell = self.lock();
        match cell.mark {
            Some((connects, mark)) if connects == now => Some(mark),
            Some(_) => {
                cell.mark = None;
                cell.generation += 1;
                drop(cell);
                self.wake.notify_one();
                None
            }
            None => None,
        }
    }

    /// Drops the baseline (a consumer may have been created again, so delivery counts may
    /// have started over) and asks for a new one.
    pub fn invalidate(&self) {
        {
            let mut cell = self.lock();
            cell.mark = None;
            cell.generation += 1;
        }
        self.wake.notify_one();
    }

    /// Takes a baseline: `read` gathers the facts; they are kept only if no reconnect and no
    /// invalidation happened while it ran.
    ///
    /// # Errors
    /// What `read` returns.
    pub async fn refresh<E, F>(&self, read: F) -> Result<(), E>
    where
        F: std::future::Future<Output = Result<M, E>>,
    {
        let before = (self.lock().generation, self.connects());
        let mark = read.await?;
        let mut cell = self.lock();
        if (cell.generation, self.connects()) == before {
            cell.mark = Some((before.1, mark));
        }
        Ok(())
    }

    /// Keeps the baseline taken: refreshes it with `read` whenever it is missing, pausing
    /// [`RETRY`] after a failure. Runs until dropped (its owner holds it as a task).
    ///
    /// # Cancel safety
    /// Cancel safe: a refresh cut short keeps nothing.
    pub async fn keep_fresh<E, F, Fut>(self: Arc<Self>, read: F)
    where
        E: std::fmt::Display,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<M, E>>,
    {
        loop {
            if self.lock().mark.is_none() {
                if let Err(e) = self.refresh(read()).await {
                    tracing::warn!(error = %e, "cannot take a stream baseline; every input is checked until it is taken");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
                // A refresh that raced an invalidation kept nothing: go again at once.
                if self.lock().mark.is_none() {
                    continue;
                }
            }
            self.wake.notified().await;
        }
    }
}

/// The last sequence of `stream` now (one stream info request).
///
/// # Errors
/// The lookup's error.
pub async fn last_seq(
    js: &jetstream::Context,
    stream: &str,
) -> Result<u64, jetstream::context::GetStreamError> {
    let stream = js.get_stream(stream).await?;
    Ok(stream.cached_info().state.last_sequence)
}

/// What a router knows of the broker it is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerMark {
    /// The ingress stream's last sequence when the connection began.
    pub ingress_last_seq: u64,
    /// When this broker incarnation was first recorded (broker clock), if the work stream
    /// held messages then: until the duplicate window has passed since, the broker may have
    /// forgotten the dedupe ids of tasks consumed before it started.
    /// Unix nanoseconds.
    pub dedupe_lost_since_ns: Option<i128>,
}

/// Why a broker baseline could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum BrokerMarkError {
    /// A stream could not be looked up.
    #[error("cannot look up stream {stream}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: jetstream::context::GetStreamError,
    },
    /// The broker incarnations bucket refused.
    #[error("cannot record the broker incarnation in {bucket}")]
    Record {
        /// The bucket.
        bucket: &'static str,
        /// Why.
        #[source]
        source: async_nats::Error,
    },
}

/// Takes a router's [`BrokerMark`]: the ingress's last sequence, and this broker incarnation's
/// record in [`protocol::subjects::BROKERS_BUCKET`] (created when it is the first router to
/// see it, saying whether the work stream held anything then).
///
/// # Errors
/// [`BrokerMarkError`] when a stream or the bucket does not answer.
pub async fn broker_mark(
    client: &Client,
    js: &jetstream::Context,
    ingress: &str,
    work: &str,
) -> Result<BrokerMark, BrokerMarkError> {
    let stream_err = |stream: &str| {
        let stream = stream.to_owned();
        move |source| BrokerMarkError::Stream { stream, source }
    };
    let bucket = protocol::subjects::BROKERS_BUCKET;
    let record_err = |source: async_nats::Error| BrokerMarkError::Record { bucket, source };
    let ingress_last_seq = last_seq(js, ingress).await.map_err(stream_err(ingress))?;
    let work_last_seq = last_seq(js, work).await.map_err(stream_err(work))?;
    let server_id = client.server_info().server_id;
    let kv = js
        .get_key_value(bucket)
        .await
        .map_err(|e| record_err(e.into()))?;
    let value = if work_last_seq > 0 { "1" } else { "0" };
    match kv.create(&server_id, value.into()).await {
        Ok(_) => {}
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(e) => return Err(record_err(e.into())),
    }
    let entry = kv
        .entry(&server_id)
        .await
        .map_err(|e| record_err(e.into()))?
        .ok_or_else(|| record_err("the broker record vanished".into()))?;
    Ok(BrokerMark {
        ingress_last_seq,
        dedupe_lost_since_ns: (entry.value.as_ref() != b"0")
            .then(|| entry.created.unix_timestamp_nanos()),
    })
}
