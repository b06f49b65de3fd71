//! Faults around a worker: refusals that cannot be published, sequences reused by a recreated
//! work stream, connections dropped while idle, consumers deleted under a running worker,
//! control requests aimed elsewhere, and a crashed worker's subscriptions.

use std::time::Duration;

use futures::{FutureExt, StreamExt};
use protocol::subjects;
use protocol::task::{TaskResult, TaskState};

use super::*;
use crate::fault::{self, Fault, FaultPoint};
use crate::journal::Journal;

#[tokio::test]
async fn a_bad_input_whose_refusal_cannot_be_published_is_left_for_redelivery() {
    // No router: the test removes the ingress stream the refusal goes through.
    let env = env_with("refusal", Hub::AttachOnly).await;
    let handler = TestHandler::new(Duration::ZERO);
    let worker = env.start("worker-refusal", handler.clone(), 1).await;
    env.js
        .delete_stream(subjects::INGRESS_STREAM)
        .await
        .expect("ingress deleted");
    // A task without text: refused, and its task id is known.
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-refused" }),
        "m-refused",
    )
    .await;
    // The refusal could not be published: the input is not acked, so it comes back (after the
    // refusal's nak delay) and is refused again.
    wait_snapshot(&worker, "the bad input delivered again", |s| {
        s.counters.bad_input >= 2
    })
    .await;
    assert_eq!(
        env.work_left().await,
        1,
        "a bad input acked without its refusal"
    );
    // Once the ingress is back, a redelivery publishes the refusal and only then acks.
    crate::streams::ensure_streams(&env.js, &env.delivery)
        .await
        .unwrap();
    env.wait_work_empty().await;
    let stream = env.js.get_stream(subjects::INGRESS_STREAM).await.unwrap();
    let stored = stream
        .get_last_raw_message_by_subject(&format!(
            "hub.pub.{}.task.delegator.t-refused",
            env.worker_id
        ))
        .await
        .expect("the refusal was published");
    let envelope = protocol::decode(&stored.payload, protocol::Codec::Json).unwrap();
    let refusal: TaskResult = serde_json::from_value(envelope.body["result"].clone()).unwrap();
    assert_eq!(refusal.state, TaskState::Failed);
    assert_eq!(handler.calls(), 0);
    stop(worker).await;
}

#[tokio::test]
async fn a_reused_sequence_for_another_task_runs_as_a_new_attempt_with_its_own_result() {
    let env = env("reuse").await;
    // The journal holds an open record of input 1 from an earlier incarnation of HUB_WORK
    // (deleted and recreated since): task t-old, with a saved result.
    {
        let mut journal = Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
        journal.admit(1, "t-old", "a-old", None).unwrap();
        let saved = super::super::SavedResult {
            seq: 1,
            result: protocol::task::failed_result(
                protocol::TaskId::new("t-old").unwrap(),
                protocol::task::AttemptId::new("a-old").unwrap(),
                env.worker_id.clone(),
                protocol::WireError::new(protocol::WireErrorKind::Internal, "old"),
            ),
        };
        journal
            .save_result(1, "t-old", &serde_json::to_value(&saved).unwrap())
            .unwrap();
    }
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-reuse", handler.clone(), 1).await;
    let seq = env.submit("t-new").await;
    assert_eq!(seq, 1, "the fresh work stream reuses sequence 1");
    let result = results.result(DEADLINE).await;
    assert_eq!(result.task_id.as_str(), "t-new", "not t-old's saved result");
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(handler.calls(), 1);
    env.wait_work_empty().await;
    stop(worker).await;
}

