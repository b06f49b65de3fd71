//! What an inbox handler makes of a DM (issue 10 §2 and §5) against a real nats-server: done
//! (acked), retry after a delay (nak'd, handed over again flagged `redelivered` and, behind
//! later DMs, `out_of_order`), or reject (terminated at once, never handed over again); a DM
//! rejected, or whose deliveries ran out, is dead-lettered and its sender told.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::attach::DurableInboxMode;
use runtime::ActorSystem;
use runtime::{Delivery, Handled};

/// A hub whose inbox consumers deliver a DM at most 3 times, with no backoff.
async fn hub_with_max_deliver(server: &harness::NatsServer) -> ActorSystem {
    let delivery = protocol::config::DeliveryConfig {
        inbox_max_deliver: 3,
        ..support::delivery()
    };
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    hub
}

/// The dead letters stored for `to`: (reason, deliveries, original seq, envelope).
async fn dead_letters(
    js: &async_nats::jetstream::Context,
    to: &str,
) -> Vec<(String, u64, u64, protocol::Envelope)> {
    support::stored_on(js, "HUB_DLQ", &format!("dlq.{to}"))
        .await
        .into_iter()
        .map(|m| {
            let header = |name: &str| m.headers.get(name).unwrap().as_str().to_owned();
            (
                header(protocol::headers::DLQ_REASON),
                header(protocol::headers::DLQ_DELIVERIES).parse().unwrap(),
                header(protocol::headers::DLQ_ORIGINAL_SEQ).parse().unwrap(),
                protocol::decode(&m.payload, protocol::Codec::Json).unwrap(),
            )
        })
        .collect()
}

/// One handoff as the handler saw it: (id, stream seq, redelivered, out_of_order).
type Handoff = (String, u64, bool, bool);

/// Attaches `bob`'s inbox with a handler that records each handoff and answers `decide` of it.
async fn attach(
    hub: &ActorSystem,
    decide: impl Fn(&Delivery) -> Handled + Send + Sync + 'static,
) -> Arc<Mutex<Vec<Handoff>>> {
    let seen: Arc<Mutex<Vec<Handoff>>> = Arc::default();
    let sink = seen.clone();
    hub.attach_inbox(&support::agent("bob"), move |d| {
        sink.lock().unwrap().push((
            d.envelope.meta.id.to_string(),
            d.stream_seq.unwrap_or(0),
            d.redelivered,
            d.out_of_order,
        ));
        let handled = decide(&d);
        async move { handled }
    })
    .await
    .unwrap();
    seen
}

