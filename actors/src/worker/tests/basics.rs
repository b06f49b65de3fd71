//! The worker's basic contract: run once, heartbeat long work, one fetch per slot, journal
//! republish, bad input, waiting and answers, expiry, compaction, bundles and re-runs (cancel
//! and the start-up refusals are in `control.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::consumer::{pull, AckPolicy};
use futures::StreamExt;
use protocol::subjects;
use protocol::task::{TaskChannelBody, TaskResult, TaskState};
use ractor::Actor;

use super::*;
use crate::fault::{self, Fault, FaultPoint};

#[tokio::test]
async fn task_runs_once_result_published_then_input_acked() {
    let env = env("once").await;
    let handler = TestHandler::new(Duration::from_millis(50));
    let mut results = env.results().await;
    let worker = env.start("worker-once", handler.clone(), 4).await;
    env.submit("t1").await;
    let (first, first_id) = results.next(Duration::from_secs(10)).await.unwrap();
    let TaskChannelBody::Status(accepted) = first else {
        panic!("acceptance comes first: {first:?}")
    };
    assert_eq!(accepted.seq, 0);
    assert_eq!(first_id, protocol::task::status_msg_id(&accepted.event_id));
    let result = results.result(Duration::from_secs(10)).await;
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(result.response.as_ref().unwrap()["echo"], "do t1");
    assert_eq!(result.attempt_id, accepted.attempt_id);
    env.wait_work_empty().await;
    // Acked and gone from the work queue: nothing can redeliver it any more.
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
    let snap = snapshot(&worker).await;
    assert_eq!(snap.counters.redelivered_while_running, 0);
    assert_eq!(snap.counters.completed, 1);
    assert_eq!(snap.running, 0);
    stop(worker).await;
}

#[tokio::test]
async fn long_work_is_heartbeated_and_not_redelivered() {
    let env = env("long").await;
    let handler = TestHandler::new(ACK_WAIT * 3);
    let mut results = env.results().await;
    let worker = env.start("worker-long", handler.clone(), 2).await;
    env.submit("t-long").await;
    let result = results.result(Duration::from_secs(15)).await;
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(result.response.unwrap()["rerun"], false);
    env.wait_work_empty().await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "run once");
    let snap = snapshot(&worker).await;
    assert_eq!(
        snap.counters.redelivered_while_running, 0,
        "never redelivered during the three ack waits it ran"
    );
    assert!(snap.counters.heartbeats >= 3, "{:?}", snap.counters);
    assert_eq!(snap.counters.redelivered, 0);
    stop(worker).await;
}

#[tokio::test]
async fn concurrency_one_runs_one_attempt_and_fetches_one_at_a_time() {
    let env = env("conc").await;
    let handler = TestHandler::new(Duration::from_millis(600));
    let mut results = env.results().await;
    for i in 0..3 {
        env.submit(&format!("t{i}")).await;
    }
    let worker = env.start("worker-conc", handler.clone(), 1).await;
    let work = env.js.get_stream(subjects::WORK_STREAM).await.unwrap();
    let consumer_name = subjects::queue_consumer(&env.queue);
    let mut done = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while done < 3 {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        let info = work.consumer_info(&consumer_name).await.unwrap();
        assert!(
            info.num_ack_pending <= 1,
            "prefetched: {} pending",
            info.num_ack_pending
        );
        if let Some((TaskChannelBody::Result(r), _)) =
            results.next(Duration::from_millis(100)).await
        {
            assert_eq!(r.state, TaskState::Completed);
            done += 1;
        }
    }
    assert_eq!(handler.max_running.load(Ordering::SeqCst), 1);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
    env.wait_work_empty().await;
    stop(worker).await;
}

