//! Task children of a [`DynamicSupervisor`](super::DynamicSupervisor): a child that is one
//! tokio task per incarnation, not an actor.
//!
//! An actor costs about 11 kB however idle it is (ractor's four mailbox channels), which a
//! host of thousands of inboxes pays once per inbox (docs/CAPACITY.md). A task child is
//! supervised exactly as an actor child is (the same [`Restart`] policy, [`Backoff`], per-child
//! intensity, restart counts and give-up), but each incarnation is a future made afresh by its
//! [`TaskSpec`]'s `start`, run on a task of its own:
//!
//! - it **returns `Ok`**: a normal stop; it **returns `Err`** or **panics**: a failure (the
//!   panic is caught on its own task and reported; it never reaches a sibling);
//! - it is asked to stop with its [`StopSignal`] ([`remove_child`](super::dynamic::remove_child),
//!   the supervisor's own stop): it finishes what it has in hand and returns; past the
//!   caller's grace it is aborted;
//! - its task is held by the supervisor's table ([`TaskRun`]), which aborts it when dropped:
//!   no incarnation outlives its supervisor.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, TryFutureExt};
use protocol::error_chain::ErrorChain;

use super::backoff::Backoff;
use super::spec::Restart;
use crate::background::Owned;

/// What a task child's incarnation fails with.
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// Makes one incarnation of a task child, given its stop signal.
pub type StartFn =
    Arc<dyn Fn(StopSignal) -> BoxFuture<'static, Result<(), TaskError>> + Send + Sync>;

/// Asks a task child's incarnation to stop (cheap to clone; one per incarnation).
#[derive(Clone, Default)]
pub struct StopSignal(Arc<StopInner>);

#[derive(Default)]
struct StopInner {
    stopped: AtomicBool,
    notify: tokio::sync::Notify,
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StopSignal")
            .field(&self.is_stopped())
            .finish()
    }
}

impl StopSignal {
    /// A signal not given yet.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Gives the signal: every [`stopped`](Self::stopped), now or later, returns.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    /// Whether the signal was given.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// Returns once the signal is given.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn stopped(&self) {
        let notified = self.0.notify.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a stop between the two is not missed.
        notified.as_mut().enable();
        if self.is_stopped() {
            return;
        }
        notified.await;
    }
}

/// Specification of one task child ([`add_task`](super::dynamic::add_task)).
#[derive(Clone)]
pub struct TaskSpec {
    /// Child id, unique among the supervisor's children (not a registry name: a task has
    /// none).
    pub id: String,
    /// When it is restarted.
    pub restart: Restart,
    /// Delay between its restarts.
    pub backoff: Backoff,
    /// Makes each incarnation.
    pub start: StartFn,
}

impl std::fmt::Debug for TaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl TaskSpec {
    /// A [`Restart::Permanent`] task child with the default [`Backoff`]; each incarnation is
    /// `start(stop)`.
    pub fn new<F, Fut, E>(id: impl Into<String>, start: F) -> TaskSpec
    where
        F: Fn(StopSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<TaskError> + 'static,
    {
        TaskSpec {
            id: id.into(),
            restart: Restart::default(),
            backoff: Backoff::default(),
            // A combinator, not an `async move` block around the incarnation: a block would
            // hold the incarnation's future twice (captured, then awaited), and a host holds
            // one per idle inbox.
            start: Arc::new(move |stop| Box::pin(start(stop).map_err(Into::into))),
        }
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
}

/// One running incarnation of a task child, held by its supervisor's table: the task is
/// aborted when this is dropped.
#[derive(Debug)]
pub struct TaskRun {
    /// Which incarnation (its exit is current only while it is the child's).
    pub(super) generation: u64,
    stop: StopSignal,
    task: Owned,
}

impl TaskRun {
    /// Starts `spec`'s next incarnation; `exited(failed)` is called once it ended by itself
    /// (not when it is aborted).
    pub(super) fn start(
        spec: &TaskSpec,
        generation: u64,
        exited: impl FnOnce(bool) + Send + 'static,
    ) -> TaskRun {
        let stop = StopSignal::new();
        let run = (spec.start)(stop.clone());
        let id = spec.id.clone();
        let task = crate::background::spawn(async move {
            let failed = match std::panic::AssertUnwindSafe(run).catch_unwind().await {
                Ok(Ok(())) => false,
                Ok(Err(error)) => {
                    tracing::warn!(child = %id, error = %ErrorChain(&*error), "supervised task failed");
                    true
                }
                Err(_) => {
                    tracing::error!(child = %id, "supervised task panicked");
                    true
                }
            };
            exited(failed);
        });
        TaskRun {
            generation,
            stop,
            task,
        }
    }

    /// Asks it to stop, waits at most `grace` for it to end, and aborts it past that.
    pub async fn stop_within(self, grace: Duration) {
        self.stop.stop();
        crate::background::join_within(self.task, grace).await;
    }

    /// Asks it to stop without waiting.
    pub(super) fn signal(&self) {
        self.stop.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stop_given_before_or_while_waiting_is_seen() {
        let early = StopSignal::new();
        early.stop();
        tokio::time::timeout(Duration::from_secs(1), early.stopped())
            .await
            .expect("a stop given before the wait");
        let late = StopSignal::new();
        let waiter = tokio::spawn({
            let late = late.clone();
            async move { late.stopped().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        late.stop();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("a stop given while waiting")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_incarnation_reports_its_end_and_a_slow_one_is_aborted_past_its_grace() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let report = |tx: tokio::sync::mpsc::UnboundedSender<bool>| {
            move |failed| {
                let _ = tx.send(failed);
            }
        };
        let ok = TaskSpec::new("ok", |stop: StopSignal| async move {
            stop.stopped().await;
            Ok::<(), std::io::Error>(())
        });
        let run = TaskRun::start(&ok, 1, report(tx.clone()));
        run.stop_within(Duration::from_secs(1)).await;
        assert_eq!(rx.recv().await, Some(false));
        let failing = TaskSpec::new("failing", |_| async {
            Err::<(), _>(std::io::Error::other("boom"))
        });
        let _run = TaskRun::start(&failing, 1, report(tx.clone()));
        assert_eq!(rx.recv().await, Some(true));
        let panicking = TaskSpec::new("panicking", |_| async {
            panic!("in the task");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
        let _run = TaskRun::start(&panicking, 1, report(tx.clone()));
        assert_eq!(rx.recv().await, Some(true));
        // Deaf to its stop: aborted after the grace, and an abort reports nothing.
        let deaf = TaskSpec::new("deaf", |_| async {
            std::future::pending::<()>().await;
            Ok::<(), std::io::Error>(())
        });
        let run = TaskRun::start(&deaf, 1, report(tx));
        let started = tokio::time::Instant::now();
        run.stop_within(Duration::from_secs(2)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(rx.recv().await, None);
    }
}
