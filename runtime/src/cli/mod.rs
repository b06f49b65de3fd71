//! The `runtime` command line (clap derive), and the client commands it runs (`messaging`:
//! send, inbox; `tasks`: delegate, task, answer). These modules belong to the binary; hosts use
//! [`runtime::ActorSystem`].
//!
//! Usage errors exit with [`EXIT_USAGE`] (64) and one line saying what is wrong; see
//! [`parse_args`].

pub mod agent;
pub mod dlq;
pub mod messaging;
pub mod operator;
pub mod render;
pub mod start;
pub mod tasks;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use protocol::config::DeliveryConfig;
use runtime::{NatsSettings, SystemError};

pub use operator::{DoctorArgs, PresenceArgs, TraceArgs};

/// A flag's value refused: exit [`EXIT_USAGE`], one line naming the flag.
pub fn invalid(flag: &str, e: &dyn std::fmt::Display) -> SystemError {
    SystemError::InvalidSetting(format!("{flag}: {e}"))
}

/// The system of a client command, on `client` (connected with `nats`, whose inbox prefix
/// it keeps), with `delivery`'s stream names.
pub fn client_builder(
    client: async_nats::Client,
    nats: &NatsSettings,
    delivery: DeliveryConfig,
    durable: bool,
) -> runtime::ActorSystemBuilder {
    runtime::ActorSystem::builder()
        .client(client)
        .inbox_prefix(nats.reply_prefix())
        .durable(durable)
        .delivery_config(delivery)
}

/// Installs the SIGINT/SIGTERM handlers of a command; a failure is the process's, not the
/// operator's (exit [`EXIT_SOFTWARE`]).
pub fn signals() -> Result<runtime::shutdown::Signals, SystemError> {
    runtime::shutdown::Signals::install().map_err(|e| SystemError::Spawn {
        what: "the signal handlers".into(),
        source: Box::new(e),
    })
}

pub use runtime::exit::{
    SOFTWARE as EXIT_SOFTWARE, UNAVAILABLE as EXIT_UNAVAILABLE, USAGE as EXIT_USAGE,
    WAITING as EXIT_WAITING,
};

/// Actor-based runtime for durable agent messaging and task execution over NATS JetStream.
#[derive(Debug, Parser)]
#[command(name = "runtime", version, about, long_about = None)]
pub struct Cli {
    /// Log output format on stderr. The level filter comes from `RUST_LOG` (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "RUNTIME_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,

    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a router, a worker, or both, and run until SIGINT or SIGTERM.
    Start(StartArgs),
    /// Print the JSON snapshot of a running router (counters, streams, restarts).
    Status(StatusArgs),
    /// Send a direct message through the hub.
    Send(SendArgs),
    /// Read an agent's inbox (durable when the hub is durable, else live).
    Inbox(InboxArgs),
    /// Print the broadcasts on a channel as they come (live only: nobody stores them).
    Listen(ListenArgs),
    /// Submit a task to a work queue, or find a task's result again with `--resume`.
    Delegate(DelegateArgs),
    /// Query or cancel a running task.
    Task(TaskArgs),
    /// Answer a task that is waiting for an answer.
    Answer(AnswerArgs),
    /// Write a nats-server configuration that binds every connection to its identity, with
    /// least-privilege grants per role, and each identity's credentials (docs/SECURITY.md).
    RenderConfig(RenderConfigArgs),
    /// List, replay or discard the dead letters (DMs their inbox could not take).
    Dlq(dlq::DlqArgs),
    /// Remove an agent (its waiting DMs are dead-lettered, its senders told) or restore it.
    Agent(agent::AgentArgs),
    /// List the agents and when each was last seen (an operator's command).
    Presence(PresenceArgs),
    /// Print the timeline of a DM or a task from the audit trail (an operator's command).
    Trace(TraceArgs),
    /// Check this host against the hub: its clock against the server's. Exits 1 when it
    /// finds a problem (`clock_skew`: more than 30 s off).
    Doctor(DoctorArgs),
}

