//! Backpressure: what the hub answers when a limit is reached, and when a sender may try again.
//!
//! - **A full inbox.** `HUB_INBOX` keeps at most `inbox.max_msgs_per_subject` DMs per recipient
//!   and refuses a new one past that (`discard: new`, `discard_new_per_subject`): nothing stored
//!   is dropped to make room. The router tells the sender with a rejection of kind
//!   [`inbox_full`](crate::WireErrorKind::InboxFull) whose `retry_after_secs` is when the
//!   recipient's oldest DM leaves the stream ([`inbox_full_retry_after`]).
//! - **A sender over its rate.** With `sender_rate_per_min` set, every sender has a token bucket
//!   ([`take_token`]) shared by all routers in a KV bucket; a DM past it is refused with kind
//!   [`rate_limited`](crate::WireErrorKind::RateLimited) and the seconds until a token is back.
//!
//! A client that reads such a refusal does not send to that recipient (inbox full) or at all
//! (rate limited) before `retry_after_secs` has passed ([`Hold`]).
//!
//! ```
//! use protocol::backpressure::{take_token, Bucket, Taken};
//!
//! // 2 per minute: a full bucket holds 2 tokens; the third DM within the minute waits 30 s.
//! let b = Bucket::full(2, 0);
//! let Taken::Granted(b) = take_token(Some(b), 2, 0) else { panic!() };
//! let Taken::Granted(b) = take_token(Some(b), 2, 1_000) else { panic!() };
//! assert_eq!(take_token(Some(b), 2, 1_000), Taken::Limited { retry_after_secs: 30 });
//! ```

use serde::{Deserialize, Serialize};

use crate::ids::AgentId;
use crate::rejection::Rejection;
use crate::wire_error::WireErrorKind;

/// The `retry_after_secs` of a full inbox whose oldest DM has no known end (an unlimited
/// `inbox.max_age_secs` and no `Nats-TTL`), or could not be read.
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 60;

/// nats-server's error code for a store that failed (`JSStreamStoreFailedF`); its description
/// names the limit.
pub const STREAM_STORE_FAILED: u64 = 10077;

/// A limit the broker refused a store on, read from its publish-ack error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRefusal {
    /// The subject holds `max_msgs_per_subject` messages (`discard_new_per_subject`).
    SubjectFull,
    /// The stream holds `max_msgs` messages or `max_bytes` bytes (`discard: new`).
    StreamFull,
    /// The message is over the stream's `max_msg_size`.
    TooLarge,
}

/// Reads a publish-ack error (`err_code`, `description`) as a refusal the sender must be told
/// of, or `None` for any other failure (which is retried).
pub fn store_refusal(err_code: u64, description: &str) -> Option<StoreRefusal> {
    if err_code != STREAM_STORE_FAILED {
        return None;
    }
    let d = description.to_ascii_lowercase();
    if d.contains("maximum messages per subject exceeded") {
        Some(StoreRefusal::SubjectFull)
    } else if d.contains("maximum messages exceeded") || d.contains("maximum bytes exceeded") {
        Some(StoreRefusal::StreamFull)
    } else if d.contains("message size exceeds maximum allowed") {
        Some(StoreRefusal::TooLarge)
    } else {
        None
    }
}

/// When a full inbox has room again: the seconds until its oldest DM (stored `age_secs` ago)
/// leaves the stream, at the end of `max_age_secs` (none when unlimited) or of its own TTL
/// (`ttl_secs`, the `Nats-TTL` it was stored with), whichever comes first. At least 1 s;
/// [`DEFAULT_RETRY_AFTER_SECS`] when neither is known.
pub fn inbox_full_retry_after(
    age_secs: u64,
    max_age_secs: Option<u64>,
    ttl_secs: Option<u64>,
) -> u64 {
    let end = match (max_age_secs, ttl_secs) {
        (Some(a), Some(t)) => a.min(t),
        (Some(a), None) => a,
        (None, Some(t)) => t,
        (None, None) => return DEFAULT_RETRY_AFTER_SECS,
    };
    end.saturating_sub(age_secs).max(1)
}

/// A sender's token bucket, as stored (JSON) in the rate-limit KV bucket under its identity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// Tokens left, in thousandths (integer arithmetic: every router computes the same).
    pub milli_tokens: u64,
    /// When it was last refilled, unix ms.
    pub at_ms: u64,
}