#[tokio::test]
async fn saved_result_is_republished_without_running_the_handler() {
    let env = env("saved").await;
    let seq = env.submit("t-saved").await;
    let saved = SavedResult {
        seq: 1,
        result: TaskResult {
            task_id: protocol::TaskId::new("t-saved").unwrap(),
            attempt_id: protocol::AttemptId::new("a-saved").unwrap(),
            worker_id: env.worker_id.clone(),
            state: TaskState::Completed,
            response: Some(serde_json::json!("from the journal")),
            error: None,
            suspend: None,
            answer_route: None,
        },
    };
    {
        let mut journal = Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
        journal.admit(seq, "t-saved", "a-saved", None).unwrap();
        journal
            .save_result(seq, "t-saved", &serde_json::to_value(&saved).unwrap())
            .unwrap();
    }
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-saved", handler.clone(), 2).await;
    let mut published = None;
    while published.is_none() {
        match results.next(Duration::from_secs(10)).await {
            Some((TaskChannelBody::Result(r), id)) => published = Some((r, id)),
            Some(_) => {}
            None => panic!("no result"),
        }
    }
    let (result, id) = published.unwrap();
    assert_eq!(result, saved.result);
    assert_eq!(
        id,
        protocol::task::result_msg_id(&saved.result.task_id, &saved.result.attempt_id, 1)
    );
    env.wait_work_empty().await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
    assert_eq!(snapshot(&worker).await.counters.redelivered, 1);
    stop(worker).await;
    let journal = Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
    assert!(
        journal.open_attempts().is_empty(),
        "forgotten after the ack"
    );
}

#[tokio::test]
async fn crash_after_journalling_result_republishes_without_rerun() {
    let env = env("crash").await;
    let handler = TestHandler::new(Duration::from_millis(20));
    let mut results = env.results().await;
    let worker = env.start("worker-crash", handler.clone(), 2).await;
    fault::arm(
        "worker-crash.attempt.delegator.t-crash",
        FaultPoint::Handle,
        Fault::Error,
        1,
    );
    env.submit("t-crash").await;
    let result = results.result(Duration::from_secs(15)).await;
    assert_eq!(result.state, TaskState::Completed);
    env.wait_work_empty().await;
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1, "ran once");
    let snap = snapshot(&worker).await;
    assert_eq!(snap.counters.attempt_failures, 1);
    assert_eq!(snap.counters.redelivered, 1);
    stop(worker).await;
}

#[tokio::test]
async fn bad_input_yields_failed_result_and_next_task_still_runs() {
    let env = env("bad").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-bad", handler.clone(), 1).await;
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-bad" }),
        "m-bad",
    )
    .await;
    env.js
        .publish(subjects::work(&env.queue, None), "not json".into())
        .await
        .unwrap()
        .await
        .unwrap();
    env.submit("t-good").await;
    let bad = results.result(Duration::from_secs(10)).await;
    assert_eq!(bad.task_id.as_str(), "t-bad");
    assert_eq!(bad.state, TaskState::Failed);
    assert_eq!(
        bad.error.unwrap().kind,
        protocol::WireErrorKind::MissingField
    );
    let good = results.result(Duration::from_secs(10)).await;
    assert_eq!(good.task_id.as_str(), "t-good");
    assert_eq!(good.state, TaskState::Completed);
    env.wait_work_empty().await;
    assert_eq!(snapshot(&worker).await.counters.bad_input, 2);
    stop(worker).await;
}

#[tokio::test]
async fn waiting_attempt_resumes_on_answer_and_ignores_duplicates() {
    let env = env("wait").await;
    let handler = TestHandler::waiting(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-wait", handler.clone(), 2).await;
    env.submit("t-wait").await;
    let waiting = results.result(Duration::from_secs(10)).await;
    assert_eq!(waiting.state, TaskState::Waiting);
    assert_eq!(waiting.suspend.as_ref().unwrap().tool_call_id, "call-1");
    assert!(waiting.answer_route.is_some());
    // The waiting result completed the input's delivery: acked (never redelivered), and the
    // attempt parked in the journal.
    env.wait_work_empty().await;
    let snap = wait_snapshot(&worker, "parked", |s| s.parked == 1 && s.running == 0).await;
    assert_eq!(snap.counters.redelivered, 0);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 1);
    // Query over the control subject: parked, answered from the journal.
    let query = env
        .control(subjects::ControlKind::Query, "t-wait", &waiting.attempt_id)
        .await;
    assert_eq!(query.state, TaskState::Waiting);
    assert!(!query.active, "parked: nothing runs");
    assert_eq!(query.suspend.unwrap().tool_call_id, "call-1");
    for _ in 0..2 {
        env.answer(&env.answer_envelope(&waiting, "ans-1")).await;
    }
    let done = results.result(Duration::from_secs(10)).await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id);
    assert_eq!(done.response.unwrap()["answers"], 1);
    // Both answers were handled (the duplicate too: judged by the resume, or acked as late
    // once the attempt is final and forgotten) before the resume count is read.
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    let snap = wait_snapshot(&worker, "both answers handled", |s| {
        s.counters.answers + s.counters.answers_refused >= 2 && s.running == 0
    })
    .await;
    assert_eq!(snap.counters.answers + snap.counters.answers_refused, 2);
    assert_eq!(handler.resumes.load(Ordering::SeqCst), 1, "one resume");
    assert_eq!(snap.parked, 0, "forgotten once final");
    stop(worker).await;
}

