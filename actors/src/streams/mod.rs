//! Creating or updating the hub's JetStream streams to the configured limits.
//!
//! The router calls [`ensure_streams`] on every start. A stream that does not exist is created;
//! one that exists is updated to the configured limits. A stream whose retention policy differs
//! from the one the runtime needs cannot be updated (JetStream refuses it), so provisioning fails
//! with [`StreamError::RetentionMismatch`], which tells the operator to delete the stream.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::{Config, RetentionPolicy};
use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use protocol::config::DeliveryConfig;
use serde::{Deserialize, Serialize};

mod buckets;
mod configs;

pub use buckets::{
    ensure_brokers_bucket, ensure_claims_bucket, ensure_idempotency_bucket, ensure_rate_bucket,
    BROKER_RECORD_AGE, CLAIM_MAX_AGE, IDEMPOTENCY_BUCKET, RATE_ENTRY_AGE,
};
use buckets::{ensure_bucket, Writers};
pub use configs::stream_configs;

/// How long one JetStream API request of the provisioning may take.
pub const STREAM_API_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`ensure_streams`] keeps going through requests that time out or find no
/// responder: an election or two, or routers started together on a cluster (nats-server
/// answers only one of two concurrent creates of a stream; the other request times out after
/// its 5 s, nats-io/nats.go#949, and each stream and bucket may collide so).
pub const PROVISION_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// Provisioning failures.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The existing stream's retention policy differs from the required one.
    #[error(
        "stream {stream} has retention {existing:?} but the runtime needs {wanted:?}; a retention \
         policy cannot be changed on an existing stream: delete the stream (its stored messages \
         go with it) and start again"
    )]
    RetentionMismatch {
        /// The stream name.
        stream: String,
        /// What the server has.
        existing: RetentionPolicy,
        /// What the runtime needs.
        wanted: RetentionPolicy,
    },
    /// A JetStream API request failed (server down, JetStream disabled, subjects overlap...).
    #[error("cannot {action} stream {stream}")]
    Api {
        /// create, update or look up.
        action: &'static str,
        /// The stream name.
        stream: String,
        /// The server's or client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The broker cannot hold a stream with the configured replicas: a single server, or a
    /// cluster with fewer JetStream servers than that.
    #[error(
        "stream {stream} cannot have {replicas} replicas on this nats deployment: set the \
         delivery config's `{key}` to at most the number of JetStream servers in the cluster (1 \
         for a single server)"
    )]
    Replicas {
        /// The stream name.
        stream: String,
        /// The replicas configured.
        replicas: usize,
        /// The delivery config key that set them (`replicas` or `inbox.replicas`).
        key: &'static str,
        /// The broker's refusal.
        #[source]
        source: async_nats::Error,
    },
    /// A JetStream API request did not answer in time.
    #[error("timed out after {timeout:?} trying to {action} stream {stream}")]
    Timeout {
        /// create, update or look up.
        action: &'static str,
        /// The stream name.
        stream: String,
        /// The limit.
        timeout: Duration,
    },
}

impl StreamError {
    /// Whether the failure is what an election, a restarting node or another router
    /// provisioning at the same moment looks like, so that the same pass may succeed a moment
    /// later: a request that timed out or found no responder (`503`); the broker's "JetStream
    /// system temporarily unavailable" (10008); a stream made by someone else between our
    /// look-up and our create (10058, "already in use"); and, on a cluster, too few servers to
    /// place the replicas (10023: a node may be restarting; a single server's 10074 is final).
    pub fn is_transient(&self) -> bool {
        match self {
            StreamError::Timeout { .. } => true,
            StreamError::Api { source, .. } => is_transient_source(&**source),
            StreamError::Replicas { source, .. } => jetstream_code(&**source) == Some(10023),
            StreamError::RetentionMismatch { .. } => false,
        }
    }
}

