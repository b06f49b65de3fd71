//! A private `nats-server` with JetStream per test.
//!
//! Each [`NatsServer`] owns a temporary store directory and a free loopback port. It is killed
//! and its store deleted on drop. [`NatsServer::restart`] keeps the store (crash tests),
//! [`NatsServer::stop`] and [`NatsServer::start`] model an outage.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::HarnessError;

/// How long a server may take to accept connections and answer JetStream requests.
const READY_DEADLINE: Duration = Duration::from_secs(15);

/// Options for a test server.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// `jetstream { sync_interval: always }`: fsync before every ack (power-loss durability).
    pub sync_always: bool,
    /// Extra lines appended verbatim to the generated server config file.
    pub extra_config: String,
    /// Require this token (`authorization { token }`); the harness's own clients use it.
    pub token: Option<String>,
    /// A config written elsewhere (e.g. by `runtime render-config`), used instead of the
    /// generated one (`sync_always`, `extra_config` and `token` are then ignored). The server
    /// is given its loopback port and monitoring port on the command line, and is ready when
    /// its monitoring endpoint reports it healthy: the harness's clients cannot log in there,
    /// so [`NatsServer::client`] is for the test to configure itself.
    pub config_file: Option<PathBuf>,
    /// Membership of a cluster ([`crate::Cluster`]): a `cluster` block with its route port and
    /// the routes to its peers. The server is then ready once it accepts connections: its
    /// JetStream answers only once the cluster has a meta leader, which the cluster awaits.
    pub cluster: Option<ClusterMember>,
}

/// One node's place in a cluster ([`ServerOptions::cluster`]).
#[derive(Debug, Clone)]
pub struct ClusterMember {
    /// The cluster's name.
    pub name: String,
    /// This node's route port (loopback).
    pub port: u16,
    /// The route ports of every node, this one's included.
    pub routes: Vec<u16>,
}

/// A running (or stopped) private nats-server. See the module docs.
#[derive(Debug)]
pub struct NatsServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// The HTTP monitoring port (loopback).
    monitor_port: u16,
    options: ServerOptions,
    child: Option<Child>,
}

/// Starts a JetStream server with default options; shorthand for [`NatsServer::run`].
///
/// # Errors
/// See [`NatsServer::run`].
pub async fn run_server() -> Result<NatsServer, HarnessError> {
    NatsServer::run(ServerOptions::default()).await
}

impl NatsServer {
    /// A server not started yet, on the given ports (a cluster picks every node's ports
    /// before any node starts, for the routes).
    pub(crate) fn unstarted(
        options: ServerOptions,
        port: u16,
        monitor_port: u16,
    ) -> Result<NatsServer, HarnessError> {
        Ok(NatsServer {
            bin: find_nats_server()?,
            dir: tempfile::Builder::new()
                .prefix("hub-nats-")
                .tempdir()
                .map_err(HarnessError::Io)?,
            port,
            monitor_port,
            options,
            child: None,
        })
    }

    /// Its `server_name` (`hub-test-<port>`): what a stream's or consumer's cluster info
    /// names as its leader.
    pub fn server_name(&self) -> String {
        format!("hub-test-{}", self.port)
    }

