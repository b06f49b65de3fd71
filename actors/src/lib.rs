//! Supervised ractor actors of the hub runtime.
//!
//! - [`supervision`]: supervision trees (strategies, restart policies, backoff, restart
//!   intensity, snapshots).
//! - [`fault`]: fault-injection hook to crash named actors on purpose in tests.
//! - [`attach`]: the attach actor (creates `inbox-<id>` on request).
//! - [`inbox`]: the inbox consumer actor (client side).
//! - [`journal`]: the worker's local durable journal (admissions, results, answers; one
//!   process per worker identity).
//! - [`consumers`]: the consumer configurations the router creates.
//! - [`dead_letter`]: a DM's dead-letter copy and its sender's `undeliverable` notice.
//! - [`removed`]: the routers' set of removed agents, fed by a watch of their tombstones.
//! - [`streams`]: creating or updating the JetStream streams to the configured limits.
//! - [`router`]: the router actor (stream provisioning and status answers).
//! - [`worker`]: the worker role (join a work queue, fetch one task per free slot, run each as
//!   an attempt actor with heartbeats, journal-before-publish and ack-after-publish).
//! - [`trace_context`]: W3C trace context between `tracing` spans and NATS headers.
//! - [`tracker`]: the trackers actor (delegator side): follows every tracked task's channel,
//!   live and stored, and delivers each final result exactly once.
//! - [`task_channel`]: reading a stored task channel with direct gets.
//! - [`counters`]: the counters every actor declares with [`counters!`].
//!
//! Every task an actor spawns is owned by its state (`background::Owned`, aborted on drop),
//! so none outlives its actor, however the actor ends.

pub mod attach;
pub mod audit;
mod background;
pub mod clock;
pub mod consumers;
pub mod counters;
pub mod dead_letter;
mod decode;
mod epoch;
pub mod expiry;
pub mod fault;
mod header_names;
pub mod history;
pub mod inbox;
pub mod ingress_seal;
pub mod journal;
pub mod removed;
mod reply;
pub mod router;
pub mod streams;
pub mod supervision;
pub mod task_channel;
pub mod task_claim;
pub mod trace_context;
pub mod tracker;
pub mod watchdog;
pub mod worker;

/// How long any JetStream publish of the runtime waits for its stream ack before its outcome
/// counts as uncertain (router stores, attempts' results, clients' sends).
pub const PUBLISH_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
