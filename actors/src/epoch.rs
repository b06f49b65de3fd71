//! Baselines: what a stream held when the current connection (and consumer) began, so that an
//! input stored after it, delivered once, is known to be a first delivery
//! (`protocol::task::must_read_channel`, `protocol::task::router_flags`).
//!
//! A baseline belongs to one connection: it is dropped when the client's connect count moves
//! (a reconnect, which a broker restart always causes) or when its owner says so
//! ([`Baseline::invalidate`]: a consumer found gone, an ack refused), and taken again in the
//! background by [`Baseline::keep_fresh`], which the owner runs as one of its own tasks. A
//! worker's baseline is also trusted for [`WORK_MARK_AGE`] only: past it, the consumers are
//! looked up again (one made again has a new creation time). While there is none, every
//! input is suspect.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::Client;
use tokio::sync::Notify;

/// How long the refresher waits after a failed refresh.
const RETRY: Duration = Duration::from_secs(1);

/// A baseline of some facts `M`, taken on connection number `connects`.
pub struct Baseline<M: Copy> {
    client: Client,
    /// How long a mark is trusted after it was taken (`None`: for the whole connection).
    max_age: Option<Duration>,
    cell: Mutex<Cell<M>>,
    wake: Notify,
}

struct Cell<M> {
    /// Bumped by every invalidation: a refresh that began before one is not kept.
    generation: u64,
    mark: Option<Mark<M>>,
}

/// Facts `M` taken on connection number `connects` at `at`.
#[derive(Debug, Clone, Copy)]
struct Mark<M> {
    connects: u64,
    facts: M,
    at: Instant,
}

impl<M: Copy> Baseline<M> {
    /// An empty baseline (everything suspect) for `client`'s connections, whose marks are
    /// trusted for `max_age` (`None`: until the connection changes or it is invalidated).
    pub fn new(client: Client, max_age: Option<Duration>) -> Arc<Self> {
        Arc::new(Baseline {
            client,
            max_age,
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

    /// The facts of the current connection, if a mark was taken on it and is not too old.
    /// A mark of an earlier connection is dropped; a missing or old one asks for a refresh.
    pub fn current(&self) -> Option<M> {
        let now = self.connects();
        let mut cell = self.lock();
        let mark = cell.mark?;
        if mark.connects != now {
            cell.mark = None;
            cell.generation += 1;
        } else if self.max_age.is_none_or(|age| mark.at.elapsed() < age) {
            return Some(mark.facts);
        }
        drop(cell);
        self.wake.notify_one();
        None
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

    /// Takes a mark: `read` gathers the facts, given the mark of the current connection if
    /// there is one (however old); they are kept only if no reconnect and no invalidation
    /// happened while it ran.
    ///
    /// # Errors
    /// What `read` returns.
    pub async fn refresh<E, F, Fut>(&self, read: &F) -> Result<(), E>
    where
        F: Fn(Option<M>) -> Fut,
        Fut: std::future::Future<Output = Result<M, E>>,
    {
        let connects = self.connects();
        let (generation, previous) = {
            let cell = self.lock();
            let previous = cell.mark.filter(|m| m.connects == connects);
            (cell.generation, previous.map(|m| m.facts))
        };
        let facts = read(previous).await?;
        let mut cell = self.lock();
        if (cell.generation, self.connects()) == (generation, connects) {
            cell.mark = Some(Mark {
                connects,
                facts,
                at: Instant::now(),
            });
        }
        Ok(())
    }

    /// Keeps the baseline taken: refreshes it with `read` whenever [`Baseline::current`] found
    /// it missing or old, pausing [`RETRY`] after a failure. Runs until dropped (its owner
    /// holds it as a task).
    ///
    /// # Cancel safety
    /// Cancel safe: a refresh cut short keeps nothing.
    pub async fn keep_fresh<E, F, Fut>(self: Arc<Self>, read: F)
    where
        E: std::fmt::Display,
        F: Fn(Option<M>) -> Fut,
        Fut: std::future::Future<Output = Result<M, E>>,
    {
        loop {
            if self.current().is_none() {
                if let Err(e) = self.refresh(&read).await {
                    tracing::warn!(error = %e, "cannot take a stream baseline; every input is checked until it is taken");
                    tokio::time::sleep(RETRY).await;
                }
                // A refresh that raced an invalidation kept nothing: `current` asks again.
                continue;
            }
            self.wake.notified().await;
        }
    }
}

/// The last sequence of `stream` now (one stream info request).
async fn last_seq(
    js: &jetstream::Context,
    stream: &str,
) -> Result<u64, jetstream::context::GetStreamError> {
    let stream = js.get_stream(stream).await?;
    Ok(stream.cached_info().state.last_sequence)
}

/// How long a worker trusts its [`WorkMark`]: past it, inputs are read until the consumers
/// have been looked at again. It bounds the time in which a consumer deleted and created
/// again (whose first deliveries are counted once, and which may even take the old
/// deliveries' acks) goes unnoticed.
pub const WORK_MARK_AGE: Duration = Duration::from_secs(1);

/// What a worker knows of the work stream and of its consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkMark {
    /// The work stream's last sequence when this connection and these consumers began.
    pub last_seq: u64,
    /// The creation times (unix nanoseconds) of the consumers the worker pulls tasks from.
    pub created: [i128; 2],
}

/// Why a worker's baseline could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum WorkMarkError {
    /// The work stream could not be looked up.
    #[error("cannot look up the work stream")]
    Stream(#[source] jetstream::context::GetStreamError),
    /// A consumer could not be looked up.
    #[error("cannot look up consumer {consumer}")]
    Consumer {
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: jetstream::context::ConsumerInfoError,
    },
}

/// Takes a worker's [`WorkMark`]: looks its `consumers` up; while they are the ones of
/// `previous` (same creation times, same connection), its sequence is kept, else the work
/// stream's last sequence now is taken (and `remade` is called when they changed).
///
/// # Errors
/// [`WorkMarkError`] when the stream or a consumer does not answer.
pub async fn work_mark(
    js: &jetstream::Context,
    stream: &str,
    consumers: &[jetstream::consumer::PullConsumer; 2],
    previous: Option<WorkMark>,
    remade: impl FnOnce(),
) -> Result<WorkMark, WorkMarkError> {
    let mut created = [0i128; 2];
    for (slot, consumer) in created.iter_mut().zip(consumers) {
        let info = consumer
            .get_info()
            .await
            .map_err(|source| WorkMarkError::Consumer {
                consumer: consumer.cached_info().name.clone(),
                source,
            })?;
        *slot = info.created.unix_timestamp_nanos();
    }
    match previous {
        Some(previous) if previous.created == created => Ok(previous),
        other => {
            if other.is_some() {
                remade();
            }
            let last_seq = last_seq(js, stream).await.map_err(WorkMarkError::Stream)?;
            Ok(WorkMark { last_seq, created })
        }
    }
}

/// What a router knows of the broker it is connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerMark {
    /// The ingress stream's last sequence when the connection began.
    pub ingress_last_seq: u64,
    /// When this broker incarnation was first recorded (broker clock, unix nanoseconds), if
    /// the work stream held messages then: until the duplicate window has passed since, the
    /// broker may have forgotten the dedupe ids of tasks consumed before it started.
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
