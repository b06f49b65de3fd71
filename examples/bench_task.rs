//! Task benchmark: tasks through the runtime (delegator -> router -> worker attempt -> router ->
//! tracker) against the raw JetStream limit of the same hops, side by side in one run against
//! one local nats-server (started here, file storage, default sync).
//!
//! ```sh
//! cargo build --release -p examples --example bench_task
//! NATS_SERVER_BIN=$PWD/.tools/bin/nats-server RUST_LOG=warn \
//!     ./target/release/examples/bench_task [N] [PACED_SECS] [ROUNDS]
//! ```
//!
//! Defaults: N = 2,000 tasks per throughput run, PACED_SECS = 5 (latency at 200 tasks/s),
//! ROUNDS = 3 (medians are printed). Queue names, worker ids, task ids and raw stream names are
//! unique per run, so runs never see each other's messages.
//!
//! (a) raw: plain async-nats over the same four routed hops:
//!     - the delegator publishes each task (256 bytes, send time inside) to `rawa<tag>.task`
//!       in stream A (work-queue retention, like `HUB_INGRESS`), up to 256 publish acks in flight;
//!     - a relay pulls A (batches of 500) and republishes: tasks to stream W (work queue, like
//!       `HUB_WORK`), results to stream R (limits, like `HUB_TASKS`), each with a `Nats-Msg-Id`,
//!       pipelined, acking A after the store ack of W/R;
//!     - worker(s): one fetch loop per worker takes a free slot (16 per worker), fetches one
//!       message from W's shared durable consumer (an expiring 1-message pull, i.e. long poll),
//!       "runs" it (no-op), publishes the result to `rawa<tag>.result` in A, and acks W after
//!       the result's publish ack;
//!     - the delegator side pulls R (batches of 500) and acks.
//!     Two routed hops there and two back; no journal.
//! (b) runtime: an `ActorSystem` (durable) with `start_router()` and one or two workers
//!     (`start_worker`, concurrency 16 each, a no-op handler returning `Completed("ok")`; the
//!     worker fsyncs its journal per attempt result). Tasks are submitted with `delegate()`,
//!     up to 256 at once. The end is measured two ways:
//!     - (b-track) `delegate_tracked()` for every task (inside the timed window): one tracker
//!       actor per task under the system's dynamic supervisor, with a core subscription of
//!       `channel.task.<delegator>.<id>` made before the submission (so its initial stored read
//!       is skipped; it re-reads every 3 s while waiting, through a router). This is the honest
//!       end-to-end figure of the API;
//!     - (b-sub) one raw core subscription of `channel.task.>` counting final results (decoded,
//!       per task id once): the pipeline without the per-task trackers.
//!
//! Prints tasks/s for raw and both runtime variants with 1 worker and with 2 workers, the
//! ratios b/a, and p50/p99 round-trip latency (submit -> final result seen) at a paced
//! 200 tasks/s with 1 worker. Last, a diagnostic split of (b): the router alone (tasks
//! delegated with no worker, timed until the router stored them all), then one worker alone
//! on the pre-filled queue (timed until every final result was seen), with the worker's mean
//! number of attempts in flight sampled every 10 ms (16 would mean the slots are the limit;
//! far fewer means the fetch loop does not keep them busy).

// The runtime binary's allocator (runtime/src/main.rs), for both sides of the comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "bench_common.rs"]
mod bench_common;

