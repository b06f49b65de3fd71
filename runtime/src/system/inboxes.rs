//! Inboxes in an [`ActorSystem`]: `attach_inbox`, `detach_inbox` and their snapshots.
//!
//! Every attached inbox is a task child of the system's one inbox supervisor (a dynamic
//! supervisor, started by the first attach; [`actors::supervision::task`]), restarted on its
//! own with its own backoff and restart intensity: a handler that fails restarts that inbox
//! alone, and an inbox that fails past its intensity is given up alone. A task, not an actor,
//! and one supervisor for all, not one each, because a host of thousands of agents pays for
//! every actor (docs/CAPACITY.md). A host attaches many agents concurrently (an inbox binds on
//! its own task, not in its supervisor's mailbox), detaches any of them, and a shutdown stops
//! them together ([`INBOX_STOP_CONCURRENCY`] at a time).

use std::time::Duration;

use std::sync::Arc;

use actors::inbox::{Delivery, Handled, InboxConsumer, InboxHandler, InboxSnapshot, InboxView};
use actors::supervision::{dynamic, DynamicRef, Restart};
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::AgentId;

use super::{ActorSystem, SystemError};

/// How long an inbox waits for an attach reply before trying the existing consumer.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(2);
/// DMs pulled per request by an inbox consumer.
pub const INBOX_BATCH: usize = 256;
/// How many inboxes a shutdown stops at once (each flushes its outbox and writes its offline
/// marker as it stops).
pub const INBOX_STOP_CONCURRENCY: usize = 256;

impl ActorSystem {
    /// Starts `id`'s inbox consumer under the system's inbox supervisor. The handler is called once per
    /// DM, in order; the DM is acked when the handler's future completes. The binding follows
    /// the system's inbox mode (`auto` by default; see [`actors::inbox`]).
    ///
    /// A host of many agents may attach them concurrently (each attach waits on its own
    /// round trips to the router, which serves attaches concurrently).
    ///
    /// # Errors
    /// [`SystemError::AlreadyAttached`] when `id`'s inbox is attached here already,
    /// [`SystemError::Spawn`] when the supervisor cannot be spawned, [`SystemError::Timeout`]
    /// when the inbox does not bind within 30 s (it keeps trying under its supervisor, and
    /// [`detach_inbox`](Self::detach_inbox) stops it). An inbox that failed past its restart
    /// intensity is given up and stops, but stays attached in name (listed, and a new attach
    /// refused) until it is detached.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may leave the inbox started (attached), which
    /// [`detach_inbox`](Self::detach_inbox) or [`shutdown`](Self::shutdown) stops.
    pub async fn attach_inbox<F, Fut, R>(&self, id: &AgentId, handler: F) -> Result<(), SystemError>
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = R> + Send + 'static,
        R: Into<Handled> + 'static,
    {
        let view = Arc::new(InboxView::default());
        {
            let mut inboxes = self.inboxes.lock().await;
            if inboxes.contains_key(id) {
                return Err(SystemError::AlreadyAttached { id: id.clone() });
            }
            inboxes.insert(id.clone(), view.clone());
        }
        let started = self.start_inbox(id, handler, view.clone()).await;
        if started.is_err() {
            self.inboxes.lock().await.remove(id);
        }
        started?;
        if !view.wait_bound(super::START_DEADLINE).await {
            return Err(SystemError::Timeout {
                what: format!("the inbox of {id} to bind"),
            });
        }
        Ok(())
    }

    /// Adds `id`'s inbox to the inbox supervisor, showing itself in `view`.
    async fn start_inbox<F, Fut, R>(
        &self,
        id: &AgentId,
        handler: F,
        view: Arc<InboxView>,
    ) -> Result<(), SystemError>
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = R> + Send + 'static,
        R: Into<Handled> + 'static,
    {
        let (holds, owner) = (self.holds.clone(), id.clone());
        let handler: InboxHandler = std::sync::Arc::new(move |d| {
            // A refusal for a limit (a system envelope) tells this sender what to hold back.
            if protocol::is_system(&d.envelope) {
                if let Some(rejection) = protocol::parse_rejection(&d.envelope) {
                    holds.note(&owner, &rejection);
                }
            }
            let done = handler(d);
            Box::pin(async move { done.await.into() })
        });
        let inbox = InboxConsumer {
            name: self.inbox_name(id),
            id: id.clone(),
            mode: self.inbox_mode,
            inbox_stream: self.delivery.inbox.name.clone(),
            hub_durable: self.durable,
            attach_timeout: ATTACH_TIMEOUT,
            batch: INBOX_BATCH,
            handler,
            presence_beat: self.durable.then(|| self.delivery.presence_beat()),
            audit_events: self.delivery.audit_events,
            shared: self.inbox_shared.clone(),
        };
        let child = inbox.task_spec(view).with_restart(Restart::Permanent);
        let supervisor = self.inbox_supervisor().await?;
        dynamic::add_task(&supervisor, child)
            .await
            .map_err(|e| SystemError::spawn(&self.inbox_name(id), e))
    }

