//! A dynamic supervisor: children are added while it runs (one per attached inbox, say), each
//! restarted on its own (one-for-one) under its own [`Restart`] policy, [`Backoff`] and
//! restart [`Intensity`], and forgotten once it ends for good.
//!
//! It differs from a static supervisor ([`spawn_supervisor`](super::spawn_supervisor)) in
//! what happens when a child exceeds its intensity: the children of a dynamic supervisor are
//! independent (one inbox per agent), so the supervisor *gives up on that child* (it is not
//! restarted again, its arguments are dropped, and [`DynamicSnapshot::given_up`] counts it)
//! instead of failing with all its siblings. A child that stops normally (or fails, when
//! [`Restart::Temporary`]) leaves the supervisor's table at once: a long-running process that
//! adds a child per task keeps a table the size of its live children.
//!
//! A child is an actor ([`add_child`]) or a task ([`add_task`], [`super::task`]): a task child
//! is supervised the same way, one task per incarnation, without an actor's mailboxes (a host
//! of thousands of inboxes).
//!
//! ```ignore
//! let (sup, _join) = DynamicSupervisor::spawn("inboxes".into(), Intensity::new(5, secs(10))).await?;
//! dynamic::add_child(&sup, ChildSpec::actor("inbox-bob", inbox, || ())
//!     .with_restart(Restart::Transient)).await?;
//! let snap = dynamic::snapshot(&sup).await?; // running, restarts, given_up
//! dynamic::remove_child(&sup, "inbox-bob", grace).await?; // stopped, never restarted
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use protocol::error_chain::ErrorChain;
use ractor::concurrency::{Instant, JoinHandle};
use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent,
};
use serde::{Deserialize, Serialize};

use super::backoff::BackoffTracker;
use super::spec::{ChildSpec, Intensity, Restart};
use super::task::{TaskRun, TaskSpec};

/// How long [`add_child`] and [`snapshot`] wait for the supervisor.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Reference to a running dynamic supervisor.
pub type DynamicRef = ActorRef<DynamicMsg>;

/// The dynamic supervisor actor; its argument is the per-child [`Intensity`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamicSupervisor;

/// Messages of a [`DynamicSupervisor`].
pub enum DynamicMsg {
    /// Start a child; replies once its `pre_start` ran (a failing `pre_start` is not an error
    /// here: the child is restarted like one that crashed). An id already in use is refused.
    Add(ChildSpec, RpcReplyPort<Result<(), DynamicError>>),
    /// Start a task child; replies once its first incarnation is spawned. An id already in
    /// use is refused.
    AddTask(TaskSpec, RpcReplyPort<Result<(), DynamicError>>),
    /// The incarnation `generation` of the task child `id` ended by itself (`failed`: an error
    /// or a panic).
    TaskExited {
        /// The child.
        id: String,
        /// Its incarnation.
        generation: u64,
        /// It failed.
        failed: bool,
    },
    /// Restart the child `id` (sent to itself after the child's backoff delay).
    Restart(String),
    /// A snapshot of the children.
    Snapshot(RpcReplyPort<DynamicSnapshot>),
    /// Forget the child `id` (it is never restarted again) and reply with its running
    /// incarnation, which the caller stops ([`remove_child`]); `None` when there is none.
    Remove(String, RpcReplyPort<Option<Running>>),
}

/// The running incarnation of a removed child, for its remover to stop.
#[derive(Debug)]
pub enum Running {
    /// An actor child's.
    Actor(ActorCell),
    /// A task child's.
    Task(TaskRun),
}

/// Why a child could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynamicError {
    /// A child with this id is already supervised.
    #[error("a child named {0} is already supervised")]
    Duplicate(String),
    /// The supervisor did not answer (stopped, or too slow).
    #[error("dynamic supervisor unavailable: {0}")]
    Unavailable(String),
}

/// Counters of a dynamic supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicSnapshot {
    /// Children currently supervised (running, or waiting for their restart).
    pub children: usize,
    /// Children added since start.
    pub added: u64,
    /// Restarts done since start (all children).
    pub restarts: u64,
    /// Children given up after exceeding their intensity.
    pub given_up: u64,
    /// The supervised children restarted at least once, with their restarts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub restarted: BTreeMap<String, u64>,
}

