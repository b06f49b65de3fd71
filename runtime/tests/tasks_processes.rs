//! Tasks across real `runtime` processes killed with SIGKILL: a worker mid-task, a waiting
//! delegator, and the router between a worker's result and the delegator.

mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actors::worker::{AttemptContext, Outcome, TaskHandler};
use protocol::task::{TaskResult, TaskSpec, TaskState};
use protocol::{AgentId, QueueName, WorkerId};
use runtime::system::tasks::new_task;
use runtime::system::worker::WorkerSettings;
use runtime::ActorSystem;
use support::processes::{logs, one_shot, Scene};
use tokio::io::{AsyncBufReadExt, BufReader};

const DEADLINE: Duration = Duration::from_secs(90);

async fn system(url: &str) -> ActorSystem {
    support::durable_system(url.to_string()).await
}

#[tokio::test]
async fn worker_killed_with_sigkill_mid_task_the_task_is_redelivered_and_completed_by_the_other_worker(
) {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(3);
    let router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let mut w1 = scene.worker(&url, "pw1", "procs");
    let mut w2 = scene.worker(&url, "pw2", "procs");

    let hub = system(&url).await;
    let spec = new_task("survive a kill", vec![]);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(
        &AgentId::new("alice").unwrap(),
        &QueueName::new("procs").unwrap(),
        None,
        &spec,
    )
    .await
    .unwrap();
    let started = harness::wait_until("a worker started the task", DEADLINE, || {
        !scene.started().is_empty()
    })
    .await;
    if let Err(e) = started {
        panic!(
            "{e}\n{}",
            logs(&[("router", &router), ("pw1", &w1), ("pw2", &w2)])
        );
    }
    let victim = scene.started().remove(0);
    let other = if victim == "pw1" { "pw2" } else { "pw1" };
    if victim == "pw1" {
        w1.kill9().await;
    } else {
        w2.kill9().await;
    }
    let result = match tokio::time::timeout(DEADLINE, tracking.result).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!(
            "no result\n{}",
            logs(&[("router", &router), ("pw1", &w1), ("pw2", &w2)])
        ),
    };
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.worker_id.as_str(), other, "{result:?}");
    assert_eq!(result.response, Some(serde_json::json!(other)));
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// An `--exec` handler ends with its worker, whatever the way out (issue 28, B2): a worker
/// killed with SIGKILL mid-task takes the handler and the child it forked with it within a
/// second (before, both lived on, parented to init, while another worker ran the task again),
/// and the task then completes once on the other worker, flagged as a re-run.
#[tokio::test]
async fn a_worker_killed_with_sigkill_takes_its_handler_and_the_handlers_child_with_it() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    // A first run forks a child, writes both pids, and waits for it; a re-run answers at once.
    let scene = Scene::new(0).with_script(
        "cat > /dev/null\n\
         if [ \"$TASK_RERUN\" = 0 ]; then\n\
           sleep 60 &\n\
           echo \"$$ $!\" > '{markers}'/\"$WORKER_ID\".tmp\n\
           mv '{markers}'/\"$WORKER_ID\".tmp '{markers}'/\"$WORKER_ID\"\n\
           wait\n\
         fi\n\
         printf '{\"response\": \"%s\"}\\n' \"$TASK_RERUN\"\n",
    );
    let router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let mut w1 = scene.worker(&url, "ow1", "orphans");
    let mut w2 = scene.worker(&url, "ow2", "orphans");
    let hub = system(&url).await;
    let alice = AgentId::new("alice").unwrap();
    let spec = new_task("leave no orphan", vec![]);
    let tracking = hub.track(&alice, &spec.task_id).await.unwrap();
    hub.delegate(&alice, &QueueName::new("orphans").unwrap(), None, &spec)
        .await
        .unwrap();
    let started = harness::wait_until("a handler started", DEADLINE, || {
        !scene.started().iter().all(|f| f.ends_with(".tmp"))
    })
    .await;
    if let Err(e) = started {
        panic!(
            "{e}\n{}",
            logs(&[("router", &router), ("ow1", &w1), ("ow2", &w2)])
        );
    }
    let victim = scene
        .started()
        .into_iter()
        .find(|f| !f.ends_with(".tmp"))
        .unwrap();
    let pids: Vec<u32> = std::fs::read_to_string(scene.markers().join(&victim))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|p| !ended(*p)), "both run: {pids:?}");
    let other = if victim == "ow1" { "ow2" } else { "ow1" };
    if victim == "ow1" {
        w1.kill9().await;
    } else {
        w2.kill9().await;
    }
    let gone = harness::wait_until(
        "the handler and its child ended with their worker",
        Duration::from_secs(1),
        || pids.iter().all(|p| ended(*p)),
    )
    .await;
    let left: Vec<u32> = pids.iter().copied().filter(|p| !ended(*p)).collect();
    // Whatever the outcome, nothing is left behind for the next test.
    for pid in &left {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(
        gone.is_ok(),
        "still running a second after their worker died: {left:?}"
    );
    let result = match tokio::time::timeout(DEADLINE, tracking.result).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!(
            "no result\n{}",
            logs(&[("router", &router), ("ow1", &w1), ("ow2", &w2)])
        ),
    };
    assert_eq!(
        (result.state, result.worker_id.as_str()),
        (TaskState::Completed, other),
        "{result:?}"
    );
    assert_eq!(result.response, Some(serde_json::json!("1")), "a re-run");
    let completed = support::results_on(&support::js(&server).await, &spec.task_id)
        .await
        .into_iter()
        .filter(|r| r.state == TaskState::Completed)
        .count();
    assert_eq!(completed, 1, "one completed run");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn delegator_killed_while_its_task_runs_resume_still_gets_the_result() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(2);
    let router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let worker = scene.worker(&url, "dw1", "dq");

    let mut delegator = one_shot(&[
        "delegate",
        "--as",
        "alice",
        "--queue",
        "dq",
        "do it",
        "--wait",
        "--timeout-secs",
        "60",
        "--nats-url",
        &url,
    ])
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(delegator.stdout.take().unwrap()).lines();
    let receipt = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("a receipt in time")
        .unwrap()
        .expect("a receipt line");
    let receipt: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    let task_id = receipt["task_id"].as_str().unwrap().to_string();

    let started = harness::wait_until("the worker started the task", DEADLINE, || {
        !scene.started().is_empty()
    })
    .await;
    if let Err(e) = started {
        panic!("{e}\n{}", logs(&[("router", &router), ("worker", &worker)]));
    }
    delegator.kill().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), lines.next_line())
            .await
            .map_or(true, |line| line.unwrap().is_none()),
        "the delegator printed no result before the kill"
    );

    let out = tokio::time::timeout(
        DEADLINE,
        one_shot(&[
            "delegate",
            "--as",
            "alice",
            "--resume",
            &task_id,
            "--timeout-secs",
            "60",
            "--nats-url",
            &url,
        ])
        .output(),
    )
    .await
    .expect("resume in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "resume failed: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs(&[("router", &router), ("worker", &worker)])
    );
    let line = stdout.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    let result: TaskResult = serde_json::from_str(line).unwrap();
    assert_eq!(result.task_id.as_str(), task_id);
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.response, Some(serde_json::json!("dw1")));
}

