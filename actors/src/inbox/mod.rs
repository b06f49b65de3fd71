//! The inbox consumer actor (client side): attaches to the hub, binds the durable consumer
//! `inbox-<id>` (or falls back to a core subscription), and hands each DM to the handler once,
//! in stream-sequence order, acking it after the handler returned.
//!
//! Mode (`NATS_HUB_DURABLE_INBOX`): `auto` requests attach; on "no responders" (a core hub) it
//! subscribes to `channel.inbox.<id>` at once; when no router answers in time it binds
//! `inbox-<id>` directly if it exists. `on` never falls back to core; `off` never attaches.
//!
//! A restart (supervisor) re-runs the attach and re-binds; the consumer resumes after the last
//! acked DM, and the dedupe set drops what the previous incarnation handled but did not ack...
//! within its own memory only: a fresh incarnation starts with an empty set (see
//! docs/SEMANTICS.md).
//!
//! Read receipts (`meta.requires_ack`) that cannot be sent at once wait in the incarnation's
//! outbox and are tried again until stored ([`outbox`]).

mod outbox;
mod presence;
mod pulls;
mod pump;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use futures::future::BoxFuture;
use protocol::attach::{
    attach_fallback, attach_fallback_on_durable_hub, when_consumer_missing, AttachOutcome,
    AttachResponse, DurableInboxMode, InboxFailure, InboxPlan,
};
use protocol::{subjects, AgentId, Envelope};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::background::Owned;
use crate::fault::{self, FaultPoint};
pub use outbox::CAPACITY as RECEIPT_OUTBOX_CAPACITY;
pub use pulls::{InboxPulls, PullsError};
pub use pump::{InboxCounters, InboxCountersSnapshot};

/// One DM handed to the handler.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The envelope (`meta.from` was set by the router).
    pub envelope: Envelope,
    /// Stream sequence in `HUB_INBOX` (durable mode).
    pub stream_seq: Option<u64>,
    /// How many times the server delivered it (1 = first time; durable mode).
    pub delivered: u64,
    /// It was delivered before (`delivered > 1`): a retry the handler asked for, or a
    /// redelivery after a lost ack.
    pub redelivered: bool,
    /// Its stream sequence is below that of a DM this inbox handed over before it (a late
    /// redelivery; [`protocol::ordering`]).
    pub out_of_order: bool,
}

/// What a handler made of a DM (a handler returning `()` is done with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Done: the DM is acked.
    Done,
    /// Not now: the DM is nak'd with this delay, and handed over again after it (flagged
    /// `redelivered`, and `out_of_order` when later DMs were handed over meanwhile).
    Retry(std::time::Duration),
    /// Never: the DM is terminated at once with this reason (one line).
    Reject(String),
}

impl From<()> for Handled {
    fn from((): ()) -> Handled {
        Handled::Done
    }
}

/// The handler: called once per DM, sequentially; the DM is settled as the outcome says when
/// the future completes.
pub type InboxHandler = Arc<dyn Fn(Delivery) -> BoxFuture<'static, Handled> + Send + Sync>;

/// Inbox consumer configuration.
#[derive(Clone)]
pub struct InboxConsumer {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The connection.
    pub client: Client,
    /// Whose inbox.
    pub id: AgentId,
    /// auto, on or off.
    pub mode: DurableInboxMode,
    /// The inbox stream (`HUB_INBOX` unless configured otherwise).
    pub inbox_stream: String,
    /// The client knows the hub is durable: in `auto` mode, "no responders" then means the
    /// router is down and the existing `inbox-<id>` is bound (not a core fallback).
    pub hub_durable: bool,
    /// How long to wait for an attach reply.
    pub attach_timeout: Duration,
    /// DMs pulled per request (also the bound on DMs held unacked by this client).
    pub batch: usize,
    /// Called once per DM.
    pub handler: InboxHandler,
    /// How often a durable inbox writes its agent's presence ([`protocol::presence`]); `None`
    /// writes none.
    pub presence_beat: Option<Duration>,
    /// Whether a durable inbox emits audit events ([`crate::audit`]).
    pub audit_events: bool,
    /// The pulls of the connection's durable inboxes, shared by all of them ([`InboxPulls`]:
    /// one subscription for every inbox of `client`).
    pub pulls: InboxPulls,
}

/// Messages of the inbox actor.
pub enum InboxMsg {
    /// Snapshot for a local caller: answered once the inbox is bound (until then the port is
    /// dropped, and the call fails).
    Snapshot(RpcReplyPort<InboxSnapshot>),
    /// Attach and bind (each incarnation sends it to itself from `pre_start`, so that a
    /// supervisor that starts many inboxes does not wait on their round trips).
    Bind,
    /// The pump stopped with an error: fail so that the supervisor restarts the actor.
    PumpFailed(crate::background::PumpFailure),
}

/// How the inbox is bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    /// Durable consumer (attached by a router, or bound directly).
    Durable {
        /// Stream.
        stream: String,
        /// Consumer.
        consumer: String,
    },
    /// Core subscription on `channel.inbox.<id>`.
    Core,
}

