//! The background tasks an actor owns: pull pipelines, subscription loops, timers, requests in
//! flight. Each is held by the actor's state as an [`Owned`] handle
//! (`tokio_util`'s `AbortOnDropHandle`), which aborts the task when it is dropped: ractor skips `post_stop` when an actor panics or its `handle` returns an
//! error, but it always drops the state, so no task outlives its actor, however it ends.
//!
//! A pump (a loop whose failure must fail its actor so that the supervisor restarts it) is
//! spawned with [`spawn_pump`]: an error or a panic is reported, never lost with the task.

use std::future::Future;

use futures::FutureExt;
use protocol::error_chain::ErrorChain;
use tokio_util::task::AbortOnDropHandle;

/// A task owned by an actor's state: aborted when dropped.
pub type Owned = AbortOnDropHandle<()>;

/// Spawns `task`, owned by the returned handle.
pub fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Owned {
    AbortOnDropHandle::new(tokio::spawn(task))
}

/// Aborts `task` and waits until it is gone (what it held, e.g. a subscription, is dropped
/// when this returns).
pub async fn abort(mut task: Owned) {
    task.abort();
    let _ = (&mut task).await;
}

/// Waits at most `within` for `task` to end by itself, then aborts it.
pub async fn join_within(mut task: Owned, within: std::time::Duration) {
    if tokio::time::timeout(within, &mut task).await.is_err() {
        task.abort();
    }
}

/// Why a pump ended by itself ([`spawn_pump`]).
#[derive(Debug, thiserror::Error)]
pub enum PumpFailure {
    /// It returned an error.
    #[error(transparent)]
    Error(Box<dyn std::error::Error + Send + Sync>),
    /// It panicked.
    #[error("the pump panicked")]
    Panicked,
}

/// Spawns `pump`, owned by the returned handle; when it ends with an error or panics, calls
/// `on_fail` with the failure (typically casting a `PumpFailed` message to the owning actor).
pub fn spawn_pump<F, E>(pump: F, on_fail: impl FnOnce(PumpFailure) + Send + 'static) -> Owned
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    // Boxed once: the task holds a pointer, not the pump's future and a moved copy of it.
    let pump = Box::pin(pump);
    spawn(async move {
        let outcome = match std::panic::AssertUnwindSafe(pump).catch_unwind().await {
            Ok(result) => result.map_err(|e| PumpFailure::Error(Box::new(e))),
            Err(_) => Err(PumpFailure::Panicked),
        };
        if let Err(failure) = outcome {
            tracing::error!(error = %ErrorChain(&failure), "pump failed");
            on_fail(failure);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn errors_and_panics_are_reported_and_success_is_not() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let report = |tx: tokio::sync::mpsc::UnboundedSender<String>| {
            move |failure: PumpFailure| {
                let _ = tx.send(failure.to_string());
            }
        };
        let wait = std::time::Duration::from_secs(5);
        let failing = spawn_pump(
            async { Err::<(), _>(std::io::Error::other("boom")) },
            report(tx.clone()),
        );
        join_within(failing, wait).await;
        let panicking = spawn_pump(
            async {
                panic!("in the pump");
                #[allow(unreachable_code)]
                Ok::<(), std::io::Error>(())
            },
            report(tx.clone()),
        );
        join_within(panicking, wait).await;
        let fine = spawn_pump(async { Ok::<(), std::io::Error>(()) }, report(tx));
        join_within(fine, wait).await;
        assert_eq!(rx.recv().await.as_deref(), Some("boom"));
        assert_eq!(rx.recv().await.as_deref(), Some("the pump panicked"));
        assert_eq!(
            rx.recv().await,
            None,
            "a pump that succeeds reports nothing"
        );
    }

    #[tokio::test]
    async fn a_dropped_handle_aborts_its_task() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let owned = spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(owned);
        // The task is aborted: its sender is dropped, the channel closes.
        assert_eq!(
            tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await,
            Ok(None)
        );
    }
}