#[tokio::test]
async fn the_work_stream_recreated_under_a_worker_with_open_records_loses_no_task() {
    let env = env("recreate").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-recreate", handler.clone(), 2).await;
    // An open journal record: a task waiting for its answer (input sequence 1).
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-parked", "text": "[ask] parked" }),
        "m-parked",
    )
    .await;
    let parked = results.result(DEADLINE).await;
    assert_eq!(parked.state, TaskState::Waiting);
    // The operator deletes HUB_WORK (e.g. after a retention mismatch) and the router creates
    // it again: its consumers are gone and its sequences start over.
    env.js.delete_stream(subjects::WORK_STREAM).await.unwrap();
    crate::streams::ensure_streams(&env.js, &env.delivery)
        .await
        .unwrap();
    let seq = env.submit("t-after").await;
    assert_eq!(seq, 1);
    let after = results.result(DEADLINE).await;
    assert_eq!(after.task_id.as_str(), "t-after");
    assert_eq!(after.state, TaskState::Completed);
    env.wait_work_empty().await;
    stop(worker).await;
}

#[tokio::test]
async fn a_worker_whose_server_restarts_while_idle_runs_the_next_task() {
    let mut env = env("idle-restart").await;
    let handler = TestHandler::new(Duration::ZERO);
    let worker = env.start("worker-idle-restart", handler.clone(), 2).await;
    // Idle: its pulls wait. The server hangs until the worker has given up on the pulls of
    // both its loops (tasks and answers) for want of a reply, then dies, and comes back on
    // its store: the replies of those pulls are lost.
    env.server.freeze();
    wait_snapshot(&worker, "pulls abandoned while frozen", |s| {
        s.counters.pulls_abandoned >= 2
    })
    .await;
    env.server.restart().await.unwrap();
    let mut results = env.results().await;
    env.submit("t-after-restart").await;
    let result = results.result(DEADLINE).await;
    assert_eq!(result.task_id.as_str(), "t-after-restart");
    assert_eq!(result.state, TaskState::Completed);
    stop(worker).await;
}

#[tokio::test]
async fn a_deleted_queue_consumer_is_rejoined_and_the_next_task_runs() {
    let env = env("lost-consumer").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-lost-consumer", handler.clone(), 2).await;
    env.submit("t-before").await;
    assert_eq!(results.result(DEADLINE).await.state, TaskState::Completed);
    let work = env.js.get_stream(subjects::WORK_STREAM).await.unwrap();
    work.delete_consumer(&subjects::queue_consumer(&env.queue))
        .await
        .unwrap();
    // The router recreates a queue's consumer when it routes the next task to it; here the
    // task is stored directly, so only the worker's re-join brings the consumer back.
    let started = tokio::time::Instant::now();
    env.submit("t-after").await;
    let result = results.result(DEADLINE).await;
    assert_eq!(result.task_id.as_str(), "t-after");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "re-joined after {:?}",
        started.elapsed()
    );
    stop(worker).await;
}

#[tokio::test]
async fn control_requests_with_a_reply_outside_the_inbox_prefix_are_ignored() {
    let env = env("ctl-reply").await;
    let worker = env
        .start("worker-ctl-reply", TestHandler::new(Duration::ZERO), 1)
        .await;
    // A victim's ingress: a reply published there would be stored as the victim's message.
    let mut victim = env.client.subscribe("hub.pub.victim.inbox").await.unwrap();
    let request = serde_json::json!({
        "task_id": "t-none", "attempt_id": "a-none", "worker_id": env.worker_id,
    });
    let body = serde_json::to_vec(&request).unwrap();
    env.client
        .publish_with_reply(
            subjects::control(&env.worker_id, subjects::ControlKind::Query),
            "hub.pub.victim.inbox",
            body.clone().into(),
        )
        .await
        .unwrap();
    // A proper request after it is answered (the worker handles them in order)...
    let reply = env
        .client
        .request(
            subjects::control(&env.worker_id, subjects::ControlKind::Query),
            body.into(),
        )
        .await
        .unwrap();
    assert!(!reply.payload.is_empty());
    // ...so the first one was handled by now, and nothing reached the victim.
    assert!(
        victim.next().now_or_never().is_none(),
        "a control reply was published outside _INBOX."
    );
    stop(worker).await;
}

