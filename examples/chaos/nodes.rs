//! The NATS side of a chaos run: one node, or a 3-node cluster with every stream R3, and the
//! faults that hit it.

use std::time::Duration;

use harness::{Cluster, HarnessError, NatsServer, ServerOptions};

/// One node or a cluster, each node with `sync_interval: always`.
pub enum Nodes {
    /// One nats-server.
    Single(Box<NatsServer>),
    /// A 3-node cluster.
    Cluster(Cluster),
}

impl Nodes {
    /// Starts one node, or a 3-node cluster when `cluster`, and waits until it takes streams.
    ///
    /// # Errors
    /// When a node does not start or the cluster does not become ready.
    pub async fn start(cluster: bool) -> Result<Nodes, HarnessError> {
        if cluster {
            return Ok(Nodes::Cluster(Cluster::start(3).await?));
        }
        let options = ServerOptions {
            sync_always: true,
            ..ServerOptions::default()
        };
        Ok(Nodes::Single(Box::new(NatsServer::run(options).await?)))
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        match self {
            Nodes::Single(_) => 1,
            Nodes::Cluster(c) => c.size(),
        }
    }

    /// The stream replicas this deployment takes.
    pub fn replicas(&self) -> usize {
        self.len()
    }

    /// Every node's URL, comma-separated (what `--nats-url` takes).
    pub fn urls(&self) -> String {
        match self {
            Nodes::Single(s) => s.url(),
            Nodes::Cluster(c) => c.urls(),
        }
    }

    /// A client of the harness's own, for stream state and step-downs.
    ///
    /// # Errors
    /// When no node can be reached.
    pub async fn client(&self) -> Result<async_nats::Client, HarnessError> {
        match self {
            Nodes::Single(s) => s.client().await,
            Nodes::Cluster(c) => c.client().await,
        }
    }

    /// `kill -9` of node `i`, and its restart on its store after `down`.
    ///
    /// # Errors
    /// When the node does not start again.
    pub async fn kill_and_restart(&mut self, i: usize, down: Duration) -> Result<(), HarnessError> {
        match self {
            Nodes::Single(s) => {
                s.stop().await;
                tokio::time::sleep(down).await;
                s.start().await
            }
            Nodes::Cluster(c) => {
                c.kill(i).await;
                tokio::time::sleep(down).await;
                c.restart(i).await
            }
        }
    }

    /// Freezes node `i` (SIGSTOP) for `paused`, then resumes it.
    pub async fn pause(&self, i: usize, paused: Duration) {
        match self {
            Nodes::Single(s) => s.freeze(),
            Nodes::Cluster(c) => c.pause(i),
        }
        tokio::time::sleep(paused).await;
        match self {
            Nodes::Single(s) => s.thaw(),
            Nodes::Cluster(c) => c.resume(i),
        }
    }

    /// Asks `stream`'s leader to step down (a cluster only).
    ///
    /// # Errors
    /// When the request is refused or unanswered (no leader at the moment, say).
    pub async fn step_down(
        &self,
        client: &async_nats::Client,
        stream: &str,
    ) -> Result<(), HarnessError> {
        match self {
            Nodes::Single(_) => Err(HarnessError::Monitor(
                "a single node has no leader to step down".into(),
            )),
            Nodes::Cluster(c) => c.step_down(client, stream).await,
        }
    }

    /// Every node's log.
    pub fn logs(&self) -> String {
        match self {
            Nodes::Single(s) => s.log(),
            Nodes::Cluster(c) => c.logs(),
        }
    }
}
