//! Removing a recipient with DMs waiting for it (issue 10, failure table "Recipient deleted with
//! pending messages"), against a real nats-server: `runtime agent remove` dead-letters every
//! DM its consumer had not acked, tells each sender once per DM (`undeliverable`,
//! `recipient_deleted`), deletes the consumer and empties the inbox; the router then refuses
//! DMs to it (`recipient_deleted`) until `runtime agent restore`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use protocol::attach::{AttachResponse, DurableInboxMode};
use protocol::rejection::{parse_notice, parse_rejection};
use protocol::removal::RECIPIENT_DELETED;
use protocol::{subjects, WireErrorKind};
use runtime::{ActorSystem, SystemError};
use support::oneshot::{assert_exit, one_stderr_line, run_cli, stdout};

/// What a `runtime agent remove` line counts: (dead_lettered, notified, consumer_deleted).
fn counts(summary: &serde_json::Value) -> (u64, u64, bool) {
    (
        summary["dead_lettered"].as_u64().unwrap(),
        summary["notified"].as_u64().unwrap(),
        summary["consumer_deleted"].as_bool().unwrap(),
    )
}

/// `runtime dlq replay <id>` against `url`.
async fn dlq_replay(url: &str, id: u64) -> std::process::Output {
    run_cli(&["dlq", "--nats-url", url, "replay", &id.to_string()]).await
}

/// `runtime agent <action> <id>` against `url`: its one JSON line.
async fn agent_cli(url: &str, action: &str, id: &str) -> serde_json::Value {
    let out = run_cli(&["agent", action, id, "--nats-url", url]).await;
    assert_exit(&out, 0, &format!("runtime agent {action} {id}"));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    serde_json::from_str(text.trim()).unwrap()
}

/// `from` sends the DM `id` to `to` with a deadline an hour away (a deadline check scheduled).
async fn send_dm_with_deadline(client: &async_nats::Client, from: &str, to: &str, id: &str) {
    let at = protocol::expiry::now_ms() + 3_600_000;
    let dm = serde_json::json!({"meta": {"id": id, "to": to, "expires_at": at}, "body": "hi"});
    support::publish_dm(client, from, dm).await;
}

/// Waits until `subject` of the inbox stream holds `n` messages.
async fn wait_stored(js: &jetstream::Context, subject: &str, n: usize) {
    harness::wait_until_async(
        &format!("{n} stored on {subject}"),
        support::DEADLINE,
        || async { support::count_on(js, subjects::INBOX_STREAM, subject).await == n },
    )
    .await
    .unwrap();
}

/// The `undeliverable` notices stored in `sender`'s inbox: message id → (reason, recipient).
async fn notices_stored(js: &jetstream::Context, sender: &str) -> Vec<(String, String, String)> {
    support::stored_on(
        js,
        subjects::INBOX_STREAM,
        &format!("channel.inbox.{sender}"),
    )
    .await
    .into_iter()
    .filter_map(|m| {
        let env = protocol::decode(&m.payload, protocol::Codec::Json).ok()?;
        let n = parse_notice(&env)?;
        (n.kind == "undeliverable").then(|| {
            (
                n.message_id.to_string(),
                n.reason.unwrap_or_default(),
                n.to.to_string(),
            )
        })
    })
    .collect()
}

/// How many times each id occurs.
fn counted<'a>(ids: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for id in ids {
        *out.entry(id.to_owned()).or_default() += 1;
    }
    out
}

