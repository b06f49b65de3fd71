//! The worker's control surface and its start-up refusals: cancel (running and waiting),
//! who may query or cancel, the journal lock, a join without a router, an incompatible
//! consumer.

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use protocol::error_chain::ErrorChain;
use protocol::subjects;
use protocol::task::{JoinReply, JoinResponse, TaskState};
use protocol::{QueueName, WorkerId};
use ractor::Actor;

use super::*;
#[tokio::test]
async fn cancel_request_publishes_a_cancelled_result() {
    let env = env("cancel").await;
    let handler = TestHandler::new(Duration::from_secs(30));
    let mut results = env.results().await;
    let worker = env.start("worker-cancel", handler.clone(), 2).await;
    env.submit("t-cancel").await;
    let Some((TaskChannelBody::Status(accepted), _)) = results.next(Duration::from_secs(10)).await
    else {
        panic!("no acceptance")
    };
    let reply = env
        .control(
            subjects::ControlKind::Cancel,
            "t-cancel",
            &accepted.attempt_id,
        )
        .await;
    assert_eq!(reply.cancel, Some(protocol::task::CancelStatus::Requested));
    let result = results.result(Duration::from_secs(10)).await;
    assert_eq!(result.state, TaskState::Cancelled);
    env.wait_work_empty().await;
    stop(worker).await;
}

#[tokio::test]
async fn only_the_delegator_or_an_admin_may_query_or_cancel_a_task() {
    let env = env("control-authz").await;
    let handler = TestHandler::new(Duration::from_secs(30));
    let mut results = env.results().await;
    let worker = env.start("worker-control-authz", handler.clone(), 2).await;
    // A running task (every task here is delegated by `delegator`).
    env.submit("t-running").await;
    let Some((TaskChannelBody::Status(accepted), _)) = results.next(DEADLINE).await else {
        panic!("no acceptance")
    };
    let attempt = &accepted.attempt_id;
    let unauthorized =
        |reply: &serde_json::Value| reply["error"]["kind"] == serde_json::json!("unauthorized");
    for kind in [subjects::ControlKind::Query, subjects::ControlKind::Cancel] {
        let reply = env.control_as(kind, "t-running", attempt, "bob").await;
        assert!(unauthorized(&reply), "bob's {kind}: {reply}");
    }
    let query = env
        .control_as(
            subjects::ControlKind::Query,
            "t-running",
            attempt,
            "delegator",
        )
        .await;
    assert_eq!(query["state"], "running", "{query}");
    assert_eq!(query["active"], true, "{query}");
    // Bob's cancel cancelled nothing: the task still runs, until its delegator cancels it.
    assert!(results.drain(Duration::from_millis(300)).await.is_empty());
    let cancel = env
        .control_as(
            subjects::ControlKind::Cancel,
            "t-running",
            attempt,
            "delegator",
        )
        .await;
    assert_eq!(cancel["cancel"], "requested", "{cancel}");
    assert_eq!(results.result(DEADLINE).await.state, TaskState::Cancelled);
    // A parked task, answered from the journal: the same rule.
    let asking = TestHandler::new(Duration::ZERO);
    stop(worker).await;
    let worker = env.start("worker-control-authz-2", asking, 1).await;
    submit_asking(&env, "t-parked").await;
    let waiting = result_of(&mut results, "t-parked").await;
    wait_snapshot(&worker, "parked", |s| s.parked == 1 && s.running == 0).await;
    let reply = env
        .control_as(
            subjects::ControlKind::Cancel,
            "t-parked",
            &waiting.attempt_id,
            "bob",
        )
        .await;
    assert!(
        unauthorized(&reply),
        "bob's cancel of a parked task: {reply}"
    );
    // The admin form (no requester: granted to admins only) is served.
    let query = env
        .control(
            subjects::ControlKind::Query,
            "t-parked",
            &waiting.attempt_id,
        )
        .await;
    assert_eq!(query.state, TaskState::Waiting);
    let snap = snapshot(&worker).await;
    assert_eq!(snap.parked, 1, "still parked: bob cancelled nothing");
    assert_eq!(snap.counters.unauthorized, 1, "{snap:?}");
    stop(worker).await;
}

#[tokio::test]
async fn second_worker_with_same_journal_refuses_to_start_naming_the_lock() {
    let env = env("lock").await;
    let worker = env
        .start("worker-lock-1", TestHandler::new(Duration::ZERO), 1)
        .await;
    let err = Actor::spawn(
        Some("worker-lock-2".into()),
        env.worker("worker-lock-2", TestHandler::new(Duration::ZERO), 1),
        (),
    )
    .await
    .expect_err("second worker refused");
    let text = err.to_string();
    assert!(text.contains("in use by another process"), "{text}");
    stop(worker).await;
}

