//! The client commands: `send` and `inbox`.

use super::*;

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
