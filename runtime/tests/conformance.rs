//! The conformance suite (issue 10 §8): each test is named after the MUST test of section 16 of
//! the delivery-semantics design that it proves, where that test applies to us (the router and
//! streams play the gateway, the inbox consumer the sidecar). docs/CONFORMANCE.md maps every
//! test of that section to the test that proves it here or elsewhere, or says why it does not
//! apply. Every test runs against a real nats-server.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actors::inbox::Handled;
use protocol::attach::DurableInboxMode;
use protocol::subjects::{self, Channel};
use protocol::{AgentId, QueueName};
use runtime::system::tasks::new_task;
use runtime::ActorSystem;

async fn hub(server: &harness::NatsServer) -> ActorSystem {
    support::durable_hub(server, DurableInboxMode::On).await
}

fn seqs(seen: &support::Seen) -> Vec<u64> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|d| d.stream_seq.unwrap())
        .collect()
}

/// A DM of `from` as the router would store it in `to`'s inbox (`meta.from` stamped), with
/// `Nats-Msg-Id` `msg_id`: what a redelivery or a replay looks like to the inbox.
async fn store_in_inbox(
    js: &async_nats::jetstream::Context,
    from: &str,
    to: &AgentId,
    id: &str,
    msg_id: &str,
) -> u64 {
    let mut dm = support::dm(to, id);
    dm.meta.from = Some(support::agent(from));
    let payload = protocol::encode(&dm, protocol::Codec::Json).unwrap();
    support::js_publish(js, &subjects::inbox(to), msg_id, payload)
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_ack_after_durable_write() {
    // The inbox acks a DM only once its handler is done with it (our "durable write" is the
    // handler's), and the router acks the ingress only after the inbox stream stored it.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let release = Arc::new(tokio::sync::Notify::new());
    let (gate, handled) = (release.clone(), Arc::new(AtomicU32::new(0)));
    let count = handled.clone();
    hub.attach_inbox(&bob, move |_| {
        let (gate, count) = (gate.clone(), count.clone());
        async move {
            gate.notified().await;
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await
    .unwrap();
    hub.send_envelope(&alice, &Channel::Inbox, &support::dm(&bob, "m1"))
        .await
        .unwrap();
    let js = support::js(&server).await;
    // Stored and handed over, not acked: the handler is still at work.
    harness::wait_until_async("the DM handed over", support::DEADLINE, || async {
        support::consumer_backlog(&js, "HUB_INBOX", "inbox-bob").await == (0, 1)
    })
    .await
    .unwrap();
    assert_eq!(
        support::stream_messages(&js, "HUB_INGRESS").await,
        0,
        "routed, so the ingress acked"
    );
    release.notify_one();
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_deduped_by_msg_id() {
    // The same DM (same sender and meta.id) stored twice, as a redelivery past the dedupe window
    // would be: handed over once.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let bob = support::agent("bob");
    let seen = support::attach_collect(&hub, &bob).await;
    let js = support::js(&server).await;
    store_in_inbox(&js, "alice", &bob, "m1", "first-store").await;
    store_in_inbox(&js, "alice", &bob, "m1", "second-store").await;
    store_in_inbox(&js, "alice", &bob, "m2", "third-store").await;
    support::wait_for(&seen, 2).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(support::bodies(&seen), ["m1", "m2"]);
    let counters = hub.inbox_snapshot(&bob).await.unwrap().counters;
    assert_eq!(counters.duplicates, 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_by_stream_seq() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let seen = support::attach_collect(&hub, &bob).await;
    for n in 0..50 {
        hub.send_envelope(
            &alice,
            &Channel::Inbox,
            &support::dm(&bob, &format!("m{n}")),
        )
        .await
        .unwrap();
    }
    support::wait_for(&seen, 50).await;
    let seqs = seqs(&seen);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let bodies: Vec<String> = (0..50).map(|n| format!("m{n}")).collect();
    assert_eq!(support::bodies(&seen), bodies);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_flags_late_redelivery() {
    // The handler asks to see m1 again later; m2 and m3 go on; m1 comes back flagged.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let seen: support::Seen = Arc::default();
    let (sink, first) = (seen.clone(), Arc::new(AtomicU32::new(0)));
    hub.attach_inbox(&bob, move |d| {
        let retry =
            d.envelope.meta.id.as_str() == "m1" && first.fetch_add(1, Ordering::SeqCst) == 0;
        sink.lock().unwrap().push(d);
        async move {
            if retry {
                Handled::Retry(Duration::from_millis(300))
            } else {
                Handled::Done
            }
        }
    })
    .await
    .unwrap();
    for id in ["m1", "m2", "m3"] {
        hub.send_envelope(&alice, &Channel::Inbox, &support::dm(&bob, id))
            .await
            .unwrap();
    }
    support::wait_for(&seen, 4).await;
    let handed: Vec<actors::inbox::Delivery> = seen.lock().unwrap().clone();
    let ids: Vec<&str> = handed.iter().map(|d| d.envelope.meta.id.as_str()).collect();
    assert_eq!(ids, ["m1", "m2", "m3", "m1"]);
    let late = &handed[3];
    assert!(
        late.redelivered && late.out_of_order && late.delivered == 2,
        "{late:?}"
    );
    assert!(handed[..3]
        .iter()
        .all(|d| !d.redelivered && !d.out_of_order));
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_checked_before_present() {
    // A DM whose deadline passed while it waited in the inbox stream is never presented.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let bob = support::agent("bob");
    let js = support::js(&server).await;
    let mut late = support::dm(&bob, "m-late");
    late.meta.from = Some(support::agent("alice"));
    late.meta
        .set_expires_at(Some(protocol::expiry::now_ms() - 1));
    let payload = protocol::encode(&late, protocol::Codec::Json).unwrap();
    support::js_publish(&js, &subjects::inbox(&bob), "late", payload).await;
    store_in_inbox(&js, "alice", &bob, "m-live", "live").await;
    let seen = support::attach_collect(&hub, &bob).await;
    support::wait_for(&seen, 1).await;
    support::wait_settled(&js, "inbox-bob").await;
    assert_eq!(support::bodies(&seen), ["m-live"]);
    assert_eq!(hub.inbox_snapshot(&bob).await.unwrap().counters.expired, 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_uses_server_time() {
    // Bob's process clock runs 10 minutes ahead, carol's 10 minutes behind: each inbox
    // judges deadlines in the server's time (measured from its consumer's info), so bob still
    // gets a DM with a minute left and carol does not get one that expired a second ago.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let js = support::js(&server).await;
    let (bob, carol) = (support::agent("bob"), support::agent("carol"));
    actors::clock::skew_for_tests(&hub.inbox_name(&bob), 600_000);
    actors::clock::skew_for_tests(&hub.inbox_name(&carol), -600_000);
    let now = protocol::expiry::now_ms();
    for (to, id, expires_at) in [
        (&bob, "m-minute-left", now + 60_000),
        (&bob, "m-no-deadline", 0),
        (&carol, "m-just-expired", now - 1_000),
        (&carol, "m-no-deadline", 0),
    ] {
        let mut dm = support::dm(to, id);
        dm.meta.from = Some(support::agent("alice"));
        dm.meta
            .set_expires_at((expires_at > 0).then_some(expires_at));
        let payload = protocol::encode(&dm, protocol::Codec::Json).unwrap();
        let dedupe = format!("{to}-{id}");
        support::js_publish(&js, &subjects::inbox(to), &dedupe, payload).await;
    }
    let seen_bob = support::attach_collect(&hub, &bob).await;
    let seen_carol = support::attach_collect(&hub, &carol).await;
    support::wait_for(&seen_bob, 2).await;
    support::wait_for(&seen_carol, 1).await;
    support::wait_settled(&js, "inbox-carol").await;
    assert_eq!(
        support::bodies(&seen_bob),
        ["m-minute-left", "m-no-deadline"]
    );
    assert_eq!(support::bodies(&seen_carol), ["m-no-deadline"]);
    let (b, c) = (
        hub.inbox_snapshot(&bob).await.unwrap(),
        hub.inbox_snapshot(&carol).await.unwrap(),
    );
    assert_eq!((b.counters.expired, c.counters.expired), (0, 1));
    // What each measured: the server's clock 10 minutes behind bob's, ahead of carol's.
    let (ob, oc) = (b.clock_offset_ms.unwrap(), c.clock_offset_ms.unwrap());
    assert!((ob + 600_000).abs() < 2_000, "{ob}");
    assert!((oc - 600_000).abs() < 2_000, "{oc}");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_skew() {
    // `runtime doctor` compares this host's clock with the server's: in step it exits 0; a
    // clock a minute ahead is `clock_skew` (exit 1), as an operator's and as an agent's.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let bob = support::agent("bob");
    support::make_consumer(&hub, &bob).await;
    let url = server.url();
    let report = |out: &std::process::Output| -> serde_json::Value {
        serde_json::from_str(support::oneshot::stdout(out).trim()).unwrap()
    };
    let out = support::oneshot::run_cli(&["doctor", "--nats-url", &url]).await;
    support::oneshot::assert_exit(&out, 0, "runtime doctor");
    let r = report(&out);
    assert_eq!(r["clock"], "ok", "{r}");
    assert!(r["clock_offset_ms"].as_i64().unwrap().abs() < 1_000, "{r}");
    for args in [
        vec!["doctor", "--nats-url", url.as_str()],
        vec!["doctor", "--agent", "bob", "--nats-url", url.as_str()],
    ] {
        let out = support::oneshot::run_cli_env(&args, &[("RUNTIME_CLOCK_SKEW_MS", "60000")]).await;
        support::oneshot::assert_exit(&out, 1, "runtime doctor, skewed");
        let r = report(&out);
        assert_eq!(r["clock"], "skewed", "{r}");
        assert!(
            (r["clock_offset_ms"].as_i64().unwrap() + 60_000).abs() < 1_000,
            "{r}"
        );
        let err = support::oneshot::one_stderr_line(&out, "runtime doctor, skewed");
        assert!(err.contains("clock_skew"), "{err}");
    }
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_measures_a_hub_whose_streams_are_renamed() {
    // A hub whose streams are not HUB_INGRESS and HUB_INBOX: `runtime doctor` takes their names
    // from the router's delivery config, as an operator and as an agent. Without the config it
    // looks for the default ingress, which this broker does not have, and says so.
    let server = harness::run_server().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delivery.json");
    std::fs::write(
        &path,
        r#"{"ingress": {"name": "ALT_INGRESS"}, "inbox": {"name": "ALT_INBOX"}}"#,
    )
    .unwrap();
    let delivery = runtime::config::load_delivery_config(Some(&path)).unwrap();
    assert_eq!(delivery.ingress.name, "ALT_INGRESS");
    let hub = ActorSystem::builder()
        .nats(runtime::NatsSettings::new(server.url()))
        .durable(true)
        .delivery_config(delivery)
        .build()
        .await
        .unwrap();
    hub.start_router().await.unwrap();
    let bob = support::agent("bob");
    support::make_consumer(&hub, &bob).await;
    let (url, config) = (server.url(), path.to_str().unwrap().to_owned());
    for args in [
        vec!["doctor", "--delivery-config", &config, "--nats-url", &url],
        vec![
            "doctor",
            "--agent",
            "bob",
            "--delivery-config",
            &config,
            "--nats-url",
            &url,
        ],
    ] {
        let out = support::oneshot::run_cli(&args).await;
        support::oneshot::assert_exit(&out, 0, "runtime doctor, renamed streams");
        let r: serde_json::Value =
            serde_json::from_str(support::oneshot::stdout(&out).trim()).unwrap();
        assert_eq!(r["clock"], "ok", "{r}");
    }
    let out = support::oneshot::run_cli(&["doctor", "--nats-url", &url]).await;
    assert_ne!(
        out.status.code(),
        Some(0),
        "the default ingress is not there"
    );
    support::oneshot::one_stderr_line(&out, "runtime doctor, default names");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_drains_in_order_after_reconnect() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    // Bob has been attached before, and is offline now.
    support::make_consumer(&hub, &bob).await;
    for n in 0..500 {
        hub.send_envelope(
            &alice,
            &Channel::Inbox,
            &support::dm(&bob, &format!("m{n}")),
        )
        .await
        .unwrap();
    }
    let js = support::js(&server).await;
    harness::wait_until_async("500 queued", support::DEADLINE, || async {
        support::count_on(&js, "HUB_INBOX", &subjects::inbox(&bob)).await == 500
    })
    .await
    .unwrap();
    let seen = support::attach_collect(&hub, &bob).await;
    support::wait_for(&seen, 500).await;
    let bodies: Vec<String> = (0..500).map(|n| format!("m{n}")).collect();
    assert_eq!(support::bodies(&seen), bodies);
    let seqs = seqs(&seen);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_retries_with_same_id() {
    // A send whose receipt was lost is sent again with the same meta.id: stored once.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let seen = support::attach_collect(&hub, &bob).await;
    let dm = support::dm(&bob, "m-retried");
    let first = hub
        .send_envelope(&alice, &Channel::Inbox, &dm)
        .await
        .unwrap();
    let again = hub
        .send_envelope(&alice, &Channel::Inbox, &dm)
        .await
        .unwrap();
    assert_eq!((first.duplicate, again.duplicate), (false, true));
    assert_eq!(first.ingress_seq, again.ingress_seq);
    hub.send_envelope(&alice, &Channel::Inbox, &support::dm(&bob, "m-next"))
        .await
        .unwrap();
    support::wait_for(&seen, 2).await;
    assert_eq!(support::bodies(&seen), ["m-retried", "m-next"]);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_rejects_oversized_inline() {
    // A 2 MiB body is refused before anything is sent.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let mut big = support::dm(&bob, "m-big");
    big.body = serde_json::Value::String("x".repeat(2 * 1024 * 1024));
    let refused = hub.send_envelope(&alice, &Channel::Inbox, &big).await;
    assert!(
        matches!(refused, Err(runtime::SystemError::Publish { .. })),
        "{refused:?}"
    );
    let js = support::js(&server).await;
    assert_eq!(support::stream_messages(&js, "HUB_INGRESS").await, 0);
    assert_eq!(
        support::router_counters(&hub).await.malformed,
        0,
        "nothing reached the router"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_uses_idempotency_key() {
    // A retried task request reuses its key and gets the existing task id: one task runs.
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let queue = QueueName::new("idem-c").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = support::Counting::default();
    support::start_worker(
        &hub,
        "cw1",
        &queue,
        1,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let alice = support::agent("alice");
    let mut first = new_task("charge order 7", Vec::new());
    first.idempotency_key = Some("order-7".into());
    let mut retry = new_task("charge order 7", Vec::new());
    retry.idempotency_key = Some("order-7".into());
    let a = hub.delegate(&alice, &queue, None, &first).await.unwrap();
    let b = hub.delegate(&alice, &queue, None, &retry).await.unwrap();
    assert_eq!(a.task_id, b.task_id);
    assert!(!a.existing && b.existing);
    harness::wait_until("the task ran", support::DEADLINE, || handler.total() == 1)
        .await
        .unwrap();
    // Still once, a moment later, with nothing left to run.
    let js = support::js(&server).await;
    harness::wait_until_async("the work stream empty", support::DEADLINE, || async {
        support::stream_messages(&js, "HUB_WORK").await == 0
    })
    .await
    .unwrap();
    assert_eq!(handler.total(), 1);
    assert_eq!(handler.runs(retry.task_id.as_str()), 0);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Attaches bob's inbox with a handler that counts its handoffs of `m-ack` and, for each,
/// waits for `gate`; returns the count.
async fn attach_gated(
    hub: &ActorSystem,
    bob: &AgentId,
    gate: Arc<tokio::sync::Notify>,
) -> Arc<AtomicU32> {
    let handled = Arc::new(AtomicU32::new(0));
    let count = handled.clone();
    hub.attach_inbox(bob, move |d| {
        let (gate, count) = (gate.clone(), count.clone());
        let ours = d.envelope.meta.id.as_str() == "m-ack";
        async move {
            if ours {
                count.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
            }
        }
    })
    .await
    .unwrap();
    handled
}

/// Alice sends bob the DM `m-ack`, asking for a read receipt.
async fn send_requiring_ack(hub: &ActorSystem, alice: &AgentId, bob: &AgentId) {
    let mut dm = support::dm(bob, "m-ack");
    dm.meta.extra.insert(
        protocol::receipt::REQUIRES_ACK_FIELD.into(),
        serde_json::Value::Bool(true),
    );
    hub.send_envelope(alice, &Channel::Inbox, &dm)
        .await
        .unwrap();
}

/// The read receipts for `m-ack` among what alice's handler saw.
fn receipts_of_m_ack(alices: &support::Seen) -> usize {
    let read = serde_json::json!({"receipt": {"kind": "read", "message_id": "m-ack"}});
    alices
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.envelope.body == read)
        .count()
}

/// A hub on `server` with alice attached and bob's handler holding alice's DM that requires
/// an ack until `release` is notified: (hub, bob, alice's deliveries, release, handoffs).
async fn handed_over_requiring_ack(
    server: &harness::NatsServer,
) -> (
    ActorSystem,
    AgentId,
    support::Seen,
    Arc<tokio::sync::Notify>,
    Arc<AtomicU32>,
) {
    let hub = hub(server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let handled = attach_gated(&hub, &bob, release.clone()).await;
    send_requiring_ack(&hub, &alice, &bob).await;
    harness::wait_until("the DM handed over", support::DEADLINE, || {
        handled.load(Ordering::SeqCst) == 1
    })
    .await
    .unwrap();
    (hub, bob, alices, release, handled)
}

/// After the broker is back: alice gets exactly one receipt for `m-ack` (one stored in her
/// inbox), bob's handler saw `m-ack` once, and bob's outbox is empty.
async fn one_receipt_and_one_handoff(
    server: &harness::NatsServer,
    hub: &ActorSystem,
    alices: &support::Seen,
    handled: &AtomicU32,
) {
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    harness::wait_until("alice's receipt", support::DEADLINE, || {
        receipts_of_m_ack(alices) >= 1
    })
    .await
    .unwrap();
    let counters = support::wait_inbox(hub, &bob, "the outbox emptied", |c| {
        c.receipts == 1 && c.receipts_pending == 0
    })
    .await;
    assert_eq!(
        (counters.receipts_failed, counters.receipts_dropped),
        (1, 0),
        "{counters:?}"
    );
    assert!(counters.receipts_retried >= 1, "{counters:?}");
    let js = support::js(server).await;
    support::wait_settled(&js, "inbox-bob").await;
    support::wait_settled(&js, "inbox-alice").await;
    assert_eq!(receipts_of_m_ack(alices), 1, "one receipt handed to alice");
    assert_eq!(
        support::count_on(&js, "HUB_INBOX", &subjects::inbox(&alice)).await,
        1,
        "one receipt stored in alice's inbox"
    );
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "bob's handler saw the DM once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_outbox_survives_gateway_outage() {
    // A read receipt generated while the broker is down waits in bob's outbox and is
    // delivered once the broker is back on its store: alice gets exactly one, and bob's
    // handler sees the DM once (a redelivery after the restart is deduplicated).
    let mut server = harness::run_server().await.unwrap();
    let (hub, bob, alices, release, handled) = handed_over_requiring_ack(&server).await;
    // The broker is killed while the handler works; then the handler is done.
    server.stop().await;
    release.notify_one();
    support::wait_inbox(&hub, &bob, "the receipt pending in the outbox", |c| {
        c.receipts_pending == 1
    })
    .await;
    server.start().await.unwrap();
    one_receipt_and_one_handoff(&server, &hub, &alices, &handled).await;
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_outbox_resends_a_receipt_lost_with_its_connection() {
    // The receipt is published to a broker that hangs (its store ack never comes), which is
    // then killed: what the client wrote to that connection is gone, so only a retry from the
    // outbox delivers it once the broker is back.
    let mut server = harness::run_server().await.unwrap();
    let (hub, bob, alices, release, handled) = handed_over_requiring_ack(&server).await;
    let probe = server.client().await.unwrap();
    server.freeze();
    harness::wait_until_async("the broker hangs", support::DEADLINE, || async {
        let info = probe.request("$JS.API.INFO", Vec::new().into());
        tokio::time::timeout(Duration::from_millis(500), info)
            .await
            .is_err()
    })
    .await
    .unwrap();
    release.notify_one();
    // The first send waits for its store ack in vain (the publish timeout), then the receipt
    // waits in the outbox.
    support::wait_inbox(&hub, &bob, "the receipt pending in the outbox", |c| {
        c.receipts_pending == 1
    })
    .await;
    server.stop().await;
    server.start().await.unwrap();
    one_receipt_and_one_handoff(&server, &hub, &alices, &handled).await;
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
