//! The audit trail (issue 10 §7) against a real nats-server: every transition of a DM or a
//! task is one event in `HUB_AUDIT`, and `runtime trace <id>` prints the timeline in order,
//! with times after the first event and the process that emitted each. The transport ack
//! (`delivered`) and the application receipt (`read`) are separate events.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actors::inbox::Handled;
use protocol::attach::DurableInboxMode;
use protocol::subjects::Channel;
use protocol::QueueName;
use runtime::system::tasks::new_task;
use serde_json::Value;
use support::oneshot::{assert_exit, run_cli, stdout};

/// `runtime trace <id> --json`, once it holds `want` events (the trail is written without
/// waiting, so it may lag a moment).
async fn trace(url: &str, id: &str, want: usize) -> Vec<Value> {
    let rows = std::sync::Mutex::new(Vec::new());
    let got = harness::wait_until_async(
        &format!("{want} events of {id}"),
        support::DEADLINE,
        || async {
            let out = run_cli(&["trace", id, "--json", "--nats-url", url]).await;
            assert_exit(&out, 0, "runtime trace");
            let read: Vec<Value> = stdout(&out)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let enough = read.len() >= want;
            *rows.lock().unwrap() = read;
            enough
        },
    )
    .await;
    let rows = rows.into_inner().unwrap();
    got.unwrap_or_else(|e| panic!("{e}: {rows:#?}"));
    rows
}

