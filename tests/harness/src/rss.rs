//! This process's resident set (Linux `/proc/self/status`), for tests and benchmarks that bound
//! what a feature costs in memory.

use std::time::Duration;

/// This process's resident set now, kB.
///
/// # Panics
/// When `/proc/self/status` has no `VmRSS` line (not Linux).
pub fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The lowest resident set read every 250 ms over `window`, kB: what the process holds once
/// its allocator has handed back what it frees lazily.
pub async fn settled_rss_kb(window: Duration) -> u64 {
    let mut low = rss_kb();
    let start = tokio::time::Instant::now();
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        low = low.min(rss_kb());
    }
    low
}
