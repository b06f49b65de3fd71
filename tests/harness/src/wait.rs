//! Waiting for events with a deadline.

use std::future::Future;
use std::time::Duration;

use crate::HarnessError;

/// Polls `cond` every 10 ms until it returns true, or fails after `deadline`.
///
/// # Errors
/// [`HarnessError::Timeout`] naming `what`.
pub async fn wait_until(
    what: &str,
    deadline: Duration,
    mut cond: impl FnMut() -> bool,
) -> Result<(), HarnessError> {
    wait_until_async(what, deadline, || std::future::ready(cond())).await
}

/// Like [`wait_until`] with an async condition.
///
/// # Errors
/// [`HarnessError::Timeout`] naming `what`.
pub async fn wait_until_async<F, Fut>(
    what: &str,
    deadline: Duration,
    mut cond: F,
) -> Result<(), HarnessError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let poll = async {
        loop {
            if cond().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(deadline, poll)
        .await
        .map_err(|_| HarnessError::Timeout { what: what.into() })
}