fn events(rows: &[Value]) -> Vec<&str> {
    rows.iter().map(|r| r["event"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_trace_prints_a_dms_timeline_in_order_with_the_transport_ack_and_the_receipt_apart()
{
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let _alices = support::attach_collect(&hub, &alice).await;
    // Bob's handler asks to see it again once, then is done with it.
    let tries = Arc::new(AtomicU32::new(0));
    let seen = tries.clone();
    hub.attach_inbox(&bob, move |_| {
        let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                Handled::Retry(Duration::from_millis(200))
            } else {
                Handled::Done
            }
        }
    })
    .await
    .unwrap();
    let mut dm = support::dm(&bob, "m-traced");
    dm.meta
        .extra
        .insert(protocol::receipt::REQUIRES_ACK_FIELD.into(), true.into());
    hub.send_envelope(&alice, &Channel::Inbox, &dm)
        .await
        .unwrap();

    let rows = trace(&server.url(), "m-traced", 8).await;
    assert_eq!(
        events(&rows),
        [
            "accepted",
            "routed",
            "fetched",
            "nacked",
            "fetched",
            "redelivered",
            "delivered",
            "read"
        ],
        "{rows:#?}"
    );
    // Times from the first event, in order; who emitted each; the attempts.
    assert_eq!(rows[0]["after_ms"], 0);
    let after: Vec<u64> = rows
        .iter()
        .map(|r| r["after_ms"].as_u64().unwrap())
        .collect();
    assert!(after.windows(2).all(|w| w[0] <= w[1]), "{after:?}");
    assert!(after[4] >= 200, "the retry came after its delay: {after:?}");
    assert!(rows[0]["actor"].as_str().unwrap().starts_with("router:"));
    assert!(rows[1]["actor"].as_str().unwrap().starts_with("router:"));
    assert!(
        rows[2..].iter().all(|r| r["actor"] == "inbox:bob"),
        "{rows:#?}"
    );
    assert_eq!(rows[2]["attempt"], 1);
    assert_eq!(rows[4]["attempt"], 2);
    assert_eq!(rows[3]["details"]["delay_ms"], 200);
    assert!(rows[0]["details"]["ingress_seq"].is_u64());
    assert!(rows[1]["details"]["seq"].is_u64());
    // The text form: one line per event.
    let out = run_cli(&["trace", "m-traced", "--nats-url", &server.url()]).await;
    assert_exit(&out, 0, "runtime trace");
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 8, "{text}");
    assert!(
        text.lines()
            .next()
            .unwrap()
            .starts_with("+0 ms accepted by router:"),
        "{text}"
    );
    // An id nobody sent has no timeline.
    let out = run_cli(&["trace", "m-nobody", "--json", "--nats-url", &server.url()]).await;
    assert_exit(&out, 0, "runtime trace");
    assert_eq!(stdout(&out), "");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_trace_prints_a_tasks_timeline() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("traced").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = support::Counting::default();
    support::start_worker(
        &hub,
        "tw1",
        &queue,
        1,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let spec = new_task("trace me", Vec::new());
    let alice = support::agent("alice");
    hub.delegate(&alice, &queue, None, &spec).await.unwrap();
    let rows = trace(&server.url(), spec.task_id.as_str(), 4).await;
    let seen = events(&rows);
    assert_eq!(&seen[..2], ["accepted", "routed"], "{rows:#?}");
    assert!(seen[2..].contains(&"result_published"), "{rows:#?}");
    // The worker's result, as the router stored it on the task's channel.
    assert!(
        rows.iter()
            .any(|r| r["event"] == "state_changed" && r["details"]["state"] == "completed"),
        "{rows:#?}"
    );
    assert!(rows.iter().all(|r| r["task_id"] == spec.task_id.as_str()));
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_timeline_has_the_workers_fetch_and_the_idempotency_keys_hit() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("traced-idem").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = support::Counting::default();
    support::start_worker(
        &hub,
        "tw2",
        &queue,
        1,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let alice = support::agent("alice");
    let mut first = new_task("charge order 9", Vec::new());
    first.idempotency_key = Some("order-9".into());
    let mut retry = new_task("charge order 9", Vec::new());
    retry.idempotency_key = Some("order-9".into());
    let a = hub.delegate(&alice, &queue, None, &first).await.unwrap();
    // The retry comes once the result is stored (the handler's return alone does not order
    // the two: the worker publishes its result after).
    harness::wait_until_async("the result stored", support::DEADLINE, || async {
        let read = trace(&server.url(), a.task_id.as_str(), 1).await;
        read.iter().any(|r| r["event"] == "result_published")
    })
    .await
    .unwrap();
    let b = hub.delegate(&alice, &queue, None, &retry).await.unwrap();
    assert!(b.existing && b.task_id == a.task_id);
    // accepted, routed, fetched, deduplicated, and the result's events.
    let rows = std::sync::Mutex::new(Vec::new());
    let got = harness::wait_until_async(
        "the fetch and the hit in the trail",
        support::DEADLINE,
        || async {
            let read = trace(&server.url(), a.task_id.as_str(), 4).await;
            let has = |e: &str| read.iter().any(|r| r["event"] == e);
            let all = has("fetched") && has("deduplicated") && has("result_published");
            *rows.lock().unwrap() = read;
            all
        },
    )
    .await;
    let rows = rows.into_inner().unwrap();
    got.unwrap_or_else(|e| panic!("{e}: {rows:#?}"));
    let fetched: Vec<_> = rows.iter().filter(|r| r["event"] == "fetched").collect();
    assert_eq!(fetched.len(), 1, "{rows:#?}");
    assert_eq!(fetched[0]["actor"], "worker:tw2");
    assert_eq!(fetched[0]["attempt"], 1);
    assert!(fetched[0]["details"]["work_seq"].as_u64().is_some());
    let hit: Vec<_> = rows
        .iter()
        .filter(|r| r["event"] == "deduplicated")
        .collect();
    assert_eq!(hit.len(), 1, "{rows:#?}");
    assert_eq!(hit[0]["actor"], "agent:alice");
    assert_eq!(hit[0]["details"]["reason"], "idempotency key order-9");
    // In order: the router's accepted and routed before the worker's fetch.
    let seen = events(&rows);
    let at = |e: &str| seen.iter().position(|s| *s == e).unwrap();
    assert!(at("routed") < at("fetched"), "{rows:#?}");
    assert!(at("result_published") < at("deduplicated"), "{rows:#?}");
    assert_eq!(handler.total(), 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