/// Snapshot of an inbox consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxSnapshot {
    /// Whose inbox.
    pub id: String,
    /// How it is bound.
    pub binding: Binding,
    /// Counters of this incarnation.
    pub counters: InboxCountersSnapshot,
    /// The server's clock minus this process's, ms, as last measured (durable bindings;
    /// deadlines are judged in server time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<i64>,
}

/// State of one incarnation: nothing until it is bound.
pub struct InboxState(Option<Bound>);

/// What a bound incarnation holds.
struct Bound {
    binding: Binding,
    pump: Option<Owned>,
    /// Publishes the pump's audit events.
    audit_flusher: Option<Owned>,
    /// The presence beats (a durable binding with a beat only).
    presence: Option<Owned>,
    /// The outbox of read receipts and its retry task (a durable binding only).
    receipts: Option<outbox::ReceiptOutbox>,
    stop: tokio::sync::watch::Sender<bool>,
    counters: Arc<InboxCounters>,
    /// Server time, and the task that measures it (a durable binding only; held, it ends
    /// with the state).
    clock: Arc<crate::clock::ServerClock>,
    _clock_refresh: Option<Owned>,
}

/// Inbox failures.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// Attach was refused or no durable inbox could be bound.
    #[error("cannot bind the inbox of {id}: {source}")]
    Bind {
        /// Whose inbox.
        id: String,
        /// Why.
        #[source]
        source: BindError,
    },
    /// The pump failed.
    #[error("inbox pump failed: {0}")]
    Pump(#[source] crate::background::PumpFailure),
}

/// Why no inbox could be bound ([`InboxError::Bind`]).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The attach outcome and the mode say give up.
    #[error(transparent)]
    Plan(#[from] InboxFailure),
    /// The plan still named an existing consumer after it was looked up.
    #[error("consumer {consumer} does not exist and no router answered")]
    NoConsumer {
        /// The consumer.
        consumer: String,
    },
}

/// The name under which an inbox actor named `name` checks the fault point `Handle` for its
/// own messages (snapshots, pump failures); `name` itself is its pump's, checked per DM.
pub fn actor_fault_name(name: &str) -> String {
    format!("{name}.actor")
}

