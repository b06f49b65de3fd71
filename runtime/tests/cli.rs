//! The `runtime` binary as operators run it: `runtime start` / `runtime status` as child
//! processes against a private nats-server per test.
//!
//! Assertions are on exit codes, on the JSON `runtime status` prints and on JetStream state,
//! never on log lines. The only stderr assertions are the documented CLI contract: a usage or
//! configuration error is one line on stderr that names the offending flag, key or file, and
//! no secret is ever printed.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod support;

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use harness::{NatsServer, RuntimeProcess};
use serde_json::Value;
use support::oneshot::{
    assert_exit, one_stderr_line, run_cli, run_cli_env, stderr, stdout, RUNTIME,
};

/// Deadline for anything awaited in these tests (server start, router up, process exit).
const DEADLINE: Duration = Duration::from_secs(20);
/// A URL where nothing listens (port 1 is never a nats-server in these tests).
const DEAD_URL: &str = "nats://127.0.0.1:1";
/// The streams a durable router provisions, with their subject filters, in provisioning order.
const STREAMS: [(&str, &str); 9] = [
    ("HUB_INGRESS", "hub.pub.>"),
    ("HUB_INBOX", "channel.inbox.>"),
    ("HUB_TASKS", "channel.task.>"),
    ("HUB_WORK", "work.>"),
    ("HUB_ANSWERS", "answer.>"),
    ("HUB_SCHEDULES", "hub.sched.>"),
    (
        "HUB_ADVISORIES",
        "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.HUB_INBOX.*",
    ),
    ("HUB_DLQ", "dlq.>"),
    ("HUB_AUDIT", "hub.audit.>"),
];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../protocol/fixtures")
        .join(name)
}

/// Starts `runtime <args>` as a long-lived child with [`RuntimeProcess`] (killed on drop).
///
/// `RuntimeProcess` finds the binary itself and inherits this process's environment; check
/// that it finds the binary this test target was built with and that no variable the binary
/// reads leaks in, so that what runs is exactly `runtime <args>`.
fn spawn_runtime(args: &[&str]) -> RuntimeProcess {
    let found = harness::runtime_bin().expect("harness finds the runtime binary");
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    assert_eq!(
        canonical(&found),
        canonical(Path::new(RUNTIME)),
        "harness::runtime_bin() must resolve to CARGO_BIN_EXE_runtime (unset RUNTIME_BIN?)"
    );
    let leaked: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| {
            (k.starts_with("NATS_") || k.starts_with("RUNTIME_"))
                && k != "NATS_SERVER_BIN"
                && k != "RUNTIME_BIN"
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "these variables would change what `runtime` does in the tests; unset them: {leaked:?}"
    );
    RuntimeProcess::spawn(args, &[]).expect("spawn runtime")
}

/// `runtime status --nats-url <url>`.
async fn status(url: &str) -> Output {
    run_cli(&["status", "--nats-url", url, "--timeout-secs", "2"]).await
}

/// Waits until `runtime status` exits 0 and returns its parsed JSON stdout. Fails early when
/// `router` exits, and with both logs when the deadline passes.
async fn wait_for_status(url: &str, router: &mut RuntimeProcess) -> Value {
    let answer: RefCell<Option<Output>> = RefCell::new(None);
    let last_failure: RefCell<Option<Output>> = RefCell::new(None);
    let router_exited = Cell::new(false);
    let waited = harness::wait_until_async("`runtime status` exits 0", DEADLINE, || {
        if router.has_exited() {
            router_exited.set(true);
        }
        let (answer, last_failure, router_exited) = (&answer, &last_failure, &router_exited);
        async move {
            if router_exited.get() {
                return true;
            }
            let out = status(url).await;
            if out.status.success() {
                *answer.borrow_mut() = Some(out);
                true
            } else {
                *last_failure.borrow_mut() = Some(out);
                false
            }
        }
    })
    .await;
    let describe_failure = || {
        last_failure
            .borrow()
            .as_ref()
            .map(|o| format!("last status: {:?}\n{}", o.status, stderr(o)))
            .unwrap_or_default()
    };
    if router_exited.get() {
        panic!(
            "the router exited before answering status\n--- router log ---\n{}",
            router.log()
        );
    }
    if let Err(e) = waited {
        panic!(
            "{e}\n{}\n--- router log ---\n{}",
            describe_failure(),
            router.log()
        );
    }
    let out = answer.into_inner().expect("status answered");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("`runtime status` printed no JSON ({e}):\n{}", stdout(&out)))
}