/// Whether `error`'s chain holds a request that timed out or found no responder, or the
/// broker's 10008.
fn is_transient_source(error: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::context::{CreateKeyValueError, CreateKeyValueErrorKind};
    use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
    use async_nats::RequestErrorKind;
    let mut next = Some(error);
    while let Some(e) = next {
        // A create's or update's own kinds for a request that timed out or found no JetStream.
        if e.downcast_ref::<CreateStreamError>().is_some_and(|create| {
            matches!(
                create.kind(),
                CreateStreamErrorKind::TimedOut | CreateStreamErrorKind::JetStreamUnavailable
            )
        }) {
            return true;
        }
        if e.downcast_ref::<CreateKeyValueError>()
            .is_some_and(|create| create.kind() == CreateKeyValueErrorKind::TimedOut)
        {
            return true;
        }
        // A bucket's create reads the account first; its timeout has no source.
        if e.downcast_ref::<async_nats::jetstream::context::AccountError>()
            .is_some_and(|account| {
                matches!(
                    account.kind(),
                    async_nats::jetstream::context::AccountErrorKind::TimedOut
                        | async_nats::jetstream::context::AccountErrorKind::JetStreamUnavailable
                )
            })
        {
            return true;
        }
        if let Some(request) = e.downcast_ref::<async_nats::RequestError>() {
            if matches!(
                request.kind(),
                RequestErrorKind::TimedOut | RequestErrorKind::NoResponders
            ) {
                return true;
            }
        }
        // The JetStream context's own request error (a create's or update's source).
        if let Some(request) = e.downcast_ref::<async_nats::jetstream::context::RequestError>() {
            use async_nats::jetstream::context::RequestErrorKind as JsKind;
            if matches!(request.kind(), JsKind::TimedOut | JsKind::NoResponders) {
                return true;
            }
        }
        next = e.source();
    }
    matches!(jetstream_code(error), Some(10008 | 10058))
}

/// What [`ensure_streams`] did to one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provisioned {
    /// The stream did not exist and was created.
    Created,
    /// The stream existed and has the configured limits now (updated where they differed).
    Updated,
}

/// One provisioned stream, for snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Stream name.
    pub name: String,
    /// What happened.
    pub action: Provisioned,
}

