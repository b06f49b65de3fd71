//! The task claim: an attempt takes its task in `HUB_CLAIMS` before its handler runs, so a
//! second delivery of a task running elsewhere stands down instead of running it again.

use protocol::task::TaskState;

use super::*;

#[tokio::test]
async fn a_task_delivered_again_while_it_runs_on_another_worker_is_not_run_twice() {
    // nats-server writes a consumer's delivery state lazily, so a kill -9 can make it forget a
    // delivery, and hand the task out again as a first delivery while the first attempt runs
    // it (docs/RELIABILITY.md). The same happens, deterministically, when the queue consumer
    // is made again under a running attempt.
    let env = env("claimed").await;
    let mut results = env.results().await;
    let first_gate = Gate::new();
    let first = env.start("worker-claimed-1", first_gate.clone(), 1).await;
    env.submit("t-claimed").await;
    first_gate.wait_started("t").await;
    let second_gate = Gate::new();
    second_gate.open();
    let other = WorkerId::new("w-claimed-other").unwrap();
    let second = spawn(env.worker_as("worker-claimed-2", other, second_gate.clone(), 1)).await;
    wait_snapshot(&second, "the second worker joined", |s| s.bound).await;
    env.remake_queue_consumer().await;
    wait_snapshot(&second, "t delivered to the second worker", |s| {
        s.counters.admitted >= 1
    })
    .await;
    let snap = wait_snapshot(&second, "the second worker stood down", |s| {
        s.counters.stood_down >= 1
    })
    .await;
    assert_eq!(second_gate.calls(), 0, "{snap:?}");
    first_gate.open();
    let t = result_of(&mut results, "t-claimed").await;
    assert_eq!(t.state, TaskState::Completed);
    env.wait_work_empty().await;
    assert_eq!(second_gate.calls(), 0, "t ran on the second worker too");
    assert_eq!(first_gate.calls(), 1);
    let finals = env
        .stored_results(&t.task_id)
        .await
        .iter()
        .filter(|r| r.state.is_final())
        .count();
    assert_eq!(finals, 1, "one final result");
    let snap = snapshot(&first).await;
    assert_eq!(snap.counters.claims_taken, 1, "{snap:?}");
    stop(second).await;
    stop(first).await;
}
