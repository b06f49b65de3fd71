//! Durable DMs through the embedded router and inbox actors, against a real nats-server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::config::DeliveryConfig;
use protocol::AgentId;
use runtime::{ActorSystem, NatsSettings};

const DEADLINE: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(10);

type Seen = Arc<Mutex<Vec<serde_json::Value>>>;

async fn durable_system(url: String) -> ActorSystem {
    let delivery = DeliveryConfig {
        ack_wait_secs: 1,
        ..Default::default()
    };
    ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .delivery_config(delivery)
        .inbox_mode(protocol::attach::DurableInboxMode::Auto)
        .build()
        .await
        .unwrap()
}

async fn attach_collect(system: &ActorSystem, id: &AgentId) -> Seen {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    system
        .attach_inbox(id, move |d| {
            let sink = sink.clone();
            Box::pin(async move { sink.lock().unwrap().push(d.envelope.body) })
        })
        .await
        .unwrap();
    seen
}

async fn wait_for(seen: &Seen, n: usize) {
    harness::wait_until("DMs delivered", DEADLINE, || {
        seen.lock().unwrap().len() >= n
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: got {:?}", seen.lock().unwrap().len()));
}

#[tokio::test]
async fn dms_published_while_no_router_runs_are_delivered_in_order_after_it_starts() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    // The streams exist (a router ran before), but no router runs now.
    let js = async_nats::jetstream::new(server.client().await.unwrap());
    actors::streams::ensure_streams(&js, &DeliveryConfig::default())
        .await
        .unwrap();
    let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
    for i in 0..50 {
        let receipt = system
            .send(&alice, &bob, serde_json::json!(i))
            .await
            .unwrap();
        assert!(receipt.ingress_seq.is_some());
    }
    system.start_router().await.unwrap();
    let seen = attach_collect(&system, &bob).await;
    wait_for(&seen, 50).await;
    let got = seen.lock().unwrap().clone();
    assert_eq!(
        got,
        (0..50).map(|i| serde_json::json!(i)).collect::<Vec<_>>()
    );
    system.shutdown(GRACE).await.unwrap();
}

#[tokio::test]
async fn dms_to_an_agent_that_never_attached_are_delivered_in_order_at_first_attach() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, carol) = (
        AgentId::new("alice").unwrap(),
        AgentId::new("carol").unwrap(),
    );
    for i in 0..30 {
        system
            .send(&alice, &carol, serde_json::json!(i))
            .await
            .unwrap();
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
    assert_eq!(
        seen.lock().unwrap().clone(),
        (0..30).map(|i| serde_json::json!(i)).collect::<Vec<_>>()
    );
    let snap = system.snapshot().await.unwrap();
    assert!(matches!(
        snap.inboxes["carol"].binding,
        actors::inbox::Binding::Durable { .. }
    ));
    system.shutdown(GRACE).await.unwrap();
}
