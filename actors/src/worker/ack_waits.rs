//! The ack waits a worker's heartbeats follow: one per consumer it pulls from, taken from the
//! consumer's info at every bind, and read again when a router says it changed the queue's
//! shared consumer ([`protocol::subjects::queue_changed`]). Every input carries the [`AckWait`]
//! of its consumer, and its attempt's heartbeat follows it: a shorter ack wait is beaten at
//! once and then at its own pace, so a router that shortens the ack wait of a queue with
//! tasks running does not have them redelivered to another worker.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use tokio::sync::watch;

use super::fetch::Consumers;

/// The current ack wait of the consumer an input came from.
pub type AckWait = watch::Receiver<Duration>;

/// The fewest a heartbeat waits between two beats.
const MIN_PERIOD: Duration = Duration::from_millis(50);

/// The heartbeat period of an input whose consumer's ack wait is `ack_wait`: a third of it.
pub fn heartbeat_period(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(MIN_PERIOD)
}

/// The ack waits of the three consumers a worker pulls from.
pub(super) struct AckWaits {
    answers: watch::Sender<Duration>,
    targeted: watch::Sender<Duration>,
    queue: watch::Sender<Duration>,
}

impl AckWaits {
    /// The ack waits of `consumers`, as bound.
    pub fn of(consumers: &Consumers) -> AckWaits {
        AckWaits {
            answers: watch::Sender::new(of(&consumers.answers)),
            targeted: watch::Sender::new(of(&consumers.targeted)),
            queue: watch::Sender::new(of(&consumers.queue)),
        }
    }

    /// Takes the ack waits of `consumers` as bound again (a re-join).
    pub fn rebind(&self, consumers: &Consumers) {
        set(&self.answers, of(&consumers.answers));
        set(&self.targeted, of(&consumers.targeted));
        set(&self.queue, of(&consumers.queue));
    }

    /// The queue consumer's ack wait is now `ack_wait` (its info read again).
    pub fn set_queue(&self, ack_wait: Duration) {
        set(&self.queue, ack_wait);
    }

    pub fn answers(&self) -> AckWait {
        self.answers.subscribe()
    }

    pub fn targeted(&self) -> AckWait {
        self.targeted.subscribe()
    }

    pub fn queue(&self) -> AckWait {
        self.queue.subscribe()
    }
}

/// The effective ack wait of `consumer` as last read.
pub(super) fn of(consumer: &PullConsumer) -> Duration {
    crate::consumers::effective_ack_wait(&consumer.cached_info().config)
}

fn set(sender: &watch::Sender<Duration>, value: Duration) {
    sender.send_if_modified(|current| {
        let changed = *current != value;
        *current = value;
        changed
    });
}

/// Beats `beat` every third of `ack_wait`, following its changes (a shorter one is beaten at
/// once), until the future is dropped. When the worker's ack waits are gone, it keeps the last
/// pace.
pub async fn heartbeat<F, Fut>(mut ack_wait: AckWait, mut beat: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut period = heartbeat_period(*ack_wait.borrow_and_update());
    let mut next = tokio::time::Instant::now() + period;
    let mut following = true;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            changed = ack_wait.changed(), if following => {
                if changed.is_err() {
                    following = false;
                    continue;
                }
                let now = heartbeat_period(*ack_wait.borrow_and_update());
                let shorter = now < period;
                period = now;
                if !shorter {
                    continue;
                }
            }
        }
        beat().await;
        next = tokio::time::Instant::now() + period;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_beats_at_once_when_its_ack_wait_shortens_then_at_the_new_pace() {
        let (tx, rx) = watch::channel(Duration::from_secs(30));
        let beats = Arc::new(AtomicU32::new(0));
        let counted = beats.clone();
        let task = tokio::spawn(heartbeat(rx, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        }));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(
            beats.load(Ordering::SeqCst),
            0,
            "a third of 30 s not reached"
        );
        tx.send(Duration::from_secs(3)).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(beats.load(Ordering::SeqCst), 1, "beaten at once");
        tokio::time::sleep(Duration::from_millis(3_050)).await;
        assert_eq!(beats.load(Ordering::SeqCst), 4, "then every second");
        // A longer one waits out the current beat, then keeps its own pace.
        tx.send(Duration::from_secs(30)).unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(beats.load(Ordering::SeqCst), 5);
        drop(tx);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(beats.load(Ordering::SeqCst), 6, "the last pace kept");
        task.abort();
    }
}
