//! A JetStream cluster on loopback ([`Cluster`]): three (or more) [`NatsServer`]s, each with
//! its own client, monitoring and route ports, its own store, its own `server_name`
//! (`hub-test-<port>`) and `sync_interval: always`, routed to each other.
//!
//! Faults are real: [`Cluster::kill`] is `kill -9` of a node, [`Cluster::lame_duck`] its
//! graceful stop (leaders stepped down first), [`Cluster::restart`] starts it again on its store, [`Cluster::pause`] and [`Cluster::resume`] are SIGSTOP and SIGCONT,
//! [`Cluster::step_down`] asks a stream's leader to step down
//! (`$JS.API.STREAM.LEADER.STEPDOWN`). A partition is not modelled: a paused node is the
//! closest this harness comes (its peers see it silent, its connections stay open).

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::ServerAddr;
use tokio::time::Instant;

use crate::nats_server::{free_port, ClusterMember, NatsServer, ServerOptions};
use crate::HarnessError;

/// How long a new cluster may take to elect a meta leader and take a replicated stream.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// The stream [`Cluster::wait_ready`] creates and deletes to prove the cluster takes one.
const PROBE_STREAM: &str = "HARNESS_READY";

/// A running JetStream cluster on loopback. Dropping it kills every node and deletes their
/// stores.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<NatsServer>,
}

