//! The core pump: plain core-NATS routing, no JetStream request of any kind.
//!
//! Routers share the queue group `hub-router` on `hub.pub.>`, so each envelope is routed by one
//! of them. Every destination, stored or not, is a core publish: an offline recipient misses it
//! (that is what durable mode is for).

use std::sync::Arc;

use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::rejection::rejection;
use protocol::routing::{route, RouteDecision};
use protocol::subjects;
use protocol::Codec;
use tokio::sync::watch;
use tracing::Instrument;

use super::counters::RouterCounters;
use super::outbound::{header_pairs, routed_headers, view};
use super::RouterError;

/// Queue group of core routers.
pub const CORE_QUEUE_GROUP: &str = "hub-router";

/// What the core pump needs.
pub struct CorePump {
    /// The shared connection.
    pub client: async_nats::Client,
    /// Counters shared with the actor.
    pub counters: Arc<RouterCounters>,
    /// The router's actor name (fault-injection key, checked per envelope).
    pub fault_name: String,
}

impl CorePump {
    /// Subscribes and routes until `stop` turns true.
    ///
    /// # Errors
    /// [`RouterError::Subscribe`] when the subscription cannot be made,
    /// [`RouterError::PullEnded`] when it ends (connection closed).
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), RouterError> {
        let mut sub = self
            .client
            .queue_subscribe(subjects::INGRESS_FILTER, CORE_QUEUE_GROUP.to_string())
            .await
            .map_err(|source| RouterError::Subscribe {
                subject: subjects::INGRESS_FILTER,
                source,
            })?;
        let mut seq = 0u64;
        loop {
            tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                }
                next = sub.next() => match next {
                    Some(msg) => {
                        crate::fault::check(&self.fault_name, crate::fault::FaultPoint::Handle)?;
                        seq += 1;
                        self.route_one(msg, seq).await;
                    }
                    None => return Err(RouterError::PullEnded),
                },
            }
        }
        let _ = sub.unsubscribe().await;
        let _ = self.client.flush().await;
        Ok(())
    }

    async fn route_one(&self, msg: async_nats::Message, seq: u64) {
        let span = tracing::info_span!("route", seq, subject = %msg.subject);
        crate::trace_context::set_parent_from(&span, msg.headers.as_ref());
        async {
            let pairs = header_pairs(msg.headers.as_ref());
            let decision = route(&view(
                msg.subject.as_str(),
                &pairs,
                &msg.payload,
                seq,
                msg.status,
            ));
            let (subject, payload, codec) = match decision {
                RouteDecision::StoreAll {
                    subject,
                    items,
                    codec,
                    ..
                } => {
                    // Core mode stores nothing: the items go out live, in order.
                    for item in items {
                        self.counters.add_stored(false);
                        let headers = routed_headers(None, codec);
                        if let Err(e) = self
                            .client
                            .publish_with_headers(subject.clone(), headers, item.payload.into())
                            .await
                        {
                            tracing::warn!(error = %ErrorChain(&e), "core publish failed");
                        }
                    }
                    return;
                }
                RouteDecision::Store {
                    subject,
                    payload,
                    codec,
                    ..
                } => {
                    self.counters.add_stored(false);
                    (subject, payload, codec)
                }
                RouteDecision::Broadcast {
                    subject,
                    payload,
                    codec,
                    ..
                } => {
                    self.counters.broadcast.bump();
                    (subject, payload, codec)
                }
                RouteDecision::Reject {
                    sender,
                    rejected_id,
                    error,
                } => {
                    self.counters.malformed.bump();
                    let (subject, _, notice) =
                        rejection(&sender, rejected_id.as_ref(), &error, seq);
                    let Ok(payload) = protocol::encode(&notice, Codec::Json) else {
                        return;
                    };
                    self.counters.rejections_sent.bump();
                    (subject, payload, Codec::Json)
                }
                RouteDecision::Drop { .. } => {
                    self.counters.dropped_by_guard.bump();
                    return;
                }
            };
            let headers = routed_headers(None, codec);
            if let Err(e) = self
                .client
                .publish_with_headers(subject, headers, payload.into())
                .await
            {
                tracing::warn!(error = %ErrorChain(&e), "core publish failed");
            }
        }
        .instrument(span)
        .await
    }
}
