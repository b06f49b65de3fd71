//! `runtime render-config`: the files it writes, and a real nats-server on them — every identity
//! connects with its own rendered credentials, and the broker holds each to its grants.
//! (The attack suite of docs/SECURITY.md builds on this.)

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use async_nats::jetstream;
use support::oneshot::{assert_exit, one_stderr_line, run_cli};
use support::rendered::{read_env, render_into, Rendered};

const IDENTITIES: &str = r#"{
  "agents": ["alice", "bob"],
  "workers": [{"id": "w1", "queues": ["q"]}],
  "routers": 1,
  "admins": ["ops"]
}"#;

const NAMES: [&str; 5] = ["alice", "bob", "w1", "router-1", "ops"];

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn an_unknown_key_in_the_identities_file_is_refused_and_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("identities.json");
    std::fs::write(&file, r#"{"routers": 1, "agnets": ["alice"]}"#).unwrap();
    let out = dir.path().join("out");
    let output = run_cli(&[
        "render-config",
        "--identities",
        &file.display().to_string(),
        "--out",
        &out.display().to_string(),
    ])
    .await;
    assert_exit(&output, 64, "an unknown key");
    let line = one_stderr_line(&output, "an unknown key");
    assert!(line.contains("agnets"), "names the key: {line}");
    assert!(!out.exists(), "nothing written");
}

#[tokio::test]
async fn the_rendered_files_are_private_and_no_secret_is_printed() {
    for auth in ["nkey", "password"] {
        let dir = tempfile::tempdir().unwrap();
        let output_dir = dir.path().join("out");
        let (printed, out) =
            render_into(dir.path(), IDENTITIES, &["--durable", "--auth", auth]).await;
        assert_eq!(out, output_dir);
        assert_eq!(mode(&out.join("nats-server.conf")), 0o600);
        assert_eq!(mode(&out.join("users")), 0o700);
        let conf = std::fs::read_to_string(out.join("nats-server.conf")).unwrap();
        for name in NAMES {
            let path = out.join(format!("users/{name}.env"));
            assert_eq!(mode(&path), 0o600, "{name}.env");
            assert!(printed.contains(&path.display().to_string()), "{printed}");
            let env = read_env(&path);
            let secret = match auth {
                "nkey" => &env["NATS_NKEY_SEED"],
                _ => &env["NATS_PASSWORD"],
            };
            assert!(secret.len() >= 32, "{name}: a real secret");
            assert!(
                !printed.contains(secret.as_str()),
                "{name}'s secret printed"
            );
            assert!(
                !conf.contains(secret.as_str()),
                "{name}'s secret in the config"
            );
            assert_eq!(env["NATS_INBOX_PREFIX"], format!("_INBOX.{name}"));
        }
        assert_eq!(
            read_env(&out.join("users/alice.env"))["RUNTIME_AGENT_ID"],
            "alice"
        );
        assert_eq!(
            read_env(&out.join("users/w1.env"))["RUNTIME_WORKER_ID"],
            "w1"
        );
        assert!(conf.contains("sync_interval: always"), "{conf}");
    }
}

#[tokio::test]
async fn a_re_render_keeps_every_secret_and_rotate_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_, out) = render_into(dir.path(), IDENTITIES, &[]).await;
    let seeds = || -> Vec<String> {
        NAMES
            .iter()
            .map(|n| read_env(&out.join(format!("users/{n}.env")))["NATS_NKEY_SEED"].clone())
            .collect()
    };
    let first = seeds();
    render_into(dir.path(), IDENTITIES, &[]).await;
    assert_eq!(seeds(), first, "a re-render keeps the keys");
    render_into(dir.path(), IDENTITIES, &["--rotate"]).await;
    let rotated = seeds();
    for (a, b) in first.iter().zip(&rotated) {
        assert_ne!(a, b, "--rotate makes new keys");
    }
}

