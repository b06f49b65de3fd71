//! The durable delivery config (`--delivery-config <file.json>`).
//!
//! Any subset of the keys may be given; the rest keep their defaults.
//! Unknown keys are rejected. Numeric limits are `i64` where `-1` means
//! unlimited; use the `*_limit()` helpers (or [`limit`]) to get an
//! `Option<u64>`.
//!
//! ```
//! use protocol::config::{DeliveryConfig, StorageKind};
//!
//! let config = DeliveryConfig::from_json_str(r#"{"inbox": {"storage": "memory"}}"#).unwrap();
//! assert_eq!(config.inbox.storage, StorageKind::Memory);
//! assert_eq!(config.inbox.name, "HUB_INBOX");
//! assert_eq!(config.router_max_deliver_limit(), None);
//! ```

mod error;
mod parse;
mod validate;

use std::fmt;
use std::time::Duration;

pub use error::ConfigError;
use serde::{Deserialize, Serialize};
pub use validate::{MAX_DURATION_SECS, REPLICAS};

use crate::subjects::{INBOX_STREAM, INGRESS_STREAM, ROUTER_CONSUMER, TASKS_STREAM};

/// The value of a limit that means "unlimited".
pub const UNLIMITED: i64 = -1;

/// A limit as an `Option`: `None` when unlimited (negative), else the value.
pub fn limit(value: i64) -> Option<u64> {
    u64::try_from(value).ok()
}

/// A number of seconds as a duration: `None` when unlimited (negative).
pub fn seconds(value: i64) -> Option<Duration> {
    limit(value).map(Duration::from_secs)
}

/// Streams, consumers and limits of durable delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// The stream capturing `hub.pub.>`.
    pub ingress: IngressStreamConfig,
    /// The stream storing inboxes.
    pub inbox: InboxStreamConfig,
    /// The stream storing task channels.
    pub tasks: TasksStreamConfig,
    /// `Nats-Msg-Id` dedupe window of every stream.
    pub duplicate_window_secs: u64,
    /// Durable name of the shared router consumer.
    pub router_consumer: String,
    /// Ack wait of the router and inbox consumers.
    pub ack_wait_secs: u64,
    /// Max deliveries of an ingress message to routers; `-1` unlimited.
    pub router_max_deliver: i64,
    /// Max unacked ingress messages across routers; `-1` unlimited.
    pub router_max_ack_pending: i64,
    /// Max unacked messages per inbox consumer; `-1` unlimited.
    pub inbox_max_ack_pending: i64,
    /// Removes an inbox consumer nobody read for this long; `-1` never.
    pub inbox_inactive_secs: i64,
    /// How long a DM is kept past its `meta.expires_at` (its `Nats-TTL` is the time left plus
    /// this): long enough for the inbox that terminates it as expired to have its sender told.
    pub expiry_grace_secs: u64,
    /// Deliveries of one DM to its inbox before it is dead-lettered; `-1` unlimited.
    pub inbox_max_deliver: i64,
    /// The waits before each redelivery of a DM whose ack did not come (the inbox consumer's
    /// backoff; the last one repeats); empty: the ack wait.
    pub inbox_backoff_secs: Vec<u64>,
    /// DMs one sender may send a minute, shared by all routers (a token bucket per sender in
    /// the `HUB_RATE` KV bucket, with a burst of one minute's worth); `-1` no limit.
    pub sender_rate_per_min: i64,
    /// How often an attached inbox writes its agent's presence (`HUB_PRESENCE`); a beat is
    /// believed for three of these.
    pub presence_beat_secs: u64,
    /// Deliveries of one task input to workers (its queue's or its worker's consumer) before
    /// it is dead-lettered; `-1` unlimited.
    pub task_max_deliver: i64,
    /// How long an answer may wait for its worker's consumer to take it before it is
    /// dead-lettered (its answerer told): a worker gone for good never takes it.
    pub answer_max_wait_secs: u64,
    /// How often each router's consumer watchdog checks the consumers of the work-queue
    /// streams for one that stopped delivering what its stream holds ([`crate::watchdog`]);
    /// `0` never.
    pub consumer_watchdog_secs: u64,
    /// Whether routers, inboxes and workers emit audit events to `HUB_AUDIT` (`runtime trace`).
    pub audit_events: bool,
    /// Replicas of every stream and KV bucket the runtime creates, 1 to 5 (more than 1 needs
    /// a JetStream cluster of at least that many nodes; `inbox.replicas` may differ for the
    /// inbox stream).
    pub replicas: usize,
}

