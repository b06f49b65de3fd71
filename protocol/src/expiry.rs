//! Message expiry: what `meta.expires_at` (unix milliseconds) means for a message now.
//!
//! A message whose deadline has come (`expires_at <= now`: the deadline itself is too late) is
//! never delivered: the router refuses it (a rejection notice of kind `expired`), and an inbox
//! consumer never hands it to its handler (it is terminated and counted). A live one is stored
//! with a `Nats-TTL` header of the whole seconds left, rounded up, so the broker frees it at its
//! deadline (the streams allow per-message TTL).
//!
//! ```
//! use protocol::expiry::{expiry, Expiry};
//!
//! assert_eq!(expiry(None, 1_000), Expiry::Never);
//! assert_eq!(expiry(Some(1_000), 1_000), Expiry::Expired);
//! assert_eq!(expiry(Some(2_001), 1_000), Expiry::Live { ttl_secs: 2 });
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::ids::{AgentId, MessageId};

/// The `reason` an inbox terminates an expired DM with (`+TERM expired`): the broker's
/// termination advisory carries it, and the router tells the sender.
pub const TERM_REASON: &str = "expired";

/// The body of a DM's expiry check, scheduled by the router when it stores a DM with a
/// deadline and fired by the broker at that deadline (on
/// [`EXPIRY_DUE_SUBJECT`](crate::subjects::EXPIRY_DUE_SUBJECT)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpiryCheck {
    /// The DM's sender (who is told).
    pub from: AgentId,
    /// Its recipient (whose inbox consumer is checked).
    pub to: AgentId,
    /// Its `meta.id`.
    pub id: MessageId,
    /// Its stream sequence in the inbox stream.
    pub inbox_seq: u64,
    /// Its deadline, unix ms.
    pub expires_at: u64,
}

/// The body of an answer's check, scheduled by the router when it stores an answer and fired
/// `answer_max_wait_secs` later (on [`ANSWER_DUE_SUBJECT`](crate::subjects::ANSWER_DUE_SUBJECT)):
/// an answer its worker's consumer never delivered by then is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerCheck {
    /// The answerer (who is told).
    pub from: AgentId,
    /// The worker it is for.
    pub worker: crate::ids::WorkerId,
    /// The answer envelope's `meta.id`.
    pub id: MessageId,
    /// The task it answers.
    pub task_id: crate::ids::TaskId,
    /// Its sequence in the answers stream.
    pub answers_seq: u64,
}

/// Whether the check at a DM's deadline tells its sender that it expired: when the recipient's
/// inbox consumer never fetched it (`delivered_seq`, the consumer's last delivered stream
/// sequence, is below it, or there is no consumer). A DM it fetched is the inbox's to judge:
/// handed over before its deadline (delivered), or terminated as expired (whose advisory tells
/// the sender). So exactly one of the two tells the sender.
pub fn notify_at_deadline(inbox_seq: u64, delivered_seq: Option<u64>) -> bool {
    delivered_seq.is_none_or(|delivered| delivered < inbox_seq)
}

/// `at_ms` (unix ms) as an RFC 3339 UTC time to the second, rounded up (a schedule never fires
/// before the deadline): what a `Nats-Schedule: @at <time>` header takes.
pub fn rfc3339_utc(at_ms: u64) -> String {
    let secs = at_ms.div_ceil(1000);
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        (rem % 3_600) / 60,
        rem % 60
    )
}

/// What a message's deadline means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// It has no deadline.
    Never,
    /// Its deadline is ahead: `ttl_secs` whole seconds (rounded up, at least 1) are left.
    Live {
        /// The `Nats-TTL` to store it with.
        ttl_secs: u64,
    },
    /// Its deadline has come.
    Expired,
}

/// What deadline `expires_at` (unix ms) means at `now_ms`.
pub fn expiry(expires_at: Option<u64>, now_ms: u64) -> Expiry {
    match expires_at {
        None => Expiry::Never,
        Some(at) if at <= now_ms => Expiry::Expired,
        Some(at) => Expiry::Live {
            ttl_secs: (at - now_ms).div_ceil(1000).max(1),
        },
    }
}

/// The wall clock in unix milliseconds (0 before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_deadline_itself_is_too_late_and_a_live_message_keeps_its_seconds_rounded_up() {
        assert_eq!(expiry(Some(999), 1_000), Expiry::Expired);
        assert_eq!(expiry(Some(1_000), 1_000), Expiry::Expired);
        assert_eq!(expiry(Some(1_001), 1_000), Expiry::Live { ttl_secs: 1 });
        assert_eq!(expiry(Some(2_000), 1_000), Expiry::Live { ttl_secs: 1 });
        assert_eq!(expiry(Some(61_000), 1_000), Expiry::Live { ttl_secs: 60 });
        assert_eq!(expiry(None, u64::MAX), Expiry::Never);
    }

    #[test]
    fn deadlines_format_as_rfc3339_rounded_up_to_the_second() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1), "1970-01-01T00:00:01Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_796_083_199_500), "2026-12-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_767_225_600_000), "2026-01-01T00:00:00Z");
    }

    #[test]
    fn the_deadline_check_tells_only_of_a_dm_the_inbox_never_fetched() {
        assert!(notify_at_deadline(7, None), "no consumer");
        assert!(notify_at_deadline(7, Some(6)));
        assert!(!notify_at_deadline(7, Some(7)));
        assert!(!notify_at_deadline(7, Some(9)));
    }

    proptest! {
        #[test]
        fn a_live_ttl_never_ends_before_the_deadline(at in 0u64..u64::MAX / 2, now in 0u64..u64::MAX / 2) {
            match expiry(Some(at), now) {
                Expiry::Expired => prop_assert!(at <= now),
                Expiry::Live { ttl_secs } => {
                    prop_assert!(at > now);
                    prop_assert!(now + ttl_secs * 1000 >= at);
                    prop_assert!(now + (ttl_secs - 1) * 1000 < at);
                }
                Expiry::Never => prop_assert!(false),
            }
        }
    }
}
