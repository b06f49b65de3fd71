//! Usage and configuration errors (exit 64, one line on stderr naming the flag, key or file),
//! and a NATS server that cannot be reached or refuses (69).

use super::*;

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
async fn more_replicas_than_a_single_server_holds_are_a_usage_error_naming_the_key() {
    let server = server().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delivery.json");
    std::fs::write(&path, r#"{"replicas": 3}"#).unwrap();
    let out = run_cli(&[
        "start",
        "--role",
        "router",
        "--durable",
        "--delivery-config",
        path.to_str().unwrap(),
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 64, "three replicas on one server");
    let text = stderr(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("`replicas`") && last.contains("3 replicas"),
        "the last stderr line names the key and what to do: {last:?}"
    );
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
