//! [`Nudge`]: the router's way to ask its system's history actor for a trim round at a given
//! time rather than at the end of the interval.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Asks the history actor of the same system for a round at a time (the router's, when it
/// refused a DM for an inbox's read history, which can be trimmed once it is older than the
/// duplicate window). The earliest time asked for wins; asks are folded into one round.
#[derive(Clone, Default)]
pub struct Nudge(Arc<Asked>);

#[derive(Default)]
struct Asked {
    /// The earliest round asked for and not started yet.
    at: Mutex<Option<Instant>>,
    changed: Notify,
}

/// What ended a wait.
pub(super) enum Waited {
    /// The interval is up, or a round was asked for now.
    Due,
    /// The actor stops.
    Stopped,
}

impl Nudge {
    /// A round in `after` (or sooner, if one was asked for sooner).
    pub fn trim_in(&self, after: Duration) {
        let at = Instant::now() + after;
        let mut asked = self.0.at.lock().unwrap_or_else(PoisonError::into_inner);
        if asked.is_none_or(|earlier| at < earlier) {
            *asked = Some(at);
            self.0.changed.notify_one();
        }
    }

    /// Waits until `interval` is up or a round asked for is due (taking the ask), or until
    /// `stop`.
    pub(super) async fn wait(
        &self,
        interval: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Waited {
        let deadline = Instant::now() + interval;
        loop {
            if *stop.borrow() {
                return Waited::Stopped;
            }
            let asked = *self.0.at.lock().unwrap_or_else(PoisonError::into_inner);
            let wake = asked.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                _ = stop.changed() => return Waited::Stopped,
                () = tokio::time::sleep_until(wake) => {
                    let mut asked = self.0.at.lock().unwrap_or_else(PoisonError::into_inner);
                    if asked.is_some_and(|at| at <= Instant::now()) {
                        *asked = None;
                    }
                    return Waited::Due;
                }
                () = self.0.changed.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn waited(nudge: &Nudge, interval: Duration) -> (Duration, bool) {
        let (_stop, mut stop_rx) = watch::channel(false);
        let start = Instant::now();
        let due = matches!(nudge.wait(interval, &mut stop_rx).await, Waited::Due);
        (start.elapsed(), due)
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_ask_a_round_is_due_at_the_interval() {
        let (after, due) = waited(&Nudge::default(), Duration::from_secs(60)).await;
        assert!(due);
        assert_eq!(after.as_secs(), 60);
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_ask_makes_the_round_due_and_is_taken() {
        let nudge = Nudge::default();
        nudge.trim_in(Duration::from_secs(5));
        nudge.trim_in(Duration::from_secs(2));
        nudge.trim_in(Duration::from_secs(9));
        let (after, due) = waited(&nudge, Duration::from_secs(60)).await;
        assert!(due);
        assert_eq!(after.as_secs(), 2);
        // Taken: the next round is the interval's.
        let (after, _) = waited(&nudge, Duration::from_secs(60)).await;
        assert_eq!(after.as_secs(), 60);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ask_made_while_waiting_wakes_the_wait_at_its_time() {
        let nudge = Nudge::default();
        let asker = nudge.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            asker.trim_in(Duration::from_secs(3));
        });
        let (after, due) = waited(&nudge, Duration::from_secs(60)).await;
        assert!(due);
        assert_eq!(after.as_secs(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait() {
        let nudge = Nudge::default();
        let (stop, mut stop_rx) = watch::channel(false);
        stop.send(true).unwrap();
        assert!(matches!(
            nudge.wait(Duration::from_secs(60), &mut stop_rx).await,
            Waited::Stopped
        ));
    }
}