#[tokio::test]
async fn every_identity_connects_with_its_rendered_credentials_and_a_wrong_one_is_refused() {
    for auth in ["nkey", "password"] {
        let hub = Rendered::start(IDENTITIES, &["--durable", "--auth", auth]).await;
        for name in NAMES {
            let connected = hub.connect(name).await;
            connected.client.flush().await.unwrap();
        }
        // The same identity with another secret is refused.
        let options = match auth {
            "nkey" => {
                async_nats::ConnectOptions::with_nkey(nkeys::KeyPair::new_user().seed().unwrap())
            }
            _ => async_nats::ConnectOptions::with_user_and_password("alice".into(), "nope".into()),
        };
        let refused = options
            .connection_timeout(Duration::from_secs(2))
            .connect(hub.server.url())
            .await;
        assert!(refused.is_err(), "{auth}: a wrong secret connected");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_rendered_config_the_router_runs_and_an_agent_publishes_only_as_itself() {
    let hub = Rendered::start(IDENTITIES, &["--durable"]).await;
    let router = hub.router();
    let ops = hub.connect("ops").await;
    let admin = jetstream::new(ops.client.clone());
    let logs = || format!("router:\n{}\nserver:\n{}", router.log(), hub.server.log());
    // The router made the streams with its own grants.
    harness::wait_until_async("the router's streams", support::DEADLINE, || async {
        admin.get_stream("HUB_INBOX").await.is_ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    let alice = hub.connect("alice").await;
    support::send_dm(&alice.client, "alice", "bob", "m1").await;
    harness::wait_until_async(
        "alice's DM routed to bob's inbox",
        support::DEADLINE,
        || async { support::count_on(&admin, "HUB_INBOX", "channel.inbox.bob").await == 1 },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    // As anyone else: refused by the broker.
    alice
        .client
        .publish(
            "hub.pub.bob.inbox",
            r#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#.into(),
        )
        .await
        .unwrap();
    alice.refused("hub.pub.bob.inbox").await;
    let _sub = alice.client.subscribe("channel.inbox.bob").await.unwrap();
    alice.refused("channel.inbox.bob").await;
    let ingress = support::count_on(&admin, "HUB_INGRESS", "hub.pub.bob.inbox").await;
    assert_eq!(ingress, 0, "nothing stored as bob");
    assert_eq!(
        support::count_on(&admin, "HUB_INBOX", "channel.inbox.bob").await,
        1,
        "bob's inbox holds alice's DM only"
    );
    // No grant of the router's is too tight: the only violations are alice's two.
    let alice_key = nkeys::KeyPair::from_seed(&hub.env("alice")["NATS_NKEY_SEED"])
        .unwrap()
        .public_key();
    let violations = hub.violations();
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(
        violations.iter().all(|l| l.contains(&alice_key)),
        "{violations:#?}"
    );
    drop(router);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_inbox_work_from_the_rendered_env_files_alone() {
    let hub = Rendered::start(IDENTITIES, &["--durable"]).await;
    let router = hub.router();
    support::wait_router_answers(&hub.connect("ops").await.client).await;
    // `env $(cat alice.env) runtime send --to bob hello`: no --as, no URL, no secret flags.
    let sent = hub.run_as("alice", &["send", "--to", "bob", "hello"]).await;
    assert_exit(&sent, 0, "send as alice");
    let receipt: serde_json::Value =
        serde_json::from_str(support::oneshot::stdout(&sent).trim()).unwrap();
    assert!(
        receipt["ingress_seq"].as_u64().is_some(),
        "a durable receipt, not a silent plain publish: {receipt}\n{}",
        hub.server.log()
    );
    let read = hub.run_as("bob", &["inbox", "--idle-secs", "2"]).await;
    assert_exit(&read, 0, "inbox as bob");
    assert_eq!(
        support::oneshot::stdout(&read).trim(),
        "alice: hello",
        "{}",
        support::oneshot::stderr(&read)
    );
    assert!(hub.violations().is_empty(), "{:#?}", hub.violations());
    drop(router);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_an_agents_task_on_their_rendered_credentials() {
    let hub = Rendered::start(IDENTITIES, &["--durable"]).await;
    let router = hub.router();
    let ops = hub.connect("ops").await;
    support::wait_router_answers(&ops.client).await;
    let worker = hub.worker(
        "w1",
        "cat > /dev/null\nprintf '{\"response\": \"done\"}\\n'\n",
    );
    // `env $(cat alice.env) runtime delegate --queue q …`
    let out = hub
        .run_as("alice", &["delegate", "--queue", "q", "do it"])
        .await;
    assert_exit(&out, 0, "delegate as alice");
    let receipt: serde_json::Value =
        serde_json::from_str(support::oneshot::stdout(&out).trim()).unwrap();
    let task_id = protocol::TaskId::new(receipt["task_id"].as_str().unwrap()).unwrap();
    let admin = jetstream::new(ops.client.clone());
    harness::wait_until_async("the task's result", support::DEADLINE, || async {
        !support::results_on(&admin, &task_id).await.is_empty()
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nworker:\n{}\nrouter:\n{}\nserver:\n{}",
            worker.log(),
            router.log(),
            hub.server.log()
        )
    });
    let results = support::results_on(&admin, &task_id).await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].state, protocol::task::TaskState::Completed);
    assert_eq!(results[0].worker_id.as_str(), "w1");
    assert!(hub.violations().is_empty(), "{:#?}", hub.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_connects_with_each_auth_method_and_a_bad_credential_exits_69() {
    // Token: a server that requires one.
    let token_server = harness::NatsServer::run(harness::ServerOptions {
        token: Some("s3cret-token-5ec12e7".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = token_server.url();
    let send = |extra: Vec<(String, String)>| async move {
        let env: Vec<(&str, &str)> = extra
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        support::oneshot::send_hi(&[], &env).await
    };
    let with = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ok = send(with(&[
        ("NATS_URL", &url),
        ("NATS_TOKEN", "s3cret-token-5ec12e7"),
    ]))
    .await;
    assert_exit(&ok, 0, "token");
    let bad = send(with(&[
        ("NATS_URL", &url),
        ("NATS_TOKEN", "wrong-token-5ec12e7"),
    ]))
    .await;
    assert_exit(&bad, 69, "a wrong token");
    let line = one_stderr_line(&bad, "a wrong token");
    assert!(!line.contains("wrong-token-5ec12e7"), "{line}");
    // User and password, and nkey: rendered configs, the CLI on the .env file alone.
    for auth in ["password", "nkey"] {
        let hub = Rendered::start(IDENTITIES, &["--auth", auth]).await;
        let ok = send(hub.process_env("alice")).await;
        assert_exit(&ok, 0, auth);
        let mut wrong = hub.process_env("alice");
        for (k, v) in wrong.iter_mut() {
            if k == "NATS_PASSWORD" {
                *v = "not-the-password".into();
            }
            if k == "NATS_NKEY_SEED" {
                *v = nkeys::KeyPair::new_user().seed().unwrap();
            }
        }
        let bad = send(wrong).await;
        assert_exit(&bad, 69, &format!("a wrong {auth}"));
        let line = one_stderr_line(&bad, auth);
        assert!(
            !line.contains("not-the-password") && !line.contains("SU"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn the_deploy_identities_file_renders_a_config_nats_server_runs() {
    let file = harness::workspace_root().join("deploy/identities.json");
    let identities = std::fs::read_to_string(file).unwrap();
    let hub = Rendered::start(&identities, &["--durable"]).await;
    for name in ["alice", "w2", "router-2", "ops"] {
        hub.connect(name).await.client.flush().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_env_cat_command_runs_as_the_identity() {
    let hub = Rendered::start(IDENTITIES, &["--durable"]).await;
    let _router = hub.router();
    support::wait_router_answers(&hub.connect("ops").await.client).await;
    // Render again with the server's URL in the files (the keys are kept).
    let url = hub.server.url();
    render_into(
        hub.dir.path(),
        IDENTITIES,
        &["--durable", "--client-url", &url],
    )
    .await;
    // Exactly what docs/SECURITY.md and deploy/README.md say, through a shell.
    let script = format!(
        "env $(cat {}) {} send --to bob hello",
        hub.env_file("alice").display(),
        support::oneshot::RUNTIME
    );
    let out = support::oneshot::run_program("sh", &["-c", &script], &[]).await;
    assert_exit(&out, 0, "env $(cat alice.env) runtime send");
    let receipt: serde_json::Value =
        serde_json::from_str(support::oneshot::stdout(&out).trim()).unwrap();
    assert!(receipt["ingress_seq"].as_u64().is_some(), "{receipt}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_router_running_inbox_and_send_still_know_the_hub_is_durable() {
    let hub = Rendered::start(IDENTITIES, &["--durable"]).await;
    let mut router = hub.router();
    support::wait_router_answers(&hub.connect("ops").await.client).await;
    // Both have attached once (their inbox consumers exist).
    for who in ["alice", "bob"] {
        let read = hub.run_as(who, &["inbox", "--idle-secs", "1"]).await;
        assert_exit(&read, 0, who);
    }
    router.kill9().await;
    // No router answers now: a send still gets a durable receipt (the ingress stores it)...
    let sent = hub
        .run_as("bob", &["send", "--to", "alice", "while down"])
        .await;
    assert_exit(&sent, 0, "send with no router");
    let receipt: serde_json::Value =
        serde_json::from_str(support::oneshot::stdout(&sent).trim()).unwrap();
    assert!(receipt["ingress_seq"].as_u64().is_some(), "{receipt}");
    // ...and once a router routes it, alice's inbox reads it from her durable consumer even
    // while that router is gone again.
    let mut router = hub.router();
    let admin = jetstream::new(hub.connect("ops").await.client);
    harness::wait_until_async("the DM routed", support::DEADLINE, || async {
        support::count_on(&admin, "HUB_INBOX", "channel.inbox.alice").await == 1
    })
    .await
    .unwrap();
    router.kill9().await;
    let read = hub.run_as("alice", &["inbox", "--idle-secs", "2"]).await;
    assert_exit(&read, 0, "inbox with no router");
    assert_eq!(support::oneshot::stdout(&read).trim(), "bob: while down");
    assert!(hub.violations().is_empty(), "{:#?}", hub.violations());
}
