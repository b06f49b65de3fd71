//! Writes by reply subject (issue 28, A1; docs/SECURITY.md, "Who writes each stream"): a
//! publish's or an API request's reply subject is not permission-checked, and the broker
//! sends its publish ack or API reply there. On the rendered config every agent and worker
//! lives in an account of its own and reaches the hub's account only through imports, whose
//! replies the broker maps back into the requester's account: whatever bob aims a reply at,
//! nothing is stored in the hub's streams, and nothing of alice's changes.
//!
//! Each attack uses a carrier bob (or worker w1) is allowed: a presence beat, a DM to
//! himself, his own consumer's info, a direct get of his own presence key, a worker's ingress.

mod support;

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use support::attack_hub::{attach, router_counters, Hub};
use support::rendered::Connected;

/// Where bob aims the replies: (stream, subject). Each belongs to alice or to the system.
const TARGETS: &[(&str, &str)] = &[
    ("KV_HUB_REMOVED", "$KV.HUB_REMOVED.alice"),
    ("HUB_INBOX", "channel.inbox.alice"),
    ("HUB_INGRESS", "hub.pub.alice.inbox"),
    (
        "KV_HUB_IDEMPOTENCY",
        "$KV.HUB_IDEMPOTENCY.alice.q.00112233445566778899aabbccddeeff",
    ),
    ("HUB_WORK", "work.q"),
    ("HUB_ANSWERS", "answer.w1"),
    (
        "HUB_TASKS",
        "channel.task.alice.0123456789abcdef0123456789abcdef",
    ),
    ("HUB_DLQ", "dlq.alice"),
    ("KV_HUB_PRESENCE", "$KV.HUB_PRESENCE.alice"),
    ("KV_HUB_HOLDS", "$KV.HUB_HOLDS.alice.to.bob"),
];

/// A request an identity may make that makes the broker send something to its reply subject.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    /// A presence beat on its own key (a publish ack).
    PresenceBeat,
    /// A DM to itself through its ingress (a publish ack).
    DmToSelf,
    /// Its own inbox consumer's info (an API reply).
    ConsumerInfo,
    /// A direct get of its own presence key (the stored record, with its headers).
    PresenceGet,
}

const CARRIERS: [Carrier; 4] = [
    Carrier::PresenceBeat,
    Carrier::DmToSelf,
    Carrier::ConsumerInfo,
    Carrier::PresenceGet,
];

impl Carrier {
    /// Sends it as `me` on `who`, the broker's answer aimed at `reply`.
    async fn send(self, who: &Connected, me: &str, reply: &str) {
        let (subject, body) = match self {
            Carrier::PresenceBeat => (
                format!("$KV.HUB_PRESENCE.{me}"),
                format!(
                    r#"{{"state":"online","at_ms":{},"beat_secs":20}}"#,
                    protocol::expiry::now_ms()
                ),
            ),
            Carrier::DmToSelf => (
                format!("hub.pub.{me}.inbox"),
                format!(
                    r#"{{"meta":{{"id":"self-{}","to":"{me}"}},"body":"x"}}"#,
                    nuid()
                ),
            ),
            Carrier::ConsumerInfo => (
                format!("$JS.API.CONSUMER.INFO.HUB_INBOX.inbox-{me}"),
                String::new(),
            ),
            Carrier::PresenceGet => (
                format!("$JS.API.DIRECT.GET.KV_HUB_PRESENCE.$KV.HUB_PRESENCE.{me}"),
                String::new(),
            ),
        };
        who.client
            .publish_with_reply(subject, reply.to_owned(), body.into())
            .await
            .unwrap();
    }

    /// Sends it with a reply to `me`'s own prefix and waits for the answer: the broker has
    /// answered every carrier sent before it on this connection.
    async fn answered(self, who: &Connected, me: &str) {
        let reply = format!("_INBOX.{me}.control.{}", nuid());
        let mut sub = who.client.subscribe(reply.clone()).await.unwrap();
        who.client.flush().await.unwrap();
        self.send(who, me, &reply).await;
        tokio::time::timeout(support::DEADLINE, sub.next())
            .await
            .unwrap_or_else(|_| panic!("{self:?} aimed at {me}'s own prefix got no answer"))
            .unwrap();
    }
}

/// A token unique within this test process.
fn nuid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("n{}", N.fetch_add(1, Ordering::Relaxed))
}