use bench_common::{
    median, now_us, produce, raw_payload, raw_sent_us, spawn_relay, spawn_sink,
    stream_with_consumer, summarize, Run, WINDOW,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use protocol::task::{TaskChannelBody, TaskSpec};
use protocol::{AgentId, Codec, QueueName, WorkerId};
use runtime::system::tasks::new_task;
use runtime::{ActorSystem, AttemptContext, NatsSettings, Outcome, TaskHandler, WorkerSettings};
use tokio::sync::Semaphore;

const CONCURRENCY: usize = 16;
const PACED_RATE: u64 = 200;
const DEADLINE: Duration = Duration::from_secs(300);

/// Sleeps until task `i` is due when paced.
async fn pace(start: Instant, i: u64, rate: Option<u64>) {
    if let Some(rate) = rate {
        let due = start + Duration::from_micros(i * 1_000_000 / rate);
        tokio::time::sleep_until(due.into()).await;
    }
}

/// (a) The raw four-hop round trip. Returns when `n` results reached the delegator side.
async fn raw(
    client: async_nats::Client,
    tag: &str,
    n: u64,
    workers: usize,
    paced: Option<u64>,
) -> Run {
    let js = jetstream::new(client.clone());
    let (a, w, r) = (
        format!("RAWA_{tag}"),
        format!("RAWW_{tag}"),
        format!("RAWR_{tag}"),
    );
    use stream::RetentionPolicy::{Limits, WorkQueue};
    let relay_consumer =
        stream_with_consumer(&js, &a, format!("rawa{tag}.>"), WorkQueue, "relay", 1).await;
    let work_consumer =
        stream_with_consumer(&js, &w, format!("raww{tag}.>"), WorkQueue, "queue", 1).await;
    let sink_consumer =
        stream_with_consumer(&js, &r, format!("rawr{tag}.>"), Limits, "sink", 1).await;

    // The relay (router): A -> W for tasks, A -> R for results, ack A after the store ack.
    let task_subject = format!("rawa{tag}.task");
    let (w_subject, r_subject) = (format!("raww{tag}.q"), format!("rawr{tag}.t"));
    let relay = spawn_relay(relay_consumer, js.clone(), 2 * n, move |subject| {
        if subject == task_subject {
            w_subject.clone()
        } else {
            r_subject.clone()
        }
    });

    // The workers: one fetch loop each, one message per free slot.
    let mut worker_loops = Vec::new();
    for _ in 0..workers {
        let consumer = work_consumer.clone();
        let wjs = js.clone();
        let result_subject = format!("rawa{tag}.result");
        worker_loops.push(tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(CONCURRENCY));
            loop {
                let permit = slots.clone().acquire_owned().await.unwrap();
                let mut batch = consumer
                    .batch()
                    .max_messages(1)
                    .expires(Duration::from_millis(500))
                    .messages()
                    .await
                    .unwrap();
                let Some(Ok(msg)) = batch.next().await else {
                    continue;
                };
                let (wjs, subject) = (wjs.clone(), result_subject.clone());
                tokio::spawn(async move {
                    // The attempt: a no-op; its result carries the task's send time.
                    let result = raw_payload(raw_sent_us(&msg.payload));
                    wjs.publish(subject, result.into())
                        .await
                        .unwrap()
                        .await
                        .expect("result ack");
                    msg.ack().await.unwrap();
                    drop(permit);
                });
            }
        }));
    }

    // The delegator side's result consumer.
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let sink = spawn_sink(sink_consumer, n, latencies.clone());
    let start = Instant::now();
    produce(js.clone(), format!("rawa{tag}.task"), n, paced, |_, t| {
        raw_payload(t)
    })
    .await;
    tokio::time::timeout(DEADLINE, sink)
        .await
        .expect("raw results in time")
        .unwrap();
    let elapsed = start.elapsed();
    relay.await.unwrap();
    for l in worker_loops {
        l.abort();
    }
    for s in [&a, &w, &r] {
        let _ = js.delete_stream(s).await;
    }
    summarize(n, elapsed, &latencies)
}

/// The no-op handler.
struct Noop;

