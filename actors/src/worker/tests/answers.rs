//! Waiting attempts and their answers: a waiting result completes the input's delivery (the
//! slot is free, the input acked), an answer resumes the same attempt from the journal on the
//! worker that owns it, and refused answers end in an error result on the task channel.

use std::time::Duration;

use protocol::task::{TaskChannelBody, TaskState};
use protocol::WorkerId;

use super::*;

/// The `answer_refused` error result of `task_id` on the task channel, as raw JSON.
async fn refusal_of(results: &mut Results, task_id: &str) -> Option<serde_json::Value> {
    results
        .find_raw(DEADLINE, |body| {
            body.get("answer_refused")
                .is_some_and(|r| r["task_id"] == task_id)
        })
        .await
        .map(|body| body["answer_refused"].clone())
}

#[tokio::test]
async fn a_waiting_task_frees_its_slot_and_the_answer_resumes_the_same_attempt() {
    let env = env("freeslot").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    // One slot: a waiting task must not hold it.
    let worker = env.start("worker-freeslot", handler.clone(), 1).await;
    submit_asking(&env, "t-asks").await;
    let waiting = result_of(&mut results, "t-asks").await;
    assert_eq!(waiting.state, TaskState::Waiting);
    // The waiting result completed the input's delivery: acked, gone from the work stream.
    env.wait_work_empty().await;
    env.submit("t-next").await;
    let next = result_of(&mut results, "t-next").await;
    assert_eq!(next.state, TaskState::Completed, "the next task ran");
    // The answer resumes the same attempt, from the journal.
    env.answer(&env.answer_envelope(&waiting, "ans-1")).await;
    let done = result_of(&mut results, "t-asks").await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id, "the same attempt");
    assert_eq!(done.response.unwrap()["answers"], 1);
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    assert_eq!(handler.calls(), 2, "t-asks and t-next ran once each");
    assert_eq!(handler.resumes(), 1);
    stop(worker).await;
}

#[tokio::test]
async fn an_answer_after_an_in_process_restart_resumes_the_waiting_attempt_on_its_owner() {
    let env = env("owner").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let w1 = env.start("worker-owner-1", handler.clone(), 1).await;
    let other = WorkerId::new("w-owner-other").unwrap();
    let w2 = spawn(env.worker_as("worker-owner-2", other, handler.clone(), 1)).await;
    submit_asking(&env, "t-own").await;
    let waiting = result_of(&mut results, "t-own").await;
    assert_eq!(waiting.state, TaskState::Waiting);
    let owner = waiting.worker_id.clone();
    assert_eq!(owner, env.worker_id, "w1 took it (w2 started later)");
    // w1 restarts in process (its journal stays). Whatever happens to the input meanwhile
    // (acked with the waiting result, or redelivered to w2) has happened once the work stream
    // is empty or w2 took something.
    stop(w1).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while env.work_left().await > 0 && snapshot(&w2).await.counters.admitted == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w1 = env.start("worker-owner-1b", handler.clone(), 1).await;
    // The answer goes to the worker the waiting result names: it is settled within seconds
    // (no nak loop), and the task completes there, as the same attempt, run once.
    env.answer_to(&owner, &env.answer_envelope(&waiting, "ans-own"))
        .await;
    let done = result_of(&mut results, "t-own").await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id);
    assert_eq!(done.worker_id, owner);
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    env.wait_work_empty().await;
    assert_eq!(handler.calls(), 1, "never run again on the other worker");
    assert_eq!(handler.resumes(), 1);
    stop(w1).await;
    stop(w2).await;
}

#[tokio::test]
async fn an_answer_for_an_attempt_this_worker_does_not_own_is_refused_on_the_task_channel() {
    let env = env("ghost").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-ghost", handler.clone(), 1).await;
    let ghost = serde_json::json!({
        "meta": { "id": "ans-ghost", "from": "boss" },
        "body": {
            "message_id": "ans-ghost", "task_id": "t-ghost", "attempt_id": "a-ghost",
            "worker_id": env.worker_id, "tool_call_id": "call-1", "responses": ["yes"],
        },
    });
    env.answer(&ghost).await;
    let refusal = refusal_of(&mut results, "t-ghost")
        .await
        .expect("an error result on the task channel");
    assert_eq!(refusal["error"]["kind"], "unknown_task_attempt");
    assert_eq!(refusal["answer_id"], "ans-ghost");
    assert_eq!(refusal["attempt_id"], "a-ghost");
    // Settled: acked, not nak'd for ever.
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    assert_eq!(handler.resumes(), 0);
    stop(worker).await;
}

#[tokio::test]
async fn a_stale_answer_is_refused_on_the_task_channel_and_the_right_one_resumes() {
    let env = env("stale").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-stale", handler.clone(), 2).await;
    submit_asking(&env, "t-stale").await;
    let waiting = result_of(&mut results, "t-stale").await;
    let mut stale = env.answer_envelope(&waiting, "ans-stale");
    stale["body"]["tool_call_id"] = "call-other".into();
    env.answer(&stale).await;
    let refusal = refusal_of(&mut results, "t-stale")
        .await
        .expect("an error result on the task channel");
    assert_eq!(refusal["error"]["kind"], "stale_answer");
    assert_eq!(refusal["answer_id"], "ans-stale");
    assert_eq!(refusal["attempt_id"], waiting.attempt_id.as_str());
    env.answer(&env.answer_envelope(&waiting, "ans-right"))
        .await;
    let done = result_of(&mut results, "t-stale").await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id);
    assert_eq!(handler.resumes(), 1);
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    stop(worker).await;
}

