//! Many agents in one process: what idle inboxes and tracked tasks cost a host, and what DMs to
//! one of many inboxes take (issue 11).
//!
//! ```sh
//! cargo run --release -p examples --example bench_inboxes -- [N] [IDLE_SECS] [PACED_SECS] [TASKS] [ATTACHING]
//! ```
//!
//! One local nats-server (file storage) and a router in a child process (this program run
//! again), so that this process holds only what a host holds. Then, in this process, one
//! `ActorSystem` (durable):
//! 1. attaches N idle inboxes (default 10,000) with `attach_inbox`, ATTACHING at a time
//!    (default 64; 1 attaches one after the other), and prints the attach rate and the RSS
//!    above the empty system at 1k, 5k and 10k (each taken once the process has settled); it
//!    stops at the first failed attach and says so;
//! 2. measures nats-server's CPU over IDLE_SECS (default 30) with every inbox attached and idle;
//! 3. sends DMs to random attached inboxes at 1,000/s for PACED_SECS (default 5) and prints
//!    p50/p99 from send to handler, and the same to one inbox of a fresh system for reference:
//!    published to the ingress (the routed DM alone, as `bench_dm` measures it), then with
//!    `ActorSystem::send` (which first reads whether the recipient was removed, a read cached
//!    per recipient);
//! 4. detaches half of the inboxes with `detach_inbox` (the same ATTACHING at a time) and
//!    prints how long that took and the RSS left, then times the shutdown of the other half;
//!    nats-server's idle CPU is measured again with half the consumers pulled from (once the
//!    detached ones' last pulls expired), and with none (what the durable consumers cost by
//!    themselves);
//! 5. in a child process of its own, tracks TASKS tasks (default 10,000) at once with
//!    `delegate_tracked` to a queue no worker serves (no result comes) and prints the RSS they
//!    cost, and nats-server's CPU while they wait (IDLE_SECS).
//!
//! RSS is `VmRSS` of `/proc/self/status`; the allocator is the `runtime` binary's (mimalloc),
//! wrapped to count the heap's live bytes, printed beside RSS ("heap"): an allocator keeps
//! memory it was given back, so only the heap says what a detach released.
//! Where the memory goes, by call site:
//!
//! ```sh
//! cargo build --release -p examples --example bench_inboxes --features system-alloc
//! heaptrack target/release/examples/bench_inboxes 1000 1 1 1
//! # what one idle inbox holds: exit once attached, everything live then reported as leaked
//! BENCH_EXIT_AFTER_ATTACH=1 heaptrack target/release/examples/bench_inboxes 1000 1 1 1
//! ```

