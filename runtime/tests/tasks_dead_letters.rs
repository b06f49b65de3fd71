//! Dead letters of tasks (issue 10 §2) against a real nats-server: a task input that workers
//! keep handing back leaves the work queue for the dead-letter stream after `task_max_deliver`
//! deliveries, instead of looping for ever, and an answer no worker takes within
//! `answer_max_wait_secs` (its worker is gone) leaves the answers stream the same way; the
//! sender is told each time.

mod support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures::StreamExt;
use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::QueueName;
use runtime::system::tasks::new_task;
use support::oneshot::{assert_exit, run_cli, stdout};

/// Waits until the router made consumer `name` on `stream`, and returns it.
async fn wait_consumer(js: &jetstream::Context, stream: &str, name: &str) -> PullConsumer {
    harness::wait_until_async(&format!("consumer {name}"), support::DEADLINE, || async {
        let stream = js.get_stream(stream).await.unwrap();
        stream
            .get_consumer::<jetstream::consumer::pull::Config>(name)
            .await
            .is_ok()
    })
    .await
    .unwrap();
    js.get_stream(stream)
        .await
        .unwrap()
        .get_consumer(name)
        .await
        .unwrap()
}

/// `runtime dlq list --json`.
async fn dead_letters(server: &harness::NatsServer) -> Vec<serde_json::Value> {
    let out = run_cli(&["dlq", "--nats-url", &server.url(), "list", "--json"]).await;
    assert_exit(&out, 0, "runtime dlq list");
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_input_handed_back_task_max_deliver_times_is_dead_lettered_and_its_delegator_told() {
    let server = harness::run_server().await.unwrap();
    let delivery = DeliveryConfig {
        task_max_deliver: 3,
        ..support::delivery()
    };
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    let alice = support::agent("alice");
    let alices = support::attach_collect(&hub, &alice).await;
    let queue = QueueName::new("poison").unwrap();
    let spec = new_task("never runs", Vec::new());
    let receipt = hub.delegate(&alice, &queue, None, &spec).await.unwrap();
    // A worker of the queue that cannot take it: every delivery is handed back at once.
    let js = support::js(&server).await;
    let consumer = wait_consumer(&js, "HUB_WORK", "queue-poison").await;
    let mut messages = consumer
        .stream()
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut deliveries = 0;
    let handed_back = tokio::time::timeout(Duration::from_secs(20), async {
        while deliveries < 3 {
            if let Some(Ok(msg)) = messages.next().await {
                deliveries += 1;
                msg.ack_with(AckKind::Nak(None)).await.unwrap();
            }
        }
    })
    .await;
    assert!(handed_back.is_ok(), "3 deliveries, got {deliveries}");
    drop(messages);

    // Alice is told, once.
    support::wait_for(&alices, 1).await;
    let notice = protocol::rejection::parse_task_notice(&alices.lock().unwrap()[0].envelope)
        .expect("a task notice");
    assert_eq!(notice.task_id, receipt.task_id);
    assert_eq!(notice.queue.as_ref(), Some(&queue));
    assert_eq!(notice.reason, "max_deliver");
    // Out of the queue, into the dead letters.
    harness::wait_until_async("the work stream empty", support::DEADLINE, || async {
        support::stream_messages(&js, "HUB_WORK").await == 0
    })
    .await
    .unwrap();
    let letters = dead_letters(&server).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["subject"], "work.poison");
    assert_eq!(letters[0]["reason"], "max_deliver");
    assert_eq!(letters[0]["deliveries"], 3);
    assert_eq!(letters[0]["from"], "alice");
    // A real worker joining later does not run it.
    let journal = tempfile::tempdir().unwrap();
    let handler = support::Counting::default();
    support::start_worker(
        &hub,
        "pw1",
        &queue,
        1,
        std::sync::Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let other = new_task("runs", Vec::new());
    hub.delegate(&alice, &queue, None, &other).await.unwrap();
    harness::wait_until("the next task ran", support::DEADLINE, || {
        handler.runs(other.task_id.as_str()) == 1
    })
    .await
    .unwrap();
    assert_eq!(handler.runs(spec.task_id.as_str()), 0);
    assert_eq!(alices.lock().unwrap().len(), 1, "one notice");
    // An operator replays it (issue 28, C): back in its queue, it runs once on the worker.
    let id = letters[0]["id"].as_u64().unwrap().to_string();
    let out = run_cli(&["dlq", "--nats-url", &server.url(), "replay", &id]).await;
    assert_exit(&out, 0, "runtime dlq replay of a task");
    let replayed: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(replayed["subject"], "work.poison", "{replayed}");
    harness::wait_until("the replayed task ran", support::DEADLINE, || {
        handler.runs(spec.task_id.as_str()) == 1
    })
    .await
    .unwrap();
    assert!(dead_letters(&server).await.is_empty());
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_for_a_worker_that_no_longer_exists_is_dead_lettered_and_its_answerer_told() {
    let server = harness::run_server().await.unwrap();
    let delivery = DeliveryConfig {
        answer_max_wait_secs: 2,
        ..support::delivery()
    };
    let hub =
        support::system_with(server.url(), true, DurableInboxMode::On, delivery.clone()).await;
    hub.start_router().await.unwrap();
    // Worker `ghost` joins (its answers consumer is made), then is gone for good.
    let queue = QueueName::new("gq").unwrap();
    let gone = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    let journal = tempfile::tempdir().unwrap();
    support::start_worker(
        &gone,
        "ghost",
        &queue,
        1,
        std::sync::Arc::new(support::Counting::default()),
        journal.path(),
    )
    .await;
    let js = support::js(&server).await;
    wait_consumer(&js, "HUB_ANSWERS", "answers-ghost").await;
    gone.shutdown(Duration::from_secs(10)).await.unwrap();
    let alice = support::agent("alice");
    let alices = support::attach_collect(&hub, &alice).await;
    let answer = serde_json::json!({
        "meta": {"id": "a1"},
        "body": {
            "message_id": "ans-1",
            "task_id": "t-ghost",
            "attempt_id": "at-1",
            "worker_id": "ghost",
            "tool_call_id": "call-1",
            "responses": ["yes"],
        },
    });
    jetstream::new(hub.client().clone())
        .publish(
            "hub.pub.alice.answer.ghost",
            serde_json::to_vec(&answer).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // Stored for ghost, nobody takes it; after the wait alice is told and it is a dead letter.
    support::wait_for(&alices, 1).await;
    let notice = protocol::rejection::parse_task_notice(&alices.lock().unwrap()[0].envelope)
        .expect("a task notice");
    assert_eq!(notice.kind, "answer_undeliverable");
    assert_eq!(notice.task_id.as_str(), "t-ghost");
    assert_eq!(notice.worker.as_ref().map(|w| w.as_str()), Some("ghost"));
    assert_eq!(notice.reason, "no_worker");
    harness::wait_until_async("the answers stream empty", support::DEADLINE, || async {
        support::stream_messages(&js, "HUB_ANSWERS").await == 0
    })
    .await
    .unwrap();
    let letters = dead_letters(&server).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["subject"], "answer.ghost");
    assert_eq!(letters[0]["reason"], "no_worker");
    // An operator replays it (issue 28, C), with the router's delivery config: it is ghost's
    // answer again, its wait checked again after `answer_max_wait_secs`: ghost still gone, it
    // comes back to the dead letters and alice is told once more.
    let id = letters[0]["id"].as_u64().unwrap().to_string();
    let config = journal.path().join("delivery.json");
    std::fs::write(&config, r#"{"answer_max_wait_secs": 2}"#).unwrap();
    let config = config.display().to_string();
    let out = run_cli(&[
        "dlq",
        "--nats-url",
        &server.url(),
        "--delivery-config",
        &config,
        "replay",
        &id,
    ])
    .await;
    assert_exit(&out, 0, "runtime dlq replay of an answer");
    let replayed: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(replayed["subject"], "answer.ghost", "{replayed}");
    support::wait_for(&alices, 2).await;
    let letters = dead_letters(&server).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["subject"], "answer.ghost");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