    /// Finds the binary, picks a free port, writes a config with its own store dir, starts the
    /// server and waits until it accepts connections and answers a JetStream request.
    ///
    /// # Errors
    /// [`HarnessError::NatsServerNotFound`] when no binary is found (the message says how to
    /// install one), [`HarnessError::NotReady`] when the server does not become ready in time.
    pub async fn run(options: ServerOptions) -> Result<NatsServer, HarnessError> {
        let bin = find_nats_server()?;
        let mut last_err = None;
        // A port picked by binding :0 can be taken by someone else before the server binds it;
        // retry with a new port a few times.
        for _ in 0..5 {
            let mut server = NatsServer {
                bin: bin.clone(),
                dir: tempfile::Builder::new()
                    .prefix("hub-nats-")
                    .tempdir()
                    .map_err(HarnessError::Io)?,
                port: free_port()?,
                monitor_port: free_port()?,
                options: options.clone(),
                child: None,
            };
            match server.start().await {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(HarnessError::NotReady {
            url: String::new(),
            log: String::new(),
        }))
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The loopback port this server listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many client subscriptions, over every connection, are on exactly `subject` (from
    /// the server's monitoring endpoint, `/connz?subs=1`).
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the endpoint cannot be reached, [`HarnessError::Monitor`]
    /// when its reply does not parse.
    pub async fn subscriptions_on(&self, subject: &str) -> Result<usize, HarnessError> {
        let body = self.monitor("/connz?subs=1&limit=100000").await?;
        let connz: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| HarnessError::Monitor(e.to_string()))?;
        let count = connz["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["subscriptions_list"].as_array().into_iter().flatten())
            .filter(|s| s.as_str() == Some(subject))
            .count();
        Ok(count)
    }

    /// The body of the monitoring endpoint's reply to `GET path`.
    async fn monitor(&self, path: &str) -> Result<String, HarnessError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.monitor_port))
            .await
            .map_err(HarnessError::Io)?;
        tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .map_err(HarnessError::Io)?;
        let mut reply = Vec::new();
        tcp.read_to_end(&mut reply)
            .await
            .map_err(HarnessError::Io)?;
        let reply = String::from_utf8_lossy(&reply);
        reply
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .ok_or_else(|| HarnessError::Monitor("no http body".into()))
    }

    /// The JetStream store directory (kept across restarts, deleted on drop).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A new client connected to this server, with retry on reconnect enabled.
    ///
    /// # Errors
    /// [`HarnessError::Connect`] when the connection fails.
    pub async fn client(&self) -> Result<async_nats::Client, HarnessError> {
        self.connect_options()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(self.url())
            .await
            .map_err(|e| HarnessError::Connect(e.to_string()))
    }

