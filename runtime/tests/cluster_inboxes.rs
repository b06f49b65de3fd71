//! Inbox consumers on a 3-node JetStream cluster (issue 29 §1): each takes
//! `inbox.consumer_replicas` (the stream's unless fewer are configured) and the shared router
//! consumer its stream's; an R3 inbox keeps delivering through the kill of its consumer's
//! leader, and an R1 inbox waits while its node is down and hands over every DM once when the
//! node returns.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use harness::{wait_until, Cluster};
use protocol::config::DeliveryConfig;
use runtime::{ActorSystem, NatsSettings};
use serde_json::json;
use support::{agent, attach_collect, bodies, Seen, GRACE};

/// Long enough for two elections and a node's restart on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// The tests' delivery config on the cluster: every stream R3.
fn delivery(consumer_replicas: Option<usize>) -> DeliveryConfig {
    let mut delivery = support::delivery();
    delivery.replicas = 3;
    delivery.inbox.consumer_replicas = consumer_replicas;
    delivery
}

/// A durable system on every node's URL, its router started.
async fn hub(cluster: &Cluster, delivery: DeliveryConfig) -> ActorSystem {
    let hub = ActorSystem::builder()
        .nats(NatsSettings::new(cluster.urls()))
        .durable(true)
        .delivery_config(delivery)
        .build()
        .await
        .unwrap();
    hub.start_router().await.unwrap();
    hub
}

/// Waits until `n` peers hold the consumer (its leader and its replicas: a consumer scaled up
/// gains its replicas one election at a time); the count last read on failure.
async fn wait_peers(
    cluster: &Cluster,
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
    n: usize,
) -> jetstream::consumer::Info {
    let last = std::sync::Mutex::new(None);
    harness::wait_until_async(
        &format!("{n} peers holding {consumer}"),
        DEADLINE,
        || async {
            let Some(info) = harness::consumer_info(js, stream, consumer).await else {
                return false;
            };
            let cluster_info = info.cluster.clone().unwrap_or_default();
            let leaders = usize::from(cluster_info.leader.is_some());
            let peers = leaders + cluster_info.replicas.len();
            let held = leaders == 1 && peers == n;
            *last.lock().unwrap() = Some((peers, info));
            held
        },
    )
    .await
    .unwrap_or_else(|e| {
        let last = last.lock().unwrap();
        panic!("{e}: (peers, info) {last:?}\n{}", cluster.logs())
    });
    last.into_inner().unwrap().expect("read").1
}

/// Waits until `seen` holds `n` deliveries; the cluster's logs on failure.
async fn wait_seen(cluster: &Cluster, seen: &Seen, n: usize) {
    wait_until(&format!("{n} deliveries"), DEADLINE, || {
        seen.lock().unwrap().len() >= n
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: got {} {:?}\n{}",
            seen.lock().unwrap().len(),
            bodies(seen),
            cluster.logs()
        )
    });
}

