//! The worker's fetch loops: answers on their own waiting pull (they need no slot to be
//! judged, so a backlog of tasks never delays them), and tasks one per free slot, first from
//! the targeted consumer (no wait), the rest from the queue consumer (a waiting pull that hands
//! over each task as it arrives). Never more than the free slots: no prefetch.
//!
//! Every pull is bounded: by its own expiry plus [`PULL_MARGIN`] (a pull whose reply was lost
//! in a disconnect is abandoned, not waited on for good), and by a reconnect (a pull sent on
//! the old connection is re-issued at once on the new one, so work resumes as fast as the
//! connection does). A pull that fails is retried after an exponential backoff; a consumer
//! found gone ends the loop with [`FetchError::ConsumerGone`], and the worker re-joins its
//! queue through the router.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, context::ConsumerInfoErrorKind};
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use ractor::ActorRef;
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::counters::WorkerCounters;
use super::slots::Slots;
use super::WorkerMsg;
use crate::supervision::Backoff;

/// How long a waiting pull on the queue (or answers) consumer stays open when nothing comes.
pub const FETCH_WAIT: Duration = Duration::from_millis(500);
/// How long past its expiry a pull is waited on before it is abandoned (its reply lost). A
/// reconnect abandons a pull at once; this bounds a reply lost otherwise, and leaves room for
/// a slow link (a message delivered to an abandoned pull waits out its ack wait).
pub const PULL_MARGIN: Duration = Duration::from_secs(1);
/// Answers pulled at once.
const ANSWER_BATCH: usize = 16;
/// The pause after the `n`-th failed pull in a row: 100 ms, doubling, at most 5 s.
const BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
    factor: 2,
    reset_after: None,
};
/// How often a pull in flight checks whether the connection was replaced.
const RECONNECT_CHECK: Duration = Duration::from_millis(50);

/// The consumers a worker pulls from.
#[derive(Clone)]
pub(super) struct Consumers {
    pub answers: PullConsumer,
    pub targeted: PullConsumer,
    pub queue: PullConsumer,
}

/// Why a fetch loop ended.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    /// A consumer the worker pulls from does not exist any more.
    #[error("consumer {consumer} is gone")]
    ConsumerGone {
        /// Its name.
        consumer: String,
    },
    /// The worker's slots were closed.
    #[error("the worker's slots are closed")]
    SlotsClosed,
}

/// What the loops share.
#[derive(Clone)]
pub(super) struct Fetcher {
    pub me: ActorRef<WorkerMsg>,
    pub client: async_nats::Client,
    pub counters: Arc<WorkerCounters>,
    pub slots: Arc<Slots>,
    /// Dropped at every failed pull: the consumer may have been created again, and its
    /// delivery counts with it.
    pub baseline: Arc<crate::epoch::Baseline<crate::epoch::WorkMark>>,
    /// The consumers' current ack waits, handed over with each input.
    pub ack_waits: Arc<super::ack_waits::AckWaits>,
}

/// How a pull ended.
enum Pulled {
    /// It expired, delivered what it asked for, or was abandoned: pull again.
    Done,
    /// The worker stops (or is gone).
    Stopped,
}

impl Fetcher {
    /// Both loops, until `stop` turns true or a consumer is gone.
    pub async fn run(
        self,
        consumers: Consumers,
        stop: watch::Receiver<bool>,
    ) -> Result<(), FetchError> {
        let answers = self
            .clone()
            .answer_loop(consumers.answers.clone(), stop.clone());
        let tasks = self.task_loop(consumers, stop);
        tokio::try_join!(answers, tasks).map(|_| ())
    }

