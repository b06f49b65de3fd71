//! Spawning supervisors (a thin layer over `ractor-supervisor`'s `Supervisor` actor).

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorCell, ActorRef, SpawnErr};
use ractor_supervisor::{Supervisor, SupervisorMsg};

use super::spec::SupervisorSpec;

/// Reference to a running supervisor.
///
/// Query it with [`snapshot`](super::snapshot); stop it (and its whole subtree) with
/// `stop(None)`.
pub type SupervisorRef = ActorRef<SupervisorMsg>;

/// Spawns a root supervisor of `spec`, which starts its children in order.
///
/// A root supervisor has nobody to fail upward to: when its restart intensity is exceeded it
/// stops (and its children with it), and its join handle completes. Use
/// [`spawn_supervisor_linked`] to have a parent actor notified instead.
///
/// A child that fails to start is not an error here: it is restarted like a child that crashed.
///
/// # Errors
///
/// Returns [`SpawnErr`] when the supervisor itself cannot be spawned, e.g. when `name` is
/// already registered.
pub async fn spawn_supervisor(
    name: Option<String>,
    spec: SupervisorSpec,
) -> Result<(SupervisorRef, JoinHandle<()>), SpawnErr> {
    Actor::spawn(name, Supervisor, spec.to_core()).await
}

/// Spawns a supervisor of `spec` linked to `parent`: `parent` receives a
/// `SupervisionEvent::ActorFailed` for it when its restart intensity is exceeded.
///
/// To supervise a supervisor with another supervisor, use
/// [`ChildSpec::supervisor`](super::ChildSpec::supervisor) instead.
///
/// # Errors
///
/// Returns [`SpawnErr`] when the supervisor cannot be spawned, e.g. when `name` is already
/// registered or `parent` is stopping.
pub async fn spawn_supervisor_linked(
    name: Option<String>,
    spec: SupervisorSpec,
    parent: ActorCell,
) -> Result<(SupervisorRef, JoinHandle<()>), SpawnErr> {
    Actor::spawn_linked(name, Supervisor, spec.to_core(), parent).await
}

/// Spawn function of [`ChildSpec::supervisor`](super::ChildSpec::supervisor).
pub(crate) async fn spawn_linked_supervisor_cell(
    id: String,
    spec: SupervisorSpec,
    parent: ActorCell,
) -> Result<ActorCell, SpawnErr> {
    let (supervisor, _join) = spawn_supervisor_linked(Some(id), spec, parent).await?;
    Ok(supervisor.get_cell())
}
