//! The expiry actor (router side, durable mode): tells a DM's sender when the DM expired before
//! its recipient read it, with a system notice of kind `expired` in the sender's inbox
//! ([`protocol::rejection::expired_notice`]).
//!
//! Two places can know it, and exactly one of them does for each DM
//! ([`protocol::expiry::notify_at_deadline`]):
//!
//! - **the deadline check.** When the router stores a DM with a `meta.expires_at`, it schedules
//!   a check at that deadline (a nats-server message schedule in `HUB_SCHEDULES`); the broker
//!   fires it on `hub.sched.due.expiry`, and this actor's `due` pump takes it. A DM the
//!   recipient's inbox consumer never fetched (its last delivered sequence is below the DM's,
//!   or it has no consumer: an agent offline all along) expired unread: the sender is told. The
//!   broker frees the DM itself a grace period later (its `Nats-TTL`).
//! - **the inbox.** A DM the inbox consumer fetched but whose deadline came before it could be
//!   handed over is terminated with the reason `expired`; the broker's termination advisory is
//!   captured in `HUB_ADVISORIES`, and this actor's `advisories` pump reads the DM (still
//!   stored, within its grace) and tells its sender.
//!
//! The same advisories pump takes care of **dead letters**: a DM whose deliveries ran out (the
//! broker's max-deliveries advisory) or that its handler rejected (terminated with
//! `rejected: <reason>`) is copied to `HUB_DLQ` (`dlq.<recipient>`, under `hub-dlq:<inbox seq>`)
//! and its sender gets a notice of kind `undeliverable`. A task input whose deliveries to
//! workers ran out (`task_max_deliver`) is copied to `dlq.work.<queue>` and removed from the work
//! stream, and its delegator told (`task_undeliverable`; [`tasks`]).
//!
//! Both pumps take their messages from durable consumers shared by every router, and ack each
//! only once what it leads to is stored: a router that dies in between has it redelivered, and
//! the `Nats-Msg-Id`s (`hub-system:<kind>:<inbox seq>`, `hub-dlq:<inbox seq>`) store each once.

mod tasks;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::MessagesErrorKind;
use async_nats::jetstream::{self, consumer::pull, AckKind};
use async_nats::Client;
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::expiry::{notify_at_deadline, ExpiryCheck, TERM_REASON};
use protocol::subjects;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::background::{Owned, PumpFailure};
use crate::dead_letter::NoticeStored;
use crate::fault::{self, FaultPoint};

/// The delay before a check or advisory that could not be handled is tried again.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);
/// How many times a check or advisory is delivered before it is given up (logged), so that
/// none can loop for ever.
pub const MAX_DELIVER: i64 = 20;
/// How far another process's clock may be ahead of this one's when it says a DM expired.
pub const CLOCK_SKEW_MS: u64 = 5_000;
/// The longest dead-letter reason kept (one line).
pub const MAX_REASON_BYTES: usize = 200;

/// Expiry actor configuration.
#[derive(Clone)]
pub struct Expiry {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The shared connection.
    pub client: Client,
    /// Stream names.
    pub delivery: Arc<DeliveryConfig>,
}

/// Messages of the expiry actor.
pub enum ExpiryMsg {
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<ExpirySnapshot>),
    /// A pump stopped with an error: fail, so that the supervisor restarts the actor.
    PumpFailed(PumpFailure),
}

crate::counters! {
    /// Counters of the expiry actor.
    pub struct ExpiryCounters => ExpirySnapshot {
        /// Deadline checks taken.
        checks,
        /// Notices stored: a DM expired unread, or was dead-lettered.
        notices,
        /// DMs copied to the dead-letter stream (deliveries ran out, or rejected).
        dead_lettered,
        /// Deadline checks of DMs the recipient's inbox had fetched (the inbox decides).
        fetched,
        /// Termination advisories taken (every reason).
        advisories,
        /// Expired DMs whose notice could not be built: the DM was already gone.
        notices_lost,
        /// Notices the sender's own full inbox refused (dropped: retrying cannot help).
        notices_dropped,
        /// Checks or advisories that do not decode (terminated).
        malformed,
        /// Checks or advisories tried again later (a broker request failed).
        retries,
        /// Advisories ignored: about a DM of another inbox than the terminating consumer's, or
        /// a termination as expired of a DM whose deadline has not come.
        foreign,
    }
}

