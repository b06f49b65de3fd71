//! Tasks under load and faults, in process against a real nats-server: tasks longer than the
//! ack wait, a crash between journalling a result and publishing it, answers (stale, right,
//! duplicate), an oversize result and invalid task envelopes.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actors::fault::{self, Fault, FaultPoint};
use actors::inbox::Delivery;
use actors::tracker::TrackerEvent;
use actors::worker::{AttemptContext, Outcome, TaskHandler};
use async_nats::jetstream;
use protocol::attach::DurableInboxMode;
use protocol::task::{Answer, TaskResult, TaskSpec, TaskState};
use protocol::{
    subjects, AgentId, Codec, Envelope, MessageId, Meta, QueueName, WireErrorKind, WorkerId,
};
use runtime::system::tasks::{new_task, Tracking};
use runtime::ActorSystem;

const DEADLINE: Duration = Duration::from_secs(90);

type Runs = Arc<Mutex<HashMap<String, Vec<String>>>>;

/// Records which worker ran which task, sleeps `delay` (`long_delay` for the text "long"),
/// then completes with the worker id.
struct Sleeper {
    delay: Duration,
    long_delay: Duration,
    runs: Runs,
}

impl Sleeper {
    fn new(delay: Duration, runs: &Runs) -> Sleeper {
        Sleeper {
            delay,
            long_delay: delay,
            runs: runs.clone(),
        }
    }
}

#[async_trait::async_trait]
impl TaskHandler for Sleeper {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        self.runs
            .lock()
            .unwrap()
            .entry(task.task_id.to_string())
            .or_default()
            .push(ctx.worker_id.to_string());
        let delay = if task.text == "long" {
            self.long_delay
        } else {
            self.delay
        };
        tokio::time::sleep(delay).await;
        Outcome::Completed(serde_json::json!({"worker": ctx.worker_id.as_str()}))
    }
}

/// Parks on question `c1`; a resume completes with the responses of all answers.
#[derive(Default, Clone)]
struct Asker {
    runs: Arc<AtomicU32>,
    resumes: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl TaskHandler for Asker {
    async fn run(&self, _: TaskSpec, _: AttemptContext) -> Outcome {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Outcome::Waiting {
            question: "which colour?".into(),
            tool_call_id: "c1".into(),
        }
    }

    async fn resume(&self, _: TaskSpec, answers: Vec<Answer>, _: AttemptContext) -> Outcome {
        self.resumes.fetch_add(1, Ordering::SeqCst);
        let responses: Vec<_> = answers.into_iter().flat_map(|a| a.responses).collect();
        Outcome::Completed(serde_json::json!(responses))
    }
}

/// Completes with a response of `size` bytes.
struct Huge {
    size: usize,
}

#[async_trait::async_trait]
impl TaskHandler for Huge {
    async fn run(&self, _: TaskSpec, _: AttemptContext) -> Outcome {
        Outcome::Completed(serde_json::json!("x".repeat(self.size)))
    }
}

fn alice() -> AgentId {
    AgentId::new("alice").unwrap()
}

async fn delegate_tracked(
    hub: &ActorSystem,
    queue: &QueueName,
    text: &str,
) -> (TaskSpec, Tracking) {
    let spec = new_task(text, vec![]);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&alice(), queue, None, &spec).await.unwrap();
    (spec, tracking)
}

async fn final_result(tracking: Tracking) -> TaskResult {
    tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .expect("tracker delivered")
}

async fn counters(hub: &ActorSystem, id: &str) -> actors::worker::WorkerCountersSnapshot {
    hub.worker_snapshot(&WorkerId::new(id).unwrap())
        .await
        .expect("worker runs")
        .counters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_of_43_tasks_to_2_workers_with_concurrency_1_each_longer_than_the_ack_wait_all_complete_exactly_once(
) {
    const N: usize = 43;
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("burst").unwrap();
    let runs = Runs::default();
    let journal = tempfile::tempdir().unwrap();
    for id in ["b1", "b2"] {
        let handler = Sleeper::new(Duration::from_millis(1300), &runs);
        support::start_worker(&hub, id, &queue, 1, Arc::new(handler), journal.path()).await;
    }
    let mut trackings = Vec::new();
    for i in 0..N {
        trackings.push(delegate_tracked(&hub, &queue, &format!("burst {i}")).await);
    }
    let mut by_worker = HashMap::<String, u32>::new();
    for (spec, tracking) in trackings {
        let result = final_result(tracking).await;
        assert_eq!(result.task_id, spec.task_id);
        assert_eq!(result.state, TaskState::Completed, "{result:?}");
        *by_worker.entry(result.worker_id.to_string()).or_default() += 1;
    }
    assert_eq!(by_worker.values().sum::<u32>(), N as u32);
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), N, "every task ran");
    let repeated: Vec<_> = runs.iter().filter(|(_, w)| w.len() != 1).collect();
    assert!(
        repeated.is_empty(),
        "tasks that ran more than once: {repeated:?}"
    );
    assert_eq!(by_worker.len(), 2, "both workers took part: {by_worker:?}");
}

