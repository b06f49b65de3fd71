//! Backpressure (issue 10 §3) against a real nats-server: a full inbox refuses the new DM
//! (never dropping an older one) and its sender is told `inbox_full` with `retry_after_secs`;
//! a refusal the sender's own full inbox cannot take ends too, counted, instead of being
//! retried for ever.

mod support;

use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::rejection::{parse_rejection, Rejection};
use protocol::subjects::{self, Channel};
use protocol::{AgentId, WireErrorKind};
use runtime::ActorSystem;

/// The cap of every inbox in these tests.
const CAP: i64 = 3;
/// The inboxes' max age: what a full inbox's retry-after is counted from.
const MAX_AGE_SECS: i64 = 600;

async fn hub(server: &harness::NatsServer) -> ActorSystem {
    let mut delivery = DeliveryConfig {
        ..support::delivery()
    };
    delivery.inbox.max_msgs_per_subject = CAP;
    delivery.inbox.max_age_secs = MAX_AGE_SECS;
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    hub
}

async fn send(hub: &ActorSystem, from: &AgentId, to: &AgentId, id: &str) {
    hub.send_envelope(from, &Channel::Inbox, &support::dm(to, id))
        .await
        .unwrap();
}

/// Alice sends m1 to m5 to bob; the last two are refused: their refusals, once both are in.
/// She sends from a system of her own that does not read her inbox: one that did would learn
/// the hold of m4's refusal and, when it comes before m5 is sent, rightly keep m5 back.
async fn send_five(
    server: &harness::NatsServer,
    alice: &AgentId,
    bob: &AgentId,
    alices: &support::Seen,
) -> Vec<Rejection> {
    let sender = support::durable_system(server.url()).await;
    for id in ["m1", "m2", "m3", "m4", "m5"] {
        send(&sender, alice, bob, id).await;
    }
    sender.shutdown(Duration::from_secs(5)).await.unwrap();
    support::wait_for(alices, 2).await;
    let refused = rejections(alices);
    let ids: Vec<_> = refused
        .iter()
        .map(|r| r.rejected_id.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["m4", "m5"]);
    refused
}