/// State of one incarnation.
pub struct ExpiryState {
    counters: Arc<ExpiryCounters>,
    stop: watch::Sender<bool>,
    pumps: Vec<Owned>,
    /// Publishes the pumps' audit events (`expired`, `dead_lettered`).
    audit_flusher: Option<Owned>,
}

/// Expiry actor failures.
#[derive(Debug, thiserror::Error)]
pub enum ExpiryError {
    /// A consumer could not be created or pulled from.
    #[error("cannot pull {consumer} of stream {stream}")]
    Consumer {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: async_nats::Error,
    },
    /// A pump's message stream ended.
    #[error("the pull of {consumer} ended")]
    Ended {
        /// The consumer.
        consumer: String,
    },
    /// A pull stayed silent past two idle heartbeats: the broker holds no pull of ours. The
    /// actor fails, and its restart pulls anew (async-nats alone would wait for the pull's
    /// expiry plus 5 s).
    #[error("the pull of {consumer} went silent")]
    Silent {
        /// The consumer.
        consumer: String,
    },
    /// A pump failed.
    #[error("expiry pump failed")]
    Pump(#[source] PumpFailure),
}

#[ractor::async_trait]
impl Actor for Expiry {
    type Msg = ExpiryMsg;
    type State = ExpiryState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ExpiryMsg>,
        _: (),
    ) -> Result<ExpiryState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let counters = Arc::new(ExpiryCounters::default());
        let (stop, stop_rx) = watch::channel(false);
        let js = jetstream::new(self.client.clone());
        let (audit, audit_flusher) = if self.delivery.audit_events {
            let (audit, flusher) =
                crate::audit::Auditor::spawn(self.client.clone(), "router", &self.name);
            (audit, Some(flusher))
        } else {
            (crate::audit::Auditor::off(), None)
        };
        let pump = ExpiryPump {
            name: self.name.clone(),
            js: js.clone(),
            delivery: self.delivery.clone(),
            counters: counters.clone(),
            audit,
        };
        let due = pull_of(
            &js,
            subjects::SCHEDULES_STREAM,
            subjects::EXPIRY_CONSUMER,
            subjects::DUE_FILTER,
            self.delivery.ack_wait(),
        )
        .await?;
        let advisories = pull_of(
            &js,
            subjects::ADVISORIES_STREAM,
            subjects::ADVISORIES_CONSUMER,
            "",
            self.delivery.ack_wait(),
        )
        .await?;
        let on_fail = |myself: ActorRef<ExpiryMsg>| {
            move |e| {
                let _ = myself.cast(ExpiryMsg::PumpFailed(e));
            }
        };
        let pumps = vec![
            crate::background::spawn_pump(
                pump.clone().due(due, stop_rx.clone()),
                on_fail(myself.clone()),
            ),
            crate::background::spawn_pump(pump.advisories(advisories, stop_rx), on_fail(myself)),
        ];
        Ok(ExpiryState {
            counters,
            stop,
            pumps,
            audit_flusher,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<ExpiryMsg>,
        state: &mut ExpiryState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop.send(true);
        for pump in state.pumps.drain(..) {
            crate::background::join_within(pump, Duration::from_secs(2)).await;
        }
        if let Some(flusher) = state.audit_flusher.take() {
            crate::background::join_within(flusher, Duration::from_secs(1)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<ExpiryMsg>,
        msg: ExpiryMsg,
        state: &mut ExpiryState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            ExpiryMsg::Snapshot(port) => {
                let _ = port.send(state.counters.snapshot());
            }
            ExpiryMsg::PumpFailed(e) => return Err(ExpiryError::Pump(e).into()),
        }
        Ok(())
    }
}

/// Creates (or updates) the pull consumer `name` of `stream` with `filter` (none when empty)
/// and opens its message stream.
async fn pull_of(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    filter: &str,
    ack_wait: Duration,
) -> Result<jetstream::consumer::pull::Stream, ExpiryError> {
    let failed = |source: async_nats::Error| ExpiryError::Consumer {
        stream: stream.to_owned(),
        consumer: name.to_owned(),
        source,
    };
    let consumer: jetstream::consumer::PullConsumer = js
        .create_consumer_on_stream(
            pull::Config {
                durable_name: Some(name.to_owned()),
                filter_subject: filter.to_owned(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait,
                max_deliver: MAX_DELIVER,
                ..Default::default()
            },
            stream,
        )
        .await
        .map_err(|e| failed(e.into()))?;
    consumer
        .stream()
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| failed(e.into()))
}

/// What the pumps need.
#[derive(Clone)]
struct ExpiryPump {
    /// The actor's name (the fault-injection key).
    name: String,
    js: jetstream::Context,
    delivery: Arc<DeliveryConfig>,
    counters: Arc<ExpiryCounters>,
    audit: crate::audit::Auditor,
}

/// What became of one check or advisory.
enum Handled {
    /// Done (a notice stored, or nothing to tell): ack.
    Done,
    /// It will never decode: terminate.
    Malformed,
    /// A broker request failed: nak with a delay, tried again.
    Retry,
}

impl ExpiryPump {
    async fn due(
        self,
        mut messages: jetstream::consumer::pull::Stream,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), ExpiryError> {
        while let Some(msg) = next(&mut messages, &mut stop, subjects::EXPIRY_CONSUMER).await? {
            let handled = if msg.subject.as_str() == subjects::ANSWER_DUE_SUBJECT {
                match serde_json::from_slice::<protocol::expiry::AnswerCheck>(&msg.payload) {
                    Ok(check) => self.answer_check(check).await,
                    Err(_) => Handled::Malformed,
                }
            } else {
                match serde_json::from_slice::<ExpiryCheck>(&msg.payload) {
                    Ok(check) => self.check(check).await,
                    Err(_) => Handled::Malformed,
                }
            };
            self.settle(&msg, handled).await;
        }
        Ok(())
    }

    /// The deadline of `check` has come: tells its sender unless the inbox fetched the DM.
    async fn check(&self, check: ExpiryCheck) -> Handled {
        self.counters.checks.bump();
        let consumer = subjects::inbox_consumer(&check.to);
        let delivered = match self
            .js
            .get_consumer_from_stream::<pull::Config, _, _>(&consumer, &self.delivery.inbox.name)
            .await
        {
            Ok(mut c) => match c.info().await {
                Ok(info) => Some(info.delivered.stream_sequence),
                Err(e) => {
                    tracing::warn!(error = %ErrorChain(&e), %consumer, "expiry check: no consumer info; tried again");
                    return Handled::Retry;
                }
            },
            Err(e) if crate::consumers::is_consumer_not_found(&e) => None,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), %consumer, "expiry check: consumer lookup failed; tried again");
                return Handled::Retry;
            }
        };
        if !notify_at_deadline(check.inbox_seq, delivered) {
            self.counters.fetched.bump();
            return Handled::Done;
        }
        self.notify(&check.from, &check.to, &check.id, check.inbox_seq)
            .await
    }

    async fn advisories(
        self,
        mut messages: jetstream::consumer::pull::Stream,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), ExpiryError> {
        while let Some(msg) = next(&mut messages, &mut stop, subjects::ADVISORIES_CONSUMER).await? {
            self.counters.advisories.bump();
            let handled = match serde_json::from_slice::<Advisory>(&msg.payload) {
                Ok(a) if a.stream == subjects::WORK_STREAM && a.kind == MAX_DELIVER_ADVISORY => {
                    self.dead_letter_task(&a).await
                }
                Ok(a) if a.stream != self.delivery.inbox.name => Handled::Done,
                Ok(a) if a.kind == MAX_DELIVER_ADVISORY => {
                    self.dead_letter(&a, "max_deliver").await
                }
                Ok(a) if a.reason == TERM_REASON => self.expired_in_inbox(&a).await,
                Ok(a) if a.reason.starts_with(REJECTED_PREFIX) => {
                    let reason = protocol::headers::one_line(&a.reason, MAX_REASON_BYTES);
                    self.dead_letter(&a, &reason).await
                }
                // Other terminations (a malformed DM, ...) are counted by the inbox.
                Ok(_) => Handled::Done,
                Err(_) => Handled::Malformed,
            };
            self.settle(&msg, handled).await;
        }
        Ok(())
    }

    /// The DM the advisory `a` is about, with its recipient and envelope: `Err` is what to do
    /// with the advisory when it cannot be read (gone: nothing; a failed request: retry), or is
    /// not the recipient's own consumer's (a client chooses the sequence in the ack subject it
    /// terminates with, and nats-server does not check it: a termination by one identity's
    /// consumer of another's DM is ignored).
    async fn read_dm(
        &self,
        a: &Advisory,
    ) -> Result<
        (
            jetstream::message::StreamMessage,
            protocol::AgentId,
            protocol::Envelope,
        ),
        Handled,
    > {
        let inbox_seq = a.stream_seq;
        let stream = self
            .js
            .get_stream_no_info(&self.delivery.inbox.name)
            .await
            .map_err(|_| Handled::Retry)?;
        let stored = match stream.direct_get(inbox_seq).await {
            Ok(stored) => stored,
            Err(e) if e.kind() == jetstream::stream::DirectGetErrorKind::NotFound => {
                self.counters.notices_lost.bump();
                tracing::warn!(
                    inbox_seq,
                    "an undelivered DM is gone before its sender could be told"
                );
                return Err(Handled::Done);
            }
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), inbox_seq, "cannot read an undelivered DM; tried again");
                return Err(Handled::Retry);
            }
        };
        let env = crate::decode::envelope(Some(&stored.headers), &stored.payload);
        let (Ok(env), Ok(to)) = (env, subjects::parse_inbox(&stored.subject)) else {
            return Err(Handled::Malformed);
        };
        if a.consumer != subjects::inbox_consumer(&to) {
            self.counters.foreign.bump();
            tracing::warn!(consumer = %a.consumer, %to, inbox_seq, "an advisory about a DM of another inbox than its consumer's is ignored");
            return Err(Handled::Done);
        }
        Ok((stored, to, env))
    }

    /// An inbox terminated the DM of advisory `a` as expired: tells its sender, when the DM's
    /// deadline has come indeed (within [`CLOCK_SKEW_MS`]).
    async fn expired_in_inbox(&self, a: &Advisory) -> Handled {
        let inbox_seq = a.stream_seq;
        let (_, to, env) = match self.read_dm(a).await {
            Ok(dm) => dm,
            Err(handled) => return handled,
        };
        let now = protocol::expiry::now_ms().saturating_add(CLOCK_SKEW_MS);
        if env.meta.expires_at().is_none_or(|at| at > now) {
            self.counters.foreign.bump();
            tracing::warn!(%to, inbox_seq, "a termination as expired of a DM whose deadline has not come is ignored");
            return Handled::Done;
        }
        let Some(from) = env.meta.from else {
            // A system notice has no sender to tell.
            return Handled::Done;
        };
        self.notify(&from, &to, &env.meta.id, inbox_seq).await
    }

    /// The DM at `inbox_seq` cannot be delivered (`reason`: its deliveries ran out, or its
    /// handler rejected it): copies it to the dead-letter stream (`dlq.<recipient>`, with its
    /// original subject, sequence, reason and delivery count), then tells its sender. The copy
    /// is stored under `hub-dlq:<inbox seq>`, so a retry after a crash stores it once.
    async fn dead_letter(&self, a: &Advisory, reason: &str) -> Handled {
        let (inbox_seq, deliveries) = (a.stream_seq, a.deliveries);
        // Crash tests: dies (as with kill -9) with the advisory taken and nothing stored.
        if fault::check(&self.name, FaultPoint::DeadLetter).is_err() {
            return Handled::Retry;
        }
        let (stored, to, env) = match self.read_dm(a).await {
            Ok(dm) => dm,
            Err(handled) => return handled,
        };
        let copied = crate::dead_letter::copy_dm(&self.js, &to, &stored, reason, deliveries).await;
        if copied.is_err() {
            return Handled::Retry;
        }
        self.counters.dead_lettered.bump();
        tracing::warn!(%to, id = %env.meta.id, inbox_seq, reason, deliveries, "DM dead-lettered");
        self.audit.emit(
            self.audit
                .msg("dead_lettered", env.meta.id.as_str())
                .attempt(deliveries)
                .details(protocol::audit::Details {
                    inbox_seq: Some(inbox_seq),
                    reason: Some(reason.to_owned()),
                    ..Default::default()
                }),
        );
        let Some(from) = env.meta.from else {
            return Handled::Done;
        };
        let (subject, msg_id, notice) =
            protocol::rejection::undeliverable_notice(&from, &to, &env.meta.id, inbox_seq, reason);
        self.store_notice(subject, msg_id, &notice).await
    }

    /// Stores the notice that `from`'s DM `id` to `to` expired unread.
    async fn notify(
        &self,
        from: &protocol::AgentId,
        to: &protocol::AgentId,
        id: &protocol::MessageId,
        inbox_seq: u64,
    ) -> Handled {
        let (subject, msg_id, notice) =
            protocol::rejection::expired_notice(from, to, id, inbox_seq);
        let handled = self.store_notice(subject, msg_id, &notice).await;
        if matches!(handled, Handled::Done) {
            tracing::info!(%from, %to, %id, inbox_seq, "expired DM: its sender was told");
            self.audit
                .emit(
                    self.audit
                        .msg("expired", id.as_str())
                        .details(protocol::audit::Details {
                            inbox_seq: Some(inbox_seq),
                            ..Default::default()
                        }),
                );
        }
        handled
    }

    /// Stores a system notice in its recipient's inbox under `msg_id`.
    async fn store_notice(
        &self,
        subject: String,
        msg_id: String,
        notice: &protocol::Envelope,
    ) -> Handled {
        match crate::dead_letter::store_notice(&self.js, subject, &msg_id, notice).await {
            NoticeStored::Stored => {
                self.counters.notices.bump();
                Handled::Done
            }
            NoticeStored::Dropped => {
                self.counters.notices_dropped.bump();
                Handled::Done
            }
            NoticeStored::Failed => Handled::Retry,
            NoticeStored::Unencodable => Handled::Malformed,
        }
    }

    async fn settle(&self, msg: &jetstream::Message, handled: Handled) {
        let kind = match handled {
            Handled::Done => AckKind::Ack,
            Handled::Malformed => {
                self.counters.malformed.bump();
                AckKind::Term
            }
            Handled::Retry => {
                self.counters.retries.bump();
                AckKind::Nak(Some(RETRY_DELAY))
            }
        };
        if let Err(e) = msg.ack_with(kind).await {
            tracing::warn!(error = %ErrorChain(&*e), "expiry: ack failed; redelivered later");
        }
    }
}

