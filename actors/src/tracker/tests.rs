//! Tracker tests against a real nats-server (the task channel stream is created here; no router).

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use protocol::subjects::TaskChannel;
use protocol::task::{AttemptId, StatusEvent, Suspend, TaskChannelBody, TaskResult, TaskState};
use protocol::{subjects, AgentId, Codec, Envelope, MessageId, Meta, TaskId, WorkerId};
use ractor::Actor;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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

fn agent(name: &str) -> AgentId {
    AgentId::new(name).unwrap()
}

/// Trackers that read with direct gets (no router here), every 200 ms.
fn trackers(name: &str, client: async_nats::Client) -> Trackers {
    Trackers::new(name, client)
        .with_read_as(ReadAs::Direct(subjects::TASKS_STREAM.into()))
        .with_reread_every(Duration::from_millis(200))
}

async fn spawn(trackers: Trackers) -> (ActorRef<TrackersMsg>, JoinHandle<()>) {
    Actor::spawn(Some(trackers.name.clone()), trackers, ())
        .await
        .unwrap()
}

/// `trackers` as the permanent child of a supervisor of its own (named `sup-<name>`),
/// restarted after `backoff`; returns the supervisor and the actor once it runs.
async fn supervised(
    trackers: Trackers,
    backoff: Backoff,
) -> (supervision::SupervisorRef, ActorRef<TrackersMsg>) {
    let name = trackers.name.clone();
    let spec = SupervisorSpec::new(Strategy::OneForOne).child(
        ChildSpec::actor(name.clone(), trackers, || ())
            .with_restart(Restart::Permanent)
            .with_backoff(backoff),
    );
    let (sup, _join) = supervision::spawn_supervisor(Some(format!("sup-{name}")), spec)
        .await
        .unwrap();
    harness::wait_until("trackers registered", DEADLINE, || {
        ractor::registry::where_is(ractor::ActorName::from(name.as_str())).is_some()
    })
    .await
    .unwrap();
    let actor = ractor::registry::where_is(ractor::ActorName::from(name.as_str()))
        .unwrap()
        .into();
    (sup, actor)
}

async fn track_of(
    actor: &ActorRef<TrackersMsg>,
    delegator: &AgentId,
    task_id: &str,
    fresh: bool,
) -> Receivers {
    track(
        actor,
        Track {
            delegator: delegator.clone(),
            task_id: task(task_id),
            fresh,
        },
    )
    .await
    .unwrap()
}

/// Tracks alice's `task_id`, not fresh.
async fn track_alice(actor: &ActorRef<TrackersMsg>, task_id: &str) -> Receivers {
    track_of(actor, &alice(), task_id, false).await
}

async fn snapshot(actor: &ActorRef<TrackersMsg>) -> TrackersSnapshot {
    ractor::call!(actor, TrackersMsg::Snapshot).unwrap()
}

/// Alice's task `task_id`'s counters (default once it is no longer tracked).
async fn counters(actor: &ActorRef<TrackersMsg>, task_id: &str) -> TaskCounters {
    ractor::call!(actor, TrackersMsg::Task, channel(task_id))
        .unwrap()
        .map(|s| s.counters)
        .unwrap_or_default()
}

async fn tracked(actor: &ActorRef<TrackersMsg>, task_id: &str) -> bool {
    ractor::call!(actor, TrackersMsg::Task, channel(task_id))
        .unwrap()
        .is_some()
}

async fn next_event(events: &mut mpsc::Receiver<TrackerEvent>) -> TrackerEvent {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("no progress in time")
        .unwrap()
}

async fn final_result(rx: oneshot::Receiver<TaskResult>) -> TaskResult {
    tokio::time::timeout(DEADLINE, rx)
        .await
        .expect("no final result in time")
        .expect("the entry was dropped without a result")
}