#[tokio::test]
async fn a_crashed_worker_leaves_no_subscription_behind_and_its_restart_answers() {
    use crate::supervision::{self, ChildSpec, Strategy, SupervisorSpec};
    let env = env("crash-subs").await;
    let name = "worker-crash-subs";
    let worker = env.worker(name, TestHandler::new(Duration::ZERO), 1);
    let spec =
        SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(name, worker, || ()));
    let (sup, _join) = supervision::spawn_supervisor(Some(format!("{name}-sup")), spec)
        .await
        .unwrap();
    let first = wait_registered(name).await;
    // One subscription per control subject and the status subject, held by this incarnation.
    let mut subjects_held: Vec<String> = subjects::ControlKind::ALL
        .into_iter()
        .map(|kind| subjects::control(&env.worker_id, kind))
        .collect();
    subjects_held.push(subjects::WORKER_STATUS_SUBJECT.to_owned());
    for subject in &subjects_held {
        assert_eq!(
            env.server.subscriptions_on(subject).await.unwrap(),
            1,
            "{subject}"
        );
    }
    // The next message the worker handles fails it (ractor then skips its post_stop).
    fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    let _ = ractor::call_t!(first, WorkerMsg::Snapshot, 500);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let current = wait_registered(name).await;
        if current.get_id() != first.get_id() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not restarted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The failed incarnation's subscriptions are gone (dropped with its state), before any
    // request could have ended them: one each, the new incarnation's.
    harness::wait_until_async("one subscription per subject", DEADLINE, || async {
        let mut one_each = true;
        for subject in &subjects_held {
            one_each &= env.server.subscriptions_on(subject).await.unwrap() == 1;
        }
        one_each
    })
    .await
    .unwrap();
    // Every control request is answered by the new incarnation.
    let request = serde_json::json!({
        "task_id": "t-none", "attempt_id": "a-none", "worker_id": env.worker_id,
    });
    let body = serde_json::to_vec(&request).unwrap();
    for i in 0..20 {
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            env.client.request(
                subjects::control(&env.worker_id, subjects::ControlKind::Query),
                body.clone().into(),
            ),
        )
        .await;
        assert!(
            matches!(reply, Ok(Ok(_))),
            "request {i} was not answered: {reply:?}"
        );
    }
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

async fn wait_registered(name: &str) -> ActorRef<WorkerMsg> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(cell) = ractor::registry::where_is(name) {
            let actor: ActorRef<WorkerMsg> = cell.into();
            if ractor::call_t!(actor, WorkerMsg::Snapshot, 500).is_ok() {
                return actor;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} not running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn control_requests_are_answered_under_the_workers_own_reply_prefix_only() {
    let env = env("ctl-prefix").await;
    let worker = spawn(Worker {
        reply_prefix: "_HUB".into(),
        ..env.worker("worker-ctl-prefix", TestHandler::new(Duration::ZERO), 1)
    })
    .await;
    let body: bytes::Bytes = serde_json::to_vec(&serde_json::json!({
        "task_id": "t-none", "attempt_id": "a-none", "worker_id": env.worker_id,
    }))
    .unwrap()
    .into();
    let subject = subjects::control(&env.worker_id, subjects::ControlKind::Query);
    // A connection with the deployment's prefix is answered...
    let hub = async_nats::ConnectOptions::new()
        .custom_inbox_prefix("_HUB")
        .connect(env.server.url())
        .await
        .unwrap();
    let reply = tokio::time::timeout(DEADLINE, hub.request(subject.clone(), body.clone()))
        .await
        .expect("answered")
        .unwrap();
    assert!(!reply.payload.is_empty());
    // ...one with the default `_INBOX` is not.
    let plain = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_millis(500)))
        .connect(env.server.url())
        .await
        .unwrap();
    let refused = plain.request(subject, body).await;
    assert!(refused.is_err(), "answered outside the prefix: {refused:?}");
    let snap = wait_snapshot(&worker, "counted", |s| s.counters.replies_refused == 1).await;
    assert_eq!(snap.counters.replies_refused, 1);
    stop(worker).await;
}

