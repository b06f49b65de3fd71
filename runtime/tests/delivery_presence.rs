//! Presence (issue 10 §4) against a real nats-server: an attached inbox beats its agent's
//! presence into `HUB_PRESENCE`, a clean stop writes an explicit offline marker, a killed one
//! reads offline once its last beat is three beats old; a send's receipt names its recipient's
//! state, and `runtime presence` lists the agents with when each was last seen.

mod support;

use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::presence::PresenceState;
use protocol::subjects::Channel;
use protocol::AgentId;
use runtime::ActorSystem;
use serde_json::Value;
use support::oneshot::{assert_exit, run_cli, stdout};

async fn system(server: &harness::NatsServer, beat_secs: u64) -> ActorSystem {
    let delivery = DeliveryConfig {
        presence_beat_secs: beat_secs,
        ..support::delivery()
    };
    support::system_with(server.url(), true, DurableInboxMode::On, delivery).await
}

/// `runtime presence --json`, by agent.
async fn presence(url: &str) -> Vec<Value> {
    let out = run_cli(&["presence", "--json", "--nats-url", url]).await;
    assert_exit(&out, 0, "runtime presence");
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn state_in_list(url: &str, agent: &str) -> Option<String> {
    presence(url)
        .await
        .into_iter()
        .find(|e| e["agent"] == agent)
        .map(|e| e["state"].as_str().unwrap().to_owned())
}

async fn receipt_state(hub: &ActorSystem, from: &AgentId, to: &AgentId) -> Option<PresenceState> {
    hub.send_envelope(from, &Channel::Inbox, &support::dm(to, "p"))
        .await
        .unwrap()
        .recipient_state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_inbox_is_online_in_receipts_and_a_clean_stop_says_offline_at_once() {
    let server = harness::run_server().await.unwrap();
    // A 10 s beat: offline within a few seconds can only be the clean stop's marker (a beat
    // times out after 30 s).
    let hub = system(&server, 10).await;
    hub.start_router().await.unwrap();
    let (alice, bob, carol) = (
        support::agent("alice"),
        support::agent("bob"),
        support::agent("carol"),
    );
    let bobs_process = system(&server, 10).await;
    let _bobs = support::attach_collect(&bobs_process, &bob).await;
    let url = server.url();
    harness::wait_until_async("bob online", support::DEADLINE, || async {
        state_in_list(&url, "bob").await.as_deref() == Some("online")
    })
    .await
    .unwrap();
    assert_eq!(
        receipt_state(&hub, &alice, &bob).await,
        Some(PresenceState::Online)
    );
    assert_eq!(
        receipt_state(&hub, &alice, &carol).await,
        Some(PresenceState::Unknown),
        "never seen"
    );
    let entry = presence(&url)
        .await
        .into_iter()
        .find(|e| e["agent"] == "bob")
        .unwrap();
    assert!(entry["seen_secs_ago"].as_u64().unwrap() <= 10, "{entry}");

    bobs_process
        .shutdown(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(state_in_list(&url, "bob").await.as_deref(), Some("offline"));
    // The receipt follows within the cache's 2 s.
    harness::wait_until_async(
        "bob offline in receipts",
        Duration::from_secs(5),
        || async { receipt_state(&hub, &alice, &bob).await == Some(PresenceState::Offline) },
    )
    .await
    .unwrap();
    // A broadcast names no recipient.
    let broadcast = hub
        .broadcast(
            &alice,
            &protocol::ChannelName::new("news").unwrap(),
            "x".into(),
        )
        .await
        .unwrap();
    assert_eq!(broadcast.recipient_state, None);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_inbox_reads_offline_once_its_last_beat_is_three_beats_old() {
    let server = harness::run_server().await.unwrap();
    let hub = system(&server, 1).await;
    hub.start_router().await.unwrap();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("delivery.json");
    std::fs::write(&config, r#"{"presence_beat_secs": 1}"#).unwrap();
    let mut bob = harness::RuntimeProcess::spawn(
        [
            "inbox",
            "--as",
            "bob",
            "--follow",
            "--nats-url",
            &url,
            "--delivery-config",
            config.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    harness::wait_until_async("bob online", support::DEADLINE, || async {
        state_in_list(&url, "bob").await.as_deref() == Some("online")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", bob.log()));
    // Still online a beat later: the beats go on.
    let first = presence(&url)
        .await
        .into_iter()
        .find(|e| e["agent"] == "bob")
        .unwrap();
    harness::wait_until_async("a later beat", support::DEADLINE, || async {
        let now = presence(&url)
            .await
            .into_iter()
            .find(|e| e["agent"] == "bob")
            .unwrap();
        now["last_seen_ms"].as_u64() > first["last_seen_ms"].as_u64() && now["state"] == "online"
    })
    .await
    .unwrap();
    bob.kill9().await;
    let killed_at = std::time::Instant::now();
    harness::wait_until_async("bob offline", support::DEADLINE, || async {
        state_in_list(&url, "bob").await.as_deref() == Some("offline")
    })
    .await
    .unwrap();
    // Not before three beats (its last one could be up to a beat before the kill).
    assert!(
        killed_at.elapsed() >= Duration::from_secs(2),
        "offline after {:?}",
        killed_at.elapsed()
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