#[tokio::test]
async fn expired_task_is_not_run_and_fails_as_expired_while_a_live_one_runs() {
    let env = env("expiry").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-expiry", handler.clone(), 1).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-late", "text": "too late",
            "expires_at": now - 1_000 }),
        "m-late",
    )
    .await;
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-live", "text": "in time",
            "expires_at": now + 600_000 }),
        "m-live",
    )
    .await;
    let late = results.result(Duration::from_secs(10)).await;
    assert_eq!(late.task_id.as_str(), "t-late");
    assert_eq!(late.state, TaskState::Failed);
    assert_eq!(late.error.unwrap().kind, protocol::WireErrorKind::Expired);
    let live = results.result(Duration::from_secs(10)).await;
    assert_eq!(live.task_id.as_str(), "t-live");
    assert_eq!(live.state, TaskState::Completed);
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        1,
        "only the live task ran"
    );
    env.wait_work_empty().await;
    assert_eq!(snapshot(&worker).await.counters.expired, 1);
    stop(worker).await;
}

#[tokio::test]
async fn journal_is_compacted_while_running_and_reopens_without_finished_attempts() {
    let env = env("compact").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = Worker {
        compact_after: 3,
        ..env.worker("worker-compact", handler.clone(), 2)
    };
    let (worker, _) = Actor::spawn(Some("worker-compact".into()), worker, ())
        .await
        .unwrap();
    for i in 0..12 {
        env.submit(&format!("t-c{i}")).await;
    }
    for _ in 0..12 {
        assert_eq!(
            results.result(Duration::from_secs(10)).await.state,
            TaskState::Completed
        );
    }
    env.wait_work_empty().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while snapshot(&worker).await.counters.compactions < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not compacted twice"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(worker).await;
    // The compacted log replays to no open attempt, and is short: only the attempts finished
    // since the last compaction (at most 3 + the 2 that may finish meanwhile), 3 lines each.
    let journal =
        crate::journal::Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
    assert!(journal.open_attempts().is_empty());
    let log = env
        .dir
        .join(env.worker_id.as_str())
        .join(crate::journal::LOG_FILE);
    let lines = std::fs::read_to_string(log).unwrap().lines().count();
    assert!(
        lines <= 5 * 3,
        "log not compacted: {lines} lines for 12 attempts"
    );
}

/// The ingress messages the worker sent for `task_id`, each as the list of task channel
/// bodies it carries (one for a plain message, several for a bundle), in order.
async fn ingress_messages(env: &Env, task_id: &str) -> Vec<Vec<TaskChannelBody>> {
    let stream = env.js.get_stream(subjects::INGRESS_STREAM).await.unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(format!("test-{task_id}")),
            filter_subject: format!("hub.pub.{}.task.delegator.{task_id}", env.worker_id),
            // A work-queue stream (as in production) needs explicit acks; nothing is acked
            // here, so the messages stay.
            ack_policy: AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut batch = consumer.fetch().max_messages(100).messages().await.unwrap();
    while let Some(msg) = batch.next().await {
        let env = protocol::decode(&msg.unwrap().payload, protocol::Codec::Json).unwrap();
        out.push(match protocol::routing::bundle_items(&env.body) {
            Some(items) => items
                .unwrap()
                .into_iter()
                .map(|e| serde_json::from_value(e.body).unwrap())
                .collect(),
            None => vec![serde_json::from_value(env.body).unwrap()],
        });
    }
    out
}

