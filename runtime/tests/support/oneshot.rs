//! Runs a one-shot command (the `runtime` binary, an example) as a child process with a clean
//! environment and a deadline.

use std::ffi::OsStr;
use std::process::{Output, Stdio};
use std::time::Duration;

/// The binary cargo built for this test target.
pub const RUNTIME: &str = env!("CARGO_BIN_EXE_runtime");
/// How long a one-shot command may run before the test gives up on it.
pub const ONE_SHOT_LIMIT: Duration = Duration::from_secs(30);

/// Environment variables that would change what the binary does (its flag fallbacks, log
/// filter, trace export). Removed from every one-shot command.
fn affects_runtime(key: &str) -> bool {
    key.starts_with("NATS_")
        || key.starts_with("RUNTIME_")
        || key.starts_with("OTEL_")
        || key == "RUST_LOG"
}

/// `program <args>` with the environment minus [`affects_runtime`], piped, killed on drop.
pub fn command(program: impl AsRef<OsStr>, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(affects_runtime) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// Runs `program <args>` with the environment minus [`affects_runtime`] plus `envs`, and
/// returns its output. Panics when it has not exited within [`ONE_SHOT_LIMIT`] (it is killed
/// then).
pub async fn run_program(
    program: impl AsRef<OsStr>,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Output {
    let program = program.as_ref();
    let mut cmd = command(program, args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    match tokio::time::timeout(ONE_SHOT_LIMIT, cmd.output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("cannot run {program:?}: {e}")),
        Err(_) => panic!(
            "`{program:?} {}` did not exit within {ONE_SHOT_LIMIT:?}",
            args.join(" ")
        ),
    }
}

/// Runs `runtime <args>` with `envs`; see [`run_program`].
pub async fn run_cli_env(args: &[&str], envs: &[(&str, &str)]) -> Output {
    run_program(RUNTIME, args, envs).await
}

/// [`run_cli_env`] without extra environment.
pub async fn run_cli(args: &[&str]) -> Output {
    run_cli_env(args, &[]).await
}

/// `runtime send --as alice --to bob hi --connect-timeout-secs 1` with `extra` flags and
/// `envs` (the URL in one of them): on a hub no router serves, a plain publish, so it exits 0
/// once it connected.
pub async fn send_hi(extra: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "send",
        "--as",
        "alice",
        "--to",
        "bob",
        "hi",
        "--connect-timeout-secs",
        "1",
    ];
    args.extend_from_slice(extra);
    run_cli_env(&args, envs).await
}

/// `nats://127.0.0.1:<port>` on a free loopback port where nothing listens.
pub fn dead_url() -> String {
    format!("nats://127.0.0.1:{}", harness::free_port().unwrap())
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts the exit code, with the whole output in the failure message.
pub fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: expected exit {code}, got {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// Asserts that stderr is exactly one non-empty line and returns it.
pub fn one_stderr_line(out: &Output, what: &str) -> String {
    let text = stderr(out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 1 && !lines[0].trim().is_empty(),
        "{what}: expected exactly one line on stderr, got {}:\n{text}",
        lines.len()
    );
    lines[0].to_string()
}
