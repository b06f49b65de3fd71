//! Router processes under crashes: `kill -9` mid-flow, two routers sharing the consumer, and a
//! nats-server restart mid-flow. The routers are real `runtime` processes; the recipient is an
//! in-process inbox.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use harness::{NatsServer, ServerOptions};
use protocol::attach::DurableInboxMode;
use protocol::subjects::Channel;
use protocol::{AgentId, ChannelName, Envelope, MessageId, Meta};
use runtime::{ActorSystem, NatsSettings};
use support::processes::Scene;

const DEADLINE: Duration = Duration::from_secs(90);

type Counts = Arc<Mutex<HashMap<u64, u32>>>;

async fn system(url: &str) -> ActorSystem {
    ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .inbox_mode(DurableInboxMode::On)
        .build()
        .await
        .unwrap()
}

async fn attach_counting(system: &ActorSystem, id: &AgentId) -> Counts {
    let counts: Counts = Arc::default();
    let sink = counts.clone();
    system
        .attach_inbox(id, move |d| {
            let n = d.envelope.body.as_u64().expect("numeric body");
            *sink.lock().unwrap().entry(n).or_default() += 1;
            Box::pin(async {})
        })
        .await
        .unwrap();
    counts
}

fn dm(i: u64, to: &AgentId) -> Envelope {
    let mut meta = Meta::new(MessageId::new(format!("dm-{i}")).unwrap());
    meta.to = Some(to.clone());
    Envelope {
        meta,
        body: serde_json::json!(i),
        extra: Default::default(),
    }
}

/// Sends DM `i` until the ingress acks it (same id each time: the ingress dedupes retries).
async fn send_until_accepted(system: &ActorSystem, from: &AgentId, env: &Envelope) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while system
        .send_envelope(from, &Channel::Inbox, env)
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "send never accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_all(counts: &Counts, n: u64) {
    let done = harness::wait_until("every DM handled", DEADLINE, || {
        counts.lock().unwrap().len() as u64 >= n
    })
    .await;
    let counts = counts.lock().unwrap();
    done.unwrap_or_else(|e| panic!("{e}: {} of {n} handled", counts.len()));
    for i in 0..n {
        assert_eq!(counts.get(&i), Some(&1), "DM {i} handled once");
    }
    assert_eq!(counts.len() as u64, n, "nothing else was handled");
}

#[tokio::test]
async fn router_killed_with_sigkill_mid_flow_loses_nothing_and_duplicates_nothing() {
    const N: u64 = 10_000;
    let server = harness::run_server().await.unwrap();
    let scene = Scene::new(0);
    let watcher = server.client().await.unwrap();
    let mut first = scene.router(&server.url());
    support::wait_router_answers(&watcher).await;

    let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
    let system = system(&server.url()).await;
    let counts = attach_counting(&system, &bob).await;

    // Publish all N pipelined, 256 acks in flight (the ingress keeps them), and kill the
    // router while it routes.
    let js = jetstream::new(server.client().await.unwrap());
    let messages = (0..N).map(|i| {
        let payload = protocol::encode(&dm(i, &bob), protocol::Codec::Json).unwrap();
        (async_nats::HeaderMap::new(), payload)
    });
    support::publish_pipelined(&js, "hub.pub.alice.inbox", messages).await;
    harness::wait_until("some DMs handled before the kill", DEADLINE, || {
        counts.lock().unwrap().len() >= 1_000
    })
    .await
    .unwrap();
    first.kill9().await;
    let handled_at_kill = counts.lock().unwrap().len() as u64;
    assert!(handled_at_kill < N, "the kill must land mid-flow");

    let _second = scene.router(&server.url());
    wait_all(&counts, N).await;
    drop(alice);
    system.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn two_routers_store_each_dm_once_and_publish_each_broadcast_once() {
    let server = harness::run_server().await.unwrap();
    let scene = Scene::new(0);
    let client = server.client().await.unwrap();
    let _a = scene.router(&server.url());
    let _b = scene.router(&server.url());
    support::wait_router_answers(&client).await;
    // Both bound the shared consumer: it has two pull requests waiting at some point.
    let js = jetstream::new(client.clone());

    let mut news = client.subscribe("channel.news").await.unwrap();
    client.flush().await.unwrap();
    let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
    let sender = system(&server.url()).await;
    let channel = ChannelName::new("news").unwrap();
    for i in 0..100u64 {
        sender
            .send(&alice, &bob, serde_json::json!(i))
            .await
            .unwrap();
        sender
            .broadcast(&alice, &channel, serde_json::json!(i))
            .await
            .unwrap();
    }
    // Every ingress envelope routed and acked.
    harness::wait_until_async("ingress drained", DEADLINE, || async {
        let mut stream = js.get_stream("HUB_INGRESS").await.unwrap();
        stream.info().await.unwrap().state.messages == 0
    })
    .await
    .unwrap();

    let mut broadcasts = HashMap::<u64, u32>::new();
    while broadcasts.values().sum::<u32>() < 100 {
        let msg = tokio::time::timeout(DEADLINE, news.next())
            .await
            .unwrap()
            .unwrap();
        let env = protocol::decode(&msg.payload, protocol::Codec::Json).unwrap();
        *broadcasts.entry(env.body.as_u64().unwrap()).or_default() += 1;
    }
    // Nothing more arrives after the 100th (a second copy would be right behind).
    client.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), news.next())
            .await
            .is_err(),
        "a broadcast was published twice"
    );
    assert!(broadcasts.values().all(|c| *c == 1) && broadcasts.len() == 100);

    let mut inbox = js.get_stream("HUB_INBOX").await.unwrap();
    let info = inbox.info().await.unwrap();
    assert_eq!(info.state.messages, 100, "each DM stored exactly once");
}

#[tokio::test]
async fn nats_server_restart_mid_flow_loses_nothing_and_the_router_resumes_by_itself() {
    const N: u64 = 600;
    let mut server = NatsServer::run(ServerOptions {
        sync_always: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let scene = Scene::new(0);
    let watcher = server.client().await.unwrap();
    let mut router_process = scene.router(&server.url());
    support::wait_router_answers(&watcher).await;
    let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
    let system = system(&server.url()).await;
    let counts = attach_counting(&system, &bob).await;

    for i in 0..N / 2 {
        send_until_accepted(&system, &alice, &dm(i, &bob)).await;
    }
    server.restart().await.unwrap();
    for i in N / 2..N {
        send_until_accepted(&system, &alice, &dm(i, &bob)).await;
    }
    wait_all(&counts, N).await;
    assert!(
        !router_process.has_exited(),
        "the router process survived the outage"
    );
    system.shutdown(Duration::from_secs(10)).await.unwrap();
}
