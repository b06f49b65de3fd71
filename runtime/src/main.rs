//! The `runtime` binary: `runtime start --role router|worker|all ...` and `runtime status`.
//!
//! Exit codes: 0 after a clean shutdown, 64 for a usage or config error (one line on stderr),
//! 69 when NATS cannot be reached or JetStream refuses, 70 for an internal failure.

use std::process::ExitCode;
use std::time::Duration;

mod cli;

use anyhow::Context as _;
use cli::{Cli, Command, Parsed, Role, StartArgs, StatusArgs};
use runtime::{ActorSystem, SystemError};

// mimalloc instead of the system allocator: routing, attempts and trackers allocate many small,
// short-lived buffers across threads, where glibc's malloc showed up as 12 % of the task
// benchmark's CPU profile (docs/PERFORMANCE.md). Embedding hosts choose their own allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long a cancelled `--exec` handler has between SIGTERM and SIGKILL.
const EXEC_KILL_GRACE: Duration = Duration::from_secs(5);

/// How long `runtime status` collects worker snapshots.
const WORKER_STATUS_WINDOW: Duration = Duration::from_millis(500);

/// The test hook that skews `runtime doctor`'s clock (fault-injection builds only).
const CLOCK_SKEW_ENV: &str = "RUNTIME_CLOCK_SKEW_MS";

fn main() -> ExitCode {
    let cli = match cli::parse_args(std::env::args_os()) {
        Parsed::Run(cli) => cli,
        Parsed::Print(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Parsed::Usage(line) => {
            eprintln!("{line}");
            return ExitCode::from(cli::EXIT_USAGE as u8);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: cannot start the async runtime: {e}");
            return ExitCode::from(cli::EXIT_SOFTWARE as u8);
        }
    };
    let (code, line) = rt.block_on(run(*cli));
    // Do not wait for stray blocking tasks (e.g. a stuck stdin read).
    rt.shutdown_timeout(Duration::from_secs(1));
    if let Some(line) = line {
        eprintln!("runtime: {line}");
    }
    ExitCode::from(code as u8)
}

async fn run(cli: Cli) -> (i32, Option<String>) {
    // Crash tests arm faults in builds with the fault-injection hook (a no-op otherwise).
    // Tests: `RUNTIME_CLOCK_SKEW_MS` skews this process's clock as `runtime doctor` reads it
    // (compiled in only with the fault-injection hook).
    if let Some(ms) = std::env::var(CLOCK_SKEW_ENV)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|_| actors::fault::ENABLED)
    {
        actors::clock::skew_for_tests("runtime-doctor", ms);
    }
    if let Ok(spec) = std::env::var(actors::fault::FAULTS_ENV) {
        if let Err(e) = actors::fault::arm_from_spec(&spec) {
            return (cli::EXIT_USAGE, Some(e.to_string()));
        }
    }
    // Servers log their lifecycle; one-shot client commands stay quiet unless asked, and leave
    // a connection failure to their one error line (async-nats would log it first).
    let level = match cli.command {
        Command::Start(_) => "info",
        _ => "warn,async_nats=off",
    };
    let telemetry = match runtime::telemetry::init(cli.log_format == cli::LogFormat::Json, level) {
        Ok(t) => t,
        Err(e) => return (cli::EXIT_USAGE, Some(e.to_string())),
    };
    let result = match cli.command {
        Command::Start(args) => start(args).await,
        Command::Status(args) => status(args).await,
        Command::Presence(args) => presence(args).await,
        Command::Trace(args) => trace(args).await,
        Command::Doctor(args) => doctor(args).await,
        Command::Send(args) => send(args).await,
        Command::Inbox(args) => cli::messaging::inbox(args).await.map_err(Into::into),
        Command::Listen(args) => cli::messaging::listen(args).await.map_err(Into::into),
        Command::Task(args) => task(args).await,
        Command::Answer(args) => answer(args).await,
        Command::RenderConfig(args) => render_config(&args),
        Command::Dlq(args) => cli::dlq::dlq(args, |line| println!("{line}"))
            .await
            .map_err(Into::into),
        Command::Agent(args) => cli::agent::agent(args, |line| println!("{line}"))
            .await
            .map_err(Into::into),
        Command::Delegate(args) => cli::tasks::delegate(args, |line| println!("{line}"))
            .await
            .map_err(|e| match e {
                cli::tasks::DelegateError::Waiting(w) => anyhow::Error::new(w),
                cli::tasks::DelegateError::System(e) => anyhow::Error::new(e),
            }),
    };
    let (code, line) = match result {
        Ok(()) => (0, None),
        Err(e) => (exit_code(&e), Some(error_line(&e))),
    };
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .ok();
    (code, line)
}