struct Child {
    spec: Spec,
    running: Option<Running>,
    backoff: BackoffTracker,
    failures: VecDeque<Instant>,
    restarts: u64,
}

/// The incarnations of task children started in this process: a task child's exit is current
/// only for the incarnation that runs now, whichever child (a removed child added again under
/// its id starts a new one, which the old one's late exit must not touch).
static INCARNATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

enum Spec {
    Actor(ChildSpec),
    Task(TaskSpec),
}

impl Spec {
    fn id(&self) -> &str {
        match self {
            Spec::Actor(spec) => &spec.id,
            Spec::Task(spec) => &spec.id,
        }
    }

    fn restart(&self) -> Restart {
        match self {
            Spec::Actor(spec) => spec.restart,
            Spec::Task(spec) => spec.restart,
        }
    }

    fn backoff(&self) -> BackoffTracker {
        match self {
            Spec::Actor(spec) => spec.backoff.tracker(),
            Spec::Task(spec) => spec.backoff.tracker(),
        }
    }
}

/// State of a dynamic supervisor.
pub struct DynamicState {
    intensity: Intensity,
    /// Boxed: the table keeps room for more entries than it holds, and a host's table holds
    /// thousands of inboxes.
    children: HashMap<String, Box<Child>>,
    stats: DynamicSnapshot,
}

impl DynamicSupervisor {
    /// Spawns a root dynamic supervisor named `name` whose children may each be restarted
    /// `intensity.max_restarts` times within `intensity.within`.
    ///
    /// # Errors
    /// [`SpawnErr`] when `name` is taken.
    pub async fn spawn(
        name: String,
        intensity: Intensity,
    ) -> Result<(DynamicRef, JoinHandle<()>), SpawnErr> {
        Actor::spawn(Some(name), DynamicSupervisor, intensity).await
    }
}

/// Adds `child` to `supervisor` and starts it.
///
/// # Errors
/// [`DynamicError::Duplicate`] for an id in use; [`DynamicError::Unavailable`] when the
/// supervisor does not answer within [`CALL_TIMEOUT`].
pub async fn add_child(supervisor: &DynamicRef, child: ChildSpec) -> Result<(), DynamicError> {
    ractor::call_t!(
        supervisor,
        DynamicMsg::Add,
        CALL_TIMEOUT.as_millis() as u64,
        child
    )
    .map_err(|e| DynamicError::Unavailable(e.to_string()))?
}

/// Adds the task child `task` to `supervisor` and starts its first incarnation.
///
/// # Errors
/// [`DynamicError::Duplicate`] for an id in use; [`DynamicError::Unavailable`] when the
/// supervisor does not answer within [`CALL_TIMEOUT`].
pub async fn add_task(supervisor: &DynamicRef, task: TaskSpec) -> Result<(), DynamicError> {
    ractor::call_t!(
        supervisor,
        DynamicMsg::AddTask,
        CALL_TIMEOUT.as_millis() as u64,
        task
    )
    .map_err(|e| DynamicError::Unavailable(e.to_string()))?
}

/// Removes the child `id` from `supervisor` and stops it gracefully (an actor's `post_stop`
/// runs; a task is given its stop signal) within `grace`, killing it past that; it is not
/// restarted. Returns whether it had an
/// incarnation to stop (one that ended just before is stopped already). The supervisor's mailbox does not wait for the stop: many children
/// may be removed at once.
///
/// # Errors
/// [`DynamicError::Unavailable`] when the supervisor does not answer within [`CALL_TIMEOUT`].
pub async fn remove_child(
    supervisor: &DynamicRef,
    id: &str,
    grace: Duration,
) -> Result<bool, DynamicError> {
    let running = ractor::call_t!(
        supervisor,
        DynamicMsg::Remove,
        CALL_TIMEOUT.as_millis() as u64,
        id.to_owned()
    )
    .map_err(|e| DynamicError::Unavailable(e.to_string()))?;
    match running {
        None => return Ok(false),
        Some(Running::Actor(cell)) => {
            if cell
                .stop_and_wait(Some("removed".into()), Some(grace))
                .await
                .is_err()
            {
                cell.kill_and_wait(Some(grace)).await.ok();
            }
        }
        // On a task of its own: a caller that gives up waiting leaves it stopping, not
        // aborted (its clean stop still runs, within `grace`).
        Some(Running::Task(run)) => {
            let _ = tokio::spawn(run.stop_within(grace)).await;
        }
    }
    Ok(true)
}

