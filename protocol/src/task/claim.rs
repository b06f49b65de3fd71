//! The task claim: before its handler runs, an attempt takes its task in the claims bucket
//! ([`CLAIMS_BUCKET`](crate::subjects::CLAIMS_BUCKET), key
//! [`claim_key`](crate::subjects::claim_key)) with a compare-and-set, and renews it with its
//! input's heartbeats under a per-message TTL of the consumer's ack wait. A second delivery of
//! the task while the claim is held elsewhere (a broker that forgot a delivery, a consumer made
//! again, a paused cluster node that delivered once more) stands down instead of running it a
//! second time. A claim is never released: it lapses one ack wait after its last renewal, so a
//! copy of the task that comes just after the first attempt finished also stands down, and
//! then finds the result on the task channel.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::AttemptId;
use crate::ids::WorkerId;

/// Who holds a task: the value of its claim entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The attempt running it.
    pub attempt_id: AttemptId,
    /// Its worker.
    pub worker_id: WorkerId,
}

impl Claim {
    /// The entry's bytes (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a claim serializes")
    }

    /// The claim in an entry's bytes; `None` when they are not one.
    pub fn decode(bytes: &[u8]) -> Option<Claim> {
        serde_json::from_slice(bytes).ok()
    }
}

/// What the claims bucket holds under a task's key, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Nothing: never claimed, or the claim lapsed without a marker.
    Empty,
    /// A deletion marker (a delete, a purge, or a lapse marker) at this revision.
    Released {
        /// The subject's last sequence.
        revision: u64,
    },
    /// A value at this revision: a claim, or (`None`) bytes that are not one.
    Value {
        /// The subject's last sequence.
        revision: u64,
        /// The claim it holds.
        claim: Option<Claim>,
    },
}

/// What an attempt does with what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimStep {
    /// Write its claim, expecting the subject's last sequence to be `expect` (0: none).
    Take {
        /// The `Nats-Expected-Last-Subject-Sequence` of the write.
        expect: u64,
    },
    /// Another attempt holds the task (or an entry that is not a claim does): do not run it.
    StandDown,
}

/// Whether attempt `mine` may take the task whose key holds `stored`: a free key, or its own
/// claim (written before this worker restarted, or by a write whose ack was lost), is taken by
/// a write expecting the revision read; anything else is someone else's.
pub fn claim_step(stored: &Stored, mine: &Claim) -> ClaimStep {
    match stored {
        Stored::Empty => ClaimStep::Take { expect: 0 },
        Stored::Released { revision } => ClaimStep::Take { expect: *revision },
        Stored::Value {
            revision,
            claim: Some(claim),
        } if claim == mine => ClaimStep::Take { expect: *revision },
        Stored::Value { .. } => ClaimStep::StandDown,
    }
}