#[async_trait::async_trait]
impl TaskHandler for Noop {
    async fn run(&self, _task: TaskSpec, _ctx: AttemptContext) -> Outcome {
        Outcome::Completed(serde_json::json!("ok"))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// `track()` per task.
    Track,
    /// One core subscription of `channel.task.>`.
    Sub,
}

/// (b) The same round trip through the runtime.
async fn hub(
    url: &str,
    tag: &str,
    n: u64,
    workers: usize,
    paced: Option<u64>,
    end: End,
    journal_root: &std::path::Path,
) -> Run {
    let system = ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .build()
        .await
        .unwrap();
    system.start_router().await.unwrap();
    let queue = QueueName::new(format!("bench-{tag}")).unwrap();
    let journal_dir = journal_root.join(tag);
    std::fs::create_dir_all(&journal_dir).unwrap();
    for k in 0..workers {
        system
            .start_worker(WorkerSettings {
                concurrency: CONCURRENCY,
                ..WorkerSettings::new(
                    WorkerId::new(format!("w{k}-{tag}")).unwrap(),
                    queue.clone(),
                    journal_dir.clone(),
                    Arc::new(Noop),
                )
            })
            .await
            .unwrap();
    }
    let specs: Vec<TaskSpec> = (0..n)
        .map(|i| new_task(format!("bench {i}"), vec![]))
        .collect();
    let sent: Arc<Mutex<HashMap<String, u64>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(n as usize)));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let got = Arc::new(AtomicU64::new(0));

    // End (b-sub): one core subscription of every task channel.
    let sub_task = if end == End::Sub {
        let mut sub = system.client().subscribe("channel.task.>").await.unwrap();
        system.client().flush().await.unwrap();
        let (sent, lat, got) = (sent.clone(), latencies.clone(), got.clone());
        Some(tokio::spawn(async move {
            let mut seen = HashSet::new();
            while let Some(msg) = sub.next().await {
                let t = now_us();
                let Ok(env) = protocol::decode(&msg.payload, Codec::Json) else {
                    continue;
                };
                let Ok(TaskChannelBody::Result(result)) = serde_json::from_value(env.body) else {
                    continue;
                };
                if !result.state.is_final() || !seen.insert(result.task_id.to_string()) {
                    continue;
                }
                if let Some(s) = sent.lock().unwrap().get(result.task_id.as_str()) {
                    lat.lock().unwrap().push(t.saturating_sub(*s));
                    got.fetch_add(1, Ordering::Relaxed);
                }
            }
        }))
    } else {
        None
    };

    let alice = AgentId::new("alice").unwrap();
    let start = Instant::now();
    let system_ref = &system;
    let (queue_ref, alice_ref) = (&queue, &alice);
    futures::stream::iter(specs.iter().enumerate())
        .map(|(i, spec)| {
            let (sent, lat, got) = (sent.clone(), latencies.clone(), got.clone());
            async move {
                pace(start, i as u64, paced).await;
                let t0 = now_us();
                sent.lock().unwrap().insert(spec.task_id.to_string(), t0);
                if end == End::Track {
                    let (_, tracking) = system_ref
                        .delegate_tracked(alice_ref, queue_ref, None, spec)
                        .await
                        .unwrap();
                    tokio::spawn(async move {
                        if let Ok(Ok(_)) = tokio::time::timeout(DEADLINE, tracking.result).await {
                            lat.lock().unwrap().push(now_us().saturating_sub(t0));
                            got.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                } else {
                    system_ref
                        .delegate(alice_ref, queue_ref, None, spec)
                        .await
                        .unwrap();
                }
            }
        })
        .buffer_unordered(WINDOW)
        .for_each(|()| async {})
        .await;
    let deadline = Instant::now() + DEADLINE;
    while got.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            panic!(
                "runtime: {} of {n} results in time",
                got.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    if let Some(t) = sub_task {
        t.abort();
    }
    system.shutdown(Duration::from_secs(10)).await.unwrap();
    summarize(n, elapsed, &latencies)
}

/// Diagnostic split of (b), 1 worker, one subscription: first `n` tasks are delegated with no
/// worker running and timed until the router stored them all in the work stream (hop one
/// alone); then the worker starts and is timed until all `n` final results were seen (the
/// worker's attempts plus the result's routed hop, with no task routing at the same time).
async fn split(url: &str, tag: &str, n: u64, journal_root: &std::path::Path) -> (f64, f64) {
    let system = ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .build()
        .await
        .unwrap();
    system.start_router().await.unwrap();
    let queue = QueueName::new(format!("bench-{tag}")).unwrap();
    let journal_dir = journal_root.join(tag);
    std::fs::create_dir_all(&journal_dir).unwrap();
    let mut sub = system.client().subscribe("channel.task.>").await.unwrap();
    system.client().flush().await.unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let count = got.clone();
    let sub_task = tokio::spawn(async move {
        let mut seen = HashSet::new();
        while let Some(msg) = sub.next().await {
            let Ok(env) = protocol::decode(&msg.payload, Codec::Json) else {
                continue;
            };
            let Ok(TaskChannelBody::Result(result)) = serde_json::from_value(env.body) else {
                continue;
            };
            if result.state.is_final() && seen.insert(result.task_id.to_string()) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let specs: Vec<TaskSpec> = (0..n)
        .map(|i| new_task(format!("bench {i}"), vec![]))
        .collect();
    let alice = AgentId::new("alice").unwrap();
    let stored0 = system
        .snapshot()
        .await
        .unwrap()
        .router
        .unwrap()
        .counters
        .stored;
    let start = Instant::now();
    futures::stream::iter(specs.iter())
        .map(|spec| system.delegate(&alice, &queue, None, spec))
        .buffer_unordered(WINDOW)
        .for_each(|r| async move {
            r.unwrap();
        })
        .await;
    while system
        .snapshot()
        .await
        .unwrap()
        .router
        .unwrap()
        .counters
        .stored
        < stored0 + n
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let route = n as f64 / start.elapsed().as_secs_f64();
    system
        .start_worker(WorkerSettings {
            concurrency: CONCURRENCY,
            ..WorkerSettings::new(
                WorkerId::new(format!("w-{tag}")).unwrap(),
                queue.clone(),
                journal_dir,
                Arc::new(Noop),
            )
        })
        .await
        .unwrap();
    let start = Instant::now();
    let wid = WorkerId::new(format!("w-{tag}")).unwrap();
    let (mut samples, mut in_flight) = (0u64, 0u64);
    while got.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(snap) = system.worker_snapshot(&wid).await {
            let c = snap.counters;
            in_flight += c
                .admitted
                .saturating_sub(c.completed + c.failed + c.cancelled);
            samples += 1;
        }
    }
    let work = n as f64 / start.elapsed().as_secs_f64();
    if let Some(snap) = system.worker_snapshot(&wid).await {
        println!(
            "  worker: mean attempts in flight {:.1} of {CONCURRENCY} (sampled every 10 ms), redelivered {}",
            in_flight as f64 / samples.max(1) as f64,
            snap.counters.redelivered
        );
    }
    sub_task.abort();
    system.shutdown(Duration::from_secs(10)).await.unwrap();
    (route, work)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    const NAMES: [&str; 3] = ["N", "PACED_SECS", "ROUNDS"];
    let args = examples::args::from_env_or_exit(
        "bench_task",
        &NAMES,
        "N tasks per throughput run (default 2000), PACED_SECS of latency at 200 tasks/s \
         (default 5), ROUNDS (default 3; medians are printed); BENCH_ONLY=raw|track|sub runs \
         one variant, BENCH_LOG=1 logs to stderr",
    );
    let n = args[0].unwrap_or(2_000);
    let paced_secs = args[1].unwrap_or(5);
    let rounds = usize::try_from(args[2].unwrap_or(3))?;
    let only = std::env::var("BENCH_ONLY").ok();
    if let Some(only) = only.as_deref() {
        if !matches!(only, "raw" | "track" | "sub") {
            examples::args::usage_error(
                "bench_task",
                &NAMES,
                &format!("BENCH_ONLY must be raw, track or sub, got {only:?}"),
            );
        }
    }
    // BENCH_LOG=1: the runtime's logs on stderr (RUST_LOG filters them), for diagnosis.
    let _telemetry = match std::env::var("BENCH_LOG") {
        Ok(_) => Some(runtime::telemetry::init(false, "warn")?),
        Err(_) => None,
    };
    let server = harness::run_server().await?;
    let client = server.client().await?;
    let nonce = format!("{:x}", now_us());
    let journal_root = std::env::temp_dir().join(format!("bench_task-{nonce}"));
    println!(
        "nats-server {} (file storage, default sync); {n} tasks, concurrency {CONCURRENCY} per worker; {rounds} rounds, medians",
        server.url()
    );

    // BENCH_ONLY=track|sub|raw runs that variant alone (1 worker), for profiling.
    if let Some(only) = only {
        let tag = format!("{nonce}o");
        let run = match only.as_str() {
            "raw" => raw(client.clone(), &format!("O{tag}"), n, 1, None).await,
            "track" | "sub" => {
                let end = if only == "track" {
                    End::Track
                } else {
                    End::Sub
                };
                hub(
                    &server.url(),
                    &format!("o{tag}"),
                    n,
                    1,
                    None,
                    end,
                    &journal_root,
                )
                .await
            }
            other => anyhow::bail!("BENCH_ONLY must be raw, track or sub, not {other}"),
        };
        println!("{only}: {:.0} tasks/s", run.rate);
        let _ = std::fs::remove_dir_all(&journal_root);
        return Ok(());
    }
    for workers in [1usize, 2] {
        let (mut ra, mut rt, mut rs) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let tag = format!("{nonce}{workers}{round}");
            let a = raw(client.clone(), &format!("T{tag}"), n, workers, None).await;
            let t = hub(
                &server.url(),
                &format!("t{tag}"),
                n,
                workers,
                None,
                End::Track,
                &journal_root,
            )
            .await;
            let s = hub(
                &server.url(),
                &format!("s{tag}"),
                n,
                workers,
                None,
                End::Sub,
                &journal_root,
            )
            .await;
            println!(
                "  {workers} worker(s) round {round}: raw {:>7.0} tasks/s, runtime+track {:>7.0} tasks/s, runtime+sub {:>7.0} tasks/s",
                a.rate, t.rate, s.rate
            );
            ra.push(a.rate);
            rt.push(t.rate);
            rs.push(s.rate);
        }
        let (a, t, s) = (median(ra), median(rt), median(rs));
        println!("throughput, {workers} worker(s) x {CONCURRENCY}, {n} tasks:");
        println!("  (a) raw four hops                 {a:>8.0} tasks/s");
        println!(
            "  (b) runtime, track() per task     {t:>8.0} tasks/s   ratio b/a {:>5.2}",
            t / a
        );
        println!(
            "  (b) runtime, one subscription     {s:>8.0} tasks/s   ratio b/a {:>5.2}",
            s / a
        );
    }

    let paced = PACED_RATE * paced_secs;
    let tag = format!("{nonce}p");
    let a = raw(
        client.clone(),
        &format!("P{tag}"),
        paced,
        1,
        Some(PACED_RATE),
    )
    .await;
    let t = hub(
        &server.url(),
        &format!("pt{tag}"),
        paced,
        1,
        Some(PACED_RATE),
        End::Track,
        &journal_root,
    )
    .await;
    let s = hub(
        &server.url(),
        &format!("ps{tag}"),
        paced,
        1,
        Some(PACED_RATE),
        End::Sub,
        &journal_root,
    )
    .await;
    println!("round-trip latency at {PACED_RATE} tasks/s for {paced_secs} s, 1 worker:");
    println!(
        "  (a) raw four hops                 p50 {:>7.2} ms  p99 {:>7.2} ms",
        a.p50_ms, a.p99_ms
    );
    println!(
        "  (b) runtime, track() per task     p50 {:>7.2} ms  p99 {:>7.2} ms",
        t.p50_ms, t.p99_ms
    );
    println!(
        "  (b) runtime, one subscription     p50 {:>7.2} ms  p99 {:>7.2} ms",
        s.p50_ms, s.p99_ms
    );
    let (route, work) = split(&server.url(), &format!("d{nonce}"), n, &journal_root).await;
    println!("diagnostic split of (b), 1 worker, {n} tasks:");
    println!("  router alone, tasks to the work stream (no worker)      {route:>8.0} tasks/s");
    println!("  then worker alone + routed results (queue pre-filled)  {work:>8.0} tasks/s");
    let _ = std::fs::remove_dir_all(&journal_root);
    Ok(())
}
