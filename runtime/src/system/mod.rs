//! [`ActorSystem`]: the embedding API. A custom host builds one, starts the parts it needs and
//! shuts it down; the `runtime` binary is such a host.
//!
//! Messaging (`send`, `broadcast`) is in [`messaging`]; inboxes (`attach_inbox`, `detach_inbox`)
//! are in [`inboxes`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), runtime::SystemError> {
//! use runtime::{ActorSystem, NatsSettings};
//! let system = ActorSystem::builder()
//!     .nats(NatsSettings::new("nats://127.0.0.1:4222"))
//!     .durable(true)
//!     .build()
//!     .await?;
//! system.start_router().await?;
//! println!("{:?}", system.snapshot().await?);
//! system.shutdown(std::time::Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actors::attach::Attach;
use actors::inbox::InboxSnapshot;
use actors::router::{Router, RouterMsg, RouterSnapshot};
use actors::supervision::{
    self, ChildSpec, DynamicRef, DynamicSnapshot, Strategy, SupervisorRef, SupervisorSnapshot,
    SupervisorSpec,
};
use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::{AgentId, WorkerId};
use ractor::concurrency::JoinHandle;
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

mod builder;
pub mod control;
mod error;
mod holds;
mod idempotency;
pub mod inboxes;
pub mod messaging;
pub mod presence;
pub mod removal;
mod status;
pub mod tasks;
pub mod trace;
pub mod worker;

pub use builder::ActorSystemBuilder;
pub use error::{BoxError, SystemError};
pub use status::{request_status, request_worker_status};

/// How long [`ActorSystem::start_router`] waits for the router to come up.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a local snapshot call may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);
/// What [`ActorSystem::shutdown`] is given beyond its grace: to hand back what did not finish,
/// stop the other trees and flush.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(3);

static NEXT_SYSTEM: AtomicU64 = AtomicU64::new(1);

/// The dynamic supervisor in `slot`, named `name`: started on first use, and again if it ever
/// stopped.
async fn dynamic_supervisor(
    slot: &Mutex<Option<(DynamicRef, JoinHandle<()>)>>,
    name: String,
) -> Result<DynamicRef, SystemError> {
    use actors::supervision::{DynamicSupervisor, Intensity};
    let mut slot = slot.lock().await;
    if let Some((sup, _)) = slot.as_ref() {
        // Alive: starting (a fresh spawn may not be `Running` yet), running or upgrading.
        if sup.get_status() < ractor::ActorStatus::Draining {
            return Ok(sup.clone());
        }
    }
    // A stopped supervisor may still hold its registry name for a moment.
    if let Some((old, join)) = slot.take() {
        old.stop(None);
        let _ = join.await;
    }
    let (sup, join) = DynamicSupervisor::spawn(name.clone(), Intensity::default())
        .await
        .map_err(|e| SystemError::spawn(&name, e))?;
    *slot = Some((sup.clone(), join));
    Ok(sup)
}

/// One supervision tree started by the system.
struct Tree {
    name: String,
    /// The worker this tree runs, if it is a worker's.
    worker: Option<WorkerId>,
    supervisor: SupervisorRef,
    join: JoinHandle<()>,
}

/// The runtime embedded in a host: one NATS connection and the supervision trees started on it.
pub struct ActorSystem {
    id: String,
    client: async_nats::Client,
    durable: bool,
    delivery: Arc<DeliveryConfig>,
    /// The root of the reply subjects its services answer on (the connection's inbox prefix).
    reply_prefix: String,
    inbox_mode: DurableInboxMode,
    trees: Mutex<Vec<Tree>>,
    /// The identities whose inboxes are attached, with what each shows ([`inboxes`]).
    inboxes: Mutex<HashMap<AgentId, Arc<actors::inbox::InboxView>>>,
    /// The inboxes' dynamic supervisor, started by the first attach.
    inbox_supervisor: Mutex<Option<(DynamicRef, JoinHandle<()>)>>,
    /// The dynamic supervisor of the trackers' actor, started by the first `track`.
    trackers: Mutex<Option<(DynamicRef, JoinHandle<()>)>>,
    /// The tasks tracked, kept across the trackers' restarts.
    tracker_table: Arc<actors::tracker::TrackerTable>,
    /// What its inboxes share: one subscription for their pulls, one task for their presence
    /// beats, one audit flusher, one server clock.
    inbox_shared: actors::inbox::InboxShared,
    /// What refusals for a limit told its senders to hold back, and until when.
    holds: Arc<holds::Holds>,
    /// The recipients' presence it read lately (a send's receipt names it).
    presence: presence::PresenceCache,
    /// How long an ingress publish is sent again while unacknowledged
    /// ([`messaging::INGRESS_RETRY_WINDOW`] unless the builder set it).
    ingress_retry_window: std::time::Duration,
}

