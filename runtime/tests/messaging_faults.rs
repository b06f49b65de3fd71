//! Dedupe and crash recovery of durable DMs: repeated publishes, redeliveries, and crashes of the
//! router and of an inbox consumer, against a real nats-server.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use actors::fault::{self, Fault, FaultPoint};
use protocol::subjects;
use serde_json::json;
use support::*;

/// The same envelope (same sender, same `meta.id`) reaches the ingress twice under different
/// ingress ids (a client retry after the ingress window, a second hub client...): the router
/// routes both, but the inbox stream stores it once and the recipient handles it once.
#[tokio::test]
async fn same_meta_id_published_twice_within_the_window_is_stored_once() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&system, &bob).await;
    let js = js(&server).await;

    let envelope =
        serde_json::to_vec(&json!({"meta": {"id": "dup-1", "to": "bob"}, "body": "once"})).unwrap();
    let ingress = subjects::ingress(&alice, &subjects::Channel::Inbox);
    let first = js_publish(&js, &ingress, "client-try-1", envelope.clone()).await;
    let second = js_publish(&js, &ingress, "client-try-2", envelope).await;
    // Control: the ingress stored both copies (different ingress ids).
    assert!(
        !first.1 && !second.1,
        "ingress dedupe must not hide the second copy"
    );
    assert_ne!(first.0, second.0);

    let counters = wait_router(&system, "both copies routed", |c| c.stored >= 2).await;
    assert_eq!(counters.stored, 2);
    assert_eq!(counters.duplicates, 1, "the second store is a duplicate");
    assert_eq!(counters.malformed, 0);
    assert_eq!(count_on(&js, "HUB_INBOX", "channel.inbox.bob").await, 1);

    // A later DM is handled after everything stored before it: the handler saw `once` once.
    system.send(&alice, &bob, json!("sentinel")).await.unwrap();
    wait_for(&seen, 2).await;
    assert_eq!(bodies(&seen), vec![json!("once"), json!("sentinel")]);
    let first = seen.lock().unwrap()[0].clone();
    assert_eq!(first.envelope.meta.id.as_str(), "dup-1");
    assert_eq!(first.envelope.meta.from.as_ref(), Some(&alice));
    system.shutdown(GRACE).await.unwrap();
}

/// Two stored copies of one envelope (what a redelivery after a lost ack looks like to the
/// client) reach the handler once; the inbox counts the second as a duplicate. (The DMs an
/// inbox holds are kept alive while they wait: the broker no longer redelivers one that waits
/// behind a slow handler, which this test once relied on.)
#[tokio::test]
async fn a_redelivery_reaches_the_handler_once() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let bob = agent("bob");
    let js = js(&server).await;

    let first = serde_json::to_vec(
        &json!({"meta": {"id": "r-1", "from": "alice", "to": "bob"}, "body": "redelivered"}),
    )
    .unwrap();
    let after = serde_json::to_vec(
        &json!({"meta": {"id": "r-2", "from": "alice", "to": "bob"}, "body": "after"}),
    )
    .unwrap();
    let inbox = subjects::inbox(&bob);
    js_publish(&js, &inbox, "r-1", first.clone()).await;
    js_publish(&js, &inbox, "r-1-again", first).await;
    js_publish(&js, &inbox, "r-2", after).await;
    assert_eq!(count_on(&js, "HUB_INBOX", &inbox).await, 3);

    let seen = attach_collect(&system, &bob).await;
    wait_for(&seen, 2).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(bodies(&seen), vec![json!("redelivered"), json!("after")]);
    let inbox_snap = system.inbox_snapshot(&bob).await.unwrap();
    assert!(matches!(
        inbox_snap.binding,
        actors::inbox::Binding::Durable { .. }
    ));
    assert_eq!(inbox_snap.counters.duplicates, 1, "{inbox_snap:?}");
    assert_eq!(inbox_snap.counters.delivered, 2);
    system.shutdown(GRACE).await.unwrap();
}