/// Counts runs, signals the start, sleeps `delay`, completes.
struct Slow {
    delay: Duration,
    runs: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl TaskHandler for Slow {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        self.runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        Outcome::Completed(serde_json::json!({"text": task.text, "worker": ctx.worker_id.as_str()}))
    }
}

fn journal_dir(dir: &Path) -> PathBuf {
    dir.join("journal")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_killed_between_a_workers_result_and_the_delegator_the_result_still_arrives() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(0);
    let mut first = scene.router(&url);
    let client = server.client().await.unwrap();
    support::wait_router_answers(&client).await;

    let hub = system(&url).await;
    let queue = QueueName::new("rq").unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    hub.start_worker(WorkerSettings {
        worker_id: WorkerId::new("rw1").unwrap(),
        queue: queue.clone(),
        concurrency: 1,
        journal_dir: journal_dir(scene.dir.path()),
        handler: Arc::new(Slow {
            delay: Duration::from_secs(2),
            runs: runs.clone(),
        }),
        shutdown_grace: actors::worker::DEFAULT_SHUTDOWN_GRACE,
    })
    .await
    .unwrap();
    let spec = new_task("across a router crash", vec![]);
    let tracking = hub
        .track(&protocol::AgentId::new("alice").unwrap(), &spec.task_id)
        .await
        .unwrap();
    hub.delegate(&AgentId::new("alice").unwrap(), &queue, None, &spec)
        .await
        .unwrap();
    harness::wait_until("the task started", DEADLINE, || {
        runs.load(Ordering::SeqCst) >= 1
    })
    .await
    .unwrap();
    first.kill9().await;

    let second = scene.router(&url);
    support::wait_router_answers(&client).await;
    let result = match tokio::time::timeout(DEADLINE, tracking.result).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("no result\n{}", logs(&[("second router", &second)])),
    };
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(result.task_id, spec.task_id);
    assert_eq!(result.worker_id.as_str(), "rw1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once");
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn worker_killed_with_sigkill_mid_task_and_restarted_on_its_journal_reruns_the_same_attempt()
{
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(0).rerun_script();
    let router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let mut worker = scene.worker(&url, "rw1", "rq");

    let hub = system(&url).await;
    let (_, tracking) = hub
        .delegate_tracked(
            &AgentId::new("alice").unwrap(),
            &QueueName::new("rq").unwrap(),
            None,
            &new_task("rerun me", vec![]),
        )
        .await
        .unwrap();
    let marker = scene.dir.path().join("markers").join("rw1");
    let started = harness::wait_until("the first run started", DEADLINE, || {
        std::fs::read_to_string(&marker).is_ok_and(|a| !a.is_empty())
    })
    .await;
    if let Err(e) = started {
        panic!("{e}\n{}", logs(&[("router", &router), ("rw1", &worker)]));
    }
    let first_attempt = std::fs::read_to_string(&marker).unwrap();
    // The admission is in the journal's page cache, not yet fsync'd: a process kill keeps it.
    worker.kill9().await;
    let restarted = scene.worker(&url, "rw1", "rq");
    let result = match tokio::time::timeout(DEADLINE, tracking.result).await {
        Ok(r) => r.unwrap(),
        Err(_) => panic!(
            "no result\n{}",
            logs(&[("router", &router), ("rw1 again", &restarted)])
        ),
    };
    assert_eq!(result.state, TaskState::Completed, "{result:?}");
    assert_eq!(
        result.attempt_id.as_str(),
        first_attempt,
        "the same attempt"
    );
    assert_eq!(
        result.response,
        Some(serde_json::json!(format!("{first_attempt}:1"))),
        "re-run flagged"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Whether this test process runs as root (it may then start workers that switch users).
fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `--exec-user` (issue 28, C): a handler run as another user can read neither its worker's
/// environment (where the NATS secret is) nor the worker's credentials file, and has no secret
/// in its own environment. A handler run as the worker's own user reads the worker's
/// environment: the control, and what docs/SECURITY.md says holds without `--exec-user`. A
/// worker that cannot switch users refuses to start (exit 64).
#[tokio::test]
async fn a_handler_run_as_another_user_reads_neither_the_workers_environment_nor_its_credentials() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let scene = Scene::new(0);
    if !is_root() {
        let mut worker = scene.worker_with(&url, "eu1", "asuser", &["--exec-user", "nobody"], &[]);
        let code = worker.wait_exit(DEADLINE).await.unwrap();
        assert_eq!(code, Some(64), "{}", worker.log());
        assert!(worker.log().contains("--exec-user"), "{}", worker.log());
        return;
    }
    let creds = scene.dir.path().join("worker.env");
    std::fs::write(&creds, "NATS_TOKEN=s3cret-token\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // Everything under the scene's dir is the worker's; the handler must be able to run its
    // script (not to read the credentials next to it).
    std::fs::set_permissions(
        scene.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let _router = scene.router(&url);
    support::wait_router_answers(&server.client().await.unwrap()).await;
    let secret = [("NATS_TOKEN", "s3cret-token")];
    let mut apart = scene.worker_with(&url, "eu1", "asuser", &["--exec-user", "nobody"], &secret);
    let mut same = scene.worker_with(&url, "eu2", "sameuser", &[], &secret);
    // The script learns its worker's pid from the marker the worker's pid is written to.
    let pids = [("eu1", apart.pid().unwrap()), ("eu2", same.pid().unwrap())];
    let mut script = String::from("cat > /dev/null\ncase \"$WORKER_ID\" in\n");
    for (id, pid) in pids {
        script.push_str(&format!("  {id}) worker={pid} ;;\n"));
    }
    script.push_str(&format!(
        "esac\n\
         uid=$(id -u)\n\
         if tr '\\0' '\\n' < /proc/$worker/environ 2>/dev/null | grep -q s3cret; then environ=read; else environ=denied; fi\n\
         if cat '{creds}' > /dev/null 2>&1; then creds=read; else creds=denied; fi\n\
         if env | grep -q s3cret; then own=yes; else own=no; fi\n\
         printf '{{\"response\": {{\"uid\": \"%s\", \"environ\": \"%s\", \"creds\": \"%s\", \"own\": \"%s\"}}}}\\n' \"$uid\" \"$environ\" \"$creds\" \"$own\"\n",
        creds = creds.display()
    ));
    std::fs::write(scene.dir.path().join("task.sh"), script).unwrap();
    std::fs::set_permissions(
        scene.dir.path().join("task.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let hub = system(&url).await;
    let alice = AgentId::new("alice").unwrap();
    let mut responses = Vec::new();
    for queue in ["asuser", "sameuser"] {
        let spec = new_task("who am i", vec![]);
        let tracking = hub.track(&alice, &spec.task_id).await.unwrap();
        hub.delegate(&alice, &QueueName::new(queue).unwrap(), None, &spec)
            .await
            .unwrap();
        let result = match tokio::time::timeout(DEADLINE, tracking.result).await {
            Ok(r) => r.unwrap(),
            Err(_) => panic!("no result\n{}", logs(&[("eu1", &apart), ("eu2", &same)])),
        };
        assert_eq!(result.state, TaskState::Completed, "{result:?}");
        responses.push(result.response.unwrap());
    }
    assert_eq!(
        responses[0],
        serde_json::json!({"uid": "65534", "environ": "denied", "creds": "denied", "own": "no"}),
        "as nobody"
    );
    assert_eq!(
        responses[1],
        serde_json::json!({"uid": "0", "environ": "read", "creds": "read", "own": "no"}),
        "as the worker's own user"
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
    let _ = (
        apart.terminate(Duration::from_secs(10)).await,
        same.terminate(Duration::from_secs(10)).await,
    );
}