/// Snapshot of everything an [`ActorSystem`] runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemSnapshot {
    /// The system id (unique in the process; prefixes every actor name).
    pub system: String,
    /// Durable or core mode.
    pub durable: bool,
    /// The router, when one runs.
    pub router: Option<RouterSnapshot>,
    /// Every inbox consumer by identity.
    pub inboxes: BTreeMap<String, InboxSnapshot>,
    /// Every supervisor by name, with its children's restart counts.
    pub supervisors: BTreeMap<String, SupervisorSnapshot>,
    /// The dynamic supervisor of the trackers' actor, once a task was tracked.
    #[serde(default)]
    pub trackers: Option<DynamicSnapshot>,
    /// Tasks tracked now.
    #[serde(default)]
    pub tracked_tasks: usize,
    /// The trackers' actor (its reads, what it ignored), while it runs.
    #[serde(default)]
    pub tracking: Option<actors::tracker::TrackersSnapshot>,
    /// The inboxes' dynamic supervisor (each inbox its child, restarted on its own), once an
    /// inbox was attached.
    #[serde(default)]
    pub inbox_supervisor: Option<DynamicSnapshot>,
}

/// The snapshot of the dynamic supervisor in `slot`, when one runs.
async fn dynamic_snapshot(
    slot: &Mutex<Option<(DynamicRef, JoinHandle<()>)>>,
    what: &str,
) -> Result<Option<DynamicSnapshot>, SystemError> {
    let sup = slot.lock().await.as_ref().map(|(sup, _)| sup.clone());
    match sup {
        Some(sup) => Ok(Some(supervision::dynamic::snapshot(&sup).await.map_err(
            |e| SystemError::Timeout {
                what: format!("{what}: {e}"),
            },
        )?)),
        None => Ok(None),
    }
}

impl ActorSystem {
    /// A builder with defaults: `nats://127.0.0.1:4222`, core mode, default delivery config.
    pub fn builder() -> ActorSystemBuilder {
        ActorSystemBuilder::default()
    }

    /// The system id, unique in this process; every actor name starts with it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The shared NATS connection.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The actor name of the router (for fault injection in tests).
    pub fn router_name(&self) -> String {
        format!("{}/router", self.id)
    }

    /// The actor name of the attach actor (durable mode).
    pub fn attach_name(&self) -> String {
        format!("{}/attach", self.id)
    }

    /// The actor name of the expiry actor (durable mode).
    pub fn expiry_name(&self) -> String {
        format!("{}/expiry", self.id)
    }

    /// The actor name of the history actor (durable mode).
    pub fn history_name(&self) -> String {
        format!("{}/history", self.id)
    }

    /// The actor name of the consumer watchdog (durable mode).
    pub fn watchdog_name(&self) -> String {
        format!("{}/watchdog", self.id)
    }

    /// The actor name of `id`'s inbox consumer.
    pub fn inbox_name(&self, id: &AgentId) -> String {
        format!("{}/inbox-{id}", self.id)
    }

