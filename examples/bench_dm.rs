//! DM benchmark: the router actor and the inbox against the raw two-hop JetStream limit, side by
//! side in one run against one local nats-server (started here, file storage, default sync).
//!
//! ```sh
//! cargo run --release -p examples --example bench_dm -- [N] [PACED_SECS] [ROUNDS]
//! ```
//!
//! (a) raw: publish to stream A, pull, republish to stream B with a message id (pipelined,
//!     ack A after B's store ack), pull B and ack: plain async-nats.
//! (b) hub: publish envelopes to `hub.pub.alice.inbox`; the router actor stores them in
//!     `HUB_INBOX`; bob's inbox hands each to a handler and acks it.
//!
//! Prints msgs/s for each with the producer live, the ratios b/a and c/a (of the arms' median
//! rates, and the median of each round's own ratio), and p50/p99 end-to-end latency at a paced
//! 1,000 msgs/s (raw, and the hub with the audit trail on).
//!
//! (c) the same as (b) with the audit trail off (`audit_events = false`): what the trail costs
//!     is the difference, measured side by side in each round.
//!
//! Every arm starts on an empty server and deletes every stream it made when it ends (the hub's
//! streams and KV buckets too), so no run stores into streams that hold an earlier run's
//! messages and message ids.
//!
//! `BENCH_OTLP=1` installs the runtime's telemetry (`runtime::telemetry::init`, as the `runtime`
//! binary does) before anything runs, so that with `OTEL_EXPORTER_OTLP_ENDPOINT` set the
//! router's `route` and the inbox's `inbox.handle` spans go to the OTLP batch exporter. With an
//! endpoint where nothing listens it measures what an unreachable collector costs routing:
//!
//! ```sh
//! BENCH_OTLP=1 OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1 \
//!     cargo run --release -p examples --example bench_dm -- 50000 5 5
//! ```
//!
//! `BENCH_CLUSTER=1` runs both arms on a 3-node cluster on loopback (`harness::Cluster`, every
//! node with `sync_interval: always`) with every stream R3, the raw arm's and the hub's alike:
//! the R3 ratio of issue 29 §6.
//!
//! `BENCH_ROUTERS=N` runs N routers in the hub arms (each an `ActorSystem` of its own, with its
//! own connection, sharing the ingress's consumer): router scaling, issue 29 §6.
//!
//! `BENCH_ARM=a|b|c` runs that arm alone, ROUNDS times, and prints its rate and CPU per DM: for
//! a profiler (`perf record`), whose sample counts of two such runs compare where each arm
//! spends its CPU.

// The runtime binary's allocator (runtime/src/main.rs), for both sides of the comparison.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "bench_common.rs"]
mod bench_common;

use bench_common::{
    cpu_ms, median, now_us, produce, raw_payload, spawn_relay, spawn_sink, stream_with_consumer,
    summarize, Run, PAYLOAD,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use protocol::{AgentId, Codec, Envelope, MessageId, Meta};
use runtime::{ActorSystem, NatsSettings};

/// Envelopes of about 256 bytes to one recipient, whose body is `"<send time us>:<padding>"`,
/// made as a client that sends many would make them: encoded once as a template, with each
/// one's `meta.id` and body written into it (the raw arm's producer formats its payload just as
/// cheaply; encoding each envelope twice, as this program once did, was 4 % of the process's
/// CPU, which the hub arm alone paid). [`Envelopes::check`] proves the bytes are what
/// `protocol::encode` writes.
struct Envelopes {
    to: AgentId,
    /// The encoding around the id and the body: before the id, between them, after the body.
    parts: [Vec<u8>; 3],
}

impl Envelopes {
    const ID: &'static str = "IDPLACEHOLDER";
    const BODY: &'static str = "BODYPLACEHOLDER";

    fn to(to: &AgentId) -> Envelopes {
        let template = Self::slow(Self::ID, Self::BODY, to);
        let find = |needle: &str| {
            template
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .expect("the placeholder is in the template")
        };
        let (id, body) = (find(Self::ID), find(Self::BODY));
        assert!(id < body, "meta comes before the body");
        Envelopes {
            to: to.clone(),
            parts: [
                template[..id].to_vec(),
                template[id + Self::ID.len()..body].to_vec(),
                template[body + Self::BODY.len()..].to_vec(),
            ],
        }
    }

    /// What `protocol::encode` writes for the envelope with `id` and `body`.
    fn slow(id: &str, body: &str, to: &AgentId) -> Vec<u8> {
        let mut meta = Meta::new(MessageId::new(id).unwrap());
        meta.to = Some(to.clone());
        let env = Envelope {
            meta,
            body: serde_json::Value::String(body.to_owned()),
            extra: Default::default(),
        };
        protocol::encode(&env, Codec::Json).unwrap()
    }

    /// The `i`-th envelope, sent at `sent_us`. Its `meta.id` is unique per sender across runs:
    /// the router dedupes on (sender, meta.id).
    fn make(&self, i: u64, sent_us: u64) -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::with_capacity(PAYLOAD + 16);
        out.extend_from_slice(&self.parts[0]);
        write!(out, "{}-{i}", self.to).unwrap();
        out.extend_from_slice(&self.parts[1]);
        write!(out, "{sent_us:020}:").unwrap();
        let pad = PAYLOAD.saturating_sub(out.len() + self.parts[2].len());
        out.resize(out.len() + pad, b'x');
        out.extend_from_slice(&self.parts[2]);
        out
    }

    /// The template's envelopes are byte for byte the slow encoding's.
    fn check(&self) {
        for i in [0, 7, 12_345] {
            let fast = self.make(i, 42);
            let id = format!("{}-{i}", self.to);
            let body = &fast[self.parts[0].len() + id.len() + self.parts[1].len()
                ..fast.len() - self.parts[2].len()];
            let body = std::str::from_utf8(body).unwrap();
            assert_eq!(fast, Self::slow(&id, body, &self.to), "envelope {i}");
        }
    }
}