/// `runtime render-config`.
#[derive(Debug, Args)]
pub struct RenderConfigArgs {
    /// The identities file (JSON, strict): `agents`, `workers` (`{"id", "queues"}`), `routers`
    /// (a count or names) and `admins`.
    #[arg(long, value_name = "FILE", env = "RUNTIME_IDENTITIES")]
    pub identities: PathBuf,

    /// The directory to write `nats-server.conf`, `users/<identity>.env` and (with
    /// `--durable`) the JetStream store `jetstream/` into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// A durable hub: JetStream for the hub account, with `sync_interval: always`.
    #[arg(long)]
    pub durable: bool,

    /// How each identity authenticates: an nkey (its seed in its `.env` file) or a generated
    /// password (bcrypt-hashed in the config).
    #[arg(long, value_enum, default_value_t = AuthMethod::Nkey)]
    pub auth: AuthMethod,

    /// Generate new secrets for every identity (otherwise a re-render keeps the ones its
    /// `.env` files hold).
    #[arg(long)]
    pub rotate: bool,

    /// The address the server listens on.
    #[arg(long, value_name = "HOST:PORT", default_value = "0.0.0.0:4222")]
    pub listen: String,

    /// The URL written into every `.env` file (`NATS_URL`).
    #[arg(long, value_name = "URL", default_value = "nats://127.0.0.1:4222")]
    pub client_url: String,

    /// The server's TLS certificate (PEM); needs `--tls-key`.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The server's TLS private key (PEM); needs `--tls-cert`.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// The CA that signed the server's certificate, written into every `.env` file
    /// (`NATS_TLS_CA`) for the clients to verify the server with.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// The delivery config whose stream and consumer names the grants use.
    #[arg(long, env = "NATS_HUB_DELIVERY_CONFIG", value_name = "FILE")]
    pub delivery_config: Option<PathBuf>,
}

/// How a rendered identity authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthMethod {
    /// An nkey: the server holds the public key, the identity its seed.
    Nkey,
    /// A user name and a generated password.
    Password,
}

/// `runtime task`.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: TaskAction,
    /// The task's delegator: only it (or an admin, on the worker's admin subject) may query or
    /// cancel the task, and it reads the task's channel as itself.
    #[arg(
        long = "as",
        value_name = "ID",
        env = "RUNTIME_AGENT_ID",
        global = true
    )]
    pub as_id: Option<String>,
    /// Act as an admin on a task this identity delegated (instead of `--as`): the task channel
    /// is read with direct gets and the worker's admin control subject is used, both granted
    /// to admins only.
    #[arg(long, value_name = "ID", global = true)]
    pub delegator: Option<String>,
    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,
    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime task status|cancel`.
#[derive(Debug, Subcommand)]
pub enum TaskAction {
    /// Ask the task's worker for its state, whether it is active, and its question.
    Status {
        /// The task id.
        task_id: String,
    },
    /// Ask the task's worker to cancel it (the handler gets a cancellation signal).
    Cancel {
        /// The task id.
        task_id: String,
    },
}

/// `runtime answer`.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The task id.
    pub task_id: String,

    /// The answer text.
    #[arg(long)]
    pub text: String,

    /// Who answers: the task's delegator (a worker refuses an answer from anyone else).
    #[arg(long = "as", value_name = "ID", env = "RUNTIME_AGENT_ID")]
    pub as_id: String,

    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime delegate`.
