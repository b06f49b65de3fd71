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

#[path = "../support/mod.rs"]
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

mod client;
mod router;
mod tasks;
mod usage;
