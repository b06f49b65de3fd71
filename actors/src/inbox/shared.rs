//! What the inboxes of one connection share, so that an idle inbox holds only its own state
//! (docs/CAPACITY.md): the pulls ([`InboxPulls`]: one subscription for all), one JetStream
//! context, the presence beats ([`super::presence`]: one task for all), one audit flusher
//! ([`AuditHub`]), and the server's clock ([`crate::clock`]: measured once for all, on the
//! consumer info of the inbox that registered last).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{jetstream, Client};
use protocol::AgentId;

use super::presence::{BeatGuard, PresenceBeats};
use super::{InboxCounters, InboxPulls};
use crate::audit::{AuditHub, Auditor};
use crate::background::Owned;
use crate::clock::{ClockView, ServerClock};

/// The shared parts of one connection's inboxes (cheap to clone); their tasks end when the
/// last clone goes.
#[derive(Clone)]
pub struct InboxShared(Arc<Inner>);

struct Inner {
    client: Client,
    js: jetstream::Context,
    pulls: InboxPulls,
    presence: PresenceBeats,
    audit: AuditHub,
    clock: Arc<ServerClock>,
    /// The consumer info request the clock is measured with: the last registered inbox's.
    clock_subject: Arc<Mutex<Option<String>>>,
    /// The clock's refresh task, started by the first durable inbox.
    clock_refresh: Mutex<Option<Owned>>,
}

impl InboxShared {
    /// The shared parts of `client`'s inboxes; `clock_name` names the clock (its test skew:
    /// [`crate::clock::skew_for_tests`]). Nothing runs until an inbox needs it, but the audit
    /// flusher, which waits idle (it must be called within a tokio runtime).
    pub fn new(client: Client, clock_name: &str) -> InboxShared {
        InboxShared(Arc::new(Inner {
            js: jetstream::new(client.clone()),
            pulls: InboxPulls::new(client.clone()),
            presence: PresenceBeats::new(jetstream::new(client.clone())),
            audit: AuditHub::new(client.clone()),
            clock: ServerClock::new(clock_name),
            clock_subject: Arc::default(),
            clock_refresh: Mutex::new(None),
            client,
        }))
    }

    /// The connection.
    pub fn client(&self) -> &Client {
        &self.0.client
    }

    /// The inboxes' JetStream context.
    pub(super) fn js(&self) -> &jetstream::Context {
        &self.0.js
    }

    /// The shared pulls.
    pub fn pulls(&self) -> &InboxPulls {
        &self.0.pulls
    }

    /// An audit emitter for `id`'s inbox, flushed with every other inbox's.
    pub(super) fn auditor(&self, id: &AgentId) -> Auditor {
        self.0.audit.emitter("inbox", id.as_str())
    }

    /// Publishes at once the audit events every inbox still holds (a shutdown's last flush).
    pub async fn flush_audit(&self) {
        self.0.audit.flush().await;
    }

    /// Beats `id`'s presence every `every` until the guard goes.
    pub(super) fn beat(
        &self,
        id: &AgentId,
        every: Duration,
        counters: Arc<InboxCounters>,
    ) -> BeatGuard {
        self.0.presence.register(id, every, counters)
    }

    /// The server's clock as the inbox named `name` sees it, measured from now on with the
    /// info of `consumer` of `stream` (until another inbox registers) once every
    /// [`REFRESH_EVERY`](crate::clock::REFRESH_EVERY), the first measure at once.
    pub(super) fn clock(&self, name: &str, stream: &str, consumer: &str) -> ClockView {
        *self
            .0
            .clock_subject
            .lock()
            .unwrap_or_else(|e| e.into_inner()) =
            Some(protocol::subjects::consumer_info_request(stream, consumer));
        let mut refresh = self
            .0
            .clock_refresh
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if refresh.as_ref().is_none_or(Owned::is_finished) {
            let subject = self.0.clock_subject.clone();
            *refresh = Some(crate::background::spawn(
                self.0
                    .clock
                    .clone()
                    .refresh(self.0.client.clone(), move || {
                        subject.lock().unwrap_or_else(|e| e.into_inner()).clone()
                    }),
            ));
        }
        ClockView::new(self.0.clock.clone(), name)
    }
}
