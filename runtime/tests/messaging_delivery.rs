//! Durable DMs through the embedded router actor and inboxes, against a real nats-server:
//! router outage and offline recipient.

mod support;

use protocol::config::DeliveryConfig;
use serde_json::json;
use support::{agent, attach_collect, bodies, durable_system, wait_for, DEADLINE, GRACE};

#[tokio::test]
async fn dms_published_while_no_router_runs_are_delivered_in_order_after_it_starts() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    // The streams exist (a router ran before), but no router runs now.
    let js = async_nats::jetstream::new(server.client().await.unwrap());
    actors::streams::ensure_streams(&js, &DeliveryConfig::default())
        .await
        .unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    for i in 0..50 {
        let receipt = system.send(&alice, &bob, json!(i)).await.unwrap();
        assert!(receipt.ingress_seq.is_some());
    }
    system.start_router().await.unwrap();
    let seen = attach_collect(&system, &bob).await;
    wait_for(&seen, 50).await;
    assert_eq!(bodies(&seen), (0..50).map(|i| json!(i)).collect::<Vec<_>>());
    system.shutdown(GRACE).await.unwrap();
}

#[tokio::test]
async fn dms_to_an_agent_that_never_attached_are_delivered_in_order_at_first_attach() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, carol) = (agent("alice"), agent("carol"));
    for i in 0..30 {
        system.send(&alice, &carol, json!(i)).await.unwrap();
    }
    // Wait until all 30 are stored (routed), then attach for the first time.
    harness::wait_until_async("routed", DEADLINE, || async {
        system
            .snapshot()
            .await
            .unwrap()
            .router
            .unwrap()
            .counters
            .stored
            >= 30
    })
    .await
    .unwrap();
    let seen = attach_collect(&system, &carol).await;
    wait_for(&seen, 30).await;
    assert_eq!(bodies(&seen), (0..30).map(|i| json!(i)).collect::<Vec<_>>());
    let snap = system.snapshot().await.unwrap();
    assert!(matches!(
        snap.inboxes["carol"].binding,
        actors::inbox::Binding::Durable { .. }
    ));
    system.shutdown(GRACE).await.unwrap();
}

/// Every DM an inbox holds is kept alive, not only the one its handler has (issue 28, B1): a
/// backlog worth four ack waits of handler time, taken by one pull, is handed over once each,
/// with no redelivery and no dead letter (before, the DMs waiting behind the handler were
/// redelivered after the ack wait, ran out of deliveries and were dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_longer_than_the_ack_wait_is_handed_over_once_without_redelivery_or_dead_letter()
{
    const DMS: usize = 40;
    let server = harness::run_server().await.unwrap();
    let delivery = DeliveryConfig {
        ack_wait_secs: 1,
        inbox_max_deliver: 2,
        inbox_backoff_secs: Vec::new(),
        ..DeliveryConfig::default()
    };
    let system = support::system_with(
        server.url(),
        true,
        protocol::attach::DurableInboxMode::Auto,
        delivery,
    )
    .await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    for i in 0..DMS {
        system.send(&alice, &bob, json!(i)).await.unwrap();
    }
    support::wait_router(&system, "the backlog stored", |c| c.stored >= DMS as u64).await;
    // A handler of 100 ms per DM: 4 s for the backlog, against a 1 s ack wait.
    let seen: support::Seen = Default::default();
    let sink = seen.clone();
    system
        .attach_inbox(&bob, move |d| {
            let sink = sink.clone();
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                sink.lock().unwrap().push(d);
            })
        })
        .await
        .unwrap();
    wait_for(&seen, DMS).await;
    let js = support::js(&server).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(
        bodies(&seen),
        (0..DMS).map(|i| json!(i)).collect::<Vec<_>>()
    );
    let redelivered: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.redelivered)
        .map(|d| d.envelope.body.clone())
        .collect();
    assert!(redelivered.is_empty(), "redelivered: {redelivered:?}");
    assert_eq!(support::count_on(&js, "HUB_DLQ", "dlq.bob").await, 0);
    system.shutdown(GRACE).await.unwrap();
}
