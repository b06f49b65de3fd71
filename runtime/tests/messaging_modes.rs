//! Inbox binding modes: core hubs, durable hubs whose router is down, and the fallbacks between
//! them, against a real nats-server.

mod support;

use std::time::{Duration, Instant};

use actors::inbox::Binding;
use futures::StreamExt;
use protocol::attach::{AttachResponse, DurableInboxMode};
use protocol::subjects;
use runtime::ActorSystem;
use serde_json::json;
use support::*;

/// How long to wait for one probe before sending another.
const PROBE_WAIT: Duration = Duration::from_millis(200);

/// Core mode is fire and forget: a DM sent before the router's and the inbox's subscriptions
/// reach the server is lost. Sends probes until one arrives, so that both are in place.
async fn until_core_path_is_up(system: &ActorSystem, seen: &Seen) {
    let (alice, bob) = (agent("alice"), agent("bob"));
    let deadline = Instant::now() + DEADLINE;
    loop {
        system.send(&alice, &bob, json!("probe")).await.unwrap();
        if harness::wait_until("a probe", PROBE_WAIT, || !seen.lock().unwrap().is_empty())
            .await
            .is_ok()
        {
            return;
        }
        assert!(Instant::now() < deadline, "no probe reached bob");
    }
}

/// What the handler saw, without the probes.
fn real(seen: &Seen) -> Vec<serde_json::Value> {
    bodies(seen)
        .into_iter()
        .filter(|b| b != &json!("probe"))
        .collect()
}

/// A core system routes DMs over plain core NATS, in order, and sends no JetStream API request
/// at all, not even from the inbox in `auto` mode.
#[tokio::test]
async fn core_mode_dms_flow_and_no_jetstream_request_is_made() {
    let server = harness::run_server().await.unwrap();
    let watcher = server.client().await.unwrap();
    let mut js_api = watcher.subscribe("$JS.API.>").await.unwrap();
    watcher.flush().await.unwrap();

    let system = system(server.url(), false, DurableInboxMode::Auto).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&system, &bob).await;
    let snap = system.snapshot().await.unwrap();
    assert!(!snap.durable);
    assert_eq!(snap.inboxes["bob"].binding, Binding::Core);
    until_core_path_is_up(&system, &seen).await;

    for i in 0..20 {
        let receipt = system.send(&alice, &bob, json!(i)).await.unwrap();
        assert_eq!(receipt.ingress_seq, None, "core sends are not stored");
    }
    harness::wait_until("20 DMs", DEADLINE, || real(&seen).len() >= 20)
        .await
        .unwrap_or_else(|e| panic!("{e}: got {:?}", real(&seen)));
    assert_eq!(real(&seen), (0..20).map(|i| json!(i)).collect::<Vec<_>>());
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|d| d.envelope.meta.from.as_ref() == Some(&alice) && d.stream_seq.is_none()));
    let counters = router_counters(&system).await;
    assert!(counters.stored >= 20);
    system.shutdown(GRACE).await.unwrap();

    // Positive control: a JetStream request made now is seen by the watcher, and it is the
    // first one it sees, so the system made none.
    let control = server.client().await.unwrap();
    control
        .publish_with_reply("$JS.API.INFO", "control.marker", "".into())
        .await
        .unwrap();
    control.flush().await.unwrap();
    let first = tokio::time::timeout(DEADLINE, js_api.next())
        .await
        .expect("the watcher sees the control request")
        .unwrap();
    assert_eq!(first.subject.as_str(), "$JS.API.INFO");
    assert_eq!(
        first.reply.as_ref().map(|r| r.as_str()),
        Some("control.marker"),
        "the first JetStream request the watcher saw must be the control, got {first:?}"
    );
}

/// In `auto` mode, an attach request nobody answers because the hub is core ("no responders")
/// makes the inbox subscribe core at once, without waiting for the attach timeout; DMs then
/// flow through the core hub.
#[tokio::test]
async fn auto_mode_falls_back_to_core_when_the_hub_is_core() {
    let server = harness::run_server().await.unwrap();
    let hub = system(server.url(), false, DurableInboxMode::Auto).await;
    hub.start_router().await.unwrap();
    let client = system(server.url(), false, DurableInboxMode::Auto).await;
    let bob = agent("bob");

    let started = Instant::now();
    let seen = attach_collect(&client, &bob).await;
    let took = started.elapsed();
    assert_eq!(
        client.inbox_snapshot(&bob).await.unwrap().binding,
        Binding::Core
    );
    assert!(
        took < runtime::system::messaging::ATTACH_TIMEOUT,
        "fell back at once, not after the attach timeout (took {took:?})"
    );

    until_core_path_is_up(&client, &seen).await;
    client
        .send(&agent("alice"), &bob, json!("via the core hub"))
        .await
        .unwrap();
    harness::wait_until("the DM", DEADLINE, || !real(&seen).is_empty())
        .await
        .unwrap();
    assert_eq!(real(&seen), vec![json!("via the core hub")]);
    assert!(router_counters(&hub).await.stored >= 1);
    client.shutdown(GRACE).await.unwrap();
    hub.shutdown(GRACE).await.unwrap();
}