/// The supervisor's counters.
///
/// # Errors
/// [`DynamicError::Unavailable`] when it does not answer within [`CALL_TIMEOUT`].
pub async fn snapshot(supervisor: &DynamicRef) -> Result<DynamicSnapshot, DynamicError> {
    ractor::call_t!(
        supervisor,
        DynamicMsg::Snapshot,
        CALL_TIMEOUT.as_millis() as u64
    )
    .map_err(|e| DynamicError::Unavailable(e.to_string()))
}

#[ractor::async_trait]
impl Actor for DynamicSupervisor {
    type Msg = DynamicMsg;
    type State = DynamicState;
    type Arguments = Intensity;

    async fn pre_start(
        &self,
        _: ActorRef<DynamicMsg>,
        intensity: Intensity,
    ) -> Result<DynamicState, ActorProcessingErr> {
        Ok(DynamicState {
            intensity,
            children: HashMap::new(),
            stats: DynamicSnapshot::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<DynamicMsg>,
        msg: DynamicMsg,
        state: &mut DynamicState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DynamicMsg::Add(spec, reply) => {
                let added = add(&myself, state, Spec::Actor(spec)).await;
                let _ = reply.send(added);
            }
            DynamicMsg::AddTask(spec, reply) => {
                let added = add(&myself, state, Spec::Task(spec)).await;
                let _ = reply.send(added);
            }
            DynamicMsg::TaskExited {
                id,
                generation,
                failed,
            } => {
                // Only the current incarnation's exit counts (a removed child's, or one added
                // again since, is not).
                let current = state.children.get(&id).is_some_and(|c| {
                    matches!(&c.running, Some(Running::Task(run)) if run.generation == generation)
                });
                if current {
                    on_exit(&myself, state, &id, failed);
                }
            }
            DynamicMsg::Restart(id) => {
                // Only a child waiting for its restart: one removed and added again meanwhile
                // runs already, and this restart was its predecessor's.
                if let Some(child) = state.children.get_mut(&id).filter(|c| c.running.is_none()) {
                    child.restarts += 1;
                    state.stats.restarts += 1;
                    start(&myself, state, &id).await;
                }
            }
            DynamicMsg::Snapshot(reply) => {
                let mut snap = state.stats.clone();
                snap.children = state.children.len();
                snap.restarted = state
                    .children
                    .iter()
                    .filter(|(_, c)| c.restarts > 0)
                    .map(|(id, c)| (id.clone(), c.restarts))
                    .collect();
                let _ = reply.send(snap);
            }
            DynamicMsg::Remove(id, reply) => {
                // Out of the table first: the exit of its last incarnation is then not current,
                // and nothing restarts it.
                let running = state.children.remove(&id).and_then(|c| c.running);
                let _ = reply.send(running);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<DynamicMsg>,
        event: SupervisionEvent,
        state: &mut DynamicState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failed) = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, false),
            SupervisionEvent::ActorFailed(cell, error) => {
                tracing::warn!(child = ?cell.get_name(), error = %ErrorChain(&*error), "supervised child failed");
                (cell, true)
            }
            _ => return Ok(()),
        };
        let Some(id) = cell.get_name() else {
            return Ok(());
        };
        // Only the current incarnation's exit counts (a stale one is already replaced).
        let current = state.children.get(&id).is_some_and(
            |c| matches!(&c.running, Some(Running::Actor(c)) if c.get_id() == cell.get_id()),
        );
        if !current {
            return Ok(());
        }
        on_exit(&myself, state, &id, failed);
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<DynamicMsg>,
        state: &mut DynamicState,
    ) -> Result<(), ActorProcessingErr> {
        let mut tasks = Vec::new();
        for child in state.children.values_mut() {
            match child.running.take() {
                Some(Running::Actor(cell)) => cell.stop(Some("supervisor stopping".into())),
                Some(Running::Task(run)) => {
                    run.signal();
                    tasks.push(run);
                }
                None => {}
            }
        }
        // Task children finish what they have in hand, within a bound; past it they are
        // aborted (none outlives its supervisor).
        futures::future::join_all(
            tasks
                .into_iter()
                .map(|run| run.stop_within(TASK_STOP_GRACE)),
        )
        .await;
        Ok(())
    }
}