    fn connect_options(&self) -> async_nats::ConnectOptions {
        match &self.options.token {
            Some(token) => async_nats::ConnectOptions::with_token(token.clone()),
            None => async_nats::ConnectOptions::new(),
        }
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port and store.
    /// A no-op when it is running.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub async fn start(&mut self) -> Result<(), HarnessError> {
        if self.child.is_some() {
            return Ok(());
        }
        let config = match &self.options.config_file {
            Some(path) => path.clone(),
            None => self.write_config()?,
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(HarnessError::Io)?;
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&config)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor_port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(HarnessError::Io)?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::Spawn {
                bin: self.bin.display().to_string(),
                source: e,
            })?;
        self.child = Some(child);
        if let Err(e) = self.wait_ready().await {
            self.stop().await;
            return Err(e);
        }
        Ok(())
    }

    /// Kills the server with SIGKILL (no graceful shutdown) and waits for it to exit.
    /// The store is kept. A no-op when it is stopped.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Freezes the server (SIGSTOP): its connections stay open but nothing is answered, as
    /// on a hung host. [`thaw`](Self::thaw) resumes it; [`restart`](Self::restart) and
    /// [`stop`](Self::stop) work on a frozen server too (what it had not answered is lost).
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes a [`freeze`](Self::freeze)d server (SIGCONT).
    ///
    /// # Panics
    /// As [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Puts the server in lame-duck mode (`nats-server --signal ldm`, SIGUSR2): it steps down
    /// the JetStream leaders it holds, stops taking clients, closes the ones it has over its
    /// lame-duck duration (30 s, nats-server's least) and exits. [`stop`](Self::stop) or
    /// [`restart`](Self::restart) it sooner once its leaders have moved.
    ///
    /// # Panics
    /// When the server is not running or the signal cannot be sent.
    pub fn lame_duck(&self) {
        self.signal("-USR2");
    }

    /// The server process's id while it runs (benchmarks read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| c.id())
            .expect("the server runs");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid} failed: {status}");
    }

    /// `kill -9` then start again on the same port and store: what survives is what the
    /// server had written to its store.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop().await;
        self.start().await
    }

    /// The server's log so far (stdout and stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats-server.log")
    }

    fn write_config(&self) -> Result<PathBuf, HarnessError> {
        let path = self.dir.path().join("nats-server.conf");
        let sync = if self.options.sync_always {
            "\n  sync_interval: always"
        } else {
            ""
        };
        let auth = match &self.options.token {
            Some(token) => format!("authorization {{ token: {token:?} }}\n"),
            None => String::new(),
        };
        let cluster = match &self.options.cluster {
            Some(member) => {
                let routes: Vec<String> = member
                    .routes
                    .iter()
                    .map(|port| format!("nats-route://127.0.0.1:{port}"))
                    .collect();
                // Pings every 2 s, and a peer or client silent for two of them is dropped: a
                // paused node's routes are given up in about 6 s, as its clients' are, instead of
                // the two minutes nats-server's default allows (docs/RELIABILITY.md, the pause).
                format!(
                    "ping_interval: \"2s\"\nping_max: 2\nlame_duck_duration: \"30s\"\nlame_duck_grace_period: \"1s\"\ncluster {{\n  name: {name:?}\n  listen: 127.0.0.1:{port}\n  routes: [{routes}]\n}}\n",
                    name = member.name,
                    port = member.port,
                    routes = routes.join(", "),
                )
            }
            None => String::new(),
        };
        let text = format!(
            "listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\nserver_name: hub-test-{port}\njetstream {{\n  store_dir: {store:?}{sync}\n}}\n{cluster}{auth}{extra}\n",
            port = self.port,
            monitor = self.monitor_port,
            store = self.store_dir().display().to_string(),
            extra = self.options.extra_config,
        );
        std::fs::write(&path, text).map_err(HarnessError::Io)?;
        Ok(path)
    }

    async fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_DEADLINE;
        let not_ready = |s: &Self| HarnessError::NotReady {
            url: s.url(),
            log: tail(&s.log(), 2000),
        };
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_status)) = child.try_wait() {
                    self.child = None;
                    return Err(not_ready(self));
                }
            }
            if Instant::now() > deadline {
                return Err(not_ready(self));
            }
            let ready = match (&self.options.config_file, &self.options.cluster) {
                (Some(_), _) => self
                    .monitor("/healthz")
                    .await
                    .is_ok_and(|body| body.contains("\"ok\"")),
                (None, Some(_)) => true,
                (None, None) => self.jetstream_answers().await,
            };
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
                && ready
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn jetstream_answers(&self) -> bool {
        let Ok(Ok(client)) = tokio::time::timeout(
            Duration::from_secs(2),
            self.connect_options().connect(self.url()),
        )
        .await
        else {
            return false;
        };
        let js = async_nats::jetstream::new(client);
        matches!(
            tokio::time::timeout(Duration::from_secs(2), js.query_account()).await,
            Ok(Ok(_))
        )
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
            if let Some(pid) = child.id() {
                // Reap synchronously so the store dir is not deleted under a live process.
                let mut status = 0;
                // SAFETY: waitpid on our own child's pid; no memory is shared.
                unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
            }
        }
    }
}

/// Finds `nats-server`: `NATS_SERVER_BIN`, then the project-local install made by
/// `scripts/setup.sh`, then `PATH`.
///
/// # Errors
/// [`HarnessError::NatsServerNotFound`] with install instructions.
pub fn find_nats_server() -> Result<PathBuf, HarnessError> {
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN") {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(HarnessError::NatsServerNotFound {
            looked: format!("NATS_SERVER_BIN={} (not a file)", bin.display()),
        });
    }
    let local = workspace_root().join(".tools/bin/nats-server");
    if local.is_file() {
        return Ok(local);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(HarnessError::NatsServerNotFound {
        looked: format!("NATS_SERVER_BIN, {}, PATH", local.display()),
    })
}

/// The workspace root (two levels above this crate's manifest).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A free TCP port on 127.0.0.1 (bound to :0, then released).
///
/// # Errors
/// [`HarnessError::Io`] when binding fails.
pub fn free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(HarnessError::Io)?;
    Ok(listener.local_addr().map_err(HarnessError::Io)?.port())
}

fn tail(s: &str, max: usize) -> String {
    let start = s.len().saturating_sub(max);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_string()
}