#[derive(Debug, Args)]
pub struct DelegateArgs {
    /// The delegator's identity (with `--resume` too: an identity reads only the results of
    /// the tasks it delegated).
    #[arg(
        long = "as",
        value_name = "ID",
        env = "RUNTIME_AGENT_ID",
        required = true
    )]
    pub as_id: Option<String>,

    /// The work queue.
    #[arg(long, required_unless_present = "resume")]
    pub queue: Option<String>,

    /// Send the task to this worker of the queue only (a targeted task).
    #[arg(long)]
    pub worker: Option<String>,

    /// What to do.
    #[arg(required_unless_present = "resume")]
    pub text: Option<String>,

    /// Extra context lines (repeatable).
    #[arg(long)]
    pub context: Vec<String>,

    /// Submissions with the same key to the same queue create one task.
    #[arg(long)]
    pub idempotency_key: Option<String>,

    /// Wait for the result and print it. A task that asks a question ends the wait: its
    /// waiting result is printed, and the exit code is 75 (answer with `runtime answer`).
    #[arg(long)]
    pub wait: bool,

    /// With `--wait` or `--resume`: keep waiting through questions (each waiting result is
    /// printed once) until the final result.
    #[arg(long)]
    pub follow_answers: bool,

    /// Find the result of this task id from its stored channel (waits for it).
    #[arg(long, value_name = "TASK_ID", conflicts_with_all = ["text", "queue"])]
    pub resume: Option<String>,

    /// Seconds to wait for the result (`--wait`/`--resume`); a timeout does not cancel the
    /// task.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,

    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The sender's identity (the router stamps it into meta.from).
    #[arg(long = "as", value_name = "ID", env = "RUNTIME_AGENT_ID")]
    pub as_id: String,

    /// The recipient's identity.
    #[arg(long, value_name = "ID")]
    pub to: String,

    /// The message text (sent as a JSON string body).
    pub text: String,

    /// The message id (meta.id); a fresh one when omitted. Re-sending with the same id is
    /// deduplicated within the duplicate window.
    #[arg(long)]
    pub id: Option<String>,

    /// The message expires this many seconds from now (`meta.expires_at`): it is never
    /// delivered after that, and the broker frees it then.
    #[arg(long, value_name = "SECS")]
    pub expires_in_secs: Option<u64>,

    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime inbox`.
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// Whose inbox to read.
    #[arg(long = "as", value_name = "ID", env = "RUNTIME_AGENT_ID")]
    pub as_id: String,

    /// Keep reading until SIGINT/SIGTERM instead of exiting once the inbox is idle.
    #[arg(long)]
    pub follow: bool,

    /// Print each DM as one JSON line (the whole envelope) instead of `from: body`.
    #[arg(long)]
    pub json: bool,

    /// Without --follow: exit after this many seconds without a new DM.
    #[arg(long, default_value_t = 2, env = "RUNTIME_INBOX_IDLE_SECS")]
    pub idle_secs: u64,

    /// How inbox consumers bind: auto, on or off.
    #[arg(long, env = "NATS_HUB_DURABLE_INBOX", default_value = "auto")]
    pub durable_inbox: String,

    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime listen`.
#[derive(Debug, Args)]
pub struct ListenArgs {
    /// The broadcast channel (`channel.<name>`).
    #[arg(long, value_name = "NAME", env = "RUNTIME_CHANNEL")]
    pub channel: String,

    /// Exit after this many broadcasts (otherwise until SIGINT/SIGTERM).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// Print each broadcast as one JSON line (the whole envelope) instead of `from: body`.
    #[arg(long)]
    pub json: bool,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Roles a process can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Routes envelopes from the ingress to inboxes, task channels and broadcasts.
    Router,
    /// Executes tasks from a work queue (needs `--worker-id`).
    Worker,
    /// Router and worker in one process (needs `--worker-id`).
    All,
}

