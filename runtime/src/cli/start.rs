//! `runtime start`: a router, a worker, or both, until SIGINT or SIGTERM.

use std::time::Duration;

use anyhow::Context as _;
use runtime::{ActorSystem, SystemError};

use super::{Role, StartArgs};

/// How long a cancelled `--exec` handler has between SIGTERM and SIGKILL.
const EXEC_KILL_GRACE: Duration = Duration::from_secs(5);

/// Runs `runtime start` until SIGINT or SIGTERM, then shuts down within the grace.
///
/// # Errors
/// A usage error (a worker without `--durable`, an invalid id or user), a broker that cannot
/// be reached, a part that does not start.
pub async fn start(args: StartArgs) -> anyhow::Result<()> {
    let signals =
        runtime::shutdown::Signals::install().context("cannot install signal handlers")?;
    let delivery = runtime::config::load_delivery_config(args.delivery_config.as_deref())
        .map_err(SystemError::from)?;
    let worker = match args.role {
        Role::Router => None,
        Role::Worker | Role::All => Some(worker_settings(&args)?),
    };
    if worker.is_some() && !args.durable {
        return Err(SystemError::InvalidSetting(
            "the worker role needs --durable (tasks are stored in JetStream)".into(),
        )
        .into());
    }
    let system = ActorSystem::builder()
        .nats(args.nats.settings())
        .durable(args.durable)
        .delivery_config(delivery)
        .build()
        .await?;
    if args.role != Role::Worker {
        system.start_router().await?;
    }
    if let Some(settings) = worker {
        system.start_worker(settings).await?;
    }
    tracing::info!(
        role = ?args.role,
        durable = args.durable,
        nats_url = %args.nats.nats_url,
        "running; SIGINT or SIGTERM stops it"
    );
    signals.recv().await;
    tracing::info!("shutting down");
    system
        .shutdown(Duration::from_secs(args.shutdown_grace_secs))
        .await?;
    Ok(())
}

fn worker_settings(
    args: &StartArgs,
) -> Result<runtime::system::worker::WorkerSettings, SystemError> {
    let invalid = super::invalid;
    let worker_id = protocol::WorkerId::new(args.worker_id.clone().unwrap_or_default())
        .map_err(|e| invalid("--worker-id", &e))?;
    let queue = protocol::QueueName::new(args.queue.clone().unwrap_or_default())
        .map_err(|e| invalid("--queue", &e))?;
    let command = args.exec.clone().unwrap_or_default();
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let run_as = args
        .exec_user
        .as_deref()
        .map(actors::worker::RunAs::lookup)
        .transpose()
        .map_err(|e| SystemError::InvalidSetting(format!("--exec-user: {e}")))?;
    Ok(runtime::system::worker::WorkerSettings {
        worker_id,
        queue,
        concurrency: usize::from(args.concurrency),
        journal_dir: args.journal_dir.clone(),
        // A cancelled `--exec` process gets SIGTERM, then SIGKILL after this long.
        handler: std::sync::Arc::new(actors::worker::ExecHandler {
            command,
            grace: EXEC_KILL_GRACE.min(grace),
            run_as,
        }),
        shutdown_grace: grace,
    })
}
