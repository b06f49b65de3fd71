//! The consumer watchdog's decision: whether a consumer of a work-queue stream has stopped
//! delivering what its stream holds for it.
//!
//! In a work-queue stream every message still held is one no consumer has acked. So the
//! oldest message held on a consumer's filter must be, for that consumer, either awaiting
//! delivery (after its delivered sequence, counted pending) or delivered and awaiting its ack
//! (counted ack-pending). A consumer that says nothing is pending and nothing awaits an ack
//! while its stream holds such a message will never deliver it: the state open nats-server
//! issues show after a power loss or a long pause (a consumer's state ahead of its stream's).
//! A pull re-issued does not help; resetting the consumer to that message does.
//!
//! One sight could race a message stored or acked between the two reads, so a stall is only
//! called when two checks in a row see the same oldest message unaccounted for.

/// What one check saw of a consumer and its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sight {
    /// The stream sequence of the oldest message the stream holds on the consumer's filter;
    /// `None` when it holds none.
    pub oldest_held: Option<u64>,
    /// The consumer's count of messages awaiting delivery.
    pub pending: u64,
    /// The consumer's count of messages delivered and not acked yet.
    pub ack_pending: u64,
    /// The stream sequence of the consumer's last delivery.
    pub delivered_stream_seq: u64,
    /// The stream sequence below which the consumer has every message acked.
    pub ack_floor_stream_seq: u64,
}

/// Why a held message is not accounted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unaccounted {
    /// It is at or below the ack floor: the consumer takes it for acked.
    BelowAckFloor,
    /// It was delivered, yet nothing awaits an ack.
    DeliveredNotPending,
    /// It comes after the last delivery, yet nothing is pending.
    UndeliveredNotPending,
}

/// The watchdog's verdict on one consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Every message held is accounted for (or none is held).
    Healthy,
    /// The oldest held message is not accounted for: checked again before anything is done.
    Suspect {
        /// Its stream sequence.
        seq: u64,
        /// Why.
        why: Unaccounted,
    },
    /// The same message was unaccounted for at two checks in a row: reset the consumer to
    /// deliver again from `seq`.
    Stalled {
        /// The stream sequence to reset the consumer to.
        seq: u64,
        /// Why.
        why: Unaccounted,
    },
}

/// Why the oldest held message of `sight` is not accounted for, if it is not.
pub fn unaccounted(sight: &Sight) -> Option<(u64, Unaccounted)> {
    let seq = sight.oldest_held?;
    let why = if seq <= sight.ack_floor_stream_seq {
        Unaccounted::BelowAckFloor
    } else if seq <= sight.delivered_stream_seq {
        if sight.ack_pending > 0 {
            return None;
        }
        Unaccounted::DeliveredNotPending
    } else {
        if sight.pending > 0 {
            return None;
        }
        Unaccounted::UndeliveredNotPending
    };
    Some((seq, why))
}

