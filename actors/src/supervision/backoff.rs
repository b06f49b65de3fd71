//! Exponential backoff between the restarts of one child.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ractor::concurrency::Instant;

/// Exponential backoff between the restarts of one child.
///
/// The `n`-th consecutive restart (1-based) waits `initial * factor^(n-1)`, capped at `max`
/// (see [`Backoff::delay`]). When the child has not failed for `reset_after`, the count of
/// consecutive restarts starts over, so a child that crashes once a day is restarted after
/// `initial` and not after `max`.
///
/// The default is 100 ms doubling up to 10 s, reset after 60 s without a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first restart.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Growth factor between two consecutive delays; 0 is treated as 1 (constant delay).
    pub factor: u32,
    /// Quiet period after which the consecutive-restart count starts over; `None` never resets it.
    pub reset_after: Option<Duration>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            factor: 2,
            reset_after: Some(Duration::from_secs(60)),
        }
    }
}

impl Backoff {
    /// An exponential backoff from `initial` up to `max`, multiplied by `factor` at each restart,
    /// with the default `reset_after`.
    #[must_use]
    pub fn new(initial: Duration, max: Duration, factor: u32) -> Self {
        Self {
            initial,
            max,
            factor,
            ..Self::default()
        }
    }

    /// A constant delay between restarts.
    #[must_use]
    pub fn constant(delay: Duration) -> Self {
        Self::new(delay, delay, 1)
    }

    /// No delay at all between restarts (the restart intensity limit still applies).
    #[must_use]
    pub fn none() -> Self {
        Self::constant(Duration::ZERO)
    }

    /// Sets the quiet period after which the consecutive-restart count starts over.
    #[must_use]
    pub fn with_reset_after(mut self, reset_after: Option<Duration>) -> Self {
        self.reset_after = reset_after;
        self
    }

    /// Delay before the `restart_count`-th consecutive restart (1-based; 0 is treated as 1):
    /// `initial * factor^(restart_count - 1)`, capped at `max`. Never overflows.
    #[must_use]
    pub fn delay(&self, restart_count: u32) -> Duration {
        let exponent = restart_count.saturating_sub(1);
        let factor = self.factor.max(1);
        let uncapped = factor
            .checked_pow(exponent)
            .and_then(|multiplier| self.initial.checked_mul(multiplier));
        match uncapped {
            Some(delay) => delay.min(self.max),
            None => self.max,
        }
    }

    /// A fresh tracker of consecutive restarts following this backoff.
    pub(crate) fn tracker(self) -> BackoffTracker {
        BackoffTracker {
            backoff: self,
            state: Arc::new(Mutex::new(TrackerState::default())),
        }
    }
}

#[derive(Debug, Default)]
struct TrackerState {
    consecutive: u32,
    last_failure: Option<Instant>,
}

/// Counts the consecutive restarts of one child, resetting after `reset_after` of quiet.
///
/// One tracker lives as long as one incarnation of the supervisor that owns the child.
#[derive(Debug, Clone)]
pub(crate) struct BackoffTracker {
    backoff: Backoff,
    state: Arc<Mutex<TrackerState>>,
}

impl BackoffTracker {
    /// Records a failure now and returns the delay before the restart it causes.
    pub(crate) fn next_delay(&self) -> Duration {
        self.next_delay_at(Instant::now())
    }

    fn next_delay_at(&self, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let quiet_long_enough = match (state.last_failure, self.backoff.reset_after) {
            (Some(last), Some(reset_after)) => now.saturating_duration_since(last) >= reset_after,
            _ => false,
        };
        if quiet_long_enough {
            state.consecutive = 0;
        }
        state.consecutive = state.consecutive.saturating_add(1);
        state.last_failure = Some(now);
        self.backoff.delay(state.consecutive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn default_is_100ms_doubling_to_10s() {
        let b = Backoff::default();
        let delays: Vec<_> = (1..=9).map(|n| b.delay(n)).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000].map(ms)
        );
    }

    #[test]
    fn zero_is_treated_as_first_restart() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), b.delay(1));
    }

    #[test]
    fn huge_counts_and_factors_saturate_at_max() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), u32::MAX);
        assert_eq!(b.delay(2), Duration::from_secs(30));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
        let b = Backoff::new(Duration::MAX, Duration::MAX, 2);
        assert_eq!(b.delay(3), Duration::MAX);
    }

    #[test]
    fn factor_zero_or_one_is_constant_and_initial_above_max_is_capped() {
        assert_eq!(Backoff::new(ms(5), ms(100), 0).delay(7), ms(5));
        assert_eq!(Backoff::constant(ms(7)).delay(30), ms(7));
        assert_eq!(Backoff::new(ms(50), ms(20), 2).delay(1), ms(20));
        assert_eq!(Backoff::none().delay(4), Duration::ZERO);
    }

    /// Property over a grid of parameters: the schedule starts at `min(initial, max)`, never
    /// decreases, never exceeds `max`, and grows by exactly `factor` until it reaches `max`.
    #[test]
    fn schedule_is_monotone_capped_and_exponential() {
        for initial_ms in [0_u64, 1, 3, 10, 100, 999] {
            for max_ms in [0_u64, 1, 50, 1000, 60_000] {
                for factor in [0_u32, 1, 2, 3, 10] {
                    let b = Backoff::new(ms(initial_ms), ms(max_ms), factor);
                    assert_eq!(b.delay(1), ms(initial_ms).min(ms(max_ms)));
                    let mut previous = b.delay(1);
                    for n in 2..64 {
                        let d = b.delay(n);
                        assert!(d <= b.max, "{b:?} delay({n}) = {d:?} exceeds max");
                        assert!(d >= previous, "{b:?} delay({n}) = {d:?} decreased");
                        if d < b.max {
                            assert_eq!(d, previous * factor.max(1), "{b:?} delay({n})");
                        }
                        previous = d;
                    }
                }
            }
        }
    }

    #[test]
    fn tracker_grows_then_resets_after_quiet_period() {
        let b = Backoff::new(ms(100), ms(10_000), 2).with_reset_after(Some(ms(1000)));
        let tracker = b.tracker();
        let t0 = Instant::now();
        assert_eq!(tracker.next_delay_at(t0), ms(100));
        assert_eq!(tracker.next_delay_at(t0 + ms(200)), ms(200));
        assert_eq!(tracker.next_delay_at(t0 + ms(999)), ms(400));
        // 1 s without a failure: back to the initial delay.
        assert_eq!(tracker.next_delay_at(t0 + ms(1999)), ms(100));
        assert_eq!(tracker.next_delay_at(t0 + ms(2000)), ms(200));
    }

    #[test]
    fn tracker_without_reset_keeps_growing() {
        let tracker = Backoff::new(ms(1), ms(10_000), 2)
            .with_reset_after(None)
            .tracker();
        let t0 = Instant::now();
        assert_eq!(tracker.next_delay_at(t0), ms(1));
        assert_eq!(tracker.next_delay_at(t0 + ms(3_600_000)), ms(2));
    }
}