    /// Stops `id`'s inbox consumer and releases everything it held here: its task, its slot in
    /// the shared pulls, its presence beat and its timers. The DM in hand is finished and acked first, the read receipts
    /// still waiting get one more try, and the agent's presence is marked offline (as at a
    /// shutdown). Within `grace`; an inbox that does not stop in time is killed, and what it
    /// had not acked is redelivered to its next attach.
    ///
    /// The agent's durable inbox stays on the hub: DMs sent to it meanwhile wait there, and a
    /// later [`attach_inbox`](Self::attach_inbox), here or in another process, resumes after
    /// the last DM acked.
    ///
    /// Attaches and detaches of different identities may run concurrently; those of one
    /// identity must follow one another (a detach while that identity's attach still runs
    /// may leave the inbox running until the shutdown).
    ///
    /// # Errors
    /// [`SystemError::NotAttached`] when no inbox of `id` is attached here.
    ///
    /// # Cancel safety
    /// Cancel safe as to the hub (what was not acked is redelivered); a cancelled call may
    /// leave the inbox stopping in the background.
    pub async fn detach_inbox(&self, id: &AgentId, grace: Duration) -> Result<(), SystemError> {
        if self.inboxes.lock().await.remove(id).is_none() {
            return Err(SystemError::NotAttached { id: id.clone() });
        }
        self.stop_inbox(id, grace).await;
        // Its last audit events out now, not a flush window later (a host may exit next).
        self.inbox_shared.flush_audit().await;
        Ok(())
    }

    /// Removes `id`'s inbox from its supervisor and stops it within `grace`.
    async fn stop_inbox(&self, id: &AgentId, grace: Duration) {
        let supervisor = self
            .inbox_supervisor
            .lock()
            .await
            .as_ref()
            .map(|(sup, _)| sup.clone());
        if let Some(supervisor) = supervisor {
            if let Err(e) = dynamic::remove_child(&supervisor, &self.inbox_name(id), grace).await {
                tracing::warn!(%id, error = %ErrorChain(&e), "inbox not removed from its supervisor");
            }
        }
    }

    /// The identities whose inboxes are attached here, sorted.
    pub async fn attached_inboxes(&self) -> Vec<AgentId> {
        let mut ids: Vec<AgentId> = self.inboxes.lock().await.keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// The snapshot of `id`'s inbox consumer, while it is bound (none while it binds,
    /// restarts or is given up).
    pub async fn inbox_snapshot(&self, id: &AgentId) -> Option<InboxSnapshot> {
        let view = self.inboxes.lock().await.get(id)?.clone();
        view.snapshot(id)
    }

    /// The inboxes' dynamic supervisor, started on first use, and again if it ever stopped.
    async fn inbox_supervisor(&self) -> Result<DynamicRef, SystemError> {
        super::dynamic_supervisor(&self.inbox_supervisor, format!("{}/inboxes", self.id)).await
    }

    /// Stops every attached inbox, [`INBOX_STOP_CONCURRENCY`] at a time, then their supervisor
    /// (a shutdown).
    pub(super) async fn stop_inboxes(&self, grace: Duration) {
        let ids: Vec<AgentId> = self
            .inboxes
            .lock()
            .await
            .drain()
            .map(|(id, _)| id)
            .collect();
        futures::stream::iter(ids)
            .for_each_concurrent(INBOX_STOP_CONCURRENCY, |id| async move {
                self.stop_inbox(&id, grace).await
            })
            .await;
        if let Some((sup, join)) = self.inbox_supervisor.lock().await.take() {
            sup.stop(Some("system shutdown".into()));
            let _ = join.await;
        }
        // What the inboxes emitted as they stopped, before the connection is flushed.
        self.inbox_shared.flush_audit().await;
    }
}
