//! Creating or updating the hub's JetStream streams to the configured limits.
//!
//! The router calls [`ensure_streams`] on every start. A stream that does not exist is created;
//! one that exists is updated to the configured limits. A stream whose retention policy differs
//! from the one the runtime needs cannot be updated (JetStream refuses it), so provisioning fails
//! with [`StreamError::RetentionMismatch`], which tells the operator to delete the stream.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use protocol::config::{DeliveryConfig, StorageKind};
use protocol::subjects;
use serde::{Deserialize, Serialize};

/// How long one JetStream API request of the provisioning may take.
pub const STREAM_API_TIMEOUT: Duration = Duration::from_secs(10);

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

/// What [`ensure_streams`] did to one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provisioned {
    /// The stream did not exist and was created.
    Created,
    /// The stream existed and was updated to the configured limits.
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

/// The three stream configurations the runtime needs, derived from the delivery config.
///
/// - ingress (`hub.pub.>`): work-queue retention, so a routed (acked) envelope is removed; its
///   only consumer is the shared router consumer.
/// - inbox (`channel.inbox.>`): limits retention with the configured limits, discarding new
///   messages (per subject too): a DM past a limit is refused, never an older one dropped.
/// - tasks (`channel.task.>`): limits retention with the configured limits.
/// - work (`work.>`) and answers (`answer.>`): work-queue retention, max age of the tasks.
/// - schedules (`hub.sched.>`): the DMs' deadline checks, as nats-server message schedules
///   (`allow_msg_schedules`; nats-server 2.12+) and what they fire; work-queue retention, max
///   age of the inbox.
/// - advisories (the broker's termination and max-deliveries advisories of inbox deliveries):
///   work-queue retention, max age of the ingress.
/// - dead letters (`dlq.>`): limits retention, max age of the inbox.
/// - audit (`hub.audit.>`): the audit trail's event batches; limits retention, max age of the
///   inbox.
///
/// Every stream gets the configured duplicate window; inbox and tasks allow per-message TTL.
/// An unlimited max age (`-1`) is JetStream's 0.
pub fn stream_configs(cfg: &DeliveryConfig) -> [Config; 9] {
    let dup = cfg.duplicate_window();
    let ingress = Config {
        name: cfg.ingress.name.clone(),
        subjects: vec![subjects::INGRESS_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.ingress.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        discard: DiscardPolicy::Old,
        // Workers read it for a result stored here but not routed yet (`hub.pub.*.task.<delegator>.<key>`)
        // before they run a task. A direct get's reply carries `Nats-Stream` headers, which
        // the replay guard drops should one be aimed back at the ingress.
        allow_direct: true,
        ..Default::default()
    };
    let inbox = Config {
        name: cfg.inbox.name.clone(),
        subjects: vec![subjects::INBOX_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        max_messages_per_subject: cfg.inbox.max_msgs_per_subject,
        // A full inbox (or a full stream) refuses the new DM, which the router reports to its
        // sender as `inbox_full`; nothing stored is dropped to make room.
        discard: DiscardPolicy::New,
        discard_new_per_subject: cfg.inbox.max_msgs_per_subject > 0,
        max_bytes: cfg.inbox.max_bytes,
        max_messages: cfg.inbox.max_msgs,
        max_message_size: i32::try_from(cfg.inbox.max_msg_size).unwrap_or(i32::MAX),
        // Its own limit: one consumer per agent, past the broker's default (1,000 since
        // nats-server 2.15, for a stream that sets none).
        max_consumers: i32::try_from(cfg.inbox.max_consumers).unwrap_or(i32::MAX),
        num_replicas: cfg.inbox.replicas,
        storage: match cfg.inbox.storage {
            StorageKind::File => StorageType::File,
            StorageKind::Memory => StorageType::Memory,
        },
        duplicate_window: dup,
        allow_message_ttl: true,
        allow_direct: true,
        ..Default::default()
    };
    let tasks = Config {
        name: cfg.tasks.name.clone(),
        subjects: vec![subjects::TASKS_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.tasks.max_age().unwrap_or_default(),
        max_messages_per_subject: cfg.tasks.max_msgs_per_subject,
        storage: StorageType::File,
        duplicate_window: dup,
        allow_message_ttl: true,
        allow_direct: true,
        ..Default::default()
    };
    // Work and answers: work-queue retention (an acked task or answer is removed), kept as long
    // as the task channels. Their consumers' filters never overlap (`work.<queue>` vs
    // `work.*.<worker>`; `answer.<worker>` per worker), as a work queue requires.
    let work = Config {
        name: subjects::WORK_STREAM.to_string(),
        subjects: vec![subjects::WORK_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.tasks.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        // A dead-lettered input is read back by sequence (only routers may).
        allow_direct: true,
        // Its own limit: a consumer per queue and per pinned worker (and on the answers
        // stream, per worker), past the broker's default of 1,000 for a stream that sets none.
        max_consumers: i32::try_from(cfg.tasks.work_max_consumers).unwrap_or(i32::MAX),
        ..Default::default()
    };
    let answers = Config {
        name: subjects::ANSWERS_STREAM.to_string(),
        subjects: vec![subjects::ANSWERS_FILTER.to_string()],
        ..work.clone()
    };
    let schedules = Config {
        name: subjects::SCHEDULES_STREAM.to_string(),
        subjects: vec![subjects::SCHEDULES_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        allow_message_schedules: true,
        ..Default::default()
    };
    let advisories = Config {
        name: subjects::ADVISORIES_STREAM.to_string(),
        subjects: vec![
            subjects::terminated_advisories(&cfg.inbox.name),
            subjects::max_deliveries_advisories(&cfg.inbox.name),
            subjects::max_deliveries_advisories(subjects::WORK_STREAM),
        ],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.ingress.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        ..Default::default()
    };
    // The audit trail: batches of events (`protocol::audit`), kept as long as the inbox.
    let audit = Config {
        name: subjects::AUDIT_STREAM.to_string(),
        subjects: vec![subjects::AUDIT_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        ..Default::default()
    };
    let dlq = Config {
        name: subjects::DLQ_STREAM.to_string(),
        subjects: vec![subjects::DLQ_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        allow_direct: true,
        ..Default::default()
    };
    [
        ingress, inbox, tasks, work, answers, schedules, advisories, dlq, audit,
    ]
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

/// The limit a publish-ack error names, if any: the broker refused the store because the
/// subject or stream is full or the message too large ([`protocol::backpressure::store_refusal`]).
pub fn store_refusal(
    e: &async_nats::jetstream::context::PublishError,
) -> Option<protocol::backpressure::StoreRefusal> {
    let api = std::error::Error::source(e)?.downcast_ref::<async_nats::jetstream::Error>()?;
    protocol::backpressure::store_refusal(api.error_code().0, &api.to_string())
}

/// Creates each stream of [`stream_configs`] or updates it to the configured limits.
///
/// # Errors
/// [`StreamError::RetentionMismatch`] when an existing stream has another retention policy;
/// [`StreamError::Api`] / [`StreamError::Timeout`] when a request fails or does not answer.
///
/// # Cancel safety
/// Cancelling it leaves the streams provisioned so far as they are; calling it again finishes
/// the job (every step is idempotent).
pub async fn ensure_streams(
    js: &Context,
    cfg: &DeliveryConfig,
) -> Result<Vec<StreamReport>, StreamError> {
    let mut out = Vec::with_capacity(8);
    for config in stream_configs(cfg) {
        out.push(ensure_stream(js, config).await?);
    }
    ensure_idempotency_bucket(js).await?;
    ensure_brokers_bucket(js).await?;
    ensure_rate_bucket(js).await?;
    ensure_bucket(
        js,
        protocol::subjects::HOLDS_BUCKET,
        "holds told to senders (inbox_full, rate_limited)",
        cfg.inbox.max_age().unwrap_or_default(),
        Writers::Hub,
    )
    .await?;
    ensure_bucket(
        js,
        protocol::subjects::PRESENCE_BUCKET,
        "agents' presence, written by their attached inboxes",
        cfg.inbox.max_age().unwrap_or_default(),
        Writers::Identities,
    )
    .await?;
    // Tombstones of removed agents (`runtime agent remove`), kept until restored.
    ensure_bucket(
        js,
        protocol::subjects::REMOVED_BUCKET,
        "removed agents' tombstones (runtime agent remove)",
        std::time::Duration::ZERO,
        Writers::Hub,
    )
    .await?;
    Ok(out)
}

/// The KV bucket of task idempotency keys: one create-only entry per (delegator, queue, key),
/// no expiry, so two submissions with the same key produce one task however far apart they are.
pub use protocol::subjects::IDEMPOTENCY_BUCKET;

/// Creates the idempotency bucket when it does not exist.
///
/// # Errors
/// [`StreamError::Api`] / [`StreamError::Timeout`].
pub async fn ensure_idempotency_bucket(js: &Context) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        IDEMPOTENCY_BUCKET,
        "task idempotency keys (create-only), each delegator's own",
        std::time::Duration::ZERO,
        Writers::Identities,
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
pub async fn ensure_brokers_bucket(js: &Context) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        protocol::subjects::BROKERS_BUCKET,
        "broker incarnations seen by routers (create-only)",
        BROKER_RECORD_AGE,
        Writers::Hub,
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
pub async fn ensure_rate_bucket(js: &Context) -> Result<(), StreamError> {
    ensure_bucket(
        js,
        protocol::subjects::RATE_BUCKET,
        "senders' token buckets (sender_rate_per_min)",
        RATE_ENTRY_AGE,
        Writers::Hub,
    )
    .await
}

/// Who writes a bucket's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writers {
    /// Routers and admins only.
    Hub,
    /// Agents too, each its own key: the bucket refuses rollup headers, with which one key's
    /// write would purge every other key of the bucket (`Nats-Rollup: all`).
    Identities,
}

/// Creates a KV bucket (history 1, file storage, entries kept for `max_age`, zero meaning for
/// ever) when it does not exist; one that `writers` include agents refuses rollups, existing
/// or new.
async fn ensure_bucket(
    js: &Context,
    name: &str,
    description: &str,
    max_age: std::time::Duration,
    writers: Writers,
) -> Result<(), StreamError> {
    let exists = matches!(
        tokio::time::timeout(STREAM_API_TIMEOUT, js.get_key_value(name)).await,
        Ok(Ok(_))
    );
    if !exists {
        let config = async_nats::jetstream::kv::Config {
            bucket: name.to_string(),
            description: description.into(),
            history: 1,
            max_age,
            storage: StorageType::File,
            ..Default::default()
        };
        timed("create", name, js.create_key_value(config))
            .await?
            .map_err(|e| api("create", name, e))?;
    }
    if writers == Writers::Identities {
        let stream = protocol::subjects::kv_stream(name);
        let mut kv = timed("look up", &stream, js.get_stream(&stream))
            .await?
            .map_err(|e| api("look up", &stream, e))?;
        let info = timed("look up", &stream, kv.info())
            .await?
            .map_err(|e| api("look up", &stream, e))?;
        if info.config.allow_rollup {
            let mut config = info.config.clone();
            config.allow_rollup = false;
            timed("update", &stream, js.update_stream(config))
                .await?
                .map_err(|e| api("update", &stream, e))?;
        }
    }
    Ok(())
}

async fn ensure_stream(js: &Context, wanted: Config) -> Result<StreamReport, StreamError> {
    let name = wanted.name.clone();
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
                Err(first) => match retry {
                    Some(keep) => {
                        timed("update", &name, js.update_stream(keep))
                            .await?
                            .map_err(|_| api("update", &name, first))?;
                        tracing::warn!(stream = %name, max_consumers = kept, "the server kept the stream's max_consumers");
                    }
                    None => return Err(api("update", &name, first)),
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
                .map_err(|e| api("create", &name, e))?;
            tracing::info!(stream = %name, "stream created");
            Ok(StreamReport {
                name,
                action: Provisioned::Created,
            })
        }
        Err(e) => Err(api("look up", &name, e)),
    }
}

fn is_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND)
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
mod tests {
    use super::*;
    use async_nats::jetstream;

    #[tokio::test]
    async fn creates_then_updates_streams_to_configured_limits() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        let mut cfg = DeliveryConfig::default();
        let first = ensure_streams(&js, &cfg).await.unwrap();
        assert!(first.iter().all(|r| r.action == Provisioned::Created));
        assert_eq!(
            first.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            [
                "HUB_INGRESS",
                "HUB_INBOX",
                "HUB_TASKS",
                "HUB_WORK",
                "HUB_ANSWERS",
                "HUB_SCHEDULES",
                "HUB_ADVISORIES",
                "HUB_DLQ",
                "HUB_AUDIT"
            ]
        );

        cfg.inbox.max_msgs_per_subject = 7;
        cfg.duplicate_window_secs = 60;
        let second = ensure_streams(&js, &cfg).await.unwrap();
        assert!(second.iter().all(|r| r.action == Provisioned::Updated));
        let info = js
            .get_stream("HUB_INBOX")
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .clone();
        assert_eq!(info.config.max_messages_per_subject, 7);
        assert_eq!(info.config.duplicate_window, Duration::from_secs(60));
        assert_eq!(info.config.subjects, vec!["channel.inbox.>".to_string()]);
    }

    #[tokio::test]
    async fn an_inbox_stream_of_an_earlier_version_is_updated_to_refuse_new_dms_when_full() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        let cfg = DeliveryConfig::default();
        // What earlier versions made: limits retention that drops the oldest.
        let [_, mut old, ..] = stream_configs(&cfg);
        old.discard = DiscardPolicy::Old;
        old.discard_new_per_subject = false;
        js.create_stream(old).await.unwrap();
        ensure_streams(&js, &cfg).await.unwrap();
        let info = inbox_config(&js).await;
        assert_eq!(info.discard, DiscardPolicy::New);
        assert!(info.discard_new_per_subject);
        // Unlimited per subject: discard new still holds for the stream's own limits.
        let mut unlimited = cfg.clone();
        unlimited.inbox.max_msgs_per_subject = -1;
        ensure_streams(&js, &unlimited).await.unwrap();
        let info = inbox_config(&js).await;
        assert_eq!(info.discard, DiscardPolicy::New);
        assert!(!info.discard_new_per_subject);
    }

    /// Creates every consumer, 32 at a time, and checks that none was refused.
    async fn all_created(
        consumers: impl Iterator<Item = (jetstream::stream::Stream, jetstream::consumer::pull::Config)>,
    ) {
        use futures::StreamExt;
        let made = futures::stream::iter(consumers)
            .map(|(stream, config)| async move { stream.create_consumer(config).await })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
        let refused: Vec<_> = made.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            refused.is_empty(),
            "{} refused: {:?}",
            refused.len(),
            refused.first()
        );
    }

    async fn inbox_config(js: &jetstream::Context) -> Config {
        let mut stream = js.get_stream("HUB_INBOX").await.unwrap();
        stream.info().await.unwrap().config.clone()
    }

    #[tokio::test]
    async fn the_inbox_stream_holds_more_consumers_than_the_brokers_default_limit() {
        // nats-server 2.15 limits a stream that sets no `max_consumers` of its own to 1,000
        // consumers (`default_max_consumers`): one host of 1,000 agents, then every attach is
        // refused with `maximum consumers limit reached`. The inbox stream sets its own limit.
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        let cfg = DeliveryConfig::default();
        ensure_streams(&js, &cfg).await.unwrap();
        let stream = js.get_stream(&cfg.inbox.name).await.unwrap();
        all_created((0..1_001).map(|i| {
            let agent = protocol::AgentId::new(format!("agent{i}")).unwrap();
            (
                stream.clone(),
                crate::consumers::inbox_consumer(&cfg, &agent),
            )
        }))
        .await;
        assert_eq!(
            inbox_config(&js).await.max_consumers,
            i32::try_from(cfg.inbox.max_consumers).unwrap()
        );
    }

    #[tokio::test]
    async fn the_work_and_answer_streams_hold_more_consumers_than_the_brokers_default_limit() {
        // As for the inbox stream: 1,001 queues on one hub, and 1,001 workers' answer
        // consumers, each past the broker's default of 1,000.
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        let cfg = DeliveryConfig::default();
        ensure_streams(&js, &cfg).await.unwrap();
        let (work, answers) = (
            js.get_stream(subjects::WORK_STREAM).await.unwrap(),
            js.get_stream(subjects::ANSWERS_STREAM).await.unwrap(),
        );
        all_created((0..1_001).flat_map(|i| {
            let queue = protocol::QueueName::new(format!("q{i}")).unwrap();
            let worker = protocol::WorkerId::new(format!("w{i}")).unwrap();
            [
                (work.clone(), crate::consumers::queue_consumer(&cfg, &queue)),
                (
                    answers.clone(),
                    crate::consumers::answer_consumer(&cfg, &worker),
                ),
            ]
        }))
        .await;
        for name in [subjects::WORK_STREAM, subjects::ANSWERS_STREAM] {
            let mut stream = js.get_stream(name).await.unwrap();
            assert_eq!(
                stream.info().await.unwrap().config.max_consumers,
                i32::try_from(cfg.tasks.work_max_consumers).unwrap(),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn retention_change_is_refused_with_instructions() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        // Someone created HUB_INGRESS by hand with limits retention.
        js.create_stream(Config {
            name: "HUB_INGRESS".into(),
            subjects: vec!["hub.pub.>".into()],
            retention: RetentionPolicy::Limits,
            ..Default::default()
        })
        .await
        .unwrap();
        let err = ensure_streams(&js, &DeliveryConfig::default())
            .await
            .unwrap_err();
        match &err {
            StreamError::RetentionMismatch {
                stream,
                existing,
                wanted,
            } => {
                assert_eq!(stream, "HUB_INGRESS");
                assert_eq!(*existing, RetentionPolicy::Limits);
                assert_eq!(*wanted, RetentionPolicy::WorkQueue);
            }
            other => panic!("expected RetentionMismatch, got {other:?}"),
        }
        assert!(err.to_string().contains("delete the stream"));
    }
}
