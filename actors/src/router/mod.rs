//! The router actor.
//!
//! On every (re)start it provisions the JetStream streams (durable mode only), starts its pump
//! (the [`durable`] pull pipeline, or the [`core`] subscription) and subscribes to
//! [`subjects::STATUS_SUBJECT`], answering each request with a [`RouterSnapshot`]. In core mode
//! it sends no JetStream request at all.
//!
//! The actor struct is configuration; everything mutable lives in [`RouterState`], so a restart
//! by the supervisor re-runs [`pre_start`](ractor::Actor::pre_start) from scratch: the streams
//! are provisioned again, the consumer is re-bound and the subscriptions are re-created. A pump
//! that fails (consumer deleted, connection closed) makes the actor fail, and its supervisor
//! restarts it.

pub mod core;
pub mod counters;
pub mod durable;
mod outbound;
mod outcome;
mod rate;
mod refusal;
mod schedule;
mod store_acks;
mod trail;

use std::sync::Arc;
use std::time::Instant;

use async_nats::Client;
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::subjects;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::audit::Auditor;
use crate::background::{spawn_pump, Owned};
use crate::fault::{self, FaultPoint};
use crate::streams::{ensure_streams, StreamReport};
pub use counters::{RouterCounters, RouterCountersSnapshot};
pub use schedule::Planned;

/// Router configuration (cloned into every incarnation).
#[derive(Clone)]
pub struct Router {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The shared NATS connection.
    pub client: Client,
    /// Durable (JetStream) or core mode.
    pub durable: bool,
    /// Stream and consumer limits.
    pub delivery: Arc<DeliveryConfig>,
    /// The root of the reply subjects requests are answered on (the requesters' connections'
    /// inbox prefix; [`subjects::DEFAULT_REPLY_PREFIX`], `_INBOX`, by default). A request with
    /// a reply elsewhere is counted and ignored.
    pub reply_prefix: String,
    /// Asks the system's history actor for a round when a DM is refused for an inbox's read
    /// history ([`crate::history`]).
    pub history: crate::history::Nudge,
    /// The counters of the process's consumer watchdog, when it runs one (durable mode).
    pub watchdog: Option<Arc<crate::watchdog::WatchdogCounters>>,
}

/// Router messages.
pub enum RouterMsg {
    /// Answer a status request on `reply`.
    StatusRequest {
        /// Where to publish the snapshot.
        reply: async_nats::Subject,
    },
    /// Return the snapshot to a local caller.
    Snapshot(RpcReplyPort<RouterSnapshot>),
    /// The pump stopped with an error: fail, so that the supervisor restarts the router.
    PumpFailed(crate::background::PumpFailure),
}

/// Mutable state of one incarnation.
pub struct RouterState {
    streams: Vec<StreamReport>,
    /// The status listener, owned so that it ends with this incarnation.
    status_task: Option<Owned>,
    pump: Option<Owned>,
    /// Publishes the pump's audit events (ends once the pump is gone).
    audit_flusher: Option<Owned>,
    /// The removed agents (durable mode) and the watch that keeps them current, owned so that
    /// it ends with this incarnation.
    removed: Option<(crate::removed::RemovedAgents, Owned)>,
    stop: tokio::sync::watch::Sender<bool>,
    counters: Arc<RouterCounters>,
    status_requests: u64,
    started: Instant,
}

/// A cheap serializable snapshot of a router, returned by status requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterSnapshot {
    /// The actor's name.
    pub name: String,
    /// Durable (JetStream) or core mode.
    pub durable: bool,
    /// Streams provisioned by this incarnation (empty in core mode).
    pub streams: Vec<StreamReport>,
    /// Status requests answered by this incarnation.
    pub status_requests: u64,
    /// Milliseconds since this incarnation started.
    pub uptime_ms: u64,
    /// Routing counters of this incarnation.
    pub counters: RouterCountersSnapshot,
    /// How many agents this incarnation knows as removed (durable mode; a DM to one is
    /// refused `recipient_deleted`).
    #[serde(default)]
    pub removed_agents: usize,
    /// The consumer watchdog's counters, when the process runs one ([`crate::watchdog`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<crate::watchdog::WatchdogSnapshot>,
}