fn rejections(seen: &support::Seen) -> Vec<Rejection> {
    seen.lock()
        .unwrap()
        .iter()
        .filter_map(|d| parse_rejection(&d.envelope))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbox_refuses_the_new_dm_with_inbox_full_and_keeps_the_oldest() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    // Bob is offline: his consumer exists and nobody reads it.
    support::make_consumer(&hub, &bob).await;
    let refused = send_five(&server, &alice, &bob, &alices).await;
    for r in &refused {
        assert_eq!(r.error.kind, WireErrorKind::InboxFull);
        // Room comes back when bob's oldest DM (stored a moment ago) leaves the stream.
        let after = r.retry_after_secs.expect("a full inbox says when to retry");
        assert!(
            (MAX_AGE_SECS as u64 - 30..=MAX_AGE_SECS as u64).contains(&after),
            "retry after {after} s"
        );
    }
    let counters = support::wait_router(&hub, "both refused", |c| c.refused_full == 2).await;
    assert_eq!(counters.stored, 3);
    assert_eq!(counters.rejections_sent, 2);
    assert_eq!(counters.naks, 0, "a refusal is never retried");
    // Back online, bob gets the oldest three, in order: none was dropped to make room.
    let bobs = support::attach_collect(&hub, &bob).await;
    support::wait_for(&bobs, 3).await;
    let js = support::js(&server).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(support::bodies(&bobs), ["m1", "m2", "m3"]);
    assert_eq!(alices.lock().unwrap().len(), 2, "one notice per refused DM");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_the_senders_own_full_inbox_refuses_is_dropped_and_counted() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob, carol) = (
        support::agent("alice"),
        support::agent("bob"),
        support::agent("carol"),
    );
    // Alice's and bob's inboxes are full, and both are offline.
    for to in [&alice, &bob] {
        support::make_consumer(&hub, to).await;
        for n in 0..CAP {
            send(&hub, &carol, to, &format!("fill-{to}-{n}")).await;
        }
    }
    send(&hub, &alice, &bob, "m-over").await;
    let counters =
        support::wait_router(&hub, "the notice dropped", |c| c.notices_dropped == 1).await;
    assert_eq!(counters.refused_full, 1);
    assert_eq!(counters.naks, 0, "neither the DM nor its notice is retried");
    let js = support::js(&server).await;
    // Nothing is left in the ingress, and no inbox lost a DM to make room.
    harness::wait_until_async("the ingress drained", support::DEADLINE, || async {
        support::stream_messages(&js, "HUB_INGRESS").await == 0
    })
    .await
    .unwrap();
    for to in [&alice, &bob] {
        assert_eq!(
            support::count_on(&js, "HUB_INBOX", &subjects::inbox(to)).await,
            CAP as usize
        );
    }
    let alices = support::attach_collect(&hub, &alice).await;
    support::wait_for(&alices, CAP as usize).await;
    assert!(rejections(&alices).is_empty());
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A hub whose senders may send `per_min` DMs a minute.
async fn rated_hub(server: &harness::NatsServer, per_min: i64) -> ActorSystem {
    let delivery = DeliveryConfig {
        sender_rate_per_min: per_min,
        ..support::delivery()
    };
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    hub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_over_its_rate_is_refused_rate_limited_and_its_bucket_outlives_the_router() {
    let server = harness::run_server().await.unwrap();
    let (alice, bob, carol) = (
        support::agent("alice"),
        support::agent("bob"),
        support::agent("carol"),
    );
    // 3 a minute: a burst of 3, then one token every 20 s.
    let first = rated_hub(&server, 3).await;
    let alices = support::attach_collect(&first, &alice).await;
    let bobs = support::attach_collect(&first, &bob).await;
    let refused = send_five(&server, &alice, &bob, &alices).await;
    for r in &refused {
        assert_eq!(r.error.kind, WireErrorKind::RateLimited);
        let after = r.retry_after_secs.expect("a rate limit says when to retry");
        assert!((1..=20).contains(&after), "retry after {after} s");
    }
    support::wait_for(&bobs, 3).await;
    assert_eq!(support::bodies(&bobs), ["m1", "m2", "m3"]);
    let counters = support::wait_router(&first, "two limited", |c| c.rate_limited == 2).await;
    assert_eq!(counters.naks, 0);
    first.shutdown(Duration::from_secs(10)).await.unwrap();

    // Another router, later: alice's bucket is still empty, carol's is her own.
    let second = rated_hub(&server, 3).await;
    let alices = support::attach_collect(&second, &alice).await;
    let bobs = support::attach_collect(&second, &bob).await;
    send(&second, &alice, &bob, "m6").await;
    send(&second, &carol, &bob, "c1").await;
    support::wait_for(&alices, 1).await;
    support::wait_for(&bobs, 1).await;
    let refused = rejections(&alices);
    assert_eq!(refused[0].rejected_id.as_ref().unwrap().as_str(), "m6");
    assert_eq!(refused[0].error.kind, WireErrorKind::RateLimited);
    assert_eq!(support::bodies(&bobs), ["c1"]);
    second.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_honours_retry_after() {
    let server = harness::run_server().await.unwrap();
    // 60 a minute: a burst of 60, then a token a second.
    let hub = rated_hub(&server, 60).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let bobs = support::attach_collect(&hub, &bob).await;
    for n in 0..61 {
        send(&hub, &alice, &bob, &format!("m{n}")).await;
    }
    support::wait_for(&alices, 1).await;
    let after = rejections(&alices)[0].retry_after_secs.unwrap();
    assert_eq!(after, 1);
    // Held: nothing is published until the second has passed; then it goes.
    let sent_at = std::time::Instant::now();
    let held = std::sync::atomic::AtomicU32::new(0);
    harness::wait_until_async("the hold to pass", support::DEADLINE, || async {
        match hub
            .send_envelope(&alice, &Channel::Inbox, &support::dm(&bob, "late"))
            .await
        {
            Ok(_) => true,
            Err(runtime::SystemError::Held {
                to,
                retry_after_secs,
                ..
            }) => {
                assert_eq!(to, None, "a rate limit holds every DM back");
                assert!(retry_after_secs <= after);
                held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            }
            Err(e) => panic!("{e}"),
        }
    })
    .await
    .unwrap();
    let held = held.into_inner();
    assert!(held > 0, "the send right after the refusal was held");
    assert!(sent_at.elapsed() < Duration::from_secs(5));
    support::wait_for(&bobs, 61).await;
    assert_eq!(support::bodies(&bobs).last().unwrap(), "late");
    let counters = support::router_counters(&hub).await;
    assert_eq!(counters.rate_limited, 1, "no held send reached the router");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_send_to_a_full_inbox_it_was_refused_by_exits_75_and_sends_nothing() {
    use support::oneshot::{assert_exit, one_stderr_line, run_cli};
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let bob = support::agent("bob");
    support::make_consumer(&hub, &bob).await;
    let url = server.url();
    let send_cli = |to: &'static str, text: &'static str| {
        let url = url.clone();
        async move {
            run_cli(&[
                "send",
                "--as",
                "alice",
                "--to",
                to,
                text,
                "--nats-url",
                &url,
            ])
            .await
        }
    };
    for n in 0..=CAP {
        let text: &'static str = Box::leak(format!("m{n}").into_boxed_str());
        assert_exit(&send_cli("bob", text).await, 0, "runtime send");
    }
    // The last one was refused; alice's inbox is not attached, but the hold is stored.
    support::wait_router(&hub, "the refusal", |c| c.refused_full == 1).await;
    let out = send_cli("bob", "again").await;
    assert_exit(&out, 75, "a held runtime send");
    let line = one_stderr_line(&out, "a held runtime send");
    assert!(
        line.contains("inbox of bob is full") && line.contains("s more"),
        "{line}"
    );
    // Nothing reached the ingress; a DM to someone else still goes.
    assert_exit(&send_cli("carol", "hi").await, 0, "runtime send to carol");
    let counters = support::wait_router(&hub, "carol's DM", |c| c.stored == CAP as u64 + 1).await;
    assert_eq!(
        counters.refused_full, 1,
        "the held send never reached the router"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