#[tokio::test]
async fn join_without_router_fails_with_no_responders() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let dir = temp_dir("nojoin");
    let worker = Worker::new(
        "worker-nojoin",
        client,
        WorkerId::new("w-nojoin").unwrap(),
        QueueName::new("q").unwrap(),
        dir.clone(),
        TestHandler::new(Duration::ZERO),
    );
    let err = Actor::spawn(None, worker, ()).await.err().unwrap();
    let text = ErrorChain(&err).to_string();
    assert!(text.contains("no responders"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn cancel_while_waiting_publishes_a_cancelled_result_under_a_new_id() {
    let env = env("cancelwait").await;
    let handler = Arc::new(TestHandler {
        wait_first: true,
        ..Arc::into_inner(TestHandler::new(Duration::ZERO)).unwrap()
    });
    let mut results = env.results().await;
    let worker = env.start("worker-cancelwait", handler.clone(), 2).await;
    env.submit("t-cw").await;
    let waiting = results.result(Duration::from_secs(10)).await;
    assert_eq!(waiting.state, TaskState::Waiting);
    // A stale answer (wrong tool call) is refused and does not resume.
    let stale = serde_json::json!({
        "meta": { "id": "ans-stale" },
        "body": {
            "message_id": "ans-stale", "task_id": "t-cw", "attempt_id": waiting.attempt_id,
            "worker_id": env.worker_id, "tool_call_id": "other", "responses": [],
        },
    });
    env.answer(&stale).await;
    for _ in 0..50 {
        if snapshot(&worker).await.counters.answers_refused == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(snapshot(&worker).await.counters.answers_refused, 1);
    let reply = env
        .control(subjects::ControlKind::Cancel, "t-cw", &waiting.attempt_id)
        .await;
    assert_eq!(reply.cancel, Some(protocol::task::CancelStatus::Requested));
    let cancelled = results.result(Duration::from_secs(10)).await;
    assert_eq!(cancelled.state, TaskState::Cancelled);
    env.wait_work_empty().await;
    assert_eq!(handler.resumes.load(Ordering::SeqCst), 0);
    stop(worker).await;
}

#[tokio::test]
async fn incompatible_consumer_refuses_to_start_naming_the_field() {
    let env = env_with("compat", Hub::None).await;
    // A router that created the consumers earlier with other settings, and now only replies.
    let mut sub = env
        .client
        .subscribe(subjects::join_request(&env.queue, &env.worker_id))
        .await
        .unwrap();
    let (client, queue, worker_id) = (env.client.clone(), env.queue.clone(), env.worker_id.clone());
    let responder = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let body = serde_json::to_vec(&joined(&queue, &worker_id)).unwrap();
            client
                .publish(msg.reply.unwrap(), body.into())
                .await
                .unwrap();
        }
    });
    create_consumers(
        &env,
        pull::Config {
            max_deliver: 1,
            ..crate::consumers::queue_consumer(&env.delivery, &env.queue)
        },
    )
    .await;
    let err = Actor::spawn(
        Some("worker-compat".into()),
        env.worker("worker-compat", TestHandler::new(Duration::ZERO), 1),
        (),
    )
    .await
    .expect_err("incompatible consumer refused");
    let text = ErrorChain(&err).to_string();
    assert!(text.contains("max_deliver"), "{text}");
    responder.abort();
}

/// The reply a router gives a join of `worker` to `queue` with the production names.
fn joined(queue: &QueueName, worker: &WorkerId) -> JoinResponse {
    JoinResponse::Joined(JoinReply {
        work_stream: subjects::WORK_STREAM.into(),
        queue_consumer: subjects::queue_consumer(queue),
        targeted_consumer: subjects::targeted_consumer(worker),
        answers_stream: subjects::ANSWERS_STREAM.into(),
        answer_consumer: subjects::answer_consumer(worker),
        tasks_stream: subjects::TASKS_STREAM.into(),
        ingress_stream: subjects::INGRESS_STREAM.into(),
    })
}

/// A router on a busy cluster may take up to its JetStream budget
/// ([`crate::streams::STREAM_API_TIMEOUT`]) to create a worker's consumers: the worker waits
/// for that answer instead of abandoning the request and sending another, which the router
/// would then serve too (the pile-up that kept a worker of the rolling-restart test from ever
/// joining).
#[tokio::test]
async fn a_join_the_router_answers_within_its_jetstream_budget_is_awaited_not_sent_again() {
    let env = env_with("slowjoin", Hub::None).await;
    create_consumers(
        &env,
        crate::consumers::queue_consumer(&env.delivery, &env.queue),
    )
    .await;
    let slow = crate::streams::STREAM_API_TIMEOUT - Duration::from_secs(2);
    let mut sub = env
        .client
        .subscribe(subjects::join_request(&env.queue, &env.worker_id))
        .await
        .unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let (client, queue, worker_id, seen) = (
        env.client.clone(),
        env.queue.clone(),
        env.worker_id.clone(),
        requests.clone(),
    );
    let responder = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let (client, reply) = (client.clone(), msg.reply.unwrap());
            let body = serde_json::to_vec(&joined(&queue, &worker_id)).unwrap();
            tokio::spawn(async move {
                tokio::time::sleep(slow).await;
                client.publish(reply, body.into()).await.unwrap();
            });
        }
    });
    let (worker, _) = Actor::spawn(
        Some("worker-slowjoin".into()),
        env.worker("worker-slowjoin", TestHandler::new(Duration::ZERO), 1),
        (),
    )
    .await
    .unwrap_or_else(|e| panic!("a join answered after {slow:?}: {}", ErrorChain(&e)));
    assert_eq!(requests.load(Ordering::SeqCst), 1, "join requests sent");
    assert_eq!(snapshot(&worker).await.worker_id, env.worker_id.to_string());
    responder.abort();
    stop(worker).await;
}

/// Creates the worker's answer and targeted consumers as a router would, and `queue` as the
/// queue's consumer.
async fn create_consumers(env: &Env, queue: pull::Config) {
    let answers = env.js.get_stream(subjects::ANSWERS_STREAM).await.unwrap();
    answers
        .create_consumer(crate::consumers::answer_consumer(
            &env.delivery,
            &env.worker_id,
        ))
        .await
        .unwrap();
    let work = env.js.get_stream(subjects::WORK_STREAM).await.unwrap();
    for config in [
        crate::consumers::targeted_consumer(&env.delivery, &env.worker_id),
        queue,
    ] {
        work.create_consumer(config).await.unwrap();
    }
}
