//! Parked attempts across what could lose them: the work stream recreated (its sequences
//! start over), a cancel whose publish fails, a resume whose answer ack is lost, a worker
//! restart (the start-up sweep), and a result stored in the ingress but not routed yet.

use std::time::Duration;

use protocol::subjects;
use protocol::task::{TaskChannelBody, TaskState};

use super::*;
use crate::fault::{self, Fault, FaultPoint};
use crate::journal::Journal;

/// Asserts that the (stopped) worker's journal holds no open attempt.
fn assert_journal_empty(env: &Env) {
    let journal = Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
    let open = journal.open_attempts();
    assert!(open.is_empty(), "{open:?}");
}

#[tokio::test]
async fn a_parked_attempt_survives_the_work_stream_recreated_and_its_answer_resumes_it() {
    let env = env("parked-reuse").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let worker = env.start("worker-parked-reuse", handler.clone(), 2).await;
    assert_eq!(submit_asking(&env, "t-parked").await, 1);
    let waiting = result_of(&mut results, "t-parked").await;
    assert_eq!(waiting.state, TaskState::Waiting);
    env.wait_work_empty().await;
    // The work stream is recreated: the next task input is sequence 1 again.
    env.js.delete_stream(subjects::WORK_STREAM).await.unwrap();
    crate::streams::ensure_streams(&env.js, &env.delivery)
        .await
        .unwrap();
    assert_eq!(env.submit("t-after").await, 1);
    let after = result_of(&mut results, "t-after").await;
    assert_eq!(after.state, TaskState::Completed);
    env.wait_work_empty().await;
    let snap = wait_snapshot(&worker, "t-after done", |s| s.running == 0).await;
    assert_eq!(snap.parked, 1, "the parked attempt is still there");
    env.answer(&env.answer_envelope(&waiting, "ans-reuse"))
        .await;
    let done = result_of(&mut results, "t-parked").await;
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(done.attempt_id, waiting.attempt_id);
    assert_eq!(handler.resumes(), 1);
    let snap = wait_snapshot(&worker, "resumed", |s| s.parked == 0 && s.running == 0).await;
    assert_eq!(snap.counters.answers_refused, 0);
    stop(worker).await;
}

#[tokio::test]
async fn a_cancel_of_a_parked_attempt_whose_first_publish_fails_is_published_on_a_later_try() {
    let env = env("cancel-retry").await;
    let mut results = env.results().await;
    let name = "worker-cancel-retry";
    let worker = env.start(name, TestHandler::new(Duration::ZERO), 1).await;
    submit_asking(&env, "t-cancel").await;
    let waiting = result_of(&mut results, "t-cancel").await;
    env.wait_work_empty().await;
    wait_snapshot(&worker, "parked", |s| s.parked == 1 && s.running == 0).await;
    // The settle's first try fails between saving the cancelled result and publishing it.
    let attempt = format!("{name}.attempt.delegator.t-cancel");
    fault::arm(&attempt, FaultPoint::Handle, Fault::Error, 1);
    let reply = env
        .control(
            subjects::ControlKind::Cancel,
            "t-cancel",
            &waiting.attempt_id,
        )
        .await;
    assert_eq!(reply.cancel, Some(protocol::task::CancelStatus::Requested));
    let cancelled = result_of(&mut results, "t-cancel").await;
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(cancelled.attempt_id, waiting.attempt_id);
    assert_eq!(
        fault::remaining(&attempt, FaultPoint::Handle),
        0,
        "the first try failed"
    );
    let snap = wait_snapshot(&worker, "settled", |s| s.parked == 0 && s.running == 0).await;
    assert_eq!(snap.counters.cancelled, 1);
    // Published once: nothing else follows on the channel.
    assert!(results.drain(Duration::from_millis(500)).await.is_empty());
    stop(worker).await;
}

