//! Router failover (issue 29 §6): two router processes share the ingress; while DMs flow at a
//! steady rate, one is killed with SIGKILL, and this program measures how long DMs wait
//! until the survivor routes them.
//!
//! ```sh
//! cargo build --release -p runtime --bin runtime && cargo build --release -p examples --example router_failover
//! NATS_SERVER_BIN=$PWD/.tools/bin/nats-server ./target/release/examples/router_failover [ROUNDS] [RATE]
//! ```
//!
//! One local nats-server (file storage, default sync); two `runtime start --role router
//! --durable` processes (the `runtime` binary next to this one); an in-process system that
//! sends DMs from alice at RATE per second (default 500), each send spawned on a steady clock,
//! to a recipient of the round's own (`bob<round>`), whose inbox it holds; inboxes keep every
//! DM (`max_msgs_per_subject: -1`; the default keeps 10,000 unread). Each of ROUNDS rounds (default 5) lets DMs flow for 3 s, kills
//! router `round % 2` with SIGKILL, sends for 5 s more, waits until every acknowledged DM came
//! through, and starts the killed router again. Per round it prints:
//!
//! - **routing again**: the longest a DM sent after the kill waited for its delivery (what a
//!   sender sees as the failover), and the median DM latency before the kill for scale;
//! - **held**: DMs the killed router had taken and not finished (sent before the kill,
//!   delivered more than a second after it), and when the last of them came: the router
//!   consumer's ack wait (30 s by default) has to pass before they are handed to the survivor.
//!
//! Last, the medians over the rounds. Nothing acknowledged may be lost: a round whose DMs do
//! not all arrive within the ack wait and 15 s fails the program.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::RuntimeProcess;
use protocol::AgentId;
use runtime::{ActorSystem, NatsSettings};
use tokio::task::JoinSet;

/// DMs flow this long before the kill.
const BEFORE: Duration = Duration::from_secs(3);
/// DMs flow this long after it.
const AFTER: Duration = Duration::from_secs(5);
/// How long the held DMs may take beyond the ack wait.
const SLACK: Duration = Duration::from_secs(15);

/// Per DM of a round: when its send began, whether it was acknowledged, when it came.
#[derive(Default)]
struct Round {
    sent: BTreeMap<u64, (Instant, bool)>,
    delivered: BTreeMap<u64, Instant>,
}

