//! `runtime agent remove|restore`: removing an agent from a durable hub, and letting it back
//! (docs/PROTOCOL.md, "Removing an agent"; [`runtime::system::removal`]). An operator's
//! command, on admin credentials.

use clap::{Args, Subcommand};
use runtime::system::removal;
use runtime::SystemError;

use super::{HubArgs, NatsArgs};

/// `runtime agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: AgentAction,
}

/// `runtime agent remove|restore`.
#[derive(Debug, Subcommand)]
pub enum AgentAction {
    /// Remove an agent: its DMs are refused from now on (`recipient_deleted`), its inbox
    /// consumer is deleted, and every DM still waiting for it is dead-lettered (reason
    /// `recipient_deleted`) with its sender told. Safe to run again.
    Remove(AgentTarget),
    /// Let a removed agent back: it may attach and receive DMs again.
    Restore(AgentTarget),
}

/// The agent a `runtime agent` action is about, and where the hub is.
#[derive(Debug, Args)]
pub struct AgentTarget {
    /// The agent's id.
    pub id: String,
    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,
    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// Runs `runtime agent`, printing one JSON line of what it did on stdout.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid agent id; connection and request errors.
pub async fn agent(args: AgentArgs, print: impl Fn(&str)) -> Result<(), SystemError> {
    let (remove, target) = match args.action {
        AgentAction::Remove(target) => (true, target),
        AgentAction::Restore(target) => (false, target),
    };
    let delivery = target.hub.delivery()?;
    let agent = protocol::AgentId::new(target.id.as_str()).map_err(|e| super::invalid("ID", &e))?;
    let client = target.nats.settings().connect("runtime-agent").await?;
    let line = if remove {
        let done = removal::remove(&client, &delivery, &agent).await?;
        serde_json::to_string(&done).expect("a summary serializes")
    } else {
        let restored = removal::restore(&client, &agent).await?;
        serde_json::json!({"agent": agent, "restored": restored}).to_string()
    };
    let _ = client.flush().await;
    print(&line);
    Ok(())
}