/// The one line an error prints: its message and each source whose text the line does not
/// show yet (our errors print their source in their own message, so a plain `{e:#}` would
/// repeat it).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

fn render_config(args: &cli::RenderConfigArgs) -> anyhow::Result<()> {
    for path in cli::render::render(args)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn exit_code(e: &anyhow::Error) -> i32 {
    if let Some(e) = e.downcast_ref::<cli::render::RenderError>() {
        return e.exit_code();
    }
    if e.downcast_ref::<cli::tasks::TaskWaiting>().is_some() {
        return cli::EXIT_WAITING;
    }
    if e.downcast_ref::<ClockSkew>().is_some() {
        return 1;
    }
    if e.downcast_ref::<NoServerTime>().is_some() {
        return cli::EXIT_UNAVAILABLE;
    }
    match e.downcast_ref::<SystemError>() {
        Some(SystemError::Held { .. }) => cli::EXIT_WAITING,
        Some(SystemError::RecipientDeleted { .. }) => runtime::exit::NO_USER,
        Some(se) if se.is_usage() => cli::EXIT_USAGE,
        Some(se) if se.is_unavailable() => cli::EXIT_UNAVAILABLE,
        Some(_) => cli::EXIT_SOFTWARE,
        None => cli::EXIT_SOFTWARE,
    }
}

async fn start(args: StartArgs) -> anyhow::Result<()> {
    let signals =
        runtime::shutdown::Signals::install().context("cannot install signal handlers")?;
    let delivery = runtime::config::load_delivery_config(args.delivery_config.as_deref())
        .map_err(SystemError::from)?;
    let worker = match args.role {
        Role::Router => None,
        Role::Worker | Role::All => Some(worker_settings(&args)?),
    };
    if worker.is_some() && !args.durable {
        return Err(SystemError::InvalidSetting(
            "the worker role needs --durable (tasks are stored in JetStream)".into(),
        )
        .into());
    }
    let system = ActorSystem::builder()
        .nats(args.nats.settings())
        .durable(args.durable)
        .delivery_config(delivery)
        .build()
        .await?;
    if args.role != Role::Worker {
        system.start_router().await?;
    }
    if let Some(settings) = worker {
        system.start_worker(settings).await?;
    }
    tracing::info!(
        role = ?args.role,
        durable = args.durable,
        nats_url = %args.nats.nats_url,
        "running; SIGINT or SIGTERM stops it"
    );
    signals.recv().await;
    tracing::info!("shutting down");
    system
        .shutdown(Duration::from_secs(args.shutdown_grace_secs))
        .await?;
    Ok(())
}

fn worker_settings(
    args: &StartArgs,
) -> Result<runtime::system::worker::WorkerSettings, SystemError> {
    let invalid = cli::invalid;
    let worker_id = protocol::WorkerId::new(args.worker_id.clone().unwrap_or_default())
        .map_err(|e| invalid("--worker-id", &e))?;
    let queue = protocol::QueueName::new(args.queue.clone().unwrap_or_default())
        .map_err(|e| invalid("--queue", &e))?;
    let command = args.exec.clone().unwrap_or_default();
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let run_as = args
        .exec_user
        .as_deref()
        .map(actors::worker::RunAs::lookup)
        .transpose()
        .map_err(|e| SystemError::InvalidSetting(format!("--exec-user: {e}")))?;
    Ok(runtime::system::worker::WorkerSettings {
        worker_id,
        queue,
        concurrency: usize::from(args.concurrency),
        journal_dir: args.journal_dir.clone(),
        // A cancelled `--exec` process gets SIGTERM, then SIGKILL after this long.
        handler: std::sync::Arc::new(actors::worker::ExecHandler {
            command,
            grace: EXEC_KILL_GRACE.min(grace),
            run_as,
        }),
        shutdown_grace: grace,
    })
}

async fn task(args: cli::TaskArgs) -> anyhow::Result<()> {
    let reply = cli::tasks::task(args).await?;
    println!("{reply}");
    Ok(())
}

async fn answer(args: cli::AnswerArgs) -> anyhow::Result<()> {
    let answer = cli::tasks::answer(args).await?;
    println!("{}", serde_json::to_string(&answer)?);
    Ok(())
}

async fn send(args: cli::SendArgs) -> anyhow::Result<()> {
    let receipt = cli::messaging::send(args).await?;
    println!("{}", serde_json::to_string(&receipt)?);
    Ok(())
}

async fn trace(args: cli::TraceArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-trace").await?;
    for row in runtime::system::trace::trace(&client, &args.id).await? {
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            let e = &row.event;
            let attempt = e
                .attempt
                .map(|a| format!(" attempt {a}"))
                .unwrap_or_default();
            let details = if e.details.is_empty() {
                String::new()
            } else {
                format!(" {}", serde_json::to_string(&e.details)?)
            };
            println!(
                "+{} ms {} by {}{attempt}{details}",
                row.after_ms, e.event, e.actor
            );
        }
    }
    Ok(())
}