/// The `streams` of a status snapshot as (name, action) pairs.
fn stream_actions(snapshot: &Value) -> Vec<(String, String)> {
    snapshot["streams"]
        .as_array()
        .unwrap_or_else(|| panic!("status has no streams array: {snapshot}"))
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("stream name").to_string(),
                s["action"].as_str().expect("stream action").to_string(),
            )
        })
        .collect()
}

async fn stream_info(js: &jetstream::Context, name: &str) -> stream::Info {
    js.get_stream(name)
        .await
        .unwrap_or_else(|e| panic!("stream {name} must exist: {e}"))
        .info()
        .await
        .unwrap_or_else(|e| panic!("stream {name} info: {e}"))
        .clone()
}

async fn server() -> NatsServer {
    harness::run_server().await.expect("start nats-server")
}

// ---------------------------------------------------------------------------------------------
// Durable router: streams, status, crash, signals
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_router_creates_streams_and_answers_status() {
    let server = server().await;
    let url = server.url();
    let mut router = spawn_runtime(&["start", "--role", "router", "--durable", "--nats-url", &url]);

    let snapshot = wait_for_status(&url, &mut router).await;
    assert_eq!(snapshot["durable"], Value::Bool(true), "{snapshot}");
    assert!(
        snapshot["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{snapshot}"
    );
    assert!(
        snapshot["status_requests"].as_u64().is_some_and(|n| n >= 1),
        "the request being answered is counted: {snapshot}"
    );
    assert!(snapshot["uptime_ms"].is_u64(), "{snapshot}");
    // Every agent's presence (none has attached yet): an operator's status lists it.
    assert_eq!(snapshot["presence"], serde_json::json!([]), "{snapshot}");
    let names: Vec<String> = stream_actions(&snapshot)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, STREAMS.map(|(n, _)| n.to_string()), "{snapshot}");

    // Independently of what the router says: the streams exist with the right subjects.
    let js = jetstream::new(server.client().await.unwrap());
    for (name, subject) in STREAMS {
        let info = stream_info(&js, name).await;
        assert_eq!(info.config.subjects[0], subject, "{name}");
    }
    for name in [
        "HUB_INGRESS",
        "HUB_WORK",
        "HUB_ANSWERS",
        "HUB_SCHEDULES",
        "HUB_ADVISORIES",
    ] {
        assert_eq!(
            stream_info(&js, name).await.config.retention,
            stream::RetentionPolicy::WorkQueue,
            "{name}"
        );
    }
    for name in ["HUB_INBOX", "HUB_TASKS"] {
        assert_eq!(
            stream_info(&js, name).await.config.retention,
            stream::RetentionPolicy::Limits,
            "{name}"
        );
    }
    assert!(!router.has_exited(), "the router keeps running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_killed_with_sigkill_leaves_streams_and_a_new_router_answers() {
    let server = server().await;
    let url = server.url();
    let js = jetstream::new(server.client().await.unwrap());
    let args = [
        "start",
        "--role",
        "router",
        "--durable",
        "--nats-url",
        url.as_str(),
    ];

    let mut first = spawn_runtime(&args);
    wait_for_status(&url, &mut first).await;
    let mut created = Vec::new();
    for (name, _) in STREAMS {
        created.push(stream_info(&js, name).await.created);
    }
    // Something stored before the crash.
    let ack = js
        .publish("channel.inbox.agent-1", "kept across the crash".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.stream, "HUB_INBOX");

    first.kill9().await;
    let out = status(&url).await;
    assert_exit(&out, 69, "status with no router running");

    let mut second = spawn_runtime(&args);
    let snapshot = wait_for_status(&url, &mut second).await;
    assert_eq!(snapshot["durable"], Value::Bool(true), "{snapshot}");
    assert_eq!(
        stream_actions(&snapshot),
        STREAMS.map(|(n, _)| (n.to_string(), "updated".to_string())),
        "the second router finds and updates the existing streams: {snapshot}"
    );
    // The streams were neither deleted nor recreated, and what they stored is still there.
    for ((name, _), created) in STREAMS.iter().zip(created) {
        assert_eq!(
            stream_info(&js, name).await.created,
            created,
            "{name} recreated"
        );
    }
    let inbox = js.get_stream("HUB_INBOX").await.unwrap();
    let kept = inbox.get_raw_message(ack.sequence).await.unwrap();
    assert_eq!(&kept.payload[..], b"kept across the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_gracefully_with_exit_0() {
    let server = server().await;
    let url = server.url();
    let mut router = spawn_runtime(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--shutdown-grace-secs",
        "3",
        "--nats-url",
        &url,
    ]);
    wait_for_status(&url, &mut router).await;

    let code = router
        .terminate(Duration::from_secs(8))
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- router log ---\n{}", router.log()));
    assert_eq!(code, Some(0), "--- router log ---\n{}", router.log());
    assert_exit(&status(&url).await, 69, "status after the router stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_shuts_down_gracefully_with_exit_0() {
    let server = server().await;
    let url = server.url();
    let mut router = spawn_runtime(&[
        "start",
        "--role",
        "router",
        "--shutdown-grace-secs",
        "3",
        "--nats-url",
        &url,
    ]);
    wait_for_status(&url, &mut router).await;

    let pid = router.pid().expect("router pid").to_string();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    assert!(kill.success(), "kill -INT {pid} failed");
    let code = router
        .wait_exit(Duration::from_secs(8))
        .await
        .unwrap_or_else(|e| panic!("{e}\n--- router log ---\n{}", router.log()));
    assert_eq!(code, Some(0), "--- router log ---\n{}", router.log());
    assert_exit(&status(&url).await, 69, "status after the router stopped");
}

// ---------------------------------------------------------------------------------------------
// Core mode: no JetStream at all
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_router_creates_no_streams_and_sends_no_jetstream_request() {
    let server = server().await;
    let url = server.url();

    // Watch every JetStream API request on the account from before the router starts.
    let watcher = server.client().await.unwrap();
    let mut sub = watcher.subscribe("$JS.API.>").await.unwrap();
    watcher.flush().await.unwrap();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let collector = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let reply = msg.reply.map(|r| r.to_string()).unwrap_or_default();
                seen.lock().unwrap().push((msg.subject.to_string(), reply));
            }
        })
    };

    let mut router = spawn_runtime(&["start", "--role", "router", "--nats-url", &url]);
    let snapshot = wait_for_status(&url, &mut router).await;
    assert_eq!(snapshot["durable"], Value::Bool(false), "{snapshot}");
    assert_eq!(stream_actions(&snapshot), vec![], "{snapshot}");
    watcher.flush().await.unwrap();

    // Positive control: a JetStream request of our own, recognisable by its reply prefix, must
    // reach the watcher; otherwise "nothing seen" would prove nothing.
    let control = async_nats::ConnectOptions::new()
        .custom_inbox_prefix("_CONTROL")
        .connect(&url)
        .await
        .unwrap();
    let account = jetstream::new(control).query_account().await.unwrap();
    assert_eq!(account.streams, 0, "core mode must create no stream");
    let is_control = |(subject, reply): &(String, String)| {
        subject == "$JS.API.INFO" && reply.starts_with("_CONTROL.")
    };
    harness::wait_until("the watcher sees the control request", DEADLINE, || {
        seen.lock().unwrap().iter().any(is_control)
    })
    .await
    .unwrap();

    let others: Vec<(String, String)> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|m| !is_control(m))
        .cloned()
        .collect();
    assert!(
        others.is_empty(),
        "the core-mode router sent JetStream requests: {others:?}"
    );
    assert!(!router.has_exited(), "the router keeps running");
    collector.abort();
}

