//! Usage errors of the `runtime` binary and of the examples: exit 64, one line on stderr that
//! says what is wrong, no traceback.
//!
//! The Rust examples (`examples/*.rs`) are tested in `examples/tests/usage.rs`, next to the
//! binaries cargo builds for that package.

mod support;

use support::oneshot::{assert_exit, dead_url, one_stderr_line, run_cli};

// ---------------------------------------------------------------------------------------------
// Reserved identities: refused before connecting
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn send_as_a_system_prefixed_agent_is_a_usage_error_before_connecting() {
    // Nothing listens at the URL: connecting first would exit 69 after the connect timeout.
    let url = dead_url();
    for (flag, args) in [
        ("--as", ["--as", "hub-router", "--to", "bob"]),
        ("--to", ["--as", "alice", "--to", "hub-system"]),
    ] {
        let mut all = vec!["send"];
        all.extend(args);
        all.extend(["hi", "--nats-url", &url, "--connect-timeout-secs", "1"]);
        let out = run_cli(&all).await;
        assert_exit(&out, 64, flag);
        let line = one_stderr_line(&out, flag);
        assert!(line.contains(flag), "names the flag: {line}");
        assert!(
            line.contains("reserved prefix `hub-`"),
            "names the reserved prefix: {line}"
        );
    }
}

#[tokio::test]
async fn worker_id_with_the_system_prefix_is_a_usage_error_before_connecting() {
    let url = dead_url();
    let out = run_cli(&[
        "start",
        "--role",
        "worker",
        "--durable",
        "--worker-id",
        "hub-worker",
        "--queue",
        "q",
        "--exec",
        "true",
        "--nats-url",
        &url,
        "--connect-timeout-secs",
        "1",
    ])
    .await;
    assert_exit(&out, 64, "--worker-id hub-worker");
    let line = one_stderr_line(&out, "--worker-id hub-worker");
    assert!(line.contains("--worker-id"), "names the flag: {line}");
    assert!(
        line.contains("reserved prefix `hub-`"),
        "names the reserved prefix: {line}"
    );
}

// ---------------------------------------------------------------------------------------------
// examples/python/dm.py
// ---------------------------------------------------------------------------------------------

/// Runs `python3 examples/python/dm.py <args>`, with nats-py on `PYTHONPATH` (as
/// `python_client.rs` runs it) or without it (usage needs no NATS client).
async fn dm_py(args: &[&str], with_nats_py: bool) -> std::process::Output {
    let root = harness::workspace_root();
    let script = root.join("examples/python/dm.py");
    let pylib = root.join(".tools/pylib").display().to_string();
    let mut all = vec![script.to_str().unwrap()];
    all.extend(args);
    let envs: Vec<(&str, &str)> = if with_nats_py {
        vec![("PYTHONPATH", pylib.as_str())]
    } else {
        vec![]
    };
    support::oneshot::run_program("python3", &all, &envs).await
}

/// Asserts a usage error: exit 64, one stderr line with the usage, no traceback.
fn assert_dm_usage_error(out: &std::process::Output, what: &str) -> String {
    assert_exit(out, 64, what);
    let all = format!(
        "{}{}",
        support::oneshot::stdout(out),
        support::oneshot::stderr(out)
    );
    assert!(!all.contains("Traceback"), "{what}: traceback:\n{all}");
    let line = one_stderr_line(out, what);
    assert!(
        line.contains("usage: dm.py NATS_URL SENDER RECIPIENT N"),
        "{what}: prints the usage: {line}"
    );
    line
}

#[tokio::test]
async fn python_dm_without_arguments_prints_its_usage_and_exits_64() {
    for with_nats_py in [true, false] {
        let out = dm_py(&[], with_nats_py).await;
        let line = assert_dm_usage_error(&out, "no arguments");
        assert!(line.contains("expected 4 arguments, got 0"), "{line}");
    }
}

#[tokio::test]
async fn python_dm_with_wrong_arguments_prints_its_usage_and_exits_64() {
    let url = dead_url();
    for (args, wrong) in [
        (vec![url.as_str(), "alice"], "expected 4 arguments, got 2"),
        (
            vec![url.as_str(), "alice", "bob", "3", "extra"],
            "expected 4 arguments, got 5",
        ),
        (vec![url.as_str(), "alice", "bob", "three"], "N must be"),
        (vec![url.as_str(), "alice", "bob", "0"], "N must be"),
        (vec!["127.0.0.1:4222", "alice", "bob", "3"], "NATS_URL must"),
        (vec![url.as_str(), "al.ice", "bob", "3"], "SENDER must"),
        (vec![url.as_str(), "alice", "b*b", "3"], "RECIPIENT must"),
        (vec![url.as_str(), "hub-router", "bob", "3"], "SENDER must"),
        (
            vec![url.as_str(), "alice", "bob", "3", "--bogus"],
            "expected 4",
        ),
    ] {
        let what = format!("dm.py {}", args.join(" "));
        let out = dm_py(&args, true).await;
        let line = assert_dm_usage_error(&out, &what);
        assert!(line.contains(wrong), "{what}: says what is wrong: {line}");
    }
}

#[tokio::test]
async fn python_dm_help_prints_its_usage_and_exits_0() {
    for flag in ["-h", "--help"] {
        let out = dm_py(&[flag], false).await;
        assert_exit(&out, 0, flag);
        assert!(
            support::oneshot::stdout(&out).contains("usage: dm.py NATS_URL SENDER RECIPIENT N"),
            "{flag}: {}",
            support::oneshot::stdout(&out)
        );
    }
}
