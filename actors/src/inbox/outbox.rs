//! The outbox of read receipts ([`protocol::receipt`]) that could not be sent at once: the
//! broker was unreachable, or its store ack did not come in time.
//!
//! The pump sends a receipt itself while the outbox is empty; otherwise (or when that send
//! fails) it queues the receipt here, behind the others, so that receipts go out in the
//! order their DMs were handled (per sender too). A task owned by the inbox's incarnation
//! ([`ReceiptOutbox`]) sends the oldest one again and again, with backoff, until the
//! ingress stored it, then the next, and ends once the outbox is empty (an inbox with no
//! receipt waiting has no such task; the next receipt queued starts one). Every try publishes the same bytes under the same
//! `Nats-Msg-Id` (`<me>:<receipt id>~<seal>`, [`crate::ingress_seal`]), so a try whose first attempt did land after all is
//! deduplicated by the ingress stream (within its duplicate window). While the client is not
//! connected nothing is published (a publish would only wait in the client's buffer); the
//! task looks again every [`CONNECTION_POLL`].
//!
//! The outbox holds at most [`CAPACITY`] receipts: one more drops the oldest, counted
//! (`receipts_dropped`). It lives in memory, with its inbox incarnation: a clean stop tries
//! once to flush it within [`FLUSH_DEADLINE`]; a crash (or a restart of the inbox) loses
//! what it held.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use bytes::Bytes;
use protocol::error_chain::ErrorChain;
use protocol::{subjects, AgentId, Envelope};

use super::pump::{InboxCounters, Trail};
use crate::audit::Auditor;
use crate::background::Owned;
use crate::supervision::Backoff;

/// Receipts held at most; one more drops the oldest (`receipts_dropped`).
pub const CAPACITY: usize = 10_000;
/// How long a clean stop may spend flushing the outbox (once, in order).
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(2);
/// How often the retry task looks whether the client is connected again.
pub const CONNECTION_POLL: Duration = Duration::from_millis(250);

/// The waits between the failed tries of the oldest receipt: 200 ms doubling to 5 s.
pub fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(200), Duration::from_secs(5), 2).with_reset_after(None)
}

