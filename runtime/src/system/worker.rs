//! Running a worker through an [`ActorSystem`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actors::supervision::{ChildSpec, Strategy, SupervisorSpec};
use actors::worker::{TaskHandler, Worker, WorkerMsg, WorkerSnapshot};
use protocol::{QueueName, WorkerId};

use super::{ActorSystem, SystemError};

/// How long [`ActorSystem::start_worker`] waits for the worker to join its queue: four
/// [`actors::worker::DEFAULT_JOIN_TIMEOUT`]s (60 s), room for three joins and the supervisor's
/// pauses between them, so a router a busy cluster makes slow still takes the worker in.
const WORKER_START_DEADLINE: Duration =
    Duration::from_secs(actors::worker::DEFAULT_JOIN_TIMEOUT.as_secs() * 4);

/// How to run a worker.
pub struct WorkerSettings {
    /// The worker's identity.
    pub worker_id: WorkerId,
    /// The queue it takes tasks from.
    pub queue: QueueName,
    /// Attempts at once (1–1024); one task is fetched per free slot.
    pub concurrency: usize,
    /// Where the journal lives (`<dir>/<worker_id>/`).
    pub journal_dir: PathBuf,
    /// Runs the tasks.
    pub handler: Arc<dyn TaskHandler>,
    /// How long a graceful stop lets running attempts finish before their inputs are handed
    /// back to other workers (the CLI's `--shutdown-grace-secs`).
    pub shutdown_grace: Duration,
}

impl WorkerSettings {
    /// Settings with the default concurrency and shutdown grace.
    pub fn new(
        worker_id: WorkerId,
        queue: QueueName,
        journal_dir: PathBuf,
        handler: Arc<dyn TaskHandler>,
    ) -> WorkerSettings {
        WorkerSettings {
            worker_id,
            queue,
            concurrency: actors::worker::DEFAULT_CONCURRENCY,
            journal_dir,
            handler,
            shutdown_grace: actors::worker::DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

impl ActorSystem {
    /// The actor name of worker `id` (fault-injection key).
    pub fn worker_name(&self, id: &WorkerId) -> String {
        format!("{}/worker-{id}", self.id)
    }

    /// Starts a worker under its own one-for-one supervisor and waits until it has joined its
    /// queue (the router created its consumers) and bound them.
    ///
    /// The journal is checked first, so a second process with the same worker identity and
    /// journal directory is refused here with the lock holder named.
    ///
    /// # Errors
    /// [`SystemError::Journal`] when the journal is locked or unreadable,
    /// [`SystemError::Spawn`], or [`SystemError::Timeout`] when the worker does not join (no
    /// router answering, incompatible consumer).
    pub async fn start_worker(&self, settings: WorkerSettings) -> Result<(), SystemError> {
        let probe_dir = settings.journal_dir.clone();
        let probe_id = settings.worker_id.to_string();
        tokio::task::spawn_blocking(move || actors::journal::Journal::open(&probe_dir, &probe_id))
            .await
            .map_err(|e| SystemError::spawn("the journal check", e))??;
        let name = self.worker_name(&settings.worker_id);
        let mut worker = Worker::new(
            name.clone(),
            self.client.clone(),
            settings.worker_id.clone(),
            settings.queue,
            settings.journal_dir,
            settings.handler,
        );
        // The heartbeat period comes from the consumers the worker binds (their ack wait is the
        // router's `ack_wait_secs`), not from this system's delivery config.
        worker.concurrency = settings.concurrency;
        worker.shutdown_grace = settings.shutdown_grace;
        worker.reply_prefix = self.reply_prefix.clone();
        worker.audit_events = self.delivery.audit_events;
        let spec = SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(
            name.clone(),
            worker,
            || (),
        ));
        self.spawn_tree_of(
            format!("{name}-sup"),
            spec,
            Some(settings.worker_id.clone()),
        )
        .await?;
        let deadline = tokio::time::Instant::now() + WORKER_START_DEADLINE;
        while self.worker_snapshot(&settings.worker_id).await.is_none() {
            if tokio::time::Instant::now() > deadline {
                return Err(SystemError::Timeout {
                    what: format!("worker {} to join its queue", settings.worker_id),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The snapshot of worker `id`, when it runs.
    pub async fn worker_snapshot(&self, id: &WorkerId) -> Option<WorkerSnapshot> {
        let cell = ractor::registry::where_is(self.worker_name(id))?;
        let worker: ractor::ActorRef<WorkerMsg> = cell.into();
        ractor::call_t!(worker, WorkerMsg::Snapshot, 5_000).ok()
    }
}