/// The inbox consumer crashes after pulling a DM and before handing it over: the DM stays
/// unacked, the supervisor restarts the consumer, and the DM comes back after the ack wait and
/// is handled exactly once.
#[tokio::test]
async fn client_crash_before_ack_dm_comes_back_after_ack_wait_and_is_handled() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let inbox_name = system.inbox_name(&bob);
    fault::arm(&inbox_name, FaultPoint::Handle, Fault::Error, 1);
    let seen = attach_collect(&system, &bob).await;

    system.send(&alice, &bob, json!("survivor")).await.unwrap();
    wait_for(&seen, 1).await;
    assert_eq!(
        fault::remaining(&inbox_name, FaultPoint::Handle),
        0,
        "fault fired"
    );
    assert!(inbox_restarts(&system, &bob).await >= 1);
    {
        let seen = seen.lock().unwrap();
        assert!(
            seen[0].delivered >= 2,
            "handled on a redelivery, got delivered={}",
            seen[0].delivered
        );
    }

    // Exactly once: a DM sent afterwards is the next (and last) thing the handler sees.
    system.send(&alice, &bob, json!("sentinel")).await.unwrap();
    wait_for(&seen, 2).await;
    assert_eq!(bodies(&seen), vec![json!("survivor"), json!("sentinel")]);
    system.shutdown(GRACE).await.unwrap();
}

/// The router panics on a pulled envelope and the inbox fails on a DM, while 200 DMs flow: both
/// are restarted, re-bind their consumers, and every DM is handled exactly once.
#[tokio::test]
async fn crashed_router_and_inbox_are_restarted_rebind_and_lose_nothing() {
    const N: u64 = 200;
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&system, &bob).await;
    let router_name = system.router_name();
    let inbox_name = system.inbox_name(&bob);
    fault::arm(&router_name, FaultPoint::Handle, Fault::Panic, 1);
    fault::arm(&inbox_name, FaultPoint::Handle, Fault::Error, 1);

    for i in 0..N {
        system.send(&alice, &bob, json!(i)).await.unwrap();
    }
    // No snapshot before the router's fault fired: the router checks the same key in its
    // actor `handle`, and the test wants the crash in the pump, on a pulled envelope.
    harness::wait_until("both faults fired", DEADLINE, || {
        fault::remaining(&router_name, FaultPoint::Handle) == 0
            && fault::remaining(&inbox_name, FaultPoint::Handle) == 0
    })
    .await
    .unwrap();
    wait_for(&seen, N as usize).await;

    // Quiesce: nothing pending or unacked on either consumer, so nothing more can arrive.
    let js = js(&server).await;
    harness::wait_until_async("consumers drained", DEADLINE, || async {
        consumer_backlog(&js, "HUB_INGRESS", "router").await == (0, 0)
            && consumer_backlog(&js, "HUB_INBOX", "inbox-bob").await == (0, 0)
    })
    .await
    .unwrap();

    let got = bodies(&seen);
    let distinct: BTreeSet<u64> = got.iter().map(|b| b.as_u64().unwrap()).collect();
    assert_eq!(got.len(), N as usize, "no DM handled twice");
    assert_eq!(distinct, (0..N).collect::<BTreeSet<_>>(), "no DM lost");
    assert_eq!(
        count_on(&js, "HUB_INBOX", "channel.inbox.bob").await,
        N as usize
    );
    assert!(
        seen.lock().unwrap().iter().any(|d| d.delivered >= 2),
        "the DM in hand when the inbox failed came back as a redelivery"
    );

    assert!(restarts(&system, &router_sup(&system), &router_name).await >= 1);
    assert!(inbox_restarts(&system, &bob).await >= 1);
    system.shutdown(GRACE).await.unwrap();
}