/// The next message of a pump's consumer `consumer`; `None` once `stop` turns true. A pull
/// error is logged and pulled past (the message stream re-issues its pulls).
///
/// # Errors
/// [`ExpiryError::Ended`] when the message stream ends.
async fn next(
    messages: &mut jetstream::consumer::pull::Stream,
    stop: &mut watch::Receiver<bool>,
    consumer: &str,
) -> Result<Option<jetstream::Message>, ExpiryError> {
    loop {
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Ok(None);
                }
            }
            next = messages.next() => match next {
                Some(Ok(msg)) => return Ok(Some(msg)),
                Some(Err(e)) if e.kind() == MessagesErrorKind::MissingHeartbeat => {
                    return Err(ExpiryError::Silent {
                        consumer: consumer.to_owned(),
                    })
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %ErrorChain(&e), consumer, "pull error; the stream pulls again");
                }
                None => {
                    return Err(ExpiryError::Ended {
                        consumer: consumer.to_owned(),
                    })
                }
            },
        }
    }
}

/// The `type` of a max-deliveries advisory.
const MAX_DELIVER_ADVISORY: &str = "io.nats.jetstream.advisory.v1.max_deliver";
/// How an inbox's rejection reason starts (`rejected: <the handler's reason>`).
const REJECTED_PREFIX: &str = "rejected";

/// The fields of a termination (`io.nats.jetstream.advisory.v1.terminated`) or max-deliveries
/// advisory the actor reads.
#[derive(serde::Deserialize)]
struct Advisory {
    #[serde(rename = "type")]
    kind: String,
    stream: String,
    #[serde(default)]
    consumer: String,
    stream_seq: u64,
    #[serde(default)]
    deliveries: u64,
    #[serde(default)]
    reason: String,
}
