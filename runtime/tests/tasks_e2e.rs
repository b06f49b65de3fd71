//! Tasks end to end through the embedded runtime: delegator -> router -> worker attempt ->
//! router -> tracker, against a real nats-server.

mod support;

use support::Counting;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::task::TaskState;
use protocol::{AgentId, QueueName, WorkerId};
use runtime::system::tasks::new_task;

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_and_twelve_tasks_every_task_has_exactly_one_result_and_both_took_part() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("builds").unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let journal = tempfile::tempdir().unwrap();
    for id in ["w1", "w2"] {
        let echo = Counting {
            delay: Duration::from_millis(200),
            runs: runs.clone(),
        };
        support::start_worker(&hub, id, &queue, 2, Arc::new(echo), journal.path()).await;
    }
    let alice = AgentId::new("alice").unwrap();
    let mut trackings = Vec::new();
    for i in 0..12 {
        let spec = new_task(format!("task {i}"), vec![]);
        let tracking = hub
            .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
            .await
            .unwrap();
        hub.delegate(&alice, &queue, None, &spec).await.unwrap();
        trackings.push((spec, tracking));
    }
    let mut by_worker = HashMap::<String, u32>::new();
    for (spec, tracking) in trackings {
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .expect("result in time")
            .unwrap();
        assert_eq!(result.task_id, spec.task_id);
        assert_eq!(result.state, TaskState::Completed);
        assert_eq!(result.response.as_ref().unwrap()["echo"], spec.text);
        *by_worker.entry(result.worker_id.to_string()).or_default() += 1;
    }
    assert_eq!(by_worker.values().sum::<u32>(), 12);
    assert_eq!(by_worker.len(), 2, "both workers took part: {by_worker:?}");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 12);
    assert!(
        runs.values().all(|n| *n == 1),
        "each task ran once: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sent_before_any_worker_exists_are_all_done_by_a_worker_started_later() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("backlog").unwrap();
    let alice = AgentId::new("alice").unwrap();
    let mut specs = Vec::new();
    for i in 0..8 {
        let spec = new_task(format!("early {i}"), vec![]);
        hub.delegate(&alice, &queue, None, &spec).await.unwrap();
        specs.push(spec);
    }
    // Routed and waiting in the queue before any worker exists.
    harness::wait_until_async("tasks routed", DEADLINE, || async {
        hub.snapshot()
            .await
            .unwrap()
            .router
            .unwrap()
            .counters
            .stored
            >= 8
    })
    .await
    .unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let journal = tempfile::tempdir().unwrap();
    let echo = Counting {
        delay: Duration::ZERO,
        runs: runs.clone(),
    };
    support::start_worker(&hub, "late", &queue, 4, Arc::new(echo), journal.path()).await;
    for spec in &specs {
        let tracking = hub
            .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
            .await
            .unwrap();
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .expect("result in time")
            .unwrap();
        assert_eq!(result.state, TaskState::Completed);
        assert_eq!(result.worker_id.as_str(), "late");
    }
    assert!(runs.lock().unwrap().values().all(|n| *n == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_three_times_the_ack_wait_runs_once_and_is_not_redelivered() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("long").unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let journal = tempfile::tempdir().unwrap();
    let echo = Counting {
        delay: Duration::from_secs(3), // ack wait is 1 s
        runs: runs.clone(),
    };
    support::start_worker(&hub, "w-long", &queue, 1, Arc::new(echo), journal.path()).await;
    let spec = new_task("long work", vec![]);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&AgentId::new("alice").unwrap(), &queue, None, &spec)
        .await
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(runs.lock().unwrap()[spec.task_id.as_str()], 1, "ran once");
    let snap = hub
        .worker_snapshot(&WorkerId::new("w-long").unwrap())
        .await
        .unwrap();
    assert_eq!(snap.counters.redelivered, 0, "never redelivered");
    assert_eq!(
        snap.counters.redelivered_while_running, 0,
        "the broker never sent the input again while it ran: {snap:?}"
    );
    assert!(
        snap.counters.heartbeats >= 3,
        "heartbeats at ack_wait/3: {snap:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_task_runs_only_on_the_named_worker() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("targeted").unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let journal = tempfile::tempdir().unwrap();
    for id in ["t1", "t2"] {
        let echo = Counting {
            delay: Duration::ZERO,
            runs: runs.clone(),
        };
        support::start_worker(&hub, id, &queue, 2, Arc::new(echo), journal.path()).await;
    }
    let t2 = WorkerId::new("t2").unwrap();
    for i in 0..6 {
        let spec = new_task(format!("for t2 {i}"), vec![]);
        let tracking = hub
            .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
            .await
            .unwrap();
        hub.delegate(&AgentId::new("alice").unwrap(), &queue, Some(&t2), &spec)
            .await
            .unwrap();
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .expect("result in time")
            .unwrap();
        assert_eq!(result.worker_id, t2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_key_twice_gives_one_task() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("idem").unwrap();
    let alice = AgentId::new("alice").unwrap();
    let mut first = new_task("once", vec![]);
    first.idempotency_key = Some("order-42".into());
    let mut second = new_task("once again", vec![]);
    second.idempotency_key = Some("order-42".into());
    let a = hub.delegate(&alice, &queue, None, &first).await.unwrap();
    let b = hub.delegate(&alice, &queue, None, &second).await.unwrap();
    assert!(!a.existing && a.ingress_seq.is_some());
    assert!(b.existing && b.ingress_seq.is_none());
    assert_eq!(
        b.task_id, first.task_id,
        "the second sender learns the existing task id"
    );
    // Another queue: another task.
    let c = hub
        .delegate(&alice, &QueueName::new("other").unwrap(), None, &second)
        .await
        .unwrap();
    assert!(!c.existing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_events_report_acceptance_then_each_state_change_once() {
    use actors::tracker::TrackerEvent;
    use protocol::task::StatusKind;
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("status").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let echo = Counting {
        delay: Duration::from_millis(100),
        runs: Arc::default(),
    };
    support::start_worker(&hub, "w-status", &queue, 1, Arc::new(echo), journal.path()).await;
    let spec = new_task("report", vec![]);
    let mut tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&AgentId::new("alice").unwrap(), &queue, None, &spec)
        .await
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .unwrap();
    assert_eq!(result.state, TaskState::Completed);
    let mut events = Vec::new();
    while let Ok(event) = tracking.events.try_recv() {
        if let TrackerEvent::Status(status) = event {
            events.push((status.kind, status.seq, status.state, status.event_id));
        }
    }
    assert_eq!(
        events.len(),
        2,
        "acceptance and completion, each once: {events:?}"
    );
    assert_eq!(events[0].0, StatusKind::TaskAccepted);
    assert_eq!(events[0].1, 0);
    assert_eq!(events[1].2, TaskState::Completed);
    assert_ne!(events[0].3, events[1].3, "stable, distinct event ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_tasks_bundle_is_stored_as_acceptance_state_change_and_result_in_order() {
    use protocol::task::TaskChannelBody;
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("quick").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let echo = Counting {
        delay: Duration::ZERO,
        runs: Arc::default(),
    };
    support::start_worker(&hub, "w-quick", &queue, 1, Arc::new(echo), journal.path()).await;
    let spec = new_task("quick", vec![]);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&AgentId::new("alice").unwrap(), &queue, None, &spec)
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .unwrap();
    let js = support::js(&server).await;
    let channel =
        protocol::subjects::TaskChannel::of(&AgentId::new("alice").unwrap(), &spec.task_id)
            .subject();
    let stored = support::stored_on(&js, protocol::subjects::TASKS_STREAM, &channel).await;
    let shapes: Vec<String> = stored
        .iter()
        .map(|m| {
            let env = protocol::decode(&m.payload, protocol::Codec::Json).unwrap();
            assert_eq!(
                env.meta.from.unwrap().as_str(),
                "w-quick",
                "stamped per item"
            );
            match serde_json::from_value(env.body).unwrap() {
                TaskChannelBody::Status(s) if s.seq == 0 => "accepted".to_string(),
                TaskChannelBody::Status(s) => format!("status:{}", s.state.as_str()),
                TaskChannelBody::Result(r) => format!("result:{}", r.state.as_str()),
                TaskChannelBody::AnswerRefused(r) => format!("refused:{}", r.answer_id),
            }
        })
        .collect();
    assert_eq!(
        shapes,
        ["accepted", "status:completed", "result:completed"],
        "the bundle's items, each its own stored message, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_tracked_at_once_on_a_fresh_system_all_get_their_result() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("crowd").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let echo = Counting {
        delay: Duration::ZERO,
        runs: Arc::default(),
    };
    support::start_worker(&hub, "w-crowd", &queue, 8, Arc::new(echo), journal.path()).await;
    let alice = AgentId::new("alice").unwrap();
    let specs: Vec<_> = (0..64)
        .map(|i| new_task(format!("crowd {i}"), vec![]))
        .collect();
    // The first calls race to start the trackers' supervisor.
    let trackings = futures::future::join_all(
        specs
            .iter()
            .map(|spec| hub.delegate_tracked(&alice, &queue, None, spec)),
    )
    .await;
    for (spec, tracked) in specs.iter().zip(trackings) {
        let (_, tracking) = tracked.expect("tracked");
        let result = tokio::time::timeout(DEADLINE, tracking.result)
            .await
            .expect("result in time")
            .unwrap();
        assert_eq!(result.task_id, spec.task_id);
        assert_eq!(result.state, TaskState::Completed);
    }
}
