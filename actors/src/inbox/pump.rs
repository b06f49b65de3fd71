//! The inbox pump: pulls DMs (or reads a core subscription), drops repeats, hands each DM to
//! the handler and acks it after the handler returned.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use protocol::dedupe::{SeenKey, SeenSet, DEFAULT_DEDUPE_CAPACITY};
use protocol::error_chain::ErrorChain;

use super::Handled;
use protocol::audit::Details;
use protocol::subjects;
use tracing::Instrument;

use super::outbox::{Outbox, PendingReceipt, ReceiptOutbox, ReceiptSender};
use super::pulls::{ack_with, Pulled, Puller};
use super::{Binding, Delivery, InboxConsumer};
use crate::clock::ClockView;
use crate::fault::{self, FaultPoint};
use crate::supervision::task::StopSignal;

crate::counters! {
    /// Counters of one inbox incarnation.
    pub struct InboxCounters => InboxCountersSnapshot {
        /// DMs handed to the handler.
        delivered,
        /// Redeliveries dropped by the dedupe set (acked, not handed over).
        duplicates,
        /// Stored messages that do not decode (terminated).
        malformed,
        /// DMs whose `meta.expires_at` had come before they could be handed over (terminated,
        /// never handed to the handler).
        expired,
        /// DMs the handler asked to see again later (nak'd with its delay).
        retried,
        /// DMs the handler rejected (terminated with its reason).
        rejected,
        /// DMs handed over flagged `out_of_order`.
        out_of_order,
        /// Read receipts stored by the ingress (the sender set `meta.requires_ack`), at once or
        /// from the outbox.
        receipts,
        /// Read receipts that could not be sent at once (the broker unreachable, no store ack
        /// in time, or older receipts still waiting): each went to the outbox, to be tried again.
        receipts_failed,
        /// Tries of receipts from the outbox (retries and the flush at a clean stop), stored or
        /// not.
        receipts_retried,
        /// Read receipts in the outbox now (a gauge).
        receipts_pending,
        /// Read receipts dropped from a full outbox (its oldest), never sent.
        receipts_dropped,
        /// Pulls re-issued after a missed heartbeat or a pull error.
        repulls,
        /// Presence beats stored (`online`).
        presence_beats,
        /// Presence beats that could not be stored (tried again at the next beat).
        presence_failures,
    }
}

/// Why an inbox pump stopped (its incarnation fails with it, and is restarted).
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    /// The durable consumer could not be looked up or pulled from.
    #[error("cannot pull from consumer {consumer} of {stream}")]
    Pull {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: async_nats::Error,
    },
    /// The consumer was deleted, or made a push consumer, under the pump (or it refuses the
    /// inbox's pulls).
    #[error("consumer {consumer} is gone: {reason}")]
    ConsumerGone {
        /// The consumer.
        consumer: String,
        /// What the broker said.
        reason: String,
    },
    /// The live subscription could not be made.
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        /// The inbox subject.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The subscription ended (the connection closed), or the inbox's pulls were registered
    /// again by another incarnation.
    #[error("the inbox message stream ended")]
    Ended,
    /// A fault armed for this inbox fired (tests).
    #[error(transparent)]
    Fault(#[from] fault::FaultError),
    /// The handler (or the pump) panicked.
    #[error("the inbox's handler panicked")]
    Panicked,
}

/// What the pump needs: its inbox's configuration and its incarnation's parts. What an idle
/// inbox does not use is made when first used: its audit emitter, its read receipts' outbox.
pub(super) struct InboxPump {
    inbox: Arc<InboxConsumer>,
    counters: Arc<InboxCounters>,
    /// Whether its audit events go anywhere (a durable binding, audit events on).
    audit_on: bool,
    /// Where its audit events go (`fetched`, `delivered`, `nacked`, ...), once it has one.
    audit: OnceLock<crate::audit::Auditor>,
    /// Server time, which deadlines are judged in ([`crate::clock`]).
    clock: ClockView,
    /// Sends read receipts through this identity's ingress, and keeps those that could not be
    /// sent at once ([`super::outbox`]), once it had one to send (a durable binding only).
    receipts: OnceLock<Box<ReceiptOutbox>>,
}

/// What one DM's audit events name.
#[derive(Debug, Clone)]
pub(super) struct Trail {
    id: String,
    /// The W3C trace id of its `traceparent` (parsed once for all its events).
    trace_id: Option<String>,
    attempt: u64,
}

