//! Usage errors of the `runtime` binary and of the examples: exit 64, one line on stderr that
//! says what is wrong, no traceback.
//!
//! The Rust examples (`examples/*.rs`) are tested in `examples/tests/usage.rs`, next to the
//! binaries cargo builds for that package.

mod oneshot;

use oneshot::{assert_exit, dead_url, one_stderr_line, run_cli};

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
