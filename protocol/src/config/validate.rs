//! The rules a delivery config must follow beyond its types.

use std::ops::RangeInclusive;

use super::{limit, ConfigError, DeliveryConfig};
use crate::subjects::{validate_durable_name, validate_stream_name};

/// Longest duration JetStream can take: its durations are `i64`
/// nanoseconds.
pub const MAX_DURATION_SECS: u64 = i64::MAX as u64 / 1_000_000_000;

/// Allowed replica counts of a stream.
pub const REPLICAS: RangeInclusive<usize> = 1..=5;

impl DeliveryConfig {
    /// Checks the rules the types cannot express.
    ///
    /// - stream names and `router_consumer` are valid JetStream names, and
    ///   the three stream names differ;
    /// - durations are at least 1 second (`-1` allowed where documented);
    /// - `duplicate_window_secs` does not exceed any finite `max_age_secs`;
    /// - `replicas` and `inbox.replicas` are 1 to 5, `inbox.consumer_replicas` 1 to the inbox
    ///   stream's replicas, `inbox.max_consumers` and `tasks.work_max_consumers` at least 1;
    /// - limits are `-1` (unlimited) or at least 1: `0` is ambiguous.
    ///
    /// # Errors
    ///
    /// Returns [`ConfigError::Invalid`] naming the first key that breaks a
    /// rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let streams = [
            ("ingress.name", &self.ingress.name),
            ("inbox.name", &self.inbox.name),
            ("tasks.name", &self.tasks.name),
        ];
        for (index, (key, name)) in streams.iter().enumerate() {
            validate_stream_name(name)
                .map_err(|e| invalid(key, crate::error_chain::ErrorChain(&e).to_string()))?;
            if let Some((other, _)) = streams[..index].iter().find(|(_, other)| other == name) {
                return Err(invalid(key, format!("must differ from `{other}`")));
            }
        }
        validate_durable_name(&self.router_consumer).map_err(|e| {
            invalid(
                "router_consumer",
                crate::error_chain::ErrorChain(&e).to_string(),
            )
        })?;

        let max_ages = [
            ("ingress.max_age_secs", self.ingress.max_age_secs),
            ("inbox.max_age_secs", self.inbox.max_age_secs),
            ("tasks.max_age_secs", self.tasks.max_age_secs),
        ];
        for (key, value) in max_ages {
            check_duration(key, value)?;
        }
        check_duration("inbox_inactive_secs", self.inbox_inactive_secs)?;
        check_duration("inbox.trim_interval_secs", self.inbox.trim_interval_secs)?;
        for (key, value) in [
            ("duplicate_window_secs", self.duplicate_window_secs),
            ("ack_wait_secs", self.ack_wait_secs),
            ("expiry_grace_secs", self.expiry_grace_secs),
            ("presence_beat_secs", self.presence_beat_secs),
            ("answer_max_wait_secs", self.answer_max_wait_secs),
        ] {
            check_finite_duration(key, value)?;
        }
        if self.consumer_watchdog_secs != 0 {
            check_finite_duration("consumer_watchdog_secs", self.consumer_watchdog_secs)?;
        }
        for (key, max_age) in max_ages {
            if limit(max_age).is_some_and(|max_age| self.duplicate_window_secs > max_age) {
                return Err(invalid(
                    "duplicate_window_secs",
                    format!("must not exceed `{key}` ({max_age})"),
                ));
            }
        }

        if self.inbox_max_deliver == 0 || self.inbox_max_deliver < -1 {
            return Err(invalid(
                "inbox_max_deliver",
                format!(
                    "must be -1 (unlimited) or at least 1, got {}",
                    self.inbox_max_deliver
                ),
            ));
        }
        for secs in &self.inbox_backoff_secs {
            check_finite_duration("inbox_backoff_secs", *secs)?;
        }
        let backoffs = i64::try_from(self.inbox_backoff_secs.len()).unwrap_or(i64::MAX);
        if self.inbox_max_deliver != -1 && backoffs >= self.inbox_max_deliver {
            return Err(invalid(
                "inbox_backoff_secs",
                format!(
                    "holds {backoffs} waits: it must be shorter than `inbox_max_deliver` ({})",
                    self.inbox_max_deliver
                ),
            ));
        }

        for (key, replicas) in [
            ("replicas", Some(self.replicas)),
            ("inbox.replicas", self.inbox.replicas),
        ] {
            match replicas {
                Some(n) if !REPLICAS.contains(&n) => {
                    return Err(invalid(
                        key,
                        format!(
                            "must be between {} and {}, got {n}",
                            REPLICAS.start(),
                            REPLICAS.end(),
                        ),
                    ));
                }
                _ => {}
            }
        }
        if let Some(n) = self.inbox.consumer_replicas {
            let stream = self.inbox_replicas();
            if n == 0 || n > stream {
                return Err(invalid(
                    "inbox.consumer_replicas",
                    format!(
                        "must be between 1 and the inbox stream's replicas ({stream}), got {n}"
                    ),
                ));
            }
        }

        for (key, value) in [
            (
                "inbox.max_msgs_per_subject",
                self.inbox.max_msgs_per_subject,
            ),
            ("inbox.max_bytes", self.inbox.max_bytes),
            ("inbox.max_msgs", self.inbox.max_msgs),
            ("inbox.max_msg_size", self.inbox.max_msg_size),
            (
                "tasks.max_msgs_per_subject",
                self.tasks.max_msgs_per_subject,
            ),
            ("router_max_deliver", self.router_max_deliver),
            ("router_max_ack_pending", self.router_max_ack_pending),
            ("inbox_max_ack_pending", self.inbox_max_ack_pending),
            ("sender_rate_per_min", self.sender_rate_per_min),
            ("task_max_deliver", self.task_max_deliver),
        ] {
            check_limit(key, value)?;
        }
        if self.task_max_deliver == 1 {
            return Err(invalid(
                "task_max_deliver",
                "must be -1 (unlimited) or at least 2: one crash must not dead-letter a task"
                    .to_owned(),
            ));
        }
        if self.sender_rate_per_min > i64::from(u32::MAX) {
            return Err(invalid(
                "sender_rate_per_min",
                format!(
                    "must be at most {}, got {}",
                    u32::MAX,
                    self.sender_rate_per_min
                ),
            ));
        }
        // JetStream stores them as an `i32`, and puts its own default on a value below 1.
        for (key, value) in [
            ("inbox.max_consumers", self.inbox.max_consumers),
            ("tasks.work_max_consumers", self.tasks.work_max_consumers),
        ] {
            if !(1..=i64::from(i32::MAX)).contains(&value) {
                return Err(invalid(
                    key,
                    format!("must be between 1 and {}, got {value}", i32::MAX),
                ));
            }
        }
        // JetStream stores the max message size as an `i32`.
        if self.inbox.max_msg_size > i64::from(i32::MAX) {
            return Err(invalid(
                "inbox.max_msg_size",
                format!(
                    "must be at most {}, got {}",
                    i32::MAX,
                    self.inbox.max_msg_size
                ),
            ));
        }
        Ok(())
    }
}

/// `-1` (unlimited) or at least 1.
fn check_limit(key: &str, value: i64) -> Result<(), ConfigError> {
    if value == -1 || value >= 1 {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must be -1 (unlimited) or at least 1, got {value}"),
    ))
}

/// `-1` (unlimited) or 1 to [`MAX_DURATION_SECS`] seconds.
fn check_duration(key: &str, value: i64) -> Result<(), ConfigError> {
    check_limit(key, value)?;
    match limit(value) {
        Some(secs) => check_finite_duration(key, secs),
        None => Ok(()),
    }
}

/// 1 to [`MAX_DURATION_SECS`] seconds.
fn check_finite_duration(key: &str, secs: u64) -> Result<(), ConfigError> {
    if (1..=MAX_DURATION_SECS).contains(&secs) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must be between 1 and {MAX_DURATION_SECS} seconds, got {secs}"),
    ))
}

fn invalid(key: &str, reason: String) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        reason,
    }
}