/// Waits until no task is tracked and no delegator subscribed.
async fn all_untracked(actor: &ActorRef<TrackersMsg>) {
    harness::wait_until_async("nothing tracked, no subscription", DEADLINE, || {
        let actor = actor.clone();
        async move {
            let s = snapshot(&actor).await;
            s.tracked == 0 && s.delegators == 0
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn result_published_before_tracking_is_found_in_the_stored_channel_and_the_task_then_goes() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let done = result("t-before", "a1", TaskState::Completed);
    publish_stored(&js, "t-before", "r1", TaskChannelBody::Result(done.clone())).await;
    // Another task's result on the same stream is not this task's business.
    let other = result("t-other", "a9", TaskState::Failed);
    publish_stored(&js, "t-other", "r9", TaskChannelBody::Result(other)).await;

    let (actor, _join) = spawn(trackers("trackers-before", client)).await;
    let (rx, _events) = track_alice(&actor, "t-before").await;
    assert_eq!(final_result(rx).await, done);
    // Delivered: the entry goes, and alice's subscription with it.
    all_untracked(&actor).await;
    // No durable consumer is left behind.
    harness::wait_until_async("ephemeral readers deleted", DEADLINE, || {
        let js = js.clone();
        async move {
            let stream = js.get_stream(subjects::TASKS_STREAM).await.unwrap();
            stream.consumer_names().count().await == 0
        }
    })
    .await
    .unwrap();
    actor.stop(None);
}

#[tokio::test]
async fn result_published_while_tracking_is_delivered_once() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let (actor, _join) = spawn(trackers("trackers-while", client.clone())).await;
    let (rx, mut events) = track_alice(&actor, "t-while").await;
    // The first stored read is done (so the result comes during tracking).
    harness::wait_until_async("first re-read", DEADLINE, || {
        let actor = actor.clone();
        async move { counters(&actor, "t-while").await.rereads >= 1 }
    })
    .await
    .unwrap();

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
    assert!(!tracked(&actor, "t-while").await, "delivered: untracked");
    assert!(events.try_recv().is_err(), "a final result is not progress");
    // Once delivered, the copies still arriving are no task's.
    client
        .publish(
            channel("t-while"),
            envelope("r1", TaskChannelBody::Result(done)),
        )
        .await
        .unwrap();
    harness::wait_until_async("the late copy counted", DEADLINE, || {
        let actor = actor.clone();
        async move { snapshot(&actor).await.counters.untracked >= 1 }
    })
    .await
    .unwrap();
    actor.stop(None);
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

    let (actor, _join) = spawn(trackers("trackers-wait", client)).await;
    let (rx, mut events) = track_alice(&actor, "t-wait").await;
    assert_eq!(
        next_event(&mut events).await,
        TrackerEvent::Status(Box::new(accepted.clone()))
    );
    assert_eq!(
        next_event(&mut events).await,
        TrackerEvent::Progress(Box::new(waiting.clone()))
    );

    // Repeats (a re-publish of both, under new ids) are not progress again.
    publish_stored(&js, "t-wait", "s0b", TaskChannelBody::Status(accepted)).await;
    publish_stored(&js, "t-wait", "r1b", TaskChannelBody::Result(waiting)).await;
    let done = result("t-wait", "a1", TaskState::Completed);
    publish_stored(&js, "t-wait", "r2", TaskChannelBody::Result(done.clone())).await;
    assert_eq!(final_result(rx).await, done);
    assert!(
        events.try_recv().is_err(),
        "no repeated progress and no final result among progress"
    );
    actor.stop(None);
}

#[tokio::test]
async fn many_tasks_of_several_delegators_share_one_subscription_per_delegator_and_each_gets_its_own_result(
) {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let delegators = [agent("d0"), agent("d1"), agent("d2")];
    let publish = |d: &AgentId, i: usize| {
        let (js, id) = (js.clone(), format!("t{i}"));
        let subject = subjects::task(&TaskChannel::of(d, &task(&id)));
        async move {
            let body = TaskChannelBody::Result(result(&id, "a1", TaskState::Completed));
            js.publish(subject, envelope(&format!("r-{id}"), body))
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    // Half the results are stored before their task is tracked, half after.
    for i in (0..150).step_by(2) {
        publish(&delegators[i % 3], i).await;
    }
    let (actor, _join) = spawn(trackers("trackers-many", client)).await;
    let mut receivers = Vec::new();
    for i in 0..150 {
        let (rx, _events) = track_of(&actor, &delegators[i % 3], &format!("t{i}"), false).await;
        receivers.push(rx);
    }
    let s = snapshot(&actor).await;
    assert_eq!(s.delegators, 3, "one subscription per delegator: {s:?}");
    for i in (1..150).step_by(2) {
        publish(&delegators[i % 3], i).await;
    }
    for (i, rx) in receivers.into_iter().enumerate() {
        let r = final_result(rx).await;
        assert_eq!(
            r.task_id,
            task(&format!("t{i}")),
            "task {i} got its own result"
        );
    }
    all_untracked(&actor).await;
    actor.stop(None);
}

#[tokio::test]
async fn a_caller_that_drops_its_receiver_untracks_its_task_and_a_tracked_task_is_not_tracked_twice(
) {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let _js = tasks_stream(&client).await;
    let (actor, _join) = spawn(trackers("trackers-dropped", client)).await;
    let (rx, _events) = track_alice(&actor, "t-dropped").await;
    let twice = track(
        &actor,
        Track {
            delegator: alice(),
            task_id: task("t-dropped"),
            fresh: false,
        },
    )
    .await;
    assert!(
        matches!(twice, Err(TrackError::AlreadyTracked(_))),
        "{:?}",
        twice.map(|_| ())
    );
    assert_eq!(snapshot(&actor).await.tracked, 1);
    drop(rx);
    all_untracked(&actor).await;
    // Once untracked it may be tracked again.
    let (_rx, _events) = track_alice(&actor, "t-dropped").await;
    assert_eq!(snapshot(&actor).await.tracked, 1);
    actor.stop(None);
}

#[tokio::test]
async fn crashed_trackers_are_restarted_catch_up_and_deliver_once() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let done = result("t-crash", "a1", TaskState::Failed);
    publish_stored(&js, "t-crash", "r1", TaskChannelBody::Result(done.clone())).await;

    let name = "trackers-crash";
    let t = trackers(name, client);
    let table = t.table.clone();
    // The first body handled for the task (the stored result) crashes the trackers.
    let key = fault_key(name, &alice(), &task("t-crash"));
    crate::fault::arm(&key, FaultPoint::Handle, Fault::Panic, 1);
    let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1), 2);
    let (sup, actor) = supervised(t, backoff).await;
    let (rx, mut events) = track_alice(&actor, "t-crash").await;
    assert_eq!(final_result(rx).await, done);
    assert_eq!(crate::fault::remaining(&key, FaultPoint::Handle), 0);
    let snap = supervision::snapshot(&sup).await.unwrap();
    let child = snap.child(name).expect("the trackers are a child");
    assert!(child.restarts >= 1, "restarted after the crash: {snap:?}");
    assert!(events.try_recv().is_err());
    assert!(table.is_empty(), "delivered: untracked");
    crate::fault::disarm(&key, FaultPoint::Handle);
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn result_stored_during_a_nats_server_outage_is_found_after_reconnect() {
    let mut server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    tasks_stream(&client).await;
    let (actor, _join) = spawn(trackers("trackers-outage", client)).await;
    let (rx, _events) = track_alice(&actor, "t-outage").await;
    harness::wait_until_async("first re-read", DEADLINE, || {
        let actor = actor.clone();
        async move { counters(&actor, "t-outage").await.rereads >= 1 }
    })
    .await
    .unwrap();

    server.restart().await.unwrap();
    // A fresh client stores the result as soon as the restarted server's JetStream answers,
    // while the trackers' own connection is still being replaced.
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
    all_untracked(&actor).await;
    actor.stop(None);
}

#[tokio::test]
async fn a_fresh_task_skips_only_its_first_read_and_a_restart_reads_the_store() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    // Stored before the task is tracked: a fresh task (submitted after its delegator's
    // subscription was made) is assumed to have nothing stored yet, so this is found only by a
    // later read.
    let done = result("t-fresh", "a1", TaskState::Completed);
    publish_stored(&js, "t-fresh", "r1", TaskChannelBody::Result(done.clone())).await;

    let name = "trackers-fresh";
    let t = trackers(name, client).with_reread_every(Duration::from_secs(3600));
    let (sup, actor) = supervised(t, Backoff::constant(Duration::from_millis(50))).await;
    let (mut rx, _events) = track_of(&actor, &alice(), "t-fresh", true).await;
    // A task that is not fresh finds the stored result at once (see above); this one is not
    // read until the next incarnation.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut rx)
            .await
            .is_err(),
        "nothing delivered by the first incarnation"
    );
    let first = counters(&actor, "t-fresh").await;
    assert_eq!(
        (first.stored_seen, first.rereads),
        (0, 0),
        "no initial read"
    );
    // A crash: the next incarnation reads the stored channel from the start.
    crate::fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    let _ = ractor::call_t!(actor, TrackersMsg::Snapshot, 1000);
    assert_eq!(final_result(rx).await, done);
    crate::fault::disarm(name, FaultPoint::Handle);
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_task_whose_stored_read_fails_says_so_and_still_delivers_live() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    // The trackers are told the wrong stream (a client without the router's stream names).
    let t = trackers("trackers-wrong-stream", client)
        .with_read_as(ReadAs::Direct("NO_SUCH_STREAM".into()));
    let (actor, _join) = spawn(t).await;
    let (rx, mut events) = track_alice(&actor, "t-wrong").await;
    match next_event(&mut events).await {
        TrackerEvent::StoredReadFailed(reason) => {
            assert!(reason.contains("NO_SUCH_STREAM"), "{reason}")
        }
        other => panic!("expected a stored read failure, got {other:?}"),
    }
    assert!(counters(&actor, "t-wrong").await.read_errors >= 1);
    // Said once per run of failures, not at every re-read.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while counters(&actor, "t-wrong").await.read_errors < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no re-reads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(events.try_recv().is_err(), "the failure is reported once");
    // The live subscription still delivers.
    let done = result("t-wrong", "a1", TaskState::Completed);
    publish_stored(&js, "t-wrong", "r1", TaskChannelBody::Result(done.clone())).await;
    assert_eq!(final_result(rx).await, done);
    actor.stop(None);
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
    let (actor, _join) = spawn(trackers("trackers-forged", client)).await;
    let (rx, _events) = track_alice(&actor, "t-forged").await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while counters(&actor, "t-forged").await.unstamped < 2 {
        assert!(tokio::time::Instant::now() < deadline, "forgeries not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The real one (stamped w1, as in `envelope`) is what is delivered.
    let real = result("t-forged", "a1", TaskState::Failed);
    publish_stored(&js, "t-forged", "r1", TaskChannelBody::Result(real.clone())).await;
    assert_eq!(final_result(rx).await, real);
    actor.stop(None);
}

/// Waits until alice's `task_id` was read again at least `n` times; returns when it saw them.
async fn rereads_reach(
    actor: &ActorRef<TrackersMsg>,
    task_id: &str,
    n: u64,
) -> tokio::time::Instant {
    let waited = harness::wait_until_async(&format!("{n} re-reads"), DEADLINE, || {
        let actor = actor.clone();
        async move { counters(&actor, task_id).await.rereads >= n }
    })
    .await;
    let at = tokio::time::Instant::now();
    if let Err(e) = waited {
        panic!("{e}: {:?}", counters(actor, task_id).await);
    }
    at
}

#[tokio::test]
async fn a_waiting_task_is_read_less_and_less_and_again_at_once_after_a_reconnect() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let _js = tasks_stream(&client).await;
    // 50 ms, doubled after each read that found nothing; no cap to speak of.
    let t = trackers("trackers-backoff", client.clone()).with_reread(RereadSchedule {
        base: Duration::from_millis(50),
        cap: Duration::from_secs(60),
    });
    let (actor, _join) = spawn(t).await;
    let started = tokio::time::Instant::now();
    let (_rx, _events) = track_alice(&actor, "t-backoff").await;
    // Six quiet re-reads take at least 50 + 100 + ... + 1,600 ms (a fixed 50 ms: 300 ms).
    let sixth = rereads_reach(&actor, "t-backoff", 6).await;
    assert!(
        sixth - started >= Duration::from_millis(3_000),
        "six re-reads within {:?}: the schedule did not back off",
        sixth - started
    );
    // The next is due 3.2 s after the sixth, unless the connection is replaced.
    client.force_reconnect().await.unwrap();
    let seventh = rereads_reach(&actor, "t-backoff", 7).await;
    assert!(
        seventh - sixth < Duration::from_millis(2_500),
        "the re-read after a reconnect came {:?} after the last one",
        seventh - sixth
    );
    actor.stop(None);
}

/// A tracked task's memory does not grow with its progress (issue 28, B6): a task that
/// publishes far more status events than a reader takes keeps at most
/// [`MAX_PROGRESS_HELD`](super::table::MAX_PROGRESS_HELD) of them waiting for the reader and
/// at most [`MAX_PROGRESS_KEYS`](super::table::MAX_PROGRESS_KEYS) keys of what it passed on;
/// what the reader did not take in time is dropped and counted, and the final result is
/// delivered all the same.
#[tokio::test]
async fn a_task_with_more_progress_than_its_reader_takes_holds_a_bounded_amount_and_still_delivers_its_result(
) {
    use super::table::{MAX_PROGRESS_HELD, MAX_PROGRESS_KEYS};
    const EVENTS: u32 = 1_000;
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = tasks_stream(&client).await;
    let (actor, _join) = spawn(trackers("trackers-bounded", client)).await;
    let (rx, mut events) = track_alice(&actor, "t-chatty").await;
    for seq in 1..=EVENTS {
        let event = StatusEvent::new(
            task("t-chatty"),
            AttemptId::new("a1").unwrap(),
            WorkerId::new("w1").unwrap(),
            seq,
            TaskState::Running,
            u64::from(seq),
        );
        publish_stored(
            &js,
            "t-chatty",
            &format!("s{seq}"),
            TaskChannelBody::Status(event),
        )
        .await;
    }
    let done = result("t-chatty", "a1", TaskState::Completed);
    publish_stored(
        &js,
        "t-chatty",
        "r-final",
        TaskChannelBody::Result(done.clone()),
    )
    .await;
    assert_eq!(final_result(rx).await, done);
    // The reader takes nothing until now: it finds at most the bound, the rest counted lost.
    let mut held = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
        held += 1;
    }
    assert!(
        held <= MAX_PROGRESS_HELD,
        "{held} events held for the reader"
    );
    assert!(held > 0);
    let snapshot = snapshot(&actor).await;
    assert_eq!(
        snapshot.progress_dropped,
        u64::from(EVENTS) - held as u64,
        "{snapshot:?}"
    );
    assert!(MAX_PROGRESS_KEYS < EVENTS as usize);
    actor.stop(None);
}