/// The dead letters `runtime dlq list --agent <agent> --json` prints.
async fn dlq_list(url: &str, agent: &str) -> Vec<serde_json::Value> {
    let out = run_cli(&["dlq", "--nats-url", url, "list", "--agent", agent, "--json"]).await;
    assert_exit(&out, 0, "runtime dlq list");
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until the router knows `n` removed agents.
async fn wait_removed(hub: &ActorSystem, n: usize) {
    harness::wait_until_async(
        &format!("the router knows {n} removed agents"),
        support::DEADLINE,
        || async {
            hub.snapshot()
                .await
                .ok()
                .and_then(|s| s.router)
                .is_some_and(|r| r.removed_agents == n)
        },
    )
    .await
    .unwrap();
}

/// Bob, online in a system of his own, handles `n` DMs (acked), then goes offline; his
/// consumer stays, its ack floor past them.
async fn bob_handles_then_leaves(server: &harness::NatsServer, js: &jetstream::Context, n: usize) {
    let bobs = support::system(server.url(), true, DurableInboxMode::On).await;
    let seen = support::attach_collect(&bobs, &support::agent("bob")).await;
    support::wait_for(&seen, n).await;
    support::wait_settled(js, "inbox-bob").await;
    bobs.shutdown(support::GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipient_deleted_with_pending_messages() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let (alice, carol, bob) = (
        support::agent("alice"),
        support::agent("carol"),
        support::agent("bob"),
    );
    let alices = support::attach_collect(&hub, &alice).await;
    let carols = support::attach_collect(&hub, &carol).await;
    let js = support::js(&server).await;
    let client = hub.client().clone();
    // Two DMs bob handled before he went offline: not pending, never dead-lettered.
    for id in ["early-1", "early-2"] {
        support::send_dm(&client, "alice", "bob", id).await;
    }
    bob_handles_then_leaves(&server, &js, 2).await;
    // 40 DMs wait for offline bob: 30 from alice, 10 from carol (2 of them with a deadline).
    let alice_ids: Vec<String> = (0..30).map(|i| format!("a-{i}")).collect();
    let carol_ids: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    for id in &alice_ids {
        support::send_dm(&client, "alice", "bob", id).await;
    }
    for (i, id) in carol_ids.iter().enumerate() {
        if i < 2 {
            send_dm_with_deadline(&client, "carol", "bob", id).await;
        } else {
            support::send_dm(&client, "carol", "bob", id).await;
        }
    }
    wait_stored(&js, "channel.inbox.bob", 42).await;
    let checks = support::stored_on(&js, subjects::SCHEDULES_STREAM, "hub.sched.expiry.>").await;
    assert_eq!(checks.len(), 2, "the deadline checks of carol's 2 DMs");

    let summary = agent_cli(&url, "remove", "bob").await;
    assert_eq!(summary["agent"], "bob", "{summary}");
    assert_eq!(counts(&summary), (40, 40, true), "{summary}");

    // Each sender told once per DM, by message id, with the reason.
    support::wait_for(&alices, 30).await;
    support::wait_for(&carols, 10).await;
    for (sender, ids) in [("alice", &alice_ids), ("carol", &carol_ids)] {
        let notices = notices_stored(&js, sender).await;
        assert!(
            notices
                .iter()
                .all(|(_, reason, to)| reason == RECIPIENT_DELETED && to == "bob"),
            "{sender}: {notices:?}"
        );
        assert_eq!(
            counted(notices.iter().map(|n| n.0.as_str())),
            counted(ids.iter().map(String::as_str)),
            "{sender}'s notices"
        );
    }
    let delivered: Vec<String> = alices
        .lock()
        .unwrap()
        .iter()
        .filter_map(|d| parse_notice(&d.envelope).map(|n| n.message_id.to_string()))
        .collect();
    assert_eq!(
        counted(delivered.iter().map(String::as_str)),
        counted(alice_ids.iter().map(String::as_str))
    );
    // 40 dead letters for bob, listed by `runtime dlq`: the 40 waiting, not the 2 handled.
    let letters = dlq_list(&url, "bob").await;
    assert_eq!(letters.len(), 40, "{letters:?}");
    // While bob is removed, a replay is refused (exit 64) and keeps the letter.
    let first_letter = letters[0]["id"].as_u64().unwrap();
    let out = dlq_replay(&url, first_letter).await;
    assert_exit(&out, 64, "runtime dlq replay of a removed agent's letter");
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed"));
    assert_eq!(dlq_list(&url, "bob").await.len(), 40);
    assert!(letters.iter().all(|l| l["reason"] == RECIPIENT_DELETED
        && l["subject"] == "channel.inbox.bob"
        && l["deliveries"] == 0));
    let mut expected: Vec<&str> = alice_ids
        .iter()
        .chain(&carol_ids)
        .map(String::as_str)
        .collect();
    expected.sort_unstable();
    let mut listed: Vec<&str> = letters
        .iter()
        .map(|l| l["message_id"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, expected);
    // Bob's inbox subject is empty, his consumer gone, the deadline checks cancelled.
    assert_eq!(
        support::count_on(&js, subjects::INBOX_STREAM, "channel.inbox.bob").await,
        0
    );
    let inbox = js.get_stream(subjects::INBOX_STREAM).await.unwrap();
    assert!(
        inbox.consumer_info("inbox-bob").await.is_err(),
        "bob's consumer is gone"
    );
    assert!(
        support::stored_on(&js, subjects::SCHEDULES_STREAM, "hub.sched.expiry.>")
            .await
            .is_empty()
    );

    // A later DM to bob is refused, recipient_deleted, and stored nowhere; so is his attach.
    wait_removed(&hub, 1).await;
    support::send_dm(&client, "alice", "bob", "late-1").await;
    support::wait_for(&alices, 31).await;
    let refusal = parse_rejection(&alices.lock().unwrap()[30].envelope).unwrap();
    assert_eq!(
        refusal.error.kind,
        WireErrorKind::RecipientDeleted,
        "{refusal:?}"
    );
    assert_eq!(refusal.rejected_id.unwrap().as_str(), "late-1");
    assert_eq!(refusal.to.unwrap().as_str(), "bob");
    assert_eq!(refusal.retry_after_secs, None);
    // A client that sends to bob now is refused at once, and publishes nothing: the next DM
    // the router refuses is the one sent after it.
    let sent = hub
        .send(&alice, &bob, serde_json::json!("refused at send"))
        .await;
    assert!(
        matches!(&sent, Err(SystemError::RecipientDeleted { to }) if *to == bob),
        "{sent:?}"
    );
    support::send_dm(&client, "alice", "bob", "late-2").await;
    support::wait_for(&alices, 32).await;
    let refused: Vec<String> = alices.lock().unwrap()[30..]
        .iter()
        .map(|d| {
            parse_rejection(&d.envelope)
                .unwrap()
                .rejected_id
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(refused, ["late-1", "late-2"]);
    let counters = support::router_counters(&hub).await;
    assert_eq!(counters.refused_deleted, 2, "{counters:?}");
    assert_eq!(
        support::count_on(&js, subjects::INBOX_STREAM, "channel.inbox.bob").await,
        0
    );
    let reply = client
        .request(subjects::attach_request(&bob), "{}".into())
        .await
        .unwrap();
    let attach: AttachResponse = serde_json::from_slice(&reply.payload).unwrap();
    assert!(
        matches!(&attach, AttachResponse::Refused { error } if error.kind == WireErrorKind::RecipientDeleted),
        "{attach:?}"
    );

    // Restored, bob attaches and gets a new DM, and nothing of the purged backlog.
    let restored = agent_cli(&url, "restore", "bob").await;
    assert_eq!(
        restored,
        serde_json::json!({"agent": "bob", "restored": true})
    );
    wait_removed(&hub, 0).await;
    let bobs = support::system(server.url(), true, DurableInboxMode::On).await;
    let seen = support::attach_collect(&bobs, &bob).await;
    support::send_dm(&client, "alice", "bob", "after-restore").await;
    support::wait_for(&seen, 1).await;
    support::wait_settled(&js, "inbox-bob").await;
    let ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.envelope.meta.id.to_string())
        .collect();
    assert_eq!(ids, ["after-restore"]);
    // Restored, his dead letters may be replayed again: one goes back to his inbox.
    let out = dlq_replay(&url, first_letter).await;
    assert_exit(&out, 0, "runtime dlq replay after restore");
    support::wait_for(&seen, 2).await;
    assert_eq!(dlq_list(&url, "bob").await.len(), 39);
    bobs.shutdown(support::GRACE).await.unwrap();
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_run_again_after_a_partial_run_duplicates_no_dead_letter_or_notice() {
    let server = harness::run_server().await.unwrap();
    let url = server.url();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let bob = support::agent("bob");
    let _alices = support::attach_collect(&hub, &support::agent("alice")).await;
    let js = support::js(&server).await;
    let client = hub.client().clone();
    support::send_dm(&client, "alice", "bob", "early").await;
    bob_handles_then_leaves(&server, &js, 1).await;
    let ids = ["m1", "m2", "m3", "m4", "m5"];
    for id in ids {
        support::send_dm(&client, "alice", "bob", id).await;
    }
    wait_stored(&js, "channel.inbox.bob", 6).await;

    // A run that stopped midway: the tombstone written (with the consumer's marks), the
    // consumer deleted, m1 and m2 copied, nobody told, nothing deleted from the inbox.
    let inbox = js.get_stream(subjects::INBOX_STREAM).await.unwrap();
    let info = inbox.consumer_info("inbox-bob").await.unwrap();
    let mark = protocol::removal::ConsumerMark {
        ack_floor: info.ack_floor.stream_sequence,
        delivered: info.delivered.stream_sequence,
    };
    let tomb = protocol::removal::tombstone_for(None, Some(mark), protocol::expiry::now_ms());
    let kv = js.get_key_value(subjects::REMOVED_BUCKET).await.unwrap();
    kv.put("bob", serde_json::to_vec(&tomb).unwrap().into())
        .await
        .unwrap();
    inbox.delete_consumer("inbox-bob").await.unwrap();
    let stored = support::stored_on(&js, subjects::INBOX_STREAM, "channel.inbox.bob").await;
    for msg in &stored[1..3] {
        actors::dead_letter::copy_dm(&js, &bob, msg, RECIPIENT_DELETED, 0)
            .await
            .unwrap();
    }

    // Run again: only the 3 not copied are copied; all 5 senders' notices are stored once.
    let first = agent_cli(&url, "remove", "bob").await;
    assert_eq!(counts(&first), (3, 5, false), "{first}");
    // And once more: nothing left to do.
    let second = agent_cli(&url, "remove", "bob").await;
    assert_eq!(counts(&second), (0, 0, false), "{second}");
    let letters = dlq_list(&url, "bob").await;
    assert_eq!(
        counted(letters.iter().map(|l| l["message_id"].as_str().unwrap())),
        counted(ids),
        "one dead letter per waiting DM, none for the handled one: {letters:?}"
    );
    let notices = notices_stored(&js, "alice").await;
    assert_eq!(
        counted(notices.iter().map(|n| n.0.as_str())),
        counted(ids),
        "{notices:?}"
    );
    assert_eq!(
        support::count_on(&js, subjects::INBOX_STREAM, "channel.inbox.bob").await,
        0
    );
    // The tombstone kept its first marks across both runs.
    let kept: protocol::removal::Tombstone =
        serde_json::from_slice(&kv.get("bob").await.unwrap().unwrap()).unwrap();
    assert_eq!(kept, tomb);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_removes_and_restores_an_agent_on_the_rendered_grants() {
    // The rendered config: a router process on its own grants, alice attached with bob's DM
    // waiting in her inbox, and the admin `ops`.
    let hub = support::attack_hub::Hub::start().await;
    let run_as = |who: &'static str, args: &'static [&'static str]| {
        let rendered = &hub.rendered;
        async move {
            let out = rendered.run_as(who, args).await;
            assert_exit(&out, 0, &format!("{who}: runtime {}", args.join(" ")));
            serde_json::from_str::<serde_json::Value>(stdout(&out).trim()).unwrap()
        }
    };
    let summary = run_as("ops", &["agent", "remove", "alice"]).await;
    assert_eq!(counts(&summary), (1, 1, true), "{summary}");
    let notices = notices_stored(&hub.admin, "bob").await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].0, "m-for-alice");
    assert_eq!(hub.inbox_count("alice").await, 0);
    // The router learns the tombstone from its watch (read-only grants), then refuses.
    let ops = hub.rendered.connect("ops").await;
    harness::wait_until_async(
        "the router knows alice is removed",
        support::DEADLINE,
        || async {
            runtime::request_status(&ops.client, Duration::from_secs(1))
                .await
                .is_ok_and(|s| s.removed_agents == 1)
        },
    )
    .await
    .unwrap();
    // `runtime send` as bob, on his own grants: refused at once (it reads alice's tombstone),
    // exit 67, one line; nothing is published.
    let out = hub
        .rendered
        .run_as(
            "bob",
            &["send", "--as", "bob", "--to", "alice", "refused at send"],
        )
        .await;
    assert_exit(&out, 67, "runtime send to a removed agent");
    let line = one_stderr_line(&out, "runtime send to a removed agent");
    assert!(line.contains("recipient_deleted"), "{line}");
    hub.send(&hub.bob, "bob", "alice", "m-late").await;
    hub.wait_inbox("bob", 2).await;
    let stored = support::stored_on(&hub.admin, subjects::INBOX_STREAM, "channel.inbox.bob").await;
    let env = protocol::decode(&stored[1].payload, protocol::Codec::Json).unwrap();
    let refusal = parse_rejection(&env).unwrap();
    assert_eq!(refusal.error.kind, WireErrorKind::RecipientDeleted);
    assert_eq!(hub.inbox_count("alice").await, 0);
    let attach = support::attack_hub::attach(&hub.alice, "alice").await;
    assert!(attach.contains("recipient_deleted"), "{attach}");
    // Restored, she attaches again.
    let restored = run_as("ops", &["agent", "restore", "alice"]).await;
    assert_eq!(restored["restored"], true, "{restored}");
    let attach = support::attack_hub::attach(&hub.alice, "alice").await;
    assert!(attach.contains("inbox-alice"), "{attach}");
    // Nobody needed a grant it does not have.
    assert_eq!(hub.rendered.violations(), Vec::<String>::new());
}

/// A DM a router stored in the instant before it saw the tombstone lands after the removal's
/// first sweep: the second sweep, after `SETTLE`, dead-letters it too, and nothing is left in
/// the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_stored_while_the_removal_settles_is_dead_lettered_by_its_second_sweep() {
    let server = harness::run_server().await.unwrap();
    let hub = support::durable_hub(&server, DurableInboxMode::On).await;
    let js = support::js(&server).await;
    let bob = support::agent("bob");
    let inbox = subjects::inbox(&bob);
    let dm = |id: &str| {
        serde_json::to_vec(
            &serde_json::json!({"meta": {"id": id, "from": "alice", "to": "bob"}, "body": "hi"}),
        )
        .unwrap()
    };
    support::js_publish(&js, &inbox, "early", dm("early")).await;
    wait_stored(&js, &inbox, 1).await;
    let removal = tokio::spawn({
        let (client, delivery, bob) = (hub.client().clone(), support::delivery(), bob.clone());
        async move { runtime::system::removal::remove(&client, &delivery, &bob).await }
    });
    // The first sweep has copied the early DM; the removal now waits `SETTLE` (500 ms).
    harness::wait_until_async("the early DM dead-lettered", support::DEADLINE, || async {
        support::count_on(&js, "HUB_DLQ", "dlq.bob").await == 1
    })
    .await
    .unwrap();
    assert!(!removal.is_finished(), "still settling");
    // A router that had not seen the tombstone yet stores one more.
    support::js_publish(&js, &inbox, "late", dm("late")).await;
    let removed = removal.await.unwrap().unwrap();
    assert_eq!(removed.dead_lettered, 2, "{removed:?}");
    let ids: Vec<String> = support::stored_on(&js, "HUB_DLQ", "dlq.bob")
        .await
        .iter()
        .map(|m| {
            protocol::decode(&m.payload, protocol::Codec::Json)
                .unwrap()
                .meta
                .id
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["early", "late"]);
    assert_eq!(
        support::count_on(&js, subjects::INBOX_STREAM, &inbox).await,
        0,
        "nothing left in the inbox"
    );
    hub.shutdown(support::GRACE).await.unwrap();
}
