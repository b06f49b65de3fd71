//! Tasks from the command line: a worker, `delegate`, `task status`, `answer`, `--resume`.

use super::*;

// ---------------------------------------------------------------------------------------------
// Tasks from the command line: worker, delegate, task status, answer, resume
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_a_question_answer_it_and_resume_the_result_from_the_cli() {
    let server = server().await;
    let url = server.url();
    let journal = tempfile::tempdir().unwrap();
    let script = harness::workspace_root().join("deploy/worker-echo.py");
    let exec = format!("python3 {}", script.display());
    let journal_dir = journal.path().display().to_string();
    let mut all = spawn_runtime(&[
        "start",
        "--role",
        "all",
        "--durable",
        "--worker-id",
        "w9",
        "--queue",
        "q",
        "--exec",
        &exec,
        "--journal-dir",
        &journal_dir,
        "--nats-url",
        &url,
    ]);
    wait_for_status(&url, &mut all).await;

    let out = run_cli(&[
        "delegate",
        "--as",
        "alice",
        "--queue",
        "q",
        "why?",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "delegate");
    let receipt: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let task_id = receipt["task_id"].as_str().unwrap().to_string();

    // The worker asks its question: status says waiting (parked in the worker's journal).
    let status_as_alice = [
        "task",
        "--nats-url",
        &url,
        "status",
        &task_id,
        "--as",
        "alice",
    ];
    let waiting = std::cell::RefCell::new(Value::Null);
    harness::wait_until_async("task waiting", DEADLINE, || async {
        let out = run_cli(&status_as_alice).await;
        let reply: Value = serde_json::from_str(stdout(&out).trim()).unwrap_or(Value::Null);
        let done = reply["state"] == "waiting";
        *waiting.borrow_mut() = reply;
        done
    })
    .await
    .unwrap();
    // Parked: the waiting result completed its input's delivery; nothing runs until the
    // answer comes.
    assert_eq!(waiting.borrow()["active"], false);
    assert_eq!(waiting.borrow()["suspend"]["tool_call_id"], "ask-1");

    let out = run_cli(&[
        "answer",
        &task_id,
        "--as",
        "alice",
        "--text",
        "because",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "answer");
    let answer: Value = serde_json::from_str(stdout(&out).trim()).unwrap();

    // Answered just now: the task may still show its question for a moment, so the resume
    // follows answers to the final result (a plain --resume of a waiting task exits 75).
    let out = run_cli(&[
        "delegate",
        "--as",
        "alice",
        "--resume",
        &task_id,
        "--follow-answers",
        "--timeout-secs",
        "30",
        "--nats-url",
        &url,
    ])
    .await;
    assert_exit(&out, 0, "delegate --resume --follow-answers");
    let last = stdout(&out).lines().last().unwrap_or_default().to_owned();
    let result: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(result["state"], "completed");
    assert_eq!(result["response"]["echo"], "why?");
    assert_eq!(result["response"]["answers"][0]["responses"][0], "because");
    // The waiting attempt was resumed, not a new one.
    assert_eq!(result["attempt_id"], answer["attempt_id"]);

    // Finished: status comes from the task channel.
    let out = run_cli(&status_as_alice).await;
    let reply: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (reply["state"].as_str(), reply["active"].as_bool()),
        (Some("completed"), Some(false))
    );

    // `runtime status` lists the worker with its counters beside the router's snapshot.
    let out = status(&url).await;
    assert_exit(&out, 0, "status");
    let snapshot: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(snapshot["durable"], Value::Bool(true), "{snapshot}");
    let workers = snapshot["workers"].as_array().expect("a workers array");
    assert_eq!(workers.len(), 1, "{snapshot}");
    assert_eq!(workers[0]["worker_id"], "w9");
    assert_eq!(workers[0]["queue"], "q");
    assert_eq!(workers[0]["counters"]["completed"], 1, "{snapshot}");
    assert_eq!(workers[0]["counters"]["answers"], 1, "{snapshot}");
    all.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_with_an_inbox_prefix_answers_status_only_under_that_prefix() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let mut router = spawn_runtime(&[
        "start",
        "--role",
        "router",
        "--nats-url",
        &url,
        "--inbox-prefix",
        "_HUB",
    ]);
    // `runtime status` with the same prefix is answered...
    let waited = harness::wait_until_async("status under _HUB", DEADLINE, || async {
        run_cli(&[
            "status",
            "--nats-url",
            &url,
            "--timeout-secs",
            "2",
            "--inbox-prefix",
            "_HUB",
        ])
        .await
        .status
        .success()
    })
    .await;
    assert!(waited.is_ok(), "{}", router.log());
    // ...one with the default `_INBOX` is not (no answer: unavailable).
    let plain = status(&url).await;
    assert_exit(&plain, 69, "status outside the router's prefix");
    // An invalid prefix is a usage error.
    let bad = run_cli(&["status", "--nats-url", &url, "--inbox-prefix", "_HUB.*"]).await;
    assert_exit(&bad, 64, "an invalid inbox prefix");
    assert!(!router.has_exited());
}
