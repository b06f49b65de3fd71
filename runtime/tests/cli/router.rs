//! The durable and core router as operators run it: streams, `runtime status`, a crash, the
//! signals, and core mode without JetStream.

use super::*;

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