/// Emits `event` about the DM of `trail` (nothing without a trail: audit events off).
pub(super) fn emit(
    audit: &crate::audit::Auditor,
    trail: Option<&Trail>,
    event: &'static str,
    details: Details,
) {
    if let Some(t) = trail {
        let now = protocol::expiry::now_ms();
        let event = protocol::audit::EventRef::of(event, &t.id, false, now)
            .traced(t.trace_id.as_deref())
            .attempt(t.attempt)
            .details(&details);
        audit.emit_refs([event]);
    }
}

/// What the pump decided about one message.
enum Verdict {
    /// Hand it over; its dedupe key, to record once the handler is done with it.
    Handle(Delivery, SeenKey),
    Duplicate,
    Malformed,
    Expired,
}

impl InboxPump {
    /// The pump of one incarnation of `inbox`.
    pub fn new(
        inbox: Arc<InboxConsumer>,
        counters: Arc<InboxCounters>,
        audit_on: bool,
        clock: ClockView,
    ) -> InboxPump {
        InboxPump {
            inbox,
            counters,
            audit_on,
            audit: OnceLock::new(),
            clock,
            receipts: OnceLock::new(),
        }
    }

    /// Its audit emitter, made at its first event.
    fn audit(&self) -> &crate::audit::Auditor {
        self.audit.get_or_init(|| {
            if self.audit_on {
                self.inbox.shared.auditor(&self.inbox.id)
            } else {
                crate::audit::Auditor::off()
            }
        })
    }

    /// Its read receipts, made at the first.
    fn receipts(&self) -> &ReceiptOutbox {
        self.receipts.get_or_init(|| {
            let shared = &self.inbox.shared;
            Box::new(ReceiptOutbox::new(
                Outbox::new(super::outbox::CAPACITY, self.counters.clone()),
                ReceiptSender::new(shared.client().clone(), shared.js().clone(), &self.inbox.id),
                self.audit().clone(),
            ))
        })
    }

    /// A clean stop, once the pump is done: the read receipts still waiting get one more try
    /// ([`ReceiptOutbox::close`]).
    pub async fn close(&self) {
        if let Some(receipts) = self.receipts.get() {
            receipts.close().await;
        }
    }