/// `runtime start`.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// Which role to run.
    #[arg(long, value_enum, env = "RUNTIME_ROLE")]
    pub role: Role,

    /// This worker's identity (required with `--role worker` and `--role all`).
    #[arg(long, env = "RUNTIME_WORKER_ID", required_if_eq_any([("role", "worker"), ("role", "all")]))]
    pub worker_id: Option<String>,

    /// The work queue this worker takes tasks from (required with `--role worker`/`all`).
    #[arg(long, env = "RUNTIME_QUEUE", required_if_eq_any([("role", "worker"), ("role", "all")]))]
    pub queue: Option<String>,

    /// Tasks this worker runs at once (1-1024). It fetches one task per free slot.
    #[arg(long, default_value_t = 4, env = "RUNTIME_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub concurrency: u16,

    /// Command run per attempt (`sh -c`): task JSON on stdin, ids in TASK_ID, ATTEMPT_ID,
    /// WORKER_ID, TASK_RERUN; stdout JSON `{"response": ...}` or `{"question": ...,
    /// "tool_call_id": ...}` (required with `--role worker`/`all`).
    #[arg(long, env = "RUNTIME_EXEC", required_if_eq_any([("role", "worker"), ("role", "all")]))]
    pub exec: Option<String>,

    /// Run each `--exec` command as this user (its uid, its primary group, no supplementary
    /// groups), so that it can read neither the worker's environment nor its credentials file
    /// (docs/SECURITY.md). The worker must be able to switch users (run it as root).
    #[arg(long, value_name = "USER", env = "RUNTIME_EXEC_USER")]
    pub exec_user: Option<String>,

    /// Directory of the worker's local journal (one process per worker identity).
    #[arg(long, default_value = ".runtime-journal", env = "RUNTIME_JOURNAL_DIR")]
    pub journal_dir: PathBuf,

    /// Durable delivery over JetStream. Without it the router uses plain core NATS and sends
    /// no JetStream request at all.
    #[arg(long, env = "NATS_HUB_DURABLE")]
    pub durable: bool,

    /// JSON delivery config (any subset of the keys in docs/PROTOCOL.md; unknown keys are
    /// rejected).
    #[arg(long, env = "NATS_HUB_DELIVERY_CONFIG", value_name = "FILE")]
    pub delivery_config: Option<PathBuf>,

    /// Seconds running work gets to finish at a graceful shutdown (SIGINT/SIGTERM); what did
    /// not finish is handed back, and the process exits at most 3 s after this grace.
    #[arg(long, default_value_t = 10, env = "RUNTIME_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: u64,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Seconds to wait for a router to answer.
    #[arg(long, default_value_t = 5, env = "RUNTIME_STATUS_TIMEOUT_SECS")]
    pub timeout_secs: u64,

    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// Where the hub keeps its streams, for the client commands: the names the router runs with
/// (its delivery config), each overridable on its own.
#[derive(Debug, Clone, Args)]
pub struct HubArgs {
    /// The router's JSON delivery config: its stream names are used (unknown keys are
    /// rejected, as for the router).
    #[arg(long, env = "NATS_HUB_DELIVERY_CONFIG", value_name = "FILE")]
    pub delivery_config: Option<PathBuf>,

    /// The inbox stream's name (instead of the config's `inbox.name`).
    #[arg(long, env = "NATS_HUB_INBOX_STREAM", value_name = "NAME")]
    pub inbox_stream: Option<String>,

    /// The task channels' stream name (instead of the config's `tasks.name`).
    #[arg(long, env = "NATS_HUB_TASKS_STREAM", value_name = "NAME")]
    pub tasks_stream: Option<String>,
}

impl HubArgs {
    /// The delivery config the client commands use: the file's (or the defaults), with the
    /// stream names given on their own.
    ///
    /// # Errors
    /// [`SystemError::Config`] for a bad file, [`SystemError::InvalidSetting`] for a bad name.
    pub fn delivery(&self) -> Result<DeliveryConfig, SystemError> {
        let mut delivery = runtime::config::load_delivery_config(self.delivery_config.as_deref())?;
        let named = |flag: &str, name: &str| {
            protocol::subjects::validate_stream_name(name)
                .map(|()| name.to_owned())
                .map_err(|e| invalid(flag, &e))
        };
        if let Some(name) = &self.inbox_stream {
            delivery.inbox.name = named("--inbox-stream", name)?;
        }
        if let Some(name) = &self.tasks_stream {
            delivery.tasks.name = named("--tasks-stream", name)?;
        }
        Ok(delivery)
    }
}

