//! Tracker tests against a real nats-server (the task channel stream is created here; no router).

use std::time::Duration;

use async_nats::jetstream;
use protocol::subjects::TaskChannel;
use protocol::task::{AttemptId, StatusEvent, Suspend, TaskChannelBody, TaskResult, TaskState};
use protocol::{subjects, AgentId, Codec, Envelope, MessageId, Meta, TaskId, WorkerId};
use ractor::Actor;
use tokio::sync::oneshot;

use super::*;
use crate::fault::Fault;
use crate::supervision::{self, Backoff, ChildSpec, Restart, Strategy, SupervisorSpec};

const DEADLINE: Duration = Duration::from_secs(15);

fn task(id: &str) -> TaskId {
    TaskId::new(id).unwrap()
}

fn result(task_id: &str, attempt: &str, state: TaskState) -> TaskResult {
    TaskResult {
        task_id: task(task_id),
        attempt_id: AttemptId::new(attempt).unwrap(),
        worker_id: WorkerId::new("w1").unwrap(),
        state,
        response: (state == TaskState::Completed).then(|| serde_json::json!("the answer")),
        error: None,
        suspend: (state == TaskState::Waiting).then(|| Suspend {
            question: "proceed?".into(),
            tool_call_id: "call-1".into(),
        }),
        answer_route: None,
    }
}

fn envelope(id: &str, body: TaskChannelBody) -> bytes::Bytes {
    let mut meta = Meta::new(MessageId::new(id).unwrap());
    meta.from = Some("w1".parse().unwrap());
    let env = Envelope {
        meta,
        body: serde_json::to_value(body).unwrap(),
        extra: Default::default(),
    };
    protocol::encode(&env, Codec::Json).unwrap().into()
}

/// The delegator of every tracked task here.
fn alice() -> AgentId {
    AgentId::new("alice").unwrap()
}

fn channel(task_id: &str) -> String {
    subjects::task(&TaskChannel::of(&alice(), &task(task_id)))
}

async fn tasks_stream(client: &async_nats::Client) -> jetstream::Context {
    let js = jetstream::new(client.clone());
    js.create_stream(jetstream::stream::Config {
        name: subjects::TASKS_STREAM.into(),
        subjects: vec!["channel.task.>".into()],
        allow_direct: true,
        ..Default::default()
    })
    .await
    .unwrap();
    js
}

/// Publishes into the stream (live subscribers see it too) and waits for the store's ack.
async fn publish_stored(js: &jetstream::Context, task_id: &str, id: &str, body: TaskChannelBody) {
    js.publish(channel(task_id), envelope(id, body))
        .await
        .unwrap()
        .await
        .unwrap();
}

async fn snapshot(tracker: &ActorRef<TrackerMsg>) -> TrackerSnapshot {
    ractor::call!(tracker, TrackerMsg::Snapshot).unwrap()
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<TrackerEvent>) -> TrackerEvent {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("no progress in time")
        .unwrap()
}

async fn final_result(rx: oneshot::Receiver<TaskResult>) -> TaskResult {
    tokio::time::timeout(DEADLINE, rx)
        .await
        .expect("no final result in time")
        .expect("the sink was dropped without a result")
}

fn tracker(
    name: &str,
    client: async_nats::Client,
    task_id: &str,
) -> (
    TaskTracker,
    oneshot::Receiver<TaskResult>,
    mpsc::UnboundedReceiver<TrackerEvent>,
) {
    // No router here: the stored channel is read with direct gets.
    let (t, rx, events) = TaskTracker::new(name, client, alice(), task(task_id));
    let t = t.with_reader(Reader::Direct(subjects::TASKS_STREAM.into()));
    (t.with_reread_every(Duration::from_millis(200)), rx, events)
}

