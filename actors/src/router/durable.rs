//! The durable pump: pull from the shared `router` consumer, route, store with a stable
//! `Nats-Msg-Id`, and ack the ingress only after the store ack.
//!
//! Pipelined: up to `router_max_ack_pending` envelopes are between pull and ingress ack at once.
//! Store publishes are issued in pull order on one connection, so one router keeps the publish
//! order of the envelopes to one recipient; ingress acks are sent in the same order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::MessagesErrorKind;
use async_nats::jetstream::{self, AckKind, Message};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::rejection::rejection;
use protocol::routing::{route, Dest, RouteDecision};
use protocol::Codec;
use tokio::sync::watch;
use tracing::Instrument;

use super::counters::RouterCounters;
use super::outbound::{header_pairs, routed_headers, view};
use super::outcome::{ready, store_notice, Done, Pending, Pulled};
use super::rate::RateLimiter;
use super::refusal::Refusable;
use super::schedule::Planned;
use super::store_acks::{store_all, Outgoing, StoreAcks};
use super::trail::Trail;
use super::RouterError;
use crate::epoch::{broker_mark, Baseline, BrokerMark};
use crate::PUBLISH_ACK_TIMEOUT;

/// Delay of a nak after a failed store: the message comes back after this long.
pub const NAK_DELAY: Duration = Duration::from_secs(1);
/// Idle heartbeat of the pull requests: a pull that stays silent for 2× this (no message and no
/// heartbeat: the broker holds no pull of ours) is issued again, on a new subscription
/// (async-nats alone would wait for the pull's expiry plus 5 s).
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(5);
/// Expiry of one pull request.
pub const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// How long a shutdown waits for the envelopes in flight before nak'ing the rest.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The most envelopes the pump keeps in flight, whatever `router_max_ack_pending` says: their
/// stores' acks (up to `MAX_BUNDLE_ITEMS` each) fit the 65,536 messages async-nats queues for
/// a subscription by default, so none is dropped as a slow consumer's.
pub const MAX_PIPELINE: usize = 65_536 / protocol::routing::MAX_BUNDLE_ITEMS;

/// What the pump needs.
pub struct DurablePump {
    /// The shared connection.
    pub client: async_nats::Client,
    /// Limits and names.
    pub delivery: Arc<DeliveryConfig>,
    /// Counters shared with the actor.
    pub counters: Arc<RouterCounters>,
    /// The router's actor name (fault-injection key: a fault armed at `Handle` fires per
    /// pulled envelope, before it is routed, leaving it unacked).
    pub fault_name: String,
    /// Queues whose shared consumer this incarnation has made sure of.
    pub known_queues: std::sync::Mutex<std::collections::HashSet<protocol::QueueName>>,
    /// Where its audit events go ([`crate::audit`]; off: nowhere).
    pub audit: crate::audit::Auditor,
    /// The removed agents (kept current by the router's watch): a DM to one is refused.
    pub removed: crate::removed::RemovedAgents,
    /// Asks for a trim round when a DM is refused for an inbox's read history.
    pub history: crate::history::Nudge,
}