/// The ingress stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngressStreamConfig {
    /// Stream name.
    pub name: String,
    /// Retention; `-1` unlimited.
    pub max_age_secs: i64,
}

/// The inbox stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboxStreamConfig {
    /// Stream name.
    pub name: String,
    /// Retention; `-1` unlimited.
    pub max_age_secs: i64,
    /// Messages kept per inbox; `-1` unlimited.
    pub max_msgs_per_subject: i64,
    /// Bytes kept in the stream; `-1` unlimited.
    pub max_bytes: i64,
    /// Messages kept in the stream; `-1` unlimited.
    pub max_msgs: i64,
    /// Largest message accepted; `-1` unlimited (the server's max payload).
    pub max_msg_size: i64,
    /// Consumers the stream holds, one per agent that ever attached (at least 1; no unlimited:
    /// nats-server 2.15 puts its own default of 1,000 on a stream that sets none).
    pub max_consumers: i64,
    /// The inbox stream's replicas when they differ from the top-level `replicas`, 1 to 5
    /// (`null`: the same).
    pub replicas: Option<usize>,
    /// Replicas of each agent's inbox consumer, 1 to the inbox stream's replicas (`null`: the
    /// stream's, JetStream's own default). One consumer per agent: on a cluster each is a raft
    /// group of its own, so a large hub may choose 1 (docs/CAPACITY.md weighs the cost; an R1
    /// consumer's inbox waits while its node is down and resumes, its place kept, when the
    /// node returns).
    pub consumer_replicas: Option<usize>,
    /// Storage backend.
    pub storage: StorageKind,
    /// How often each router trims what the inboxes have read, so that the per-inbox cap
    /// counts unread DMs ([`crate::history`]); `-1` never.
    pub trim_interval_secs: i64,
}

/// The task channel stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksStreamConfig {
    /// Stream name.
    pub name: String,
    /// Retention; `-1` unlimited.
    pub max_age_secs: i64,
    /// Messages kept per task channel; `-1` unlimited.
    pub max_msgs_per_subject: i64,
    /// Consumers each of the work and answer streams holds (`HUB_WORK`: one per queue and one
    /// per pinned worker; `HUB_ANSWERS`: one per worker). At least 1; no unlimited, as for
    /// `inbox.max_consumers`.
    pub work_max_consumers: i64,
}

/// Where a stream keeps its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    /// On disk.
    #[default]
    File,
    /// In memory: lost when nats-server restarts.
    Memory,
}

impl fmt::Display for StorageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StorageKind::File => "file",
            StorageKind::Memory => "memory",
        })
    }
}

const DAY_SECS: i64 = 24 * 60 * 60;
const WEEK_SECS: i64 = 7 * DAY_SECS;

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            ingress: IngressStreamConfig::default(),
            inbox: InboxStreamConfig::default(),
            tasks: TasksStreamConfig::default(),
            duplicate_window_secs: 120,
            router_consumer: ROUTER_CONSUMER.to_owned(),
            ack_wait_secs: 30,
            router_max_deliver: UNLIMITED,
            router_max_ack_pending: 1000,
            inbox_max_ack_pending: 256,
            inbox_inactive_secs: WEEK_SECS,
            expiry_grace_secs: 60,
            inbox_max_deliver: 6,
            inbox_backoff_secs: vec![5, 15, 60, 300, 900],
            sender_rate_per_min: UNLIMITED,
            presence_beat_secs: 20,
            task_max_deliver: 20,
            answer_max_wait_secs: 3600,
            consumer_watchdog_secs: 10,
            audit_events: true,
            replicas: 1,
        }
    }
}

impl Default for IngressStreamConfig {
    fn default() -> IngressStreamConfig {
        IngressStreamConfig {
            name: INGRESS_STREAM.to_owned(),
            max_age_secs: DAY_SECS,
        }
    }
}

/// The inbox stream's default `max_consumers`: agents a hub holds (each attached agent keeps
/// one durable consumer on it).
pub const DEFAULT_MAX_INBOX_CONSUMERS: i64 = 100_000;

/// The work and answer streams' default `max_consumers`: queues and workers a hub holds.
pub const DEFAULT_MAX_WORK_CONSUMERS: i64 = 100_000;

impl Default for InboxStreamConfig {
    fn default() -> InboxStreamConfig {
        InboxStreamConfig {
            name: INBOX_STREAM.to_owned(),
            max_age_secs: WEEK_SECS,
            max_msgs_per_subject: 10_000,
            max_bytes: UNLIMITED,
            max_msgs: UNLIMITED,
            max_msg_size: UNLIMITED,
            max_consumers: DEFAULT_MAX_INBOX_CONSUMERS,
            replicas: None,
            consumer_replicas: None,
            storage: StorageKind::File,
            trim_interval_secs: 60,
        }
    }
}

