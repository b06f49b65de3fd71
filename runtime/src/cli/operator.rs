//! The arguments of the operator's read-only commands: `runtime doctor`, `runtime trace` and
//! `runtime presence`.

use clap::Args;

use super::{HubArgs, NatsArgs};

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