fn shape(message: &[TaskChannelBody]) -> Vec<String> {
    message
        .iter()
        .map(|body| match body {
            TaskChannelBody::Status(s) if s.seq == 0 => "accepted".to_string(),
            TaskChannelBody::Status(s) => format!("status:{}", s.state.as_str()),
            TaskChannelBody::Result(r) => format!("result:{}", r.state.as_str()),
            TaskChannelBody::AnswerRefused(r) => format!("refused:{}", r.answer_id),
        })
        .collect()
}

#[tokio::test]
async fn a_short_task_sends_one_ingress_message_and_a_long_one_sends_its_acceptance_first() {
    let env = env_with("bundle", Hub::AttachOnly).await;
    let quick = TestHandler::new(Duration::ZERO);
    let worker = env.start("worker-bundle-quick", quick, 1).await;
    env.submit("t-quick").await;
    env.wait_work_empty().await;
    stop(worker).await;
    let quick = ingress_messages(&env, "t-quick").await;
    let shapes: Vec<_> = quick.iter().map(|m| shape(m)).collect();
    assert_eq!(
        shapes,
        [["accepted", "status:completed", "result:completed"]],
        "one bundle, acceptance first"
    );

    let slow = TestHandler::new(super::attempt::ACCEPTANCE_DELAY * 10);
    let worker = env.start("worker-bundle-slow", slow, 1).await;
    env.submit("t-slow").await;
    env.wait_work_empty().await;
    stop(worker).await;
    let slow = ingress_messages(&env, "t-slow").await;
    let shapes: Vec<_> = slow.iter().map(|m| shape(m)).collect();
    assert_eq!(
        shapes,
        [
            vec!["accepted"],
            vec!["status:completed", "result:completed"]
        ],
        "the acceptance is sent while the handler runs"
    );
}

#[tokio::test]
async fn a_redelivery_this_journal_never_admitted_is_still_flagged_as_a_rerun() {
    let env = env("rerun").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    // Another worker (gone, its journal with it) took the task and never acked it.
    let work = env.js.get_stream(subjects::WORK_STREAM).await.unwrap();
    let consumer = work
        .create_consumer(crate::consumers::queue_consumer(&env.delivery, &env.queue))
        .await
        .unwrap();
    env.submit("t-again").await;
    let mut taken = consumer.fetch().max_messages(1).messages().await.unwrap();
    let first = taken.next().await.unwrap().unwrap();
    assert_eq!(first.info().unwrap().delivered, 1);
    drop(first);
    // This worker gets the redelivery after the ack wait.
    let worker = env.start("worker-rerun", handler.clone(), 1).await;
    let result = results.result(Duration::from_secs(10)).await;
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(
        result.response.unwrap()["rerun"],
        true,
        "the broker's delivery count flags the repeat"
    );
    env.wait_work_empty().await;
    stop(worker).await;
}

#[tokio::test]
async fn a_worker_stopped_mid_run_reruns_the_same_attempt_from_its_journal_flagged_as_a_rerun() {
    let env = env("same-attempt").await;
    let mut results = env.results().await;
    let slow = TestHandler::new(Duration::from_secs(30));
    let worker = env.start("worker-same-1", slow.clone(), 1).await;
    env.submit("t-same").await;
    // The acceptance names the attempt; it is sent once the handler has run for a while.
    let accepted = loop {
        match results.next(Duration::from_secs(10)).await {
            Some((TaskChannelBody::Status(s), _)) if s.seq == 0 => break s,
            Some(_) => continue,
            None => panic!("no acceptance"),
        }
    };
    assert_eq!(slow.calls.load(Ordering::SeqCst), 1);
    // The worker goes away mid-run without acking; its journal stays.
    stop(worker).await;
    let quick = TestHandler::new(Duration::ZERO);
    let worker = env.start("worker-same-2", quick.clone(), 1).await;
    let result = results.result(Duration::from_secs(10)).await;
    assert_eq!(result.state, TaskState::Completed);
    assert_eq!(
        result.attempt_id, accepted.attempt_id,
        "the same attempt, from the journal"
    );
    assert_eq!(result.response.unwrap()["rerun"], true);
    assert_eq!(quick.calls.load(Ordering::SeqCst), 1);
    env.wait_work_empty().await;
    stop(worker).await;
}