/// Why [`publish_acked`] did not get its store ack.
#[derive(Debug, thiserror::Error)]
pub enum AckedError {
    /// The publish could not be sent, or the broker refused it.
    #[error("not stored")]
    Publish(#[from] async_nats::jetstream::context::PublishError),
    /// No ack within the limit.
    #[error("no store ack within {0:?}")]
    TimedOut(std::time::Duration),
}

/// JetStream-publishes `payload` to `subject` with `headers` and waits at most `within` for
/// its store ack (the lesson: every publish-ack await is bounded).
///
/// # Errors
/// [`AckedError`]: not sent or refused (the broker's error, [`store_refusal`] reads a limit
/// from it), or not acked in time.
///
/// # Cancel safety
/// Not cancel safe: a cancelled publish may or may not be stored; publish again under the same
/// `Nats-Msg-Id`.
pub async fn publish_acked(
    js: &Context,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
    within: std::time::Duration,
) -> Result<async_nats::jetstream::publish::PublishAck, AckedError> {
    let stored = async {
        js.publish_with_headers(subject, headers, payload)
            .await?
            .await
    };
    match tokio::time::timeout(within, stored).await {
        Ok(acked) => Ok(acked?),
        Err(_) => Err(AckedError::TimedOut(within)),
    }
}

/// Whether a publish that failed so may be stored by the same publish sent again: no stream
/// answered (`503`, as during an election, or the stream not made yet), no ack came, the
/// connection broke, the client had too many publishes in flight, or the stream has the same
/// id still on its way through raft (10158, "duplicate message id is in process": sent again,
/// it is acked as a duplicate once the first copy is stored).
pub fn is_transient(e: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::context::PublishErrorKind as Kind;
    matches!(
        e.kind(),
        Kind::StreamNotFound | Kind::TimedOut | Kind::BrokenPipe | Kind::MaxAckPending
    ) || jetstream_code(e) == Some(DUPLICATE_IN_PROCESS)
}

/// The broker's code for a publish whose `Nats-Msg-Id` another publish is still proposing.
const DUPLICATE_IN_PROCESS: u64 = 10158;

/// The limit a publish-ack error names, if any: the broker refused the store because the
/// subject or stream is full or the message too large ([`protocol::backpressure::store_refusal`]).
pub fn store_refusal(
    e: &async_nats::jetstream::context::PublishError,
) -> Option<protocol::backpressure::StoreRefusal> {
    let api = std::error::Error::source(e)?.downcast_ref::<async_nats::jetstream::Error>()?;
    protocol::backpressure::store_refusal(api.error_code().0, &api.to_string())
}

/// Creates each stream of [`stream_configs`] and the hub's KV buckets, or updates them to the
/// configured limits. A failure an election causes ([`StreamError::is_transient`]: a request
/// that times out or finds no responder) is tried again, from the start, after a pause of
/// 100 ms doubling to 2 s, until [`PROVISION_RETRY_WINDOW`] has passed; so a router started
/// while its cluster elects a leader, or while a node restarts, waits for it, and routers
/// started together all start.
///
/// # Errors
/// [`StreamError::RetentionMismatch`] when an existing stream has another retention policy;
/// [`StreamError::Replicas`] when the broker cannot hold the configured replicas;
/// [`StreamError::Api`] / [`StreamError::Timeout`] when a request fails, or still times out
/// or finds no responder when the window ends.
///
/// # Cancel safety
/// Cancelling it leaves the streams provisioned so far as they are; calling it again finishes
/// the job (every step is idempotent).
pub async fn ensure_streams(
    js: &Context,
    cfg: &DeliveryConfig,
) -> Result<Vec<StreamReport>, StreamError> {
    const PAUSE: crate::supervision::Backoff = crate::supervision::Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        factor: 2,
        reset_after: None,
    };
    let deadline = tokio::time::Instant::now() + PROVISION_RETRY_WINDOW;
    let mut attempt = 0;
    loop {
        match provision(js, cfg).await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %protocol::error_chain::ErrorChain(&e), "provisioning the streams again: no leader answered");
                tokio::time::sleep(PAUSE.delay(attempt)).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// One pass of [`ensure_streams`].
async fn provision(js: &Context, cfg: &DeliveryConfig) -> Result<Vec<StreamReport>, StreamError> {
    let mut out = Vec::with_capacity(9);
    for config in stream_configs(cfg) {
        let key = if config.name == cfg.inbox.name && cfg.inbox.replicas.is_some() {
            "inbox.replicas"
        } else {
            "replicas"
        };
        out.push(ensure_stream(js, config, key).await?);
    }
    let replicas = cfg.replicas;
    ensure_idempotency_bucket(js, replicas).await?;
    ensure_brokers_bucket(js, replicas).await?;
    ensure_rate_bucket(js, replicas).await?;
    ensure_claims_bucket(js, replicas).await?;
    ensure_bucket(
        js,
        protocol::subjects::HOLDS_BUCKET,
        "holds told to senders (inbox_full, rate_limited)",
        cfg.inbox.max_age().unwrap_or_default(),
        Writers::Hub,
        replicas,
    )
    .await?;
    ensure_bucket(
        js,
        protocol::subjects::PRESENCE_BUCKET,
        "agents' presence, written by their attached inboxes",
        cfg.inbox.max_age().unwrap_or_default(),
        Writers::Identities,
        replicas,
    )
    .await?;
    // Tombstones of removed agents (`runtime agent remove`), kept until restored.
    ensure_bucket(
        js,
        protocol::subjects::REMOVED_BUCKET,
        "removed agents' tombstones (runtime agent remove)",
        std::time::Duration::ZERO,
        Writers::Hub,
        replicas,
    )
    .await?;
    Ok(out)
}

async fn ensure_stream(
    js: &Context,
    wanted: Config,
    key: &'static str,
) -> Result<StreamReport, StreamError> {
    let name = wanted.name.clone();
    let replicas = wanted.num_replicas;
    let refused = |action, e| refused(action, &name, (replicas, key), e);
    let existing = timed("look up", &name, js.get_stream(&name)).await?;
    match existing {
        Ok(mut stream) => {
            let info = timed("look up", &name, stream.info())
                .await?
                .map_err(|e| api("look up", &name, e))?;
            if info.config.retention != wanted.retention {
                return Err(StreamError::RetentionMismatch {
                    stream: name,
                    existing: info.config.retention,
                    wanted: wanted.retention,
                });
            }
            if has_config(&info.config, &wanted) {
                return Ok(StreamReport {
                    name,
                    action: Provisioned::Updated,
                });
            }
            let kept = info.config.max_consumers;
            let retry = (kept != wanted.max_consumers).then(|| Config {
                max_consumers: kept,
                ..wanted.clone()
            });
            match timed("update", &name, js.update_stream(wanted)).await? {
                Ok(_) => {}
                // An older broker cannot change a stream's `max_consumers` (nats-server allows
                // it since early 2026, and has no default limit before 2.15): the rest is
                // updated, that kept.
                // Only a refusal: a timeout (another router's update at the same moment) is
                // tried again by `ensure_streams`, the configured value with it.
                Err(first)
                    if !matches!(
                        first.kind(),
                        async_nats::jetstream::context::CreateStreamErrorKind::JetStream(_)
                    ) =>
                {
                    return Err(refused("update", first))
                }
                Err(first) => match retry {
                    Some(keep) => {
                        timed("update", &name, js.update_stream(keep))
                            .await?
                            .map_err(|_| refused("update", first))?;
                        tracing::warn!(stream = %name, max_consumers = kept, "the server kept the stream's max_consumers");
                    }
                    None => return Err(refused("update", first)),
                },
            }
            tracing::info!(stream = %name, "stream updated to the configured limits");
            Ok(StreamReport {
                name,
                action: Provisioned::Updated,
            })
        }
        Err(e) if is_not_found(&e) => {
            timed("create", &name, js.create_stream(wanted))
                .await?
                .map_err(|e| refused("create", e))?;
            tracing::info!(stream = %name, "stream created");
            Ok(StreamReport {
                name,
                action: Provisioned::Created,
            })
        }
        Err(e) => Err(api("look up", &name, e)),
    }
}

/// Whether `existing` is `wanted` already: each field `wanted` serializes is equal in
/// `existing` (a limit left at 0 equal to the broker's -1), and each field only `existing`
/// has is one the broker keeps of its own (its `metadata`, the rollup headers it allows with
/// message schedules) or a default (false, 0, -1, `none`, empty). A setting changed by hand
/// is put back; a setting the broker writes differently from how it was asked only costs an
/// update.
fn has_config(existing: &Config, wanted: &Config) -> bool {
    use serde_json::Value;
    let (Ok(Value::Object(existing)), Ok(Value::Object(wanted))) =
        (serde_json::to_value(existing), serde_json::to_value(wanted))
    else {
        return false;
    };
    let schedules = wanted.get("allow_msg_schedules") == Some(&Value::Bool(true));
    let asked = wanted.iter().all(|(key, value)| match existing.get(key) {
        Some(found) if found == value => true,
        // An unset limit (0) the broker keeps as unlimited (-1).
        Some(found) => value.as_i64() == Some(0) && found.as_i64() == Some(-1),
        None => false,
    });
    let kept = existing
        .iter()
        .filter(|(key, _)| !wanted.contains_key(*key))
        .all(|(key, value)| match (key.as_str(), value) {
            ("metadata", _) => true,
            ("allow_rollup_hdrs", Value::Bool(true)) => schedules,
            (_, Value::Bool(false) | Value::Null) => true,
            (_, Value::String(s)) => s.is_empty() || s == "none",
            (_, Value::Number(n)) => matches!(n.as_i64(), Some(0 | -1)),
            (_, Value::Array(a)) => a.is_empty(),
            (_, Value::Object(o)) => o.is_empty(),
            _ => false,
        });
    asked && kept
}

fn is_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// A create or update the broker refused: [`StreamError::Replicas`] when it cannot hold the
/// `replicas` the config `key` set (nats-server's "replicas > 1 not supported in
/// non-clustered mode", 10074, or "insufficient resources", 10023), else [`StreamError::Api`].
fn refused(
    action: &'static str,
    stream: &str,
    (replicas, key): (usize, &'static str),
    source: impl Into<async_nats::Error>,
) -> StreamError {
    let source = source.into();
    if replicas > 1 && matches!(jetstream_code(&*source), Some(10074 | 10023)) {
        return StreamError::Replicas {
            stream: stream.to_string(),
            replicas,
            key,
            source,
        };
    }
    api(action, stream, source)
}

/// The JetStream API error code somewhere in `error`'s chain.
fn jetstream_code(error: &(dyn std::error::Error + 'static)) -> Option<u64> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(js.error_code().0);
        }
        // A create's or update's error holds the broker's in its kind (a KV bucket's create
        // has that as its source).
        if let Some(create) = e.downcast_ref::<async_nats::jetstream::context::CreateStreamError>()
        {
            if let async_nats::jetstream::context::CreateStreamErrorKind::JetStream(js) =
                create.kind()
            {
                return Some(js.error_code().0);
            }
        }
        // So does a look-up's.
        if let Some(get) = e.downcast_ref::<async_nats::jetstream::context::GetStreamError>() {
            if let async_nats::jetstream::context::GetStreamErrorKind::JetStream(js) = get.kind() {
                return Some(js.error_code().0);
            }
        }
        next = e.source();
    }
    None
}

fn api(action: &'static str, stream: &str, source: impl Into<async_nats::Error>) -> StreamError {
    StreamError::Api {
        action,
        stream: stream.to_string(),
        source: source.into(),
    }
}

async fn timed<T>(
    action: &'static str,
    stream: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, StreamError> {
    tokio::time::timeout(STREAM_API_TIMEOUT, fut)
        .await
        .map_err(|_| StreamError::Timeout {
            action,
            stream: stream.to_string(),
            timeout: STREAM_API_TIMEOUT,
        })
}

#[cfg(test)]
mod tests;
