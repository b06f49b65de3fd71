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
