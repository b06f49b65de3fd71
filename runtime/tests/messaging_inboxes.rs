//! Inboxes of many agents in one system: detach, a second attach of the same identity, and
//! attaches made concurrently (issue 11), against a real nats-server.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use protocol::presence::PresenceState;
use runtime::system::presence;
use runtime::SystemError;
use serde_json::json;
use support::{agent, attach_collect, bodies, wait_for, DEADLINE, GRACE};

#[tokio::test]
async fn a_detached_inbox_takes_no_more_dms_and_its_next_attach_gets_those_sent_meanwhile() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, protocol::attach::DurableInboxMode::On).await;
    let (alice, bob) = (agent("alice"), agent("bob"));
    let first = attach_collect(&hub, &bob).await;
    for i in 0..3 {
        hub.send(&alice, &bob, json!(i)).await.unwrap();
    }
    wait_for(&first, 3).await;

    hub.detach_inbox(&bob, GRACE).await.unwrap();
    // Nothing of it runs any more, and its clean stop marked it offline.
    assert!(hub.inbox_snapshot(&bob).await.is_none());
    assert!(hub.attached_inboxes().await.is_empty());
    let snap = hub.snapshot().await.unwrap();
    assert!(snap.inboxes.is_empty(), "{:?}", snap.inboxes);
    let supervisor = snap.inbox_supervisor.expect("the inbox supervisor runs");
    assert_eq!(supervisor.children, 0, "{supervisor:?}");
    let entries = presence::list(hub.client()).await.unwrap();
    let entry = entries
        .iter()
        .find(|e| e.agent == "bob")
        .expect("bob's record");
    assert_eq!(entry.state, PresenceState::Offline);

    // Sent while detached: they wait in its durable inbox.
    for i in 3..6 {
        hub.send(&alice, &bob, json!(i)).await.unwrap();
    }
    support::wait_router(&hub, "6 DMs stored", |c| c.stored >= 6).await;
    let second = attach_collect(&hub, &bob).await;
    wait_for(&second, 3).await;
    assert_eq!(bodies(&second), vec![json!(3), json!(4), json!(5)]);
    assert_eq!(
        bodies(&first),
        vec![json!(0), json!(1), json!(2)],
        "the detached handler saw nothing after the detach"
    );
    hub.shutdown(GRACE).await.unwrap();
}

#[tokio::test]
async fn attaching_an_attached_inbox_or_detaching_an_unknown_one_is_refused() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, protocol::attach::DurableInboxMode::On).await;
    let (alice, bob, carol) = (agent("alice"), agent("bob"), agent("carol"));
    let seen = attach_collect(&hub, &bob).await;
    let again = hub.attach_inbox(&bob, |_d| Box::pin(async {})).await;
    assert!(
        matches!(&again, Err(SystemError::AlreadyAttached { id }) if *id == bob),
        "{again:?}"
    );
    let unknown = hub.detach_inbox(&carol, GRACE).await;
    assert!(
        matches!(&unknown, Err(SystemError::NotAttached { id }) if *id == carol),
        "{unknown:?}"
    );
    // The first attach still serves bob.
    hub.send(&alice, &bob, json!("still here")).await.unwrap();
    wait_for(&seen, 1).await;
    assert_eq!(bodies(&seen), vec![json!("still here")]);
    // Detached once; a second detach finds nothing.
    hub.detach_inbox(&bob, GRACE).await.unwrap();
    assert!(matches!(
        hub.detach_inbox(&bob, GRACE).await,
        Err(SystemError::NotAttached { .. })
    ));
    hub.shutdown(GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inboxes_attached_concurrently_each_get_their_own_dms_once() {
    const AGENTS: usize = 200;
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, protocol::attach::DurableInboxMode::On).await;
    let ids: Vec<_> = (0..AGENTS).map(|i| agent(&format!("agent{i}"))).collect();
    // Which inbox saw which DM body, and how often.
    let seen: Arc<Mutex<HashMap<(String, String), u32>>> = Arc::default();
    let attached: Vec<Result<(), SystemError>> = futures::stream::iter(&ids)
        .map(|id| {
            let (sink, me) = (seen.clone(), id.to_string());
            hub.attach_inbox(id, move |d| {
                let body = d.envelope.body.as_str().unwrap_or_default().to_owned();
                *sink.lock().unwrap().entry((me.clone(), body)).or_default() += 1;
                Box::pin(async {})
            })
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(attached.iter().all(Result::is_ok), "{attached:?}");
    assert_eq!(hub.attached_inboxes().await.len(), AGENTS);

    let alice = agent("alice");
    for id in &ids {
        hub.send(&alice, id, json!(format!("for {id}")))
            .await
            .unwrap();
    }
    harness::wait_until("every DM handled", DEADLINE, || {
        seen.lock().unwrap().len() >= AGENTS
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {} handled", seen.lock().unwrap().len()));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), AGENTS, "nothing else was handled: {seen:?}");
    for id in &ids {
        let key = (id.to_string(), format!("for {id}"));
        assert_eq!(seen.get(&key), Some(&1), "{id} got its DM once");
    }
    hub.shutdown(GRACE).await.unwrap();
}