#[tokio::test]
async fn a_result_whose_stream_ack_is_late_is_sent_again_and_stored_once() {
    let env = env("late-ack").await;
    let mut results = env.results().await;
    let gate = Gate::new();
    let worker = env.start("worker-late-ack", gate.clone(), 1).await;
    env.submit("t-late-ack").await;
    gate.wait_started("t").await;
    // The broker hangs while the result goes out: the first try gets no stream ack in time
    // and is sent again with the same ids. Woken, the broker stores what arrived; the task
    // channel holds the result once. (Whether the ingress calls the second try a duplicate
    // depends on whether the acceptance went out on its own before: the retry carries it.)
    env.server.freeze();
    gate.open();
    wait_snapshot(&worker, "the result sent again", |s| {
        s.counters.publish_retries >= 1
    })
    .await;
    env.server.thaw();
    let result = result_of(&mut results, "t-late-ack").await;
    assert_eq!(result.state, TaskState::Completed);
    env.wait_work_empty().await;
    let snap = snapshot(&worker).await;
    assert!(snap.counters.publish_retries >= 1, "{snap:?}");
    let results_stored = env.stored_results(&result.task_id).await.len();
    assert_eq!(results_stored, 1, "the result stored once");
    assert_eq!(gate.calls(), 1, "ran once");
    assert_eq!(snap.counters.attempt_failures, 0, "{snap:?}");
    stop(worker).await;
}

/// Stores a task for `worker` alone (its targeted consumer, which the test leaves alone).
async fn submit_targeted(env: &Env, worker: &WorkerId, task_id: &str, text: &str) {
    let envelope = serde_json::json!({
        "meta": { "id": format!("m-{task_id}"), "from": "delegator" },
        "body": { "version": 1, "task_id": task_id, "text": text },
    });
    env.store(
        &subjects::work(&env.queue, Some(worker)),
        serde_json::to_vec(&envelope).unwrap(),
    )
    .await;
}

#[tokio::test]
async fn a_first_delivery_from_a_consumer_made_again_is_checked_and_not_run_twice() {
    // A queue consumer deleted and created again delivers what the old one had delivered
    // with a delivery count of 1 (and may even take the old deliveries' acks). A worker whose
    // baseline predates it must notice (the consumer's creation time changed) and read the
    // channel of such a task, which another worker already finished.
    let env = env("remade-consumer").await;
    let mut results = env.results().await;
    // The first worker is kept busy by x, a task for it alone.
    let first_gate = Gate::new();
    let first = env.start("worker-remade-1", first_gate.clone(), 1).await;
    submit_targeted(&env, &env.worker_id, "t-remade-x", "do x").await;
    first_gate.wait_started("x").await;
    // The second worker takes t from the queue; its attempt stores t's result and fails
    // before its ack, so t stays in the work stream; its slot then takes a task held for it.
    let second_gate = Gate::new();
    let other = WorkerId::new("w-remade-other").unwrap();
    fault::arm(
        "worker-remade-2.attempt.delegator.t-remade-t",
        FaultPoint::ResultConfirmed,
        Fault::Error,
        1,
    );
    let second =
        spawn(env.worker_as("worker-remade-2", other.clone(), second_gate.clone(), 1)).await;
    env.submit("t-remade-t").await;
    second_gate.wait_started("t").await;
    submit_targeted(&env, &other, "t-remade-hold", "[hold]").await;
    env.remake_queue_consumer().await;
    second_gate.open();
    let t = result_of(&mut results, "t-remade-t").await;
    assert_eq!(t.state, TaskState::Completed);
    wait_snapshot(&second, "t's attempt failed, the held task taken", |s| {
        s.counters.attempt_failures == 1 && s.running == 1
    })
    .await;
    // A consumer made again goes unnoticed for at most the baseline's age (the documented
    // window): past it, the first worker looks at its consumers before it trusts the
    // baseline. x then finishes there, and the new queue consumer delivers t to it.
    tokio::time::sleep(crate::epoch::WORK_MARK_AGE).await;
    first_gate.open();
    let snap = wait_snapshot(&first, "t settled", |s| s.counters.settled == 1).await;
    assert_eq!(second_gate.calls(), 1, "t ran once");
    assert_eq!(first_gate.calls(), 1, "the first worker ran x only");
    assert_eq!(snap.counters.consumers_remade, 1, "{snap:?}");
    stop(second).await;
    stop(first).await;
}
