//! Graceful shutdown of a supervision tree.

use std::time::Duration;

use futures::future::BoxFuture;
use ractor::rpc::CallResult;
use ractor::{ActorCell, ActorRef};
use ractor_supervisor::SupervisorMsg;

use super::supervisor::SupervisorRef;

/// Stops the tree rooted at `supervisor` gracefully, OTP style: its children in reverse start
/// order, each nested supervisor after its own subtree, each child with its `post_stop`, none
/// of them restarted; then the supervisor itself.
///
/// Each stop waits at most `timeout`; an actor that does not stop in time is killed. Stopping
/// a supervisor with `stop(None)` instead makes ractor kill its children (no `post_stop`), and
/// stopping a [`Restart::Permanent`](super::Restart::Permanent) child by hand has it restarted.
pub async fn shutdown(supervisor: &SupervisorRef, timeout: Duration) {
    shutdown_cell(supervisor.get_cell(), timeout).await;
}

fn shutdown_cell(supervisor: ActorCell, timeout: Duration) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let order = start_order(&supervisor, timeout).await;
        let mut children = supervisor.get_children();
        children.sort_by_key(|child| {
            child
                .get_name()
                .and_then(|name| order.iter().position(|id| *id == name))
                .unwrap_or(usize::MAX)
        });
        // Unlinked children no longer report their exit: the supervisor restarts none of them.
        for child in &children {
            child.unlink(supervisor.clone());
        }
        for child in children.into_iter().rev() {
            if child.is_message_type_of::<SupervisorMsg>() == Some(true) {
                shutdown_cell(child, timeout).await;
            } else {
                stop_or_kill(&child, timeout).await;
            }
        }
        stop_or_kill(&supervisor, timeout).await;
    })
}

/// The child ids of `supervisor` in start order (empty if it does not answer).
async fn start_order(supervisor: &ActorCell, timeout: Duration) -> Vec<String> {
    let supervisor: SupervisorRef = ActorRef::from(supervisor.clone());
    match supervisor
        .call(SupervisorMsg::InspectState, Some(timeout))
        .await
    {
        Ok(CallResult::Success(state)) => state.child_specs.into_iter().map(|s| s.id).collect(),
        _ => Vec::new(),
    }
}

async fn stop_or_kill(actor: &ActorCell, timeout: Duration) {
    if actor.stop_and_wait(None, Some(timeout)).await.is_err() {
        actor.kill();
    }
}