#[tokio::test]
async fn result_published_before_the_tracker_started_is_found_in_the_stored_channel() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let done = result("t-before", "a1", TaskState::Completed);
    publish_stored(&js, "t-before", "r1", TaskChannelBody::Result(done.clone())).await;
    // Another task's result on the same stream is not this tracker's business.
    let other = result("t-other", "a9", TaskState::Failed);
    publish_stored(&js, "t-other", "r9", TaskChannelBody::Result(other)).await;

    let (t, rx, _events) = tracker("tracker-before", client, "t-before");
    let (_actor, join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    assert_eq!(final_result(rx).await, done);
    tokio::time::timeout(DEADLINE, join)
        .await
        .expect("the tracker stops after delivering")
        .unwrap();
    // No durable consumer is left behind.
    let info = js.get_stream(subjects::TASKS_STREAM).await.unwrap();
    let mut names = info.consumer_names();
    let mut left = Vec::new();
    while let Some(name) = names.next().await {
        left.push(name.unwrap());
    }
    harness::wait_until_async("ephemeral readers deleted", DEADLINE, || {
        let js = js.clone();
        async move {
            let stream = js.get_stream(subjects::TASKS_STREAM).await.unwrap();
            stream.consumer_names().count().await == 0
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; consumers seen: {left:?}"));
}

#[tokio::test]
async fn result_published_while_tracking_is_delivered_once() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let (t, rx, mut events) = tracker("tracker-while", client.clone(), "t-while");
    let sink = t.sink.clone();
    let (actor, join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    // The first stored read is done (so the result comes during tracking).
    harness::wait_until_async("first re-read", DEADLINE, || {
        let actor = actor.clone();
        async move { snapshot(&actor).await.counters.rereads >= 1 }
    })
    .await
    .unwrap();
    assert!(!snapshot(&actor).await.delivered);

    let done = result("t-while", "a1", TaskState::Completed);
    // Stored (and seen live), plus a second live-only copy of the same envelope.
    publish_stored(&js, "t-while", "r1", TaskChannelBody::Result(done.clone())).await;
    client
        .publish(
            channel("t-while"),
            envelope("r1", TaskChannelBody::Result(done.clone())),
        )
        .await
        .unwrap();
    assert_eq!(final_result(rx).await, done);
    tokio::time::timeout(DEADLINE, join)
        .await
        .expect("the tracker stops after delivering")
        .unwrap();
    assert!(sink.is_done());
    assert!(
        !sink.deliver(done),
        "the sink refuses a second final result"
    );
    assert!(events.try_recv().is_err(), "a final result is not progress");
}

#[tokio::test]
async fn waiting_result_is_progress_and_the_final_result_follows() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let accepted = StatusEvent::new(
        task("t-wait"),
        AttemptId::new("a1").unwrap(),
        WorkerId::new("w1").unwrap(),
        0,
        TaskState::Running,
        1,
    );
    let waiting = result("t-wait", "a1", TaskState::Waiting);
    publish_stored(
        &js,
        "t-wait",
        "s0",
        TaskChannelBody::Status(accepted.clone()),
    )
    .await;
    publish_stored(
        &js,
        "t-wait",
        "r1",
        TaskChannelBody::Result(waiting.clone()),
    )
    .await;

    let (t, rx, mut events) = tracker("tracker-wait", client, "t-wait");
    let (_actor, join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    assert_eq!(
        next_event(&mut events).await,
        TrackerEvent::Status(accepted.clone())
    );
    assert_eq!(
        next_event(&mut events).await,
        TrackerEvent::Progress(waiting.clone())
    );

    // Repeats (a re-publish of both, under new ids) are not progress again.
    publish_stored(&js, "t-wait", "s0b", TaskChannelBody::Status(accepted)).await;
    publish_stored(&js, "t-wait", "r1b", TaskChannelBody::Result(waiting)).await;
    let done = result("t-wait", "a1", TaskState::Completed);
    publish_stored(&js, "t-wait", "r2", TaskChannelBody::Result(done.clone())).await;
    assert_eq!(final_result(rx).await, done);
    tokio::time::timeout(DEADLINE, join).await.unwrap().unwrap();
    assert!(
        events.try_recv().is_err(),
        "no repeated progress and no final result among progress"
    );
}

#[tokio::test]
async fn crashed_tracker_is_restarted_catches_up_and_delivers_once() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let done = result("t-crash", "a1", TaskState::Failed);
    publish_stored(&js, "t-crash", "r1", TaskChannelBody::Result(done.clone())).await;

    let name = "tracker-crash";
    let (t, rx, mut events) = tracker(name, client, "t-crash");
    // The first message handled (the stored result) crashes the tracker.
    crate::fault::arm(name, FaultPoint::Handle, Fault::Panic, 1);
    let spec = SupervisorSpec::new(Strategy::OneForOne).child(
        ChildSpec::actor(name, t, || ())
            .with_restart(Restart::Transient)
            .with_backoff(Backoff::new(
                Duration::from_millis(50),
                Duration::from_secs(1),
                2,
            )),
    );
    let (sup, _join) = supervision::spawn_supervisor(Some("sup-tracker-crash".into()), spec)
        .await
        .unwrap();
    assert_eq!(final_result(rx).await, done);
    let snap = supervision::snapshot(&sup).await.unwrap();
    let child = snap.child(name).expect("the tracker is a child");
    assert!(child.restarts >= 1, "restarted after the crash: {snap:?}");
    assert!(events.try_recv().is_err());
    crate::fault::disarm(name, FaultPoint::Handle);
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn result_stored_during_a_nats_server_outage_is_found_after_reconnect() {
    let mut server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    tasks_stream(&client).await;
    let (t, rx, _events) = tracker("tracker-outage", client, "t-outage");
    let (actor, join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    harness::wait_until_async("first re-read", DEADLINE, || {
        let actor = actor.clone();
        async move { snapshot(&actor).await.counters.rereads >= 1 }
    })
    .await
    .unwrap();

    server.restart().await.unwrap();
    // A fresh client stores the result as soon as the restarted server's JetStream answers,
    // while the tracker's own connection is still being replaced.
    let writer = server.client().await.unwrap();
    let js = jetstream::new(writer);
    let done = result("t-outage", "a1", TaskState::Completed);
    harness::wait_until_async("result stored after restart", DEADLINE, || {
        let js = js.clone();
        let done = done.clone();
        async move {
            match js
                .publish(
                    channel("t-outage"),
                    envelope("r1", TaskChannelBody::Result(done)),
                )
                .await
            {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(final_result(rx).await, done);
    tokio::time::timeout(DEADLINE, join)
        .await
        .expect("the tracker stops after delivering")
        .unwrap();
}

#[tokio::test]
async fn a_fresh_tracker_skips_only_its_first_read_and_a_restarted_one_reads_the_store() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    // Stored before the tracker starts: a fresh tracker (whose task is submitted after it
    // subscribed) assumes nothing is stored yet, so this is found only by a later read.
    let done = result("t-fresh", "a1", TaskState::Completed);
    publish_stored(&js, "t-fresh", "r1", TaskChannelBody::Result(done.clone())).await;

    let name = "tracker-fresh";
    let (t, mut rx, _events) = TaskTracker::new(name, client, alice(), task("t-fresh"));
    let t = t.with_reader(Reader::Direct(subjects::TASKS_STREAM.into()));
    let t = t.with_reread_every(Duration::from_secs(3600)).fresh();
    let spec = SupervisorSpec::new(Strategy::OneForOne).child(
        ChildSpec::actor(name, t, || ())
            .with_restart(Restart::Transient)
            .with_backoff(Backoff::constant(Duration::from_millis(50))),
    );
    let (sup, _join) = supervision::spawn_supervisor(Some("sup-tracker-fresh".into()), spec)
        .await
        .unwrap();
    harness::wait_until("tracker registered", DEADLINE, || {
        ractor::registry::where_is(ractor::ActorName::from(name)).is_some()
    })
    .await
    .unwrap();
    let actor: ActorRef<TrackerMsg> = ractor::registry::where_is(ractor::ActorName::from(name))
        .unwrap()
        .into();
    // A non-fresh tracker finds the stored result at once (see the test above); this one
    // does not read until its next incarnation.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut rx)
            .await
            .is_err(),
        "nothing delivered by the first incarnation"
    );
    let first = snapshot(&actor).await;
    assert_eq!(
        (first.counters.stored_seen, first.counters.rereads),
        (0, 0),
        "no initial read"
    );
    // A crash: the next incarnation reads the stored channel from the start.
    crate::fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    let _ = ractor::call_t!(actor, TrackerMsg::Snapshot, 1000);
    assert_eq!(final_result(rx).await, done);
    crate::fault::disarm(name, FaultPoint::Handle);
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_tracker_whose_stored_read_fails_says_so_and_still_delivers_live() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    // The tracker is told the wrong stream (a client without the router's stream names).
    let (t, rx, mut events) = tracker("tracker-wrong-stream", client, "t-wrong");
    let t = t.with_reader(Reader::Direct("NO_SUCH_STREAM".into()));
    let (actor, _join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    match next_event(&mut events).await {
        TrackerEvent::StoredReadFailed(reason) => {
            assert!(reason.contains("NO_SUCH_STREAM"), "{reason}")
        }
        other => panic!("expected a stored read failure, got {other:?}"),
    }
    assert!(snapshot(&actor).await.counters.read_errors >= 1);
    // Said once per run of failures, not at every re-read.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while snapshot(&actor).await.counters.read_errors < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no re-reads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(events.try_recv().is_err(), "the failure is reported once");
    // The live subscription still delivers.
    let done = result("t-wrong", "a1", TaskState::Completed);
    publish_stored(&js, "t-wrong", "r1", TaskChannelBody::Result(done.clone())).await;
    assert_eq!(final_result(rx).await, done);
}

#[tokio::test]
async fn a_result_not_published_by_the_worker_it_names_is_ignored_and_counted() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    // Forged: w1's "completed" result, but stamped as mallory's (as the router stamps the
    // sender of whatever reaches it), and one not stamped at all.
    let forged = result("t-forged", "a1", TaskState::Completed);
    for (id, from) in [("f1", Some("mallory")), ("f2", None)] {
        let mut meta = Meta::new(MessageId::new(id).unwrap());
        meta.from = from.map(|f| f.parse().unwrap());
        let env = Envelope {
            meta,
            body: serde_json::to_value(TaskChannelBody::Result(forged.clone())).unwrap(),
            extra: Default::default(),
        };
        let payload: bytes::Bytes = protocol::encode(&env, Codec::Json).unwrap().into();
        js.publish(channel("t-forged"), payload)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let (t, rx, _events) = tracker("tracker-forged", client, "t-forged");
    let (actor, _join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while snapshot(&actor).await.counters.unstamped < 2 {
        assert!(tokio::time::Instant::now() < deadline, "forgeries not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The real one (stamped w1, as in `envelope`) is what the tracker delivers.
    let real = result("t-forged", "a1", TaskState::Failed);
    publish_stored(&js, "t-forged", "r1", TaskChannelBody::Result(real.clone())).await;
    assert_eq!(final_result(rx).await, real);
}

/// Waits until the tracker made at least `n` re-reads; returns when it saw them.
async fn rereads_reach(actor: &ActorRef<TrackerMsg>, n: u64) -> tokio::time::Instant {
    let waited = harness::wait_until_async(&format!("{n} re-reads"), DEADLINE, || {
        let actor = actor.clone();
        async move { snapshot(&actor).await.counters.rereads >= n }
    })
    .await;
    let at = tokio::time::Instant::now();
    if let Err(e) = waited {
        panic!("{e}: {:?}", snapshot(actor).await.counters);
    }
    at
}

#[tokio::test]
async fn a_waiting_tracker_reads_less_and_less_and_again_at_once_after_a_reconnect() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let _js = tasks_stream(&client).await;
    let (t, _rx, _events) = tracker("tracker-backoff", client.clone(), "t-backoff");
    // 50 ms, doubled after each read that found nothing; no cap to speak of.
    let t = t.with_reread(RereadSchedule {
        base: Duration::from_millis(50),
        cap: Duration::from_secs(60),
    });
    let started = tokio::time::Instant::now();
    let (actor, _join) = Actor::spawn(Some(t.name.clone()), t, ()).await.unwrap();
    // Six quiet re-reads take at least 50 + 100 + ... + 1,600 ms (a fixed 50 ms: 300 ms).
    let sixth = rereads_reach(&actor, 6).await;
    assert!(
        sixth - started >= Duration::from_millis(3_000),
        "six re-reads within {:?}: the schedule did not back off",
        sixth - started
    );
    // The next is due 3.2 s after the sixth, unless the connection is replaced.
    client.force_reconnect().await.unwrap();
    let seventh = rereads_reach(&actor, 7).await;
    assert!(
        seventh - sixth < Duration::from_millis(2_500),
        "the re-read after a reconnect came {:?} after the last one",
        seventh - sixth
    );
    actor.stop(None);
}
