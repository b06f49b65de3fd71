//! The inbox consumer (client side): attaches to the hub, binds the durable consumer
//! `inbox-<id>` (or falls back to a core subscription), and hands each DM to the handler once,
//! in stream-sequence order, acking it after the handler returned.
//!
//! Mode (`NATS_HUB_DURABLE_INBOX`): `auto` requests attach; on "no responders" (a core hub) it
//! subscribes to `channel.inbox.<id>` at once; when no router answers in time it binds
//! `inbox-<id>` directly if it exists. `on` never falls back to core; `off` never attaches.
//!
//! An inbox is a task child of a dynamic supervisor ([`InboxConsumer::task_spec`],
//! [`crate::supervision::task`]), not an actor: a host of thousands of agents pays for every
//! actor's mailboxes (docs/CAPACITY.md). Each incarnation is one task that binds, then runs
//! the pump inline, until its stop signal or a failure; the supervisor restarts it with its
//! own backoff and intensity, and gives up on it alone. What the inboxes of a connection share
//! (pulls, presence beats, the audit flusher, the server's clock) is in [`InboxShared`]; what
//! one inbox shows is its [`InboxView`].
//!
//! A restart re-runs the attach and re-binds; the consumer resumes after the last acked DM,
//! and the dedupe set drops what the previous incarnation handled but did not ack... within
//! its own memory only: a fresh incarnation starts with an empty set (see docs/SEMANTICS.md).
//!
//! Read receipts (`meta.requires_ack`) that cannot be sent at once wait in the incarnation's
//! outbox and are tried again until stored ([`outbox`]).

mod outbox;
mod presence;
mod pulls;
mod pump;
mod shared;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use protocol::attach::{
    attach_fallback, attach_fallback_on_durable_hub, when_consumer_missing, AttachOutcome,
    AttachResponse, DurableInboxMode, InboxFailure, InboxPlan,
};
use protocol::{subjects, AgentId, Envelope};
use serde::{Deserialize, Serialize};

use crate::clock::ClockView;
use crate::fault::{self, FaultPoint};
use crate::supervision::task::{StopSignal, TaskSpec};
pub use outbox::CAPACITY as RECEIPT_OUTBOX_CAPACITY;
pub use pulls::{InboxPulls, PullsError};
pub use pump::{InboxCounters, InboxCountersSnapshot, PumpError};
pub use shared::InboxShared;
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

/// Inbox consumer configuration: one agent's inbox. Its incarnations run as a task child
/// ([`InboxConsumer::task_spec`]).
#[derive(Clone)]
pub struct InboxConsumer {
    /// Its child id, also the fault-injection key and the name its clock's test skew goes by.
    pub name: String,
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
    /// What the connection's inboxes share: the connection, one subscription for every pull,
    /// the presence beats, the audit flusher, the server's clock ([`InboxShared`]).
    pub shared: InboxShared,
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

/// What one attached inbox shows, across its incarnations: the snapshot of the incarnation
/// that is bound now, none while it binds, restarts or is given up. Read without a round trip
/// (no mailbox to ask).
#[derive(Default)]
pub struct InboxView {
    bound: Mutex<Option<Bound>>,
    /// Wakes those waiting for a binding.
    changed: tokio::sync::Notify,
}

/// What a bound incarnation shows.
struct Bound {
    binding: Binding,
    counters: Arc<InboxCounters>,
    clock: ClockView,
}

/// Clears an incarnation's view when dropped.
struct Shown<'a>(&'a InboxView);

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

impl InboxView {
    /// The snapshot of `id`'s incarnation bound now, if one is.
    pub fn snapshot(&self, id: &AgentId) -> Option<InboxSnapshot> {
        let bound = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        bound.as_ref().map(|b| InboxSnapshot {
            id: id.to_string(),
            binding: b.binding.clone(),
            counters: b.counters.snapshot(),
            clock_offset_ms: b.clock.offset_ms(),
        })
    }

