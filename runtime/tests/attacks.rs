//! The attack suite (issue 9, docs/SECURITY.md): a real nats-server on the config
//! `runtime render-config` writes, a real router process on its own rendered credentials, and
//! agents alice and bob. Connected as bob, each attack is refused by the broker (a permissions
//! violation) or by the router, and nothing of alice's is read, changed or lost. The controls
//! show the rightful identity may do the same. The attacks on tasks (13 to 15), and their
//! controls, with a worker running, are in `attacks_tasks.rs`.

mod support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt;
use support::attack_hub::{alice_delegates, attach, router_counters, Hub};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_01_bob_cannot_publish_as_alice() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "hub.pub.alice.inbox",
        None,
        r#"{"meta":{"id":"x","to":"bob"},"body":1}"#,
    )
    .await;
    assert_eq!(
        hub.inbox_count("bob").await,
        0,
        "nothing reached bob as alice"
    );
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_02_bob_cannot_write_into_alices_inbox() {
    let hub = Hub::start().await;
    let forged = r#"{"meta":{"id":"f","from":"carol","to":"alice"},"body":"forged"}"#;
    hub.bob_refused("channel.inbox.alice", None, forged).await;
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_03_bob_cannot_make_alices_attach_request() {
    let hub = Hub::start().await;
    hub.bob_refused("hub.delivery.alice.inbox", Some("_INBOX.bob.x"), "{}")
        .await;
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_04_bob_cannot_subscribe_to_alices_inbox() {
    let hub = Hub::start().await;
    hub.bob_refused_subscription("channel.inbox.alice").await;
    hub.send(&hub.bob, "bob", "alice", "m-second").await;
    hub.wait_inbox("alice", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_05_bob_cannot_pull_from_alices_consumer() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-alice",
        Some("_INBOX.bob.pull"),
        r#"{"batch":1,"expires":1000000000}"#,
    )
    .await;
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_06_bob_cannot_ack_nak_or_term_alices_messages() {
    let hub = Hub::start().await;
    // Alice pulls her DM and holds it unacked: its ack subject is what bob would need.
    let js = jetstream::new(hub.alice.client.clone());
    let consumer: PullConsumer = js
        .get_consumer_from_stream("inbox-alice", "HUB_INBOX")
        .await
        .unwrap();
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let msg = batch.next().await.unwrap().unwrap();
    let ack_subject = msg.reply.clone().unwrap().to_string();
    for verb in ["+ACK", "-NAK", "+TERM"] {
        hub.bob_refused(&ack_subject, None, verb).await;
    }
    let info = hub.alice_consumer().await;
    assert_eq!(info.num_ack_pending, 1, "still alice's to ack: {info:?}");
    msg.ack().await.unwrap();
    harness::wait_until_async("alice's own ack", support::DEADLINE, || async {
        hub.alice_consumer().await.num_ack_pending == 0
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_07_bob_cannot_read_alices_consumer_info() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "$JS.API.CONSUMER.INFO.HUB_INBOX.inbox-alice",
        Some("_INBOX.bob.info"),
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_08_bob_cannot_delete_alices_consumer() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "$JS.API.CONSUMER.DELETE.HUB_INBOX.inbox-alice",
        Some("_INBOX.bob.del"),
        "",
    )
    .await;
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_09_bob_cannot_create_any_consumer() {
    let hub = Hub::start().await;
    let before = consumer_names(&hub).await;
    let pull = r#"{"stream_name":"HUB_INBOX","config":{"durable_name":"evil","ack_policy":"explicit","filter_subject":"channel.inbox.alice"}}"#;
    hub.bob_refused(
        "$JS.API.CONSUMER.CREATE.HUB_INBOX.evil.channel.inbox.alice",
        Some("_INBOX.bob.c1"),
        pull,
    )
    .await;
    let push = r#"{"stream_name":"HUB_INBOX","config":{"name":"evilpush","deliver_subject":"hub.pub.alice.inbox","ack_policy":"none"}}"#;
    hub.bob_refused(
        "$JS.API.CONSUMER.CREATE.HUB_INBOX.evilpush",
        Some("_INBOX.bob.c2"),
        push,
    )
    .await;
    hub.bob_refused(
        "$JS.API.CONSUMER.DURABLE.CREATE.HUB_INBOX.evil",
        Some("_INBOX.bob.c3"),
        pull,
    )
    .await;
    assert_eq!(consumer_names(&hub).await, before, "no consumer made");
    hub.alice_intact().await;
}

async fn consumer_names(hub: &Hub) -> Vec<String> {
    let stream = hub.admin.get_stream("HUB_INBOX").await.unwrap();
    let mut names: Vec<String> = stream.consumer_names().map(|n| n.unwrap()).collect().await;
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_10_bob_cannot_read_an_inbox_by_sequence() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "$JS.API.STREAM.MSG.GET.HUB_INBOX",
        Some("_INBOX.bob.g1"),
        r#"{"seq":1}"#,
    )
    .await;
    hub.bob_refused(
        "$JS.API.DIRECT.GET.HUB_INBOX",
        Some("_INBOX.bob.g2"),
        r#"{"seq":1}"#,
    )
    .await;
    hub.bob_refused(
        "$JS.API.DIRECT.GET.HUB_INBOX.channel.inbox.alice",
        Some("_INBOX.bob.g3"),
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_11_bob_cannot_read_stream_info_or_purge_a_stream() {
    let hub = Hub::start().await;
    for stream in ["HUB_INBOX", "HUB_INGRESS", "HUB_TASKS", "HUB_WORK"] {
        hub.bob_refused(
            &format!("$JS.API.STREAM.INFO.{stream}"),
            Some("_INBOX.bob.i"),
            "",
        )
        .await;
    }
    hub.bob_refused("$JS.API.STREAM.PURGE.HUB_INBOX", Some("_INBOX.bob.p"), "")
        .await;
    hub.bob_refused("$JS.API.STREAM.DELETE.HUB_INBOX", Some("_INBOX.bob.d"), "")
        .await;
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_12_a_jetstream_api_reply_aimed_at_alices_ingress_never_reaches_it() {
    let hub = Hub::start().await;
    // Bob attaches, so he may read his own consumer's info; then he aims the JSON reply of
    // that request at alice's ingress subject, which the broker does not check.
    attach(&hub.bob, "bob").await;
    // And pulls of his own (empty) inbox, whose statuses ("no messages", "request timeout")
    // go there too.
    for (subject, body) in [
        ("$JS.API.CONSUMER.INFO.HUB_INBOX.inbox-bob", ""),
        (
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            r#"{"batch":1,"no_wait":true}"#,
        ),
        (
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            r#"{"batch":1,"expires":100000000}"#,
        ),
    ] {
        hub.bob
            .client
            .publish_with_reply(subject, "hub.pub.alice.inbox", body.into())
            .await
            .unwrap();
    }
    hub.bob.client.flush().await.unwrap();
    // Bob's account reaches the hub's only through imports, whose replies the broker maps back
    // into his own account: nothing reaches the ingress as alice's. The router takes the
    // ingress in order, so once a DM bob sends after the attempts is routed, anything stored
    // before it was seen too.
    hub.send(&hub.bob, "bob", "alice", "m-after").await;
    hub.wait_inbox("alice", 2).await;
    let ops = hub.rendered.connect("ops").await;
    let counters = router_counters(&ops).await;
    assert_eq!(counters["dropped_by_guard"], 0, "{counters}");
    assert_eq!(counters["malformed"], 0, "{counters}");
    assert_eq!(
        hub.inbox_count("alice").await,
        2,
        "bob's two DMs, no notice in alice's inbox"
    );
    assert_eq!(hub.inbox_count("bob").await, 0, "nothing in bob's inbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_16_bob_cannot_join_the_queue_as_a_worker() {
    let hub = Hub::start().await;
    hub.bob_refused(
        "hub.work.q.join.w1",
        Some("_INBOX.bob.j"),
        r#"{"worker_id":"w1","concurrency":1}"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_17_bob_cannot_pull_a_workers_consumers() {
    let hub = Hub::start().await;
    for (stream, consumer) in [
        ("HUB_WORK", "queue-q"),
        ("HUB_WORK", "worker-w1"),
        ("HUB_ANSWERS", "answers-w1"),
    ] {
        hub.bob_refused(
            &format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
            Some("_INBOX.bob.n"),
            r#"{"batch":1}"#,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_18_bob_cannot_subscribe_outside_his_reply_prefix_or_to_control() {
    let hub = Hub::start().await;
    for subject in [
        "_INBOX.>",
        "_INBOX.alice.>",
        "hub.ctl.>",
        "hub.ctl.w1.cancel",
    ] {
        hub.bob_refused_subscription(subject).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_19_a_worker_cannot_replay_a_stored_task_as_an_agents() {
    let hub = Hub::start().await;
    let (_, _) = alice_delegates(&hub).await;
    let work = "work.q";
    harness::wait_until_async("alice's task stored", support::DEADLINE, || async {
        support::count_on(&hub.admin, "HUB_WORK", work).await == 1
    })
    .await
    .unwrap();
    // w1 may pull its queue; it aims the delivery at bob's ingress (a pull's reply subject is
    // not checked), hoping the router stores the task again as bob's.
    let w1 = hub.rendered.connect("w1").await;
    w1.client
        .publish_with_reply(
            "$JS.API.CONSUMER.MSG.NEXT.HUB_WORK.queue-q",
            "hub.pub.bob.work.q",
            r#"{"batch":1}"#.into(),
        )
        .await
        .unwrap();
    w1.client.flush().await.unwrap();
    // The router takes the ingress in order: once a DM sent after the attempt is routed, the
    // replay (if the ingress captured it) was seen too.
    hub.send(&hub.alice, "alice", "bob", "m-after").await;
    hub.wait_inbox("bob", 1).await;
    let ops = hub.rendered.connect("ops").await;
    assert_eq!(
        support::count_on(&hub.admin, "HUB_WORK", work).await,
        1,
        "no second copy of the task"
    );
    assert_eq!(router_counters(&ops).await["malformed"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_alice_sends_attaches_reads_and_acks_her_own_inbox() {
    alice_reads_and_acks(Hub::start().await, 9).await;
}

/// nats-server 2.14+ can send ack subjects in a v2 form, `$JS.ACK.<domain>.<account hash>.
/// <stream>.<consumer>.…` (feature flag `js_ack_fc_v2`, the default from 2.16): both forms are
/// granted, so acks work either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_alice_acks_her_inbox_with_the_v2_ack_subjects_on() {
    let hub = Hub::start_with("feature_flags {\n  js_ack_fc_v2: true\n}").await;
    alice_reads_and_acks(hub, 11).await;
}

/// Alice's DM to bob is routed; she reads her own DM from bob (its ack subject has
/// `ack_tokens` tokens: 9 in the v1 form, 11 in v2) and acks it.
async fn alice_reads_and_acks(hub: Hub, ack_tokens: usize) {
    // Her DM to bob is routed.
    hub.send(&hub.alice, "alice", "bob", "m-to-bob").await;
    hub.wait_inbox("bob", 1).await;
    // She reads and acks her own DM.
    let js = jetstream::new(hub.alice.client.clone());
    let consumer: PullConsumer = js
        .get_consumer_from_stream("inbox-alice", "HUB_INBOX")
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let msg = batch.next().await.unwrap().unwrap();
    let env: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(env["meta"]["from"], "bob");
    let ack_subject = msg.reply.clone().unwrap().to_string();
    assert_eq!(ack_subject.split('.').count(), ack_tokens, "{ack_subject}");
    msg.double_ack().await.unwrap();
    let info = hub.alice_consumer().await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
    assert!(hub.alice.errors().is_empty(), "{:?}", hub.alice.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_20_a_worker_cannot_read_the_dms_waiting_in_the_ingress() {
    let hub = Hub::start().await;
    let w1 = hub.rendered.connect("w1").await;
    // A worker reads task channel messages still in the ingress (the last one of a task's,
    // subject-suffixed), never a DM: not by sequence, not by subject, in no form.
    for (subject, body) in [
        ("$JS.API.DIRECT.GET.HUB_INGRESS", r#"{"seq":1}"#),
        (
            "$JS.API.DIRECT.GET.HUB_INGRESS",
            r#"{"last_by_subj":"hub.pub.bob.inbox"}"#,
        ),
        ("$JS.API.DIRECT.GET.HUB_INGRESS.hub.pub.bob.inbox", ""),
        ("$JS.API.DIRECT.GET.HUB_INGRESS.hub.pub.>", ""),
        ("$JS.API.STREAM.MSG.GET.HUB_INGRESS", r#"{"seq":1}"#),
    ] {
        w1.client
            .publish_with_reply(subject, "_INBOX.w1.get", body.into())
            .await
            .unwrap();
        w1.refused(subject).await;
    }
    hub.alice_intact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_22_bob_cannot_read_alices_holds_and_alice_reads_her_own() {
    let hub = Hub::start().await;
    // Bob's inbox may hold one DM (the admin says so), and alice sends him two: the router
    // refuses the second and stores alice's hold on DMs to bob.
    let mut config = hub
        .admin
        .get_stream("HUB_INBOX")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.max_messages_per_subject = 1;
    hub.admin.update_stream(config).await.unwrap();
    hub.send(&hub.alice, "alice", "bob", "m1").await;
    hub.send(&hub.alice, "alice", "bob", "m2").await;
    let hold = "$JS.API.DIRECT.GET.KV_HUB_HOLDS.$KV.HUB_HOLDS.alice.to.bob";
    let read = || async {
        hub.alice
            .client
            .request(hold, "".into())
            .await
            .ok()
            .filter(|r| {
                r.headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Sequence"))
                    .is_some()
            })
    };
    harness::wait_until_async("alice's hold stored", support::DEADLINE, || async {
        read().await.is_some()
    })
    .await
    .unwrap();
    for (subject, body) in [
        (
            "$JS.API.DIRECT.GET.KV_HUB_HOLDS.$KV.HUB_HOLDS.alice.to.bob",
            "",
        ),
        (
            "$JS.API.DIRECT.GET.KV_HUB_HOLDS",
            r#"{"last_by_subj":"$KV.HUB_HOLDS.alice.to.bob"}"#,
        ),
        ("$KV.HUB_HOLDS.bob.to.alice", "{}"),
    ] {
        hub.bob_refused(subject, Some("_INBOX.bob.h"), body).await;
    }
    // Control: alice reads hers, a hold well in the future.
    let reply = read().await.expect("alice reads her hold");
    let hold: protocol::backpressure::Hold = serde_json::from_slice(&reply.payload).unwrap();
    assert!(
        hold.until_ms > protocol::expiry::now_ms() + 60_000,
        "{hold:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_23_bob_cannot_write_alices_presence_and_alice_writes_her_own() {
    let hub = Hub::start().await;
    let record = r#"{"state":"offline","at_ms":1,"beat_secs":20}"#;
    hub.bob_refused("$KV.HUB_PRESENCE.alice", Some("_INBOX.bob.p"), record)
        .await;
    // Control: alice beats her own, and anyone may read it (a receipt names it).
    let online = format!(
        r#"{{"state":"online","at_ms":{},"beat_secs":20}}"#,
        protocol::expiry::now_ms()
    );
    jetstream::new(hub.alice.client.clone())
        .publish("$KV.HUB_PRESENCE.alice", online.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let read = hub
        .bob
        .client
        .request(
            "$JS.API.DIRECT.GET.KV_HUB_PRESENCE.$KV.HUB_PRESENCE.alice",
            "".into(),
        )
        .await
        .unwrap();
    assert_eq!(std::str::from_utf8(&read.payload).unwrap(), online);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_26_bob_cannot_read_or_write_alices_idempotency_keys() {
    let hub = Hub::start().await;
    let entry = protocol::task::idempotency::entry_key(
        &support::agent("alice"),
        &protocol::QueueName::new("q").unwrap(),
        "k1",
    );
    let subject = format!("$KV.HUB_IDEMPOTENCY.{entry}");
    for (subject, body) in [
        (subject.clone(), r#"{"task_id":"t1"}"#),
        (
            format!("$JS.API.DIRECT.GET.KV_HUB_IDEMPOTENCY.{subject}"),
            "",
        ),
        (
            "$JS.API.DIRECT.GET.KV_HUB_IDEMPOTENCY".to_owned(),
            r#"{"last_by_subj":"$KV.HUB_IDEMPOTENCY.alice.>"}"#,
        ),
        ("$JS.API.STREAM.INFO.KV_HUB_IDEMPOTENCY".to_owned(), ""),
    ] {
        hub.bob_refused(&subject, Some("_INBOX.bob.i"), body).await;
    }
    assert_eq!(
        support::count_on(&hub.admin, "KV_HUB_IDEMPOTENCY", &subject).await,
        0
    );
}

/// Agents receive broadcasts on their own credentials (`runtime listen`), stamped by the
/// router with their sender; nobody publishes on a broadcast channel but the routers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_bob_receives_alices_broadcast_and_cannot_forge_one() {
    let hub = Hub::start().await;
    let mut listener = hub.rendered.spawn_as(
        "bob",
        &["listen", "--channel", "news", "--count", "1", "--json"],
    );
    harness::wait_until("bob listens", support::DEADLINE, || {
        listener.log().contains("listening on channel.news")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", listener.log()));
    let forged = r#"{"meta":{"id":"f","from":"alice"},"body":"forged"}"#;
    hub.bob_refused("channel.news", None, forged).await;
    jetstream::new(hub.alice.client.clone())
        .publish(
            "hub.pub.alice.news",
            r#"{"meta":{"id":"b1"},"body":"hello all"}"#.into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let code = listener.wait_exit(support::DEADLINE).await.unwrap();
    assert_eq!(code, Some(0), "{}", listener.log());
    let log = listener.log();
    let line = log
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no broadcast printed: {log}"));
    let envelope: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(envelope["meta"]["from"], "alice", "{line}");
    assert_eq!(envelope["body"], "hello all", "{line}");
}

/// The ingress dedupes `Nats-Msg-Id`s across every identity. Were alice's ids ones bob can
/// guess (`alice:<meta.id>`, `alice:task:<task id>`, both chosen by alice and seen by those
/// she writes to), bob could publish first under them on his own ingress: alice's DM and task
/// would then be acked as duplicates and dropped. Every ingress id ends with a part only its
/// publishing process can compute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_27_bob_cannot_pre_empt_alices_dm_or_task_by_guessing_its_msg_id() {
    let hub = Hub::start().await;
    let bob_ingress =
        protocol::subjects::ingress(&support::agent("bob"), &protocol::Channel::Inbox);
    for (n, guessed) in ["alice:m-27", "alice:task:t-27"].into_iter().enumerate() {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", guessed);
        let decoy =
            serde_json::json!({"meta": {"id": format!("decoy-{n}"), "to": "bob"}, "body": "x"});
        let ack = jetstream::new(hub.bob.client.clone())
            .publish_with_headers(bob_ingress.clone(), headers, decoy.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(!ack.duplicate);
    }
    hub.wait_inbox("bob", 2).await;

    let alice = runtime::ActorSystem::builder()
        .nats(hub.rendered.settings("alice"))
        .durable(true)
        .build()
        .await
        .unwrap();
    let from = support::agent("alice");
    let mut meta = protocol::Meta::new(protocol::MessageId::new("m-27").unwrap());
    meta.to = Some(support::agent("bob"));
    let dm = protocol::Envelope {
        meta,
        body: serde_json::json!("from alice"),
        extra: Default::default(),
    };
    let receipt = alice
        .send_envelope(&from, &protocol::Channel::Inbox, &dm)
        .await
        .unwrap();
    assert!(
        !receipt.duplicate,
        "alice's DM was taken for bob's: {receipt:?}"
    );
    hub.wait_inbox("bob", 3).await;

    let queue = protocol::QueueName::new("q").unwrap();
    let mut spec = runtime::system::tasks::new_task("alice's task", vec![]);
    spec.task_id = protocol::TaskId::new("t-27").unwrap();
    alice.delegate(&from, &queue, None, &spec).await.unwrap();
    let work = protocol::subjects::work(&queue, None);
    harness::wait_until_async("alice's task stored", support::DEADLINE, || async {
        support::count_on(&hub.admin, "HUB_WORK", &work).await == 1
    })
    .await
    .unwrap();
}
