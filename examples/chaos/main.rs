//! The chaos program (issue 29 §5): a load of DMs and tasks through real router and worker
//! processes while random faults hit them and the NATS nodes, then a check that nothing
//! acknowledged was lost or handed over twice.
//!
//! ```sh
//! bash scripts/setup.sh && cargo build -p runtime --bin runtime
//! NATS_SERVER_BIN=$PWD/.tools/bin/nats-server \
//!     cargo run -p examples --example chaos -- [--cluster] [--seed N] [--short]
//! ```
//!
//! - **Load:** 10,000 DMs from 4 senders to 4 recipients (every pair) and 1,000 tasks over 2
//!   workers, spread over `--load-secs`, through 2 router processes; one nats-server, or a
//!   3-node cluster with every stream R3 (`--cluster`), each node with `sync_interval: always`.
//!   The senders and the recipients' inboxes live in this process.
//! - **Faults:** every 3 to 6 s until the load is sent, one drawn from `--seed`: kill -9 of a
//!   router, a worker (with its handlers) or a nats node, each started again after 1 s; a
//!   node paused for 2 to 10 s; on a cluster, a stream leader stepped down.
//! - **Checks,** once everything acknowledged came through (or `--drain-secs` passed): no
//!   acknowledged DM lost; no DM handed to a handler twice; every acknowledged task with
//!   exactly one final result, `completed`, stored once; every re-execution of a task flagged
//!   as a re-run and following a kill of the worker that ran it before; no process exited on
//!   its own; and at least 95 % of the load acknowledged (a hub that refuses everything loses
//!   nothing).
//!
//! It prints a progress bar while it runs (on a terminal), each fault as it happens, the
//! checks, and a last line `N passed, M failed`. Exit status: 0 when every check held, 1 when
//! one failed, 70 when the run could not be set up, 64 for a usage error.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod check;
mod faults;
mod load;
mod nodes;
mod processes;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use protocol::config::DeliveryConfig;
use protocol::AgentId;

use check::Report;
use faults::{Fault, Kind, Schedule, DOWN};
use load::{Load, RECIPIENTS};
use nodes::Nodes;
use processes::{Processes, ROUTERS, WORKERS};

/// Random faults under a load of DMs and tasks, then a check that nothing acknowledged was
/// lost or handed over twice.
#[derive(Debug, Parser)]
#[command(
    name = "chaos",
    override_usage = "chaos [--cluster] [--seed N] [--short] [OPTIONS]"
)]
struct Args {
    /// Run on a 3-node cluster with every stream R3 (else on one node).
    #[arg(long)]
    cluster: bool,
    /// The seed of the faults and their gaps (else one from the clock, printed).
    #[arg(long, env = "CHAOS_SEED")]
    seed: Option<u64>,
    /// The short mode CI runs: one node, the load spread over 60 s, and (unless `--faults`
    /// says) every kind of fault one node has.
    #[arg(long, conflicts_with_all = ["cluster", "load_secs"])]
    short: bool,
    /// The kinds of fault to draw from, comma-separated (default: every kind the deployment
    /// has; step-down only on a cluster).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<Kind>,
    /// DMs to send, between 4 senders and 4 recipients.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    dms: u64,
    /// Tasks to delegate to the 2 workers.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    tasks: u64,
    /// Seconds over which the load is sent; faults come until it is.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    load_secs: u64,
    /// Seconds the hub may take, once the load is sent, to hand over what it acknowledged.
    #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..))]
    drain_secs: u64,
}

/// The faults of the short mode: every kind one node has (step-down needs a cluster).
const SHORT_FAULTS: [Kind; 4] = [
    Kind::KillRouter,
    Kind::KillWorker,
    Kind::KillNode,
    Kind::PauseNode,
];
/// The exit status of a usage error (`EX_USAGE`).
const EXIT_USAGE: u8 = 64;
/// The exit status of a run that could not be set up (`EX_SOFTWARE`).
const EXIT_SETUP: u8 = 70;
/// How long the routers may take to answer once started.
const ROUTERS_UP: Duration = Duration::from_secs(90);
/// How long the inbox consumers may take to settle once everything came through.
const SETTLE: Duration = Duration::from_secs(60);
/// The share of the load that must be acknowledged, percent.
const ACKED_AT_LEAST: u64 = 95;

