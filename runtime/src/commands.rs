//! The client subcommands of the binary: `runtime send` and `runtime inbox`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::{AgentId, Envelope, MessageId, Meta};

use crate::cli::{InboxArgs, SendArgs};
use crate::system::messaging::Receipt;
use crate::{ActorSystem, SystemError};

fn agent(flag: &str, value: &str) -> Result<AgentId, SystemError> {
    AgentId::new(value).map_err(|e| SystemError::InvalidSetting(format!("{flag}: {e}")))
}

/// Whether the hub is durable: the ingress stream exists.
async fn hub_is_durable(client: &async_nats::Client) -> bool {
    let js = async_nats::jetstream::new(client.clone());
    let name = protocol::config::DeliveryConfig::default().ingress.name;
    matches!(
        tokio::time::timeout(Duration::from_secs(5), js.get_stream(name)).await,
        Ok(Ok(_))
    )
}

/// `runtime send --as alice --to bob TEXT`: a JetStream publish to the ingress when the hub is
/// durable (the receipt carries the ingress sequence), a core publish otherwise.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid identity or id; connection and publish
/// errors.
pub async fn send(args: SendArgs) -> Result<Receipt, SystemError> {
    let from = agent("--as", &args.as_id)?;
    let to = agent("--to", &args.to)?;
    let id = match args.id {
        Some(id) => {
            MessageId::new(id).map_err(|e| SystemError::InvalidSetting(format!("--id: {e}")))?
        }
        None => crate::system::messaging::new_message_id(),
    };
    let client = args.nats.settings().connect("runtime-send").await?;
    let durable = hub_is_durable(&client).await;
    let system = ActorSystem::builder()
        .client(client)
        .durable(durable)
        .build()
        .await?;
    // The trace of a DM starts here: the publish carries this span's `traceparent`, so the
    // router's `route` span and the recipient's handler span join this trace.
    let span = tracing::info_span!("send", from = %from, to = %to, id = %id);
    let mut meta = Meta::new(id);
    meta.to = Some(to);
    let envelope = Envelope {
        meta,
        body: serde_json::Value::String(args.text),
        extra: Default::default(),
    };
    let receipt = tracing::Instrument::instrument(
        system.send_envelope(&from, &protocol::Channel::Inbox, &envelope),
        span,
    )
    .await?;
    let _ = system.client().flush().await;
    Ok(receipt)
}

/// `runtime inbox --as bob [--follow] [--json]`: prints each DM on stdout; without `--follow`
/// exits once no DM arrived for `--idle-secs`.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid identity or mode; connection and bind errors.
pub async fn inbox(args: InboxArgs) -> Result<(), SystemError> {
    let id = agent("--as", &args.as_id)?;
    let mode: DurableInboxMode =
        args.durable_inbox
            .parse()
            .map_err(|e: protocol::attach::InvalidInboxMode| {
                SystemError::InvalidSetting(e.to_string())
            })?;
    let signals = crate::shutdown::Signals::install()
        .map_err(|e| SystemError::InvalidSetting(format!("cannot install signal handlers: {e}")))?;
    let client = args.nats.settings().connect("runtime-inbox").await?;
    let durable = mode != DurableInboxMode::Off && hub_is_durable(&client).await;
    let system = ActorSystem::builder()
        .client(client)
        .durable(durable)
        .inbox_mode(mode)
        .build()
        .await?;
    let json = args.json;
    let count = Arc::new(AtomicU64::new(0));
    let seen = count.clone();
    system
        .attach_inbox(&id, move |d| {
            let line = if json {
                serde_json::to_string(&d.envelope).unwrap_or_default()
            } else {
                let from = d
                    .envelope
                    .meta
                    .from
                    .as_ref()
                    .map_or("hub", |f| f.as_str())
                    .to_string();
                let body = match &d.envelope.body {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("{from}: {body}")
            };
            println!("{line}");
            seen.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {})
        })
        .await?;
    if args.follow {
        signals.recv().await;
    } else {
        let idle = Duration::from_secs(args.idle_secs);
        let mut last = count.load(Ordering::Relaxed);
        let wait_idle = async {
            loop {
                tokio::time::sleep(idle).await;
                let now = count.load(Ordering::Relaxed);
                if now == last {
                    break;
                }
                last = now;
            }
        };
        tokio::select! {
            _ = wait_idle => {}
            _ = signals.recv() => {}
        }
    }
    system.shutdown(Duration::from_secs(10)).await
}