/// What one round measured.
struct Measured {
    /// The longest wait of a DM sent after the kill, ms.
    routing_again_ms: f64,
    /// The median latency before the kill, ms.
    before_p50_ms: f64,
    /// DMs the killed router held.
    held: usize,
    /// When the last held DM came, s after the kill.
    held_last_s: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = examples::args::from_env_or_exit(
        "router_failover",
        &["ROUNDS", "RATE"],
        "ROUNDS kills of one of two routers (default 5), DMs at RATE per second (default 500)",
    );
    let rounds = args[0].unwrap_or(5);
    let rate = args[1].unwrap_or(500);
    let server = harness::run_server().await?;
    let url = server.url();
    // Every DM of a round is kept: the default keeps the newest 10,000 unread per recipient.
    let config = tempfile::NamedTempFile::new()?;
    let delivery_json = r#"{"inbox": {"max_msgs_per_subject": -1}}"#;
    std::fs::write(config.path(), delivery_json)?;
    let config_path = config.path().display().to_string();
    let spawn_router = || RuntimeProcess::router(&url, Some(&config_path));
    let mut routers = [spawn_router()?, spawn_router()?];
    let client = server.client().await?;
    harness::wait_until_async(
        "a router answers status",
        Duration::from_secs(60),
        || async {
            runtime::request_status(&client, Duration::from_millis(500))
                .await
                .is_ok()
        },
    )
    .await?;
    let hub = Arc::new(
        ActorSystem::builder()
            .nats(NatsSettings::new(url.clone()))
            .durable(true)
            .delivery_config(protocol::DeliveryConfig::from_json_str(delivery_json)?)
            .build()
            .await?,
    );
    let round = Arc::new(Mutex::new(Round::default()));
    println!(
        "nats-server {url}; 2 routers; DMs at {rate}/s; {rounds} rounds: 3 s of DMs, kill -9 of \
         one router, 5 s more"
    );
    let mut measured = Vec::new();
    let mut next = 0u64;
    for r in 0..rounds {
        *round.lock().unwrap() = Round::default();
        let bob = AgentId::new(format!("bob{r}"))?;
        {
            let round = round.clone();
            hub.attach_inbox(&bob, move |d: runtime::Delivery| {
                if let Some(n) = d.envelope.body.as_u64() {
                    round
                        .lock()
                        .unwrap()
                        .delivered
                        .entry(n)
                        .or_insert_with(Instant::now);
                }
                async {}
            })
            .await?;
        }
        let victim = usize::try_from(r % 2)?;
        let began = Instant::now();
        let mut clock = tokio::time::interval(Duration::from_secs(1) / u32::try_from(rate)?);
        let mut sends = JoinSet::new();
        let mut killed = None;
        while began.elapsed() < BEFORE + AFTER {
            clock.tick().await;
            if killed.is_none() && began.elapsed() >= BEFORE {
                routers[victim].kill9().await;
                killed = Some(Instant::now());
            }
            let (hub, round, n) = (hub.clone(), round.clone(), next);
            next += 1;
            round
                .lock()
                .unwrap()
                .sent
                .insert(n, (Instant::now(), false));
            let (alice, bob) = (AgentId::new("alice")?, bob.clone());
            sends.spawn(async move {
                let ok = hub.send(&alice, &bob, serde_json::json!(n)).await.is_ok();
                round.lock().unwrap().sent.get_mut(&n).unwrap().1 = ok;
            });
            while sends.try_join_next().is_some() {}
        }
        while sends.join_next().await.is_some() {}
        let kill = killed.expect("the kill happened");
        let all_in = || {
            let round = round.lock().unwrap();
            round
                .sent
                .iter()
                .filter(|(_, (_, ok))| *ok)
                .all(|(n, _)| round.delivered.contains_key(n))
        };
        let deadline = Duration::from_secs(30) + SLACK;
        if let Err(e) =
            harness::wait_until("every acknowledged DM delivered", deadline, all_in).await
        {
            let missing: Vec<String> = {
                let round = round.lock().unwrap();
                round
                    .sent
                    .iter()
                    .filter(|(n, (_, ok))| *ok && !round.delivered.contains_key(n))
                    .map(|(n, (at, _))| {
                        let since = if *at >= kill {
                            format!("+{:.3}", (*at - kill).as_secs_f64())
                        } else {
                            format!("-{:.3}", (kill - *at).as_secs_f64())
                        };
                        format!("{n} (sent {since} s from the kill)")
                    })
                    .collect()
            };
            anyhow::bail!(
                "round {r}: {e}: {} acknowledged DMs did not come: {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            );
        }
        let m = measure(&round.lock().unwrap(), kill);
        println!(
            "round {r}: killed router {victim}; routing again: longest wait of a DM sent after the \
             kill {:.1} ms (median before it {:.1} ms); held by the killed router: {} DMs, the \
             last delivered {:.1} s after the kill",
            m.routing_again_ms, m.before_p50_ms, m.held, m.held_last_s
        );
        measured.push(m);
        routers[victim] = spawn_router()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let median = |f: fn(&Measured) -> f64| {
        let mut v: Vec<f64> = measured.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "medians over {rounds} rounds: routing again {:.1} ms, latency before the kill {:.1} ms, \
         held {:.0} DMs, the last of them {:.1} s after the kill",
        median(|m| m.routing_again_ms),
        median(|m| m.before_p50_ms),
        median(|m| m.held as f64),
        median(|m| m.held_last_s),
    );
    if let Ok(hub) = Arc::try_unwrap(hub) {
        hub.shutdown(Duration::from_secs(10)).await?;
    }
    Ok(())
}

fn measure(round: &Round, kill: Instant) -> Measured {
    let waits = |after: bool| -> Vec<(Instant, Duration)> {
        round
            .sent
            .iter()
            .filter(|(_, (at, ok))| *ok && (*at >= kill) == after)
            .filter_map(|(n, (at, _))| round.delivered.get(n).map(|d| (*at, *d - *at)))
            .collect()
    };
    let after = waits(true);
    let mut before: Vec<Duration> = waits(false).into_iter().map(|(_, w)| w).collect();
    before.sort();
    let held: Vec<Instant> = round
        .sent
        .iter()
        .filter(|(_, (at, ok))| *ok && *at < kill)
        .filter_map(|(n, _)| round.delivered.get(n))
        .filter(|d| **d > kill + Duration::from_secs(1))
        .copied()
        .collect();
    Measured {
        routing_again_ms: after
            .iter()
            .map(|(_, w)| w.as_secs_f64() * 1e3)
            .fold(0.0, f64::max),
        before_p50_ms: before
            .get(before.len() / 2)
            .map_or(0.0, |w| w.as_secs_f64() * 1e3),
        held: held.len(),
        held_last_s: held
            .iter()
            .map(|d| (*d - kill).as_secs_f64())
            .fold(0.0, f64::max),
    }
}