// ---------------------------------------------------------------------------------------------
// Usage and configuration errors: exit 64, one line on stderr
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn worker_role_without_worker_id_is_a_usage_error_naming_the_flag() {
    let out = run_cli(&["start", "--role", "worker", "--nats-url", DEAD_URL]).await;
    assert_exit(&out, 64, "--role worker without --worker-id");
    let line = one_stderr_line(&out, "--role worker without --worker-id");
    assert!(line.contains("--worker-id"), "{line}");
}

#[tokio::test]
async fn unknown_flag_is_a_usage_error_naming_the_flag() {
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--no-such-flag",
        "--nats-url",
        DEAD_URL,
    ])
    .await;
    assert_exit(&out, 64, "unknown flag");
    let line = one_stderr_line(&out, "unknown flag");
    assert!(line.contains("--no-such-flag"), "{line}");
}

#[tokio::test]
async fn delivery_config_with_an_unknown_key_is_a_usage_error_naming_the_key() {
    // The fixture's inbox section has `max_age` (the key is `max_age_secs`). The config is
    // loaded before connecting: nothing listens at DEAD_URL, so connecting first would be 69.
    let path = fixture("delivery-wrong-key.json");
    let path = path.to_str().unwrap();
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--delivery-config",
        path,
        "--nats-url",
        DEAD_URL,
    ])
    .await;
    assert_exit(&out, 64, "unknown delivery config key");
    let line = one_stderr_line(&out, "unknown delivery config key");
    assert!(
        line.contains("inbox.max_age"),
        "names the dotted key: {line}"
    );
    assert!(
        !line.contains("inbox.max_age_secs"),
        "names the wrong key: {line}"
    );
    assert!(
        line.contains("delivery-wrong-key.json"),
        "names the file: {line}"
    );
}