/// The broker never gets an inbox's pull (lost on the way, as a broker that forgot it): the
/// client believes a pull is open, so nothing is delivered until the pull is issued again. A
/// pull that stays silent past two idle heartbeats (10 s) is issued again, so the DM waiting
/// is handled within about 10 s, not after the pull's expiry and async-nats's own re-pull (35 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_whose_pull_the_broker_never_got_pulls_again_after_two_missed_heartbeats() {
    let server = harness::run_server().await.unwrap();
    let hub = durable_system(server.url()).await;
    hub.start_router().await.unwrap();
    // Bob's host reaches the broker through a proxy that loses his inbox's first pull.
    let proxy = harness::Proxy::start(server.port()).await.unwrap();
    proxy.lose_next("$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.", 1);
    let bob_host = durable_system(proxy.url()).await;
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&bob_host, &bob).await;
    harness::wait_until("the first pull lost", DEADLINE, || proxy.lost() == 1)
        .await
        .unwrap();
    let sent = std::time::Instant::now();
    hub.send(&alice, &bob, json!("waiting for a pull"))
        .await
        .unwrap();
    harness::wait_until("the DM handled", Duration::from_secs(20), || {
        !seen.lock().unwrap().is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e} ({:?} after the send)", sent.elapsed()));
    assert_eq!(bodies(&seen), vec![json!("waiting for a pull")]);
    let counters = wait_inbox(&bob_host, &bob, "the pull re-issued", |c| {
        c.repulls >= 1 && c.delivered >= 1
    })
    .await;
    assert_eq!(counters.delivered, 1);
    bob_host.shutdown(GRACE).await.unwrap();
    hub.shutdown(GRACE).await.unwrap();
}

/// The same for the router's pull of the ingress: a router whose pull the broker never got
/// routes the DMs waiting within about 10 s, not 35 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_whose_pull_the_broker_never_got_pulls_again_after_two_missed_heartbeats() {
    let server = harness::run_server().await.unwrap();
    let proxy = harness::Proxy::start(server.port()).await.unwrap();
    proxy.lose_next("$JS.API.CONSUMER.MSG.NEXT.HUB_INGRESS.", 1);
    let router_host = durable_system(proxy.url()).await;
    router_host.start_router().await.unwrap();
    harness::wait_until("the router's first pull lost", DEADLINE, || {
        proxy.lost() == 1
    })
    .await
    .unwrap();
    let hub = durable_system(server.url()).await;
    let (alice, bob) = (agent("alice"), agent("bob"));
    let seen = attach_collect(&hub, &bob).await;
    let sent = std::time::Instant::now();
    hub.send(&alice, &bob, json!("waiting for the router"))
        .await
        .unwrap();
    harness::wait_until("the DM routed and handled", Duration::from_secs(20), || {
        !seen.lock().unwrap().is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e} ({:?} after the send)", sent.elapsed()));
    assert_eq!(bodies(&seen), vec![json!("waiting for the router")]);
    // Counted once the ingress ack is done, which may come after the handler saw the DM.
    let counters = wait_router(&router_host, "the DM counted as stored", |c| c.stored >= 1).await;
    assert!(counters.reconnects >= 1, "{counters:?}");
    assert_eq!(counters.stored, 1);
    hub.shutdown(GRACE).await.unwrap();
    router_host.shutdown(GRACE).await.unwrap();
}

/// A handler that panics at every DM: its inbox is restarted (the DM comes back to each
/// incarnation), then given up alone; a dead incarnation shows no snapshot, the inbox stays
/// attached in name, and its sibling goes on.
#[tokio::test]
async fn an_inbox_whose_handler_panics_is_given_up_alone_and_shows_no_snapshot() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob, carol) = (agent("alice"), agent("bob"), agent("carol"));
    system
        .attach_inbox(&bob, |_| async {
            panic!("the handler panics");
            #[allow(unreachable_code)]
            actors::inbox::Handled::Done
        })
        .await
        .unwrap();
    let seen_carol = attach_collect(&system, &carol).await;
    system.send(&alice, &bob, json!("poison")).await.unwrap();
    harness::wait_until_async("bob's inbox given up", Duration::from_secs(30), || async {
        system
            .snapshot()
            .await
            .ok()
            .and_then(|s| s.inbox_supervisor)
            .is_some_and(|s| s.given_up == 1)
    })
    .await
    .unwrap();
    assert!(
        system.inbox_snapshot(&bob).await.is_none(),
        "a given-up inbox shows its last incarnation: {:?}",
        system.inbox_snapshot(&bob).await
    );
    assert_eq!(
        system.attached_inboxes().await,
        vec![bob.clone(), carol.clone()]
    );
    system.send(&alice, &carol, json!("fine")).await.unwrap();
    wait_for(&seen_carol, 1).await;
    assert_eq!(bodies(&seen_carol), vec![json!("fine")]);
    system.shutdown(GRACE).await.unwrap();
}
