//! Every Rust example prints its usage: `-h`/`--help` on stdout with exit 0; arguments it
//! cannot use as one line on stderr (what is wrong, then the usage) with exit 64, before it
//! connects to or starts anything.
//!
//! The example binaries are the ones cargo builds for this package next to this test
//! (`target/<profile>/examples/`): `cargo test -p examples` (or `--workspace`) builds them
//! first.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

/// How long an example may take to print its usage.
const LIMIT: Duration = Duration::from_secs(30);

/// Each example with its usage line.
const EXAMPLES: [(&str, &str); 6] = [
    ("router_failover", "usage: router_failover [ROUNDS] [RATE]"),
    ("embedded_host", "usage: embedded_host"),
    ("embedded_worker", "usage: embedded_worker"),
    ("bench_dm", "usage: bench_dm [N] [PACED_SECS] [ROUNDS]"),
    ("bench_task", "usage: bench_task [N] [PACED_SECS] [ROUNDS]"),
    (
        "bench_inboxes",
        "usage: bench_inboxes [N] [IDLE_SECS] [PACED_SECS] [TASKS] [ATTACHING]",
    ),
];

/// `target/<profile>/examples/<name>`, next to this test's `deps/` folder.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .unwrap();
    assert!(
        path.is_file(),
        "{} is not built: run `cargo test -p examples` (it builds the examples first)",
        path.display()
    );
    path
}

/// Runs the example with `args` and `envs`, killing it after [`LIMIT`]. Nothing listens at its
/// NATS URL, so an example that ignored its arguments would fail to connect rather than reach
/// a server on the default port.
async fn run(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let dead = format!("nats://127.0.0.1:{}", harness::free_port().unwrap());
    let mut cmd = tokio::process::Command::new(example(name));
    cmd.args(args)
        .env("NATS_URL", dead)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match tokio::time::timeout(LIMIT, cmd.output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("`{name} {}` did not exit within {LIMIT:?}", args.join(" ")),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn every_example_prints_its_usage_and_exits_0_on_help() {
    for (name, usage) in EXAMPLES {
        for flag in ["-h", "--help"] {
            let out = run(name, &[flag], &[]).await;
            let what = format!("{name} {flag}");
            assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out.stderr));
            assert!(
                text(&out.stdout).contains(usage),
                "{what}: {}",
                text(&out.stdout)
            );
        }
    }
}

#[tokio::test]
async fn wrong_arguments_print_the_usage_and_exit_64() {
    let mut cases: Vec<(&str, Vec<&str>, &str)> = Vec::new();
    for name in ["embedded_host", "embedded_worker"] {
        cases.push((name, vec!["extra"], "takes no arguments"));
        cases.push((name, vec!["--bogus"], "takes no arguments"));
    }
    for name in ["bench_dm", "bench_task"] {
        cases.push((name, vec!["x"], "N must be a positive integer"));
        cases.push((name, vec!["0"], "N must be a positive integer"));
        cases.push((name, vec!["-5"], "N must be a positive integer"));
        cases.push((
            name,
            vec!["10", "1.5"],
            "PACED_SECS must be a positive integer",
        ));
        cases.push((
            name,
            vec!["10", "1", "r"],
            "ROUNDS must be a positive integer",
        ));
        cases.push((name, vec!["10", "1", "1", "1"], "at most 3 arguments"));
    }
    cases.push((
        "router_failover",
        vec!["0"],
        "ROUNDS must be a positive integer",
    ));
    cases.push((
        "router_failover",
        vec!["1", "x"],
        "RATE must be a positive integer",
    ));
    cases.push((
        "router_failover",
        vec!["1", "1", "1"],
        "at most 2 arguments",
    ));
    cases.push(("bench_inboxes", vec!["x"], "N must be a positive integer"));
    cases.push((
        "bench_inboxes",
        vec!["10", "0"],
        "IDLE_SECS must be a positive integer",
    ));
    cases.push((
        "bench_inboxes",
        vec!["10", "1", "1", "t"],
        "TASKS must be a positive integer",
    ));
    cases.push((
        "bench_inboxes",
        vec!["10", "1", "1", "1", "0"],
        "ATTACHING must be a positive integer",
    ));
    cases.push((
        "bench_inboxes",
        vec!["10", "1", "1", "1", "1", "1"],
        "at most 5 arguments",
    ));
    for (name, args, wrong) in cases {
        let what = format!("{name} {}", args.join(" "));
        let out = run(name, &args, &[]).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line on stderr: {stderr}");
        let usage = EXAMPLES.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(
            lines[0].contains(usage),
            "{what}: prints the usage: {stderr}"
        );
        assert!(
            lines[0].contains(wrong),
            "{what}: says what is wrong: {stderr}"
        );
    }
}

#[tokio::test]
async fn bench_task_refuses_an_unknown_bench_only_before_starting() {
    let out = run("bench_task", &["10"], &[("BENCH_ONLY", "bogus")]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("BENCH_ONLY must be raw, track or sub"),
        "{stderr}"
    );
}

#[tokio::test]
async fn chaos_prints_its_usage_and_refuses_wrong_flags_with_one_line_and_64() {
    for flag in ["-h", "--help"] {
        let out = run("chaos", &[flag], &[]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("Usage: chaos [--cluster] [--seed N] [--short]"),
            "{}",
            text(&out.stdout)
        );
    }
    let cases: [(&[&str], &str); 6] = [
        (
            &["--faults", "kill-router,bogus"],
            "invalid value 'bogus' for '--faults",
        ),
        (&["--bogus"], "unexpected argument '--bogus'"),
        (&["--dms", "0"], "invalid value '0' for '--dms <DMS>'"),
        (&["--seed", "x"], "invalid value 'x' for '--seed <SEED>'"),
        (&["--short", "--cluster"], "cannot be used with"),
        (&["--load-secs", "5", "--short"], "cannot be used with"),
    ];
    for (args, wrong) in cases {
        let what = format!("chaos {}", args.join(" "));
        let out = run("chaos", args, &[]).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
        assert!(stderr.starts_with("chaos: "), "{what}: {stderr}");
        assert!(
            stderr.contains(wrong),
            "{what}: says what is wrong: {stderr}"
        );
    }
}
