//! Node failures on a 3-node cluster under a steady load of DMs and tasks, through real
//! router and worker processes (issue 29 §4). After each fault the hub routes again without a
//! restart of any router or worker; once the load stops and the system drains, every
//! acknowledged DM was handed over once and every acknowledged task has one completed result,
//! any run of its handler after the first flagged as a re-run ([`support::cluster_load`]).
//! Each test prints the time from each fault until every recipient and the delegator got
//! something sent after it.
//!
//! The tests of this binary run one at a time ([`one_at_a_time`]): two clusters, four
//! processes each and their load at once are more than this 2-core machine runs on time.

mod support;

use std::time::{Duration, Instant};

use async_nats::jetstream;
use support::cluster_load::Load;

/// How long a killed node stays down.
const DOWN: Duration = Duration::from_secs(1);
/// How long a paused node stays frozen.
const PAUSED: Duration = Duration::from_secs(15);

/// Holds the other tests of this binary off while one runs (a tokio lock: it is held across
/// the test's awaits, and a failed test does not poison it).
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// `kill -9` of `node`, its restart after [`DOWN`], and the time from `fault` until the hub
/// routed again; returns once every stream's replicas are current again.
async fn kill_and_restart(
    load: &mut Load,
    node: usize,
    fault: Instant,
) -> support::cluster_load::Recovery {
    load.cluster.kill(node).await;
    tokio::time::sleep(DOWN).await;
    load.cluster.restart(node).await.unwrap();
    let recovery = load.recovered(fault).await;
    load.wait_current().await;
    recovery
}

/// Every stream the hub makes.
fn streams() -> Vec<String> {
    actors::streams::stream_configs(&protocol::config::DeliveryConfig::default())
        .into_iter()
        .map(|c| c.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_of_the_ingress_inbox_and_work_leaders_under_load_lose_nothing_and_settle_every_task_once(
) {
    let _turn = one_at_a_time().await;
    let mut load = Load::start().await;
    let js = jetstream::new(load.cluster.client().await.unwrap());
    for (what, stream, consumer) in [
        ("the ingress's leader", "HUB_INGRESS", None),
        (
            "bob's inbox consumer's leader",
            "HUB_INBOX",
            Some("inbox-bob"),
        ),
        ("the work stream's leader", "HUB_WORK", None),
    ] {
        let leader = match consumer {
            None => load.cluster.stream_leader(&js, stream).await,
            Some(consumer) => load.cluster.consumer_leader(&js, stream, consumer).await,
        }
        .unwrap_or_else(|e| panic!("{e}\n{}", load.logs()));
        let recovery = kill_and_restart(&mut load, leader, Instant::now()).await;
        eprintln!("kill -9 of {what} (node {leader}): {recovery:?}");
    }
    load.stop_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing_and_settles_every_task_once() {
    let _turn = one_at_a_time().await;
    let mut load = Load::start().await;
    for node in 0..load.cluster.size() {
        let recovery = kill_and_restart(&mut load, node, Instant::now()).await;
        eprintln!("restart of node {node} (kill -9): {recovery:?}");
    }
    load.stop_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_in_lame_duck_mode_under_load_loses_nothing_and_settles_every_task_once()
{
    let _turn = one_at_a_time().await;
    let mut load = Load::start().await;
    let js = jetstream::new(load.cluster.client().await.unwrap());
    for node in 0..load.cluster.size() {
        let fault = Instant::now();
        load.cluster.lame_duck(node);
        // Its leaders step down first; it is stopped once it leads no stream.
        let names = streams();
        let moved =
            harness::wait_until_async("the node's leaders moved", support::DEADLINE, || {
                let (cluster, js, names) = (&load.cluster, &js, &names);
                async move {
                    for name in names {
                        match cluster.stream_leader(js, name).await {
                            Ok(leader) if leader != node => {}
                            _ => return false,
                        }
                    }
                    true
                }
            })
            .await;
        if let Err(e) = moved {
            panic!("{e}\n{}", load.logs());
        }
        let recovery = kill_and_restart(&mut load, node, fault).await;
        eprintln!("restart of node {node} (lame duck): {recovery:?}");
    }
    load.stop_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_for_15_s_under_load_loses_nothing_and_settles_every_task_once() {
    let _turn = one_at_a_time().await;
    let load = Load::start().await;
    let js = jetstream::new(load.cluster.client().await.unwrap());
    // The ingress's leader: every DM and task goes through it.
    let node = load
        .cluster
        .stream_leader(&js, "HUB_INGRESS")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", load.logs()));
    let fault = Instant::now();
    load.cluster.pause(node);
    tokio::time::sleep(PAUSED).await;
    load.cluster.resume(node);
    let recovery = load.recovered(fault).await;
    eprintln!("pause of node {node} for {PAUSED:?}: {recovery:?}");
    load.wait_current().await;
    load.stop_and_check().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_leader_stepping_down_under_load_loses_nothing_and_settles_every_task_once() {
    let _turn = one_at_a_time().await;
    let load = Load::start().await;
    let client = load.cluster.client().await.unwrap();
    let fault = Instant::now();
    for name in streams() {
        load.cluster
            .step_down(&client, &name)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", load.logs()));
    }
    let recovery = load.recovered(fault).await;
    eprintln!("step-down of every stream leader: {recovery:?}");
    // The load goes on a while on the new leaders.
    tokio::time::sleep(Duration::from_secs(5)).await;
    load.wait_current().await;
    load.stop_and_check().await;
}
