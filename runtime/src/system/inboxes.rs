//! Inboxes in an [`ActorSystem`]: `attach_inbox`, `detach_inbox` and their snapshots.
//!
//! Each attached inbox is its own supervision tree (a one-for-one supervisor of one inbox
//! actor), so a handler that fails restarts that inbox alone. The system keeps the trees by
//! identity: a host of many agents attaches them concurrently, detaches any of them, and a
//! shutdown stops them together ([`INBOX_STOP_CONCURRENCY`] at a time).

use std::time::Duration;

use actors::inbox::{Delivery, Handled, InboxConsumer, InboxHandler, InboxMsg, InboxSnapshot};
use actors::supervision::{self, ChildSpec, Strategy, SupervisorSpec};
use futures::StreamExt;
use protocol::AgentId;

use super::{ActorSystem, SystemError, Tree};

/// How long an inbox waits for an attach reply before trying the existing consumer.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(2);
/// DMs pulled per request by an inbox consumer.
pub const INBOX_BATCH: usize = 256;
/// How many inboxes a shutdown stops at once (each flushes its outbox and writes its offline
/// marker as it stops).
pub const INBOX_STOP_CONCURRENCY: usize = 256;
/// How often [`ActorSystem::attach_inbox`] looks whether the inbox is bound.
const BIND_POLL: Duration = Duration::from_millis(20);

impl ActorSystem {
    /// Starts `id`'s inbox consumer under its own supervisor. The handler is called once per
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
    /// [`detach_inbox`](Self::detach_inbox) stops it).
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
        if self.inboxes.lock().await.contains_key(id) {
            return Err(SystemError::AlreadyAttached { id: id.clone() });
        }
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
            client: self.client.clone(),
            id: id.clone(),
            mode: self.inbox_mode,
            inbox_stream: self.delivery.inbox.name.clone(),
            hub_durable: self.durable,
            attach_timeout: ATTACH_TIMEOUT,
            batch: INBOX_BATCH,
            handler,
            presence_beat: self.durable.then(|| self.delivery.presence_beat()),
            audit_events: self.delivery.audit_events,
        };
        let spec = SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(
            self.inbox_name(id),
            inbox,
            || (),
        ));
        let tree = self.start_tree(self.inbox_sup_name(id), spec, None).await?;
        self.inboxes.lock().await.insert(id.clone(), tree);
        let deadline = tokio::time::Instant::now() + super::START_DEADLINE;
        while self.inbox_snapshot(id).await.is_none() {
            if tokio::time::Instant::now() > deadline {
                return Err(SystemError::Timeout {
                    what: format!("the inbox of {id} to bind"),
                });
            }
            tokio::time::sleep(BIND_POLL).await;
        }
        Ok(())
    }

    /// Stops `id`'s inbox consumer and releases everything it held here: its actors, tasks,
    /// subscription and timers. The DM in hand is finished and acked first, the read receipts
    /// still waiting get one more try, and the agent's presence is marked offline (as at a
    /// shutdown). Within `grace`; an inbox that does not stop in time is killed, and what it
    /// had not acked is redelivered to its next attach.
    ///
    /// The agent's durable inbox stays on the hub: DMs sent to it meanwhile wait there, and a
    /// later [`attach_inbox`](Self::attach_inbox), here or in another process, resumes after
    /// the last DM acked.
    ///
    /// # Errors
    /// [`SystemError::NotAttached`] when no inbox of `id` is attached here.
    ///
    /// # Cancel safety
    /// Cancel safe as to the hub (what was not acked is redelivered); a cancelled call may
    /// leave the inbox stopping in the background.
    pub async fn detach_inbox(&self, id: &AgentId, grace: Duration) -> Result<(), SystemError> {
        let tree = self
            .inboxes
            .lock()
            .await
            .remove(id)
            .ok_or_else(|| SystemError::NotAttached { id: id.clone() })?;
        stop_tree(tree, grace).await;
        Ok(())
    }

    /// The identities whose inboxes are attached here, sorted.
    pub async fn attached_inboxes(&self) -> Vec<AgentId> {
        let mut ids: Vec<AgentId> = self.inboxes.lock().await.keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// The snapshot of `id`'s inbox consumer, when it runs.
    pub async fn inbox_snapshot(&self, id: &AgentId) -> Option<InboxSnapshot> {
        let cell = ractor::registry::where_is(self.inbox_name(id))?;
        let inbox: ractor::ActorRef<InboxMsg> = cell.into();
        ractor::call_t!(inbox, InboxMsg::Snapshot, 5_000).ok()
    }

    /// The name of `id`'s inbox supervisor.
    pub(super) fn inbox_sup_name(&self, id: &AgentId) -> String {
        format!("{}-sup", self.inbox_name(id))
    }

    /// Stops every attached inbox, [`INBOX_STOP_CONCURRENCY`] at a time (a shutdown).
    pub(super) async fn stop_inboxes(&self, grace: Duration) {
        let trees: Vec<Tree> = self.inboxes.lock().await.drain().map(|(_, t)| t).collect();
        futures::stream::iter(trees)
            .for_each_concurrent(INBOX_STOP_CONCURRENCY, |tree| stop_tree(tree, grace))
            .await;
    }
}

/// Stops one tree gracefully and waits until its supervisor is gone.
async fn stop_tree(tree: Tree, grace: Duration) {
    supervision::shutdown(&tree.supervisor, grace).await;
    let _ = tree.join.await;
}