#[tokio::test]
async fn a_resume_whose_answer_ack_is_lost_is_closed_by_the_redelivered_answer() {
    let env = env("dup-final").await;
    let handler = TestHandler::new(Duration::ZERO);
    let mut results = env.results().await;
    let name = "worker-dup-final";
    let worker = env.start(name, handler.clone(), 1).await;
    submit_asking(&env, "t-dup").await;
    let waiting = result_of(&mut results, "t-dup").await;
    env.wait_work_empty().await;
    wait_snapshot(&worker, "parked", |s| s.parked == 1 && s.running == 0).await;
    // The resume's final result is stored; then it fails before acking its answer.
    fault::arm(
        &format!("{name}.attempt.delegator.t-dup"),
        FaultPoint::ResultConfirmed,
        Fault::Error,
        1,
    );
    env.answer(&env.answer_envelope(&waiting, "ans-dup")).await;
    let done = result_of(&mut results, "t-dup").await;
    assert_eq!(done.state, TaskState::Completed);
    // The answer comes back after its ack wait: the saved final result is republished (the
    // stream drops the copy), the answer acked, and the attempt forgotten.
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    let snap = wait_snapshot(&worker, "closed", |s| s.parked == 0 && s.running == 0).await;
    assert_eq!(handler.resumes(), 1, "not resumed twice");
    assert_eq!(snap.counters.attempt_failures, 1);
    stop(worker).await;
    assert_journal_empty(&env);
}

#[tokio::test]
async fn the_start_up_sweep_publishes_a_saved_cancel_and_forgets_attempts_finished_elsewhere() {
    let env = env("sweep").await;
    let mut results = env.results().await;
    let handler = TestHandler::new(Duration::ZERO);
    let worker = env.start("worker-sweep-1", handler.clone(), 1).await;
    // A task finished on the task channel, and one parked.
    env.submit("t-done").await;
    assert_eq!(
        result_of(&mut results, "t-done").await.state,
        TaskState::Completed
    );
    submit_asking(&env, "t-cancelled").await;
    let waiting = result_of(&mut results, "t-cancelled").await;
    env.wait_work_empty().await;
    wait_snapshot(&worker, "parked", |s| s.parked == 1 && s.running == 0).await;
    stop(worker).await;
    // What a crash leaves: the cancel of the parked attempt saved, its publish never made;
    // and an open record of t-done's input (another copy of it finished elsewhere).
    {
        let mut journal = Journal::open_when_free(&env.dir, env.worker_id.as_str()).unwrap();
        let record = journal
            .lookup_attempt("t-cancelled", waiting.attempt_id.as_str())
            .unwrap()
            .clone();
        let cancelled = SavedResult {
            seq: 2,
            result: TaskResult {
                state: TaskState::Cancelled,
                suspend: None,
                answer_route: None,
                response: None,
                ..waiting.clone()
            },
        };
        journal
            .save_result(
                record.input_seq,
                "t-cancelled",
                &serde_json::to_value(&cancelled).unwrap(),
            )
            .unwrap();
        journal
            .admit(77, "t-done", "a-elsewhere", Some("delegator"))
            .unwrap();
    }
    let worker = env.start("worker-sweep-2", handler.clone(), 1).await;
    let settled = result_of(&mut results, "t-cancelled").await;
    assert_eq!(settled.state, TaskState::Cancelled);
    assert_eq!(settled.attempt_id, waiting.attempt_id);
    let snap = wait_snapshot(&worker, "swept", |s| {
        s.parked == 0 && s.running == 0 && s.counters.swept == 1
    })
    .await;
    assert_eq!(handler.calls(), 2, "nothing ran again");
    assert_eq!(
        snap.counters.admitted, 1,
        "only the settle of the parked attempt"
    );
    assert!(results.drain(Duration::from_millis(500)).await.is_empty());
    stop(worker).await;
    assert_journal_empty(&env);
}

