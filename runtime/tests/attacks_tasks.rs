//! The attacks on tasks (issue 9, docs/SECURITY.md, attacks 13 to 15) and their controls, on
//! the rendered config with a real router and a real worker `w1` (queue `q`), each running on
//! its own rendered credentials. Alice delegates through the CLI on her `.env` file alone;
//! bob, connected with his, tries to read, forge, query, cancel and answer her task.
//!
//! A task channel lives under its delegator (`channel.task.<delegator>.<task id>`): alice may
//! subscribe to hers, and read them through a router (`hub.delivery.alice.task`), which reads
//! only `channel.task.alice.…`. Query and cancel name their requester
//! (`hub.ctl.<worker>.<kind>.<requester>`), and the worker serves only the task's delegator.

mod support;

use std::process::Output;
use std::time::Duration;

use actors::task_channel::{self, Reader};
use async_nats::jetstream;
use futures::StreamExt;
use protocol::task::{TaskResult, TaskState};
use protocol::{AgentId, TaskId};
use serde_json::Value;
use support::attack_hub::Hub;
use support::oneshot::stdout;

/// The worker's command: a task whose text says `ASKME` asks a question first (answered: it
/// completes); one that says `SLOWLY` runs for 30 s (long enough to be cancelled); any other
/// completes at once.
const SCRIPT: &str = r#"task=$(cat)
case "$task" in
  *ASKME*) if [ -z "$TASK_ANSWERS" ]; then printf '{"question": "which?", "tool_call_id": "q1"}\n'; exit 0; fi ;;
  *SLOWLY*) sleep 30 ;;
esac
printf '{"response": "done"}\n'
"#;

/// The hub of `attacks.rs` with worker `w1` running on its rendered credentials.
struct TaskHub {
    hub: Hub,
    worker: harness::RuntimeProcess,
}

impl TaskHub {
    async fn start() -> TaskHub {
        let hub = Hub::start().await;
        let worker = hub.rendered.worker("w1", SCRIPT);
        TaskHub { hub, worker }
    }

    /// Runs the CLI as `who`, on its `.env` file alone.
    async fn cli(&self, who: &str, args: &[&str]) -> Output {
        self.hub.rendered.run_as(who, args).await
    }

    /// Alice delegates `text` to queue `q` without waiting; the task id.
    async fn alice_delegates(&self, text: &str) -> TaskId {
        let out = self.cli("alice", &["delegate", "--queue", "q", text]).await;
        self.exit(&out, 0, "alice's delegate");
        let receipt: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
        TaskId::new(receipt["task_id"].as_str().unwrap()).unwrap()
    }

    /// `runtime task <action> <task_id>` as `who`: its exit and JSON reply (`Null` if none).
    async fn task(&self, who: &str, action: &str, task_id: &TaskId) -> (Option<i32>, Value) {
        let out = self.cli(who, &["task", action, task_id.as_str()]).await;
        let reply = serde_json::from_str(stdout(&out).trim()).unwrap_or(Value::Null);
        (out.status.code(), reply)
    }

