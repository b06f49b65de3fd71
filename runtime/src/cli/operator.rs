//! The operator's read-only commands: `runtime status`, `runtime doctor`, `runtime trace` and
//! `runtime presence`, their arguments, and how each prints.

use std::fmt;
use std::time::Duration;

use clap::Args;
use runtime::SystemError;

use super::{HubArgs, NatsArgs, StatusArgs};

/// How long `runtime status` collects worker snapshots.
const WORKER_STATUS_WINDOW: Duration = Duration::from_millis(500);

/// `runtime doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Measure with this agent's inbox consumer (what an agent's grants allow) instead of the
    /// ingress stream's info (an operator's or a router's).
    #[arg(long, value_name = "ID", env = "RUNTIME_AGENT_ID")]
    pub agent: Option<String>,

    /// The hub's stream names.
    #[command(flatten)]
    pub hub: HubArgs,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The DM's `meta.id` or the task id.
    pub id: String,

    /// One JSON object per event, one per line.
    #[arg(long)]
    pub json: bool,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime presence`.
#[derive(Debug, Args)]
pub struct PresenceArgs {
    /// One JSON object per agent, one per line.
    #[arg(long)]
    pub json: bool,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// One event of `runtime trace`, as printed without `--json`:
/// `+<ms> ms <event> by <actor>[ attempt <n>][ <details>]`.
pub struct TraceLine<'a>(pub &'a protocol::audit::TimelineRow);

impl fmt::Display for TraceLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = self.0;
        let e = &row.event;
        write!(f, "+{} ms {} by {}", row.after_ms, e.event, e.actor)?;
        if let Some(attempt) = e.attempt {
            write!(f, " attempt {attempt}")?;
        }
        if !e.details.is_empty() {
            let details = serde_json::to_string(&e.details).map_err(|_| fmt::Error)?;
            write!(f, " {details}")?;
        }
        Ok(())
    }
}

/// One agent of `runtime presence`, as printed without `--json`:
/// `<agent> <state> last seen <n> s ago`.
pub struct PresenceLine<'a>(pub &'a runtime::system::presence::PresenceEntry);

impl fmt::Display for PresenceLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entry = self.0;
        let state = match entry.state {
            protocol::presence::PresenceState::Online => "online",
            protocol::presence::PresenceState::Offline => "offline",
            protocol::presence::PresenceState::Unknown => "unknown",
        };
        write!(
            f,
            "{} {state} last seen {} s ago",
            entry.agent, entry.seen_secs_ago
        )
    }
}

/// `runtime trace ID`: the timeline of a DM or task from the audit trail, one line per event.
///
/// # Errors
/// Connection and read errors.
pub async fn trace(args: TraceArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-trace").await?;
    for row in runtime::system::trace::trace(&client, &args.id).await? {
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            println!("{}", TraceLine(&row));
        }
    }
    Ok(())
}

/// `runtime presence`: every agent, online or offline, and when it was last seen.
///
/// # Errors
/// Connection and read errors.
pub async fn presence(args: PresenceArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-presence").await?;
    for entry in runtime::system::presence::list(&client).await? {
        if args.json {
            println!("{}", serde_json::to_string(&entry)?);
        } else {
            println!("{}", PresenceLine(&entry));
        }
    }
    Ok(())
}

/// A finding of `runtime doctor` (exit 1): the report is printed before it.
#[derive(Debug, thiserror::Error)]
#[error("clock_skew: this host's clock is {offset_ms} ms off the server's (more than 30 s)")]
pub struct ClockSkew {
    offset_ms: i64,
}

/// `runtime doctor` could not read the server's clock (exit 69: the hub is unavailable to it).
#[derive(Debug, thiserror::Error)]
#[error("cannot read the server's time")]
pub struct NoServerTime {
    #[source]
    source: actors::clock::MeasureError,
}

/// `runtime doctor`: this host's clock against the server's, as one JSON line.
///
/// # Errors
/// [`ClockSkew`] when it is more than 30 s off, [`NoServerTime`] when the server's time cannot
/// be read, connection errors.
pub async fn doctor(args: DoctorArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-doctor").await?;
    let delivery = args.hub.delivery()?;
    let subject = match &args.agent {
        Some(id) => {
            let id = protocol::AgentId::new(id.as_str())
                .map_err(|e| SystemError::InvalidSetting(format!("--agent: {e}")))?;
            protocol::subjects::consumer_info_request(
                &delivery.inbox.name,
                &protocol::subjects::inbox_consumer(&id),
            )
        }
        None => protocol::subjects::stream_info_request(&delivery.ingress.name),
    };
    let clock = actors::clock::ServerClock::new("runtime-doctor");
    let measured = clock
        .measure(&client, &subject)
        .await
        .map_err(|e| NoServerTime { source: e })?;
    let verdict = protocol::clock::skew_verdict(measured.offset_ms);
    println!(
        "{}",
        serde_json::json!({
            "clock_offset_ms": measured.offset_ms,
            "uncertainty_ms": measured.uncertainty_ms,
            "clock": verdict,
        })
    );
    match verdict {
        protocol::clock::SkewVerdict::Ok => Ok(()),
        protocol::clock::SkewVerdict::Skewed => Err(ClockSkew {
            offset_ms: measured.offset_ms,
        }
        .into()),
    }
}

/// `runtime status`: the router's snapshot, every worker's under `workers`, and on a durable
/// hub the agents' presence when this identity may list it.
///
/// # Errors
/// No router, no answer in time, connection errors.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-status").await?;
    let snapshot = runtime::request_status(&client, Duration::from_secs(args.timeout_secs)).await?;
    // The router's snapshot, plus `workers`: the snapshot of every worker that answered
    // within the window.
    let workers = runtime::request_worker_status(&client, WORKER_STATUS_WINDOW).await?;
    let mut out = serde_json::to_value(&snapshot)?;
    if let Some(object) = out.as_object_mut() {
        object.insert("workers".into(), serde_json::to_value(workers)?);
        // The agents' presence on a durable hub, when this identity may list it (an
        // operator's); a core hub has no JetStream to ask.
        let durable = object.get("durable") == Some(&serde_json::Value::Bool(true));
        if durable {
            if let Ok(presence) = runtime::system::presence::list(&client).await {
                object.insert("presence".into(), serde_json::to_value(presence)?);
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