async fn wait_handoffs(seen: &Arc<Mutex<Vec<Handoff>>>, n: usize) {
    harness::wait_until(&format!("{n} handoffs"), support::DEADLINE, || {
        seen.lock().unwrap().len() >= n
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", seen.lock().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dm_comes_back_after_later_ones_flagged_redelivered_and_out_of_order() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let alice = support::agent("alice");
    let seen = attach(&hub, |d| {
        if d.envelope.meta.id.as_str() == "m1" && !d.redelivered {
            Handled::Retry(Duration::from_millis(500))
        } else {
            Handled::Done
        }
    })
    .await;
    for id in ["m1", "m2", "m3"] {
        let env = support::dm(&support::agent("bob"), id);
        hub.send_envelope(&alice, &protocol::Channel::Inbox, &env)
            .await
            .unwrap();
    }
    wait_handoffs(&seen, 4).await;
    let js = support::js(&server).await;
    support::wait_settled(&js, "inbox-bob").await;
    let handoffs = seen.lock().unwrap().clone();
    assert_eq!(handoffs.len(), 4, "{handoffs:?}");
    // In stream order first, m1 not yet redelivered...
    assert_eq!(
        handoffs[..3]
            .iter()
            .map(|h| (h.0.as_str(), h.2, h.3))
            .collect::<Vec<_>>(),
        [
            ("m1", false, false),
            ("m2", false, false),
            ("m3", false, false)
        ]
    );
    // ...then m1 again, behind them: redelivered, out of order.
    let (id, seq, redelivered, out_of_order) = &handoffs[3];
    assert_eq!(
        (id.as_str(), *seq, *redelivered, *out_of_order),
        ("m1", handoffs[0].1, true, true)
    );
    let snapshot = hub.inbox_snapshot(&support::agent("bob")).await.unwrap();
    assert_eq!(
        (snapshot.counters.retried, snapshot.counters.out_of_order),
        (1, 1),
        "{snapshot:?}"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_dm_is_terminated_at_once_and_never_handed_over_again() {
    let server = harness::run_server().await.unwrap();
    let hub = hub_with_max_deliver(&server).await;
    let alices = support::attach_collect(&hub, &support::agent("alice")).await;
    let seen = attach(&hub, |d| match d.envelope.meta.id.as_str() {
        "m-bad" => Handled::Reject("cannot parse this\nat all".into()),
        _ => Handled::Done,
    })
    .await;
    let client = hub.client().clone();
    support::send_dm(&client, "alice", "bob", "m-bad").await;
    support::send_dm(&client, "alice", "bob", "m-good").await;
    wait_handoffs(&seen, 2).await;
    let js = support::js(&server).await;
    support::wait_settled(&js, "inbox-bob").await;
    // Nothing pending and nothing awaiting an ack: the rejected DM was terminated, not left to
    // come back after the ack wait.
    let ids: Vec<String> = seen.lock().unwrap().iter().map(|h| h.0.clone()).collect();
    assert_eq!(ids, ["m-bad", "m-good"]);
    let snapshot = hub.inbox_snapshot(&support::agent("bob")).await.unwrap();
    assert_eq!(snapshot.counters.rejected, 1, "{snapshot:?}");
    // Dead-lettered with the handler's reason (one line), and alice is told.
    support::wait_for(&alices, 1).await;
    let notice = protocol::rejection::parse_notice(&alices.lock().unwrap()[0].envelope).unwrap();
    assert_eq!(
        (notice.kind.as_str(), notice.message_id.as_str()),
        ("undeliverable", "m-bad")
    );
    assert_eq!(
        notice.reason.as_deref(),
        Some("rejected: cannot parse this at all")
    );
    let dlq = dead_letters(&js, "bob").await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let (reason, deliveries, _, env) = &dlq[0];
    assert_eq!(
        (reason.as_str(), *deliveries),
        ("rejected: cannot parse this at all", 1)
    );
    assert_eq!(env.meta.id.as_str(), "m-bad");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_whose_deliveries_run_out_is_dead_lettered_and_its_sender_told() {
    let server = harness::run_server().await.unwrap();
    let hub = hub_with_max_deliver(&server).await;
    let alices = support::attach_collect(&hub, &support::agent("alice")).await;
    // Bob's handler never gets past m-stuck.
    let seen = attach(&hub, |d| match d.envelope.meta.id.as_str() {
        "m-stuck" => Handled::Retry(Duration::from_millis(50)),
        _ => Handled::Done,
    })
    .await;
    let client = hub.client().clone();
    support::send_dm(&client, "alice", "bob", "m-stuck").await;
    support::send_dm(&client, "alice", "bob", "m-after").await;
    support::wait_for(&alices, 1).await;
    let notice = protocol::rejection::parse_notice(&alices.lock().unwrap()[0].envelope).unwrap();
    assert_eq!(
        (
            notice.kind.as_str(),
            notice.message_id.as_str(),
            notice.reason.as_deref()
        ),
        ("undeliverable", "m-stuck", Some("max_deliver"))
    );
    let js = support::js(&server).await;
    let dlq = dead_letters(&js, "bob").await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let (reason, deliveries, seq, env) = &dlq[0];
    assert_eq!((reason.as_str(), *deliveries), ("max_deliver", 3));
    assert_eq!(*seq, notice.inbox_seq);
    assert_eq!(env.meta.id.as_str(), "m-stuck");
    // It was handed over exactly 3 times, and the next DM went on being delivered.
    wait_handoffs(&seen, 4).await;
    let stuck = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.0 == "m-stuck")
        .count();
    assert_eq!(stuck, 3);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_dlq_lists_replays_and_discards_dead_letters() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let hub = hub_with_max_deliver(&server).await;
    // Bob rejects m-once the first time it comes, and m-never always.
    let rejected_once = Arc::new(Mutex::new(false));
    let flag = rejected_once.clone();
    let seen = attach(&hub, move |d| match d.envelope.meta.id.as_str() {
        "m-once" if !std::mem::replace(&mut *flag.lock().unwrap(), true) => {
            Handled::Reject("not today".into())
        }
        "m-never" => Handled::Reject("never".into()),
        _ => Handled::Done,
    })
    .await;
    let client = hub.client().clone();
    support::send_dm(&client, "alice", "bob", "m-once").await;
    support::send_dm(&client, "alice", "bob", "m-never").await;
    let js = support::js(&server).await;
    harness::wait_until_async("two dead letters", support::DEADLINE, || async {
        dead_letters(&js, "bob").await.len() == 2
    })
    .await
    .unwrap();
    // `runtime dlq --nats-url <url> <args…>`.
    let cli = |args: Vec<String>| {
        let url = url.clone();
        async move {
            let mut all = vec!["dlq".to_owned(), "--nats-url".to_owned(), url];
            all.extend(args);
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            support::oneshot::run_cli(&all).await
        }
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let listed = |out: &std::process::Output| -> Vec<serde_json::Value> {
        support::oneshot::stdout(out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let out = cli(args(&["list", "--agent", "bob", "--json"])).await;
    support::oneshot::assert_exit(&out, 0, "dlq list");
    let letters = listed(&out);
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0]["message_id"], "m-once");
    assert_eq!(letters[0]["reason"], "rejected: not today");
    assert_eq!(letters[0]["from"], "alice");
    assert_eq!(letters[1]["message_id"], "m-never");
    let (once, never) = (
        letters[0]["id"].as_u64().unwrap().to_string(),
        letters[1]["id"].as_u64().unwrap().to_string(),
    );
    // Replayed: bob gets m-once again (same meta.id), and takes it this time.
    let out = cli(args(&["replay", &once])).await;
    support::oneshot::assert_exit(&out, 0, "dlq replay");
    wait_handoffs(&seen, 3).await;
    let ids: Vec<String> = seen.lock().unwrap().iter().map(|h| h.0.clone()).collect();
    assert_eq!(ids, ["m-once", "m-never", "m-once"]);
    // Discarded: gone; and what is not there is a usage error.
    let out = cli(args(&["discard", &never])).await;
    support::oneshot::assert_exit(&out, 0, "dlq discard");
    let out = cli(args(&["list", "--json"])).await;
    assert!(
        listed(&out).is_empty(),
        "{}",
        support::oneshot::stdout(&out)
    );
    let out = cli(args(&["discard", &never])).await;
    support::oneshot::assert_exit(&out, 64, "discard of a dead letter that is not there");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_between_the_advisory_and_the_dead_letter_copy_loses_nothing() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = support::processes::Scene::new(0);
    let router_args = |scene: &support::processes::Scene| {
        vec![
            "start".to_owned(),
            "--role".into(),
            "router".into(),
            "--durable".into(),
            "--nats-url".into(),
            url.clone(),
            "--delivery-config".into(),
            scene.config(),
        ]
    };
    // Router 1 dies (as with kill -9) once it took the advisory, before the copy.
    let mut first = harness::RuntimeProcess::spawn(
        router_args(&scene),
        &[
            ("RUST_LOG", "warn"),
            ("RUNTIME_FAULTS", "sys1/expiry@dead_letter=exit"),
        ],
    )
    .unwrap();
    // Bob and alice in their own process, which runs no router.
    let agents = support::system(url.clone(), true, DurableInboxMode::On).await;
    support::wait_router_answers(agents.client()).await;
    let alices = support::attach_collect(&agents, &support::agent("alice")).await;
    let seen = attach(&agents, |_| Handled::Reject("no".into())).await;
    support::send_dm(agents.client(), "alice", "bob", "m-bad").await;
    wait_handoffs(&seen, 1).await;
    first
        .wait_exit(support::DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("router 1 did not die: {e}\n{}", first.log()));
    let js = support::js(&server).await;
    assert!(
        dead_letters(&js, "bob").await.is_empty(),
        "nothing copied yet"
    );
    // Router 2 takes the advisory again (its ack never came) and copies the dead letter.
    let second =
        harness::RuntimeProcess::spawn(router_args(&scene), &[("RUST_LOG", "warn")]).unwrap();
    support::wait_for(&alices, 1).await;
    harness::wait_until_async("the advisory settled", support::DEADLINE, || async {
        support::stream_messages(&js, "HUB_ADVISORIES").await == 0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", second.log()));
    let dlq = dead_letters(&js, "bob").await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0].3.meta.id.as_str(), "m-bad");
    let notices: Vec<_> = alices
        .lock()
        .unwrap()
        .iter()
        .filter_map(|d| protocol::rejection::parse_notice(&d.envelope))
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].kind, "undeliverable");
    agents.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_that_requires_ack_gets_a_read_receipt_once_its_handler_is_done() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let seen = attach(&hub, |_| Handled::Done).await;
    for (id, requires_ack) in [("m-plain", false), ("m-ack", true)] {
        let mut env = support::dm(&bob, id);
        if requires_ack {
            env.meta.extra.insert(
                protocol::receipt::REQUIRES_ACK_FIELD.into(),
                serde_json::Value::Bool(true),
            );
        }
        hub.send_envelope(&alice, &protocol::Channel::Inbox, &env)
            .await
            .unwrap();
    }
    wait_handoffs(&seen, 2).await;
    // Alice gets one receipt, from bob, for the DM that asked.
    support::wait_for(&alices, 1).await;
    let receipt = alices.lock().unwrap()[0].envelope.clone();
    assert_eq!(
        receipt.meta.from.as_ref().unwrap(),
        &bob,
        "stamped by the router"
    );
    assert_eq!(
        receipt.body,
        serde_json::json!({"receipt": {"kind": "read", "message_id": "m-ack"}})
    );
    let js = support::js(&server).await;
    support::wait_settled(&js, "inbox-alice").await;
    assert_eq!(
        alices.lock().unwrap().len(),
        1,
        "no receipt for the plain DM"
    );
    let snapshot = hub.inbox_snapshot(&bob).await.unwrap();
    assert_eq!(snapshot.counters.receipts, 1, "{snapshot:?}");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_keeps_its_dm_with_heartbeats_and_it_is_not_redelivered() {
    let server = harness::run_server().await.unwrap();
    // A 1 s ack wait, and a backoff of 1 s: without heartbeats, a 3 s handler would see its DM
    // come back and, after 3 deliveries, dead-lettered.
    let delivery = protocol::config::DeliveryConfig {
        inbox_max_deliver: 3,
        inbox_backoff_secs: vec![1, 1],
        ..support::delivery()
    };
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    let seen: Arc<Mutex<Vec<Handoff>>> = Arc::default();
    let sink = seen.clone();
    hub.attach_inbox(&support::agent("bob"), move |d| {
        sink.lock().unwrap().push((
            d.envelope.meta.id.to_string(),
            d.stream_seq.unwrap_or(0),
            d.redelivered,
            d.out_of_order,
        ));
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Handled::Done
        }
    })
    .await
    .unwrap();
    support::send_dm(hub.client(), "alice", "bob", "m-slow").await;
    let js = support::js(&server).await;
    wait_handoffs(&seen, 1).await;
    support::wait_settled(&js, "inbox-bob").await;
    let handoffs = seen.lock().unwrap().clone();
    assert_eq!(handoffs.len(), 1, "{handoffs:?}");
    assert!(!handoffs[0].2, "not a redelivery");
    assert!(dead_letters(&js, "bob").await.is_empty());
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_termination_forged_on_another_inbox_s_dm_dead_letters_nothing() {
    let server = harness::run_server().await.unwrap();
    let hub = hub_with_max_deliver(&server).await;
    let alices = support::attach_collect(&hub, &support::agent("alice")).await;
    // Bob's DM, stored and read.
    let seen = attach(&hub, |_| Handled::Done).await;
    support::send_dm(hub.client(), "alice", "bob", "m-bobs").await;
    wait_handoffs(&seen, 1).await;
    let bobs_seq = seen.lock().unwrap()[0].1;
    // Mallory, with a consumer of her own, terminates "her" delivery of bob's DM: the sequence
    // in an ack subject is the client's to choose, and nats-server does not check it.
    let reply = hub
        .client()
        .request(
            protocol::subjects::attach_request(&support::agent("mallory")),
            "{}".into(),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&reply.payload).contains("inbox-mallory"));
    let js = support::js(&server).await;
    for reason in ["rejected: x", "expired"] {
        hub.client()
            .publish(
                format!("$JS.ACK.HUB_INBOX.inbox-mallory.1.{bobs_seq}.1.0.0"),
                format!("+TERM {reason}").into(),
            )
            .await
            .unwrap();
    }
    hub.client().flush().await.unwrap();
    // Both advisories captured and taken by the router's `advisories` consumer.
    harness::wait_until_async("the advisories taken", support::DEADLINE, || async {
        let stream = js.get_stream("HUB_ADVISORIES").await.unwrap();
        let info = stream.consumer_info("advisories").await.unwrap();
        info.delivered.stream_sequence >= 2 && info.num_pending == 0 && info.num_ack_pending == 0
    })
    .await
    .unwrap();
    // Nothing of bob's DM was dead-lettered, and alice was told nothing.
    assert!(dead_letters(&js, "bob").await.is_empty());
    support::wait_settled(&js, "inbox-alice").await;
    assert!(
        alices.lock().unwrap().is_empty(),
        "alice was told something"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// The router's pull of the advisories (which say a DM was rejected) never reaches the broker:
/// once it has been silent past two idle heartbeats the expiry actor fails and its restart
/// pulls anew, so the dead letter and the sender's notice come within about 10 s, not 35 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_pull_of_the_advisories_delays_a_dead_letter_by_seconds_not_by_the_pulls_expiry() {
    let server = harness::run_server().await.unwrap();
    let proxy = harness::Proxy::start(server.port()).await.unwrap();
    proxy.lose_next("$JS.API.CONSUMER.MSG.NEXT.HUB_ADVISORIES.", 1);
    let router_host =
        support::system_with(proxy.url(), true, DurableInboxMode::On, support::delivery()).await;
    router_host.start_router().await.unwrap();
    harness::wait_until("the advisories' first pull lost", support::DEADLINE, || {
        proxy.lost() == 1
    })
    .await
    .unwrap();
    let hub = support::system_with(
        server.url(),
        true,
        DurableInboxMode::On,
        support::delivery(),
    )
    .await;
    let alices = support::attach_collect(&hub, &support::agent("alice")).await;
    let _seen = attach(&hub, |_| Handled::Reject("not wanted".into())).await;
    let sent = std::time::Instant::now();
    support::send_dm(hub.client(), "alice", "bob", "m-rejected").await;
    harness::wait_until("alice told", Duration::from_secs(20), || {
        !alices.lock().unwrap().is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e} ({:?} after the send)", sent.elapsed()));
    let notice = protocol::rejection::parse_notice(&alices.lock().unwrap()[0].envelope).unwrap();
    assert_eq!(
        (notice.kind.as_str(), notice.message_id.as_str()),
        ("undeliverable", "m-rejected")
    );
    let js = support::js(&server).await;
    assert_eq!(dead_letters(&js, "bob").await.len(), 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
    router_host.shutdown(Duration::from_secs(10)).await.unwrap();
}