/// Why a receipt was not stored.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The receipt could not be encoded.
    #[error("cannot encode the read receipt")]
    Encode(#[from] protocol::EnvelopeError),
    /// The client is not connected to the broker: nothing was published.
    #[error("not connected to the broker")]
    Disconnected,
    /// The publish failed, the ingress refused it, or no store ack came in time (then it may
    /// still have been stored).
    #[error("the ingress did not store the read receipt")]
    Acked(#[from] crate::streams::AckedError),
}

/// A receipt ready to be published (again): its encoded envelope and dedupe id.
#[derive(Debug, Clone)]
pub struct PendingReceipt {
    /// The receipt's `meta.id` (`read:<sender>:<DM id>`).
    pub id: String,
    /// Its `Nats-Msg-Id` at the ingress: `<me>:<receipt id>~<seal>`.
    pub msg_id: String,
    /// The encoded envelope (JSON).
    pub payload: Bytes,
    /// The audit trail of the DM it is for (its `read` event names it).
    pub trail: Option<Trail>,
}

impl PendingReceipt {
    /// `receipt`, sent by `me`, for the DM whose audit trail is `trail`.
    ///
    /// # Errors
    /// [`ReceiptError::Encode`] when it does not encode.
    pub fn new(
        me: &AgentId,
        receipt: &Envelope,
        trail: Option<Trail>,
    ) -> Result<PendingReceipt, ReceiptError> {
        let payload = protocol::encode(receipt, protocol::Codec::Json)?;
        Ok(PendingReceipt {
            id: receipt.meta.id.to_string(),
            msg_id: crate::ingress_seal::ingress_msg_id(&format!("{me}:{}", receipt.meta.id)),
            payload: payload.into(),
            trail,
        })
    }
}

/// Publishes receipts through one identity's ingress (`hub.pub.<me>.inbox`).
#[derive(Clone)]
pub struct ReceiptSender {
    client: async_nats::Client,
    js: jetstream::Context,
    subject: String,
}

impl ReceiptSender {
    /// The sender of `me`'s receipts on `client`, through `js`.
    pub fn new(client: async_nats::Client, js: jetstream::Context, me: &AgentId) -> ReceiptSender {
        ReceiptSender {
            js,
            client,
            subject: subjects::ingress(me, &protocol::Channel::Inbox),
        }
    }

    /// Publishes `receipt` and waits for the ingress to store it, at most
    /// [`PUBLISH_ACK_TIMEOUT`](crate::PUBLISH_ACK_TIMEOUT) in all. A duplicate (an earlier try
    /// landed) counts as stored.
    ///
    /// # Errors
    /// [`ReceiptError::Disconnected`] at once (nothing published) when the client is not
    /// connected; else why it was not stored.
    pub async fn send(&self, receipt: &PendingReceipt) -> Result<(), ReceiptError> {
        if self.client.connection_state() != State::Connected {
            return Err(ReceiptError::Disconnected);
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(protocol::headers::NATS_MSG_ID, receipt.msg_id.as_str());
        crate::streams::publish_acked(
            &self.js,
            self.subject.clone(),
            headers,
            receipt.payload.clone(),
            crate::PUBLISH_ACK_TIMEOUT,
        )
        .await?;
        Ok(())
    }
}

/// The receipts waiting, oldest first, each with its place in line.
struct Queue {
    entries: VecDeque<(u64, Arc<PendingReceipt>)>,
    next: u64,
    capacity: usize,
}

impl Queue {
    /// Appends `receipt`; returns the oldest one when it had to make room.
    fn push(&mut self, receipt: PendingReceipt) -> Option<Arc<PendingReceipt>> {
        let dropped = if self.entries.len() >= self.capacity.max(1) {
            self.entries.pop_front().map(|(_, r)| r)
        } else {
            None
        };
        self.entries.push_back((self.next, Arc::new(receipt)));
        self.next += 1;
        dropped
    }
}

/// The outbox of one inbox incarnation, shared by its pump (which queues) and its retry task
/// (which sends). See the module docs.
pub struct Outbox {
    queue: Mutex<Queue>,
    /// A retry task runs (or is about to end, and looks once more).
    retrying: AtomicBool,
    counters: Arc<InboxCounters>,
}

impl Outbox {
    /// An empty outbox of at most `capacity` receipts, counting into `counters`.
    pub fn new(capacity: usize, counters: Arc<InboxCounters>) -> Arc<Outbox> {
        Arc::new(Outbox {
            queue: Mutex::new(Queue {
                entries: VecDeque::new(),
                next: 0,
                capacity,
            }),
            retrying: AtomicBool::new(false),
            counters,
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue().entries.is_empty()
    }

    /// Queues a receipt that could not be sent at once (`receipts_failed`), behind the others;
    /// past the capacity the oldest is dropped (`receipts_dropped`). Who queues then makes sure
    /// a retry task runs ([`Outbox::claim_retry`]).
    pub fn push(&self, receipt: PendingReceipt) {
        self.counters.receipts_failed.bump();
        let dropped = {
            let mut queue = self.queue();
            let dropped = queue.push(receipt);
            if dropped.is_none() {
                self.counters.receipts_pending.bump();
            }
            dropped
        };
        if let Some(old) = dropped {
            self.counters.receipts_dropped.bump();
            let total = self.counters.receipts_dropped.get();
            if total == 1 || total.is_multiple_of(1000) {
                tracing::warn!(id = %old.id, dropped = total, capacity = CAPACITY, "read receipt outbox full: its oldest receipt is dropped");
            }
        }
    }

    /// Whether the caller is to start a retry task: none runs. Once per task: the task gives
    /// it back when it ends ([`retry`]).
    pub fn claim_retry(&self) -> bool {
        !self.retrying.swap(true, Ordering::AcqRel)
    }

    /// The oldest receipt and its place in line.
    fn head(&self) -> Option<(u64, Arc<PendingReceipt>)> {
        self.queue().entries.front().cloned()
    }

    /// Removes the receipt at `place` once stored, unless it was dropped meanwhile.
    fn settle(&self, place: u64) {
        let mut queue = self.queue();
        if queue.entries.front().is_some_and(|(p, _)| *p == place) {
            queue.entries.pop_front();
            self.counters.receipts_pending.sub();
        }
    }

    /// The receipt ids waiting, oldest first (tests).
    #[cfg(test)]
    fn ids(&self) -> Vec<String> {
        self.queue()
            .entries
            .iter()
            .map(|(_, r)| r.id.clone())
            .collect()
    }
}

/// Sends the oldest receipt of `outbox` with `send` until it is stored, then the next, until
/// the outbox is empty (then it gives back its claim, [`Outbox::claim_retry`], and ends; the
/// task is aborted with its owner before that). A failed try waits `backoff.delay(n)` after the
/// `n`-th failure in a row; a client not connected ([`ReceiptError::Disconnected`]) is looked
/// at again every [`CONNECTION_POLL`], publishing nothing and counting no try. Each stored
/// receipt is counted (`receipts`) and given to `stored`.
pub async fn retry<S, F>(
    outbox: Arc<Outbox>,
    backoff: Backoff,
    send: S,
    stored: impl Fn(&PendingReceipt),
) where
    S: Fn(Arc<PendingReceipt>) -> F,
    F: Future<Output = Result<(), ReceiptError>>,
{
    let mut failures: u32 = 0;
    loop {
        let Some((place, head)) = outbox.head() else {
            outbox.retrying.store(false, Ordering::Release);
            // A receipt queued since `head`, whose queuer saw this task still running, is
            // taken here: the claim is taken back, unless that queuer claimed it for a task
            // of its own.
            if outbox.is_empty() || !outbox.claim_retry() {
                return;
            }
            continue;
        };
        match send(head.clone()).await {
            Ok(()) => {
                outbox.counters.receipts_retried.bump();
                outbox.settle(place);
                outbox.counters.receipts.bump();
                stored(&head);
                if failures > 0 {
                    tracing::info!(id = %head.id, after = failures, "read receipt stored from the outbox");
                }
                failures = 0;
            }
            Err(ReceiptError::Disconnected) => tokio::time::sleep(CONNECTION_POLL).await,
            Err(e) => {
                outbox.counters.receipts_retried.bump();
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %ErrorChain(&e), id = %head.id, "read receipt not stored; trying again with backoff");
                } else {
                    tracing::debug!(error = %ErrorChain(&e), id = %head.id, failures, "read receipt not stored");
                }
                tokio::time::sleep(backoff.delay(failures)).await;
            }
        }
    }
}

/// Tries each waiting receipt once, oldest first, within `within`; stops at the first that is
/// not stored (the rest would fail alike). Returns how many are left.
async fn flush<S, F>(
    outbox: &Outbox,
    within: Duration,
    send: S,
    stored: impl Fn(&PendingReceipt),
) -> usize
where
    S: Fn(Arc<PendingReceipt>) -> F,
    F: Future<Output = Result<(), ReceiptError>>,
{
    let all = async {
        while let Some((place, head)) = outbox.head() {
            let sent = send(head.clone()).await;
            if !matches!(sent, Err(ReceiptError::Disconnected)) {
                outbox.counters.receipts_retried.bump();
            }
            if let Err(e) = sent {
                tracing::warn!(error = %ErrorChain(&e), id = %head.id, "read receipt outbox not flushed");
                return;
            }
            outbox.settle(place);
            outbox.counters.receipts.bump();
            stored(&head);
        }
    };
    let _ = tokio::time::timeout(within, all).await;
    outbox.queue().entries.len()
}

/// An inbox incarnation's outbox, its sender, and the retry task while receipts wait: the
/// task ends with it.
pub struct ReceiptOutbox {
    outbox: Arc<Outbox>,
    sender: ReceiptSender,
    audit: Auditor,
    retry: Mutex<Option<Owned>>,
}

impl ReceiptOutbox {
    /// `outbox`, whose receipts are sent through `sender`; each stored receipt's `read` event
    /// goes to `audit`. No task runs until a receipt is queued.
    pub fn new(outbox: Arc<Outbox>, sender: ReceiptSender, audit: Auditor) -> ReceiptOutbox {
        ReceiptOutbox {
            outbox,
            sender,
            audit,
            retry: Mutex::new(None),
        }
    }

    /// The receipts waiting.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Publishes receipts through this identity's ingress.
    pub fn sender(&self) -> &ReceiptSender {
        &self.sender
    }

    /// Queues `receipt` behind the others ([`Outbox::push`]) and starts the retry task unless
    /// one runs.
    pub fn queue(&self, receipt: PendingReceipt) {
        self.outbox.push(receipt);
        if !self.outbox.claim_retry() {
            return;
        }
        let (sender, audit) = (self.sender.clone(), self.audit.clone());
        let task = retry(
            self.outbox.clone(),
            retry_backoff(),
            move |r| {
                let sender = sender.clone();
                async move { sender.send(&r).await }
            },
            move |r| super::pump::emit(&audit, r.trail.as_ref(), "read", Default::default()),
        );
        // A task that ended (its claim given back) is replaced.
        *self.retry.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(crate::background::spawn(task));
    }

    /// A clean stop: ends the retry task, then tries once to flush the outbox within
    /// [`FLUSH_DEADLINE`]; what is left is lost (logged).
    pub async fn close(&self) {
        let task = self
            .retry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            crate::background::abort(task).await;
        }
        if self.outbox.is_empty() {
            return;
        }
        let (sender, audit) = (&self.sender, &self.audit);
        let left = flush(
            &self.outbox,
            FLUSH_DEADLINE,
            |r| async move { sender.send(&r).await },
            |r| super::pump::emit(audit, r.trail.as_ref(), "read", Default::default()),
        )
        .await;
        if left > 0 {
            tracing::warn!(
                left,
                "inbox stopped with read receipts in its outbox: they are lost"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    fn receipt(n: usize) -> PendingReceipt {
        PendingReceipt {
            id: format!("read:alice:m{n}"),
            msg_id: format!("bob:read:alice:m{n}"),
            payload: Bytes::from(format!("{n}")),
            trail: None,
        }
    }

    fn outbox(capacity: usize) -> (Arc<Outbox>, Arc<InboxCounters>) {
        let counters = Arc::new(InboxCounters::default());
        (Outbox::new(capacity, counters.clone()), counters)
    }

    #[test]
    fn the_outbox_keeps_its_order_and_drops_the_oldest_past_its_bound() {
        let (outbox, counters) = outbox(3);
        assert!(outbox.is_empty());
        for n in 0..5 {
            outbox.push(receipt(n));
        }
        assert_eq!(
            outbox.ids(),
            ["read:alice:m2", "read:alice:m3", "read:alice:m4"]
        );
        let c = counters.snapshot();
        assert_eq!(
            (c.receipts_failed, c.receipts_pending, c.receipts_dropped),
            (5, 3, 2)
        );
        // Settling the head removes it; a place that is no longer the head (it was dropped
        // while its try was in flight) removes nothing.
        let (place, head) = outbox.head().unwrap();
        assert_eq!(head.id, "read:alice:m2");
        outbox.settle(place);
        outbox.settle(place);
        assert_eq!(outbox.ids(), ["read:alice:m3", "read:alice:m4"]);
        assert_eq!(counters.snapshot().receipts_pending, 2);
        let (stale, _) = outbox.head().unwrap();
        outbox.push(receipt(5));
        outbox.push(receipt(6)); // drops m3, the head of `stale`
        outbox.settle(stale);
        assert_eq!(
            outbox.ids(),
            ["read:alice:m4", "read:alice:m5", "read:alice:m6"]
        );
        assert_eq!(counters.snapshot().receipts_pending, 3);
        assert!(!outbox.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_retry_task_backs_off_on_the_oldest_then_sends_the_rest_in_order() {
        let (outbox, counters) = outbox(CAPACITY);
        for n in 0..3 {
            outbox.push(receipt(n));
        }
        // The broker is away for the first 2 tries (the client not even connected), then the
        // ingress fails 3 tries; then it stores everything.
        let tries: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let stored: Arc<Mutex<Vec<String>>> = Arc::default();
        let task = {
            let (tries, calls, stored) = (tries.clone(), calls.clone(), stored.clone());
            crate::background::spawn(retry(
                outbox.clone(),
                retry_backoff(),
                move |r| {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    let tries = tries.clone();
                    async move {
                        if n < 2 {
                            return Err(ReceiptError::Disconnected);
                        }
                        tries
                            .lock()
                            .unwrap()
                            .push((start.elapsed(), r.msg_id.clone()));
                        if n < 5 {
                            Err(crate::streams::AckedError::TimedOut(Duration::ZERO).into())
                        } else {
                            Ok(())
                        }
                    }
                },
                move |r| stored.lock().unwrap().push(r.id.clone()),
            ))
        };
        harness_wait(|| counters.snapshot().receipts == 3).await;
        let ms = |m: u64| Duration::from_millis(m);
        let tries = tries.lock().unwrap().clone();
        assert_eq!(
            tries,
            [
                // Two polls of the connection, then the first try; 200, 400, 800 ms backoff.
                (ms(500), "bob:read:alice:m0".to_owned()),
                (ms(700), "bob:read:alice:m0".to_owned()),
                (ms(1100), "bob:read:alice:m0".to_owned()),
                (ms(1900), "bob:read:alice:m0".to_owned()),
                (ms(1900), "bob:read:alice:m1".to_owned()),
                (ms(1900), "bob:read:alice:m2".to_owned()),
            ]
        );
        assert_eq!(
            *stored.lock().unwrap(),
            ["read:alice:m0", "read:alice:m1", "read:alice:m2"]
        );
        let c = counters.snapshot();
        assert_eq!(
            (c.receipts, c.receipts_retried, c.receipts_pending),
            (3, 6, 0)
        );
        // Empty, it gave its claim back and ended; the next receipt queued claims a new one.
        harness_wait(|| task.is_finished()).await;
        outbox.push(receipt(3));
        assert!(outbox.claim_retry());
        assert!(!outbox.claim_retry(), "one task at a time");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_tries_once_in_order_and_stops_at_the_first_failure() {
        let (outbox, counters) = outbox(CAPACITY);
        for n in 0..4 {
            outbox.push(receipt(n));
        }
        let sent: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = sent.clone();
        let left = flush(
            &outbox,
            FLUSH_DEADLINE,
            move |r| {
                let sink = sink.clone();
                async move {
                    sink.lock().unwrap().push(r.id.clone());
                    if r.id.ends_with("m2") {
                        Err(crate::streams::AckedError::TimedOut(Duration::ZERO).into())
                    } else {
                        Ok(())
                    }
                }
            },
            |_| {},
        )
        .await;
        assert_eq!(left, 2);
        assert_eq!(
            *sent.lock().unwrap(),
            ["read:alice:m0", "read:alice:m1", "read:alice:m2"]
        );
        assert_eq!(outbox.ids(), ["read:alice:m2", "read:alice:m3"]);
        // A flush that outlasts its deadline is cut short.
        let left = flush(
            &outbox,
            FLUSH_DEADLINE,
            |_| std::future::pending::<Result<(), ReceiptError>>(),
            |_| {},
        )
        .await;
        assert_eq!(left, 2);
        assert_eq!(counters.snapshot().receipts, 2);
    }

    /// Waits (in paused time) until `cond` holds.
    async fn harness_wait(cond: impl Fn() -> bool) {
        let wait = async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("the condition within a minute");
    }
}