    async fn answer_loop(
        self,
        answers: PullConsumer,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), FetchError> {
        let mut failures = 0;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let (me, ack_wait) = (self.me.clone(), self.ack_waits.answers());
            let pulled = self
                .pull(&answers, ANSWER_BATCH, Some(FETCH_WAIT), &mut stop, |msg| {
                    me.cast(WorkerMsg::Answer {
                        msg,
                        ack_wait: ack_wait.clone(),
                    })
                    .is_ok()
                })
                .await;
            match pulled {
                Ok(Pulled::Stopped) => return Ok(()),
                Ok(Pulled::Done) => failures = 0,
                Err(error) => {
                    self.failed(&answers, error, &mut failures, &mut stop)
                        .await?
                }
            }
        }
    }

    async fn task_loop(
        self,
        consumers: Consumers,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), FetchError> {
        // One backoff per consumer: a targeted pull that works does not hide a queue pull that
        // keeps failing.
        let mut failures = [0; 2];
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let first = tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    continue;
                }
                permit = self.slots.for_task() => permit.map_err(|_| FetchError::SlotsClosed)?,
            };
            let mut permits = vec![first];
            while let Some(permit) = self.slots.try_for_task() {
                permits.push(permit);
            }
            for (i, (consumer, wait)) in [
                (&consumers.targeted, None),
                (&consumers.queue, Some(FETCH_WAIT)),
            ]
            .into_iter()
            .enumerate()
            {
                if permits.is_empty() {
                    break;
                }
                let ack_wait = if i == 0 {
                    self.ack_waits.targeted()
                } else {
                    self.ack_waits.queue()
                };
                let pulled = self
                    .pull(consumer, permits.len(), wait, &mut stop, |msg| {
                        self.hand_over(msg, ack_wait.clone(), &mut permits)
                    })
                    .await;
                match pulled {
                    Ok(Pulled::Stopped) => return Ok(()),
                    Ok(Pulled::Done) => failures[i] = 0,
                    Err(error) => {
                        self.failed(consumer, error, &mut failures[i], &mut stop)
                            .await?;
                        break;
                    }
                }
            }
        }
    }

    /// Hands a task over to the worker with one of the free slots; `false` when the worker is
    /// gone.
    fn hand_over(
        &self,
        msg: jetstream::Message,
        ack_wait: super::ack_waits::AckWait,
        permits: &mut Vec<OwnedSemaphorePermit>,
    ) -> bool {
        let Some(permit) = permits.pop() else {
            // Cannot happen (a pull asks for as many messages as free slots); left unacked,
            // it is redelivered after the ack wait.
            tracing::error!(subject = %msg.subject, "a pull delivered more tasks than it asked for");
            return true;
        };
        self.me
            .cast(WorkerMsg::Task {
                msg,
                ack_wait,
                permit,
            })
            .is_ok()
    }

    /// One pull of at most `max` messages (a waiting one for `wait`, else one that ends at
    /// "no messages"), each handed to `take`. Bounded: abandoned past its expiry plus
    /// [`PULL_MARGIN`], or when the connection is replaced. `Err` carries the failure.
    async fn pull(
        &self,
        consumer: &PullConsumer,
        max: usize,
        wait: Option<Duration>,
        stop: &mut watch::Receiver<bool>,
        mut take: impl FnMut(jetstream::Message) -> bool,
    ) -> Result<Pulled, async_nats::Error> {
        let stats = self.client.statistics();
        let connects = stats.connects.load(Ordering::Relaxed);
        let (batch, bound) = match wait {
            Some(wait) => (
                consumer
                    .batch()
                    .max_messages(max)
                    .expires(wait)
                    .messages()
                    .await,
                wait + PULL_MARGIN,
            ),
            None => (
                consumer.fetch().max_messages(max).messages().await,
                PULL_MARGIN * 2,
            ),
        };
        let mut batch = batch?;
        let deadline = tokio::time::Instant::now() + bound;
        let mut check = tokio::time::interval(RECONNECT_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return Ok(Pulled::Stopped);
                    }
                }
                _ = check.tick() => {
                    if stats.connects.load(Ordering::Relaxed) != connects {
                        // Sent on the old connection: its reply will not come.
                        self.counters.pulls_abandoned.bump();
                        return Ok(Pulled::Done);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    // No reply by its expiry (plus the margin): lost, or the server hangs.
                    self.counters.pulls_abandoned.bump();
                    return Ok(Pulled::Done);
                }
                next = batch.next() => match next {
                    Some(Ok(msg)) => {
                        if !take(msg) {
                            return Ok(Pulled::Stopped);
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Ok(Pulled::Done),
                },
            }
        }
    }

    /// After a failed pull: counts it, ends the loop when the consumer is gone, else waits out
    /// the backoff of the `failures`-th failure in a row.
    async fn failed(
        &self,
        consumer: &PullConsumer,
        error: async_nats::Error,
        failures: &mut u32,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), FetchError> {
        self.counters.fetch_errors.bump();
        self.baseline.invalidate();
        let name = consumer.cached_info().name.clone();
        let gone = matches!(
            consumer.get_info().await.map_err(|e| e.kind()),
            Err(ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound)
        );
        if gone {
            tracing::warn!(consumer = %name, error = %ErrorChain(&*error), "consumer gone; re-joining the queue");
            return Err(FetchError::ConsumerGone { consumer: name });
        }
        *failures += 1;
        let pause = BACKOFF.delay(*failures);
        tracing::warn!(consumer = %name, error = %ErrorChain(&*error), ?pause, "pull failed; pulling again after a pause");
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(pause) => {}
        }
        Ok(())
    }
}