/// A durable hub attaches bob (creating `inbox-bob`) and stores `n` DMs for him that nobody
/// reads; then the hub shuts down completely. Returns the server.
async fn stored_while_bob_was_away(n: u64) -> harness::NatsServer {
    let server = harness::run_server().await.unwrap();
    let hub = durable_system(server.url()).await;
    hub.start_router().await.unwrap();
    // The attach protocol, as bob's client would speak it, but nobody reads the consumer yet.
    let raw = server.client().await.unwrap();
    let reply = raw
        .request(
            subjects::attach_request(&agent("bob")),
            protocol::attach::ATTACH_REQUEST_BODY.into(),
        )
        .await
        .unwrap();
    let reply: AttachResponse = serde_json::from_slice(&reply.payload).unwrap();
    assert!(matches!(reply, AttachResponse::Attached(_)), "{reply:?}");
    for i in 0..n {
        hub.send(&agent("alice"), &agent("bob"), json!(i))
            .await
            .unwrap();
    }
    wait_router(&hub, "all DMs stored", |c| c.stored >= n).await;
    hub.shutdown(GRACE).await.unwrap();

    // Control: no router answers any more, and nats says so ("no responders"). Polled: the
    // hub's attach subscription may outlive `shutdown` by a moment.
    harness::wait_until_async("no attach responder", DEADLINE, || async {
        let request = raw.request(subjects::attach_request(&agent("bob")), "{}".into());
        matches!(
            tokio::time::timeout(PROBE_WAIT, request).await,
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders
        )
    })
    .await
    .unwrap();
    let js = async_nats::jetstream::new(raw);
    assert_eq!(
        consumer_backlog(&js, "HUB_INBOX", "inbox-bob").await,
        (n, 0),
        "the DMs wait unread in inbox-bob"
    );
    server
}

/// Binds bob in `mode` on a system without router and checks that he gets the stored DMs.
async fn bob_reads_the_existing_consumer(
    server: &harness::NatsServer,
    mode: DurableInboxMode,
    n: u64,
) {
    let client = system(server.url(), true, mode).await;
    let bob = agent("bob");
    let seen = attach_collect(&client, &bob).await;
    assert_eq!(
        client.inbox_snapshot(&bob).await.unwrap().binding,
        Binding::Durable {
            stream: "HUB_INBOX".into(),
            consumer: "inbox-bob".into()
        },
        "mode {mode}: no router answered but inbox-bob exists: bind it directly"
    );
    wait_for(&seen, n as usize).await;
    assert_eq!(bodies(&seen), (0..n).map(|i| json!(i)).collect::<Vec<_>>());
    client.shutdown(GRACE).await.unwrap();
}

/// `on` mode: the router is down (no responders), `inbox-bob` exists: bind it directly and
/// read what was stored while bob was away.
#[tokio::test]
async fn on_mode_binds_the_existing_consumer_when_no_router_answers() {
    let server = stored_while_bob_was_away(10).await;
    bob_reads_the_existing_consumer(&server, DurableInboxMode::On, 10).await;
}

/// `auto` mode with a router that is up but does not answer in time (hung): the attach times
/// out, and the inbox binds the existing `inbox-bob`.
#[tokio::test]
async fn auto_mode_binds_the_existing_consumer_when_the_router_does_not_answer_in_time() {
    let server = stored_while_bob_was_away(10).await;
    // A hung router: it listens on the attach subjects and never replies.
    let hung = server.client().await.unwrap();
    let _hung_sub = hung
        .queue_subscribe(
            subjects::ATTACH_FILTER,
            subjects::ATTACH_QUEUE_GROUP.to_string(),
        )
        .await
        .unwrap();
    hung.flush().await.unwrap();
    bob_reads_the_existing_consumer(&server, DurableInboxMode::Auto, 10).await;
}

/// `auto` mode, durable hub whose router is down (no responders, like a core hub), `inbox-bob`
/// exists: the issue asks to bind it directly, so the DMs stored while bob was away reach him.
#[tokio::test]
async fn auto_mode_binds_the_existing_consumer_when_no_router_answers() {
    let server = stored_while_bob_was_away(10).await;
    bob_reads_the_existing_consumer(&server, DurableInboxMode::Auto, 10).await;
}