// The `runtime` binary's allocator; `--features system-alloc` leaves the system's, for a heap
// profiler (heaptrack) to see every allocation. Either way wrapped to count the bytes live,
// which say what a detach released whatever the allocator keeps for later.
#[cfg(not(feature = "system-alloc"))]
static INNER: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(feature = "system-alloc")]
static INNER: std::alloc::System = std::alloc::System;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes allocated and not freed.
static LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// The allocator, counting what is live in [`LIVE`].
struct Counting;

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = INNER.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: std::alloc::Layout) {
        INNER.dealloc(p, layout);
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = INNER.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, p: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        let q = INNER.realloc(p, layout, size);
        if !q.is_null() {
            LIVE.fetch_add(size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        q
    }
}

/// The heap's live bytes now, kB.
fn live_kb() -> i64 {
    LIVE.load(Ordering::Relaxed) / 1024
}

#[path = "bench_common.rs"]
mod bench_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench_common::{cpu_ms, now_us, percentile};
use futures::StreamExt;
use protocol::{AgentId, QueueName};
use runtime::{ActorSystem, NatsSettings};

/// Set in the child that runs the router: the server's URL.
const ROUTER_ENV: &str = "BENCH_INBOXES_ROUTER";
/// Set in the child that tracks tasks: the server's URL and how many tasks.
const TASKS_ENV: &str = "BENCH_INBOXES_TASKS";
/// Set: exit right after attaching, without a destructor run (heaptrack then reports every
/// idle inbox's memory as leaked, by call site).
const EXIT_AFTER_ATTACH_ENV: &str = "BENCH_EXIT_AFTER_ATTACH";
/// Where RSS is read at while attaching.
const CHECKPOINTS: [u64; 3] = [1_000, 5_000, 10_000];

/// RSS once it has stopped moving (allocators hand memory back lazily), kB.
async fn settled_rss_kb() -> u64 {
    harness::rss::settled_rss_kb(Duration::from_secs(3)).await
}

async fn system(url: &str) -> ActorSystem {
    ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .build()
        .await
        .expect("system")
}

/// The child: a router on `url` until it is killed.
async fn run_router(url: &str) -> ! {
    // BENCH_LOG=1: the router's logs on stderr (RUST_LOG filters them), for diagnosis.
    let _telemetry = std::env::var("BENCH_LOG")
        .ok()
        .map(|_| runtime::telemetry::init(false, "warn").expect("telemetry"));
    let system = system(url).await;
    system.start_router().await.expect("router");
    println!("router ready");
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// A DM body of its send time, µs.
fn timed_body() -> serde_json::Value {
    serde_json::json!({ "sent_us": now_us() })
}

/// Records send-to-handler latency of every DM it sees.
type Latencies = Arc<Mutex<Vec<u64>>>;

/// Attaches `id` with a handler that records each DM's latency and counts it.
async fn attach(
    system: &ActorSystem,
    id: &AgentId,
    latencies: &Latencies,
    seen: &Arc<AtomicU64>,
) -> Result<(), runtime::SystemError> {
    let (latencies, seen) = (latencies.clone(), seen.clone());
    system
        .attach_inbox(id, move |d| {
            let sent = d.envelope.body["sent_us"].as_u64().unwrap_or(0);
            latencies
                .lock()
                .unwrap()
                .push(now_us().saturating_sub(sent));
            seen.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {})
        })
        .await
}

/// How the paced DMs are sent.
#[derive(Clone, Copy)]
enum Via {
    /// `ActorSystem::send`, one after the other: what a host's send costs, with its checks (a
    /// read of whether the recipient was removed, cached per recipient for 4 s: a miss for
    /// nearly every DM to a random one of 10,000).
    Send,
    /// Published to alice's ingress, store acks awaited aside: the routed DM alone, as
    /// `bench_dm` measures it (docs/PERFORMANCE.md).
    Ingress,
}

/// Sends DMs from `alice` at 1,000/s for `secs` to the agent `pick(i)` and waits (up to 30 s)
/// until `seen` has counted them all; p50 and p99 in ms, how many were handled, and the rate
/// they were sent at (below 1,000/s when each send takes longer than a millisecond).
async fn paced(
    system: &ActorSystem,
    via: Via,
    secs: u64,
    pick: impl Fn(u64) -> AgentId,
    latencies: &Latencies,
    seen: &AtomicU64,
) -> (f64, f64, u64, f64) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let alice = AgentId::new("alice").unwrap();
    let js = async_nats::jetstream::new(system.client().clone());
    latencies.lock().unwrap().clear();
    let before = seen.load(Ordering::Relaxed);
    let n = secs * 1_000;
    let start = Instant::now();
    let mut acks = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until((start + Duration::from_micros(i * 1_000)).into()).await;
        match via {
            Via::Send => {
                system
                    .send(&alice, &pick(i), timed_body())
                    .await
                    .expect("send");
            }
            Via::Ingress => {
                let id = format!("paced-{run}-{i}");
                let mut meta = protocol::Meta::new(protocol::MessageId::new(id.as_str()).unwrap());
                meta.to = Some(pick(i));
                let envelope = protocol::Envelope {
                    meta,
                    body: timed_body(),
                    extra: Default::default(),
                };
                let payload = protocol::encode(&envelope, protocol::Codec::Json).unwrap();
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(
                    protocol::headers::NATS_MSG_ID,
                    format!("alice:{id}").as_str(),
                );
                let ack = js
                    .publish_with_headers("hub.pub.alice.inbox", headers, payload.into())
                    .await
                    .expect("publish");
                acks.spawn(async move { ack.await.expect("stored") });
            }
        }
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    while acks.join_next().await.is_some() {}
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.load(Ordering::Relaxed) - before < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut l = latencies.lock().unwrap().clone();
    l.sort_unstable();
    (
        percentile(&l, 0.50),
        percentile(&l, 0.99),
        seen.load(Ordering::Relaxed) - before,
        rate,
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Ok(url) = std::env::var(ROUTER_ENV) {
        run_router(&url).await;
    }
    if let Ok(arg) = std::env::var(TASKS_ENV) {
        return tracked_tasks(&arg).await;
    }
    let _telemetry = std::env::var("BENCH_LOG")
        .ok()
        .map(|_| runtime::telemetry::init(false, "warn"))
        .transpose()?;
    const NAMES: [&str; 5] = ["N", "IDLE_SECS", "PACED_SECS", "TASKS", "ATTACHING"];
    let args = examples::args::from_env_or_exit(
        "bench_inboxes",
        &NAMES,
        "N idle inboxes (default 10000), IDLE_SECS of idle broker CPU (default 30), \
         PACED_SECS of DMs at 1,000/s (default 5), TASKS tracked at once (default 10000), \
         ATTACHING attaches at a time (default 64)",
    );
    let n = args[0].unwrap_or(10_000);
    let idle_secs = args[1].unwrap_or(30);
    let paced_secs = args[2].unwrap_or(5);
    let tasks = args[3].unwrap_or(10_000);
    let attaching = args[4].unwrap_or(64) as usize;

    let server = harness::run_server().await?;
    let url = server.url();
    let mut router = tokio::process::Command::new(std::env::current_exe()?)
        .env(ROUTER_ENV, &url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    {
        use tokio::io::AsyncBufReadExt;
        let out = router.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(out).lines();
        while let Some(line) = lines.next_line().await? {
            if line == "router ready" {
                break;
            }
        }
    }
    println!(
        "nats-server {url} (file storage); router in process {:?}",
        router.id()
    );

    // 1. Idle inboxes.
    let host = system(&url).await;
    let empty = settled_rss_kb().await;
    let empty_heap = live_kb();
    println!(
        "empty system: RSS {:.1} MB, heap {:.1} MB",
        empty as f64 / 1024.0,
        empty_heap as f64 / 1024.0
    );
    let latencies: Latencies = Arc::default();
    let seen = Arc::new(AtomicU64::new(0));
    let mut attached = 0u64;
    let start = Instant::now();
    let mut last = (0u64, Duration::ZERO);
    let mut failure = None;
    // Blocks that end at each checkpoint, each attached `attaching` at a time.
    let mut ends: Vec<u64> = CHECKPOINTS.iter().copied().filter(|&c| c < n).collect();
    ends.push(n);
    for end in ends {
        let block = futures::stream::iter(attached..end)
            .map(|i| {
                let (host, latencies, seen) = (&host, &latencies, &seen);
                async move {
                    let id = AgentId::new(format!("idle{i}")).expect("a valid id");
                    attach(host, &id, latencies, seen)
                        .await
                        .map_err(|e| format!("attach of idle{i} failed: {e}"))
                }
            })
            .buffer_unordered(attaching);
        let results: Vec<Result<(), String>> = block.collect().await;
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        attached += ok;
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            failure = Some(e);
        }
        let took = start.elapsed();
        let rate = (attached - last.0) as f64 / (took - last.1).as_secs_f64();
        last = (attached, took);
        let rss = settled_rss_kb().await;
        let above = rss.saturating_sub(empty);
        let heap = live_kb() - empty_heap;
        println!(
            "{attached:>6} inboxes: attached in {:>6.1} s ({rate:>5.0}/s over the last block), RSS +{:>7.1} MB, {:>6.1} kB per inbox (heap {:>5.1} kB)",
            took.as_secs_f64(),
            above as f64 / 1024.0,
            above as f64 / attached.max(1) as f64,
            heap as f64 / attached.max(1) as f64,
        );
        if failure.is_some() {
            break;
        }
    }
    if let Some(failure) = &failure {
        println!("{failure}; going on with {attached} inboxes");
    }
    if std::env::var_os(EXIT_AFTER_ATTACH_ENV).is_some() {
        // For a heap profiler: what is live now is reported as leaked, by call site.
        router.start_kill().ok();
        drop(server);
        std::process::exit(0);
    }

    // 2. The broker while they idle.
    let broker = server.pid().expect("the server's pid");
    let idle = |what: String| async move {
        let (cpu0, t0) = (cpu_ms(broker), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let busy = (cpu_ms(broker) - cpu0) as f64 / t0.elapsed().as_millis() as f64;
        println!(
            "nats-server idle {what}: {:.1} % of a core over {idle_secs} s",
            busy * 100.0
        );
    };
    idle(format!("with {attached} inboxes attached")).await;

    // 3. DMs to random inboxes, and to the one inbox of a fresh system.
    let solo = system(&url).await;
    let (solo_latencies, solo_seen): (Latencies, _) = (Arc::default(), Arc::new(AtomicU64::new(0)));
    let bob = AgentId::new("solo-bob")?;
    attach(&solo, &bob, &solo_latencies, &solo_seen).await?;
    for (via, how) in [
        (Via::Ingress, "published to the ingress"),
        (Via::Send, "with ActorSystem::send"),
    ] {
        let mut random_p99 = None;
        if attached > 0 {
            // A scattered attached inbox per DM (Fibonacci hashing of the DM's number).
            let pick = |i: u64| {
                let n = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % attached;
                AgentId::new(format!("idle{n}")).unwrap()
            };
            let (p50, p99, got, rate) =
                paced(&host, via, paced_secs, pick, &latencies, &seen).await;
            println!(
                "DMs {how} to random inboxes of {attached}, 1,000/s for {paced_secs} s: p50 {p50:.2} ms, p99 {p99:.2} ms ({got} handled, sent at {rate:.0}/s)"
            );
            random_p99 = Some(p99);
        }
        let (p50, p99, got, rate) = paced(
            &solo,
            via,
            paced_secs,
            |_| bob.clone(),
            &solo_latencies,
            &solo_seen,
        )
        .await;
        println!(
            "DMs {how} to one inbox (a fresh system), 1,000/s for {paced_secs} s: p50 {p50:.2} ms, p99 {p99:.2} ms ({got} handled, sent at {rate:.0}/s)"
        );
        if let Some(random) = random_p99 {
            println!(
                "  p99 ratio, random of {attached} / one: {:.2}",
                random / p99.max(0.001)
            );
        }
    }
    solo.shutdown(Duration::from_secs(10)).await?;

    // 4. Detach half, shut down with the rest.
    let ids = host.attached_inboxes().await;
    let half = ids.len() / 2;
    let before_detach = settled_rss_kb().await;
    let heap_before_detach = live_kb();
    let detaching = Instant::now();
    let detached: Vec<_> = futures::stream::iter(&ids[..half])
        .map(|id| host.detach_inbox(id, Duration::from_secs(10)))
        .buffer_unordered(attaching)
        .collect()
        .await;
    let took = detaching.elapsed();
    let failed = detached.iter().filter(|r| r.is_err()).count();
    let after_detach = settled_rss_kb().await;
    let heap_after_detach = live_kb();
    println!(
        "detach of {half} inboxes: {:.1} s ({failed} failed); above the empty system, RSS {:.1} → {:.1} MB, heap {:.1} → {:.1} MB ({:.1} kB of heap released per inbox)",
        took.as_secs_f64(),
        before_detach.saturating_sub(empty) as f64 / 1024.0,
        after_detach.saturating_sub(empty) as f64 / 1024.0,
        (heap_before_detach - empty_heap) as f64 / 1024.0,
        (heap_after_detach - empty_heap) as f64 / 1024.0,
        (heap_before_detach - heap_after_detach) as f64 / half.max(1) as f64,
    );
    let rest = ids.len() - half;
    // The detached inboxes' last pulls wait at the broker until they expire (30 s), heartbeated
    // meanwhile: measured after that.
    tokio::time::sleep(Duration::from_secs(35)).await;
    idle(format!(
        "with {rest} of its {} inbox consumers attached",
        ids.len()
    ))
    .await;
    let stopping = Instant::now();
    match host.shutdown(Duration::from_secs(30)).await {
        Ok(()) => println!(
            "shutdown with {rest} inboxes: {:.1} s",
            stopping.elapsed().as_secs_f64()
        ),
        Err(e) => println!("shutdown with {rest} inboxes failed: {e}"),
    }
    idle(format!(
        "with its {} inbox consumers, none attached",
        ids.len()
    ))
    .await;

    // The broker's share of the latency to a cold consumer of many, without the runtime.
    if attached > 0 {
        raw_reference(&url, attached, idle_secs, paced_secs, attaching).await?;
    }

    // 5. Tracked tasks, in a child process of their own: this one's allocator keeps what the
    // inboxes freed, and would count it again.
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .env(TASKS_ENV, format!("{url} {tasks} {broker} {idle_secs}"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .await?;
    print!("{}", String::from_utf8_lossy(&child.stdout));
    router.kill().await?;
    Ok(())
}

/// The child that tracks tasks: `"<url> <tasks> <broker pid> <idle secs>"`. It tracks that
/// many tasks at once to a queue no worker serves, prints what they cost the host and the
/// broker while they wait, and exits.
async fn tracked_tasks(arg: &str) -> anyhow::Result<()> {
    let parts: Vec<&str> = arg.split(' ').collect();
    let [url, tasks, broker, idle_secs] = parts[..] else {
        anyhow::bail!("{TASKS_ENV} is \"<url> <tasks> <broker pid> <idle secs>\", not {arg:?}");
    };
    let (tasks, broker, idle_secs): (u64, u32, u64) =
        (tasks.parse()?, broker.parse()?, idle_secs.parse()?);
    let tracker_host = system(url).await;
    let before = settled_rss_kb().await;
    let heap_before = live_kb();
    let alice = AgentId::new("alice")?;
    let queue = QueueName::new("nobody-serves")?;
    let start = Instant::now();
    let mut tracking = Vec::with_capacity(tasks as usize);
    for i in 0..tasks {
        let spec = runtime::system::tasks::new_task(format!("task {i}"), Vec::new());
        match tracker_host
            .delegate_tracked(&alice, &queue, None, &spec)
            .await
        {
            Ok(t) => tracking.push(t),
            Err(e) => {
                println!("delegate_tracked {} failed: {e}", i + 1);
                break;
            }
        }
    }
    let took = start.elapsed();
    let rss = settled_rss_kb().await;
    let above = rss.saturating_sub(before);
    let heap = live_kb() - heap_before;
    let n = tracking.len().max(1) as f64;
    println!(
        "{:>6} tracked tasks: submitted in {:.1} s, RSS +{:.1} MB, {:.1} kB per task (heap {:.1} kB)",
        tracking.len(),
        took.as_secs_f64(),
        above as f64 / 1024.0,
        above as f64 / n,
        heap as f64 / n,
    );
    // Twice: the trackers' re-reads back off from 3 s to 30 s within their first minute.
    for window in ["first", "second"] {
        let (cpu0, t0) = (cpu_ms(broker), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let busy = (cpu_ms(broker) - cpu0) as f64 / t0.elapsed().as_millis() as f64;
        let reads = tracker_host
            .snapshot()
            .await?
            .tracking
            .map_or(0, |t| t.counters.reads);
        println!(
            "nats-server while {} tracked tasks wait ({window} {idle_secs} s): {:.1} % of a core ({reads} stored reads so far)",
            tracking.len(),
            busy * 100.0
        );
    }
    drop(tracking);
    tracker_host.shutdown(Duration::from_secs(30)).await?;
    Ok(())
}

/// The raw reference for DMs to many inboxes: `n` plain pull consumers (async-nats, one stream,
/// one filter subject each, the pull settings of an inbox), idle for `idle_secs`, then messages
/// at 1,000/s for `secs` to random ones and to one of them; prints p50/p99 of each and the p99
/// ratio. One hop (publish, pull), where a DM takes two (the router between).
async fn raw_reference(
    url: &str,
    n: u64,
    idle_secs: u64,
    secs: u64,
    attaching: usize,
) -> anyhow::Result<()> {
    use async_nats::jetstream::{consumer::pull, stream};
    let client = async_nats::connect(url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js
        .create_stream(stream::Config {
            name: "RAW_INBOX".into(),
            subjects: vec!["raw.inbox.*".into()],
            max_consumers: (n as i32).saturating_add(10),
            ..Default::default()
        })
        .await?;
    let latencies: Latencies = Arc::default();
    let seen = Arc::new(AtomicU64::new(0));
    let pumps: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let (stream, latencies, seen) = (&stream, latencies.clone(), seen.clone());
            async move {
                let consumer = stream
                    .create_consumer(pull::Config {
                        durable_name: Some(format!("raw-{i}")),
                        filter_subject: format!("raw.inbox.{i}"),
                        ..Default::default()
                    })
                    .await?;
                let mut messages = consumer
                    .stream()
                    .max_messages_per_batch(256)
                    .heartbeat(Duration::from_secs(5))
                    .expires(Duration::from_secs(30))
                    .messages()
                    .await?;
                Ok::<_, anyhow::Error>(tokio::spawn(async move {
                    while let Some(Ok(msg)) = messages.next().await {
                        let sent: u64 = std::str::from_utf8(&msg.payload)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        latencies
                            .lock()
                            .unwrap()
                            .push(now_us().saturating_sub(sent));
                        seen.fetch_add(1, Ordering::Relaxed);
                        let _ = msg.ack().await;
                    }
                }))
            }
        })
        .buffer_unordered(attaching)
        .collect()
        .await;
    let pumps: Vec<_> = pumps.into_iter().collect::<Result<_, _>>()?;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let paced_raw = |pick: Box<dyn Fn(u64) -> u64>| {
        let (js, latencies, seen) = (js.clone(), latencies.clone(), seen.clone());
        async move {
            latencies.lock().unwrap().clear();
            let before = seen.load(Ordering::Relaxed);
            let count = secs * 1_000;
            let start = Instant::now();
            let mut acks = tokio::task::JoinSet::new();
            for i in 0..count {
                tokio::time::sleep_until((start + Duration::from_micros(i * 1_000)).into()).await;
                let ack = js
                    .publish(
                        format!("raw.inbox.{}", pick(i)),
                        now_us().to_string().into(),
                    )
                    .await
                    .expect("publish");
                acks.spawn(async move { ack.await.expect("stored") });
            }
            while acks.join_next().await.is_some() {}
            let deadline = Instant::now() + Duration::from_secs(30);
            while seen.load(Ordering::Relaxed) - before < count && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut l = latencies.lock().unwrap().clone();
            l.sort_unstable();
            (percentile(&l, 0.50), percentile(&l, 0.99))
        }
    };
    let (r50, r99) = paced_raw(Box::new(move |i| {
        (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % n
    }))
    .await;
    let (o50, o99) = paced_raw(Box::new(|_| 0)).await;
    println!(
        "raw JetStream, {n} pull consumers idle {idle_secs} s, 1,000 msgs/s for {secs} s: to random ones p50 {r50:.2} ms, p99 {r99:.2} ms; to one p50 {o50:.2} ms, p99 {o99:.2} ms; p99 ratio {:.2}",
        r99 / o99.max(0.001)
    );
    for pump in pumps {
        pump.abort();
    }
    Ok(())
}