    /// Whether an incarnation is bound now.
    pub fn is_bound(&self) -> bool {
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Waits until an incarnation is bound, at most `within`; returns whether one is.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_bound(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.is_bound() {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    fn set(&self, bound: Option<Bound>) {
        *self.bound.lock().unwrap_or_else(|e| e.into_inner()) = bound;
        self.changed.notify_waiters();
    }
}

/// Inbox failures: an incarnation that ends with one is restarted by its supervisor.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// Attach was refused or no durable inbox could be bound.
    #[error("cannot bind the inbox of {id}")]
    Bind {
        /// Whose inbox.
        id: String,
        /// Why.
        #[source]
        source: BindError,
    },
    /// The pump failed.
    #[error("inbox pump failed")]
    Pump(#[source] PumpError),
    /// A fault armed for this inbox's start fired (tests).
    #[error(transparent)]
    Fault(#[from] fault::FaultError),
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

impl InboxConsumer {
    /// The task child that runs this inbox, each incarnation showing itself in `view`.
    pub fn task_spec(self, view: Arc<InboxView>) -> TaskSpec {
        let name = self.name.clone();
        let inbox = Arc::new(self);
        TaskSpec::new(name, move |stop| inbox.clone().run(stop, view.clone()))
    }

    /// One incarnation: binds, then hands DMs over until `stop` (a clean stop: the DM in hand
    /// is finished and acked, the read receipts waiting get one more try, the agent is marked
    /// offline) or a failure (what it held is dropped: the supervisor restarts it).
    ///
    /// Not an `async fn`: its future holds the inbox once, and a host of many inboxes holds
    /// one such future per idle inbox.
    ///
    /// # Errors
    /// [`InboxError`] when it cannot bind or its pump fails.
    #[allow(clippy::manual_async_fn)]
    pub fn run(
        self: Arc<Self>,
        stop: StopSignal,
        view: Arc<InboxView>,
    ) -> impl std::future::Future<Output = Result<(), InboxError>> + Send + 'static {
        async move {
            fault::check(&self.name, FaultPoint::PreStart)?;
            // Boxed: the bind's requests are not held by an idle inbox's future.
            let binding = tokio::select! {
                biased;
                () = stop.stopped() => return Ok(()),
                bound = Box::pin(self.bind()) => bound?,
            };
            let counters = Arc::new(InboxCounters::default());
            let durable = matches!(binding, Binding::Durable { .. });
            let clock = match &binding {
                Binding::Durable { stream, consumer } => {
                    self.shared.clock(&self.name, stream, consumer)
                }
                Binding::Core => ClockView::unmeasured(&self.name),
            };
            let beats = match (&binding, self.presence_beat) {
                (Binding::Durable { .. }, Some(every)) => {
                    Some(self.shared.beat(&self.id, every, counters.clone()))
                }
                _ => None,
            };
            view.set(Some(Bound {
                binding: binding.clone(),
                counters: counters.clone(),
                clock: clock.clone(),
            }));
            // Cleared when this incarnation ends, however it ends (an abort too).
            let shown = Shown(&view);
            tracing::info!(id = %self.id, ?binding, "inbox bound");
            // Only a durable inbox emits audit events and sends receipts (nothing is acked in
            // core mode).
            let pump =
                pump::InboxPump::new(self.clone(), counters, durable && self.audit_events, clock);
            // A panic (the handler's) fails this incarnation as an error would, here, so that
            // it ends as any failure does (its view cleared, its parts dropped).
            let pumped = std::panic::AssertUnwindSafe(pump.run(binding, &stop))
                .catch_unwind()
                .await
                .unwrap_or(Err(PumpError::Panicked));
            drop(shown);
            pumped.map_err(InboxError::Pump)?;
            // A clean stop. Boxed: only a stopping inbox holds it.
            Box::pin(async move {
                // Once the pump is done (it queues no more): one try to flush the outbox.
                pump.close().await;
                if let Some(beats) = beats {
                    // A clean stop says so at once (a crash leaves the last beat to time out).
                    beats.offline().await;
                }
            })
            .await;
            Ok(())
        }
    }

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
        let request = self.shared.client().request(subject, Vec::new().into());
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
        let js = self.shared.js();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle inbox's task holds is its incarnation's future, once per idle inbox of a
    /// host (docs/CAPACITY.md): bound here, so that a change that makes it hold a DM's
    /// handling, a publish or itself twice (an `async move` block around it) is seen.
    #[tokio::test]
    async fn an_idle_inbox_s_future_stays_small() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let inbox = InboxConsumer {
            name: "small".into(),
            id: AgentId::new("bob").unwrap(),
            mode: DurableInboxMode::On,
            inbox_stream: "HUB_INBOX".into(),
            hub_durable: true,
            attach_timeout: Duration::from_secs(1),
            batch: 256,
            handler: Arc::new(|_| Box::pin(async { Handled::Done })),
            presence_beat: Some(Duration::from_secs(20)),
            audit_events: true,
            shared: InboxShared::new(client, "small/clock"),
        };
        let spec = inbox.clone().task_spec(Arc::default());
        // As the supervisor boxes it.
        let boxed = (spec.start)(StopSignal::new());
        let size = std::mem::size_of_val(&*boxed);
        assert!(size <= 1_536, "an idle inbox's future: {size} bytes");
        let direct = Arc::new(inbox).run(StopSignal::new(), Arc::default());
        assert!(
            size <= std::mem::size_of_val(&direct) + 64,
            "held once: {size} against {}",
            std::mem::size_of_val(&direct)
        );
    }
}