/// The verdict on `sight`, given the verdict of the check before (`None` for a first check).
pub fn judge(before: Option<Verdict>, sight: &Sight) -> Verdict {
    let Some((seq, why)) = unaccounted(sight) else {
        return Verdict::Healthy;
    };
    match before {
        Some(Verdict::Suspect { seq: was, .. }) if was == seq => Verdict::Stalled { seq, why },
        _ => Verdict::Suspect { seq, why },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sight(
        oldest: Option<u64>,
        pending: u64,
        ack_pending: u64,
        delivered: u64,
        floor: u64,
    ) -> Sight {
        Sight {
            oldest_held: oldest,
            pending,
            ack_pending,
            delivered_stream_seq: delivered,
            ack_floor_stream_seq: floor,
        }
    }

    #[test]
    fn a_held_message_the_consumer_counts_is_healthy() {
        // Nothing held.
        assert_eq!(judge(None, &sight(None, 0, 0, 10, 10)), Verdict::Healthy);
        // Delivered, awaiting its ack (a task running, or nak'd for later).
        assert_eq!(judge(None, &sight(Some(8), 0, 1, 10, 7)), Verdict::Healthy);
        // Not delivered yet, pending.
        assert_eq!(
            judge(None, &sight(Some(11), 3, 0, 10, 10)),
            Verdict::Healthy
        );
    }

    #[test]
    fn an_unaccounted_message_seen_twice_is_a_stall_reset_to_it() {
        for (s, why) in [
            (sight(Some(5), 0, 0, 10, 7), Unaccounted::BelowAckFloor),
            (
                sight(Some(9), 4, 0, 10, 7),
                Unaccounted::DeliveredNotPending,
            ),
            (
                sight(Some(11), 0, 2, 10, 7),
                Unaccounted::UndeliveredNotPending,
            ),
        ] {
            let first = judge(None, &s);
            let seq = s.oldest_held.unwrap();
            assert_eq!(first, Verdict::Suspect { seq, why });
            assert_eq!(judge(Some(first), &s), Verdict::Stalled { seq, why });
        }
    }

    #[test]
    fn a_suspect_that_moved_on_is_suspected_anew_or_cleared() {
        let first = judge(None, &sight(Some(11), 0, 0, 10, 10));
        // The message was delivered meanwhile (stored just as the first check read).
        assert_eq!(
            judge(Some(first), &sight(Some(11), 0, 1, 11, 10)),
            Verdict::Healthy
        );
        // Another message is unaccounted for now: a new suspicion, not a stall.
        assert!(matches!(
            judge(Some(first), &sight(Some(12), 0, 0, 11, 11)),
            Verdict::Suspect { seq: 12, .. }
        ));
        // After a stall (and its reset), the next check starts over.
        let stalled = Verdict::Stalled {
            seq: 11,
            why: Unaccounted::UndeliveredNotPending,
        };
        assert!(matches!(
            judge(Some(stalled), &sight(Some(11), 0, 0, 10, 10)),
            Verdict::Suspect { .. }
        ));
    }

    fn any_sight() -> impl Strategy<Value = Sight> {
        (
            proptest::option::of(1u64..40),
            0u64..3,
            0u64..3,
            0u64..40,
            0u64..40,
        )
            .prop_map(|(oldest, pending, ack_pending, delivered, floor)| {
                sight(oldest, pending, ack_pending, delivered.max(floor), floor)
            })
    }

    fn any_verdict() -> impl Strategy<Value = Option<Verdict>> {
        let why = prop_oneof![
            Just(Unaccounted::BelowAckFloor),
            Just(Unaccounted::DeliveredNotPending),
            Just(Unaccounted::UndeliveredNotPending),
        ];
        proptest::option::of(prop_oneof![
            Just(Verdict::Healthy),
            (1u64..40, why.clone()).prop_map(|(seq, why)| Verdict::Suspect { seq, why }),
            (1u64..40, why).prop_map(|(seq, why)| Verdict::Stalled { seq, why }),
        ])
    }

    proptest! {
        /// A stall always names the oldest held message, which the consumer does not count,
        /// and is only called after the same suspicion one check before.
        #[test]
        fn a_stall_needs_the_same_suspicion_twice(before in any_verdict(), s in any_sight()) {
            match judge(before, &s) {
                Verdict::Healthy => prop_assert!(unaccounted(&s).is_none()),
                Verdict::Suspect { seq, why } => {
                    prop_assert_eq!(unaccounted(&s), Some((seq, why)));
                    let was_same_suspect = matches!(before, Some(Verdict::Suspect { seq: was, .. }) if was == seq);
                    prop_assert!(!was_same_suspect);
                }
                Verdict::Stalled { seq, why } => {
                    prop_assert_eq!(unaccounted(&s), Some((seq, why)));
                    let was_same_suspect = matches!(before, Some(Verdict::Suspect { seq: was, .. }) if was == seq);
                    prop_assert!(was_same_suspect);
                }
            }
        }

        /// Nothing held, or nothing the consumer could be missing, is never a stall.
        #[test]
        fn a_counted_message_is_never_a_stall(before in any_verdict(), s in any_sight()) {
            let counted = match s.oldest_held {
                None => true,
                Some(seq) => seq > s.ack_floor_stream_seq
                    && ((seq <= s.delivered_stream_seq && s.ack_pending > 0)
                        || (seq > s.delivered_stream_seq && s.pending > 0)),
            };
            if counted {
                prop_assert_eq!(judge(before, &s), Verdict::Healthy);
            }
        }
    }
}