/// Connection options shared by every subcommand. Only one authentication method may be set.
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// NATS server URL, or a cluster's comma-separated list (`nats://a:4222,nats://b:4222`).
    #[arg(long, default_value = "nats://127.0.0.1:4222", env = "NATS_URL")]
    pub nats_url: String,

    /// Authenticate with this token.
    #[arg(long, env = "NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,

    /// Authenticate as this user (with `--nats-password`).
    #[arg(long, env = "NATS_USERNAME")]
    pub nats_username: Option<String>,

    /// Password for `--nats-username` (may be empty).
    #[arg(long, env = "NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,

    /// Authenticate with this user NKey seed (the secret seed itself, not a path).
    #[arg(long, env = "NATS_NKEY_SEED", hide_env_values = true)]
    pub nats_nkey_seed: Option<String>,

    /// Authenticate with this credentials (JWT + seed) file.
    #[arg(long, env = "NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,

    /// Seconds to wait for the first connection before giving up.
    #[arg(long, default_value_t = 10, env = "NATS_CONNECT_TIMEOUT_SECS")]
    pub connect_timeout_secs: u64,

    /// Seconds the server may be silent before the client pings it; three silent intervals
    /// and the client reconnects, to another node of a cluster.
    #[arg(long, default_value_t = 2, env = "NATS_PING_INTERVAL_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_interval_secs: u64,

    /// Inbox prefix of the connection (reply subjects `<prefix>.<...>`; default `_INBOX`). The
    /// router, attach and worker answer requests only on replies under their own prefix, so
    /// clients and services must agree on it.
    #[arg(long, env = "NATS_INBOX_PREFIX", value_name = "PREFIX")]
    pub inbox_prefix: Option<String>,

    /// A CA certificate (PEM) to verify the server with; requires TLS.
    #[arg(long, env = "NATS_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// A client certificate (PEM), for servers that verify clients; needs `--tls-key`.
    #[arg(long, env = "NATS_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM); needs `--tls-cert`.
    #[arg(long, env = "NATS_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
}

impl NatsArgs {
    /// A connection named `name` made with these flags.
    ///
    /// # Errors
    /// [`SystemError::Connect`] (through [`NatsSettings::connect`]): invalid auth flags, or
    /// no server reachable.
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, SystemError> {
        Ok(self.settings().connect(name).await?)
    }

    /// The flags as connection settings (auth not validated yet; see
    /// [`NatsSettings::validate`]).
    pub fn settings(&self) -> NatsSettings {
        NatsSettings {
            url: self.nats_url.clone(),
            token: self.nats_token.clone(),
            username: self.nats_username.clone(),
            password: self.nats_password.clone(),
            nkey_seed: self.nats_nkey_seed.clone(),
            creds_file: self.nats_creds.clone(),
            connect_timeout: std::time::Duration::from_secs(self.connect_timeout_secs),
            ping_interval: Some(std::time::Duration::from_secs(self.ping_interval_secs)),
            inbox_prefix: self.inbox_prefix.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}

/// What parsing the command line gave.
#[derive(Debug)]
pub enum Parsed {
    /// Run this.
    Run(Box<Cli>),
    /// Print this (help or version) to stdout and exit 0.
    Print(String),
    /// Print this one line to stderr and exit [`EXIT_USAGE`].
    Usage(String),
}

/// Parses `args` (including the program name). Help and version go to [`Parsed::Print`]; every
/// other clap error becomes one line in [`Parsed::Usage`].
pub fn parse_args<I, T>(args: I) -> Parsed
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => Parsed::Run(Box::new(cli)),
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                Parsed::Print(e.render().to_string())
            }
            _ => Parsed::Usage(one_line(&e.render().to_string())),
        },
    }
}

/// Folds clap's multi-line error into one line: the message and its details, without the
/// usage block and tips.
fn one_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    for line in rendered.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.trim_start_matches("error: ").to_string());
    }
    format!("runtime: usage error: {} (see --help)", parts.join(" "))
}

#[cfg(test)]
mod tests;