impl Bucket {
    /// A full bucket of `rate_per_min` tokens at `now_ms`.
    pub fn full(rate_per_min: u32, now_ms: u64) -> Bucket {
        Bucket {
            milli_tokens: u64::from(rate_per_min) * 1000,
            at_ms: now_ms,
        }
    }
}

/// What [`take_token`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Taken {
    /// The DM may go; store this bucket.
    Granted(Bucket),
    /// No token: refuse it; the next token is back in this many seconds (at least 1).
    Limited {
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
    },
}

/// Takes one token from `bucket` (none yet: a full one) at `now_ms`, after refilling it at
/// `rate_per_min` tokens a minute up to `rate_per_min` (a burst of one minute's worth). A
/// clock that went back refills nothing.
pub fn take_token(bucket: Option<Bucket>, rate_per_min: u32, now_ms: u64) -> Taken {
    let cap = u64::from(rate_per_min) * 1000;
    let mut b = bucket.unwrap_or_else(|| Bucket::full(rate_per_min, now_ms));
    let elapsed = now_ms.saturating_sub(b.at_ms);
    // milli-tokens per ms = rate/60_000 * 1000 = rate/60.
    let refill = elapsed.saturating_mul(u64::from(rate_per_min)) / 60;
    b.milli_tokens = b.milli_tokens.saturating_add(refill).min(cap);
    b.at_ms = b.at_ms.max(now_ms);
    if b.milli_tokens >= 1000 {
        b.milli_tokens -= 1000;
        return Taken::Granted(b);
    }
    if rate_per_min == 0 {
        return Taken::Limited {
            retry_after_secs: DEFAULT_RETRY_AFTER_SECS,
        };
    }
    let missing = 1000 - b.milli_tokens;
    // ms until `missing` milli-tokens: missing * 60 / rate, rounded up, then whole seconds.
    let ms = (missing * 60).div_ceil(u64::from(rate_per_min));
    Taken::Limited {
        retry_after_secs: ms.div_ceil(1000).max(1),
    }
}

/// A client's note not to send before `until_ms` (unix ms): to one recipient (a full inbox)
/// or to anyone (rate limited). The router also stores it (JSON) in the holds KV bucket under
/// [`HoldScope::key`], where a one-shot client (the CLI) reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// Unix ms before which a send is refused locally.
    pub until_ms: u64,
}

impl Hold {
    /// A hold of `retry_after_secs` from `now_ms`.
    pub fn after(now_ms: u64, retry_after_secs: u64) -> Hold {
        Hold {
            until_ms: now_ms.saturating_add(retry_after_secs.saturating_mul(1000)),
        }
    }

    /// Whole seconds left at `now_ms`, rounded up; `None` once it has passed.
    pub fn left_secs(&self, now_ms: u64) -> Option<u64> {
        (now_ms < self.until_ms).then(|| (self.until_ms - now_ms).div_ceil(1000))
    }
}

/// What a [`Hold`] holds back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HoldScope {
    /// The sender's DMs to this recipient (its inbox is full).
    To(AgentId),
    /// Every DM of the sender (it is over its rate).
    All,
}

impl HoldScope {
    /// The key of `from`'s hold in the holds KV bucket: `<from>.to.<to>` or `<from>.rate`.
    pub fn key(&self, from: &AgentId) -> String {
        match self {
            HoldScope::To(to) => format!("{from}.to.{to}"),
            HoldScope::All => format!("{from}.rate"),
        }
    }
}

