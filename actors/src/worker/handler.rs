//! The task handler interface: what a worker runs for each attempt.

pub use protocol::task::Outcome;
use protocol::task::{Answer, AttemptId, TaskSpec};
use protocol::{TaskId, WorkerId};
use tokio::sync::watch;

/// What a handler knows about the attempt it runs.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    /// The task.
    pub task_id: TaskId,
    /// The attempt (stable across a re-run after a crash).
    pub attempt_id: AttemptId,
    /// This worker.
    pub worker_id: WorkerId,
    /// The same attempt ran before and crashed without saving a result: its effects may
    /// repeat.
    pub rerun: bool,
    /// Turns `true` when the attempt is cancelled.
    pub cancelled: watch::Receiver<bool>,
}

impl AttemptContext {
    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Resolves once cancellation is requested (never, if the attempt is dropped first).
    pub async fn cancelled(&self) {
        let mut rx = self.cancelled.clone();
        if rx.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs tasks. One call per attempt; `resume` is called with every accepted answer so far
/// when a waiting attempt is answered.
///
/// # Cancel safety
///
/// The future a handler returns may be dropped at any await point: when the worker fails or
/// stops, and when a graceful shutdown hands the input back (after the grace, and after the
/// cancelled handler was given a bounded time to end). Nothing it did is rolled back, and its
/// outcome is not recorded: the attempt is run again elsewhere (flagged `rerun`). Keep effects
/// idempotent or keyed by `task_id`/`attempt_id`, and hold external resources in values whose
/// `Drop` releases them. A cancel is first signalled through [`AttemptContext::cancelled`],
/// which a handler should watch to stop on its own terms.
#[async_trait::async_trait]
pub trait TaskHandler: Send + Sync + 'static {
    /// Runs `task` from the start.
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome;

    /// Resumes a waiting attempt with all answers accepted so far (oldest first).
    async fn resume(&self, task: TaskSpec, answers: Vec<Answer>, ctx: AttemptContext) -> Outcome {
        let _ = (task, answers, ctx);
        Outcome::Failed("resume not supported".into())
    }
}
