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