/// A running attempt follows its queue consumer's current ack wait (issue 28, B3): a router
/// with a 3 s ack wait updates the shared queue consumer (made with 30 s) while a 10 s task
/// runs; the attempt heartbeats at once and then at the new pace, and the task runs once
/// (before, it kept heartbeating every 10 s, and the second worker ran it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shorter_ack_wait_set_while_a_task_runs_is_followed_and_the_task_runs_once() {
    let server = harness::run_server().await.unwrap();
    let with_ack_wait = |secs| protocol::config::DeliveryConfig {
        ack_wait_secs: secs,
        ..support::delivery()
    };
    let first =
        support::system_with(server.url(), true, DurableInboxMode::On, with_ack_wait(30)).await;
    first.start_router().await.unwrap();
    let queue = QueueName::new("rewait").unwrap();
    let runs = Runs::default();
    let journal = tempfile::tempdir().unwrap();
    let workers =
        support::system_with(server.url(), true, DurableInboxMode::On, with_ack_wait(30)).await;
    let handler = Sleeper::new(Duration::from_secs(10), &runs);
    support::start_worker(
        &workers,
        "rw1",
        &queue,
        1,
        Arc::new(handler),
        journal.path(),
    )
    .await;
    let (spec, tracking) = delegate_tracked(&workers, &queue, "ten seconds").await;
    harness::wait_until("the task runs", DEADLINE, || {
        runs.lock().unwrap().contains_key(spec.task_id.as_str())
    })
    .await
    .unwrap();
    // A router with a 3 s ack wait replaces the first, and a second worker joins through it:
    // the router updates the queue consumer.
    first.shutdown(Duration::from_secs(10)).await.unwrap();
    let second =
        support::system_with(server.url(), true, DurableInboxMode::On, with_ack_wait(3)).await;
    second.start_router().await.unwrap();
    let handler = Sleeper::new(Duration::from_secs(10), &runs);
    support::start_worker(&second, "rw2", &queue, 1, Arc::new(handler), journal.path()).await;
    let js = support::js(&server).await;
    let stream = js.get_stream(subjects::WORK_STREAM).await.unwrap();
    let ack_wait = stream
        .consumer_info(&subjects::queue_consumer(&queue))
        .await
        .unwrap()
        .config
        .ack_wait;
    assert_eq!(ack_wait, Duration::from_secs(3), "the consumer was updated");
    let result = final_result(tracking).await;
    assert_eq!(
        (result.state, result.worker_id.as_str()),
        (TaskState::Completed, "rw1"),
        "{result:?}"
    );
    let ran = runs.lock().unwrap()[spec.task_id.as_str()].clone();
    assert_eq!(ran, ["rw1"], "the task ran once");
    second.shutdown(Duration::from_secs(10)).await.unwrap();
    workers.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_worker_takes_the_next_task_while_another_runs_a_long_one() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("idle").unwrap();
    let runs = Runs::default();
    let journal = tempfile::tempdir().unwrap();
    for id in ["i1", "i2"] {
        let handler = Sleeper {
            delay: Duration::ZERO,
            long_delay: Duration::from_secs(10),
            runs: runs.clone(),
        };
        support::start_worker(&hub, id, &queue, 1, Arc::new(handler), journal.path()).await;
    }
    let (long, long_tracking) = delegate_tracked(&hub, &queue, "long").await;
    harness::wait_until("the long task started", DEADLINE, || {
        runs.lock().unwrap().contains_key(long.task_id.as_str())
    })
    .await
    .unwrap();
    let busy = runs.lock().unwrap()[long.task_id.as_str()][0].clone();
    let sent = Instant::now();
    let (_, short_tracking) = delegate_tracked(&hub, &queue, "short").await;
    let short = final_result(short_tracking).await;
    let took = sent.elapsed();
    assert_eq!(short.state, TaskState::Completed);
    assert_ne!(
        short.worker_id.as_str(),
        busy,
        "the short task ran on the idle worker"
    );
    assert!(
        took < Duration::from_secs(3),
        "the short task waited for the long one: {took:?}"
    );
    let long_result = final_result(long_tracking).await;
    assert_eq!(long_result.worker_id.as_str(), busy);
    assert_eq!(long_result.state, TaskState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_after_journalling_the_result_before_publishing_republishes_without_rerunning() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("crashy").unwrap();
    let runs = Runs::default();
    let journal = tempfile::tempdir().unwrap();
    let id = WorkerId::new("c1").unwrap();
    let handler = Sleeper::new(Duration::from_millis(100), &runs);
    support::start_worker(
        &hub,
        id.as_str(),
        &queue,
        1,
        Arc::new(handler),
        journal.path(),
    )
    .await;

    let spec = new_task("crash me", vec![]);
    let attempt = format!("{}.attempt.alice.{}", hub.worker_name(&id), spec.task_id);
    fault::arm(&attempt, FaultPoint::Handle, Fault::Panic, 1);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&alice(), &queue, None, &spec).await.unwrap();
    let result = final_result(tracking).await;
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(
        fault::remaining(&attempt, FaultPoint::Handle),
        0,
        "the fault fired"
    );
    assert_eq!(
        runs.lock().unwrap()[spec.task_id.as_str()].len(),
        1,
        "the journalled result was republished, the handler did not run again"
    );
    let c = counters(&hub, id.as_str()).await;
    assert!(c.redelivered >= 1, "the input came back: {c:?}");
}

