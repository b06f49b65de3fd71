//! The router's guards: replayed stored messages are dropped, malformed input is refused with a
//! notice to its sender, and neither stops the routing of what follows.

mod support;

use async_nats::jetstream;
use futures::StreamExt;
use protocol::rejection::parse_rejection;
use protocol::{subjects, WireErrorKind};
use serde_json::json;
use support::*;

/// An attacker asks JetStream for carol's last stored DM with the reply aimed at bob's ingress
/// subject: the ingress stream captures the reply (a replay of a stored message under bob's
/// identity), and the router drops it instead of storing it as a DM from bob.
#[tokio::test]
async fn direct_get_reply_aimed_at_another_identitys_ingress_is_dropped_and_counted() {
    let server = harness::run_server().await.unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob, carol) = (agent("alice"), agent("bob"), agent("carol"));
    system
        .send(&alice, &carol, json!("for carol only"))
        .await
        .unwrap();
    wait_router(&system, "the DM stored", |c| c.stored >= 1).await;
    let js = js(&server).await;
    assert_eq!(count_on(&js, "HUB_INBOX", "channel.inbox.carol").await, 1);

    let attacker = server.client().await.unwrap();
    let bob_ingress = subjects::ingress(&bob, &subjects::Channel::Inbox);
    // Watch the reply go by, to show what the ingress captured.
    let mut watch = attacker.subscribe(bob_ingress.clone()).await.unwrap();
    attacker.flush().await.unwrap();
    attacker
        .publish_with_reply(
            "$JS.API.DIRECT.GET.HUB_INBOX",
            bob_ingress.clone(),
            r#"{"last_by_subj":"channel.inbox.carol"}"#.into(),
        )
        .await
        .unwrap();
    attacker.flush().await.unwrap();
    let replay = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("the direct get answers on bob's ingress subject")
        .unwrap();
    let replay_headers = replay.headers.clone().unwrap_or_default();
    assert_eq!(
        replay_headers
            .get(protocol::headers::NATS_SUBJECT)
            .map(|v| v.as_str()),
        Some("channel.inbox.carol"),
        "the reply is carol's stored DM"
    );

    // The positive control is the counter itself: the router did see the replay.
    let counters = wait_router(&system, "the replay dropped", |c| c.dropped_by_guard >= 1).await;
    assert_eq!(counters.dropped_by_guard, 1);
    assert_eq!(counters.stored, 1, "nothing stored for the replay");
    assert_eq!(counters.malformed, 0, "a dropped replay is not a rejection");
    assert_eq!(counters.rejections_sent, 0);
    // Nothing waits in the ingress: the replay was terminated, not left for redelivery.
    let (pending, unacked) = consumer_backlog(&js, "HUB_INGRESS", "router").await;
    assert_eq!((pending, unacked), (0, 0));

    assert_eq!(count_on(&js, "HUB_INBOX", "channel.inbox.carol").await, 1);
    let stored = stored_on(&js, "HUB_INBOX", "channel.inbox.>").await;
    assert_eq!(stored.len(), 1, "only alice's DM is stored anywhere");
    let env = protocol::decode(&stored[0].payload, protocol::Codec::Json).unwrap();
    assert_eq!(env.meta.from.as_ref(), Some(&alice));
    assert!(stored.iter().all(|m| {
        let env = protocol::decode(&m.payload, protocol::Codec::Json).unwrap();
        env.meta.from.as_ref() != Some(&bob)
    }));
    system.shutdown(GRACE).await.unwrap();
}

/// Garbage, a missing `meta.id`, an invalid recipient and an oversize envelope are each refused
/// with a rejection notice in the sender's inbox, in order; the good DM that follows them is
/// routed as usual.
#[tokio::test]
async fn malformed_input_is_reported_to_the_sender_and_the_next_message_is_still_routed() {
    let server = harness::NatsServer::run(harness::ServerOptions {
        extra_config: "max_payload: 2MB".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let system = durable_system(server.url()).await;
    system.start_router().await.unwrap();
    let (alice, bob) = (agent("alice"), agent("bob"));
    let alice_seen = attach_collect(&system, &alice).await;
    let bob_seen = attach_collect(&system, &bob).await;

    let client = server.client().await.unwrap();
    client.flush().await.unwrap();
    assert!(client.server_info().max_payload >= 2 * 1024 * 1024);
    let js = jetstream::new(client);
    let ingress = subjects::ingress(&alice, &subjects::Channel::Inbox);
    let oversize = serde_json::to_vec(&json!({
        "meta": {"id": "m-big", "to": "bob"},
        "body": "x".repeat(1536 * 1024),
    }))
    .unwrap();
    assert!(oversize.len() > protocol::MAX_ENVELOPE_BYTES);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\xffnot an envelope".to_vec()),
        ("no-id", br#"{"meta":{"to":"bob"},"body":"no id"}"#.to_vec()),
        (
            "bad-to",
            br#"{"meta":{"id":"m-bad-to","to":"bo.b"},"body":"bad recipient"}"#.to_vec(),
        ),
        ("oversize", oversize),
        (
            "good",
            br#"{"meta":{"id":"m-good","to":"bob"},"body":"good"}"#.to_vec(),
        ),
    ];
    for (msg_id, payload) in inputs {
        let (_, duplicate) = js_publish(&js, &ingress, msg_id, payload).await;
        assert!(!duplicate);
    }

    wait_for(&bob_seen, 1).await;
    wait_for(&alice_seen, 4).await;
    let counters = wait_router(&system, "all five handled", |c| {
        c.stored >= 1 && c.rejections_sent >= 4
    })
    .await;
    assert_eq!(counters.malformed, 4);
    assert_eq!(counters.rejections_sent, 4);
    assert_eq!(counters.stored, 1);

    let notices: Vec<_> = alice_seen
        .lock()
        .unwrap()
        .iter()
        .map(|d| parse_rejection(&d.envelope).expect("a rejection notice"))
        .collect();
    let kinds: Vec<WireErrorKind> = notices.iter().map(|r| r.error.kind).collect();
    assert_eq!(
        kinds,
        vec![
            WireErrorKind::Malformed,
            WireErrorKind::MissingField,
            WireErrorKind::InvalidRecipient,
            WireErrorKind::TooLarge,
        ]
    );
    let rejected: Vec<Option<&str>> = notices
        .iter()
        .map(|r| r.rejected_id.as_ref().map(|id| id.as_str()))
        .collect();
    assert_eq!(rejected, vec![None, None, Some("m-bad-to"), None]);
    let seqs: Vec<u64> = notices.iter().map(|r| r.ingress_seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in ingress order: {seqs:?}"
    );

    // Bob got the good DM and nothing else: a DM sent afterwards is the next thing he sees.
    system.send(&alice, &bob, json!("sentinel")).await.unwrap();
    wait_for(&bob_seen, 2).await;
    assert_eq!(bodies(&bob_seen), vec![json!("good"), json!("sentinel")]);
    assert_eq!(
        alice_seen.lock().unwrap().len(),
        4,
        "one notice per refused input"
    );
    system.shutdown(GRACE).await.unwrap();
}