/// What `runtime delegate` printed.
#[derive(Debug, serde::Serialize)]
pub struct DelegateOutcome {
    /// The receipt (absent with `--resume`).
    pub receipt: Option<crate::system::tasks::TaskReceipt>,
    /// The final result, with `--wait` or `--resume`.
    pub result: Option<protocol::task::TaskResult>,
}

/// `runtime delegate`: submits a task (and waits for its result with `--wait`), or finds a
/// task's result from its stored channel with `--resume`. A timeout does not cancel the task;
/// Ctrl-C while waiting sends a cancel to the task's worker.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for invalid ids; [`SystemError::Timeout`] when no result
/// arrived in time; connection and publish errors.
pub async fn delegate(
    args: crate::cli::DelegateArgs,
    print: impl Fn(&str),
) -> Result<DelegateOutcome, SystemError> {
    use protocol::{QueueName, TaskId, WorkerId};
    let invalid =
        |flag: &str, e: &dyn std::fmt::Display| SystemError::InvalidSetting(format!("{flag}: {e}"));
    let client = args.nats.settings().connect("runtime-delegate").await?;
    let system = ActorSystem::builder()
        .client(client)
        .durable(true)
        .build()
        .await?;
    let (receipt, task_id, tracking) = match &args.resume {
        Some(id) => (
            None,
            TaskId::new(id.as_str()).map_err(|e| invalid("--resume", &e))?,
            None,
        ),
        None => {
            let from = agent("--as", args.as_id.as_deref().unwrap_or_default())?;
            let queue = QueueName::new(args.queue.clone().unwrap_or_default())
                .map_err(|e| invalid("--queue", &e))?;
            let worker = args
                .worker
                .as_deref()
                .map(WorkerId::new)
                .transpose()
                .map_err(|e| invalid("--worker", &e))?;
            let mut spec = crate::system::tasks::new_task(
                args.text.clone().unwrap_or_default(),
                args.context.clone(),
            );
            spec.idempotency_key = args.idempotency_key.clone();
            if spec.text.trim().is_empty() {
                return Err(SystemError::InvalidSetting(
                    "TEXT: a task needs a non-blank text".into(),
                ));
            }
            // With --wait the tracker subscribes before the task is submitted.
            let (receipt, tracking) = if args.wait {
                let (receipt, tracking) = system
                    .delegate_tracked(&from, &queue, worker.as_ref(), &spec)
                    .await?;
                (receipt, Some(tracking))
            } else {
                let receipt = system
                    .delegate(&from, &queue, worker.as_ref(), &spec)
                    .await?;
                (receipt, None)
            };
            print(&serde_json::to_string(&receipt).unwrap_or_default());
            let task_id = receipt.task_id.clone();
            (Some(receipt), task_id, tracking)
        }
    };
    let mut result = None;
    if args.wait || args.resume.is_some() {
        let signals = crate::shutdown::Signals::install().map_err(|e| {
            SystemError::InvalidSetting(format!("cannot install signal handlers: {e}"))
        })?;
        let tracking = match tracking {
            Some(tracking) => tracking,
            None => system.track(&task_id).await?,
        };
        let limit = Duration::from_secs(args.timeout_secs);
        let waited = tokio::select! {
            waited = tokio::time::timeout(limit, tracking.result) => waited,
            _ = signals.recv() => {
                // Ctrl-C while waiting cancels the task (a timeout does not).
                let cancel = crate::task_commands::control(
                    system.client(),
                    &task_id,
                    protocol::subjects::ControlKind::Cancel,
                )
                .await;
                let _ = system.shutdown(Duration::from_secs(5)).await;
                return Err(SystemError::Request(match cancel {
                    Ok(reply) => format!("interrupted; cancel of task {task_id} sent: {reply}"),
                    Err(e) => format!("interrupted; cancel of task {task_id} not delivered: {e}"),
                }));
            }
        };
        match waited {
            Ok(Ok(r)) => {
                print(&serde_json::to_string(&r).unwrap_or_default());
                result = Some(r);
            }
            Ok(Err(_)) => {
                return Err(SystemError::Request(
                    "the task tracker stopped without a result".into(),
                ))
            }
            Err(_) => {
                let _ = system.shutdown(Duration::from_secs(5)).await;
                return Err(SystemError::Timeout {
                    what: format!("the result of task {task_id} (the task is not cancelled; `runtime delegate --resume {task_id}` finds it later)"),
                });
            }
        }
    }
    system.shutdown(Duration::from_secs(5)).await?;
    Ok(DelegateOutcome { receipt, result })
}
