//! The task commands of the `runtime` binary as a user runs them: configured stream names,
//! and a task that asks a question while the delegator waits.

mod support;

use std::process::Output;
use std::time::Duration;

use harness::RuntimeProcess;
use serde_json::Value;
use support::processes::one_shot;
use tokio::io::{AsyncBufReadExt, BufReader};

const DEADLINE: Duration = Duration::from_secs(30);

async fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    support::oneshot::run_cli_env(args, envs).await
}

/// `runtime answer <task_id> --as alice --text because`, which must succeed.
async fn answer_because(task_id: &str, url: &str, envs: &[(&str, &str)]) {
    let args = [
        "answer",
        task_id,
        "--as",
        "alice",
        "--text",
        "because",
        "--nats-url",
        url,
    ];
    let out = run(&args, envs).await;
    assert_eq!(out.status.code(), Some(0), "answer: {}", describe(&out));
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A router and a worker (`deploy/worker-echo.py`: a text ending in `?` asks first) in one
/// process, with `delivery` as the delivery config.
struct Hub {
    _dir: tempfile::TempDir,
    config: String,
    _process: RuntimeProcess,
}

async fn hub(server: &harness::NatsServer, delivery: &str) -> Hub {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("delivery.json");
    std::fs::write(&config, delivery).unwrap();
    let config = config.display().to_string();
    let journal = dir.path().join("journal").display().to_string();
    let script = harness::workspace_root().join("deploy/worker-echo.py");
    let exec = format!("python3 {}", script.display());
    let url = server.url();
    let process = RuntimeProcess::spawn(
        [
            "start",
            "--role",
            "all",
            "--durable",
            "--worker-id",
            "cw",
            "--queue",
            "cq",
            "--exec",
            &exec,
            "--journal-dir",
            &journal,
            "--nats-url",
            &url,
            "--delivery-config",
            &config,
        ],
        &[("RUST_LOG", "warn")],
    )
    .unwrap();
    let client = server.client().await.unwrap();
    support::wait_router_answers(&client).await;
    harness::wait_until_async("the worker joined", DEADLINE, || async {
        runtime::request_worker_status(&client, Duration::from_millis(300))
            .await
            .is_ok_and(|w| !w.is_empty())
    })
    .await
    .unwrap();
    Hub {
        _dir: dir,
        config,
        _process: process,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_commands_use_the_configured_stream_names() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let hub = hub(
        &server,
        r#"{"tasks": {"name": "MY_TASKS"}, "inbox": {"name": "MY_INBOX"}}"#,
    )
    .await;
    // `runtime <command> [<action>] --nats-url URL --delivery-config FILE [args]`.
    let with_config = |args: &[&str]| {
        let (command, rest) = args.split_at(1);
        let mut all: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        all.extend(["--nats-url".into(), url.clone()]);
        all.extend(["--delivery-config".into(), hub.config.clone()]);
        all.extend(rest.iter().map(|s| s.to_string()));
        all
    };
    let args = with_config(&["delegate", "--as", "alice", "--queue", "cq", "why?"]);
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    assert_eq!(out.status.code(), Some(0), "delegate: {}", describe(&out));
    let task_id = json_lines(&out)[0]["task_id"].as_str().unwrap().to_string();

    // `task status` with the config file.
    let args = with_config(&["task", "status", &task_id, "--as", "alice"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let waiting = std::cell::RefCell::new(Value::Null);
    harness::wait_until_async("the task waits", DEADLINE, || async {
        let out = run(&args, &[]).await;
        let reply = json_lines(&out).pop().unwrap_or(Value::Null);
        let done = reply["state"] == "waiting";
        *waiting.borrow_mut() = reply;
        done
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", waiting.borrow()));

    // `answer` with the environment variable instead of the file.
    answer_because(&task_id, &url, &[("NATS_HUB_TASKS_STREAM", "MY_TASKS")]).await;

    // `delegate --resume` finds the result on the configured stream (following answers: the
    // channel may still show the question for a moment after the answer).
    let args = with_config(&[
        "delegate",
        "--as",
        "alice",
        "--resume",
        &task_id,
        "--follow-answers",
        "--timeout-secs",
        "20",
    ]);
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    assert_eq!(out.status.code(), Some(0), "resume: {}", describe(&out));
    let result = json_lines(&out).pop().unwrap();
    assert_eq!(result["state"], "completed", "{result}");
    assert_eq!(result["response"]["answers"][0]["responses"][0], "because");

    // A DM through the configured inbox stream.
    let args = with_config(&["send", "--as", "alice", "--to", "bob", "hello bob"]);
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    assert_eq!(out.status.code(), Some(0), "send: {}", describe(&out));
    let out = run(
        &["inbox", "--as", "bob", "--json", "--nats-url", &url],
        &[("NATS_HUB_INBOX_STREAM", "MY_INBOX")],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "inbox: {}", describe(&out));
    let dms = json_lines(&out);
    assert_eq!(dms.len(), 1, "{}", describe(&out));
    assert_eq!(dms[0]["body"], "hello bob");
    drop(hub);
}

/// The exit code of `delegate --wait`/`--resume` when the task waits for an answer.
const EXIT_WAITING: i32 = 75;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_wait_on_a_question_prints_it_and_exits_with_the_waiting_code() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let _hub = hub(&server, "{}").await;
    let out = run(
        &[
            "delegate",
            "--as",
            "alice",
            "--queue",
            "cq",
            "why?",
            "--wait",
            "--timeout-secs",
            "20",
            "--nats-url",
            &url,
        ],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(EXIT_WAITING), "{}", describe(&out));
    let lines = json_lines(&out);
    let task_id = lines[0]["task_id"].as_str().unwrap().to_string();
    let waiting = lines.last().unwrap();
    assert_eq!(waiting["state"], "waiting", "{}", describe(&out));
    assert_eq!(
        waiting["suspend"]["question"],
        "what should I answer to: why?"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("runtime answer {task_id}")),
        "the answer command is printed: {stderr}"
    );
    // `--resume` says the same about a task that still waits.
    let out = run(
        &[
            "delegate",
            "--as",
            "alice",
            "--resume",
            &task_id,
            "--timeout-secs",
            "20",
            "--nats-url",
            &url,
        ],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(EXIT_WAITING), "{}", describe(&out));
    assert_eq!(json_lines(&out).last().unwrap()["state"], "waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_wait_follow_answers_waits_through_the_answer_to_the_final_result() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let _hub = hub(&server, "{}").await;
    let mut delegator = one_shot(&[
        "delegate",
        "--as",
        "alice",
        "--queue",
        "cq",
        "why?",
        "--wait",
        "--follow-answers",
        "--timeout-secs",
        "30",
        "--nats-url",
        &url,
    ])
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(delegator.stdout.take().unwrap()).lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    };
    let receipt = next().await;
    let task_id = receipt["task_id"].as_str().unwrap().to_string();
    let waiting = next().await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    answer_because(&task_id, &url, &[]).await;
    let done = next().await;
    assert_eq!(done["state"], "completed", "{done}");
    let status = tokio::time::timeout(DEADLINE, delegator.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
