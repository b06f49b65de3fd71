//! Pump tasks: the loops an actor owns (pull pipelines, subscriptions) run as tokio tasks whose
//! failure — an error or a panic — must fail the owning actor so that its supervisor restarts
//! it, never vanish silently with the task.

use std::future::Future;

use futures::FutureExt;
use tokio::task::JoinHandle;

/// Spawns `pump`; when it ends with an error or panics, calls `on_fail` with the reason
/// (typically casting a `PumpFailed` message to the owning actor).
pub fn spawn_pump<F, E>(pump: F, on_fail: impl FnOnce(String) + Send + 'static) -> JoinHandle<()>
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    tokio::spawn(async move {
        let outcome = match std::panic::AssertUnwindSafe(pump).catch_unwind().await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err("the pump panicked".to_string()),
        };
        if let Err(reason) = outcome {
            tracing::error!(%reason, "pump failed");
            on_fail(reason);
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
            move |r| {
                let _ = tx.send(r);
            }
        };
        spawn_pump(async { Err::<(), _>("boom") }, report(tx.clone()))
            .await
            .unwrap();
        spawn_pump(
            async {
                panic!("in the pump");
                #[allow(unreachable_code)]
                Ok::<(), String>(())
            },
            report(tx.clone()),
        )
        .await
        .unwrap();
        spawn_pump(async { Ok::<(), String>(()) }, report(tx))
            .await
            .unwrap();
        assert_eq!(rx.recv().await.as_deref(), Some("boom"));
        assert_eq!(rx.recv().await.as_deref(), Some("the pump panicked"));
        assert_eq!(
            rx.recv().await,
            None,
            "a pump that succeeds reports nothing"
        );
    }
}