impl DurablePump {
    /// What refusing a DM needs of the pump.
    fn refusals(&self) -> super::refusal::Refusals<'_> {
        super::refusal::Refusals {
            client: &self.client,
            delivery: &self.delivery,
            counters: &self.counters,
            audit: &self.audit,
            history: &self.history,
        }
    }

    /// Binds (creates or updates) the router consumer and routes until `stop` turns true or a
    /// fatal error occurs. On stop it stops pulling and drains what is in flight for up to
    /// [`DRAIN_TIMEOUT`]; what is left is nak'd.
    ///
    /// # Errors
    /// [`RouterError::Consumer`] when the consumer cannot be bound or was deleted,
    /// [`RouterError::PullEnded`] when the message stream ends.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), RouterError> {
        // At most `MAX_PIPELINE` at once: the acks of every store in flight then fit the queue of
        // the store-ack subscription (`store_acks`), even while the loop is busy elsewhere.
        let max_in_flight = usize::try_from(self.delivery.router_max_ack_pending)
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or(1000)
            .min(MAX_PIPELINE);
        // The context serves the stores made outside the pipeline's own acks (refusal and
        // rejection notices, schedules). Every such store holds one of its publish-ack permits
        // until its ack future is polled to the end, and the pump does not poll those futures
        // while it waits for a permit: the budget covers the most stores that can be in flight
        // (a bundle stores up to MAX_BUNDLE_ITEMS), or the pump would wait for itself. Its
        // timeout bounds each of those store acks' waits and the router's other requests.
        let js = jetstream::ContextBuilder::new()
            .max_ack_inflight(max_in_flight * protocol::routing::MAX_BUNDLE_ITEMS + 1)
            .timeout(PUBLISH_ACK_TIMEOUT)
            .build(self.client.clone());
        let stream = js
            .get_stream(&self.delivery.ingress.name)
            .await
            .map_err(|e| RouterError::Consumer(Box::new(e)))?;
        let consumer = stream
            .create_consumer(crate::consumers::router_consumer(&self.delivery))
            .await
            .map_err(|e| RouterError::Consumer(Box::new(e)))?;
        let open = || {
            consumer
                .stream()
                .max_messages_per_batch(max_in_flight.min(500))
                .heartbeat(PULL_HEARTBEAT)
                .expires(PULL_EXPIRES)
                .messages()
        };
        let mut messages = open()
            .await
            .map_err(|e| RouterError::Consumer(Box::new(e)))?;
        // What the broker held when this connection began (re-taken after every reconnect):
        // a task stored from an input older than that, or while the broker may have
        // forgotten the dedupe ids of consumed tasks, is flagged for the worker to check.
        let broker = Baseline::<BrokerMark>::new(self.client.clone(), None);
        let read = {
            let (client, js) = (self.client.clone(), js.clone());
            let ingress = self.delivery.ingress.name.clone();
            move |_previous| {
                let (client, js, ingress) = (client.clone(), js.clone(), ingress.clone());
                async move { broker_mark(&client, &js, &ingress, protocol::subjects::WORK_STREAM).await }
            }
        };
        if let Err(e) = broker.refresh(&read).await {
            tracing::warn!(error = %ErrorChain(&e), "no broker baseline yet; every routed task is flagged for a check");
        }
        let _refresher = crate::background::spawn(broker.clone().keep_fresh(read));
        let rate = match self.delivery.sender_rate() {
            Some(per_min) => Some(
                RateLimiter::open(&js, per_min)
                    .await
                    .map_err(RouterError::RateBucket)?,
            ),
            None => None,
        };
        // The pipeline's store acks, read by this loop (`store_acks`).
        let (acks, mut acks_sub) = StoreAcks::open(self.client.clone())
            .await
            .map_err(RouterError::StoreAcks)?;
        let mut in_flight: FuturesOrdered<Pending> = FuturesOrdered::new();
        // Room for every message in flight at once: never regrown while routing.
        let mut held: VecDeque<(Message, Option<Trail>)> = VecDeque::with_capacity(max_in_flight);
        let mut seq_fallback = 0u64;
        // One future for the whole loop: a `changed()` made at every turn registered and
        // removed a waiter twice per DM.
        let stopped = async {
            while stop.changed().await.is_ok() {
                if *stop.borrow() {
                    return;
                }
            }
        };
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                biased;
                () = &mut stopped => break,
                // Before the pipeline: every ack already come is handed over before a store's
                // wait is polled, so none times out with its ack unread.
                Some(reply) = acks_sub.next() => acks.settle(reply),
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    let (msg, trail) = held.pop_front().expect("one held message per pending outcome");
                    self.finish(msg, trail, done).await;
                }
                next = messages.next(), if in_flight.len() < max_in_flight => match next {
                    Some(Ok(msg)) => {
                        crate::fault::check(&self.fault_name, crate::fault::FaultPoint::Handle)?;
                        seq_fallback += 1;
                        let pulled = Pulled::of(&msg, seq_fallback);
                        self.counters.in_flight.bump();
                        let (pending, trail) = self.start(&js, &acks, &msg, pulled, &broker, rate.as_ref()).await;
                        in_flight.push_back(pending);
                        held.push_back((msg, trail));
                    }
                    Some(Err(e)) => match e.kind() {
                        MessagesErrorKind::MissingHeartbeat => {
                            // The broker holds no pull of ours while the stream counts one
                            // open: nothing would come until that pull's expiry. A new stream
                            // issues a new pull at once (messages delivered to the old one and
                            // not seen come back after the ack wait).
                            self.counters.reconnects.bump();
                            tracing::warn!("router pull silent past two heartbeats; pulling again");
                            match open().await {
                                Ok(fresh) => messages = fresh,
                                Err(e) => tracing::warn!(error = %ErrorChain(&e), "router pull not issued again; the stream's own re-pull stands"),
                            }
                        }
                        MessagesErrorKind::ConsumerDeleted
                        | MessagesErrorKind::PushBasedConsumer => {
                            return Err(RouterError::Consumer(Box::new(e)));
                        }
                        _ => {
                            self.counters.reconnects.bump();
                            tracing::warn!(error = %ErrorChain(&e), "router pull error; pulling again");
                        }
                    },
                    None => return Err(RouterError::PullEnded),
                },
            }
        }
        drop(messages);
        self.drain(&acks, &mut acks_sub, in_flight, held).await;
        Ok(())
    }

    /// Decides and issues the publish for one message; returns the future that resolves when
    /// the store is acked (or at once when nothing is stored), and its audit trail.
    // The async block yields the *store-ack* future on purpose: awaiting it here would
    // serialize the pipeline.
    #[allow(clippy::async_yields_async)]
    async fn start(
        &self,
        js: &jetstream::Context,
        acks: &StoreAcks,
        msg: &Message,
        pulled: Pulled,
        broker: &Baseline<BrokerMark>,
        rate: Option<&RateLimiter>,
    ) -> (Pending, Option<Trail>) {
        let seq = pulled.seq;
        let span = tracing::info_span!("route", ingress_seq = seq, subject = %msg.subject);
        crate::trace_context::set_parent_from(&span, msg.headers.as_ref());
        let pairs = header_pairs(msg.headers.as_ref());
        let decision = route(&view(
            msg.subject.as_str(),
            &pairs,
            &msg.payload,
            seq,
            msg.status,
        ));
        drop(pairs);
        let trail = super::trail::accepted(&self.audit, msg, pulled, &decision);
        let pending = async move {
            match decision {
                RouteDecision::Store {
                    dest,
                    subject,
                    msg_id,
                    payload,
                    codec,
                    from,
                    id,
                } => {
                    let out = Outgoing {
                        subject,
                        headers: routed_headers(Some(&msg_id), codec),
                        payload,
                    };
                    match dest {
                        Dest::Inbox {
                            to,
                            ttl_secs,
                            expires_at,
                        } => {
                            let dm = Refusable { from, to, id, seq };
                            self.store_dm(
                                js,
                                acks,
                                out.ttl(ttl_secs, &self.delivery),
                                dm,
                                expires_at,
                                rate,
                            )
                            .await
                        }
                        Dest::Work { queue, worker, .. } => {
                            let check = self.flags_check(msg, pulled, broker);
                            self.store_task(js, acks, out, (queue, worker), check).await
                        }
                        Dest::Answer { worker, task_id } => {
                            let wait_ms = self.delivery.answer_max_wait_secs.saturating_mul(1000);
                            let check = Planned::Answer {
                                from,
                                worker,
                                id,
                                task_id,
                                at_ms: protocol::expiry::now_ms().saturating_add(wait_ms),
                            };
                            let pending = out.send(acks, None).await;
                            check.once_stored(js, &self.counters, pending)
                        }
                        Dest::TaskChannel(_) => out.send(acks, None).await,
                    }
                }
                RouteDecision::StoreAll {
                    subject,
                    items,
                    codec,
                    ..
                } => store_all(acks, subject, items, codec).await,
                RouteDecision::Broadcast {
                    subject,
                    payload,
                    codec,
                    ..
                } => self.broadcast(subject, payload, codec).await,
                RouteDecision::Reject {
                    sender,
                    rejected_id,
                    error,
                } => {
                    self.reject(js, &sender, rejected_id.as_ref(), &error, seq)
                        .await
                }
                RouteDecision::Drop { reason } => {
                    self.counters.dropped_by_guard.bump();
                    tracing::warn!(?reason, "replay guard dropped an ingress message");
                    ready(Done::Immediate { terminate: true })
                }
            }
        }
        .instrument(span)
        .await;
        (pending, trail.map(Trail::sent_now))
    }

    /// Publishes a broadcast live (core NATS: nothing is stored).
    async fn broadcast(&self, subject: String, payload: Vec<u8>, codec: Codec) -> Pending {
        let headers = routed_headers(None, codec);
        match self
            .client
            .publish_with_headers(subject, headers, payload.into())
            .await
        {
            Ok(()) => {
                self.counters.broadcast.bump();
                ready(Done::Immediate { terminate: false })
            }
            Err(e) => ready(Done::Failed(e.to_string())),
        }
    }

    /// Stores the rejection notice of a malformed envelope in its sender's inbox
    /// ([`rejection`]); the ingress message is terminated once it is stored.
    async fn reject(
        &self,
        js: &jetstream::Context,
        sender: &protocol::AgentId,
        rejected_id: Option<&protocol::MessageId>,
        error: &protocol::WireError,
        seq: u64,
    ) -> Pending {
        self.counters.malformed.bump();
        tracing::warn!(%sender, kind = error.kind.as_str(), detail = %error.detail, "malformed envelope refused");
        let (subject, msg_id, notice) = rejection(sender, rejected_id, error, seq);
        match protocol::encode(&notice, Codec::Json) {
            Ok(payload) => {
                let headers = routed_headers(Some(&msg_id), Codec::Json);
                store_notice(js, subject, headers, payload).await
            }
            Err(_) => ready(Done::Immediate { terminate: true }),
        }
    }

    /// Stores a DM, unless its recipient was removed or its sender is over its rate (both
    /// refused before it is stored and told to the sender); one with a deadline has its check
    /// scheduled once stored. A limit the broker refuses it for is told to its sender too.
    async fn store_dm(
        &self,
        js: &jetstream::Context,
        acks: &StoreAcks,
        out: Outgoing,
        dm: Refusable,
        expires_at: Option<u64>,
        rate: Option<&RateLimiter>,
    ) -> Pending {
        // To a removed agent: refused before it takes a token (a lookup in memory: the set is
        // fed by a watch).
        if self.removed.contains(&dm.to) {
            return self.refusals().recipient_deleted(js, dm);
        }
        // Over its sender's rate (awaited here, so the store order stays the pull order).
        if let Some(rate) = rate {
            match rate.take(&dm.from).await {
                Ok(None) => {}
                Ok(Some(secs)) => return self.refusals().rate_limited(js, dm, secs),
                Err(reason) => return ready(Done::Failed(reason)),
            }
        }
        let Some(expires_at) = expires_at else {
            return out.send(acks, Some(dm)).await;
        };
        let check = Planned::Expiry {
            from: dm.from.clone(),
            to: dm.to.clone(),
            id: dm.id.clone(),
            expires_at,
        };
        match out.sent(acks, Some(dm)).await {
            Ok(ack) => check.once_stored(js, &self.counters, ack),
            Err(reason) => ready(Done::Failed(reason)),
        }
    }

    /// Stores a task input (`Hub-Check` when `check`); the first one for a queue makes sure
    /// of the queue's shared consumer.
    async fn store_task(
        &self,
        js: &jetstream::Context,
        acks: &StoreAcks,
        mut out: Outgoing,
        (queue, worker): (protocol::QueueName, Option<protocol::WorkerId>),
        check: bool,
    ) -> Pending {
        if worker.is_none() {
            if let Err(e) = self.ensure_queue_consumer(js, &queue).await {
                return ready(Done::Failed(e));
            }
        }
        if check {
            self.counters.flagged.bump();
            out.headers.insert(protocol::headers::HUB_CHECK, "1");
        }
        out.send(acks, None).await
    }

    /// Whether a task stored from `msg` is flagged (`Hub-Check`) for the worker to read its
    /// task channel first ([`protocol::task::router_flags`]).
    fn flags_check(&self, msg: &Message, pulled: Pulled, broker: &Baseline<BrokerMark>) -> bool {
        let window =
            i128::try_from(self.delivery.duplicate_window().as_nanos()).unwrap_or(i128::MAX);
        let stored_ns = pulled.info.map(|i| i128::from(i.stored_ns));
        let baseline = broker
            .current()
            .map(|mark| protocol::task::IngressBaseline {
                ingress_last_seq: mark.ingress_last_seq,
                dedupe_may_be_lost: match (mark.dedupe_lost_since_ns, stored_ns) {
                    (None, _) => false,
                    (Some(since), Some(stored)) => stored < since.saturating_add(window),
                    (Some(_), None) => true,
                },
            });
        protocol::task::router_flags(&protocol::task::IngressFacts {
            delivered: pulled.info.map_or(1, |i| i.delivered),
            sender_flagged: msg
                .headers
                .as_ref()
                .is_some_and(|h| h.get(protocol::headers::HUB_CHECK).is_some()),
            baseline,
            ingress_seq: pulled.seq,
        })
    }

    /// The first task routed to a queue creates the queue's shared consumer, so tasks wait for
    /// the first worker (which drains the backlog). Never deleted for inactivity.
    async fn ensure_queue_consumer(
        &self,
        js: &jetstream::Context,
        queue: &protocol::QueueName,
    ) -> Result<(), String> {
        if self
            .known_queues
            .lock()
            .expect("not poisoned")
            .contains(queue)
        {
            return Ok(());
        }
        let config = crate::consumers::queue_consumer(&self.delivery, queue);
        let created = async {
            js.get_stream(protocol::subjects::WORK_STREAM)
                .await?
                .create_consumer(config)
                .await?;
            Ok::<_, async_nats::Error>(())
        };
        match tokio::time::timeout(crate::streams::STREAM_API_TIMEOUT, created).await {
            Ok(Ok(())) => {
                self.known_queues
                    .lock()
                    .expect("not poisoned")
                    .insert(queue.clone());
                Ok(())
            }
            Ok(Err(e)) => Err(format!("cannot create the consumer of queue {queue}: {e}")),
            Err(_) => Err(format!("no answer creating the consumer of queue {queue}")),
        }
    }

    async fn finish(&self, msg: Message, trail: Option<Trail>, done: Done) {
        self.counters.in_flight.sub();
        super::trail::finish(&self.audit, trail, Some(&done));
        // A DM the broker refused for a limit: its sender is told first (only on this path
        // does the pipeline wait for a second store).
        let done = match done {
            Done::Refused(what, Some(dm)) => self.refusals().refuse(what, *dm).await,
            done => done,
        };
        let result = match done {
            Done::Stored {
                duplicate,
                terminate,
                ..
            } => {
                if terminate {
                    self.counters.rejections_sent.bump();
                    msg.ack_with(AckKind::Term).await
                } else {
                    self.counters.add_stored(duplicate);
                    msg.ack().await
                }
            }
            Done::StoredAll { stored, duplicates } => {
                for i in 0..stored {
                    self.counters.add_stored(i < duplicates);
                }
                msg.ack().await
            }
            Done::Immediate { terminate: true } => msg.ack_with(AckKind::Term).await,
            Done::Immediate { terminate: false } => msg.ack().await,
            Done::Refused(what, _) => {
                // Only DMs are refused by design; a notice or task channel store refused for
                // a limit cannot succeed later either.
                self.counters.notices_dropped.bump();
                tracing::warn!(?what, "store refused for a limit; terminated");
                msg.ack_with(AckKind::Term).await
            }
            Done::Failed(reason) => {
                self.counters.naks.bump();
                tracing::warn!(%reason, "store failed; nak with delay");
                msg.ack_with(AckKind::Nak(Some(NAK_DELAY))).await
            }
        };
        if let Err(e) = result {
            // The ack is lost with the connection; the message comes back after ack_wait and
            // the stored copy's Nats-Msg-Id makes the second store a duplicate.
            tracing::warn!(error = %ErrorChain(&*e), "ingress ack failed; it will be redelivered");
        }
    }

    /// Finishes what is in flight for up to [`DRAIN_TIMEOUT`], then naks (without delay, so
    /// another router takes them at once) what did not resolve, and flushes.
    async fn drain(
        &self,
        acks: &StoreAcks,
        acks_sub: &mut async_nats::Subscriber,
        mut in_flight: FuturesOrdered<Pending>,
        mut held: VecDeque<(Message, Option<Trail>)>,
    ) {
        let deadline = tokio::time::sleep_until(tokio::time::Instant::now() + DRAIN_TIMEOUT);
        tokio::pin!(deadline);
        while !in_flight.is_empty() {
            // The deadline last: past it, what has already resolved (or whose ack has come)
            // is still finished; only what is still waiting is nak'd.
            tokio::select! {
                biased;
                Some(reply) = acks_sub.next() => acks.settle(reply),
                Some(done) = in_flight.next() => {
                    let (msg, trail) = held
                        .pop_front()
                        .expect("one held message per pending outcome");
                    self.finish(msg, trail, done).await;
                }
                () = &mut deadline => break,
            }
        }
        if !held.is_empty() {
            tracing::warn!(
                left = held.len(),
                "drain timed out; nak'ing the rest for redelivery"
            );
        }
        for (msg, trail) in held {
            super::trail::finish(&self.audit, trail, None);
            self.counters.in_flight.sub();
            self.counters.naks.bump();
            let _ = msg.ack_with(AckKind::Nak(None)).await;
        }
        let _ = self.client.flush().await;
    }
}