/// Adds the child `spec` to the table and starts it, unless its id is in use.
async fn add(
    myself: &ActorRef<DynamicMsg>,
    state: &mut DynamicState,
    spec: Spec,
) -> Result<(), DynamicError> {
    let id = spec.id().to_owned();
    if state.children.contains_key(&id) {
        return Err(DynamicError::Duplicate(id));
    }
    state.insert(id.clone(), spec);
    start(myself, state, &id).await;
    Ok(())
}

impl DynamicState {
    /// A new child in the table, not started yet.
    fn insert(&mut self, id: String, spec: Spec) {
        self.children.insert(
            id,
            Box::new(Child {
                backoff: spec.backoff(),
                spec,
                running: None,
                failures: VecDeque::new(),
                restarts: 0,
            }),
        );
        self.stats.added += 1;
    }
}

/// How long a stopping supervisor waits for its task children to finish what they have in
/// hand before it aborts them.
pub const TASK_STOP_GRACE: Duration = Duration::from_secs(5);

/// Spawns (or respawns) the child `id`; a failed spawn counts as a failure.
async fn start(myself: &ActorRef<DynamicMsg>, state: &mut DynamicState, id: &str) {
    let Some(child) = state.children.get_mut(id) else {
        return;
    };
    child.running = None;
    let spawn = match &child.spec {
        Spec::Actor(spec) => spec.spawn.clone(),
        Spec::Task(spec) => {
            let generation = INCARNATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (me, id) = (myself.clone(), id.to_owned());
            child.running = Some(Running::Task(TaskRun::start(
                spec,
                generation,
                move |failed| {
                    let _ = me.cast(DynamicMsg::TaskExited {
                        id,
                        generation,
                        failed,
                    });
                },
            )));
            return;
        }
    };
    match spawn.call(myself.get_cell(), id.to_owned()).await {
        Ok(cell) => {
            if let Some(child) = state.children.get_mut(id) {
                child.running = Some(Running::Actor(cell));
            }
        }
        Err(error) => {
            tracing::warn!(child = id, error = %ErrorChain(&error), "supervised child did not start");
            on_exit(myself, state, id, true);
        }
    }
}

/// Decides what follows the exit of the child `id`: forget it, give up on it, or restart it
/// after its backoff delay.
fn on_exit(myself: &ActorRef<DynamicMsg>, state: &mut DynamicState, id: &str, failed: bool) {
    let intensity = state.intensity;
    let Some(child) = state.children.get_mut(id) else {
        return;
    };
    child.running = None;
    let restart = match child.spec.restart() {
        Restart::Permanent => true,
        Restart::Transient => failed,
        Restart::Temporary => false,
    };
    if !restart {
        state.children.remove(id);
        return;
    }
    let now = Instant::now();
    child.failures.push_back(now);
    while child
        .failures
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) > intensity.within)
    {
        child.failures.pop_front();
    }
    if child.failures.len() > intensity.max_restarts {
        tracing::error!(
            child = id,
            restarts = intensity.max_restarts,
            within = ?intensity.within,
            "child exceeded its restart intensity; giving up on it"
        );
        state.children.remove(id);
        state.stats.given_up += 1;
        return;
    }
    let delay = child.backoff.next_delay();
    // The timer's handle is not kept: a restart due after the supervisor stopped is dropped.
    drop(myself.send_after(delay, {
        let id = id.to_owned();
        move || DynamicMsg::Restart(id)
    }));
}

#[cfg(test)]
mod tests;
