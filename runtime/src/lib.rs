//! The hub runtime: the [`ActorSystem`] embedding API, configuration loading, telemetry and
//! the `runtime` binary's command line.
//!
//! A custom host embeds the same runtime the binary runs:
//!
//! ```no_run
//! # async fn demo() -> Result<(), runtime::SystemError> {
//! use runtime::{ActorSystem, NatsSettings};
//! let delivery = runtime::config::load_delivery_config(None)?; // defaults
//! let system = ActorSystem::builder()
//!     .nats(NatsSettings::new("nats://127.0.0.1:4222"))
//!     .durable(true)
//!     .delivery_config(delivery)
//!     .build()
//!     .await?;
//! system.start_router().await?; // provisions HUB_INGRESS, HUB_INBOX, HUB_TASKS
//! let snapshot = system.snapshot().await?;
//! assert!(snapshot.router.is_some());
//! system.shutdown(std::time::Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```
//!
//! # Errors
//! Every fallible API returns [`SystemError`]; [`SystemError::is_usage`] and
//! [`SystemError::is_unavailable`] classify it for exit codes.

pub mod config;
pub mod connect;
pub mod exit;
pub mod shutdown;
pub mod system;
pub mod telemetry;

/// What a host writes its inbox handlers and task handlers with.
pub use actors::inbox::{Delivery, Handled};
pub use actors::worker::{AttemptContext, Outcome, TaskHandler};
pub use connect::{ConnectError, NatsSettings, PING_INTERVAL};
/// The ids, envelopes and task types a host sends, receives and runs.
pub use protocol::task::{Answer, TaskChannelBody, TaskResult, TaskSpec, TaskState};
pub use protocol::{
    AgentId, Channel, Codec, Envelope, MessageId, Meta, QueueName, TaskId, WorkerId,
};
pub use system::tasks::new_task;
pub use system::worker::WorkerSettings;
pub use system::{
    request_status, request_worker_status, ActorSystem, ActorSystemBuilder, SystemError,
    SystemSnapshot,
};