impl Default for TasksStreamConfig {
    fn default() -> TasksStreamConfig {
        TasksStreamConfig {
            name: TASKS_STREAM.to_owned(),
            max_age_secs: DAY_SECS,
            max_msgs_per_subject: 10_000,
            work_max_consumers: DEFAULT_MAX_WORK_CONSUMERS,
        }
    }
}

impl DeliveryConfig {
    /// The inbox stream's replicas: `inbox.replicas`, else `replicas`.
    pub fn inbox_replicas(&self) -> usize {
        self.inbox.replicas.unwrap_or(self.replicas)
    }

    /// An inbox consumer's replicas: `inbox.consumer_replicas`, else the inbox stream's.
    pub fn inbox_consumer_replicas(&self) -> usize {
        self.inbox
            .consumer_replicas
            .unwrap_or_else(|| self.inbox_replicas())
    }

    /// The `Nats-Msg-Id` dedupe window.
    pub fn duplicate_window(&self) -> Duration {
        Duration::from_secs(self.duplicate_window_secs)
    }

    /// The inbox consumer's backoff ([`inbox_backoff_secs`](Self::inbox_backoff_secs)).
    pub fn inbox_backoff(&self) -> Vec<Duration> {
        self.inbox_backoff_secs
            .iter()
            .map(|s| Duration::from_secs(*s))
            .collect()
    }

    /// [`Self::sender_rate_per_min`]; `None` when senders are not limited.
    pub fn sender_rate(&self) -> Option<u32> {
        limit(self.sender_rate_per_min).and_then(|r| u32::try_from(r).ok())
    }

    /// [`Self::presence_beat_secs`] as a duration.
    pub fn presence_beat(&self) -> Duration {
        Duration::from_secs(self.presence_beat_secs)
    }

    /// The consumer ack wait.
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_secs)
    }

    /// The inbox consumer inactivity threshold; `None` never removes it.
    pub fn inbox_inactive(&self) -> Option<Duration> {
        seconds(self.inbox_inactive_secs)
    }

    /// [`Self::router_max_deliver`]; `None` is unlimited.
    pub fn router_max_deliver_limit(&self) -> Option<u64> {
        limit(self.router_max_deliver)
    }

    /// [`Self::router_max_ack_pending`]; `None` is unlimited.
    pub fn router_max_ack_pending_limit(&self) -> Option<u64> {
        limit(self.router_max_ack_pending)
    }

    /// [`Self::inbox_max_ack_pending`]; `None` is unlimited.
    pub fn inbox_max_ack_pending_limit(&self) -> Option<u64> {
        limit(self.inbox_max_ack_pending)
    }
}

impl IngressStreamConfig {
    /// Retention; `None` is unlimited.
    pub fn max_age(&self) -> Option<Duration> {
        seconds(self.max_age_secs)
    }
}

impl InboxStreamConfig {
    /// Retention; `None` is unlimited.
    pub fn max_age(&self) -> Option<Duration> {
        seconds(self.max_age_secs)
    }

    /// [`Self::max_msgs_per_subject`]; `None` is unlimited.
    pub fn max_msgs_per_subject_limit(&self) -> Option<u64> {
        limit(self.max_msgs_per_subject)
    }

    /// [`Self::max_bytes`]; `None` is unlimited.
    pub fn max_bytes_limit(&self) -> Option<u64> {
        limit(self.max_bytes)
    }

    /// [`Self::trim_interval_secs`]; `None` is never.
    pub fn trim_interval(&self) -> Option<Duration> {
        seconds(self.trim_interval_secs)
    }

    /// [`Self::max_msgs`]; `None` is unlimited.
    pub fn max_msgs_limit(&self) -> Option<u64> {
        limit(self.max_msgs)
    }

    /// [`Self::max_msg_size`]; `None` is unlimited.
    pub fn max_msg_size_limit(&self) -> Option<u64> {
        limit(self.max_msg_size)
    }
}

impl TasksStreamConfig {
    /// Retention; `None` is unlimited.
    pub fn max_age(&self) -> Option<Duration> {
        seconds(self.max_age_secs)
    }

    /// [`Self::max_msgs_per_subject`]; `None` is unlimited.
    pub fn max_msgs_per_subject_limit(&self) -> Option<u64> {
        limit(self.max_msgs_per_subject)
    }
}

#[cfg(test)]
mod tests;
