//! Message expiry (`meta.expires_at`, issue 10 §1) against a real nats-server: the router
//! refuses a DM past its deadline and stores a live one with `Nats-TTL`, the broker frees it
//! after its deadline, an inbox never hands a DM past its deadline to its handler, and the
//! sender of a DM that expired unread gets a notice of kind `expired`, whether its recipient was
//! offline (the deadline check) or online (the inbox's termination).

mod support;

use protocol::attach::DurableInboxMode;
use protocol::subjects::{self, Channel};
use protocol::{AgentId, Envelope, WireErrorKind};
use runtime::ActorSystem;

/// A DM to `to` with id `id`, expiring at `expires_at` (unix ms) if any.
fn dm(to: &AgentId, id: &str, expires_at: Option<u64>) -> Envelope {
    let mut env = support::dm(to, id);
    env.meta.set_expires_at(expires_at);
    env
}

/// The `message_id`s of the `expired` notices `seen` (in order).
fn expired_notices(seen: &support::Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter_map(|d| protocol::rejection::parse_notice(&d.envelope))
        .map(|n| n.message_id.to_string())
        .collect()
}

/// A hub whose DMs stay a second past their deadline (the grace), so a test waits little.
async fn hub(server: &harness::NatsServer) -> ActorSystem {
    let delivery = protocol::config::DeliveryConfig {
        expiry_grace_secs: 1,
        ..support::delivery()
    };
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    hub
}

async fn send(hub: &ActorSystem, from: &AgentId, env: &Envelope) {
    hub.send_envelope(from, &Channel::Inbox, env).await.unwrap();
}

fn ids(seen: &support::Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|d| d.envelope.meta.id.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_offline_past_the_expiry_of_3_of_5_dms_receives_only_the_2_live_ones() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    // Bob's consumer exists (his attach request), and nobody reads it: he is offline.
    support::make_consumer(&hub, &bob).await;
    let soon = protocol::expiry::now_ms() + 1_500;
    for (id, expires_at) in [
        ("m1", Some(soon)),
        ("m2", None),
        ("m3", Some(soon)),
        ("m4", Some(soon + 3_600_000)),
        ("m5", Some(soon)),
    ] {
        send(&hub, &alice, &dm(&bob, id, expires_at)).await;
    }
    let js = support::js(&server).await;
    let inbox = subjects::inbox(&bob);
    harness::wait_until_async("5 DMs stored", support::DEADLINE, || async {
        support::count_on(&js, "HUB_INBOX", &inbox).await == 5
    })
    .await
    .unwrap();
    // At their deadline alice is told, once each; the broker frees them after their grace
    // (their Nats-TTL), with nobody reading.
    support::wait_for(&alices, 3).await;
    let mut told = expired_notices(&alices);
    told.sort();
    assert_eq!(told, ["m1", "m3", "m5"]);
    harness::wait_until_async("the expired DMs freed", support::DEADLINE, || async {
        support::count_on(&js, "HUB_INBOX", &inbox).await == 2
    })
    .await
    .unwrap();
    // Back online: only the live ones, in order.
    let seen = support::attach_collect(&hub, &bob).await;
    support::wait_for(&seen, 2).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(ids(&seen), ["m2", "m4"]);
    assert_eq!(alices.lock().unwrap().len(), 3, "one notice each, no more");
    hub.shutdown(std::time::Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_past_its_deadline_is_refused_with_a_notice_of_kind_expired() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let late = protocol::expiry::now_ms() - 1;
    send(&hub, &alice, &dm(&bob, "m-late", Some(late))).await;
    // Its rejection reaches alice; nothing reaches bob's inbox.
    support::wait_for(&alices, 1).await;
    let notice = alices.lock().unwrap()[0].envelope.clone();
    let rejection = protocol::rejection::parse_rejection(&notice).expect("a rejection notice");
    assert_eq!(rejection.error.kind, WireErrorKind::Expired);
    assert_eq!(rejection.rejected_id.unwrap().as_str(), "m-late");
    let js = support::js(&server).await;
    assert_eq!(
        support::count_on(&js, "HUB_INBOX", &subjects::inbox(&bob)).await,
        0
    );
    hub.shutdown(std::time::Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_never_hands_over_a_dm_past_its_deadline() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let js = support::js(&server).await;
    // Stored as the router stores, but without a TTL (say, by a router whose clock was behind):
    // only the inbox's own check stands between it and the handler.
    support::make_consumer(&hub, &bob).await;
    let past = protocol::expiry::now_ms() - 1;
    for env in [dm(&bob, "m-dead", Some(past)), dm(&bob, "m-live", None)] {
        let mut env = env;
        env.meta.from = Some(alice.clone());
        let payload = protocol::encode(&env, protocol::Codec::Json).unwrap();
        let msg_id = format!("hub-router:alice:{}", env.meta.id);
        support::js_publish(&js, &subjects::inbox(&bob), &msg_id, payload).await;
    }
    let seen = support::attach_collect(&hub, &bob).await;
    support::wait_for(&seen, 1).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(ids(&seen), ["m-live"]);
    let snapshot = hub.inbox_snapshot(&bob).await.unwrap();
    assert_eq!(snapshot.counters.expired, 1, "{snapshot:?}");
    // Bob's inbox terminated it as expired: alice is told, from the broker's advisory.
    support::wait_for(&alices, 1).await;
    assert_eq!(expired_notices(&alices), ["m-dead"]);
    hub.shutdown(std::time::Duration::from_secs(10))
        .await
        .unwrap();
}
