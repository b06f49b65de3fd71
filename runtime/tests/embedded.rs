//! The embedding API against a real nats-server.

use std::time::Duration;

use async_nats::jetstream;
use runtime::{ActorSystem, NatsSettings, SystemError};

const GRACE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn embedded_system_starts_a_durable_router_and_snapshots_it() {
    let server = harness::run_server().await.unwrap();
    let system = ActorSystem::builder()
        .nats(NatsSettings::new(server.url()))
        .durable(true)
        .build()
        .await
        .unwrap();
    system.start_router().await.unwrap();

    let snapshot = system.snapshot().await.unwrap();
    let router = snapshot.router.expect("router snapshot");
    assert!(router.durable);
    let names: Vec<_> = router.streams.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "HUB_INGRESS",
            "HUB_INBOX",
            "HUB_TASKS",
            "HUB_WORK",
            "HUB_ANSWERS",
            "HUB_SCHEDULES",
            "HUB_ADVISORIES",
            "HUB_DLQ",
            "HUB_AUDIT"
        ]
    );
    let sup = snapshot
        .supervisors
        .values()
        .next()
        .expect("router supervisor");
    // The router, the attach, expiry, history and watchdog actors, all running, none
    // restarted.
    assert_eq!(sup.children.len(), 5);
    assert!(sup.children.iter().all(|c| c.running && c.restarts == 0));

    // The same snapshot is served over NATS to `runtime status`.
    let remote = runtime::request_status(system.client(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(remote.name, system.router_name());

    let js = jetstream::new(server.client().await.unwrap());
    for name in ["HUB_INGRESS", "HUB_INBOX", "HUB_TASKS"] {
        js.get_stream(name).await.unwrap();
    }
    let client = server.client().await.unwrap();
    system.shutdown(GRACE).await.unwrap();

    // After shutdown nobody answers status requests any more.
    assert!(matches!(
        runtime::request_status(&client, Duration::from_secs(2)).await,
        Err(SystemError::NoRouter { .. })
    ));
}

#[tokio::test]
async fn two_systems_in_one_process_do_not_clash() {
    let server = harness::run_server().await.unwrap();
    let mut systems = Vec::new();
    for _ in 0..2 {
        let system = ActorSystem::builder()
            .nats(NatsSettings::new(server.url()))
            .durable(true)
            .build()
            .await
            .unwrap();
        system.start_router().await.unwrap();
        systems.push(system);
    }
    assert_ne!(systems[0].router_name(), systems[1].router_name());
    for system in systems {
        assert!(system.snapshot().await.unwrap().router.is_some());
        system.shutdown(GRACE).await.unwrap();
    }
}