    /// Pumps `binding` until `stop` is given (then `Ok`, the DM in hand finished) or the pump
    /// fails.
    ///
    /// Not an `async fn`: its future holds its arguments once (an `async fn` keeps them
    /// twice), and a host of many inboxes holds one such future per idle inbox.
    #[allow(clippy::manual_async_fn)]
    pub fn run<'a>(
        &'a self,
        binding: Binding,
        stop: &'a StopSignal,
    ) -> impl std::future::Future<Output = Result<(), PumpError>> + Send + 'a {
        async move {
            match binding {
                Binding::Durable { stream, consumer } => self.durable(stream, consumer, stop).await,
                Binding::Core => self.core(stop).await,
            }
        }
    }

    async fn durable(
        &self,
        stream: String,
        consumer: String,
        stop: &StopSignal,
    ) -> Result<(), PumpError> {
        // The first deadline is judged in server time too.
        self.clock.settled().await;
        let pull = |source: async_nats::Error| PumpError::Pull {
            stream: stream.clone(),
            consumer: consumer.clone(),
            source,
        };
        // The setup, and the rare paths below, are boxed: the pump's future holds its largest
        // await inline for its whole life, once per idle inbox of a host. The context and the
        // consumer's info end with this block.
        let (beat, mut puller) = Box::pin(async {
            let js = self.inbox.shared.js();
            // Consumer info only: an agent may not read the stream's info.
            let pull_consumer: jetstream::consumer::PullConsumer = js
                .get_consumer_from_stream(&consumer, &stream)
                .await
                .map_err(|e| pull(e.into()))?;
            // The consumer's real ack wait: its first backoff when it has one (nats-server then
            // redelivers after it), else its ack wait; a DM being handled is heartbeated at a
            // third of it, so a slow handler never has it redelivered.
            let ack_wait =
                crate::consumers::effective_ack_wait(&pull_consumer.cached_info().config);
            let beat = (ack_wait / 3).max(Duration::from_millis(100));
            // Its pulls go through the connection's shared subscription ([`super::pulls`]).
            let puller = self
                .inbox
                .shared
                .pulls()
                .register(&stream, &consumer, self.inbox.batch)
                .await
                .map_err(|e| pull(e.into()))?;
            Ok::<_, PumpError>((beat, puller))
        })
        .await?;
        let mut seen = SeenSet::new(DEFAULT_DEDUPE_CAPACITY);
        // The highest stream sequence handed over by this incarnation.
        let mut last_handed: Option<u64> = None;
        // One future for the whole loop, not a waiter registered and removed per DM.
        let stopped = stop.stopped();
        tokio::pin!(stopped);
        loop {
            let next = tokio::select! {
                biased;
                () = &mut stopped => return Ok(()),
                next = puller.next(&self.counters.repulls) => next,
            };
            let msg = match next {
                Pulled::Message(msg) => msg,
                Pulled::Gone(reason) => return Err(PumpError::ConsumerGone { consumer, reason }),
                Pulled::Ended => return Err(PumpError::Ended),
            };
            // Boxed: an idle inbox's future does not hold a DM's handling (about 3 kB, once
            // per idle inbox of a host); one allocation per DM.
            Box::pin(self.handle(msg, &mut seen, &mut last_handed, beat, &mut puller)).await?;
            // What waits behind it is kept from redelivery too (boxed: rare, and not held by
            // an idle inbox's future).
            if puller.held_beat_due() {
                Box::pin(puller.keep_held_alive(beat)).await;
            }
        }
    }

    /// Judges, hands over and settles one durable message.
    async fn handle(
        &self,
        mut msg: async_nats::Message,
        seen: &mut SeenSet,
        last_handed: &mut Option<u64>,
        beat: Duration,
        puller: &mut Puller,
    ) -> Result<(), PumpError> {
        let (stream_seq, delivered) = msg
            .reply
            .as_deref()
            .and_then(subjects::parse_ack_info)
            .map_or((None, 1), |i| (Some(i.stream_seq), i.delivered));
        let verdict = self.judge(&msg, stream_seq, delivered, *last_handed, seen);
        let trail = self.trail(&msg, &verdict, stream_seq, delivered);
        let client = self.inbox.shared.client();
        let ack = match verdict {
            Verdict::Handle(delivery, key) => {
                let receipt = protocol::receipt::read_receipt(&delivery.envelope);
                *last_handed = (*last_handed).max(stream_seq);
                let handled = {
                    let work = self.deliver(delivery, msg.headers.as_ref());
                    tokio::pin!(work);
                    // A handler done at its first poll (most are) arms no timer; a
                    // longer one beats first once it has taken a beat's time.
                    match futures::poll!(&mut work) {
                        std::task::Poll::Ready(done) => done?,
                        std::task::Poll::Pending => {
                            let mut tick =
                                tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
                            loop {
                                tokio::select! {
                                    done = &mut work => break done?,
                                    _ = tick.tick() => {
                                        let _ = ack_with(client, msg.reply.clone(), AckKind::Progress).await;
                                        puller.keep_held_alive(beat).await;
                                    }
                                }
                            }
                        }
                    }
                };
                match handled {
                    Handled::Done => {
                        seen.first_time_key(key);
                        match ack_with(client, msg.reply.take(), AckKind::Ack).await {
                            Ok(()) => self.emit(&trail, "delivered", Details::default()),
                            Err(e) => {
                                tracing::warn!(error = %ErrorChain(&*e), "inbox ack failed; the DM will be redelivered")
                            }
                        }
                        // The second level: the sender asked to know it was read.
                        if let Some(receipt) = receipt {
                            Box::pin(self.send_receipt(&receipt, trail)).await;
                        }
                        return Ok(());
                    }
                    Handled::Retry(delay) => {
                        self.counters.retried.bump();
                        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                        self.emit(
                            &trail,
                            "nacked",
                            Details {
                                delay_ms: Some(ms),
                                ..Details::default()
                            },
                        );
                        AckKind::Nak(Some(delay))
                    }
                    Handled::Reject(reason) => {
                        // Not remembered as seen: a replay of its dead letter (the same
                        // `meta.id`) is handed over again.
                        self.counters.rejected.bump();
                        self.emit(
                            &trail,
                            "rejected",
                            Details {
                                reason: Some(reason.clone()),
                                ..Details::default()
                            },
                        );
                        if let Err(e) =
                            Box::pin(self.term_with(&msg, &reject_reason(&reason))).await
                        {
                            tracing::warn!(error = %ErrorChain(&*e), "inbox term failed; the DM will be redelivered");
                        }
                        return Ok(());
                    }
                }
            }
            Verdict::Duplicate => AckKind::Ack,
            Verdict::Malformed => AckKind::Term,
            Verdict::Expired => {
                // Terminated with its reason: the broker's termination advisory names it,
                // and the router tells the sender (`crate::expiry`).
                if let Err(e) = Box::pin(self.term_with(&msg, protocol::expiry::TERM_REASON)).await
                {
                    tracing::warn!(error = %ErrorChain(&*e), "inbox term failed; the DM will be redelivered");
                }
                return Ok(());
            }
        };
        if let Err(e) = ack_with(client, msg.reply.take(), ack).await {
            tracing::warn!(error = %ErrorChain(&*e), "inbox ack failed; the DM will be redelivered");
        }
        Ok(())
    }

    async fn core(&self, stop: &StopSignal) -> Result<(), PumpError> {
        let subject = subjects::inbox(&self.inbox.id);
        let mut sub = self
            .inbox
            .shared
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|source| PumpError::Subscribe { subject, source })?;
        let mut seen = SeenSet::new(DEFAULT_DEDUPE_CAPACITY);
        let stopped = stop.stopped();
        tokio::pin!(stopped);
        loop {
            let msg = tokio::select! {
                biased;
                () = &mut stopped => return Ok(()),
                next = sub.next() => next.ok_or(PumpError::Ended)?,
            };
            if let Verdict::Handle(delivery, key) = self.judge(&msg, None, 1, None, &seen) {
                // Nothing is redelivered in core mode: whatever the handler says, the DM is
                // gone once handed over. Boxed, as a durable DM's handling.
                let handled = Box::pin(self.deliver(delivery, msg.headers.as_ref())).await?;
                if handled != Handled::Done {
                    tracing::warn!(
                        ?handled,
                        "core mode cannot redeliver or dead-letter a DM; it is dropped"
                    );
                }
                seen.first_time_key(key);
            }
        }
    }

    /// Sends a read receipt through this identity's ingress (`hub.pub.<me>.inbox`, dedupe id
    /// `<me>:<receipt id>~<seal>`), and waits for the ingress to store it. One that cannot be sent at
    /// once (or that older receipts still wait before) goes to the outbox, which tries it
    /// again until it is stored ([`super::outbox`]): the DM was handled and acked.
    async fn send_receipt(&self, receipt: &protocol::Envelope, trail: Option<Trail>) {
        let receipts = self.receipts();
        let pending = match PendingReceipt::new(&self.inbox.id, receipt, trail) {
            Ok(pending) => pending,
            Err(e) => {
                self.counters.receipts_dropped.bump();
                tracing::warn!(error = %ErrorChain(&e), id = %receipt.meta.id, "read receipt dropped");
                return;
            }
        };
        if !receipts.outbox().is_empty() {
            // Behind the receipts still waiting: receipts go out in the order of their DMs.
            receipts.queue(pending);
            return;
        }
        match receipts.sender().send(&pending).await {
            Ok(()) => {
                self.counters.receipts.bump();
                emit(
                    self.audit(),
                    pending.trail.as_ref(),
                    "read",
                    Details::default(),
                );
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), id = %pending.id, "read receipt not sent; kept in the outbox");
                receipts.queue(pending);
            }
        }
    }

    /// Terminates `msg` with `reason` (`+TERM <reason>`): the broker's termination advisory
    /// carries it.
    async fn term_with(
        &self,
        msg: &async_nats::Message,
        reason: &str,
    ) -> Result<(), async_nats::Error> {
        let reply = msg
            .reply
            .clone()
            .ok_or("a JetStream message without an ack subject")?;
        self.inbox
            .shared
            .client()
            .publish(reply, format!("+TERM {reason}").into())
            .await?;
        Ok(())
    }

    /// What a durable message's audit events name (its `meta.id`, trace and attempt), and the
    /// events of the verdict itself: `fetched` (and `redelivered` past the first delivery) for
    /// a handoff, `deduplicated`, `expired`.
    fn trail(
        &self,
        msg: &async_nats::Message,
        verdict: &Verdict,
        stream_seq: Option<u64>,
        delivered: u64,
    ) -> Option<Trail> {
        if !self.audit().is_on() {
            return None;
        }
        let id = match verdict {
            Verdict::Handle(d, _) => d.envelope.meta.id.to_string(),
            Verdict::Duplicate | Verdict::Expired => {
                crate::decode::envelope(msg.headers.as_ref(), &msg.payload)
                    .ok()?
                    .meta
                    .id
                    .to_string()
            }
            Verdict::Malformed => return None,
        };
        let trail = Trail {
            id,
            trace_id: protocol::audit::trace_id_of(
                msg.headers
                    .as_ref()
                    .and_then(|h| h.get(crate::header_names::TRACEPARENT))
                    .map(|v| v.as_str()),
            ),
            attempt: delivered,
        };
        let seq = Details {
            stream_seq,
            ..Details::default()
        };
        match verdict {
            Verdict::Handle(d, _) => {
                emit(self.audit(), Some(&trail), "fetched", seq.clone());
                if d.redelivered {
                    emit(self.audit(), Some(&trail), "redelivered", seq);
                }
            }
            Verdict::Duplicate => emit(self.audit(), Some(&trail), "deduplicated", seq),
            Verdict::Expired => emit(self.audit(), Some(&trail), "expired", seq),
            Verdict::Malformed => {}
        }
        Some(trail)
    }

    fn emit(&self, trail: &Option<Trail>, event: &'static str, details: Details) {
        emit(self.audit(), trail.as_ref(), event, details);
    }

    fn judge(
        &self,
        msg: &async_nats::Message,
        stream_seq: Option<u64>,
        delivered: u64,
        last_handed: Option<u64>,
        seen: &SeenSet,
    ) -> Verdict {
        let envelope = crate::decode::envelope(msg.headers.as_ref(), &msg.payload).ok();
        let Some(envelope) = envelope else {
            self.counters.malformed.bump();
            return Verdict::Malformed;
        };
        // Only what a handler was done with is a duplicate: a DM it asked to see again is
        // handed over again. Checked first: a DM handled before its deadline whose ack was
        // lost is acked as a duplicate, not terminated as expired.
        let key = seen.key_of(envelope.meta.from.as_ref(), &envelope.meta.id);
        if seen.contains_key(key) {
            self.counters.duplicates.bump();
            return Verdict::Duplicate;
        }
        // Checked against the server's clock right before the handoff: a DM that expired
        // while it waited (stored, fetched, or queued behind a slow handler) is never handed
        // over.
        let now = self.clock.now_ms();
        if protocol::expiry::expiry(envelope.meta.expires_at(), now)
            == protocol::expiry::Expiry::Expired
        {
            self.counters.expired.bump();
            tracing::info!(id = %envelope.meta.id, expires_at = envelope.meta.expires_at(), now, "expired DM terminated, not handed over");
            return Verdict::Expired;
        }
        let flags = protocol::ordering::handoff_flags(stream_seq, delivered, last_handed);
        if flags.out_of_order {
            self.counters.out_of_order.bump();
        }
        Verdict::Handle(
            Delivery {
                envelope,
                stream_seq,
                delivered,
                redelivered: flags.redelivered,
                out_of_order: flags.out_of_order,
            },
            key,
        )
    }

    async fn deliver(
        &self,
        delivery: Delivery,
        headers: Option<&async_nats::HeaderMap>,
    ) -> Result<Handled, PumpError> {
        // Crash tests: a fault armed for this inbox fires before the DM is handed over, so the
        // DM stays unacked and must come back.
        fault::check(&self.inbox.name, FaultPoint::Handle)?;
        let span = tracing::info_span!(
            "inbox.handle",
            inbox = %self.inbox.id,
            id = %delivery.envelope.meta.id,
            stream_seq = delivery.stream_seq
        );
        crate::trace_context::set_parent_from(&span, headers);
        let handled = (self.inbox.handler)(delivery).instrument(span).await;
        self.counters.delivered.bump();
        Ok(handled)
    }
}

/// A handler's rejection reason as one `+TERM` line: `rejected: <reason>`, as one line of at
/// most 200 bytes.
fn reject_reason(reason: &str) -> String {
    protocol::headers::one_line(&format!("rejected: {reason}"), 200)
}