/// How many messages each target's stream holds on its subject.
async fn stored(hub: &Hub) -> Vec<usize> {
    let mut out = Vec::new();
    for (stream, subject) in TARGETS {
        out.push(support::count_on(&hub.admin, stream, subject).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_24_no_reply_subject_stores_anything_in_another_identitys_or_the_systems_streams() {
    let hub = Hub::start().await;
    // Bob attaches (his consumer's info is his to read) and beats once (his presence key is
    // his to read); alice beats too, so that her presence record is there to overwrite.
    attach(&hub.bob, "bob").await;
    Carrier::PresenceBeat.answered(&hub.bob, "bob").await;
    Carrier::PresenceBeat.answered(&hub.alice, "alice").await;
    let w1 = hub.rendered.connect("w1").await;
    let before = stored(&hub).await;
    let alice_presence = presence_of(&hub, "alice").await;

    for (_, target) in TARGETS {
        for carrier in CARRIERS {
            carrier.send(&hub.bob, "bob", target).await;
        }
        // A worker's ingress is a carrier too.
        w1.client
            .publish_with_reply(
                "hub.pub.w1.inbox",
                target.to_string(),
                r#"{"meta":{"id":"w-self","to":"w1"},"body":"x"}"#.into(),
            )
            .await
            .unwrap();
    }
    // Every carrier answered once more, on the senders' own prefixes: the broker sent every
    // answer aimed above before these.
    for carrier in CARRIERS {
        carrier.answered(&hub.bob, "bob").await;
    }
    let w1_reply = format!("_INBOX.w1.control.{}", nuid());
    let mut w1_sub = w1.client.subscribe(w1_reply.clone()).await.unwrap();
    w1.client
        .publish_with_reply(
            "hub.pub.w1.inbox",
            w1_reply,
            r#"{"meta":{"id":"w-self-2","to":"w1"},"body":"x"}"#.into(),
        )
        .await
        .unwrap();
    tokio::time::timeout(support::DEADLINE, w1_sub.next())
        .await
        .expect("w1's own publish ack")
        .unwrap();
    // The router takes the ingress in order: a DM bob sends alice now is taken (stored, or
    // refused for a tombstone or a full inbox) after anything stored as alice's before it.
    let ops = hub.rendered.connect("ops").await;
    let taken = |c: &serde_json::Value| {
        [
            "stored",
            "refused_deleted",
            "refused_full",
            "malformed",
            "dropped_by_guard",
        ]
        .iter()
        .map(|k| c[k].as_u64().unwrap_or(0))
        .sum::<u64>()
    };
    let taken_before = taken(&router_counters(&ops).await);
    hub.send(&hub.bob, "bob", "alice", "m-after").await;
    harness::wait_until_async("bob's DM taken", support::DEADLINE, || async {
        taken(&router_counters(&ops).await) > taken_before
    })
    .await
    .unwrap();

    let after = stored(&hub).await;
    // Bob's DM to alice is the one message her inbox gained.
    let mut before = before;
    before[1] += 1;
    let written: Vec<String> = TARGETS
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a != b)
        .map(|((stream, subject), (b, a))| format!("{stream} {subject}: {b} -> {a}"))
        .collect();
    assert!(written.is_empty(), "replies stored: {written:#?}");
    // Alice is as she was: her DMs (bob's two, nothing else), her presence, no tombstone, no
    // notice, nothing in the router's trail as hers.
    assert_eq!(presence_of(&hub, "alice").await, alice_presence);
    let counters = router_counters(&ops).await;
    assert_eq!(counters["malformed"], 0, "{counters}");
    assert_eq!(counters["dropped_by_guard"], 0, "{counters}");
    assert_eq!(counters["refused_deleted"], 0, "{counters}");
    assert_eq!(counters["refused_full"], 0, "{counters}");
    let reply = attach(&hub.alice, "alice").await;
    assert!(reply.contains("inbox-alice"), "alice attaches: {reply}");
    let info = hub.alice_consumer().await;
    assert_eq!(info.num_pending, 2, "bob's two DMs, nothing else: {info:?}");
}

/// The last presence record of `who`, as the admin reads it.
async fn presence_of(hub: &Hub, who: &str) -> Option<Vec<u8>> {
    let stream = hub.admin.get_stream("KV_HUB_PRESENCE").await.unwrap();
    stream
        .get_last_raw_message_by_subject(&format!("$KV.HUB_PRESENCE.{who}"))
        .await
        .ok()
        .map(|m| m.payload.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_25_bob_cannot_roll_up_the_presence_bucket() {
    let hub = Hub::start().await;
    Carrier::PresenceBeat.answered(&hub.alice, "alice").await;
    let alice_presence = presence_of(&hub, "alice").await;
    assert!(alice_presence.is_some());
    // Bob beats his own key with a rollup of the whole bucket: the broker would purge every
    // other agent's record.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Rollup", "all");
    let ack = jetstream::new(hub.bob.client.clone())
        .publish_with_headers(
            "$KV.HUB_PRESENCE.bob",
            headers,
            r#"{"state":"online","at_ms":1,"beat_secs":20}"#.into(),
        )
        .await
        .unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), ack)
        .await
        .expect("the broker answers the rollup");
    assert!(refused.is_err(), "the rollup was stored: {refused:?}");
    assert_eq!(presence_of(&hub, "alice").await, alice_presence);
}
