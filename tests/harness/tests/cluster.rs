//! The cluster harness against three real nats-servers: a replicated stream keeps what it
//! acknowledged through the kill -9 of its leader, and a stepped-down leader is replaced.

use std::future::IntoFuture;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use harness::{wait_until_async, Cluster};
use tokio::time::Instant;

/// Long enough for two elections (4–9 s each) and the restarted node's catch-up.
const DEADLINE: Duration = Duration::from_secs(60);

fn replicated(name: &str) -> stream::Config {
    stream::Config {
        name: name.into(),
        subjects: vec![format!("{}.>", name.to_lowercase())],
        num_replicas: 3,
        ..Default::default()
    }
}

/// Publishes `n` messages from `from` on, each retried with its own `Nats-Msg-Id` until the
/// stream acknowledges it (through an election a publish gets a 503 or no answer; a retry of
/// one stored before its ack was lost is acknowledged as a duplicate); panics when one is not
/// acknowledged within [`DEADLINE`]. What the stream holds is for the caller to check.
async fn publish_acked(js: &jetstream::Context, subject: &str, from: usize, n: usize) {
    for i in from..from + n {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("m-{i}").as_str());
            let answer = match js
                .publish_with_headers(subject.to_owned(), headers, i.to_string().into())
                .await
            {
                Ok(ack) => tokio::time::timeout(Duration::from_secs(2), ack.into_future())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|acked| acked.map_err(|e| e.to_string())),
                Err(e) => Err(e.to_string()),
            };
            match answer {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("message {i} not acknowledged within {DEADLINE:?}: {e}"),
            }
        }
    }
}

/// Waits until `stream` holds exactly `n` messages, sequences 1 to `n` (each stored once), and
/// both other replicas are current with its leader.
async fn every_replica_holds(cluster: &Cluster, js: &jetstream::Context, stream: &str, n: u64) {
    wait_until_async(
        &format!("{n} messages on every replica of {stream}"),
        DEADLINE,
        || async {
            let Ok(Ok(mut found)) =
                tokio::time::timeout(Duration::from_secs(5), js.get_stream(stream)).await
            else {
                return false;
            };
            let Ok(info) = found.info().await else {
                return false;
            };
            let replicas = info
                .cluster
                .as_ref()
                .map(|c| c.replicas.clone())
                .unwrap_or_default();
            info.state.messages == n
                && info.state.last_sequence == n
                && replicas.len() == 2
                && replicas
                    .iter()
                    .all(|r| r.current && r.lag.unwrap_or(0) == 0)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r3_stream_keeps_every_acknowledged_message_through_the_kill_of_its_leader() {
    let mut cluster = Cluster::start(3).await.unwrap();
    let client = cluster.client().await.unwrap();
    let js = jetstream::new(client.clone());
    js.create_stream(replicated("KEEP")).await.unwrap();

    publish_acked(&js, "keep.a", 0, 100).await;
    let leader = cluster.stream_leader(&js, "KEEP").await.unwrap();
    cluster.kill(leader).await;
    // Through the election: each publish is retried with its id until acknowledged.
    publish_acked(&js, "keep.a", 100, 100).await;
    // The killed node may have led the meta group too: stream info answers after its election.
    wait_until_async("a live node leading KEEP", DEADLINE, || async {
        matches!(cluster.stream_leader(&js, "KEEP").await, Ok(now) if now != leader)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    cluster.restart(leader).await.unwrap();

    // Every message was acknowledged; the stream holds each exactly once (ids dedupe the
    // retries), and every replica holds all 200, the restarted one included, once caught up.
    every_replica_holds(&cluster, &js, "KEEP", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_leader_that_steps_down_is_replaced_and_the_stream_takes_writes() {
    let cluster = Cluster::start(3).await.unwrap();
    let client = cluster.client().await.unwrap();
    let js = jetstream::new(client.clone());
    js.create_stream(replicated("STEP")).await.unwrap();
    let leader = cluster.stream_leader(&js, "STEP").await.unwrap();
    cluster.step_down(&client, "STEP").await.unwrap();
    wait_until_async("another leader", DEADLINE, || async {
        matches!(cluster.stream_leader(&js, "STEP").await, Ok(now) if now != leader)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    publish_acked(&js, "step.a", 0, 10).await;
    every_replica_holds(&cluster, &js, "STEP", 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lame_duck_stream_leader_hands_over_and_every_publish_meanwhile_is_stored_once() {
    let mut cluster = Cluster::start(3).await.unwrap();
    let client = cluster.client().await.unwrap();
    let js = jetstream::new(client.clone());
    js.create_stream(replicated("DUCK")).await.unwrap();
    js.get_stream("DUCK")
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("reader".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let leader = cluster.stream_leader(&js, "DUCK").await.unwrap();
    // The leader goes into lame-duck mode; 100 messages are published while it hands over.
    let publishing = publish_acked(&js, "duck.a", 0, 100);
    cluster.lame_duck(leader);
    publishing.await;
    wait_until_async(
        "live leaders of DUCK and its consumer",
        DEADLINE,
        || async {
            let stream = cluster.stream_leader(&js, "DUCK").await;
            let consumer = cluster.consumer_leader(&js, "DUCK", "reader").await;
            matches!((stream, consumer), (Ok(s), Ok(c)) if s != leader && c != leader)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    // It would exit by itself after its 30 s; stopped now, and started again on its store.
    cluster.kill(leader).await;
    cluster.restart(leader).await.unwrap();
    every_replica_holds(&cluster, &js, "DUCK", 100).await;
}
