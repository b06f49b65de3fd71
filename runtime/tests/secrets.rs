//! No secret is ever printed: the `runtime` binary run as operators run it, with each
//! authentication method's secret given by flag or environment, against a URL that embeds
//! credentials, an unreachable server and a server that refuses the credentials. Assertions are
//! on exit codes (README: 64 usage or configuration error, 69 NATS unreachable or refusing) and
//! on stdout and stderr never containing the secret.

mod support;

use std::path::Path;
use std::process::Output;

use support::oneshot::{assert_exit, dead_url, one_stderr_line, run_cli_env, stderr, stdout};

use harness::secrets::{JWT, PASSWORD, SEED, TOKEN};

/// Asserts that neither stdout nor stderr shows any of `secrets`.
fn assert_no_secret(out: &Output, secrets: &[&str], what: &str) {
    let shown = format!("{}{}", stdout(out), stderr(out));
    for secret in secrets {
        assert!(!shown.contains(secret), "{what}: secret printed:\n{shown}");
    }
}

/// The creds file of the creds method, as a flag value.
fn creds_file(dir: &Path) -> String {
    harness::secrets::creds_file(dir).display().to_string()
}

/// An auth method: its name, how it is given (flags or environment) and its secrets.
type Method<T> = (&'static str, Vec<T>, Vec<&'static str>);

/// Each auth method as flags, with its secrets: `(method, flags, secrets)`.
fn each_auth_method(dir: &Path) -> Vec<Method<String>> {
    let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("token", flags(&["--nats-token", TOKEN]), vec![TOKEN]),
        (
            "user/password",
            flags(&["--nats-username", "alice", "--nats-password", PASSWORD]),
            vec![PASSWORD],
        ),
        ("nkey seed", flags(&["--nats-nkey-seed", SEED]), vec![SEED]),
        (
            "creds file",
            vec!["--nats-creds".into(), creds_file(dir)],
            vec![JWT, SEED],
        ),
    ]
}

/// The same secrets through the environment fallbacks instead of flags.
fn each_auth_env(dir: &Path) -> Vec<Method<(&'static str, String)>> {
    vec![
        (
            "NATS_TOKEN",
            vec![("NATS_TOKEN", TOKEN.into())],
            vec![TOKEN],
        ),
        (
            "NATS_USERNAME/NATS_PASSWORD",
            vec![
                ("NATS_USERNAME", "alice".into()),
                ("NATS_PASSWORD", PASSWORD.into()),
            ],
            vec![PASSWORD],
        ),
        (
            "NATS_NKEY_SEED",
            vec![("NATS_NKEY_SEED", SEED.into())],
            vec![SEED],
        ),
        (
            "NATS_CREDS",
            vec![("NATS_CREDS", creds_file(dir))],
            vec![JWT, SEED],
        ),
    ]
}

/// `runtime send --as alice --to bob hi --nats-url URL` with `auth` flags and `envs`.
async fn send(url: &str, auth: &[String], envs: &[(&str, String)]) -> Output {
    let mut extra = vec!["--nats-url", url];
    extra.extend(auth.iter().map(String::as_str));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    support::oneshot::send_hi(&extra, &envs).await
}

#[tokio::test]
async fn credentials_in_the_url_are_refused_without_printing_them() {
    let port = harness::free_port().unwrap();
    let host = format!("127.0.0.1:{port}");
    for url in [
        format!("nats://u:{PASSWORD}@{host}"),
        format!("nats://{TOKEN}@{host}"),
        format!("nats://u:{PASSWORD}@{host}/path"),
        format!("u:{PASSWORD}@{host}"),
    ] {
        for args in [
            vec!["status", "--nats-url", &url],
            vec!["start", "--role", "router", "--nats-url", &url],
            vec![
                "send",
                "--as",
                "alice",
                "--to",
                "bob",
                "hi",
                "--nats-url",
                &url,
            ],
        ] {
            let what = format!("{} with {url}", args[0]);
            let out = run_cli_env(&args, &[]).await;
            assert_exit(&out, 64, &what);
            let line = one_stderr_line(&out, &what);
            assert!(line.contains(&host), "{what}: names the server: {line}");
            assert_no_secret(&out, &[PASSWORD, TOKEN], &what);
        }
        // The same URL from the environment.
        let what = format!("NATS_URL={url}");
        let out = run_cli_env(&["status"], &[("NATS_URL", &url)]).await;
        assert_exit(&out, 64, &what);
        assert_no_secret(&out, &[PASSWORD, TOKEN], &what);
    }
}

#[tokio::test]
async fn an_unreachable_server_is_reported_without_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let url = dead_url();
    for (method, flags, secrets) in each_auth_method(dir.path()) {
        let out = send(&url, &flags, &[]).await;
        assert_exit(&out, 69, method);
        assert_no_secret(&out, &secrets, method);
    }
    for (method, envs, secrets) in each_auth_env(dir.path()) {
        let out = send(&url, &[], &envs).await;
        assert_exit(&out, 69, method);
        assert_no_secret(&out, &secrets, method);
    }
}

#[tokio::test]
async fn a_server_refusing_the_credentials_is_reported_without_the_secret() {
    let server = harness::NatsServer::run(harness::ServerOptions {
        token: Some("the-servers-own-token".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    for (method, flags, secrets) in each_auth_method(dir.path()) {
        let out = send(&url, &flags, &[]).await;
        assert_exit(&out, 69, method);
        assert_no_secret(&out, &secrets, method);
        // `start` logs at info level: its log lines carry no secret either.
        let mut args = vec!["start", "--role", "router", "--nats-url", &url];
        args.extend(flags.iter().map(String::as_str));
        args.extend(["--connect-timeout-secs", "1"]);
        let out = run_cli_env(&args, &[]).await;
        assert_exit(&out, 69, &format!("start, {method}"));
        assert_no_secret(&out, &secrets, &format!("start, {method}"));
    }
    for (method, envs, secrets) in each_auth_env(dir.path()) {
        let out = send(&url, &[], &envs).await;
        assert_exit(&out, 69, method);
        assert_no_secret(&out, &secrets, method);
    }
}
