//! When a tracker reads its task's stored channel again (`actors::tracker`). The live
//! subscription sees what is published while it is connected; a re-read finds what it missed:
//! a result published while the connection was being replaced, or one dropped from a full
//! subscription. So the re-reads that matter follow a reconnect, and a task that waits long
//! needs few others: each re-read that finds nothing doubles the wait before the next, from the
//! base interval up to a cap, and anything found, or a new connection, starts again from the
//! base (a new connection: at the tracker's next look, within the base interval). 10,000 tracked tasks that wait read 10,000 / cap times a
//! second, not 10,000 / base (docs/CAPACITY.md).

use std::time::Duration;

/// How often a tracker reads its stored channel again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RereadSchedule {
    /// The wait after a read that found something (and the first one).
    pub base: Duration,
    /// The longest wait between two reads.
    pub cap: Duration,
}

impl RereadSchedule {
    /// Every `every`, found something or not.
    pub fn fixed(every: Duration) -> RereadSchedule {
        RereadSchedule {
            base: every,
            cap: every,
        }
    }

    /// The wait before the next read after `quiet` reads in a row found nothing: `base` doubled
    /// `quiet` times, at most `cap` (and never below `base`).
    pub fn wait_after(&self, quiet: u32) -> Duration {
        let doubled = self
            .base
            .checked_mul(1u32.checked_shl(quiet.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX);
        doubled.min(self.cap).max(self.base)
    }

    /// Whether a read is due now: the connection was replaced since the last read (whatever
    /// was published meanwhile went past the live subscription), or the wait after `quiet`
    /// quiet reads has passed since it.
    pub fn due(&self, quiet: u32, since_last: Duration, reconnected: bool) -> bool {
        reconnected || since_last >= self.wait_after(quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_wait_doubles_from_the_base_to_the_cap() {
        let schedule = RereadSchedule {
            base: secs(3),
            cap: secs(30),
        };
        let waits: Vec<u64> = (0..6).map(|q| schedule.wait_after(q).as_secs()).collect();
        assert_eq!(waits, [3, 6, 12, 24, 30, 30]);
        assert_eq!(schedule.wait_after(u32::MAX), secs(30));
    }

    #[test]
    fn a_fixed_schedule_never_waits_longer() {
        let schedule = RereadSchedule::fixed(Duration::from_millis(200));
        for quiet in [0, 1, 5, 64, u32::MAX] {
            assert_eq!(schedule.wait_after(quiet), Duration::from_millis(200));
        }
    }

    #[test]
    fn a_reconnect_makes_a_read_due_at_once() {
        let schedule = RereadSchedule {
            base: secs(3),
            cap: secs(30),
        };
        assert!(schedule.due(10, Duration::ZERO, true));
        assert!(!schedule.due(10, secs(29), false));
        assert!(schedule.due(10, secs(30), false));
        assert!(schedule.due(0, secs(3), false));
    }

    proptest! {
        #[test]
        fn the_wait_stays_between_base_and_cap_and_never_shrinks_while_quiet(
            base_ms in 1u64..100_000,
            extra_ms in 0u64..10_000_000,
            quiet in 0u32..200,
        ) {
            let schedule = RereadSchedule {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(base_ms + extra_ms),
            };
            let now = schedule.wait_after(quiet);
            prop_assert!(now >= schedule.base && now <= schedule.cap);
            prop_assert!(schedule.wait_after(quiet + 1) >= now);
            prop_assert_eq!(schedule.wait_after(0), schedule.base);
        }
    }
}