fn body_sent_us(env: &Envelope) -> u64 {
    env.body
        .as_str()
        .and_then(|s| s.get(..20))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// (a) The raw two-hop relay, its streams with `replicas` replicas. Returns when `n` messages
/// reached the end of hop two.
async fn raw(
    client: async_nats::Client,
    tag: &str,
    n: u64,
    paced: Option<u64>,
    replicas: usize,
) -> Run {
    let js = jetstream::new(client.clone());
    let (a, b) = (format!("RAWA_{tag}"), format!("RAWB_{tag}"));
    // The same stream shapes as the hub's: hop one is a work queue (like HUB_INGRESS, whose
    // acked messages are removed), hop two keeps messages (like HUB_INBOX).
    let relay_consumer = stream_with_consumer(
        &js,
        &a,
        format!("rawa{tag}.>"),
        stream::RetentionPolicy::WorkQueue,
        "relay",
        replicas,
    )
    .await;
    let sink_consumer = stream_with_consumer(
        &js,
        &b,
        format!("rawb{tag}.>"),
        stream::RetentionPolicy::Limits,
        "sink",
        replicas,
    )
    .await;
    // Hop 1 -> 2: pull from A, republish to B with a message id, ack A after B's store ack.
    let out_subject = format!("rawb{tag}.x");
    let relay = spawn_relay(relay_consumer, js.clone(), n, move |_| out_subject.clone());
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let sink = spawn_sink(sink_consumer, n, latencies.clone());
    let start = Instant::now();
    produce(js.clone(), format!("rawa{tag}.x"), n, paced, |_, t| {
        raw_payload(t)
    })
    .await;
    sink.await.unwrap();
    let elapsed = start.elapsed();
    relay.await.unwrap();
    delete_streams(&js).await;
    summarize(n, elapsed, &latencies)
}

/// Deletes every stream of the server (and so every KV bucket): each arm starts on an empty
/// server, as a fresh deployment does. The hub's streams once outlived its arm, so each hub
/// run stored into streams holding every earlier hub run's DMs (and their message ids in the
/// duplicate window), while each raw run had new, empty streams.
async fn delete_streams(js: &jetstream::Context) {
    use futures::TryStreamExt;
    let names: Vec<String> = js.stream_names().try_collect().await.expect("stream names");
    for name in names {
        js.delete_stream(&name).await.expect("stream deleted");
    }
}

/// How many routers the hub arms run (`BENCH_ROUTERS`, default 1).
fn routers() -> usize {
    std::env::var("BENCH_ROUTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// (b) The same traffic through the router actor and bob's inbox, with the audit trail
/// on (the default) or, for (c), off; every stream with `replicas` replicas.
async fn hub(
    url: &str,
    client: &async_nats::Client,
    n: u64,
    paced: Option<u64>,
    bob: &AgentId,
    (audit, replicas): (bool, usize),
) -> Run {
    // Keep every DM of the run: the default keeps the newest 10,000 per recipient.
    let mut delivery = protocol::DeliveryConfig {
        replicas,
        ..Default::default()
    };
    delivery.inbox.max_msgs_per_subject = -1;
    delivery.audit_events = audit;
    // A system with its router started; BENCH_ROUTERS=N runs N of them sharing the ingress,
    // each with its own connection, as router processes have.
    let router_system = || async {
        let system = ActorSystem::builder()
            .nats(NatsSettings::new(url))
            .durable(true)
            .delivery_config(delivery.clone())
            .build()
            .await
            .unwrap();
        system.start_router().await.unwrap();
        system
    };
    let system = router_system().await;
    let mut more_routers = Vec::new();
    for _ in 1..routers() {
        more_routers.push(router_system().await);
    }
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let got = Arc::new(AtomicU64::new(0));
    // When the last DM was handled, and the longest wait between two (a stall shows here).
    let (last_us, gap_us) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (lat, count, last, gap) = (
        latencies.clone(),
        got.clone(),
        last_us.clone(),
        gap_us.clone(),
    );
    system
        .attach_inbox(bob, move |d| {
            let now = now_us();
            lat.lock()
                .unwrap()
                .push(now.saturating_sub(body_sent_us(&d.envelope)));
            let before = last.swap(now, Ordering::Relaxed);
            if before != 0 {
                gap.fetch_max(now.saturating_sub(before), Ordering::Relaxed);
            }
            count.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {})
        })
        .await
        .unwrap();
    let js = jetstream::new(system.client().clone());
    let envelopes = Envelopes::to(bob);
    envelopes.check();
    let start = Instant::now();
    produce(js, "hub.pub.alice.inbox".into(), n, paced, move |i, t| {
        envelopes.make(i, t)
    })
    .await;
    while got.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    // Which pull went silent, when one did.
    let snapshot = system.snapshot().await.unwrap();
    let router = snapshot.router.map_or(0, |r| r.counters.reconnects);
    let inbox = snapshot
        .inboxes
        .get(bob.as_str())
        .map_or(0, |i| i.counters.repulls);
    system.shutdown(Duration::from_secs(10)).await.unwrap();
    for extra in more_routers {
        extra.shutdown(Duration::from_secs(10)).await.unwrap();
    }
    delete_streams(&jetstream::new(client.clone())).await;
    Run {
        longest_gap_ms: gap_us.load(Ordering::Relaxed) as f64 / 1000.0,
        repulls: (router, inbox),
        ..summarize(n, elapsed, &latencies)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = examples::args::from_env_or_exit(
        "bench_dm",
        &["N", "PACED_SECS", "ROUNDS"],
        "N DMs per throughput run (default 50000), PACED_SECS of latency at 1,000 msgs/s \
         (default 5), ROUNDS of raw, hub and hub without audit alternating (default 3; medians are \
         printed)",
    );
    let n = args[0].unwrap_or(50_000);
    let paced_secs = args[1].unwrap_or(5);
    let rounds = usize::try_from(args[2].unwrap_or(3))?;
    // BENCH_OTLP=1: the runtime's telemetry, exporting spans when OTEL_EXPORTER_OTLP_ENDPOINT
    // is set (see the header).
    let telemetry = match std::env::var("BENCH_OTLP") {
        Ok(v) if v == "1" => Some(runtime::telemetry::init(false, "warn")?),
        _ => None,
    };
    // BENCH_CLUSTER=1: a 3-node cluster on loopback (`sync_interval: always` on every node),
    // every stream of both arms R3.
    let on_cluster = std::env::var("BENCH_CLUSTER").is_ok_and(|v| v == "1");
    let (single, cluster) = if on_cluster {
        (None, Some(harness::Cluster::start(3).await?))
    } else {
        (Some(harness::run_server().await?), None)
    };
    let (url, client, server_pids, replicas) = match (&single, &cluster) {
        (Some(server), _) => (
            server.url(),
            server.client().await?,
            vec![server.pid().unwrap_or(0)],
            1,
        ),
        (_, Some(cluster)) => (
            cluster.urls(),
            cluster.client().await?,
            (0..cluster.size())
                .map(|i| cluster.node(i).pid().unwrap_or(0))
                .collect(),
            3,
        ),
        _ => unreachable!("one of the two is started"),
    };
    let broker = if on_cluster {
        "a 3-node cluster (R3 streams, sync_interval: always)"
    } else {
        "one nats-server (file storage, default sync)"
    };
    println!(
        "{broker} at {url}; {PAYLOAD}-byte payloads; {rounds} rounds, raw, hub and hub without audit alternating, medians; {} router(s)",
        routers()
    );
    if let Some(t) = &telemetry {
        println!("BENCH_OTLP=1: spans exported over OTLP: {}", t.exporting());
    }

    // CPU used per DM by this process and by nats-server, for each arm: on a shared machine
    // it moves far less than throughput does.
    let me = std::process::id();
    let cpu = || {
        (
            cpu_ms(me),
            server_pids.iter().map(|p| cpu_ms(*p)).sum::<u64>(),
        )
    };
    let per_dm = |before: (u64, u64), after: (u64, u64)| {
        let us = |b: u64, a: u64| a.saturating_sub(b) as f64 * 1_000.0 / n as f64;
        (us(before.0, after.0), us(before.1, after.1))
    };
    if let Ok(arm) = std::env::var("BENCH_ARM") {
        for round in 0..rounds {
            let t0 = cpu();
            let id = AgentId::new(format!("solo{round}"))?;
            let run = match arm.as_str() {
                "a" => raw(client.clone(), &format!("S{round}"), n, None, replicas).await,
                "b" => hub(&url, &client, n, None, &id, (true, replicas)).await,
                "c" => hub(&url, &client, n, None, &id, (false, replicas)).await,
                other => anyhow::bail!("BENCH_ARM must be a, b or c, not {other:?}"),
            };
            let (process, broker) = per_dm(t0, cpu());
            println!(
                "  ({arm}) round {round}: {:>8.0} msgs/s, CPU per DM: process {process:.1} us, nats-server {broker:.1} us",
                run.rate
            );
        }
        return Ok(());
    }
    let (mut ra, mut rb, mut rc) = (Vec::new(), Vec::new(), Vec::new());
    let mut cpus: [Vec<(f64, f64)>; 3] = Default::default();
    for round in 0..rounds {
        let t0 = cpu();
        let a = raw(client.clone(), &format!("T{round}"), n, None, replicas).await;
        let t1 = cpu();
        // Each hub run gets its own recipient, so it starts with an empty inbox.
        let bob = AgentId::new(format!("bob{round}"))?;
        let b = hub(&url, &client, n, None, &bob, (true, replicas)).await;
        let t2 = cpu();
        let dave = AgentId::new(format!("dave{round}"))?;
        let c = hub(&url, &client, n, None, &dave, (false, replicas)).await;
        let t3 = cpu();
        println!(
            "  round {round}: raw {:>8.0} msgs/s, hub {:>8.0} msgs/s, hub without audit {:>8.0} msgs/s",
            a.rate, b.rate, c.rate
        );
        // A stall: the longest wait between two handled DMs, when it is over a second.
        for (arm, run) in [("hub", &b), ("hub without audit", &c)] {
            if run.longest_gap_ms > 1_000.0 {
                println!(
                    "    {arm}: stalled, {:.1} s between two DMs (pulls issued again after a silent one: router {}, inbox {})",
                    run.longest_gap_ms / 1000.0,
                    run.repulls.0,
                    run.repulls.1
                );
            }
        }
        ra.push(a.rate);
        rb.push(b.rate);
        rc.push(c.rate);
        cpus[0].push(per_dm(t0, t1));
        cpus[1].push(per_dm(t1, t2));
        cpus[2].push(per_dm(t2, t3));
    }
    // Each round's own ratio: its arms ran within seconds of each other, so a slow phase of a
    // shared machine weighs on both; their median is the steadier figure of the two.
    let paired = |x: &[f64]| median(x.iter().zip(&ra).map(|(x, a)| x / a).collect());
    let (pb, pc) = (paired(&rb), paired(&rc));
    let (a, b, c) = (median(ra), median(rb), median(rc));
    println!("throughput, producer live, {n} msgs:");
    println!("  (a) raw two hops      {a:>9.0} msgs/s");
    println!("  (b) router + inbox    {b:>9.0} msgs/s");
    println!("  (c) (b) without audit {c:>9.0} msgs/s");
    println!("  ratio b/a             {:>9.2}", b / a);
    println!("  ratio c/a             {:>9.2}", c / a);
    println!("  ratio b/a, median of the rounds' own {pb:>5.2}");
    println!("  ratio c/a, median of the rounds' own {pc:>5.2}");
    println!("CPU per DM (medians; this process, which runs both clients, and nats-server):");
    for (name, arm) in ["(a)", "(b)", "(c)"].iter().zip(cpus) {
        let client = median(arm.iter().map(|c| c.0).collect());
        let broker = median(arm.iter().map(|c| c.1).collect());
        println!(
            "  {name} process {client:>6.1} us  nats-server {broker:>6.1} us  total {:>6.1} us",
            client + broker
        );
    }

    let paced = 1_000 * paced_secs;
    let a = raw(client.clone(), "P", paced, Some(1_000), replicas).await;
    let b = hub(
        &url,
        &client,
        paced,
        Some(1_000),
        &AgentId::new("carol")?,
        (true, replicas),
    )
    .await;
    println!("latency at 1,000 msgs/s for {paced_secs} s:");
    println!(
        "  (a) raw two hops      p50 {:>6.2} ms  p99 {:>6.2} ms",
        a.p50_ms, a.p99_ms
    );
    println!(
        "  (b) router + inbox    p50 {:>6.2} ms  p99 {:>6.2} ms",
        b.p50_ms, b.p99_ms
    );
    println!(
        "  p99 ratio b/a         {:>6.2}",
        b.p99_ms / a.p99_ms.max(0.001)
    );
    if let Some(t) = telemetry {
        tokio::task::spawn_blocking(move || t.shutdown()).await?;
    }
    Ok(())
}