#[tokio::test]
async fn missing_delivery_config_file_is_a_usage_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-delivery.json");
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--delivery-config",
        missing.to_str().unwrap(),
        "--nats-url",
        DEAD_URL,
    ])
    .await;
    assert_exit(&out, 64, "missing delivery config");
    let line = one_stderr_line(&out, "missing delivery config");
    assert!(line.contains("no-such-delivery.json"), "{line}");
}

#[tokio::test]
async fn two_auth_methods_are_a_usage_error_that_prints_no_secret() {
    const TOKEN: &str = "tok-7f3a-SECRET";
    const SEED: &str = "SUSEEDSECRET9c41";
    const PASSWORD: &str = "pw-SECRET-e2b0";

    // Both from flags, on `start`.
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--nats-url",
        DEAD_URL,
        "--nats-token",
        TOKEN,
        "--nats-nkey-seed",
        SEED,
    ])
    .await;
    assert_exit(&out, 64, "token and nkey seed");
    let line = one_stderr_line(&out, "token and nkey seed");
    assert!(line.contains("token") && line.contains("nkey"), "{line}");
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !all.contains(TOKEN) && !all.contains(SEED),
        "secret printed: {all}"
    );

    // From the environment, on `status`.
    let out = run_cli_env(
        &["status", "--nats-url", DEAD_URL],
        &[
            ("NATS_TOKEN", TOKEN),
            ("NATS_USERNAME", "alice"),
            ("NATS_PASSWORD", PASSWORD),
        ],
    )
    .await;
    assert_exit(&out, 64, "token and username/password");
    let line = one_stderr_line(&out, "token and username/password");
    assert!(
        line.contains("token") && line.contains("password"),
        "{line}"
    );
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        !all.contains(TOKEN) && !all.contains(PASSWORD),
        "secret printed: {all}"
    );
}