#[tokio::test]
async fn a_result_in_the_ingress_not_routed_yet_is_not_run_again_by_another_worker() {
    // No router routes the ingress into the task channels (it is behind): the result of the
    // first attempt is only in HUB_INGRESS when its input reaches a second worker.
    let env = env_with("unrouted", Hub::AttachOnly).await;
    let handler = TestHandler::new(Duration::ZERO);
    let name = "worker-unrouted-1";
    fault::arm(
        &format!("{name}.attempt.delegator.t-unrouted"),
        FaultPoint::ResultConfirmed,
        Fault::Error,
        1,
    );
    let first = env.start(name, handler.clone(), 1).await;
    env.submit("t-unrouted").await;
    wait_snapshot(&first, "attempt failed", |s| {
        s.counters.attempt_failures == 1
    })
    .await;
    stop(first).await;
    let other = WorkerId::new("w-unrouted-other").unwrap();
    let second = spawn(env.worker_as("worker-unrouted-2", other, handler.clone(), 1)).await;
    env.wait_work_empty().await;
    let snap = wait_snapshot(&second, "settled", |s| s.counters.settled == 1).await;
    assert_eq!(handler.calls(), 1, "run once");
    assert_eq!(snap.counters.completed, 0);
    stop(second).await;
}

#[tokio::test]
async fn an_answer_refusal_is_published_as_the_refusing_worker() {
    let env = env("refusal-from").await;
    let worker = env
        .start("worker-refusal-from", TestHandler::new(Duration::ZERO), 1)
        .await;
    let mut results = env.results().await;
    let ghost = serde_json::json!({
        "meta": { "id": "ans-ghost", "from": "boss" },
        "body": {
            "message_id": "ans-ghost", "task_id": "t-ghost-from", "attempt_id": "a-ghost",
            "worker_id": "w-someone-else", "tool_call_id": "call-1", "responses": ["yes"],
        },
    });
    env.answer(&ghost).await;
    let (body, from) = results.next_from(DEADLINE).await.expect("a refusal");
    assert!(
        matches!(body, TaskChannelBody::AnswerRefused(_)),
        "{body:?}"
    );
    assert_eq!(from, env.worker_id.as_str());
    stop(worker).await;
}

/// Parks at once on `[ask]` tasks; runs any other task until it is cancelled. Counts resumes.
#[derive(Default)]
struct AskOrHold {
    resumes: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl TaskHandler for AskOrHold {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        if task.text.contains("[ask]") {
            return Outcome::Waiting {
                question: "approve?".into(),
                tool_call_id: "call-1".into(),
            };
        }
        ctx.cancelled().await;
        Outcome::Cancelled
    }

    async fn resume(&self, _: TaskSpec, _: Vec<Answer>, _: AttemptContext) -> Outcome {
        self.resumes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Outcome::Completed(serde_json::json!("resumed"))
    }
}

#[tokio::test]
async fn a_cancel_of_a_resume_waiting_for_its_slot_is_cancelled_without_running() {
    let env = env("resume-slot-cancel").await;
    let handler = Arc::new(AskOrHold::default());
    let mut results = env.results().await;
    let worker = spawn(Worker {
        shutdown_grace: Duration::from_millis(500),
        ..env.worker("worker-resume-slot", handler.clone(), 1)
    })
    .await;
    submit_asking(&env, "t-asks").await;
    let waiting = result_of(&mut results, "t-asks").await;
    env.wait_work_empty().await;
    // The only slot is taken by a task that holds it.
    env.submit("t-holds").await;
    wait_snapshot(&worker, "the slot is taken", |s| {
        s.running == 1 && s.parked == 1
    })
    .await;
    env.answer(&env.answer_envelope(&waiting, "ans-slot")).await;
    wait_snapshot(&worker, "the resume waits", |s| s.running == 2).await;
    let reply = env
        .control(subjects::ControlKind::Cancel, "t-asks", &waiting.attempt_id)
        .await;
    assert_eq!(reply.cancel, Some(protocol::task::CancelStatus::Requested));
    let cancelled = result_of(&mut results, "t-asks").await;
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(cancelled.attempt_id, waiting.attempt_id);
    env.wait_empty(subjects::ANSWERS_STREAM).await;
    let snap = wait_snapshot(&worker, "cancelled", |s| s.running == 1 && s.parked == 0).await;
    assert_eq!(handler.resumes.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(snap.counters.cancelled, 1);
    stop(worker).await;
}
