//! Many agents in one process (issue 11): 2,000 inboxes attached in one system, one DM to
//! each through a router process killed with SIGKILL mid-way, then one more to each after
//! nats-server was killed and restarted on its store (every pull re-issued at once); every DM
//! handled once by its own inbox, and RSS per inbox under a bound taken from `bench_inboxes`.
//!
//! Alone in its test binary: RSS is the whole process's.

mod support;

use std::time::Duration;

use async_nats::jetstream;
use protocol::attach::DurableInboxMode;
use protocol::{AgentId, Envelope, MessageId, Meta};
use runtime::{ActorSystem, NatsSettings};
use support::processes::Scene;

const AGENTS: usize = 2_000;
const DEADLINE: Duration = Duration::from_secs(120);
/// RSS per idle inbox this test allows, kB. `bench_inboxes` measures 3.1 kB of heap and 4.6 kB
/// of RSS per inbox at 10,000 since an inbox is a task child with what it shares in
/// `InboxShared` (release build, mimalloc; docs/CAPACITY.md). This test, a debug build on the
/// system allocator, measured 6 kB three times (28 kB with an actor per inbox, 44 kB before the
/// shared pulls). The bound fails if an inbox grows by half, and leaves 8 MB of the 2,000
/// inboxes' RSS to the allocator's whims.
const RSS_PER_INBOX_KB: u64 = 10;

/// Which agent saw which DM, and how often.
type Seen = support::many::Counts;

fn agent(i: usize) -> AgentId {
    AgentId::new(format!("many{i}")).unwrap()
}

/// DM `n` to agent `i`: its body is `n`.
fn dm(n: u64, i: usize) -> Vec<u8> {
    let mut meta = Meta::new(MessageId::new(format!("dm-{n}")).unwrap());
    meta.to = Some(agent(i));
    let envelope = Envelope {
        meta,
        body: serde_json::json!(n),
        extra: Default::default(),
    };
    protocol::encode(&envelope, protocol::Codec::Json).unwrap()
}

/// Publishes DMs `range` from alice's ingress (DM `n` to agent `n % AGENTS`), pipelined, and
/// waits for every store ack.
async fn publish(js: &jetstream::Context, range: std::ops::Range<usize>) {
    let messages = range.map(|n| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            protocol::headers::NATS_MSG_ID,
            format!("alice:dm-{n}").as_str(),
        );
        (headers, dm(n as u64, n % AGENTS))
    });
    support::publish_pipelined(js, "hub.pub.alice.inbox", messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_inboxes_in_one_process_each_handle_their_dms_once_across_a_router_sigkill_and_a_broker_restart(
) {
    let mut server = harness::NatsServer::run(harness::ServerOptions {
        sync_always: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let scene = Scene::new(0);
    let watcher = server.client().await.unwrap();
    let mut first = scene.router(&server.url());
    support::wait_router_answers(&watcher).await;

    let host = ActorSystem::builder()
        .nats(NatsSettings::new(server.url()))
        .durable(true)
        .inbox_mode(DurableInboxMode::On)
        .build()
        .await
        .unwrap();
    let (seen, per_inbox) = support::many::attach_counting(&host, AGENTS, agent).await;
    println!("RSS per idle inbox: {per_inbox} kB (bound {RSS_PER_INBOX_KB} kB)");
    assert!(
        per_inbox <= RSS_PER_INBOX_KB,
        "an idle inbox costs {per_inbox} kB of RSS, above the bound of {RSS_PER_INBOX_KB} kB"
    );

    // The first half through the first router; it is killed once some are handled, and the
    // second half waits in the ingress until the next router runs.
    let js = jetstream::new(server.client().await.unwrap());
    publish(&js, 0..AGENTS / 2).await;
    harness::wait_until("some DMs handled before the kill", DEADLINE, || {
        seen.lock().unwrap().len() >= 100
    })
    .await
    .unwrap();
    first.kill9().await;
    // Stored after the kill: only the next router can route these.
    publish(&js, AGENTS / 2..AGENTS).await;

    let _second = scene.router(&server.url());
    wait_all(&js, &seen, 0..AGENTS).await;

    // nats-server killed and restarted on its store: 2,000 pulls to re-issue at once.
    let restarted = tokio::time::Instant::now();
    server.restart().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    publish(&js, AGENTS..2 * AGENTS).await;
    wait_all(&js, &seen, 0..2 * AGENTS).await;
    println!(
        "after the broker restart: {AGENTS} more DMs handled within {:.1} s",
        restarted.elapsed().as_secs_f64()
    );
    host.shutdown(Duration::from_secs(30)).await.unwrap();
}

/// Waits until the DMs `range` are handled and every inbox consumer has nothing pending and
/// nothing unacked (so no copy can come later), then checks that each was handled once, by its
/// own agent, and that nothing else was.
async fn wait_all(js: &jetstream::Context, seen: &Seen, range: std::ops::Range<usize>) {
    let n = range.len();
    let done = harness::wait_until("every DM handled", DEADLINE, || {
        seen.lock().unwrap().len() >= n
    })
    .await;
    done.unwrap_or_else(|e| panic!("{e}: {} of {n} handled", seen.lock().unwrap().len()));
    for i in 0..AGENTS {
        support::wait_settled(js, &format!("inbox-{}", agent(i))).await;
    }
    let seen = seen.lock().unwrap().clone();
    for n in range.clone() {
        let i = n % AGENTS;
        assert_eq!(
            seen.get(&(i, n as u64)),
            Some(&1),
            "{} handled DM {n} once",
            agent(i)
        );
    }
    assert_eq!(seen.len(), range.len(), "no inbox saw another's DM");
}