/// The TTL of a claim renewed every third of `ack_wait`: the ack wait itself, rounded up to
/// whole seconds (the `Nats-TTL` header's unit), at least one second. A worker that stops
/// renewing (killed, cut off) loses the claim about when its input is redelivered.
pub fn claim_ttl(ack_wait: Duration) -> Duration {
    let secs = ack_wait.as_secs() + u64::from(ack_wait.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// The `Nats-TTL` header value of a claim written with `ttl`.
pub fn ttl_header(ttl: Duration) -> String {
    format!("{}s", claim_ttl(ttl).as_secs())
}

/// The shortest nak delay of a stood-down input.
pub const MIN_STAND_DOWN: Duration = Duration::from_millis(250);
/// What a stood-down input waits past the claim's lapse (the broker removes a lapsed entry a
/// moment after its TTL).
pub const LAPSE_MARGIN: Duration = Duration::from_millis(250);

/// How long a stood-down input is nak'd for: until the claim it met lapses, as far as the
/// claim's write time (`written_at_ms`, the broker's clock) and TTL say at `now_ms`, plus
/// [`LAPSE_MARGIN`]; between [`MIN_STAND_DOWN`] and the ack wait plus the margin (a claim
/// without a TTL, or a clock far off, waits one ack wait).
pub fn stand_down_delay(
    written_at_ms: Option<u64>,
    ttl: Option<Duration>,
    now_ms: u64,
    ack_wait: Duration,
) -> Duration {
    let most = ack_wait.max(MIN_STAND_DOWN) + LAPSE_MARGIN;
    let left = match (written_at_ms, ttl) {
        (Some(at), Some(ttl)) => {
            let lapses_at = at.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
            Duration::from_millis(lapses_at.saturating_sub(now_ms)) + LAPSE_MARGIN
        }
        _ => most,
    };
    left.clamp(MIN_STAND_DOWN, most)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(attempt: &str, worker: &str) -> Claim {
        Claim {
            attempt_id: AttemptId::new(attempt).unwrap(),
            worker_id: WorkerId::new(worker).unwrap(),
        }
    }

    #[test]
    fn a_free_key_or_its_own_claim_is_taken_anything_else_stood_down_from() {
        let mine = claim("a1", "w1");
        assert_eq!(
            claim_step(&Stored::Empty, &mine),
            ClaimStep::Take { expect: 0 }
        );
        assert_eq!(
            claim_step(&Stored::Released { revision: 7 }, &mine),
            ClaimStep::Take { expect: 7 }
        );
        let own = Stored::Value {
            revision: 9,
            claim: Some(mine.clone()),
        };
        assert_eq!(claim_step(&own, &mine), ClaimStep::Take { expect: 9 });
        for other in [
            Some(claim("a2", "w2")),
            // The same attempt id from another worker is not this attempt.
            Some(claim("a1", "w2")),
            Some(claim("a2", "w1")),
            None,
        ] {
            let stored = Stored::Value {
                revision: 3,
                claim: other.clone(),
            };
            assert_eq!(
                claim_step(&stored, &mine),
                ClaimStep::StandDown,
                "{other:?}"
            );
        }
    }

    #[test]
    fn a_claim_round_trips_and_other_bytes_are_no_claim() {
        let c = claim("a1", "w1");
        assert_eq!(Claim::decode(&c.encode()), Some(c));
        assert_eq!(Claim::decode(b"not json"), None);
        assert_eq!(
            Claim::decode(br#"{"attempt_id": "a b", "worker_id": "w"}"#),
            None
        );
    }

    #[test]
    fn ttls_are_whole_seconds_covering_the_ack_wait() {
        assert_eq!(
            claim_ttl(Duration::from_millis(100)),
            Duration::from_secs(1)
        );
        assert_eq!(claim_ttl(Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(
            claim_ttl(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
        assert_eq!(ttl_header(Duration::from_secs(30)), "30s");
    }

    #[test]
    fn a_stood_down_input_waits_until_the_claim_lapses() {
        let ack_wait = Duration::from_secs(30);
        let at = 1_000_000;
        assert_eq!(
            stand_down_delay(
                Some(at),
                Some(Duration::from_secs(30)),
                at + 10_000,
                ack_wait
            ),
            Duration::from_millis(20_250)
        );
        // Lapsed already: soon.
        assert_eq!(
            stand_down_delay(Some(at), Some(Duration::from_secs(1)), at + 5_000, ack_wait),
            MIN_STAND_DOWN
        );
        // No TTL known: one ack wait.
        assert_eq!(
            stand_down_delay(None, None, at, ack_wait),
            ack_wait + LAPSE_MARGIN
        );
        // A writer's clock far ahead does not hold the input longer than an ack wait.
        assert_eq!(
            stand_down_delay(
                Some(at + 3_600_000),
                Some(Duration::from_secs(30)),
                at,
                ack_wait
            ),
            ack_wait + LAPSE_MARGIN
        );
    }

    fn any_claim() -> impl Strategy<Value = Claim> {
        (prop_oneof!["a1", "a2"], prop_oneof!["w1", "w2"]).prop_map(|(a, w)| claim(&a, &w))
    }

    fn any_stored() -> impl Strategy<Value = Stored> {
        prop_oneof![
            Just(Stored::Empty),
            (1u64..100).prop_map(|revision| Stored::Released { revision }),
            (1u64..100, proptest::option::of(any_claim()))
                .prop_map(|(revision, claim)| Stored::Value { revision, claim }),
        ]
    }

    proptest! {
        /// A take never overwrites another's claim, and always expects the revision it read,
        /// so two attempts that read the same state cannot both take it.
        #[test]
        fn a_take_expects_what_was_read_and_never_overwrites_another_claim(
            stored in any_stored(),
            mine in any_claim(),
        ) {
            match (claim_step(&stored, &mine), &stored) {
                (ClaimStep::Take { expect }, Stored::Empty) => prop_assert_eq!(expect, 0),
                (ClaimStep::Take { expect }, Stored::Released { revision }) => prop_assert_eq!(expect, *revision),
                (ClaimStep::Take { expect }, Stored::Value { revision, claim }) => {
                    prop_assert_eq!(expect, *revision);
                    prop_assert_eq!(claim.as_ref(), Some(&mine));
                }
                (ClaimStep::StandDown, Stored::Value { claim, .. }) => prop_assert_ne!(claim.as_ref(), Some(&mine)),
                (ClaimStep::StandDown, _) => prop_assert!(false, "stood down from a free key"),
            }
        }

        #[test]
        fn a_stand_down_is_bounded_by_the_ack_wait(
            at in proptest::option::of(0u64..10_000_000),
            ttl in proptest::option::of(0u64..100_000),
            now in 0u64..10_000_000,
            ack_wait_ms in 0u64..100_000,
        ) {
            let ack_wait = Duration::from_millis(ack_wait_ms);
            let delay = stand_down_delay(at, ttl.map(Duration::from_millis), now, ack_wait);
            prop_assert!(delay >= MIN_STAND_DOWN);
            prop_assert!(delay <= ack_wait.max(MIN_STAND_DOWN) + LAPSE_MARGIN);
        }

        #[test]
        fn a_ttl_covers_its_ack_wait(ms in 0u64..10_000_000) {
            let ack_wait = Duration::from_millis(ms);
            let ttl = claim_ttl(ack_wait);
            prop_assert!(ttl >= ack_wait);
            prop_assert!(ttl < ack_wait + Duration::from_secs(1) || ttl == Duration::from_secs(1));
            prop_assert_eq!(ttl.subsec_nanos(), 0);
        }
    }
}
