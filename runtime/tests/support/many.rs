//! Many inboxes in one host: attach them all, count what each handler sees, and measure what
//! an idle inbox costs in RSS (the many_inboxes and hosts tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use protocol::AgentId;
use runtime::ActorSystem;

/// How many times inbox `i` was handed DM `n` (its numeric body).
pub type Counts = Arc<Mutex<HashMap<(usize, u64), u32>>>;

/// Attaches the inboxes of `agent(0)` to `agent(n - 1)` on `host`, 64 at a time, each
/// counting the numeric bodies it is handed; asserts every attach succeeded and returns the
/// counts with the RSS each idle inbox added, in kB (measured once RSS settled, before and
/// after).
pub async fn attach_counting(
    host: &ActorSystem,
    n: usize,
    agent: impl Fn(usize) -> AgentId,
) -> (Counts, u64) {
    let empty = harness::rss::settled_rss_kb(Duration::from_secs(2)).await;
    let seen: Counts = Arc::default();
    let attached: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let sink = seen.clone();
            let id = agent(i);
            async move {
                host.attach_inbox(&id, move |d| {
                    let n = d.envelope.body.as_u64().expect("a numeric body");
                    *sink.lock().unwrap().entry((i, n)).or_default() += 1;
                    Box::pin(async {})
                })
                .await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let failed: Vec<_> = attached.iter().filter(|r| r.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} attaches failed: {:?}",
        failed.len(),
        failed.first()
    );
    let per_inbox = harness::rss::settled_rss_kb(Duration::from_secs(2))
        .await
        .saturating_sub(empty)
        / n as u64;
    (seen, per_inbox)
}