fn answer_envelope(answer: &Answer, envelope_id: &str) -> Vec<u8> {
    let env = Envelope {
        meta: Meta::new(MessageId::new(envelope_id).unwrap()),
        body: serde_json::to_value(answer).unwrap(),
        extra: Default::default(),
    };
    protocol::encode(&env, Codec::Json).unwrap()
}

async fn publish_acked(js: &jetstream::Context, subject: &str, payload: Vec<u8>) {
    js.publish(subject.to_string(), payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_wrong_tool_call_id_is_stale_right_answer_completes_with_the_same_attempt_id_and_a_duplicate_is_not_resumed_twice(
) {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("asks").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let asker = Asker::default();
    support::start_worker(
        &hub,
        "a1",
        &queue,
        1,
        Arc::new(asker.clone()),
        journal.path(),
    )
    .await;
    let (spec, mut tracking) = delegate_tracked(&hub, &queue, "ask me").await;

    // The waiting result arrives as a progress event.
    let waiting = tokio::time::timeout(DEADLINE, async {
        loop {
            match tracking.events.recv().await.expect("events open") {
                TrackerEvent::Progress(r) if r.state == TaskState::Waiting => break r,
                _ => {}
            }
        }
    })
    .await
    .expect("the waiting result in time");
    let suspend = waiting.suspend.clone().expect("a question");
    assert_eq!(suspend.tool_call_id, "c1");
    assert!(waiting.answer_route.is_some(), "{waiting:?}");
    assert_eq!(waiting.worker_id.as_str(), "a1");

    let js = jetstream::new(server.client().await.unwrap());
    let subject = subjects::answer_ingress(&alice(), &waiting.worker_id);
    let mut answer = Answer {
        message_id: MessageId::new("ans-wrong").unwrap(),
        task_id: spec.task_id.clone(),
        attempt_id: waiting.attempt_id.clone(),
        worker_id: waiting.worker_id.clone(),
        tool_call_id: "c-other".into(),
        responses: vec![serde_json::json!("red")],
    };
    publish_acked(&js, &subject, answer_envelope(&answer, "env-wrong")).await;
    harness::wait_until_async("the stale answer refused", DEADLINE, || async {
        counters(&hub, "a1").await.answers_refused >= 1
    })
    .await
    .unwrap();
    assert_eq!(counters(&hub, "a1").await.answers_refused, 1);
    assert_eq!(asker.resumes.load(Ordering::SeqCst), 0, "not resumed");

    answer.message_id = MessageId::new("ans-right").unwrap();
    answer.tool_call_id = "c1".into();
    answer.responses = vec![serde_json::json!("blue")];
    publish_acked(&js, &subject, answer_envelope(&answer, "env-right")).await;
    let done = final_result(tracking).await;
    assert_eq!(done.state, TaskState::Completed, "{done:?}");
    assert_eq!(done.attempt_id, waiting.attempt_id, "the same attempt");
    assert_eq!(done.response, Some(serde_json::json!(["blue"])));

    // The same answer again (a new envelope, so the ingress does not dedupe it).
    publish_acked(&js, &subject, answer_envelope(&answer, "env-right-again")).await;
    harness::wait_until_async("the duplicate answer handled", DEADLINE, || async {
        let c = counters(&hub, "a1").await;
        c.answers + c.answers_refused >= 3
    })
    .await
    .unwrap();
    assert_eq!(asker.resumes.load(Ordering::SeqCst), 1, "resumed once");
    assert_eq!(asker.runs.load(Ordering::SeqCst), 1, "ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversize_result_becomes_result_too_large() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("huge").unwrap();
    let journal = tempfile::tempdir().unwrap();
    let handler = Huge { size: 1_200 * 1024 };
    support::start_worker(&hub, "h1", &queue, 1, Arc::new(handler), journal.path()).await;
    let (spec, tracking) = delegate_tracked(&hub, &queue, "too much").await;
    let result = final_result(tracking).await;
    assert_eq!(result.task_id, spec.task_id);
    assert_eq!(result.state, TaskState::Failed, "{result:?}");
    assert!(result.response.is_none());
    assert_eq!(
        result.error.expect("an error").kind,
        WireErrorKind::ResultTooLarge
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_tasks_are_rejected_and_the_next_good_task_still_runs() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let queue = QueueName::new("strict").unwrap();
    let runs = Runs::default();
    let journal = tempfile::tempdir().unwrap();
    let handler = Sleeper::new(Duration::ZERO, &runs);
    support::start_worker(&hub, "s1", &queue, 1, Arc::new(handler), journal.path()).await;

    let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let sink = seen.clone();
    hub.attach_inbox(&alice(), move |d| {
        sink.lock().unwrap().push(d);
        Box::pin(async {})
    })
    .await
    .unwrap();

    let good = |text: &str| serde_json::to_value(new_task(text, vec![])).unwrap();
    let mut wrong_version = good("wrong version");
    wrong_version["version"] = serde_json::json!(99);
    let mut blank = good("blank");
    blank["text"] = serde_json::json!("   ");
    let mut unknown = good("unknown field");
    unknown["colour"] = serde_json::json!("red");
    let js = jetstream::new(server.client().await.unwrap());
    let subject = subjects::work_ingress(&alice(), &queue, None);
    let ids = ["bad-version", "bad-blank", "bad-unknown"];
    for (id, body) in ids.iter().zip([wrong_version, blank, unknown]) {
        let env = Envelope {
            meta: Meta::new(MessageId::new(*id).unwrap()),
            body,
            extra: Default::default(),
        };
        publish_acked(&js, &subject, protocol::encode(&env, Codec::Json).unwrap()).await;
    }
    harness::wait_until("three rejection notices", DEADLINE, || {
        seen.lock().unwrap().len() >= 3
    })
    .await
    .unwrap();
    let mut rejected: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|d| {
            let r = protocol::rejection::parse_rejection(&d.envelope)
                .unwrap_or_else(|| panic!("not a rejection: {:?}", d.envelope));
            r.rejected_id.expect("the refused id").to_string()
        })
        .collect();
    rejected.sort();
    let mut expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(rejected, expected);
    assert!(runs.lock().unwrap().is_empty(), "no bad task ran");

    let (spec, tracking) = delegate_tracked(&hub, &queue, "good").await;
    let result = final_result(tracking).await;
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(result.task_id, spec.task_id);
    assert_eq!(runs.lock().unwrap().len(), 1);
    assert_eq!(seen.lock().unwrap().len(), 3, "no further notices");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trackers_crashed_by_the_fault_hook_are_restarted_by_the_systems_supervisor_and_deliver_once(
) {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("crashy").unwrap();
    let runs: Runs = Arc::default();
    let journal = tempfile::tempdir().unwrap();
    let handler = Arc::new(Sleeper::new(Duration::from_millis(300), &runs));
    support::start_worker(&hub, "w1", &queue, 1, handler, journal.path()).await;
    let spec = new_task("crash my tracker", vec![]);
    // The tracker panics on the first task channel message it handles (the acceptance status),
    // so the rest of the channel is only found by its next incarnation.
    fault::arm(
        &hub.tracker_name(&support::agent("alice"), &spec.task_id),
        FaultPoint::Handle,
        Fault::Panic,
        1,
    );
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&support::agent("alice"), &queue, None, &spec)
        .await
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("result in time")
        .expect("delivered, not given up");
    assert_eq!(result.task_id, spec.task_id);
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(
        fault::remaining(
            &hub.tracker_name(&support::agent("alice"), &spec.task_id),
            FaultPoint::Handle
        ),
        0,
        "the fault fired"
    );
    // The trackers' actor was restarted once, and the task is no longer tracked once delivered.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let snapshot = hub.snapshot().await.unwrap();
        let trackers = snapshot.trackers.unwrap();
        if snapshot.tracked_tasks == 0 {
            assert_eq!(trackers.restarts, 1);
            assert_eq!(
                (trackers.children, trackers.added, trackers.given_up),
                (1, 1, 0)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "task still tracked: {trackers:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each status event reached the caller once although two incarnations read the channel.
    let mut events = tracking.events;
    let mut statuses = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let TrackerEvent::Status(s) = event {
            statuses.push(s.event_id);
        }
    }
    let unique: std::collections::HashSet<_> = statuses.iter().collect();
    assert_eq!(
        unique.len(),
        statuses.len(),
        "no status event twice: {statuses:?}"
    );
    assert_eq!(runs.lock().unwrap().len(), 1);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_trackers_supervisor_is_started_again_by_the_next_track() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("again").unwrap();
    let runs: Runs = Arc::default();
    let journal = tempfile::tempdir().unwrap();
    let handler = Arc::new(Sleeper::new(Duration::ZERO, &runs));
    support::start_worker(&hub, "w-again", &queue, 1, handler, journal.path()).await;
    let alice = support::agent("alice");
    let first = new_task("first", vec![]);
    let (_, tracking) = hub
        .delegate_tracked(&alice, &queue, None, &first)
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("first result in time")
        .unwrap();
    // The trackers' supervisor goes away (a bug, a kill): the next track starts another.
    let name = format!("{}/trackers", hub.id());
    let sup = ractor::registry::where_is(name.clone()).expect("trackers' supervisor");
    sup.stop(None);
    let deadline = Instant::now() + DEADLINE;
    while ractor::registry::where_is(name.clone()).is_some() {
        assert!(Instant::now() < deadline, "supervisor not stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = new_task("second", vec![]);
    let (_, tracking) = hub
        .delegate_tracked(&alice, &queue, None, &second)
        .await
        .expect("tracked again");
    let result = tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .expect("second result in time")
        .unwrap();
    assert_eq!(result.task_id, second.task_id);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trackers_given_up_are_started_again_by_the_next_track_and_still_follow_the_tasks_tracked_before(
) {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::Auto).await;
    let queue = QueueName::new("given-up").unwrap();
    // Tracked while no worker serves the queue: no result yet.
    let (first, first_tracking) = delegate_tracked(&hub, &queue, "before").await;
    // The trackers' actor fails at each of its next 6 messages: more than 5 restarts within
    // 10 s, so its supervisor gives it up.
    let actor = format!("{}/trackers/all", hub.id());
    fault::arm(&actor, FaultPoint::Handle, Fault::Error, 6);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let snapshot = hub.snapshot().await.unwrap();
        if snapshot.trackers.as_ref().unwrap().given_up == 1 {
            assert_eq!(snapshot.trackers.unwrap().children, 0);
            assert!(snapshot.tracking.is_none(), "no trackers' actor runs");
            break;
        }
        assert!(Instant::now() < deadline, "not given up: {snapshot:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(fault::remaining(&actor, FaultPoint::Handle), 0);
    assert_eq!(
        hub.tracked_tasks(),
        1,
        "the task is still tracked, in the table"
    );
    // Its result is stored while nobody follows it.
    let runs: Runs = Arc::default();
    let journal = tempfile::tempdir().unwrap();
    let handler = Arc::new(Sleeper::new(Duration::ZERO, &runs));
    support::start_worker(&hub, "w-given-up", &queue, 1, handler, journal.path()).await;
    harness::wait_until("the first task ran", DEADLINE, || {
        runs.lock().unwrap().contains_key(first.task_id.as_str())
    })
    .await
    .unwrap();
    // The next track starts the actor again, which follows both tasks.
    let (second, second_tracking) = delegate_tracked(&hub, &queue, "after").await;
    let (a, b) = (
        final_result(first_tracking).await,
        final_result(second_tracking).await,
    );
    assert_eq!(
        (a.task_id, a.state, b.task_id, b.state),
        (
            first.task_id,
            TaskState::Completed,
            second.task_id,
            TaskState::Completed
        )
    );
    let trackers = hub.snapshot().await.unwrap().trackers.unwrap();
    assert_eq!((trackers.added, trackers.given_up), (2, 1), "{trackers:?}");
    assert_eq!(hub.tracked_tasks(), 0);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