#[tokio::test]
async fn a_duplicate_answer_gets_the_saved_result_again_and_resumes_nothing() {
    let env = env("dupans").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-dupans", handler.clone(), 1).await;
    // Asks twice: the first answer parks it again on a second question.
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": "t-dup", "text": "[ask2] t-dup" }),
        "m-t-dup",
    )
    .await;
    let first = result_of(&mut results, "t-dup").await;
    env.answer(&env.answer_envelope(&first, "ans-1")).await;
    let second = result_of(&mut results, "t-dup").await;
    assert_eq!(second.state, TaskState::Waiting);
    assert_eq!(second.suspend.as_ref().unwrap().tool_call_id, "call-2");
    // What the worker publishes for the task from now on, seen at the ingress (the task
    // channel drops a copy with the same ids, so it would not show there).
    let channel = subjects::TaskChannel::of(
        &protocol::AgentId::new("delegator").unwrap(),
        &second.task_id,
    );
    let mut published = env
        .client
        .subscribe(subjects::task_ingress_filter(&channel))
        .await
        .unwrap();
    env.client.flush().await.unwrap();
    // The same answer again (a retry of the answerer, or a redelivery).
    env.answer(&env.answer_envelope(&first, "ans-1")).await;
    let again = tokio::time::timeout(DEADLINE, published.next())
        .await
        .expect("the saved result published again")
        .unwrap();
    let env_again = protocol::decode(&again.payload, protocol::Codec::Json).unwrap();
    let bodies = match protocol::routing::bundle_items(&env_again.body) {
        Some(items) => items.unwrap().into_iter().map(|i| i.body).collect(),
        None => vec![env_again.body],
    };
    assert!(
        bodies.iter().any(|b| {
            serde_json::from_value::<TaskChannelBody>(b.clone())
                .is_ok_and(|b| matches!(b, TaskChannelBody::Result(r) if r == second))
        }),
        "{bodies:?}"
    );
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    // The ingress said so too: the same ids, within its duplicate window.
    let snap = wait_snapshot(&worker, "the duplicate answer handled", |s| {
        s.counters.answers >= 2 && s.counters.publish_duplicates >= 1
    })
    .await;
    assert_eq!(snap.counters.answers, 2);
    assert_eq!(snap.counters.publish_duplicates, 1, "{snap:?}");
    assert_eq!(handler.resumes(), 1, "a duplicate resumes nothing");
    assert_eq!(snap.counters.answers_refused, 0);
    // The saved (second waiting) result went out again, with the same ids: the task channel
    // deduplicates it, and nothing else arrived.
    let more = results.drain(Duration::from_millis(300)).await;
    assert!(
        more.iter()
            .all(|b| matches!(b, TaskChannelBody::Result(r) if r == &second)),
        "{more:?}"
    );
    stop(worker).await;
}

#[tokio::test]
async fn only_the_delegator_answers_through_the_route_and_anyone_else_is_refused() {
    let env = env("route").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-route", handler.clone(), 1).await;
    submit_asking(&env, "t-route").await;
    let waiting = result_of(&mut results, "t-route").await;
    let route = waiting
        .answer_route
        .clone()
        .expect("a waiting result has a route");
    // The route names the worker's answer channel, not a sender: the answerer puts its own
    // identity in front of it.
    assert_eq!(route, subjects::answer(&waiting.worker_id), "{route}");
    let through = |who: &str| {
        let who = protocol::AgentId::new(who).unwrap();
        subjects::answer_ingress_from_route(&who, &route, &waiting.worker_id)
            .expect("the route checks out against the worker the result names")
    };
    assert_eq!(
        through("boss"),
        format!("hub.pub.boss.answer.{}", waiting.worker_id)
    );
    // Boss did not delegate the task: its answer, stamped as boss by the router, is refused
    // (unauthorized) and resumes nothing.
    let answer = env.answer_envelope(&waiting, "ans-boss");
    env.js
        .publish(through("boss"), serde_json::to_vec(&answer).unwrap().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let refusal = loop {
        match results.next(DEADLINE).await.expect("the refusal").0 {
            TaskChannelBody::AnswerRefused(r) => break r,
            _ => continue,
        }
    };
    assert_eq!(refusal.answer_id.as_str(), "ans-boss");
    assert_eq!(refusal.error.kind, protocol::WireErrorKind::Unauthorized);
    assert_eq!(handler.resumes(), 0);
    // The delegator's answer, sent there as the delegator, resumes the attempt.
    let answer = env.answer_envelope(&waiting, "ans-route");
    env.js
        .publish(
            through("delegator"),
            serde_json::to_vec(&answer).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let done = result_of(&mut results, "t-route").await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id);
    assert_eq!(handler.resumes(), 1);
    assert_eq!(snapshot(&worker).await.counters.unauthorized, 1);
    stop(worker).await;
}