async fn presence(args: cli::PresenceArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-presence").await?;
    for entry in runtime::system::presence::list(&client).await? {
        if args.json {
            println!("{}", serde_json::to_string(&entry)?);
        } else {
            let state = serde_json::to_value(entry.state)?;
            println!(
                "{} {} last seen {} s ago",
                entry.agent,
                state.as_str().unwrap_or("unknown"),
                entry.seen_secs_ago
            );
        }
    }
    Ok(())
}

/// A finding of `runtime doctor` (exit 1): the report is printed before it.
#[derive(Debug, thiserror::Error)]
#[error("clock_skew: this host's clock is {offset_ms} ms off the server's (more than 30 s)")]
struct ClockSkew {
    offset_ms: i64,
}

/// `runtime doctor` could not read the server's clock (exit 69: the hub is unavailable to it).
#[derive(Debug, thiserror::Error)]
#[error("cannot read the server's time")]
struct NoServerTime {
    #[source]
    source: actors::clock::MeasureError,
}

async fn doctor(args: cli::DoctorArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-doctor").await?;
    let delivery = args.hub.delivery()?;
    let subject = match &args.agent {
        Some(id) => {
            let id = protocol::AgentId::new(id.as_str())
                .map_err(|e| SystemError::InvalidSetting(format!("--agent: {e}")))?;
            protocol::subjects::consumer_info_request(
                &delivery.inbox.name,
                &protocol::subjects::inbox_consumer(&id),
            )
        }
        None => protocol::subjects::stream_info_request(&delivery.ingress.name),
    };
    let clock = actors::clock::ServerClock::new("runtime-doctor");
    let measured = clock
        .measure(&client, &subject)
        .await
        .map_err(|e| NoServerTime { source: e })?;
    let verdict = protocol::clock::skew_verdict(measured.offset_ms);
    println!(
        "{}",
        serde_json::json!({
            "clock_offset_ms": measured.offset_ms,
            "uncertainty_ms": measured.uncertainty_ms,
            "clock": verdict,
        })
    );
    match verdict {
        protocol::clock::SkewVerdict::Ok => Ok(()),
        protocol::clock::SkewVerdict::Skewed => Err(ClockSkew {
            offset_ms: measured.offset_ms,
        }
        .into()),
    }
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.nats.connect("runtime-status").await?;
    let snapshot = runtime::request_status(&client, Duration::from_secs(args.timeout_secs)).await?;
    // The router's snapshot, plus `workers`: the snapshot of every worker that answered
    // within the window.
    let workers = runtime::request_worker_status(&client, WORKER_STATUS_WINDOW).await?;
    let mut out = serde_json::to_value(&snapshot)?;
    if let Some(object) = out.as_object_mut() {
        object.insert("workers".into(), serde_json::to_value(workers)?);
        // The agents' presence on a durable hub, when this identity may list it (an
        // operator's); a core hub has no JetStream to ask.
        let durable = object.get("durable") == Some(&serde_json::Value::Bool(true));
        if durable {
            if let Ok(presence) = runtime::system::presence::list(&client).await {
                object.insert("presence".into(), serde_json::to_value(presence)?);
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