    /// Starts the router under its own one-for-one supervisor and waits until it answers.
    ///
    /// In durable mode the streams are provisioned first, here, so that a fatal problem (a
    /// retention policy that cannot be changed, JetStream disabled) is returned to the caller
    /// instead of being retried by the supervisor.
    ///
    /// # Errors
    /// [`SystemError::Streams`], [`SystemError::Spawn`] or [`SystemError::Timeout`].
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may leave a started router that only
    /// [`shutdown`](Self::shutdown) stops.
    pub async fn start_router(&self) -> Result<(), SystemError> {
        if self.durable {
            let js = async_nats::jetstream::new(self.client.clone());
            actors::streams::ensure_streams(&js, &self.delivery).await?;
        }
        // The router asks the history actor for a round when it refuses a DM for read history.
        let nudge = actors::history::Nudge::default();
        let watchdog_counters = Arc::new(actors::watchdog::WatchdogCounters::default());
        let router = Router {
            name: self.router_name(),
            client: self.client.clone(),
            durable: self.durable,
            delivery: self.delivery.clone(),
            reply_prefix: self.reply_prefix.clone(),
            history: nudge.clone(),
            watchdog: (self.durable && self.delivery.consumer_watchdog_secs > 0)
                .then(|| watchdog_counters.clone()),
        };
        let mut spec = SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(
            self.router_name(),
            router,
            || (),
        ));
        if self.durable {
            let attach = Attach {
                name: self.attach_name(),
                client: self.client.clone(),
                delivery: self.delivery.clone(),
                reply_prefix: self.reply_prefix.clone(),
            };
            spec = spec.child(ChildSpec::actor(self.attach_name(), attach, || ()));
            let expiry = actors::expiry::Expiry {
                name: self.expiry_name(),
                client: self.client.clone(),
                delivery: self.delivery.clone(),
            };
            spec = spec.child(ChildSpec::actor(self.expiry_name(), expiry, || ()));
            let history = actors::history::History {
                name: self.history_name(),
                client: self.client.clone(),
                delivery: self.delivery.clone(),
                nudge,
            };
            spec = spec.child(ChildSpec::actor(self.history_name(), history, || ()));
            if self.delivery.consumer_watchdog_secs > 0 {
                let watchdog = actors::watchdog::Watchdog {
                    name: self.watchdog_name(),
                    client: self.client.clone(),
                    delivery: self.delivery.clone(),
                    interval: Duration::from_secs(self.delivery.consumer_watchdog_secs),
                    counters: watchdog_counters,
                };
                spec = spec.child(ChildSpec::actor(self.watchdog_name(), watchdog, || ()));
            }
        }
        self.spawn_tree(format!("{}/router-sup", self.id), spec)
            .await?;
        // The router provisions the streams again as it starts, through an election if one
        // comes: it may take the whole retry window before it answers.
        let deadline = tokio::time::Instant::now()
            + START_DEADLINE
            + if self.durable {
                actors::streams::PROVISION_RETRY_WINDOW
            } else {
                Duration::ZERO
            };
        loop {
            if self.router_snapshot().await.is_some() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(SystemError::Timeout {
                    what: "the router to start".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Spawns a supervision tree and remembers it for snapshots and shutdown.
    async fn spawn_tree(&self, name: String, spec: SupervisorSpec) -> Result<(), SystemError> {
        self.spawn_tree_of(name, spec, None).await
    }

    /// Spawns a supervision tree (of `worker`, when it runs one).
    async fn spawn_tree_of(
        &self,
        name: String,
        spec: SupervisorSpec,
        worker: Option<WorkerId>,
    ) -> Result<(), SystemError> {
        let (supervisor, join) = supervision::spawn_supervisor(Some(name.clone()), spec)
            .await
            .map_err(|e| SystemError::spawn(&name, e))?;
        self.trees.lock().await.push(Tree {
            name,
            worker,
            supervisor,
            join,
        });
        Ok(())
    }

    async fn router_snapshot(&self) -> Option<RouterSnapshot> {
        let cell = ractor::registry::where_is(self.router_name())?;
        let router: ActorRef<RouterMsg> = cell.into();
        ractor::call_t!(
            router,
            RouterMsg::Snapshot,
            SNAPSHOT_TIMEOUT.as_millis() as u64
        )
        .ok()
    }

    /// The history actor's counters (trim rounds, inboxes and DMs trimmed), when this system
    /// runs a durable router.
    pub async fn history_snapshot(&self) -> Option<actors::history::HistorySnapshot> {
        let cell = ractor::registry::where_is(self.history_name())?;
        let history: ActorRef<actors::history::HistoryMsg> = cell.into();
        ractor::call_t!(
            history,
            actors::history::HistoryMsg::Snapshot,
            SNAPSHOT_TIMEOUT.as_millis() as u64
        )
        .ok()
    }

    /// A snapshot of every actor: the router's counters and each supervisor's restart counts.
    ///
    /// # Errors
    /// [`SystemError::Timeout`] when a supervisor does not answer.
    pub async fn snapshot(&self) -> Result<SystemSnapshot, SystemError> {
        let mut supervisors = BTreeMap::new();
        let named: Vec<(String, SupervisorRef)> = self
            .trees
            .lock()
            .await
            .iter()
            .map(|t| (t.name.clone(), t.supervisor.clone()))
            .collect();
        for (name, supervisor) in named {
            let snap =
                supervision::snapshot(&supervisor)
                    .await
                    .map_err(|e| SystemError::Timeout {
                        what: format!("supervisor {name}: {e}"),
                    })?;
            supervisors.insert(name, snap);
        }
        let mut inboxes = BTreeMap::new();
        for id in self.attached_inboxes().await {
            if let Some(snap) = self.inbox_snapshot(&id).await {
                inboxes.insert(id.to_string(), snap);
            }
        }
        let trackers = dynamic_snapshot(&self.trackers, "the trackers' supervisor").await?;
        let inbox_supervisor =
            dynamic_snapshot(&self.inbox_supervisor, "the inboxes' supervisor").await?;
        Ok(SystemSnapshot {
            system: self.id.clone(),
            durable: self.durable,
            router: self.router_snapshot().await,
            inboxes,
            supervisors,
            trackers,
            tracked_tasks: self.tracker_table.len(),
            tracking: self.trackers_snapshot().await,
            inbox_supervisor,
        })
    }

    /// Stops everything, then flushes the connection:
    ///
    /// 1. every worker stops taking input at once (what it fetched and did not start is
    ///    handed back, for other workers);
    /// 2. the workers stop together: each lets its running attempts finish within its own
    ///    shutdown grace, then hands back the inputs of the rest;
    /// 3. the trackers, then the inboxes together ([`inboxes::INBOX_STOP_CONCURRENCY`] at a
    ///    time), then every other supervision tree (children first), in the reverse order of
    ///    their start.
    ///
    /// `grace` bounds each stop; the whole shutdown is given `grace` plus
    /// [`SHUTDOWN_SLACK`].
    ///
    /// # Errors
    /// [`SystemError::Timeout`] when that ran out; everything is stopped anyway.
    pub async fn shutdown(self, grace: Duration) -> Result<(), SystemError> {
        let work = async {
            let trees = std::mem::take(&mut *self.trees.lock().await);
            let (workers, others): (Vec<Tree>, Vec<Tree>) =
                trees.into_iter().partition(|t| t.worker.is_some());
            let drains = workers.iter().filter_map(|t| t.worker.as_ref()).map(|id| {
                let name = self.worker_name(id);
                async move {
                    if let Some(cell) = ractor::registry::where_is(name) {
                        let worker: ActorRef<actors::worker::WorkerMsg> = cell.into();
                        let _ = ractor::call_t!(
                            worker,
                            actors::worker::WorkerMsg::Drain,
                            SNAPSHOT_TIMEOUT.as_millis() as u64
                        );
                    }
                }
            });
            futures::future::join_all(drains).await;
            futures::future::join_all(workers.into_iter().map(|tree| async move {
                supervision::shutdown(&tree.supervisor, grace).await;
                let _ = tree.join.await;
            }))
            .await;
            if let Some((sup, join)) = self.trackers.lock().await.take() {
                sup.stop(Some("system shutdown".into()));
                let _ = join.await;
            }
            // Every caller still waiting for a result sees its sender gone.
            self.tracker_table.clear();
            self.stop_inboxes(grace).await;
            for tree in others.into_iter().rev() {
                supervision::shutdown(&tree.supervisor, grace).await;
                let _ = tree.join.await;
            }
            let _ = self.client.flush().await;
        };
        let budget = grace + SHUTDOWN_SLACK;
        tokio::time::timeout(budget, work)
            .await
            .map_err(|_| SystemError::Timeout {
                what: format!("a graceful shutdown within {budget:?}"),
            })
    }
}
