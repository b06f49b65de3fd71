//! The hub's KV buckets: created when missing, kept at the configured replicas, and, where
//! agents write their own keys, refusing rollups.

use async_nats::jetstream::stream::StorageType;
use async_nats::jetstream::Context;

use super::{timed, StreamError, STREAM_API_TIMEOUT};

/// The KV bucket of task idempotency keys: one create-only entry per (delegator, queue, key),
/// no expiry, so two submissions with the same key produce one task however far apart they are.
pub use protocol::subjects::IDEMPOTENCY_BUCKET;

/// Creates the idempotency bucket when it does not exist.
///
/// # Errors
/// [`StreamError::Api`] / [`StreamError::Timeout`].
pub async fn ensure_idempotency_bucket(js: &Context, replicas: usize) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        IDEMPOTENCY_BUCKET,
        "task idempotency keys (create-only), each delegator's own",
        std::time::Duration::ZERO,
        Writers::Identities,
        replicas,
    )
    .await
}

/// How long a broker incarnation's record is kept: a router that connects to a broker up
/// longer than this records it again, and treats it as just started (the safe side).
pub const BROKER_RECORD_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Creates the broker incarnations bucket ([`protocol::subjects::BROKERS_BUCKET`]) when it
/// does not exist.
///
/// # Errors
/// [`StreamError::Api`] / [`StreamError::Timeout`].
pub async fn ensure_brokers_bucket(js: &Context, replicas: usize) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        protocol::subjects::BROKERS_BUCKET,
        "broker incarnations seen by routers (create-only)",
        BROKER_RECORD_AGE,
        Writers::Hub,
        replicas,
    )
    .await
}

/// How long a sender's bucket entry is kept after its last write: a full bucket refills in one
/// minute, so an entry older than that is a full bucket, and a missing one is treated as full.
pub const RATE_ENTRY_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Creates the senders' rate bucket ([`protocol::subjects::RATE_BUCKET`]) when it does not
/// exist: one token bucket per sender, compare-and-set by the routers.
///
/// # Errors
/// [`StreamError::Api`] / [`StreamError::Timeout`].
pub async fn ensure_rate_bucket(js: &Context, replicas: usize) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        protocol::subjects::RATE_BUCKET,
        "senders' token buckets (sender_rate_per_min)",
        RATE_ENTRY_AGE,
        Writers::Hub,
        replicas,
    )
    .await
}

/// The entries of the claims bucket are kept at most this long whatever their TTL (a value
/// written without one, by hand, lapses too).
pub const CLAIM_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Creates the task claims bucket ([`protocol::subjects::CLAIMS_BUCKET`]) when it does not
/// exist, with per-message TTLs: each claim lapses one ack wait after its last renewal.
///
/// # Errors
/// [`StreamError::Api`] / [`StreamError::Timeout`].
pub async fn ensure_claims_bucket(js: &Context, replicas: usize) -> Result<(), StreamError> {
    ensure_bucket_with(
        js,
        protocol::subjects::CLAIMS_BUCKET,
        "task claims, taken by attempts before their handler runs (per-message TTL)",
        CLAIM_MAX_AGE,
        Writers::Identities,
        replicas,
        true,
    )
    .await
}

/// Who writes a bucket's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writers {
    /// Routers and admins only.
    Hub,
    /// Agents too, each its own key: the bucket refuses rollup headers, with which one key's
    /// write would purge every other key of the bucket (`Nats-Rollup: all`).
    Identities,
}

/// Creates a KV bucket (history 1, file storage, `replicas`, entries kept for `max_age`, zero
/// meaning for ever) when it does not exist. One that exists is brought to `replicas`; one
/// that `writers` include agents refuses rollups, existing or new.
pub(super) async fn ensure_bucket(
    js: &Context,
    name: &str,
    description: &str,
    max_age: std::time::Duration,
    writers: Writers,
    replicas: usize,
) -> Result<(), StreamError> {
    ensure_bucket_with(js, name, description, max_age, writers, replicas, false).await
}

/// [`ensure_bucket`], with per-message TTLs (`Nats-TTL`) allowed when `message_ttls` (an
/// existing bucket is updated to allow them: JetStream allows turning them on, not off).
pub(super) async fn ensure_bucket_with(
    js: &Context,
    name: &str,
    description: &str,
    max_age: std::time::Duration,
    writers: Writers,
    replicas: usize,
    message_ttls: bool,
) -> Result<(), StreamError> {
    let stream = protocol::subjects::kv_stream(name);
    // A bucket's handle carries its stream's info, read when it was looked up or created.
    let kv = match tokio::time::timeout(STREAM_API_TIMEOUT, js.get_key_value(name)).await {
        Ok(Ok(kv)) => kv,
        _ => {
            let config = async_nats::jetstream::kv::Config {
                bucket: name.to_string(),
                description: description.into(),
                history: 1,
                max_age,
                storage: StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            };
            timed("create", name, js.create_key_value(config))
                .await?
                .map_err(|e| super::refused("create", &stream, (replicas, "replicas"), e))?
        }
    };
    let info = kv.stream.cached_info();
    let refuses_rollups = writers == Writers::Hub || !info.config.allow_rollup;
    let ttls_allowed = !message_ttls || info.config.allow_message_ttl;
    if info.config.num_replicas != replicas || !refuses_rollups || !ttls_allowed {
        let mut config = info.config.clone();
        config.num_replicas = replicas;
        config.allow_message_ttl |= message_ttls;
        if writers == Writers::Identities {
            config.allow_rollup = false;
        }
        timed("update", &stream, js.update_stream(config))
            .await?
            .map_err(|e| super::refused("update", &stream, (replicas, "replicas"), e))?;
    }
    Ok(())
}
