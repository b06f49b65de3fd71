//! The `runtime` binary: `runtime start --role router|worker|all ...` and `runtime status`.
//!
//! Exit codes: 0 after a clean shutdown, 64 for a usage or config error (one line on stderr),
//! 69 when NATS cannot be reached or JetStream refuses, 70 for an internal failure.

use std::process::ExitCode;
use std::time::Duration;

mod cli;

use cli::{Cli, Command, Parsed};
use runtime::SystemError;

// mimalloc instead of the system allocator: routing, attempts and trackers allocate many small,
// short-lived buffers across threads, where glibc's malloc showed up as 12 % of the task
// benchmark's CPU profile (docs/PERFORMANCE.md). Embedding hosts choose their own allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        Command::Start(args) => cli::start::start(args).await,
        Command::Status(args) => cli::operator::status(args).await,
        Command::Presence(args) => cli::operator::presence(args).await,
        Command::Trace(args) => cli::operator::trace(args).await,
        Command::Doctor(args) => cli::operator::doctor(args).await,
        Command::Send(args) => cli::messaging::print_send(args).await,
        Command::Inbox(args) => cli::messaging::inbox(args).await.map_err(Into::into),
        Command::Listen(args) => cli::messaging::listen(args).await.map_err(Into::into),
        Command::Task(args) => cli::tasks::print_task(args).await,
        Command::Answer(args) => cli::tasks::print_answer(args).await,
        Command::RenderConfig(args) => cli::render::print_render(&args),
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

/// The one line an error prints: its message and its sources
/// ([`protocol::error_chain::ErrorChain`]).
fn error_line(e: &anyhow::Error) -> String {
    protocol::error_chain::ErrorChain(e.as_ref()).to_string()
}

fn exit_code(e: &anyhow::Error) -> i32 {
    if let Some(e) = e.downcast_ref::<cli::render::RenderError>() {
        return e.exit_code();
    }
    if e.downcast_ref::<cli::tasks::TaskWaiting>().is_some() {
        return cli::EXIT_WAITING;
    }
    if e.downcast_ref::<cli::operator::ClockSkew>().is_some() {
        return 1;
    }
    if e.downcast_ref::<cli::operator::NoServerTime>().is_some() {
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
