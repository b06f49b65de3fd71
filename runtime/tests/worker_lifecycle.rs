//! Real worker processes across a graceful shutdown (SIGTERM) and a broker crash between a
//! stored result and its input ack.

mod support;

use std::time::{Duration, Instant};

use harness::RuntimeProcess;
use protocol::subjects;
use protocol::task::TaskState;
use protocol::{AgentId, QueueName};
use runtime::system::tasks::new_task;
use support::processes::{logs, Scene};

const DEADLINE: Duration = Duration::from_secs(60);

/// An exec script that appends `<WORKER_ID> <TASK_RERUN>` to `<markers>/runs`, sleeps
/// `$SLEEP_<WORKER_ID>` seconds (0 when unset) and answers with its worker id.
const SCRIPT: &str = "cat > /dev/null\n\
    echo \"$WORKER_ID $TASK_RERUN\" >> '{markers}/runs'\n\
    eval \"s=\\${SLEEP_$WORKER_ID:-0}\"\n\
    sleep \"$s\"\n\
    printf '{\"response\": \"%s\"}\\n' \"$WORKER_ID\"\n";

fn runs(scene: &Scene) -> Vec<String> {
    std::fs::read_to_string(scene.markers().join("runs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn alice() -> AgentId {
    support::agent("alice")
}

/// The final result `tracking` gets, or a panic with the logs of `processes`.
async fn final_result(
    tracking: runtime::system::tasks::Tracking,
    processes: &[(&str, &RuntimeProcess)],
) -> protocol::task::TaskResult {
    tokio::time::timeout(DEADLINE, tracking.result)
        .await
        .unwrap_or_else(|_| panic!("no result\n{}", logs(processes)))
        .unwrap()
}

async fn wait_exit(process: &mut RuntimeProcess, within: Duration) -> Option<i32> {
    process.wait_exit(within).await.expect("the process exits")
}

/// What [`one_task_started`] starts.
struct Started {
    scene: Scene,
    router: RuntimeProcess,
    worker: RuntimeProcess,
    hub: runtime::ActorSystem,
    tracking: runtime::system::tasks::Tracking,
}

/// A router (ack wait 20 s), worker `id` on `queue` running [`SCRIPT`] (with `args` and
/// `env`), a durable system, and one task delegated to `queue`, seen started.
async fn one_task_started(
    url: &str,
    id: &str,
    queue: &str,
    args: &[&str],
    env: &[(&str, &str)],
    server: &harness::NatsServer,
) -> Started {
    let scene = Scene::new(0)
        .with_delivery(r#"{"ack_wait_secs": 20}"#)
        .with_script(SCRIPT);
    let router = scene.router(url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let worker = scene.worker_with(url, id, queue, args, env);
    let hub = support::durable_system(url.to_owned()).await;
    let spec = new_task(format!("a task for {id}"), vec![]);
    let (_, tracking) = hub
        .delegate_tracked(&alice(), &QueueName::new(queue).unwrap(), None, &spec)
        .await
        .unwrap();
    harness::wait_until("the task started", DEADLINE, || !runs(&scene).is_empty())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&[("router", &router), (id, &worker)])));
    Started {
        scene,
        router,
        worker,
        hub,
        tracking,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_task_lets_a_short_task_complete_once_before_exit() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let Started {
        scene,
        router,
        worker: mut w1,
        hub,
        tracking,
    } = one_task_started(&url, "sw1", "sq", &[], &[("SLEEP_sw1", "2")], &server).await;
    // Another worker joins; then the first is asked to stop mid-task.
    let w2 = scene.worker(&url, "sw2", "sq");
    w1.signal(15);
    let result = final_result(tracking, &[("router", &router), ("sw1", &w1), ("sw2", &w2)]).await;
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.worker_id.as_str(), "sw1", "finished where it ran");
    assert_eq!(wait_exit(&mut w1, Duration::from_secs(15)).await, Some(0));
    let js = support::js(&server).await;
    harness::wait_until_async("the input acked", DEADLINE, || async {
        support::stream_messages(&js, subjects::WORK_STREAM).await == 0
    })
    .await
    .unwrap();
    assert_eq!(runs(&scene), ["sw1 0"], "ran once");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_long_task_hands_it_to_another_worker_at_once() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    // A 20 s ack wait: the task must move long before it.
    let Started {
        scene,
        router,
        worker: mut w1,
        hub,
        tracking,
    } = one_task_started(
        &url,
        "lw1",
        "lq",
        &["--shutdown-grace-secs", "2"],
        &[("SLEEP_lw1", "120")],
        &server,
    )
    .await;
    let w2 = scene.worker(&url, "lw2", "lq");
    support::wait_router_answers(&server.client().await.unwrap()).await;
    wait_joined(&hub, "lw2").await;
    let stopped = Instant::now();
    w1.signal(15);
    let result = final_result(tracking, &[("router", &router), ("lw1", &w1), ("lw2", &w2)]).await;
    let moved_after = stopped.elapsed();
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.worker_id.as_str(), "lw2");
    assert!(
        moved_after < Duration::from_secs(10),
        "the task moved after {moved_after:?}, not at once (the ack wait is 20 s)"
    );
    assert_eq!(wait_exit(&mut w1, Duration::from_secs(15)).await, Some(0));
    assert_eq!(runs(&scene), ["lw1 0", "lw2 1"]);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Worker `id` on `queue`, armed to die (as with kill -9) right after the stream confirmed
/// the result of `spec`, before its input ack.
fn dying_after_result(
    scene: &Scene,
    url: &str,
    id: &str,
    queue: &str,
    spec: &protocol::task::TaskSpec,
) -> RuntimeProcess {
    let fault = format!(
        "sys1/worker-{id}.attempt.alice.{}@result_confirmed=exit",
        spec.task_id
    );
    scene.worker_with(url, id, queue, &[], &[("RUNTIME_FAULTS", &fault)])
}

/// Waits until worker `id` answers the status request.
async fn wait_joined(hub: &runtime::ActorSystem, id: &str) {
    harness::wait_until_async(&format!("{id} joined"), DEADLINE, || async {
        runtime::request_worker_status(hub.client(), Duration::from_millis(300))
            .await
            .is_ok_and(|w| w.iter().any(|s| s.worker_id == id))
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_stored_but_unconfirmed_when_the_broker_crashed_is_not_run_again() {
    let mut server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(0)
        .with_delivery(r#"{"ack_wait_secs": 2}"#)
        .with_script(SCRIPT);
    let mut router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let spec = new_task("stored then crashed", vec![]);
    // The result is stored, the input is not acked.
    let mut w1 = dying_after_result(&scene, &url, "cw1", "cq", &spec);
    let hub = support::durable_system(url.clone()).await;
    wait_joined(&hub, "cw1").await;
    hub.delegate(&alice(), &QueueName::new("cq").unwrap(), None, &spec)
        .await
        .unwrap();
    let exited = w1.wait_exit(DEADLINE).await.expect("cw1 exits");
    assert_ne!(exited, Some(0), "the fault fired\n{}", w1.log());
    assert_eq!(runs(&scene).len(), 1);
    // Everything restarts: the broker (its delivery counts start again at 1), the router and a
    // worker with a journal of its own.
    hub.shutdown(Duration::from_secs(5)).await.unwrap();
    router.kill9().await;
    server.restart().await.unwrap();
    let router = scene.router(&url);
    let js = support::js(&server).await;
    harness::wait_until_async("the stored result routed", DEADLINE, || async {
        !support::results_on(&js, &spec.task_id).await.is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&[("router", &router)])));
    let w2 = scene.worker(&url, "cw2", "cq");
    harness::wait_until_async("the input settled", DEADLINE, || async {
        support::stream_messages(&js, subjects::WORK_STREAM).await == 0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&[("router", &router), ("cw2", &w2)])));
    let results = support::results_on(&js, &spec.task_id).await;
    assert_eq!(runs(&scene), ["cw1 0"], "one execution");
    assert_eq!(results.len(), 1, "one completed result: {results:?}");
    assert_eq!(results[0].state, TaskState::Completed);
    assert_eq!(results[0].worker_id.as_str(), "cw1");
}

/// The directory holding `consumer`'s state in the server's store (`…/obs/<consumer>`).
fn consumer_dir(server: &harness::NatsServer, stream: &str, consumer: &str) -> std::path::PathBuf {
    fn find(dir: &std::path::Path, stream: &str, consumer: &str) -> Option<std::path::PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if path.ends_with(format!("streams/{stream}/obs/{consumer}")) {
                return Some(path);
            }
            if let Some(found) = find(&path, stream, consumer) {
                return Some(found);
            }
        }
        None
    }
    find(&server.store_dir(), stream, consumer)
        .unwrap_or_else(|| panic!("no state of {stream}/{consumer} under the store"))
}

/// The consumer's state files (name and bytes), to put back later.
fn consumer_state(dir: &std::path::Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_delivered_once_more_after_a_broker_crash_is_not_run_again() {
    let mut server = harness::run_server().await.unwrap();
    let url = server.url();
    // A 20 s ack wait: nothing is redelivered before the crash.
    let scene = Scene::new(0)
        .with_delivery(r#"{"ack_wait_secs": 20}"#)
        .with_script(SCRIPT);
    let router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let spec = new_task("finished, then delivered once more", vec![]);
    let mut w1 = dying_after_result(&scene, &url, "kw1", "kq", &spec);
    let hub = support::durable_system(url.clone()).await;
    wait_joined(&hub, "kw1").await;
    // The queue consumer's state before the delivery.
    let queue = QueueName::new("kq").unwrap();
    let obs = consumer_dir(
        &server,
        subjects::WORK_STREAM,
        &subjects::queue_consumer(&queue),
    );
    let before = consumer_state(&obs);
    hub.delegate(&alice(), &queue, None, &spec).await.unwrap();
    // kw1 dies right after the stream confirmed its result, before its input ack.
    let exited = w1.wait_exit(DEADLINE).await.expect("kw1 exits");
    assert_ne!(exited, Some(0), "the fault fired\n{}", w1.log());
    let js = support::js(&server).await;
    harness::wait_until_async("the result routed", DEADLINE, || async {
        !support::results_on(&js, &spec.task_id).await.is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&[("router", &router)])));
    // Another worker of the queue is connected before the broker crashes.
    let w2 = scene.worker(&url, "kw2", "kq");
    wait_joined(&hub, "kw2").await;
    hub.shutdown(Duration::from_secs(5)).await.unwrap();
    // The broker writes a consumer's state lazily, after the delivery: a kill -9 before that
    // write leaves the state as it was before the delivery (the chaos run saw delivery counts
    // start again at 1). Here that state is put back while the broker is down.
    server.stop().await;
    for entry in std::fs::read_dir(&obs).unwrap().flatten() {
        if entry.path().is_file() {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    for (name, bytes) in &before {
        std::fs::write(obs.join(name), bytes).unwrap();
    }
    server.start().await.unwrap();
    let js = support::js(&server).await;
    // The broker delivers the input again, counted once, to kw2, which settles it from the
    // task channel instead of running it: the input was stored before kw2's baseline, taken
    // again on its new connection. (Without that rule kw2 runs it with `TASK_RERUN=0`.)
    harness::wait_until_async("the input settled", DEADLINE, || async {
        support::stream_messages(&js, subjects::WORK_STREAM).await == 0
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&[("router", &router), ("kw2", &w2)])));
    let results = support::results_on(&js, &spec.task_id).await;
    assert_eq!(runs(&scene), ["kw1 0"], "one execution");
    assert_eq!(results.len(), 1, "one completed result: {results:?}");
    assert_eq!(results[0].worker_id.as_str(), "kw1");
}
