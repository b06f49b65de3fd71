//! Declarative description of a supervision tree: strategies, restart policies, child and
//! supervisor specifications.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use ractor::{Actor, ActorCell, SpawnErr};
use ractor_supervisor as core;

use super::backoff::Backoff;
use super::supervisor::spawn_linked_supervisor_cell;

/// Which children a supervisor restarts when one of them has to be restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Only the child that exited is restarted.
    #[default]
    OneForOne,
    /// All children are stopped and restarted, in their declaration order.
    OneForAll,
    /// The child that exited and every child declared after it are stopped and restarted.
    RestForOne,
}

impl From<Strategy> for core::SupervisorStrategy {
    fn from(strategy: Strategy) -> Self {
        match strategy {
            Strategy::OneForOne => core::SupervisorStrategy::OneForOne,
            Strategy::OneForAll => core::SupervisorStrategy::OneForAll,
            Strategy::RestForOne => core::SupervisorStrategy::RestForOne,
        }
    }
}

/// When a child that exited is restarted (OTP's `restart` child-spec key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    /// Always restarted, even after a normal stop.
    #[default]
    Permanent,
    /// Restarted only after a failure (an error or a panic, in `pre_start` or later).
    Transient,
    /// Never restarted.
    Temporary,
}

impl From<Restart> for core::Restart {
    fn from(restart: Restart) -> Self {
        match restart {
            Restart::Permanent => core::Restart::Permanent,
            Restart::Transient => core::Restart::Transient,
            Restart::Temporary => core::Restart::Temporary,
        }
    }
}

/// Restart intensity limit: more than `max_restarts` restarts (of all children together) within
/// `within` make the supervisor fail, so that its own supervisor deals with it (OTP's
/// `intensity` and `period`). The default is 5 restarts within 10 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intensity {
    /// Restarts tolerated within the window; one more makes the supervisor fail.
    pub max_restarts: usize,
    /// Length of the sliding window.
    pub within: Duration,
}

impl Default for Intensity {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            within: Duration::from_secs(10),
        }
    }
}

impl Intensity {
    /// At most `max_restarts` restarts within `within`.
    #[must_use]
    pub fn new(max_restarts: usize, within: Duration) -> Self {
        Self {
            max_restarts,
            within,
        }
    }
}

/// How to spawn one child, linked to its supervisor.
///
/// The closure receives the supervisor's cell and the child id, and must spawn the child
/// **linked** to that cell and **named** with that id (ractor's global registry name): the
/// supervisor recognises its children by name. [`ChildSpec::actor`] and
/// [`ChildSpec::supervisor`] do this for you.
pub type SpawnFn = core::SpawnFn;

/// Specification of one supervised child.
#[derive(Clone)]
pub struct ChildSpec {
    /// Child id, also the child's name in ractor's global registry: unique in the process.
    pub id: String,
    /// When the child is restarted.
    pub restart: Restart,
    /// Delay between its restarts.
    pub backoff: Backoff,
    /// How to spawn it.
    pub spawn: SpawnFn,
}

impl fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl ChildSpec {
    /// A [`Restart::Permanent`] child with the default [`Backoff`], spawned by `spawn`.
    ///
    /// `spawn(supervisor, id)` must spawn the child linked to `supervisor` and named `id`,
    /// e.g. with `Actor::spawn_linked(Some(id), handler, args, supervisor)`.
    pub fn new<F, Fut>(id: impl Into<String>, spawn: F) -> Self
    where
        F: Fn(ActorCell, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ActorCell, SpawnErr>> + Send + 'static,
    {
        Self {
            id: id.into(),
            restart: Restart::default(),
            backoff: Backoff::default(),
            spawn: SpawnFn::new(spawn),
        }
    }

    /// A [`Restart::Permanent`] child running `actor`, started each time with fresh arguments
    /// from `args` (so that a restart rebuilds the state from them).
    pub fn actor<A, F>(id: impl Into<String>, actor: A, args: F) -> Self
    where
        A: Actor + Clone,
        F: Fn() -> A::Arguments + Send + Sync + 'static,
    {
        Self::new(id, move |supervisor, id| {
            let actor = actor.clone();
            let arguments = args();
            async move {
                let (child, _join) =
                    Actor::spawn_linked(Some(id), actor, arguments, supervisor).await?;
                Ok(child.get_cell())
            }
        })
    }

    /// A [`Restart::Permanent`] child that is itself a supervisor of `spec`: when it fails (its
    /// restart intensity was exceeded), this supervisor restarts it with its whole subtree.
    pub fn supervisor(id: impl Into<String>, spec: SupervisorSpec) -> Self {
        Self::new(id, move |parent, id| {
            let spec = spec.clone();
            async move { spawn_linked_supervisor_cell(id, spec, parent).await }
        })
    }

    /// Sets the restart policy.
    #[must_use]
    pub fn with_restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Sets the backoff between restarts.
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The `ractor-supervisor` child spec, with a fresh backoff tracker (one per supervisor
    /// incarnation).
    pub(crate) fn to_core(&self) -> core::ChildSpec {
        let tracker = self.backoff.tracker();
        core::ChildSpec {
            id: self.id.clone(),
            restart: self.restart.into(),
            spawn_fn: self.spawn.clone(),
            backoff_fn: Some(core::ChildBackoffFn::new(move |_, _, _, _| {
                Some(tracker.next_delay())
            })),
            reset_after: None,
        }
    }
}

/// Specification of a supervisor: its strategy, its restart intensity and its children, in
/// start order.
#[derive(Debug, Clone, Default)]
pub struct SupervisorSpec {
    /// Which children are restarted together.
    pub strategy: Strategy,
    /// When the supervisor gives up and fails upward.
    pub intensity: Intensity,
    /// The children, started in this order.
    pub children: Vec<ChildSpec>,
}

impl SupervisorSpec {
    /// An empty supervisor with `strategy` and the default [`Intensity`].
    #[must_use]
    pub fn new(strategy: Strategy) -> Self {
        Self {
            strategy,
            ..Self::default()
        }
    }

    /// Sets the restart intensity limit.
    #[must_use]
    pub fn with_intensity(mut self, intensity: Intensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Appends a child (started after those already there).
    #[must_use]
    pub fn child(mut self, child: ChildSpec) -> Self {
        self.children.push(child);
        self
    }

    /// The `ractor-supervisor` startup arguments for one incarnation of this supervisor.
    pub(crate) fn to_core(&self) -> core::SupervisorArguments {
        core::SupervisorArguments {
            child_specs: self.children.iter().map(ChildSpec::to_core).collect(),
            options: core::SupervisorOptions {
                strategy: self.strategy.into(),
                max_restarts: self.intensity.max_restarts,
                max_window: self.intensity.within,
                reset_after: None,
            },
        }
    }
}