fn main() -> ExitCode {
    let mut args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            print!("{}", e.render());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let first = e.render().to_string();
            let first = first.lines().next().unwrap_or_default();
            eprintln!(
                "chaos: {} (see --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if args.short {
        args.load_secs = 60;
        if args.faults.is_empty() {
            args.faults = SHORT_FAULTS.to_vec();
        }
    }
    if args.faults.is_empty() {
        args.faults = Kind::ALL.to_vec();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the async runtime starts");
    match rt.block_on(run(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e:#}");
            ExitCode::from(EXIT_SETUP)
        }
    }
}

/// One fault as it happened.
struct Applied {
    /// When it began, since the load started.
    at: Duration,
    fault: Fault,
    /// How long applying it took (the kill and restart, or the pause).
    took: Duration,
    /// Why it could not be applied.
    error: Option<String>,
}

/// Runs the load and the faults, and checks what came of them; returns how many checks failed.
async fn run(args: Args) -> anyhow::Result<usize> {
    let seed = args.seed.unwrap_or_else(|| wall_ns() as u64);
    let mode = if args.cluster {
        "3-node cluster, R3"
    } else {
        "one node"
    };
    let kinds: Vec<String> = args
        .faults
        .iter()
        .filter_map(|k| clap::ValueEnum::to_possible_value(k).map(|v| v.get_name().to_string()))
        .collect();
    println!(
        "chaos: seed {seed}, {mode}, {} DMs and {} tasks over {} s, faults: {}",
        args.dms,
        args.tasks,
        args.load_secs,
        kinds.join(",")
    );
    let mut nodes = Nodes::start(args.cluster).await.context("starting nats")?;
    let urls = nodes.urls();
    let delivery_json = format!(r#"{{"replicas": {}}}"#, nodes.replicas());
    let delivery = DeliveryConfig::from_json_str(&delivery_json)?;
    let mut processes = Processes::start_routers(&urls, &delivery_json)?;
    let client = nodes.client().await?;
    let up = harness::wait_until_async("a router answers status", ROUTERS_UP, || async {
        runtime::request_status(&client, Duration::from_millis(500))
            .await
            .is_ok()
    })
    .await;
    if let Err(e) = up {
        anyhow::bail!("{e}\n{}", processes.logs());
    }
    processes.start_workers()?;
    let load = Load::start(&urls, delivery.clone()).await?;
    let streams: Vec<String> = actors::streams::stream_configs(&delivery)
        .into_iter()
        .map(|c| c.name)
        .collect();
    let mut schedule = Schedule::new(
        seed,
        &args.faults,
        nodes.len(),
        ROUTERS,
        WORKERS.len(),
        streams,
    );

    let total = args.dms + args.tasks;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} through  {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let progress = {
        let (bar, ledger) = (bar.clone(), load.ledger.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(ledger.lock().unwrap().through());
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let start = Instant::now();
    let load_began = wall_ns();
    let mut driver = load.drive(args.dms, args.tasks, Duration::from_secs(args.load_secs));
    let mut applied: Vec<Applied> = Vec::new();
    let mut worker_kills: Vec<(String, u128)> = Vec::new();
    let trackers = loop {
        tokio::select! {
            sent = &mut driver => break sent?,
            _ = tokio::time::sleep(schedule.gap()) => {}
        }
        let fault = schedule.fault();
        let at = start.elapsed();
        bar.set_message(fault.to_string());
        let began = Instant::now();
        let error = match apply(&fault, &mut nodes, &mut processes, &client).await {
            Ok(Some(gone)) => {
                // A worker's kill: a run it began before it was gone is explained.
                let Fault::KillWorker(i) = fault else {
                    unreachable!("only a worker's kill says when it was gone")
                };
                worker_kills.push((WORKERS[i].to_string(), gone));
                None
            }
            Ok(None) => None,
            Err(e) => Some(format!("{e:#}")),
        };
        let entry = Applied {
            at,
            fault,
            took: began.elapsed(),
            error,
        };
        if bar.is_hidden() {
            println!("{}", describe(&entry));
        } else {
            bar.println(describe(&entry));
        }
        applied.push(entry);
    };
    let sent_in = start.elapsed();
    bar.set_message("draining");
    let drained = harness::wait_until(
        "everything acknowledged through",
        Duration::from_secs(args.drain_secs),
        || load.ledger.lock().unwrap().complete(),
    )
    .await
    .is_ok();
    let drain_took = start.elapsed() - sent_in;
    let js = async_nats::jetstream::new(client.clone());
    let consumers: Vec<String> = RECIPIENTS
        .iter()
        .map(|r| protocol::subjects::inbox_consumer(&AgentId::new(*r).unwrap()))
        .collect();
    let settled = harness::wait_until_async("the inboxes settled", SETTLE, || {
        harness::consumers_settled(&js, protocol::subjects::INBOX_STREAM, &consumers)
    })
    .await
    .is_ok();
    progress.abort();
    bar.finish_and_clear();

    let mut report = Report::default();
    report.fact(format!(
        "{} faults in {:.1} s of load; drained in {:.1} s",
        applied.len(),
        sent_in.as_secs_f64(),
        drain_took.as_secs_f64()
    ));
    check_dms(&mut report, &load, drained, settled).await;
    check_tasks(
        &mut report,
        &load,
        &js,
        &processes.runs(),
        &worker_kills,
        load_began,
    )
    .await;
    let exited = processes.exited();
    report.check(
        exited.is_empty(),
        format!("processes that exited on their own: {}", list(&exited)),
    );
    let refused = load.ledger.lock().unwrap().refused.clone();
    if !refused.is_empty() {
        report.fact(format!("not acknowledged, by reason: {refused:?}"));
    }
    drop(trackers);
    print!("{}", report.render());
    let failed = report.failed();
    if failed > 0 {
        // What each worker incarnation alive now counted (the killed ones' counts died
        // with them).
        for worker in runtime::request_worker_status(&client, Duration::from_secs(1))
            .await
            .unwrap_or_default()
        {
            eprintln!(
                "--- worker {} counters (this incarnation): {}",
                worker.worker_id,
                serde_json::to_string(&worker.counters).unwrap_or_default()
            );
        }
        eprintln!(
            "--- logs\n{}\n{}",
            processes.logs(),
            tail(&nodes.logs(), 200)
        );
        eprintln!(
            "the run's files (delivery config, handler, run log, journals) are kept in {}",
            processes.keep().display()
        );
    }
    if let Ok(hub) = std::sync::Arc::try_unwrap(load.hub) {
        let _ = hub.shutdown(Duration::from_secs(10)).await;
    }
    Ok(failed)
}

/// Applies `fault`, healing it before it returns (a kill is followed by a restart after
/// [`DOWN`], a pause by a resume). For a worker's kill, returns when the worker was gone (wall
/// clock ns): the kill explains a re-run of any run it began before then.
async fn apply(
    fault: &Fault,
    nodes: &mut Nodes,
    processes: &mut Processes,
    client: &async_nats::Client,
) -> anyhow::Result<Option<u128>> {
    match fault {
        Fault::KillRouter(i) => processes.kill_router(*i, DOWN).await?,
        Fault::KillWorker(i) => {
            let gone = processes.kill_worker(*i, DOWN).await?;
            let ns = gone.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            return Ok(Some(ns));
        }
        Fault::KillNode(i) => nodes.kill_and_restart(*i, DOWN).await?,
        Fault::PauseNode(i, paused) => nodes.pause(*i, *paused).await,
        Fault::StepDown(stream) => nodes.step_down(client, stream).await?,
    }
    Ok(None)
}

/// The DM checks: none lost, none handed over twice.
async fn check_dms(report: &mut Report, load: &Load, drained: bool, settled: bool) {
    let mut duplicates_dropped = 0;
    for r in RECIPIENTS {
        if let Some(s) = load.hub.inbox_snapshot(&AgentId::new(r).unwrap()).await {
            duplicates_dropped += s.counters.duplicates;
        }
    }
    let ledger = load.ledger.lock().unwrap();
    let acked = ledger.dms.values().filter(|a| **a == Some(true)).count();
    let lost: Vec<u64> = ledger
        .dms
        .iter()
        .filter(|(n, a)| **a == Some(true) && !ledger.handled.contains_key(n))
        .map(|(n, _)| *n)
        .collect();
    let twice: Vec<u64> = ledger
        .handled
        .iter()
        .filter(|(_, c)| **c > 1)
        .map(|(n, _)| *n)
        .collect();
    report.fact(format!(
        "DMs: sent {}, acknowledged {acked}, delivered {} (of which not acknowledged to the \
         sender: {})",
        ledger.dms.len(),
        ledger.handled.len(),
        ledger
            .handled
            .keys()
            .filter(|n| ledger.dms.get(n) != Some(&Some(true)))
            .count()
    ));
    report.fact(format!(
        "raw redeliveries: {} dropped by the inboxes' dedupe (this incarnation), {} handed over \
         flagged redelivered",
        duplicates_dropped, ledger.flagged_redelivered
    ));
    report.check(drained, "everything acknowledged came through in time");
    report.check(
        settled,
        "the inbox consumers settled (nothing pending or unacknowledged)",
    );
    report.check(lost.is_empty(), format!("DMs lost: {}", count_list(&lost)));
    report.check(
        twice.is_empty(),
        format!(
            "DMs handed to a handler twice after dedupe: {}",
            count_list(&twice)
        ),
    );
    report.check(
        ledger.foreign == 0,
        format!("DMs handed over that no one sent: {}", ledger.foreign),
    );
    report.check(
        acked as u64 * 100 >= ledger.dms.len() as u64 * ACKED_AT_LEAST,
        format!(
            "DMs acknowledged: {acked} of {}, at least {ACKED_AT_LEAST} %",
            ledger.dms.len()
        ),
    );
}

/// The task checks: exactly one final result for each acknowledged task, and re-executions only
/// after a worker kill, flagged.
async fn check_tasks(
    report: &mut Report,
    load: &Load,
    js: &async_nats::jetstream::Context,
    runs: &str,
    worker_kills: &[(String, u128)],
    load_began: u128,
) {
    let tasks: Vec<_> = {
        let ledger = load.ledger.lock().unwrap();
        ledger
            .tasks
            .iter()
            .map(|(id, (acked, result))| (id.clone(), *acked == Some(true), result.clone()))
            .collect()
    };
    let acked = tasks.iter().filter(|(_, a, _)| *a).count();
    let (mut no_result, mut not_completed, mut not_one_stored, mut unreadable) =
        (Vec::new(), Vec::new(), Vec::new(), 0);
    let executions = check::executions(runs, worker_kills);
    for (id, acked, result) in &tasks {
        if !acked {
            continue;
        }
        match result {
            None => no_result.push(id.to_string()),
            Some(r) if r.state != protocol::task::TaskState::Completed => {
                not_completed.push(format!("{id}: {:?}", r.state))
            }
            Some(_) => {}
        }
        let wait = if result.is_some() {
            Duration::from_secs(10)
        } else {
            Duration::ZERO
        };
        match check::finals_stored(js, id, wait).await {
            Ok(finals) if finals.len() == 1 => {}
            Ok(finals) => not_one_stored.push(format!("{id}: {}", finals.len())),
            Err(_) => unreadable += 1,
        }
    }
    report.fact(format!(
        "tasks: delegated {}, acknowledged {acked}, with a final result {}; handlers ran for {} \
         tasks",
        tasks.len(),
        tasks.iter().filter(|(_, a, r)| *a && r.is_some()).count(),
        executions.runs.len()
    ));
    report.fact(format!(
        "task re-executions: {}, of which after a kill of the worker that ran it before: {}; \
         worker kills: {}",
        executions.reexecutions,
        executions.matched,
        worker_kills.len()
    ));
    if !no_result.is_empty() {
        let first: Vec<String> = no_result.iter().take(10).cloned().collect();
        for line in check::whereabouts(js, processes::QUEUE, &first).await {
            report.fact(line);
        }
    }
    report.check(
        no_result.is_empty(),
        format!(
            "acknowledged tasks with no final result: {}",
            list(&no_result)
        ),
    );
    report.check(
        not_completed.is_empty(),
        format!("final results not completed: {}", list(&not_completed)),
    );
    report.check(
        not_one_stored.is_empty() && unreadable == 0,
        format!(
            "acknowledged tasks without exactly one final result stored: {} ({unreadable} unreadable)",
            list(&not_one_stored)
        ),
    );
    for (task, (w0, at0), (w1, at1)) in executions.unexplained.iter().take(10) {
        let since = |ns: &u128| ns.saturating_sub(load_began) as f64 / 1e9;
        report.fact(format!(
            "re-execution with no worker kill: {task} ran on {w0} at t+{:.1} s, again on {w1} at \
             t+{:.1} s",
            since(at0),
            since(at1)
        ));
    }
    report.check(
        executions.reexecutions == executions.matched,
        format!(
            "task re-executions with no worker kill to explain them: {}",
            executions.reexecutions - executions.matched
        ),
    );
    report.check(
        executions.unflagged.is_empty(),
        format!(
            "re-executions not flagged TASK_RERUN=1: {}",
            list(&executions.unflagged)
        ),
    );
    report.check(
        acked as u64 * 100 >= tasks.len() as u64 * ACKED_AT_LEAST,
        format!(
            "tasks acknowledged: {acked} of {}, at least {ACKED_AT_LEAST} %",
            tasks.len()
        ),
    );
}

fn describe(entry: &Applied) -> String {
    let outcome = match &entry.error {
        None => format!("healed in {:.1} s", entry.took.as_secs_f64()),
        Some(e) => format!("not applied: {e}"),
    };
    format!(
        "  t+{:6.1} s  {}  ({outcome})",
        entry.at.as_secs_f64(),
        entry.fault
    )
}

/// How many, and the first few.
fn count_list<T: std::fmt::Debug>(items: &[T]) -> String {
    if items.is_empty() {
        return "0".into();
    }
    format!(
        "{} (first: {:?})",
        items.len(),
        &items[..items.len().min(5)]
    )
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    format!(
        "{} ({})",
        items.len(),
        items[..items.len().min(5)].join(", ")
    )
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}
