//! What replicated consumers cost a 3-node JetStream cluster (issue 29 §1): `N` durable pull
//! consumers on one R3 stream, each filtered on its own subject as an inbox consumer is, made
//! R1 and then R3 (one raft group each), on a fresh cluster per mode. Prints, per mode, the
//! time to create them, the cluster's idle CPU (the three nats-servers together, over 10 s)
//! and their resident memory, and the R3/R1 ratios.
//!
//! ```sh
//! cargo run --release -p examples --example bench_consumers -- 1000
//! ```

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use harness::Cluster;

/// How long the idle CPU is sampled.
const IDLE: Duration = Duration::from_secs(10);

/// One mode's figures.
struct Figures {
    create: Duration,
    idle_cpu_percent: f64,
    rss_mb: f64,
}

/// CPU time (user + system) of process `pid` so far, in clock ticks (100 a second).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Resident memory of process `pid`, in kB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn measure(n: usize, replicas: usize) -> anyhow::Result<Figures> {
    let cluster = Cluster::start(3).await?;
    let js = jetstream::new(cluster.client().await?);
    let inbox = js
        .create_stream(stream::Config {
            name: "BENCH_INBOX".into(),
            subjects: vec!["bench.inbox.>".into()],
            num_replicas: 3,
            ..Default::default()
        })
        .await?;
    let start = Instant::now();
    for i in 0..n {
        inbox
            .create_consumer(consumer::pull::Config {
                durable_name: Some(format!("inbox-a{i}")),
                filter_subject: format!("bench.inbox.a{i}"),
                ack_policy: consumer::AckPolicy::Explicit,
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
    }
    let create = start.elapsed();
    // Settle, then sample the idle cluster.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pids: Vec<u32> = (0..cluster.size())
        .filter_map(|i| cluster.node(i).pid())
        .collect();
    let before: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    tokio::time::sleep(IDLE).await;
    let after: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let idle_cpu_percent = (after - before) as f64 / IDLE.as_secs_f64();
    let rss_mb = pids.iter().map(|p| rss_kb(*p)).sum::<u64>() as f64 / 1024.0;
    Ok(Figures {
        create,
        idle_cpu_percent,
        rss_mb,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    println!("{n} consumers on an R3 stream, 3-node cluster (sync_interval: always):");
    let r1 = measure(n, 1).await?;
    let r3 = measure(n, 3).await?;
    for (name, f) in [("R1", &r1), ("R3", &r3)] {
        println!(
            "  {name} consumers: created in {:>6.1} s ({:>5.0}/s), idle cluster CPU {:>6.1} % of a core, nats-server RSS {:>7.1} MB",
            f.create.as_secs_f64(),
            n as f64 / f.create.as_secs_f64(),
            f.idle_cpu_percent,
            f.rss_mb
        );
    }
    println!(
        "  R3/R1: create time {:.2}, idle CPU {:.2}, RSS {:.2}",
        r3.create.as_secs_f64() / r1.create.as_secs_f64(),
        r3.idle_cpu_percent / r1.idle_cpu_percent.max(0.1),
        r3.rss_mb / r1.rss_mb
    );
    Ok(())
}
