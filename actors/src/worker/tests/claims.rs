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

#[tokio::test]
async fn a_running_input_delivered_again_as_a_first_delivery_is_not_acked_as_its_own_alias() {
    // A broker that forgot a delivery (a kill -9, a consumer made again) hands a running
    // attempt's input to its own worker again, at the same sequence, as a first delivery. It
    // is that attempt's input, not another message: acking it as an alias of the running task
    // removed it from the work stream, and the task was lost when the attempt then failed
    // (seen in a fresh-clone CI run of the chaos program: a task never ran, no result).
    let env = env("own-alias").await;
    let mut results = env.results().await;
    let gate = Gate::new();
    let worker = env.start("worker-own-alias", gate.clone(), 2).await;
    env.submit("t-own-alias").await;
    gate.wait_started("t").await;
    env.remake_queue_consumer().await;
    let snap = wait_snapshot(&worker, "t delivered again", |s| {
        s.counters.aliased + s.counters.redelivered_while_running >= 1
    })
    .await;
    assert_eq!(snap.counters.aliased, 0, "{snap:?}");
    assert_eq!(
        env.work_left().await,
        1,
        "the input is still in the work stream"
    );
    // The attempt fails before it publishes (the next message it handles): its input is the
    // only copy of the task, and it comes back.
    crate::fault::arm(
        "worker-own-alias.attempt.delegator.t-own-alias",
        crate::fault::FaultPoint::Handle,
        crate::fault::Fault::Error,
        1,
    );
    gate.open();
    let t = result_of(&mut results, "t-own-alias").await;
    assert_eq!(t.state, TaskState::Completed);
    env.wait_work_empty().await;
    stop(worker).await;
}