    /// Waits until alice's `task status` of `task_id` says `state`.
    async fn alice_sees(&self, task_id: &TaskId, state: &str) -> Value {
        let seen = std::cell::RefCell::new(Value::Null);
        harness::wait_until_async(
            &format!("alice's task {state}"),
            support::DEADLINE,
            || async {
                let (_, reply) = self.task("alice", "status", task_id).await;
                let done = reply["state"] == state;
                *seen.borrow_mut() = reply;
                done
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: last {}\n{}", seen.borrow(), self.logs()));
        seen.into_inner()
    }

    /// The results stored on `task_id`'s channel under `delegator`, as the admin reads them.
    async fn results_under(&self, delegator: &str, task_id: &TaskId) -> Vec<TaskResult> {
        let subject = format!("channel.task.{delegator}.{task_id}");
        support::stored_on(&self.hub.admin, "HUB_TASKS", &subject)
            .await
            .into_iter()
            .filter_map(|m| {
                let env = protocol::decode(&m.payload, protocol::Codec::Json).ok()?;
                serde_json::from_value::<Value>(env.body).ok()
            })
            .filter_map(|body| serde_json::from_value(body.get("result")?.clone()).ok())
            .collect()
    }

    /// The number of messages on `task_id`'s channel under `delegator`.
    async fn count_under(&self, delegator: &str, task_id: &TaskId) -> usize {
        let subject = format!("channel.task.{delegator}.{task_id}");
        support::count_on(&self.hub.admin, "HUB_TASKS", &subject).await
    }

    fn exit(&self, out: &Output, code: i32, what: &str) {
        assert_eq!(
            out.status.code(),
            Some(code),
            "{what}: {}\n{}\n{}",
            stdout(out),
            support::oneshot::stderr(out),
            self.logs()
        );
    }

    fn logs(&self) -> String {
        format!("worker:\n{}", self.worker.log())
    }

    /// No permission was refused to anyone: no grant is too tight for what was done.
    fn no_violations(&self) {
        let violations = self.hub.rendered.violations();
        assert!(
            violations.is_empty(),
            "a grant is too tight: {violations:#?}"
        );
    }

    /// No permission was refused to anyone but bob (the server's log names a user by its
    /// nkey).
    fn only_bob_refused(&self) {
        let seed = self.hub.rendered.env("bob")["NATS_NKEY_SEED"].clone();
        let bob = nkeys::KeyPair::from_seed(&seed).unwrap().public_key();
        let others: Vec<String> = self
            .hub
            .rendered
            .violations()
            .into_iter()
            .filter(|v| !v.contains(&bob))
            .collect();
        assert!(others.is_empty(), "a grant is too tight: {others:#?}");
    }
}

/// The last JSON line of a CLI's output.
fn last_line(out: &Output) -> Value {
    let text = stdout(out);
    serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_alice_delegates_waits_answers_and_resumes_her_own_task_and_w1_runs_it() {
    let hub = TaskHub::start().await;
    // `delegate --wait` follows the task live and through the router's reads: it stops at the
    // question (exit 75, the waiting result printed).
    let out = hub
        .cli(
            "alice",
            &[
                "delegate",
                "--queue",
                "q",
                "--wait",
                "--timeout-secs",
                "30",
                "ASKME",
            ],
        )
        .await;
    hub.exit(&out, 75, "delegate --wait of a task that asks");
    let receipt: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let task_id = TaskId::new(receipt["task_id"].as_str().unwrap()).unwrap();
    let waiting = last_line(&out);
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    assert_eq!(waiting["suspend"]["question"], "which?");
    assert_eq!(waiting["worker_id"], "w1");
    // Her status query reaches the worker (`hub.ctl.w1.query.alice`).
    let status = hub.alice_sees(&task_id, "waiting").await;
    assert_eq!(status["suspend"]["tool_call_id"], "q1", "{status}");
    // She answers, and her resume finds the final result.
    let out = hub
        .cli("alice", &["answer", task_id.as_str(), "--text", "that one"])
        .await;
    hub.exit(&out, 0, "answer");
    let out = hub
        .cli(
            "alice",
            &[
                "delegate",
                "--resume",
                task_id.as_str(),
                "--follow-answers",
                "--timeout-secs",
                "30",
            ],
        )
        .await;
    hub.exit(&out, 0, "delegate --resume");
    let done = last_line(&out);
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["response"], "done");
    assert_eq!(
        done["attempt_id"], waiting["attempt_id"],
        "the waiting attempt resumed"
    );
    hub.alice_sees(&task_id, "completed").await;
    // Everything stored is on alice's own channel of the task.
    let results = hub.results_under("alice", &task_id).await;
    let states: Vec<TaskState> = results.iter().map(|r| r.state).collect();
    assert_eq!(states, [TaskState::Waiting, TaskState::Completed]);
    hub.no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_alice_cancels_her_own_running_task() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("SLOWLY").await;
    let running = hub.alice_sees(&task_id, "running").await;
    assert_eq!(running["active"], true, "{running}");
    let (code, reply) = hub.task("alice", "cancel", &task_id).await;
    assert_eq!(code, Some(0), "{reply}");
    assert_eq!(reply["cancel"], "requested", "{reply}");
    hub.alice_sees(&task_id, "cancelled").await;
    let results = hub.results_under("alice", &task_id).await;
    assert_eq!(
        results.last().map(|r| r.state),
        Some(TaskState::Cancelled),
        "{results:?}"
    );
    hub.no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_admin_queries_and_cancels_a_task_alice_delegated() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("SLOWLY").await;
    hub.alice_sees(&task_id, "running").await;
    let ops = |action: &'static str| {
        let task_id = task_id.clone();
        let hub = &hub;
        async move {
            let args = ["task", action, task_id.as_str(), "--delegator", "alice"];
            let out = hub.cli("ops", &args).await;
            hub.exit(&out, 0, &format!("ops' task {action}"));
            serde_json::from_str::<Value>(stdout(&out).trim()).unwrap()
        }
    };
    let status = ops("status").await;
    assert_eq!(
        (status["state"].as_str(), status["active"].as_bool()),
        (Some("running"), Some(true)),
        "{status}"
    );
    let cancel = ops("cancel").await;
    assert_eq!(cancel["cancel"], "requested", "{cancel}");
    hub.alice_sees(&task_id, "cancelled").await;
    hub.no_violations();
}

/// A delegator's idempotency key is its own (issue 28, A2): alice submits twice with one key
/// and gets one task, run once; bob with the same key gets a task of his own and learns nothing
/// of hers. All on the rendered grants, with no permission refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_each_delegators_own_on_the_rendered_config() {
    let hub = TaskHub::start().await;
    let delegate = |who: &'static str, text: &'static str| {
        let hub = &hub;
        async move {
            let args = ["delegate", "--queue", "q", "--idempotency-key", "k1", text];
            let out = hub.cli(who, &args).await;
            hub.exit(&out, 0, &format!("{who}'s delegate"));
            serde_json::from_str::<Value>(stdout(&out).lines().next().unwrap()).unwrap()
        }
    };
    let first = delegate("alice", "QUICK one").await;
    let again = delegate("alice", "QUICK one").await;
    assert_eq!(first["existing"], false, "{first}");
    assert_eq!(again["existing"], true, "{again}");
    assert_eq!(again["task_id"], first["task_id"], "{first} {again}");
    let task_id = TaskId::new(first["task_id"].as_str().unwrap()).unwrap();
    hub.alice_sees(&task_id, "completed").await;
    let bobs = delegate("bob", "QUICK bob").await;
    assert_eq!(bobs["existing"], false, "bob's own task: {bobs}");
    assert_ne!(bobs["task_id"], first["task_id"], "{bobs}");
    let bob_task = TaskId::new(bobs["task_id"].as_str().unwrap()).unwrap();
    let (code, status) = hub.task("bob", "status", &bob_task).await;
    assert_eq!(code, Some(0), "{status}");
    // Alice's task ran once; nothing of it is under bob.
    let states: Vec<TaskState> = hub
        .results_under("alice", &task_id)
        .await
        .iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(states, [TaskState::Completed], "one run of alice's task");
    assert_eq!(hub.count_under("bob", &task_id).await, 0);
    hub.no_violations();
}

