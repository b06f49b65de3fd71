//! Cheap, serializable snapshot of a supervisor's children.

use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::ActorStatus;
use ractor_supervisor::SupervisorMsg;

use super::supervisor::SupervisorRef;

/// How long [`snapshot`] waits for the supervisor's answer.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);

/// State of one child of a supervisor.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChildSnapshot {
    /// Child id (its registry name).
    pub id: String,
    /// Restarts caused by this child's own exits since this supervisor incarnation started,
    /// counting one that waits behind its backoff delay. Restarts of a sibling dragged along by
    /// [`Strategy::OneForAll`](super::Strategy::OneForAll) or
    /// [`Strategy::RestForOne`](super::Strategy::RestForOne) are counted on the sibling that
    /// caused them.
    pub restarts: usize,
    /// Whether the child is currently running (started, not stopping).
    pub running: bool,
}

/// State of the children of a supervisor, in start order.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SupervisorSnapshot {
    /// One entry per child spec, in start order.
    pub children: Vec<ChildSnapshot>,
}

impl SupervisorSnapshot {
    /// The snapshot of the child `id`, if the supervisor has such a child.
    #[must_use]
    pub fn child(&self, id: &str) -> Option<&ChildSnapshot> {
        self.children.iter().find(|child| child.id == id)
    }
}

/// Why a snapshot could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The supervisor is not running (stopped, or failed).
    #[error("supervisor is not running: {0}")]
    NotRunning(String),
    /// The supervisor did not answer in time.
    #[error("supervisor did not answer within {0:?}")]
    Timeout(Duration),
    /// The supervisor dropped the reply port without answering.
    #[error("supervisor dropped the snapshot request")]
    NoReply,
}

/// Asks `supervisor` for the restart counts and liveness of its children, waiting at most
/// [`SNAPSHOT_TIMEOUT`].
///
/// # Errors
///
/// See [`snapshot_within`].
pub async fn snapshot(supervisor: &SupervisorRef) -> Result<SupervisorSnapshot, SnapshotError> {
    snapshot_within(supervisor, SNAPSHOT_TIMEOUT).await
}

/// Asks `supervisor` for the restart counts and liveness of its children, waiting at most
/// `timeout`.
///
/// The supervisor answers between two of its own steps, so the snapshot is consistent with its
/// restart bookkeeping; liveness is read from the children's status at the same moment.
///
/// # Errors
///
/// Returns [`SnapshotError::NotRunning`] when the supervisor has stopped,
/// [`SnapshotError::Timeout`] when it does not answer within `timeout` (e.g. it is busy
/// restarting children), and [`SnapshotError::NoReply`] when it drops the request.
pub async fn snapshot_within(
    supervisor: &SupervisorRef,
    timeout: Duration,
) -> Result<SupervisorSnapshot, SnapshotError> {
    let state = match supervisor
        .call(SupervisorMsg::InspectState, Some(timeout))
        .await
    {
        Ok(CallResult::Success(state)) => state,
        Ok(CallResult::Timeout) => return Err(SnapshotError::Timeout(timeout)),
        Ok(CallResult::SenderError) => return Err(SnapshotError::NoReply),
        Err(err) => return Err(SnapshotError::NotRunning(err.to_string())),
    };
    let running: Vec<String> = supervisor
        .get_children()
        .into_iter()
        .filter(|cell| cell.get_status() == ActorStatus::Running)
        .filter_map(|cell| cell.get_name())
        .collect();
    let children = state
        .child_specs
        .iter()
        .map(|spec| ChildSnapshot {
            id: spec.id.clone(),
            restarts: state
                .child_failure_state
                .get(&spec.id)
                .map_or(0, |failures| failures.restart_count),
            running: running.contains(&spec.id),
        })
        .collect();
    Ok(SupervisorSnapshot { children })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_serializes_to_plain_json() {
        let snapshot = SupervisorSnapshot {
            children: vec![ChildSnapshot {
                id: "inbox".into(),
                restarts: 2,
                running: true,
            }],
        };
        let json = serde_json::to_value(&snapshot).expect("serializable");
        assert_eq!(
            json,
            serde_json::json!({"children": [{"id": "inbox", "restarts": 2, "running": true}]})
        );
        assert_eq!(snapshot.child("inbox").map(|c| c.restarts), Some(2));
        assert!(snapshot.child("other").is_none());
    }
}