/// Every body `0..n` handed over exactly once (the handler sees what the client's dedupe
/// lets through).
fn assert_each_once(seen: &Seen, n: u64) {
    let bodies = bodies(seen);
    let distinct: BTreeSet<u64> = bodies
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert_eq!(
        bodies.len(),
        distinct.len(),
        "handed over twice: {bodies:?}"
    );
    assert_eq!(distinct, (0..n).collect(), "every DM handed over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_consumers_take_their_configured_replicas_and_the_router_s_its_stream_s() {
    let cluster = Cluster::start(3).await.unwrap();
    let js = jetstream::new(cluster.client().await.unwrap());
    let few = hub(&cluster, delivery(Some(1))).await;
    let bob = agent("bob");
    let seen = attach_collect(&few, &bob).await;
    few.send(&agent("alice"), &bob, json!(0)).await.unwrap();
    wait_seen(&cluster, &seen, 1).await;
    let inbox = wait_peers(&cluster, &js, "HUB_INBOX", "inbox-bob", 1).await;
    assert_eq!(
        inbox.config.num_replicas, 1,
        "an R1 consumer, not one still electing"
    );
    wait_peers(&cluster, &js, "HUB_INGRESS", "router", 3).await;
    few.shutdown(GRACE).await.unwrap();

    // Configured like the stream again: the next attach scales the consumer up in place, its
    // place kept (the DM it acknowledged is not handed over again).
    let like_stream = hub(&cluster, delivery(None)).await;
    let seen = attach_collect(&like_stream, &bob).await;
    wait_peers(&cluster, &js, "HUB_INBOX", "inbox-bob", 3).await;
    like_stream
        .send(&agent("alice"), &bob, json!(1))
        .await
        .unwrap();
    wait_seen(&cluster, &seen, 1).await;
    assert_eq!(bodies(&seen), vec![json!(1)]);
    like_stream.shutdown(GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r3_inbox_hands_over_every_dm_once_through_the_kill_of_its_consumer_leader() {
    const DMS: u64 = 200;
    let mut cluster = Cluster::start(3).await.unwrap();
    let js = jetstream::new(cluster.client().await.unwrap());
    let hub = std::sync::Arc::new(hub(&cluster, delivery(None)).await);
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&hub, &bob).await;
    let sender = {
        let hub = hub.clone();
        tokio::spawn(async move {
            for i in 0..DMS {
                hub.send(&alice, &bob, json!(i)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    wait_seen(&cluster, &seen, 20).await;
    let leader = cluster
        .consumer_leader(&js, "HUB_INBOX", "inbox-bob")
        .await
        .unwrap();
    let at_kill = seen.lock().unwrap().len();
    let killed = Instant::now();
    cluster.kill(leader).await;
    wait_seen(&cluster, &seen, at_kill + 1).await;
    eprintln!(
        "inbox handing over again {:.1} s after its consumer leader's kill",
        killed.elapsed().as_secs_f64()
    );
    sender.await.unwrap();
    cluster.restart(leader).await.unwrap();
    wait_seen(&cluster, &seen, usize::try_from(DMS).unwrap()).await;
    assert_each_once(&seen, DMS);
    let hub = std::sync::Arc::into_inner(hub).expect("the sender is done");
    hub.shutdown(GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r1_inbox_whose_node_is_killed_hands_over_every_dm_once_when_the_node_returns() {
    const DMS: u64 = 20;
    let mut cluster = Cluster::start(3).await.unwrap();
    let js = jetstream::new(cluster.client().await.unwrap());
    let hub = hub(&cluster, delivery(Some(1))).await;
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&hub, &bob).await;
    hub.send(&alice, &bob, json!(0)).await.unwrap();
    wait_seen(&cluster, &seen, 1).await;
    let inbox = wait_peers(&cluster, &js, "HUB_INBOX", "inbox-bob", 1).await;
    assert_eq!(inbox.config.num_replicas, 1);
    // DM 0's ack has reached the consumer.
    harness::wait_until_async("DM 0 acknowledged", DEADLINE, || async {
        harness::consumer_info(&js, "HUB_INBOX", "inbox-bob")
            .await
            .is_some_and(|i| i.num_ack_pending == 0 && i.ack_floor.stream_sequence >= 1)
    })
    .await
    .unwrap();
    let node = cluster
        .consumer_leader(&js, "HUB_INBOX", "inbox-bob")
        .await
        .unwrap();
    cluster.kill(node).await;
    // The streams keep their quorum: every DM is acknowledged while the consumer is away,
    // and none reaches bob until its node returns.
    for i in 1..DMS {
        hub.send(&alice, &bob, json!(i))
            .await
            .unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs()));
    }
    assert_eq!(
        bodies(&seen),
        vec![json!(0)],
        "nothing without its consumer"
    );
    cluster.restart(node).await.unwrap();
    wait_seen(&cluster, &seen, usize::try_from(DMS).unwrap()).await;
    assert_each_once(&seen, DMS);
    // Where it was, or just before: an R1 consumer's acks are written to its node's disk
    // lazily, so DM 0, acknowledged before the kill -9, may be delivered again (seen every
    // time here); the inbox's dedupe keeps it from the handler. Nothing older comes back.
    let counters = hub
        .inbox_snapshot(&bob)
        .await
        .expect("bob's inbox")
        .counters;
    assert!(counters.duplicates <= 1, "{counters:?}");
    hub.shutdown(GRACE).await.unwrap();
}