#[ractor::async_trait]
impl Actor for InboxConsumer {
    type Msg = InboxMsg;
    type State = InboxState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<InboxMsg>,
        _: (),
    ) -> Result<InboxState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        myself.cast(InboxMsg::Bind)?;
        Ok(InboxState(None))
    }

    async fn post_stop(
        &self,
        _: ActorRef<InboxMsg>,
        state: &mut InboxState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(state) = state.0.as_mut() else {
            return Ok(());
        };
        let _ = state.stop.send(true);
        if let Some(pump) = state.pump.take() {
            // The pump finishes the DM in hand (acks it) and stops pulling.
            pump.join_within(Duration::from_secs(5)).await;
        }
        if let Some(receipts) = state.receipts.take() {
            // Once the pump is gone (it queues no more): one try to flush the outbox, before
            // the audit flusher is joined (its `read` events go out with the rest).
            receipts.close().await;
        }
        if let Some(flusher) = state.audit_flusher.take() {
            flusher.join_within(Duration::from_secs(1)).await;
        }
        if let (Some(beats), Some(every)) = (state.presence.take(), self.presence_beat) {
            beats.abort().await;
            // A clean stop says so at once (a crash leaves the last beat to time out).
            let js = async_nats::jetstream::new(self.client.clone());
            let record = protocol::presence::PresenceRecord::offline(
                protocol::expiry::now_ms(),
                every.as_secs(),
            );
            if let Err(e) = presence::write(&js, &self.id, &record).await {
                tracing::warn!(id = %self.id, error = %e, "offline marker not stored");
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<InboxMsg>,
        msg: InboxMsg,
        state: &mut InboxState,
    ) -> Result<(), ActorProcessingErr> {
        // The fault point `Handle` under the inbox's name is its pump's, per DM (see
        // `pump.rs`); the actor's own messages, all but its bind, check it under
        // `actor_fault_name`.
        if !matches!(msg, InboxMsg::Bind) {
            fault::check(&actor_fault_name(&self.name), FaultPoint::Handle)?;
        }
        match msg {
            InboxMsg::Bind => {
                if state.0.is_none() {
                    // A failed bind fails the incarnation: its supervisor starts another,
                    // which attaches again.
                    state.0 = Some(self.start(myself).await?);
                }
            }
            InboxMsg::Snapshot(port) => {
                if let Some(state) = &state.0 {
                    let _ = port.send(InboxSnapshot {
                        id: self.id.to_string(),
                        binding: state.binding.clone(),
                        counters: state.counters.snapshot(),
                        clock_offset_ms: state.clock.offset_ms(),
                    });
                }
            }
            InboxMsg::PumpFailed(reason) => return Err(InboxError::Pump(reason).into()),
        }
        Ok(())
    }
}

impl InboxConsumer {
    /// Binds, then starts the pump and the tasks beside it.
    async fn start(&self, myself: ActorRef<InboxMsg>) -> Result<Bound, InboxError> {
        let binding = self.bind().await?;
        let counters = Arc::new(InboxCounters::default());
        let durable = matches!(binding, Binding::Durable { .. });
        let (audit, audit_flusher) = if durable && self.audit_events {
            let (audit, flusher) =
                crate::audit::Auditor::spawn(self.client.clone(), "inbox", self.id.as_str());
            (audit, Some(flusher))
        } else {
            (crate::audit::Auditor::off(), None)
        };
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let clock = crate::clock::ServerClock::new(&self.name);
        let clock_refresh = match &binding {
            Binding::Durable { stream, consumer } => Some(Owned::spawn(clock.clone().refresh(
                self.client.clone(),
                protocol::subjects::consumer_info_request(stream, consumer),
            ))),
            Binding::Core => None,
        };
        let receipts_out = outbox::Outbox::new(outbox::CAPACITY, counters.clone());
        let sender = outbox::ReceiptSender::new(self.client.clone(), &self.id);
        // Only a durable inbox sends receipts (nothing is acked in core mode).
        let receipts = durable.then(|| {
            outbox::ReceiptOutbox::spawn(receipts_out.clone(), sender.clone(), audit.clone())
        });
        let pump = pump::InboxPump {
            client: self.client.clone(),
            id: self.id.clone(),
            handler: self.handler.clone(),
            counters: counters.clone(),
            batch: self.batch,
            fault_name: self.name.clone(),
            audit,
            clock: clock.clone(),
            outbox: receipts_out,
            receipts: sender,
            pulls: self.pulls.clone(),
        };
        let pump = crate::background::spawn_pump(pump.run(binding.clone(), stop_rx), move |e| {
            let _ = myself.cast(InboxMsg::PumpFailed(e));
        });
        let presence = match (&binding, self.presence_beat) {
            (Binding::Durable { .. }, Some(every)) => Some(Owned::spawn(presence::beat(
                async_nats::jetstream::new(self.client.clone()),
                self.id.clone(),
                every,
                counters.clone(),
            ))),
            _ => None,
        };
        tracing::info!(id = %self.id, ?binding, "inbox bound");
        Ok(Bound {
            binding,
            pump: Some(pump),
            audit_flusher,
            presence,
            receipts,
            stop,
            counters,
            clock,
            _clock_refresh: clock_refresh,
        })
    }
}

impl InboxConsumer {
    /// Attach (unless off), then decide how to bind.
    async fn bind(&self) -> Result<Binding, InboxError> {
        let fail = |source: BindError| InboxError::Bind {
            id: self.id.to_string(),
            source,
        };
        let plan = if self.mode == DurableInboxMode::Off {
            InboxPlan::CoreSubscribe
        } else {
            let outcome = self.request_attach().await;
            if self.hub_durable {
                attach_fallback_on_durable_hub(self.mode, &self.id, outcome)
            } else {
                attach_fallback(self.mode, &self.id, outcome)
            }
        };
        let plan = match plan {
            InboxPlan::BindExisting { consumer } => {
                if self.consumer_exists(&consumer).await {
                    InboxPlan::BindDurable {
                        stream: self.inbox_stream.clone(),
                        consumer,
                    }
                } else {
                    when_consumer_missing(self.mode)
                }
            }
            other => other,
        };
        match plan {
            InboxPlan::BindDurable { stream, consumer } => {
                Ok(Binding::Durable { stream, consumer })
            }
            InboxPlan::CoreSubscribe => Ok(Binding::Core),
            InboxPlan::BindExisting { consumer } => Err(fail(BindError::NoConsumer { consumer })),
            InboxPlan::Fail(failure) => Err(fail(failure.into())),
        }
    }

    async fn request_attach(&self) -> AttachOutcome {
        let subject = subjects::attach_request(&self.id);
        let request = self.client.request(subject, Vec::new().into());
        match tokio::time::timeout(self.attach_timeout, request).await {
            Err(_) => AttachOutcome::Timeout,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                AttachOutcome::NoResponders
            }
            Ok(Err(_)) => AttachOutcome::Timeout,
            Ok(Ok(reply)) => match serde_json::from_slice::<AttachResponse>(&reply.payload) {
                Ok(AttachResponse::Attached(reply)) => AttachOutcome::Attached(reply),
                Ok(AttachResponse::Refused { error }) => AttachOutcome::Refused(error),
                Err(e) => AttachOutcome::Refused(protocol::WireError::new(
                    protocol::WireErrorKind::Malformed,
                    format!("unreadable attach reply: {e}"),
                )),
            },
        }
    }

    async fn consumer_exists(&self, consumer: &str) -> bool {
        let js = async_nats::jetstream::new(self.client.clone());
        // Consumer info only: an agent may not read the stream's info.
        let lookup = async {
            js.get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                consumer,
                &self.inbox_stream,
            )
            .await
            .ok()
        };
        matches!(
            tokio::time::timeout(self.attach_timeout, lookup).await,
            Ok(Some(_))
        )
    }
}
