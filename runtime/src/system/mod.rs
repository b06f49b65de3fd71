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
use std::sync::atomic::{AtomicU64, Ordering};
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
use protocol::subjects;
use protocol::{AgentId, WorkerId};
use ractor::concurrency::JoinHandle;
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

pub mod control;
mod holds;
mod idempotency;
pub mod inboxes;
pub mod messaging;
pub mod presence;
pub mod removal;
pub mod tasks;
pub mod trace;
pub mod worker;

use crate::config::ConfigLoadError;
use crate::connect::{ConnectError, NatsSettings};

/// How long [`ActorSystem::start_router`] waits for the router to come up.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a local snapshot call may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);
/// What [`ActorSystem::shutdown`] is given beyond its grace: to hand back what did not finish,
/// stop the other trees and flush.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(3);

static NEXT_SYSTEM: AtomicU64 = AtomicU64::new(1);

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Failures of the embedding API.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    /// The delivery config file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigLoadError),
    /// The connection settings are invalid or the server is unreachable.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Stream provisioning failed (including a retention policy that cannot be changed).
    #[error(transparent)]
    Streams(#[from] actors::streams::StreamError),
    /// An actor could not be spawned.
    #[error("cannot spawn {what}: {source}")]
    Spawn {
        /// Which actor.
        what: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// [`ActorSystem::attach_inbox`] of an identity whose inbox is attached here already.
    #[error("the inbox of {id} is attached already")]
    AlreadyAttached {
        /// The identity.
        id: AgentId,
    },
    /// [`ActorSystem::detach_inbox`] of an identity with no inbox attached here.
    #[error("no inbox of {id} is attached here")]
    NotAttached {
        /// The identity.
        id: AgentId,
    },
    /// An actor did not come up or answer in time.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What.
        what: String,
    },
    /// `runtime status` found no router on the server.
    #[error("no router answered on {subject} (is `runtime start --role router` running?)")]
    NoRouter {
        /// The status subject.
        subject: &'static str,
    },
    /// A NATS request failed, or its reply does not decode.
    #[error("request on {subject} failed: {source}")]
    Request {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A setting (environment variable or argument) has an invalid value.
    #[error("{0}")]
    InvalidSetting(String),
    /// A task the router would refuse (checked before anything is written or sent).
    #[error("invalid task: {0}")]
    InvalidTask(#[source] protocol::TaskError),
    /// A publish was not accepted by the ingress stream.
    #[error("publish to {subject} failed: {source}")]
    Publish {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The worker's journal is locked by another process or unreadable.
    #[error(transparent)]
    Journal(#[from] actors::journal::JournalError),
    /// A refusal for a limit told `from` to wait: its DMs to `to` (a full inbox), or all its
    /// DMs (`to` is `None`: over its rate), are held back for `retry_after_secs` more. Nothing
    /// was published; send again after that.
    #[error("{} for {retry_after_secs} s more", held_what(from, to.as_ref()))]
    Held {
        /// The sender held back.
        from: AgentId,
        /// The recipient whose inbox is full; `None` when the sender is over its rate.
        to: Option<AgentId>,
        /// Whole seconds left.
        retry_after_secs: u64,
    },
    /// The recipient was removed from the hub (`runtime agent remove`): nothing was
    /// published. Its tombstone is read before the send (cached for up to 5 s), so a send in
    /// the seconds after a removal may still be published, and then refused by the router
    /// with a `recipient_deleted` notice.
    #[error("recipient_deleted: {to} was removed from the hub")]
    RecipientDeleted {
        /// The removed recipient.
        to: AgentId,
    },
    /// The task is not in the state the operation needs (unknown, not waiting...).
    #[error("task {task_id}: {what}")]
    Task {
        /// The task.
        task_id: protocol::TaskId,
        /// What is the matter.
        what: String,
    },
}

fn held_what(from: &AgentId, to: Option<&AgentId>) -> String {
    match to {
        Some(to) => format!("the inbox of {to} is full: {from} may not send to it"),
        None => format!("{from} is over its rate: it may not send"),
    }
}

impl SystemError {
    /// An operator mistake in flags or config files: exit 64.
    pub fn is_usage(&self) -> bool {
        match self {
            SystemError::Config(_)
            | SystemError::InvalidSetting(_)
            | SystemError::InvalidTask(_)
            | SystemError::Journal(_) => true,
            SystemError::Connect(e) => e.is_usage(),
            SystemError::Streams(actors::streams::StreamError::RetentionMismatch { .. }) => true,
            _ => false,
        }
    }

    /// The server is unreachable or refused: exit 69.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            SystemError::Connect(_)
                | SystemError::Streams(_)
                | SystemError::NoRouter { .. }
                | SystemError::Request { .. }
                | SystemError::Publish { .. }
                | SystemError::Timeout { .. }
                | SystemError::Task { .. }
        ) && !self.is_usage()
    }

    pub(crate) fn request(subject: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Request {
            subject: subject.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn publish(subject: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Publish {
            subject: subject.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn spawn(what: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Spawn {
            what: what.to_owned(),
            source: source.into(),
        }
    }
}

/// Builder of an [`ActorSystem`].
#[derive(Debug, Default)]
pub struct ActorSystemBuilder {
    nats: Option<NatsSettings>,
    client: Option<async_nats::Client>,
    durable: bool,
    delivery: DeliveryConfig,
    inbox_prefix: Option<String>,
    inbox_mode: Option<DurableInboxMode>,
}

impl ActorSystemBuilder {
    /// How inbox consumers bind (default: `NATS_HUB_DURABLE_INBOX`, else `auto`).
    #[must_use]
    pub fn inbox_mode(mut self, mode: DurableInboxMode) -> Self {
        self.inbox_mode = Some(mode);
        self
    }

    /// Connect with these settings (URL, one auth method, connect timeout).
    #[must_use]
    pub fn nats(mut self, settings: NatsSettings) -> Self {
        self.nats = Some(settings);
        self
    }

    /// The inbox prefix of the connection given with [`client`](Self::client) (with
    /// [`nats`](Self::nats) it is the settings' `inbox_prefix`). The system's services answer
    /// requests only on reply subjects under it; default `_INBOX`.
    #[must_use]
    pub fn inbox_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.inbox_prefix = Some(prefix.into());
        self
    }

    /// Use an existing connection instead of connecting.
    #[must_use]
    pub fn client(mut self, client: async_nats::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Durable delivery over JetStream (default off: plain core NATS, no JetStream traffic).
    #[must_use]
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Stream and consumer limits (default: [`DeliveryConfig::default`]).
    #[must_use]
    pub fn delivery_config(mut self, delivery: DeliveryConfig) -> Self {
        self.delivery = delivery;
        self
    }

    /// Connects (unless a client was given) and returns the system, with nothing started yet.
    ///
    /// # Errors
    /// [`SystemError::Connect`] when the settings are invalid or the server is unreachable.
    pub async fn build(self) -> Result<ActorSystem, SystemError> {
        let id = format!("sys{}", NEXT_SYSTEM.fetch_add(1, Ordering::Relaxed));
        let reply_prefix = match (&self.client, &self.nats, self.inbox_prefix) {
            (_, _, Some(prefix)) => prefix,
            (None, Some(settings), None) => settings.reply_prefix().to_owned(),
            _ => subjects::DEFAULT_REPLY_PREFIX.to_owned(),
        };
        if !subjects::is_valid_reply_prefix(&reply_prefix) {
            return Err(ConnectError::InvalidInboxPrefix(reply_prefix).into());
        }
        let client = match (self.client, self.nats) {
            (Some(client), _) => client,
            (None, Some(settings)) => settings.connect(&format!("runtime-{id}")).await?,
            (None, None) => {
                NatsSettings::new("nats://127.0.0.1:4222")
                    .connect(&format!("runtime-{id}"))
                    .await?
            }
        };
        let inbox_mode = match self.inbox_mode {
            Some(mode) => mode,
            None => match std::env::var(protocol::attach::ENV_DURABLE_INBOX) {
                Ok(v) => v.parse().map_err(|e: protocol::attach::InvalidInboxMode| {
                    SystemError::InvalidSetting(e.to_string())
                })?,
                Err(_) => DurableInboxMode::default(),
            },
        };
        let inbox_shared = actors::inbox::InboxShared::new(client.clone(), &format!("{id}/clock"));
        Ok(ActorSystem {
            id,
            client,
            durable: self.durable,
            presence: presence::PresenceCache::new(self.delivery.presence_beat()),
            delivery: Arc::new(self.delivery),
            reply_prefix,
            inbox_mode,
            trees: Mutex::new(Vec::new()),
            inboxes: Mutex::new(HashMap::new()),
            inbox_supervisor: Mutex::new(None),
            trackers: Mutex::new(None),
            tracker_table: Arc::default(),
            inbox_shared,
            holds: Arc::default(),
        })
    }
}

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
        let router = Router {
            name: self.router_name(),
            client: self.client.clone(),
            durable: self.durable,
            delivery: self.delivery.clone(),
            reply_prefix: self.reply_prefix.clone(),
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
        }
        self.spawn_tree(format!("{}/router-sup", self.id), spec)
            .await?;
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
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

/// Asks every running worker for its snapshot over NATS (`runtime status`): one request on
/// [`subjects::WORKER_STATUS_SUBJECT`], each worker's answer on a subject of its own under the
/// request's reply ([`subjects::worker_status_answer`]), collected for `window` (there is no
/// knowing how many workers run), sorted by worker id.
///
/// # Errors
/// [`SystemError::Request`] when the request cannot be sent.
pub async fn request_worker_status(
    client: &async_nats::Client,
    window: Duration,
) -> Result<Vec<actors::worker::WorkerSnapshot>, SystemError> {
    use futures::StreamExt;
    let subject = subjects::WORKER_STATUS_SUBJECT;
    // Each worker answers on `<reply>.<worker>` (`subjects::worker_status_answer`).
    let token = client.new_inbox();
    let token = token.rsplit('.').next().unwrap_or(&token);
    let reply = subjects::worker_status_reply(token);
    let mut replies = client
        .subscribe(format!("{reply}.*"))
        .await
        .map_err(|e| SystemError::request(subject, e))?;
    client
        .publish_with_reply(subject, reply, Vec::new().into())
        .await
        .map_err(|e| SystemError::request(subject, e))?;
    let mut workers = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, replies.next()).await {
        if let Ok(snapshot) = serde_json::from_slice(&msg.payload) {
            workers.push(snapshot);
        }
    }
    workers.sort_by(|a: &actors::worker::WorkerSnapshot, b| a.worker_id.cmp(&b.worker_id));
    Ok(workers)
}

/// Asks a running router for its snapshot over NATS (`runtime status`).
///
/// # Errors
/// [`SystemError::NoRouter`] when no router listens, [`SystemError::Timeout`] when none answers
/// in time, [`SystemError::Request`] for other failures.
pub async fn request_status(
    client: &async_nats::Client,
    timeout: Duration,
) -> Result<RouterSnapshot, SystemError> {
    use async_nats::RequestErrorKind;
    let request = client.request(subjects::STATUS_SUBJECT, Vec::new().into());
    let reply = match tokio::time::timeout(timeout, request).await {
        Err(_) => {
            return Err(SystemError::Timeout {
                what: "a router to answer the status request".into(),
            })
        }
        Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => {
            return Err(SystemError::NoRouter {
                subject: subjects::STATUS_SUBJECT,
            })
        }
        Ok(Err(e)) => return Err(SystemError::request(subjects::STATUS_SUBJECT, e)),
        Ok(Ok(reply)) => reply,
    };
    serde_json::from_slice(&reply.payload)
        .map_err(|e| SystemError::request(subjects::STATUS_SUBJECT, e))
}