/// The hold a rejection tells its recipient (the refused DM's sender) to keep, read at
/// `now_ms`: `None` unless it is a refusal for a limit with a `retry_after_secs`.
pub fn hold_of(rejection: &Rejection, now_ms: u64) -> Option<(HoldScope, Hold)> {
    let secs = rejection.retry_after_secs?;
    let scope = match (rejection.error.kind, &rejection.to) {
        (WireErrorKind::InboxFull, Some(to)) => HoldScope::To(to.clone()),
        (WireErrorKind::RateLimited, _) => HoldScope::All,
        _ => return None,
    };
    Some((scope, Hold::after(now_ms, secs)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refusals_are_read_from_the_store_error() {
        let f = STREAM_STORE_FAILED;
        assert_eq!(
            store_refusal(f, "maximum messages per subject exceeded"),
            Some(StoreRefusal::SubjectFull)
        );
        assert_eq!(
            store_refusal(f, "maximum bytes exceeded"),
            Some(StoreRefusal::StreamFull)
        );
        assert_eq!(
            store_refusal(f, "maximum messages exceeded"),
            Some(StoreRefusal::StreamFull)
        );
        assert_eq!(
            store_refusal(f, "message size exceeds maximum allowed"),
            Some(StoreRefusal::TooLarge)
        );
        assert_eq!(store_refusal(f, "insufficient resources"), None);
        assert_eq!(
            store_refusal(10_008, "maximum messages per subject exceeded"),
            None
        );
    }

    #[test]
    fn a_full_inbox_has_room_when_its_oldest_leaves() {
        assert_eq!(inbox_full_retry_after(100, Some(600), None), 500);
        assert_eq!(inbox_full_retry_after(100, Some(600), Some(130)), 30);
        assert_eq!(inbox_full_retry_after(100, None, Some(130)), 30);
        assert_eq!(inbox_full_retry_after(700, Some(600), None), 1);
        assert_eq!(
            inbox_full_retry_after(5, None, None),
            DEFAULT_RETRY_AFTER_SECS
        );
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_one_minute_of_tokens() {
        let b = Bucket::full(60, 0);
        // 60 taken at once, the 61st waits a second.
        let mut cur = Some(b);
        for _ in 0..60 {
            match take_token(cur, 60, 0) {
                Taken::Granted(b) => cur = Some(b),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            take_token(cur, 60, 0),
            Taken::Limited {
                retry_after_secs: 1
            }
        );
        // After an hour it holds a minute's worth, not an hour's.
        let Taken::Granted(b) = take_token(cur, 60, 3_600_000) else {
            panic!()
        };
        assert_eq!(b.milli_tokens, 59_000);
    }

    #[test]
    fn a_refusal_for_a_limit_tells_what_to_hold_back() {
        use crate::ids::MessageId;
        use crate::rejection::{parse_rejection, refusal};
        use crate::wire_error::WireError;
        let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
        let id = MessageId::new("m1").unwrap();
        let full = WireError::new(WireErrorKind::InboxFull, "full");
        let (_, _, env) = refusal(&alice, Some(&id), &full, 1, Some(5), Some(&bob));
        let (scope, hold) = hold_of(&parse_rejection(&env).unwrap(), 1_000).unwrap();
        assert_eq!(scope, HoldScope::To(bob.clone()));
        assert_eq!(scope.key(&alice), "alice.to.bob");
        assert_eq!(hold.until_ms, 6_000);
        let rate = WireError::new(WireErrorKind::RateLimited, "over");
        let (_, _, env) = refusal(&alice, Some(&id), &rate, 1, Some(2), Some(&bob));
        let (scope, _) = hold_of(&parse_rejection(&env).unwrap(), 0).unwrap();
        assert_eq!(scope, HoldScope::All);
        assert_eq!(scope.key(&alice), "alice.rate");
        // Any other rejection holds nothing back.
        let malformed = WireError::new(WireErrorKind::Malformed, "bad");
        let (_, _, env) = crate::rejection::rejection(&alice, Some(&id), &malformed, 1);
        assert_eq!(hold_of(&parse_rejection(&env).unwrap(), 0), None);
    }

    #[test]
    fn holds_count_down() {
        let h = Hold::after(1_000, 3);
        assert_eq!(h.left_secs(1_000), Some(3));
        assert_eq!(h.left_secs(3_500), Some(1));
        assert_eq!(h.left_secs(4_000), None);
    }

    proptest! {
        /// Within any window, no more than the burst plus the refill is granted.
        #[test]
        fn never_more_than_burst_plus_refill(rate in 1u32..600, steps in proptest::collection::vec(0u64..5_000, 1..200)) {
            let mut now = 0u64;
            let mut bucket = None;
            let mut granted = 0u64;
            for step in steps {
                now += step;
                match take_token(bucket, rate, now) {
                    Taken::Granted(b) => { bucket = Some(b); granted += 1; }
                    Taken::Limited { retry_after_secs } => {
                        prop_assert!(retry_after_secs >= 1);
                        // Waiting that long is enough.
                        let later = now + retry_after_secs * 1000;
                        prop_assert!(matches!(take_token(bucket, rate, later), Taken::Granted(_)));
                    }
                }
            }
            let allowed = u64::from(rate) + now * u64::from(rate) / 60_000 + 1;
            prop_assert!(granted <= allowed, "granted {granted} > {allowed}");
        }
    }
}