/// Router failures.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// Stream provisioning failed.
    #[error(transparent)]
    Streams(#[from] crate::streams::StreamError),
    /// A fault armed for this router fired (tests).
    #[error(transparent)]
    Fault(#[from] crate::fault::FaultError),
    /// The router consumer could not be bound, or was deleted under the router.
    #[error("the router consumer failed")]
    Consumer(#[source] async_nats::Error),
    /// The senders' rate bucket could not be opened (`sender_rate_per_min` is set).
    #[error("cannot open the rate bucket")]
    RateBucket(#[source] async_nats::Error),
    /// The removed agents could not be read (they are known before anything is routed).
    #[error(transparent)]
    Removed(#[from] crate::removed::WatchError),
    /// The subscription of the pipeline's store acks could not be made.
    #[error("cannot subscribe to the router's store acks")]
    StoreAcks(#[source] async_nats::SubscribeError),
    /// The message stream or subscription ended (connection closed).
    #[error("the router's message stream ended")]
    PullEnded,
    /// The pump failed (reported through the actor).
    #[error("router pump failed")]
    Pump(#[source] crate::background::PumpFailure),
    /// The status subscription could not be made.
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        /// The subject.
        subject: &'static str,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
}

#[ractor::async_trait]
impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<RouterMsg>,
        _: (),
    ) -> Result<RouterState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let streams = if self.durable {
            let js = async_nats::jetstream::new(self.client.clone());
            ensure_streams(&js, &self.delivery)
                .await
                .map_err(RouterError::from)?
        } else {
            Vec::new()
        };
        let mut sub = self
            .client
            .subscribe(subjects::STATUS_SUBJECT)
            .await
            .map_err(|source| RouterError::Subscribe {
                subject: subjects::STATUS_SUBJECT,
                source,
            })?;
        let me = myself.clone();
        let counters = Arc::new(RouterCounters::default());
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut status_stop = stop_rx.clone();
        let status_task = crate::background::spawn(async move {
            loop {
                tokio::select! {
                    _ = status_stop.changed() => {
                        // Unsubscribed with an awaited command, queued before the stop's
                        // flush: dropping the subscriber instead sends its unsubscribe later
                        // when the connection's command queue is full.
                        let _ = sub.unsubscribe().await;
                        return;
                    }
                    next = sub.next() => match next {
                        Some(msg) => {
                            if let Some(reply) = msg.reply {
                                if me.cast(RouterMsg::StatusRequest { reply }).is_err() {
                                    return;
                                }
                            }
                        }
                        None => return,
                    },
                }
            }
        });
        let (audit, audit_flusher) = if self.durable && self.delivery.audit_events {
            let (audit, flusher) = Auditor::spawn(self.client.clone(), "router", &self.name);
            (audit, Some(flusher))
        } else {
            (Auditor::off(), None)
        };
        // Every tombstone is known before the first DM is routed.
        let removed = if self.durable {
            Some(
                crate::removed::watch(self.client.clone())
                    .await
                    .map_err(RouterError::from)?,
            )
        } else {
            None
        };
        let pump = if self.durable {
            let pump = durable::DurablePump {
                removed: removed.as_ref().map(|(r, _)| r.clone()).unwrap_or_default(),
                client: self.client.clone(),
                delivery: self.delivery.clone(),
                counters: counters.clone(),
                fault_name: self.name.clone(),
                known_queues: Default::default(),
                audit,
                history: self.history.clone(),
            };
            spawn_pump(pump.run(stop_rx), move |e| {
                let _ = myself.cast(RouterMsg::PumpFailed(e));
            })
        } else {
            let pump = core::CorePump {
                client: self.client.clone(),
                counters: counters.clone(),
                fault_name: self.name.clone(),
            };
            spawn_pump(pump.run(stop_rx), move |e| {
                let _ = myself.cast(RouterMsg::PumpFailed(e));
            })
        };
        tracing::info!(name = %self.name, durable = self.durable, "router started");
        Ok(RouterState {
            streams,
            status_task: Some(status_task),
            pump: Some(pump),
            audit_flusher,
            removed,
            stop,
            counters,
            status_requests: 0,
            started: Instant::now(),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<RouterMsg>,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        // Stop pulling, drain what is in flight (bounded), then return.
        let _ = state.stop.send(true);
        if let Some(pump) = state.pump.take() {
            let grace = durable::DRAIN_TIMEOUT + std::time::Duration::from_secs(1);
            crate::background::join_within(pump, grace).await;
        }
        // Its last audit events out (the pump's handle is gone with it).
        if let Some(flusher) = state.audit_flusher.take() {
            crate::background::join_within(flusher, std::time::Duration::from_secs(1)).await;
        }
        // The status subscription is gone (and the server told) before the actor is: a status
        // request after a shutdown finds no responders instead of a dead subscriber.
        if let Some(task) = state.status_task.take() {
            crate::background::join_within(task, std::time::Duration::from_secs(2)).await;
        }
        let _ = self.client.flush().await;
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<RouterMsg>,
        msg: RouterMsg,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            RouterMsg::StatusRequest { reply } => {
                let Some(reply) = crate::reply::answerable(
                    Some(&reply),
                    &self.reply_prefix,
                    subjects::STATUS_SUBJECT,
                    || state.counters.replies_refused.bump(),
                ) else {
                    return Ok(());
                };
                state.status_requests += 1;
                let body = serde_json::to_vec(&self.snapshot(state))?;
                if let Err(e) = self.client.publish(reply, body.into()).await {
                    tracing::warn!(error = %ErrorChain(&e), "cannot answer a status request");
                }
            }
            RouterMsg::Snapshot(port) => {
                let _ = port.send(self.snapshot(state));
            }
            RouterMsg::PumpFailed(reason) => {
                return Err(RouterError::Pump(reason).into());
            }
        }
        Ok(())
    }
}

impl Router {
    fn snapshot(&self, state: &RouterState) -> RouterSnapshot {
        RouterSnapshot {
            name: self.name.clone(),
            durable: self.durable,
            streams: state.streams.clone(),
            status_requests: state.status_requests,
            uptime_ms: state.started.elapsed().as_millis() as u64,
            counters: state.counters.snapshot(),
            removed_agents: state.removed.as_ref().map_or(0, |(r, _)| r.len()),
            watchdog: self.watchdog.as_ref().map(|w| w.snapshot()),
        }
    }
}