/// `runtime status` as an admin: the router's snapshot and the worker's, which answers from
/// its own account on a subject of its own (`hub.admin.workers.<token>.w1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_admin_sees_the_routers_and_every_workers_status() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("QUICK").await;
    hub.alice_sees(&task_id, "completed").await;
    let out = hub.cli("ops", &["status"]).await;
    hub.exit(&out, 0, "ops' status");
    let status: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let workers: Vec<&str> = status["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"))
        .iter()
        .filter_map(|w| w["worker_id"].as_str())
        .collect();
    assert_eq!(workers, ["w1"], "{status}");
    hub.no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_13_bob_cannot_read_the_result_of_alices_task() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("QUICK").await;
    hub.alice_sees(&task_id, "completed").await;
    let channel = format!("channel.task.alice.{task_id}");
    let h = &hub.hub;
    // Live: not her channel, nor all of them.
    h.bob_refused_subscription(&channel).await;
    h.bob_refused_subscription("channel.task.>").await;
    // Stored, straight from the stream: no direct get, in either form.
    h.bob_refused(
        "$JS.API.DIRECT.GET.HUB_TASKS",
        Some("_INBOX.bob.t1"),
        &format!(r#"{{"last_by_subj":"{channel}"}}"#),
    )
    .await;
    h.bob_refused(
        &format!("$JS.API.DIRECT.GET.HUB_TASKS.{channel}"),
        Some("_INBOX.bob.t2"),
        "",
    )
    .await;
    // Through the router: only as himself, and the router reads only his own channels.
    h.bob_refused("hub.delivery.alice.task", Some("_INBOX.bob.t3"), "{}")
        .await;
    let js = jetstream::new(h.bob.client.clone());
    let bob = AgentId::new("bob").unwrap();
    let read = task_channel::read(&js, &Reader::Routed(bob.clone()), &bob, &task_id, 1)
        .await
        .expect("bob's read of his own channel of that id");
    assert!(read.is_empty(), "bob read {} messages", read.len());
    // His own CLI finds nothing of the task.
    let (code, reply) = hub.task("bob", "status", &task_id).await;
    assert_ne!(code, Some(0), "bob's status of alice's task: {reply}");
    let out = hub
        .cli(
            "bob",
            &[
                "delegate",
                "--resume",
                task_id.as_str(),
                "--timeout-secs",
                "2",
            ],
        )
        .await;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        !stdout(&out).contains("completed"),
        "bob's resume printed alice's result: {}",
        stdout(&out)
    );
    // Alice's result is where it was.
    assert_eq!(hub.results_under("alice", &task_id).await.len(), 1);
    hub.only_bob_refused();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_14_bob_cannot_forge_a_result_on_alices_task_channel() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("SLOWLY").await;
    let running = hub.alice_sees(&task_id, "running").await;
    assert_eq!(running["active"], true);
    let forged = serde_json::json!({"meta": {"id": "forged"}, "body": {"result": {
        "task_id": task_id, "attempt_id": "a1", "worker_id": "w1", "state": "completed",
        "response": "forged"}}})
    .to_string();
    let h = &hub.hub;
    // Agents publish on no task channel: not through his ingress, not straight at hers.
    h.bob_refused(&format!("hub.pub.bob.task.alice.{task_id}"), None, &forged)
        .await;
    h.bob_refused(&format!("channel.task.alice.{task_id}"), None, &forged)
        .await;
    // Nothing but w1's acceptance on her channel, and the task still runs.
    assert!(
        hub.results_under("alice", &task_id).await.is_empty(),
        "a result on alice's channel"
    );
    let (_, status) = hub.task("alice", "status", &task_id).await;
    assert_eq!(
        (status["state"].as_str(), status["active"].as_bool()),
        (Some("running"), Some(true)),
        "{status}"
    );
    hub.only_bob_refused();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_15_bob_cannot_query_cancel_or_answer_alices_task() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("ASKME").await;
    hub.alice_sees(&task_id, "waiting").await;
    let waiting = hub.results_under("alice", &task_id).await.remove(0);
    let h = &hub.hub;
    let request = serde_json::json!({
        "task_id": task_id, "attempt_id": waiting.attempt_id, "worker_id": "w1",
    })
    .to_string();
    for kind in ["query", "cancel"] {
        // Neither the admin form nor alice's.
        h.bob_refused(
            &format!("hub.ctl.w1.{kind}"),
            Some("_INBOX.bob.c"),
            &request,
        )
        .await;
        h.bob_refused(
            &format!("hub.ctl.w1.{kind}.alice"),
            Some("_INBOX.bob.c"),
            &request,
        )
        .await;
        // His own form reaches the worker, which serves only the task's delegator.
        let reply = h
            .bob
            .client
            .request(format!("hub.ctl.w1.{kind}.bob"), request.clone().into())
            .await
            .expect("the worker answers bob");
        let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(
            reply["error"]["kind"], "unauthorized",
            "bob's {kind}: {reply}"
        );
    }
    // He answers her question as himself (his grant allows answers): the worker refuses it,
    // on his own channel of the task, and nothing resumes.
    let answer = serde_json::json!({"meta": {"id": "ans-bob"}, "body": {
        "message_id": "ans-bob", "task_id": task_id, "attempt_id": waiting.attempt_id,
        "worker_id": "w1", "tool_call_id": "q1", "responses": ["bob's"]}});
    let js = jetstream::new(h.bob.client.clone());
    js.publish("hub.pub.bob.answer.w1", answer.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    harness::wait_until_async(
        "the refusal on bob's channel",
        support::DEADLINE,
        || async { hub.count_under("bob", &task_id).await == 1 },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", hub.logs()));
    // His CLI cannot even find the task to cancel it, as himself or as an admin would.
    let (code, reply) = hub.task("bob", "cancel", &task_id).await;
    assert_ne!(code, Some(0), "bob's cancel: {reply}");
    let args = ["task", "cancel", task_id.as_str(), "--delegator", "alice"];
    let out = hub.cli("bob", &args).await;
    assert_ne!(
        out.status.code(),
        Some(0),
        "bob's admin cancel: {}",
        stdout(&out)
    );
    // Alice's task still waits on her question, unanswered, and she can still cancel it.
    let status = hub.alice_sees(&task_id, "waiting").await;
    assert_eq!(status["suspend"]["tool_call_id"], "q1");
    let states: Vec<TaskState> = hub
        .results_under("alice", &task_id)
        .await
        .iter()
        .map(|r| r.state)
        .collect();
    assert_eq!(states, [TaskState::Waiting], "nothing resumed alice's task");
    let (code, reply) = hub.task("alice", "cancel", &task_id).await;
    assert_eq!(code, Some(0), "{reply}");
    hub.alice_sees(&task_id, "cancelled").await;
    hub.only_bob_refused();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_21_bob_cannot_replay_a_forged_result_into_alices_tracker() {
    let hub = TaskHub::start().await;
    let task_id = hub.alice_delegates("SLOWLY").await;
    hub.alice_sees(&task_id, "running").await;
    // Alice tracks her task in her own process, live and through the router.
    let alice = AgentId::new("alice").unwrap();
    let trackers = actors::tracker::Trackers::new("alice-trackers", h_client(&hub, "alice").await);
    let (tracker, _) = ractor::Actor::spawn(None, trackers, ()).await.unwrap();
    let track = actors::tracker::Track {
        delegator: alice.clone(),
        task_id: task_id.clone(),
        fresh: false,
    };
    let (result, _events) = actors::tracker::track(&tracker, track).await.unwrap();
    let h = &hub.hub;
    // Bob stores a forged final result as a DM to himself (stamped as bob, naming bob as the
    // worker), then pulls it from his own inbox consumer with the reply aimed at alice's task
    // channel: nats-server checks neither. Bob's account reaches the hub's only through
    // imports, whose replies the broker maps back into his own account, so it never reaches
    // alice's subscription (on one account it did, and the tracker's check of the ack reply
    // was all that stopped it).
    support::attack_hub::attach(&h.bob, "bob").await;
    let forged = serde_json::json!({"meta": {"id": "forged", "to": "bob"}, "body": {"result": {
        "task_id": task_id, "attempt_id": "a-forged", "worker_id": "bob", "state": "completed",
        "response": "forged"}}});
    jetstream::new(h.bob.client.clone())
        .publish("hub.pub.bob.inbox", forged.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    h.wait_inbox("bob", 1).await;
    h.bob
        .client
        .publish_with_reply(
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            format!("channel.task.alice.{task_id}"),
            r#"{"batch":1}"#.into(),
        )
        .await
        .unwrap();
    // The consumer takes bob's pulls in order: once a later pull of his own is answered (the
    // DM, or a status if the first pull took it), the first was served.
    let own = "_INBOX.bob.after";
    let mut answers = h.bob.client.subscribe(own).await.unwrap();
    h.bob
        .client
        .publish_with_reply(
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            own,
            r#"{"batch":1,"expires":500000000}"#.into(),
        )
        .await
        .unwrap();
    tokio::time::timeout(support::DEADLINE, answers.next())
        .await
        .expect("bob's own pull answered")
        .unwrap();
    // The tracker saw nothing: the first final result it delivers is the real one, after
    // alice cancels her task.
    let snapshot = ractor::call!(tracker, actors::tracker::TrackersMsg::Snapshot).unwrap();
    assert_eq!(snapshot.counters.replayed, 0, "{:?}", snapshot.counters);
    let channel = protocol::subjects::TaskChannel::of(&alice, &task_id).subject();
    let task = ractor::call!(tracker, actors::tracker::TrackersMsg::Task, channel).unwrap();
    assert!(task.is_some(), "still tracked: no result was delivered");
    let (code, reply) = hub.task("alice", "cancel", &task_id).await;
    assert_eq!(code, Some(0), "{reply}");
    let result = tokio::time::timeout(support::DEADLINE, result)
        .await
        .expect("alice's result")
        .unwrap();
    assert_eq!(
        (result.state, result.worker_id.as_str()),
        (TaskState::Cancelled, "w1"),
        "{result:?}"
    );
    hub.only_bob_refused();
}

/// A client of `who` on its rendered credentials.
async fn h_client(hub: &TaskHub, who: &str) -> async_nats::Client {
    hub.hub.rendered.connect(who).await.client
}

/// The consumer watchdog on the router's rendered credentials: a queue consumer whose state
/// went ahead of its stream (it takes a held task for acked, as open nats-server issues show
/// after a power loss) is found at two checks, reset to the task, and the task runs. Without
/// the watchdog the task stays in `HUB_WORK` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_watchdog_resets_a_stalled_queue_consumer_on_its_rendered_credentials() {
    let mut hub = TaskHub::start().await;
    let admin = hub.hub.admin.clone();
    harness::wait_until_async("w1 joined queue q", support::DEADLINE, || async {
        harness::consumer_info(&admin, "HUB_WORK", "queue-q")
            .await
            .is_some()
    })
    .await
    .unwrap();
    hub.worker.kill9().await;
    let task_id = hub.alice_delegates("lost by its consumer").await;
    let held = || async {
        let mut work = admin.get_stream("HUB_WORK").await.unwrap();
        let info = work.info().await.unwrap();
        (info.state.messages, info.state.last_sequence)
    };
    harness::wait_until_async("the task in HUB_WORK", support::DEADLINE, || async {
        held().await.0 == 1
    })
    .await
    .unwrap();
    let last = held().await.1;
    actors::watchdog::reset(&admin.client(), "HUB_WORK", "queue-q", last + 1)
        .await
        .unwrap();
    hub.worker = hub.hub.rendered.worker("w1", SCRIPT);
    hub.alice_sees(&task_id, "completed").await;
    let status = runtime::request_status(&admin.client(), Duration::from_secs(2))
        .await
        .unwrap();
    let watchdog = status.watchdog.expect("the router runs a watchdog");
    assert!(watchdog.resets >= 1, "{watchdog:?}");
    assert_eq!(watchdog.reset_errors, 0, "{watchdog:?}");
    hub.no_violations();
}
