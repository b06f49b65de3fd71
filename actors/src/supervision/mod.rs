//! Supervision trees: supervisors that restart their failed children, OTP style.
//!
//! A supervisor is described by a [`SupervisorSpec`]: a [`Strategy`] (which children restart
//! together), an [`Intensity`] (how many restarts within which window it tolerates before it
//! fails itself, upward to its own supervisor) and its [`ChildSpec`]s, started in order. Each
//! child has a [`Restart`] policy (is it restarted after a normal stop? after a failure?) and a
//! [`Backoff`] (exponential delay between its consecutive restarts).
//!
//! A failure is an error returned or a panic raised by the child, in `pre_start` (the restart
//! itself fails: it is retried after the next backoff delay) or later. A restarted child gets
//! fresh arguments, so its state is rebuilt from them.
//!
//! Supervisors nest: [`ChildSpec::supervisor`] makes a supervisor the child of another, which
//! restarts it, with its whole subtree, when it exceeds its restart intensity.
//!
//! A [`DynamicSupervisor`] takes children while it runs (one per attached inbox): each is
//! restarted on its own, and one that exceeds its intensity is given up, not its siblings. Its
//! children may be actors or tasks ([`task`]: one tokio task per incarnation, for the children
//! a host holds by the thousand).
//!
//! Every supervisor answers [`snapshot`] with a serializable [`SupervisorSnapshot`] of its
//! children's restart counts and liveness.
//!
//! [`shutdown`] stops a tree gracefully: children in reverse start order, with their
//! `post_stop`, without restarting them.
//!
//! The restart machinery is the `ractor-supervisor` crate; this module is its thin, typed front.
//!
//! # Child ids are registry names
//!
//! A child's id is its name in ractor's process-global registry (the supervisor recognises its
//! children by name), so ids must be unique in the whole process, not only in one supervisor.
//!
//! # Example
//!
//! ```ignore
//! use actors::supervision::{self, Backoff, ChildSpec, Intensity, Restart, Strategy, SupervisorSpec};
//!
//! let spec = SupervisorSpec::new(Strategy::OneForOne)
//!     .with_intensity(Intensity::new(5, Duration::from_secs(10)))
//!     .child(ChildSpec::actor("router", Router, move || router_args.clone()))
//!     .child(
//!         ChildSpec::actor("inbox-orders", InboxConsumer, || InboxArgs::new("orders"))
//!             .with_restart(Restart::Transient)
//!             .with_backoff(Backoff::new(Duration::from_millis(200), Duration::from_secs(30), 2)),
//!     )
//!     .child(ChildSpec::supervisor("workers", workers_spec));
//! let (root, join) = supervision::spawn_supervisor(Some("root".into()), spec).await?;
//! let snap = supervision::snapshot(&root).await?; // serde::Serialize
//! // ...
//! supervision::shutdown(&root, Duration::from_secs(5)).await;
//! ```

mod backoff;
pub mod dynamic;
mod shutdown;
mod snapshot;
mod spec;
mod supervisor;
pub mod task;

pub use backoff::Backoff;
pub use dynamic::{DynamicRef, DynamicSnapshot, DynamicSupervisor};
pub use shutdown::shutdown;
pub use snapshot::{
    snapshot, snapshot_within, ChildSnapshot, SnapshotError, SupervisorSnapshot, SNAPSHOT_TIMEOUT,
};
pub use spec::{ChildSpec, Intensity, Restart, SpawnFn, Strategy, SupervisorSpec};
pub use supervisor::{spawn_supervisor, spawn_supervisor_linked, SupervisorRef};

/// The message type of a supervisor actor (see [`SupervisorRef`]).
pub use ractor_supervisor::SupervisorMsg;
