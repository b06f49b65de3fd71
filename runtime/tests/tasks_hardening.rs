//! Tasks that must neither be lost nor run twice: an idempotency key whose first publish
//! failed, a router whose consumers have a shorter ack wait than the worker's own config, and
//! a task republished after a broker restart made the work stream forget its message id.

mod support;

use support::Counting;

use std::sync::Arc;
use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::subjects;
use protocol::task::TaskState;
use protocol::{AgentId, QueueName};
use runtime::system::tasks::new_task;
use runtime::{ActorSystem, NatsSettings};

const DEADLINE: Duration = Duration::from_secs(60);

fn alice() -> AgentId {
    support::agent("alice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_whose_first_publish_failed_runs_its_task_exactly_once() {
    first_publish_fails_then_retry("charge order 42".into(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_task_whose_first_publish_failed_is_published_from_the_retry_and_runs_once() {
    // 100 KB: too large for its idempotency record to keep (64 KiB), so the retry's own task
    // is published under the first task id.
    first_publish_fails_then_retry("x".repeat(100_000), false).await;
}

/// A keyed task whose first publish fails (the ingress is gone for a moment), then a retry with
/// the same key and a fresh task id, then a third submission: one task, run once, under the
/// first task id. `recorded` says whether the pending record keeps the envelope.
async fn first_publish_fails_then_retry(text: String, recorded: bool) {
    let server = harness::run_server().await.unwrap();
    // The first publish is to fail while the ingress is gone, not ride it out until the
    // router has made the stream again.
    let hub = runtime::ActorSystem::builder()
        .nats(runtime::NatsSettings::new(server.url()))
        .durable(true)
        .delivery_config(support::delivery())
        .inbox_mode(DurableInboxMode::On)
        .ingress_retry_window(Duration::ZERO)
        .build()
        .await
        .unwrap();
    hub.start_router().await.unwrap();
    let queue = QueueName::new("idem").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = Counting::default();
    support::start_worker(
        &hub,
        "iw1",
        &queue,
        2,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let js = support::js(&server).await;

    // The key is written, then the publish fails: the ingress stream is gone for a moment.
    let ingress = js.get_stream(subjects::INGRESS_STREAM).await.unwrap();
    let ingress_config = ingress.cached_info().config.clone();
    js.delete_stream(subjects::INGRESS_STREAM).await.unwrap();
    let mut first = new_task(text.clone(), vec![]);
    first.idempotency_key = Some("order-42".into());
    let failed = hub.delegate(&alice(), &queue, None, &first).await;
    assert!(failed.is_err(), "the publish cannot succeed: {failed:?}");
    js.create_stream(ingress_config).await.unwrap();
    let kv = js
        .get_key_value(subjects::IDEMPOTENCY_BUCKET)
        .await
        .unwrap();
    let entry = protocol::task::idempotency::entry_key(&alice(), &queue, "order-42");
    let pending: serde_json::Value =
        serde_json::from_slice(&kv.get(&entry).await.unwrap().unwrap()).unwrap();
    assert_eq!(pending["state"], "pending");
    assert_eq!(
        pending.get("envelope").is_some(),
        recorded,
        "{}",
        pending["state"]
    );

    // The client retries with the same key (a fresh task id, as `runtime delegate` makes).
    let mut retry = new_task(text.clone(), vec![]);
    retry.idempotency_key = Some("order-42".into());
    let (receipt, tracking) = hub
        .delegate_tracked(&alice(), &queue, None, &retry)
        .await
        .unwrap();
    assert_eq!(
        receipt.task_id, first.task_id,
        "the key names the first task"
    );
    assert!(
        receipt.existing && receipt.ingress_seq.is_some(),
        "{receipt:?}"
    );
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("the task ran")
        .unwrap();
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.task_id, first.task_id);
    // A third submission finds the task done: nothing is sent, nothing runs again.
    let mut third = new_task(text.clone(), vec![]);
    third.idempotency_key = Some("order-42".into());
    let again = hub.delegate(&alice(), &queue, None, &third).await.unwrap();
    assert_eq!(again.task_id, first.task_id);
    assert!(again.existing);
    assert_eq!(handler.runs(first.task_id.as_str()), 1);
    assert_eq!(handler.total(), 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_idempotency_key_is_refused_before_anything_is_written() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("idem-bad").unwrap();
    let mut spec = new_task("charge", vec![]);
    spec.idempotency_key = Some("order 42".into());
    let refused = hub.delegate(&alice(), &queue, None, &spec).await;
    assert!(
        matches!(refused, Err(runtime::SystemError::InvalidTask(_))),
        "{refused:?}"
    );
    let js = support::js(&server).await;
    let kv = js
        .get_key_value(actors::streams::IDEMPOTENCY_BUCKET)
        .await
        .unwrap();
    let mut keys = kv.keys().await.unwrap();
    use futures::StreamExt;
    assert!(keys.next().await.is_none(), "an entry was written");
    assert_eq!(
        support::stream_messages(&js, subjects::INGRESS_STREAM).await,
        0
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_ack_wait_shorter_than_the_workers_config_runs_a_long_task_once() {
    let server = harness::run_server().await.unwrap();
    // The router creates the consumers with a 3 s ack wait; the workers have no delivery
    // config (the default says 30 s).
    let router = ActorSystem::builder()
        .nats(NatsSettings::new(server.url()))
        .durable(true)
        .delivery_config(DeliveryConfig {
            ack_wait_secs: 3,
            ..DeliveryConfig::default()
        })
        .build()
        .await
        .unwrap();
    router.start_router().await.unwrap();
    let queue = QueueName::new("long").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = Counting {
        delay: Duration::from_secs(10),
        ..Counting::default()
    };
    let mut workers = Vec::new();
    for id in ["lw1", "lw2"] {
        let worker = ActorSystem::builder()
            .nats(NatsSettings::new(server.url()))
            .durable(true)
            .build()
            .await
            .unwrap();
        support::start_worker(
            &worker,
            id,
            &queue,
            1,
            Arc::new(handler.clone()),
            journal.path(),
        )
        .await;
        workers.push(worker);
    }
    let spec = new_task("a long one", vec![]);
    let (_, tracking) = router
        .delegate_tracked(&alice(), &queue, None, &spec)
        .await
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("a result")
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);
    let js = support::js(&server).await;
    harness::wait_until_async("the work stream drained", DEADLINE, || async {
        support::stream_messages(&js, subjects::WORK_STREAM).await == 0
    })
    .await
    .unwrap();
    assert_eq!(handler.runs(spec.task_id.as_str()), 1, "ran once");
    let completed = support::results_on(&js, &spec.task_id).await;
    assert_eq!(completed.len(), 1, "one result: {completed:?}");
    for worker in workers {
        worker.shutdown(Duration::from_secs(10)).await.unwrap();
    }
    router.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_republished_after_a_broker_restart_runs_once() {
    let mut server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("again").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = Counting::default();
    support::start_worker(
        &hub,
        "aw1",
        &queue,
        1,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let spec = new_task("once only", vec![]);
    let (_, tracking) = hub
        .delegate_tracked(&alice(), &queue, None, &spec)
        .await
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);
    let js = support::js(&server).await;
    harness::wait_until_async("the task consumed", DEADLINE, || async {
        support::stream_messages(&js, subjects::WORK_STREAM).await == 0
    })
    .await
    .unwrap();

    // The broker restarts: a work-queue stream forgets the message ids of consumed messages.
    server.restart().await.unwrap();
    let js = support::js(&server).await;
    // The same ingress envelope again (a router that crashed before its ingress ack, or a
    // client retry), with the same Nats-Msg-Id.
    let envelope = protocol::Envelope {
        meta: protocol::Meta::new(protocol::MessageId::new("retry-1").unwrap()),
        body: serde_json::to_value(&spec).unwrap(),
        extra: Default::default(),
    };
    let payload = protocol::encode(&envelope, protocol::Codec::Json).unwrap();
    support::js_publish(
        &js,
        &subjects::work_ingress(&alice(), &queue, None),
        &format!("alice:task:{}", spec.task_id),
        payload,
    )
    .await;
    // The copy reached the worker (stored again: the dedupe forgot it) and was settled from the
    // task channel without running.
    let aw1 = protocol::WorkerId::new("aw1").unwrap();
    harness::wait_until_async(
        "the republished task routed and settled",
        DEADLINE,
        || async {
            support::stream_messages(&js, subjects::INGRESS_STREAM).await == 0
                && support::stream_messages(&js, subjects::WORK_STREAM).await == 0
                && hub
                    .worker_snapshot(&aw1)
                    .await
                    .is_some_and(|s| s.counters.settled == 1)
        },
    )
    .await
    .unwrap();
    assert_eq!(handler.runs(spec.task_id.as_str()), 1, "ran once");
    let completed = support::results_on(&js, &spec.task_id).await;
    assert_eq!(completed.len(), 1, "one result: {completed:?}");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_restart_tasks_resume_as_fast_as_dms() {
    let mut server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("resume").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = Counting::default();
    support::start_worker(
        &hub,
        "rw1",
        &queue,
        2,
        Arc::new(handler.clone()),
        journal.path(),
    )
    .await;
    let bob = support::agent("bob");
    let seen = support::attach_collect(&hub, &bob).await;
    // Warm: one of each goes through.
    let (_, tracking) = hub
        .delegate_tracked(&alice(), &queue, None, &new_task("warm", vec![]))
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .unwrap()
        .unwrap();
    hub.send(&alice(), &bob, serde_json::json!("warm"))
        .await
        .unwrap();
    support::wait_for(&seen, 1).await;

    server.restart().await.unwrap();
    // Both clients reconnect; time from the first accepted send to its delivery.
    let started = std::time::Instant::now();
    let spec = new_task("after the restart", vec![]);
    let tracking = loop {
        match hub.delegate_tracked(&alice(), &queue, None, &spec).await {
            Ok((_, tracking)) => break tracking,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        assert!(started.elapsed() < DEADLINE, "no submission accepted");
    };
    let submitted = started.elapsed();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);
    let task_latency = started.elapsed() - submitted;
    let dm_started = std::time::Instant::now();
    harness::wait_until_async("a DM accepted", DEADLINE, || async {
        hub.send(&alice(), &bob, serde_json::json!("after"))
            .await
            .is_ok()
    })
    .await
    .unwrap();
    support::wait_for(&seen, 2).await;
    let dm_latency = dm_started.elapsed();
    println!(
        "after a restart: submission accepted after {submitted:?}, task result {task_latency:?} later, DM in {dm_latency:?}"
    );
    assert!(
        task_latency < Duration::from_millis(1500),
        "tasks paused {task_latency:?} after the restart (DMs: {dm_latency:?})"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_stops_its_workers_together_and_every_long_task_is_handed_back_at_once() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let host = support::durable_system(server.url()).await;
    let queue = QueueName::new("drain").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let slow = Counting {
        delay: Duration::from_secs(120),
        ..Counting::default()
    };
    for id in ["dw1", "dw2", "dw3"] {
        host.start_worker(runtime::system::worker::WorkerSettings {
            concurrency: 1,
            shutdown_grace: Duration::from_secs(1),
            ..runtime::system::worker::WorkerSettings::new(
                protocol::WorkerId::new(id).unwrap(),
                queue.clone(),
                journal.path().to_path_buf(),
                Arc::new(slow.clone()),
            )
        })
        .await
        .unwrap();
    }
    let mut trackings = Vec::new();
    for n in 0..3 {
        let spec = new_task(format!("long {n}"), vec![]);
        let (_, tracking) = hub
            .delegate_tracked(&alice(), &queue, None, &spec)
            .await
            .unwrap();
        trackings.push(tracking);
    }
    harness::wait_until("each worker runs one", DEADLINE, || slow.total() == 3)
        .await
        .unwrap();
    // Stopped one after another, three workers with a 1 s grace each would need 3 s.
    let stopping = std::time::Instant::now();
    host.shutdown(Duration::from_secs(1))
        .await
        .expect("stopped within the grace");
    assert!(
        stopping.elapsed() < Duration::from_secs(3),
        "stopped after {:?}",
        stopping.elapsed()
    );
    // Handed back (not left to the 30 s ack wait): a new worker finishes all three now.
    let quick = Counting::default();
    support::start_worker(
        &hub,
        "dw4",
        &queue,
        3,
        Arc::new(quick.clone()),
        journal.path(),
    )
    .await;
    let moved = std::time::Instant::now();
    for tracking in trackings {
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .expect("the task moved")
            .unwrap();
        assert_eq!(result.state, TaskState::Completed, "{result:?}");
        assert_eq!(result.response.unwrap()["worker"], "dw4");
    }
    assert!(
        moved.elapsed() < Duration::from_secs(10),
        "moved after {:?} (the ack wait is 30 s)",
        moved.elapsed()
    );
    assert_eq!(quick.total(), 3);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_id_another_agent_used_first_does_not_swallow_the_task() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("squat").unwrap();
    let spec = new_task("alice's real task", vec![]);
    // Bob learned the id and delegated a task under it first, within the duplicate window.
    let mut squat = spec.clone();
    squat.text = "bob's".into();
    hub.delegate(&support::agent("bob"), &queue, None, &squat)
        .await
        .unwrap();
    hub.delegate(&alice(), &queue, None, &spec).await.unwrap();
    let js = support::js(&server).await;
    let work = subjects::work(&queue, None);
    harness::wait_until_async("both tasks in the work stream", DEADLINE, || async {
        support::count_on(&js, subjects::WORK_STREAM, &work).await == 2
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: alice's task was taken for a repeat of bob's"));
    // One worker runs both at once (each its own task: not an alias of the other), and each
    // delegator gets its own task's result on its own channel.
    let bob_tracking = hub
        .track(&support::agent("bob"), &spec.task_id)
        .await
        .unwrap();
    let alice_tracking = hub.track(&alice(), &spec.task_id).await.unwrap();
    let handler = Counting {
        delay: Duration::from_millis(500),
        ..Counting::default()
    };
    let journal = tempfile::tempdir().unwrap();
    let h = Arc::new(handler.clone());
    support::start_worker(&hub, "w-squat", &queue, 2, h, journal.path()).await;
    for (tracking, text) in [
        (alice_tracking, "alice's real task"),
        (bob_tracking, "bob's"),
    ] {
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .unwrap_or_else(|_| panic!("no result for {text}"))
            .unwrap();
        assert_eq!(result.state, TaskState::Completed, "{result:?}");
        assert_eq!(result.response.unwrap()["echo"], text);
    }
    assert_eq!(handler.runs(spec.task_id.as_str()), 2, "both ran");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
