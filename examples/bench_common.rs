//! What the benchmark programs share: timestamps in payloads, percentiles, medians.
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Payload size of the raw messages.
pub const PAYLOAD: usize = 256;

/// Microseconds since the epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A [`PAYLOAD`]-byte raw payload starting with the send time in microseconds.
pub fn raw_payload(sent_us: u64) -> Vec<u8> {
    let mut p = format!("{sent_us:020}").into_bytes();
    p.resize(PAYLOAD, b'x');
    p
}

/// The send time at the start of a [`raw_payload`].
pub fn raw_sent_us(payload: &[u8]) -> u64 {
    payload
        .get(..20)
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The `p` percentile of sorted microsecond latencies, in milliseconds.
pub fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

/// One measured run.
pub struct Run {
    /// Messages (or tasks) per second.
    pub rate: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// The longest wait between two items handled, ms, where a run measures it (a stall
    /// shows here); 0 otherwise.
    pub longest_gap_ms: f64,
    /// Pulls issued again by (router, inbox) after a silent one, where a run counts them.
    pub repulls: (u64, u64),
}

/// Rate and latency percentiles of `n` items in `elapsed`.
pub fn summarize(n: u64, elapsed: Duration, latencies: &Mutex<Vec<u64>>) -> Run {
    let mut l = latencies.lock().unwrap().clone();
    l.sort_unstable();
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&l, 0.50),
        p99_ms: percentile(&l, 0.99),
        longest_gap_ms: 0.0,
        repulls: (0, 0),
    }
}

/// CPU time (user and system) the process `pid` has used so far, in ms (Linux `/proc`; 0
/// elsewhere). CPU per message is steadier than throughput on a shared machine.
#[allow(dead_code)]
pub fn cpu_ms(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum());
    // Linux reports them in clock ticks of 10 ms (USER_HZ = 100).
    ticks * 10
}

/// The median of `v` (not empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------------
// The raw side's building blocks: plain async-nats, the same in both benchmarks.
// ---------------------------------------------------------------------------------------------

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Instant;

/// Publish acks in flight at once on the producer side.
pub const WINDOW: usize = 256;

/// A durable pull consumer with explicit acks.
pub fn pull_config(name: &str) -> pull::Config {
    pull::Config {
        durable_name: Some(name.into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        max_ack_pending: 10_000,
        ..Default::default()
    }
}

/// Creates the stream `name` on `subject` with `retention`, a 2-minute duplicate window and
/// `replicas` replicas, and a durable pull consumer `consumer` on it (replicated as its stream).
pub async fn stream_with_consumer(
    js: &jetstream::Context,
    name: &str,
    subject: String,
    retention: stream::RetentionPolicy,
    consumer: &str,
    replicas: usize,
) -> jetstream::consumer::PullConsumer {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![subject],
        retention,
        duplicate_window: Duration::from_secs(120),
        num_replicas: replicas,
        ..Default::default()
    })
    .await
    .expect("stream")
    .create_consumer(pull_config(consumer))
    .await
    .expect("consumer")
}

/// Publishes `n` payloads `make(i, now_us)` to `subject`, paced at `rate` per second when
/// given, with up to [`WINDOW`] publish acks in flight; returns once all are acked.
pub async fn produce(
    js: jetstream::Context,
    subject: String,
    n: u64,
    rate: Option<u64>,
    make: impl Fn(u64, u64) -> Vec<u8>,
) {
    let mut acks = FuturesOrdered::new();
    let start = Instant::now();
    for i in 0..n {
        if let Some(rate) = rate {
            let due = start + Duration::from_micros(i * 1_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let ack = js
            .publish(subject.clone(), make(i, now_us()).into())
            .await
            .expect("publish");
        acks.push_back(ack.into_future());
        if acks.len() >= WINDOW {
            acks.next().await.unwrap().expect("publish ack");
        }
    }
    while let Some(ack) = acks.next().await {
        ack.expect("publish ack");
    }
}

/// The raw router: pulls `consumer` (batches of 500) and republishes each message to
/// `route(subject)` with a `Nats-Msg-Id` (its stream sequence), pipelined (up to 1,000 in
/// flight), acking the input after the store ack; ends after `total` messages.
pub fn spawn_relay(
    consumer: jetstream::consumer::PullConsumer,
    js: jetstream::Context,
    total: u64,
    route: impl Fn(&str) -> String + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(500)
            .messages()
            .await
            .unwrap();
        let mut pending = FuturesOrdered::new();
        let mut moved = 0u64;
        while moved < total {
            tokio::select! {
                biased;
                Some((msg, ack)) = pending.next(), if !pending.is_empty() => {
                    let ack: Result<(), _> = ack;
                    ack.expect("store ack of the relayed copy");
                    let msg: jetstream::Message = msg;
                    msg.ack().await.unwrap();
                    moved += 1;
                }
                Some(Ok(msg)) = messages.next(), if pending.len() < 1000 => {
                    let id = msg.info().map(|i| i.stream_sequence).unwrap_or(0).to_string();
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", id.as_str());
                    let ack = js
                        .publish_with_headers(route(msg.subject.as_str()), h, msg.payload.clone())
                        .await
                        .unwrap()
                        .into_future();
                    pending.push_back(async move { (msg, ack.await.map(|_| ())) });
                }
            }
        }
    })
}

/// The raw receiving end: pulls `consumer` (batches of 500), records each message's latency
/// (from the send time in its [`raw_payload`]) in `latencies` and acks it; ends after `n`.
pub fn spawn_sink(
    consumer: jetstream::consumer::PullConsumer,
    n: u64,
    latencies: Arc<Mutex<Vec<u64>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(500)
            .messages()
            .await
            .unwrap();
        for _ in 0..n {
            let msg = messages.next().await.unwrap().unwrap();
            latencies
                .lock()
                .unwrap()
                .push(now_us().saturating_sub(raw_sent_us(&msg.payload)));
            msg.ack().await.unwrap();
        }
    })
}