impl Cluster {
    /// Starts `size` nodes routed to each other, each with `sync_interval: always`, and waits
    /// until the cluster has a meta leader and takes a stream replicated on every node
    /// ([`wait_ready`](Self::wait_ready)).
    ///
    /// # Errors
    /// [`HarnessError::NotReady`] when a node does not start, [`HarnessError::Timeout`] when
    /// the cluster does not become ready in time.
    pub async fn start(size: usize) -> Result<Cluster, HarnessError> {
        let mut last = None;
        // Ports picked by binding :0 can be taken before a node binds them: try new ones.
        for _ in 0..3 {
            match Cluster::try_start(size).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    async fn try_start(size: usize) -> Result<Cluster, HarnessError> {
        let routes: Vec<u16> = (0..size).map(|_| free_port()).collect::<Result<_, _>>()?;
        let mut nodes = Vec::with_capacity(size);
        for route in &routes {
            let options = ServerOptions {
                sync_always: true,
                cluster: Some(ClusterMember {
                    name: "hub-test".into(),
                    port: *route,
                    routes: routes.clone(),
                }),
                ..ServerOptions::default()
            };
            nodes.push(NatsServer::unstarted(options, free_port()?, free_port()?)?);
        }
        for node in &mut nodes {
            node.start().await?;
        }
        let cluster = Cluster { nodes };
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// How many nodes it has.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`.
    ///
    /// # Panics
    /// When there is no node `i`.
    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    /// Every node's client URL, comma-separated (`NATS_URL`'s form for a cluster).
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(NatsServer::url).collect();
        urls.join(",")
    }

    /// A client that knows every node and reconnects to whichever answers.
    ///
    /// # Errors
    /// [`HarnessError::Connect`] when no node can be reached.
    pub async fn client(&self) -> Result<async_nats::Client, HarnessError> {
        let addrs: Vec<ServerAddr> = self
            .nodes
            .iter()
            .map(|n| n.url().parse())
            .collect::<Result<_, _>>()
            .map_err(|e: std::io::Error| HarnessError::Connect(e.to_string()))?;
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(addrs)
            .await
            .map_err(|e| HarnessError::Connect(e.to_string()))
    }

    /// Waits until the cluster has a meta leader and takes a stream replicated on every
    /// node: one is created and deleted.
    ///
    /// # Errors
    /// [`HarnessError::Timeout`] after a minute.
    pub async fn wait_ready(&self) -> Result<(), HarnessError> {
        let client = self.client().await?;
        let js = jetstream::new(client);
        let deadline = Instant::now() + READY_DEADLINE;
        let config = stream::Config {
            name: PROBE_STREAM.into(),
            subjects: vec!["harness.ready".into()],
            num_replicas: self.size(),
            ..Default::default()
        };
        loop {
            let created =
                tokio::time::timeout(Duration::from_secs(5), js.create_stream(config.clone()));
            if let Ok(Ok(_)) = created.await {
                let deleted =
                    tokio::time::timeout(Duration::from_secs(5), js.delete_stream(PROBE_STREAM));
                if let Ok(Ok(_)) = deleted.await {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Timeout {
                    what: format!("a {}-node cluster to take a replicated stream", self.size()),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The index of the node that leads `stream` now, from the stream's cluster info.
    ///
    /// # Errors
    /// [`HarnessError::Monitor`] when the stream info cannot be read or names no leader this
    /// cluster has.
    pub async fn stream_leader(
        &self,
        js: &jetstream::Context,
        stream: &str,
    ) -> Result<usize, HarnessError> {
        let info = tokio::time::timeout(Duration::from_secs(5), js.get_stream(stream))
            .await
            .map_err(|_| HarnessError::Monitor(format!("no stream info of {stream} in time")))?
            .map_err(|e| HarnessError::Monitor(e.to_string()))?
            .cached_info()
            .clone();
        let leader = info
            .cluster
            .and_then(|c| c.leader)
            .ok_or_else(|| HarnessError::Monitor(format!("{stream} has no leader")))?;
        self.index_of(&leader)
            .ok_or_else(|| HarnessError::Monitor(format!("{stream}'s leader {leader} is no node")))
    }

    /// The index of the node named `server_name`.
    pub fn index_of(&self, server_name: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.server_name() == server_name)
    }

    /// Asks `stream`'s leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN.<stream>`); the
    /// others elect a new one.
    ///
    /// # Errors
    /// [`HarnessError::Monitor`] when the request fails or is refused.
    pub async fn step_down(
        &self,
        client: &async_nats::Client,
        stream: &str,
    ) -> Result<(), HarnessError> {
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(subject, Vec::new().into()),
        )
        .await
        .map_err(|_| HarnessError::Monitor(format!("no stepdown reply for {stream}")))?
        .map_err(|e| HarnessError::Monitor(e.to_string()))?;
        let body: serde_json::Value = serde_json::from_slice(&reply.payload)
            .map_err(|e| HarnessError::Monitor(e.to_string()))?;
        match body.get("success").and_then(serde_json::Value::as_bool) {
            Some(true) => Ok(()),
            _ => Err(HarnessError::Monitor(format!(
                "stepdown of {stream} refused: {body}"
            ))),
        }
    }

    /// `kill -9` of node `i`; its store is kept.
    pub async fn kill(&mut self, i: usize) {
        self.nodes[i].stop().await;
    }

    /// Lame-duck mode for node `i` (a graceful stop: its leaders step down first, its clients
    /// are closed over 30 s, then it exits); [`kill`](Self::kill) it sooner once its leaders
    /// have moved.
    ///
    /// # Panics
    /// When the node is not running.
    pub fn lame_duck(&self, i: usize) {
        self.nodes[i].lame_duck();
    }

    /// The index of the node that leads consumer `consumer` of `stream` now.
    ///
    /// # Errors
    /// [`HarnessError::Monitor`] when the consumer info cannot be read or names no leader this
    /// cluster has.
    pub async fn consumer_leader(
        &self,
        js: &jetstream::Context,
        stream: &str,
        consumer: &str,
    ) -> Result<usize, HarnessError> {
        let info = tokio::time::timeout(Duration::from_secs(5), async {
            js.get_stream(stream)
                .await
                .map_err(|e| e.to_string())?
                .consumer_info(consumer)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| HarnessError::Monitor(format!("no info of {consumer} in time")))?
        .map_err(HarnessError::Monitor)?;
        let leader = info
            .cluster
            .and_then(|c| c.leader)
            .ok_or_else(|| HarnessError::Monitor(format!("{consumer} has no leader")))?;
        self.index_of(&leader).ok_or_else(|| {
            HarnessError::Monitor(format!("{consumer}'s leader {leader} is no node"))
        })
    }

    /// Starts node `i` again on its ports and store (after [`kill`](Self::kill)); ready once
    /// it accepts connections (it catches up with its peers on its own).
    ///
    /// # Errors
    /// As [`NatsServer::start`].
    pub async fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        self.nodes[i].start().await
    }

    /// Freezes node `i` (SIGSTOP): its peers and clients see it silent.
    ///
    /// # Panics
    /// When the node is not running.
    pub fn pause(&self, i: usize) {
        self.nodes[i].freeze();
    }

    /// Resumes a [`pause`](Self::pause)d node (SIGCONT).
    ///
    /// # Panics
    /// When the node is not running.
    pub fn resume(&self, i: usize) {
        self.nodes[i].thaw();
    }

    /// Every node's log, each under its name, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}", n.server_name(), n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