#[tokio::test]
async fn worker_role_without_queue_or_exec_is_a_usage_error_naming_the_flag() {
    for role in ["worker", "all"] {
        let out = run_cli(&[
            "start",
            "--role",
            role,
            "--worker-id",
            "w1",
            "--nats-url",
            DEAD_URL,
        ])
        .await;
        assert_exit(&out, 64, role);
        let line = one_stderr_line(&out, role);
        assert!(
            line.contains("--queue") || line.contains("--exec"),
            "{line}"
        );
    }
    // With everything but --durable: tasks need JetStream.
    let out = run_cli(&[
        "start",
        "--role",
        "worker",
        "--worker-id",
        "w1",
        "--queue",
        "q",
        "--exec",
        "true",
        "--nats-url",
        DEAD_URL,
    ])
    .await;
    assert_exit(&out, 64, "worker without --durable");
    assert!(one_stderr_line(&out, "worker without --durable").contains("--durable"));
}

// ---------------------------------------------------------------------------------------------
// NATS unreachable or refusing: 69 / 64, never a loop
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn unreachable_server_exits_69() {
    let port = harness::free_port().unwrap().to_string();
    let url = format!("nats://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--nats-url",
        &url,
        "--connect-timeout-secs",
        "1",
    ])
    .await;
    assert_exit(&out, 69, "unreachable server");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "gave up after {:?}, with a 1 s connect timeout",
        started.elapsed()
    );
    let line = one_stderr_line(&out, "unreachable server");
    assert!(line.contains(&port), "names the server: {line}");
    // The cause once: an error that prints its source is not followed by it again.
    assert_eq!(
        line.matches("refused").count(),
        1,
        "the cause is said once: {line}"
    );

    let out = run_cli(&["status", "--nats-url", &url, "--connect-timeout-secs", "1"]).await;
    assert_exit(&out, 69, "status against an unreachable server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_mismatch_is_refused_with_instructions() {
    let server = server().await;
    let url = server.url();
    let js = jetstream::new(server.client().await.unwrap());
    // An operator created HUB_INGRESS by hand with limits retention and stored something.
    js.create_stream(stream::Config {
        name: "HUB_INGRESS".into(),
        subjects: vec!["hub.pub.>".into()],
        retention: stream::RetentionPolicy::Limits,
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("hub.pub.agent-1.general", "operator data".into())
        .await
        .unwrap()
        .await
        .unwrap();

    // run_cli fails the test if the process keeps retrying instead of exiting.
    let out = run_cli(&["start", "--role", "router", "--durable", "--nats-url", &url]).await;
    assert_exit(&out, 64, "retention mismatch");
    let text = stderr(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("HUB_INGRESS") && last.contains("delete the stream"),
        "the last stderr line must tell the operator what to do: {last:?}"
    );

    // The runtime changed nothing: the stream and its message are still there.
    let info = stream_info(&js, "HUB_INGRESS").await;
    assert_eq!(info.config.retention, stream::RetentionPolicy::Limits);
    assert_eq!(info.state.messages, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_config_limits_are_applied() {
    let server = server().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("delivery.json");
    std::fs::write(
        &config,
        r#"{"inbox": {"max_msgs_per_subject": 7}, "duplicate_window_secs": 30}"#,
    )
    .unwrap();

    let mut router = spawn_runtime(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--delivery-config",
        config.to_str().unwrap(),
        "--nats-url",
        &url,
    ]);
    wait_for_status(&url, &mut router).await;

    let js = jetstream::new(server.client().await.unwrap());
    let inbox = stream_info(&js, "HUB_INBOX").await;
    assert_eq!(inbox.config.max_messages_per_subject, 7);
    assert_eq!(inbox.config.duplicate_window, Duration::from_secs(30));
    for name in ["HUB_INGRESS", "HUB_TASKS"] {
        assert_eq!(
            stream_info(&js, name).await.config.duplicate_window,
            Duration::from_secs(30),
            "{name} gets the configured duplicate window"
        );
    }
    assert_eq!(
        stream_info(&js, "HUB_TASKS")
            .await
            .config
            .max_messages_per_subject,
        10_000,
        "an inbox limit does not leak into the task stream"
    );
}

// ---------------------------------------------------------------------------------------------
// Client commands: send and inbox
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_inbox_commands_deliver_a_dm_in_order_with_the_senders_identity() {
    let server = server().await;
    let url = server.url();
    let mut router = spawn_runtime(&["start", "--role", "router", "--durable", "--nats-url", &url]);
    wait_for_status(&url, &mut router).await;

    let mut receipts = Vec::new();
    for text in ["first", "second"] {
        let out = run_cli(&[
            "send",
            "--as",
            "alice",
            "--to",
            "bob",
            text,
            "--nats-url",
            &url,
        ])
        .await;
        assert_exit(&out, 0, "runtime send");
        let receipt: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        receipts.push(
            receipt["ingress_seq"]
                .as_u64()
                .expect("durable receipt has a sequence"),
        );
    }
    assert!(
        receipts[0] < receipts[1],
        "ingress sequences grow: {receipts:?}"
    );

    let out = run_cli(&[
        "inbox",
        "--as",
        "bob",
        "--json",
        "--idle-secs",
        "1",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "runtime inbox");
    let envelopes: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let bodies: Vec<&str> = envelopes
        .iter()
        .map(|e| e["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["first", "second"]);
    assert!(envelopes.iter().all(|e| e["meta"]["from"] == "alice"));
    // Beside each envelope, where it stands in the inbox.
    let seqs: Vec<u64> = envelopes
        .iter()
        .map(|e| e["delivery"]["stream_seq"].as_u64().unwrap())
        .collect();
    assert!(seqs[0] < seqs[1], "{seqs:?}");
    assert!(envelopes
        .iter()
        .all(|e| e["delivery"]["redelivered"] == false
            && e["delivery"]["out_of_order"] == false
            && e["delivery"]["delivered"] == 1));

    // Acked: a second read finds nothing new.
    let out = run_cli(&[
        "inbox",
        "--as",
        "bob",
        "--idle-secs",
        "1",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "second runtime inbox");
    assert_eq!(stdout(&out), "", "DMs were acked by the first read");
    router.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_with_an_invalid_identity_is_a_usage_error() {
    let out = run_cli(&[
        "send",
        "--as",
        "al.ice",
        "--to",
        "bob",
        "x",
        "--nats-url",
        DEAD_URL,
    ])
    .await;
    assert_exit(&out, 64, "invalid --as");
    let line = one_stderr_line(&out, "invalid --as");
    assert!(line.contains("--as") && line.contains('.'), "{line}");
}

// ---------------------------------------------------------------------------------------------
// Tasks from the command line: worker, delegate, task status, answer, resume
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_a_question_answer_it_and_resume_the_result_from_the_cli() {
    let server = server().await;
    let url = server.url();
    let journal = tempfile::tempdir().unwrap();
    let script = harness::workspace_root().join("deploy/worker-echo.py");
    let exec = format!("python3 {}", script.display());
    let journal_dir = journal.path().display().to_string();
    let mut all = spawn_runtime(&[
        "start",
        "--role",
        "all",
        "--durable",
        "--worker-id",
        "w9",
        "--queue",
        "q",
        "--exec",
        &exec,
        "--journal-dir",
        &journal_dir,
        "--nats-url",
        &url,
    ]);
    wait_for_status(&url, &mut all).await;

    let out = run_cli(&[
        "delegate",
        "--as",
        "alice",
        "--queue",
        "q",
        "why?",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "delegate");
    let receipt: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let task_id = receipt["task_id"].as_str().unwrap().to_string();

    // The worker asks its question: status says waiting (parked in the worker's journal).
    let status_as_alice = [
        "task",
        "--nats-url",
        &url,
        "status",
        &task_id,
        "--as",
        "alice",
    ];
    let waiting = std::cell::RefCell::new(Value::Null);
    harness::wait_until_async("task waiting", DEADLINE, || async {
        let out = run_cli(&status_as_alice).await;
        let reply: Value = serde_json::from_str(stdout(&out).trim()).unwrap_or(Value::Null);
        let done = reply["state"] == "waiting";
        *waiting.borrow_mut() = reply;
        done
    })
    .await
    .unwrap();
    // Parked: the waiting result completed its input's delivery; nothing runs until the
    // answer comes.
    assert_eq!(waiting.borrow()["active"], false);
    assert_eq!(waiting.borrow()["suspend"]["tool_call_id"], "ask-1");

    let out = run_cli(&[
        "answer",
        &task_id,
        "--as",
        "alice",
        "--text",
        "because",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "answer");
    let answer: Value = serde_json::from_str(stdout(&out).trim()).unwrap();

    // Answered just now: the task may still show its question for a moment, so the resume
    // follows answers to the final result (a plain --resume of a waiting task exits 75).
    let out = run_cli(&[
        "delegate",
        "--as",
        "alice",
        "--resume",
        &task_id,
        "--follow-answers",
        "--timeout-secs",
        "30",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "delegate --resume --follow-answers");
    let last = stdout(&out).lines().last().unwrap_or_default().to_owned();
    let result: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(result["state"], "completed");
    assert_eq!(result["response"]["echo"], "why?");
    assert_eq!(result["response"]["answers"][0]["responses"][0], "because");
    // The waiting attempt was resumed, not a new one.
    assert_eq!(result["attempt_id"], answer["attempt_id"]);

    // Finished: status comes from the task channel.
    let out = run_cli(&status_as_alice).await;
    let reply: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (reply["state"].as_str(), reply["active"].as_bool()),
        (Some("completed"), Some(false))
    );

    // `runtime status` lists the worker with its counters beside the router's snapshot.
    let out = status(&url).await;
    assert_exit(&out, 0, "status");
    let snapshot: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(snapshot["durable"], Value::Bool(true), "{snapshot}");
    let workers = snapshot["workers"].as_array().expect("a workers array");
    assert_eq!(workers.len(), 1, "{snapshot}");
    assert_eq!(workers[0]["worker_id"], "w9");
    assert_eq!(workers[0]["queue"], "q");
    assert_eq!(workers[0]["counters"]["completed"], 1, "{snapshot}");
    assert_eq!(workers[0]["counters"]["answers"], 1, "{snapshot}");
    all.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_with_an_inbox_prefix_answers_status_only_under_that_prefix() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let mut router = spawn_runtime(&[
        "start",
        "--role",
        "router",
        "--nats-url",
        &url,
        "--inbox-prefix",
        "_HUB",
    ]);
    // `runtime status` with the same prefix is answered...
    let waited = harness::wait_until_async("status under _HUB", DEADLINE, || async {
        run_cli(&[
            "status",
            "--nats-url",
            &url,
            "--timeout-secs",
            "2",
            "--inbox-prefix",
            "_HUB",
        ])
        .await
        .status
        .success()
    })
    .await;
    assert!(waited.is_ok(), "{}", router.log());
    // ...one with the default `_INBOX` is not (no answer: unavailable).
    let plain = status(&url).await;
    assert_exit(&plain, 69, "status outside the router's prefix");
    // An invalid prefix is a usage error.
    let bad = run_cli(&["status", "--nats-url", &url, "--inbox-prefix", "_HUB.*"]).await;
    assert_exit(&bad, 64, "an invalid inbox prefix");
    assert!(!router.has_exited());
}
