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
}

/// Rate and latency percentiles of `n` items in `elapsed`.
pub fn summarize(n: u64, elapsed: Duration, latencies: &Mutex<Vec<u64>>) -> Run {
    let mut l = latencies.lock().unwrap().clone();
    l.sort_unstable();
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&l, 0.50),
        p99_ms: percentile(&l, 0.99),
    }
}

/// The median of `v` (not empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
