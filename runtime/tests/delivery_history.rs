//! An inbox's cap counts what its agent has not read (issue 28, B5): the routers trim what the
//! inboxes have read (`actors::history`), against a real nats-server. An agent that reads
//! everything keeps taking DMs past its cap; a DM its handler rejected is dead-lettered before
//! the history it sits in is trimmed.

mod support;

use std::time::Duration;

use actors::fault::{self, Fault, FaultPoint};
use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::subjects::{self, Channel};
use protocol::AgentId;
use runtime::{ActorSystem, Handled};

/// The cap of every inbox in these tests.
const CAP: i64 = 3;

/// A hub whose inboxes are capped at [`CAP`] and trimmed every `trim_interval_secs`, what they
/// read being kept for the dedupe `duplicate_window_secs` (and the 5 s clock margin).
async fn hub_with(
    server: &harness::NatsServer,
    trim_interval_secs: i64,
    duplicate_window_secs: u64,
) -> ActorSystem {
    let mut delivery = DeliveryConfig {
        duplicate_window_secs,
        ..support::delivery()
    };
    delivery.inbox.max_msgs_per_subject = CAP;
    delivery.inbox.trim_interval_secs = trim_interval_secs;
    let hub = support::system_with(server.url(), true, DurableInboxMode::On, delivery).await;
    hub.start_router().await.unwrap();
    hub
}

/// Rounds every second; what was read is trimmed once 6 s old.
async fn hub(server: &harness::NatsServer) -> ActorSystem {
    hub_with(server, 1, 1).await
}

async fn send(hub: &ActorSystem, from: &AgentId, to: &AgentId, id: &str) {
    hub.send_envelope(from, &Channel::Inbox, &support::dm(to, id))
        .await
        .unwrap();
}

/// Waits until `to`'s inbox subject holds `n` DMs.
async fn wait_stored(js: &async_nats::jetstream::Context, to: &AgentId, n: usize) {
    let subject = subjects::inbox(to);
    harness::wait_until_async(
        &format!("{n} DMs on {subject}"),
        support::DEADLINE,
        || async { support::count_on(js, "HUB_INBOX", &subject).await == n },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_reads_everything_takes_dms_past_its_inbox_cap() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let js = support::js(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let bobs = support::attach_collect(&hub, &bob).await;
    let mut sent = Vec::new();
    // Three times the cap, a cap's worth at a time: each round is read, then trimmed.
    for round in 0..3 {
        for n in 0..CAP {
            let id = format!("r{round}-{n}");
            send(&hub, &alice, &bob, &id).await;
            sent.push(serde_json::json!(id));
        }
        support::wait_for(&bobs, sent.len()).await;
        support::wait_settled(&js, "inbox-bob").await;
        wait_stored(&js, &bob, 0).await;
    }
    assert_eq!(support::bodies(&bobs), sent);
    assert!(
        alices.lock().unwrap().is_empty(),
        "no refusal: {:?}",
        support::bodies(&alices)
    );
    let counters = support::wait_router(&hub, "every DM stored", |c| c.stored == 9).await;
    assert_eq!(counters.refused_full, 0);
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Bob's handler rejects `m-bad`, which the broker terminates (bob's ack floor passes it), and
/// the expiry actor fails to copy it ten times, 2 s apart: its advisory stays unacked for about
/// 20 s, past the first rounds that could trim it (1 s window, 5 s margin, 5 s settling). The round waits for the advisories consumer, so the DM is still
/// there to be copied, and only then is it trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_dm_is_dead_lettered_before_the_history_it_sits_in_is_trimmed() {
    let server = harness::run_server().await.unwrap();
    let hub = hub(&server).await;
    let js = support::js(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let _alices = support::attach_collect(&hub, &alice).await;
    fault::arm(&hub.expiry_name(), FaultPoint::DeadLetter, Fault::Error, 10);
    hub.attach_inbox(&bob, |d| {
        let rejected = d.envelope.meta.id.as_str() == "m-bad";
        async move {
            if rejected {
                Handled::Reject("not wanted".into())
            } else {
                Handled::Done
            }
        }
    })
    .await
    .unwrap();
    for id in ["m-bad", "m-2", "m-3"] {
        send(&hub, &alice, &bob, id).await;
    }
    support::wait_settled(&js, "inbox-bob").await;
    let dlq = format!("dlq.{bob}");
    // Ten failed copies 2 s apart, then the copy.
    let copied = Duration::from_secs(60);
    harness::wait_until_async("m-bad dead-lettered", copied, || async {
        support::count_on(&js, "HUB_DLQ", &dlq).await == 1
    })
    .await
    .unwrap();
    assert_eq!(
        fault::remaining(&hub.expiry_name(), FaultPoint::DeadLetter),
        0
    );
    let copy = &support::stored_on(&js, "HUB_DLQ", &dlq).await[0];
    let env = protocol::decode(&copy.payload, protocol::Codec::Json).unwrap();
    assert_eq!(env.meta.id.as_str(), "m-bad");
    wait_stored(&js, &bob, 0).await;
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Bob read his three DMs, and the next round is a minute away: alice's fourth DM is refused
/// `inbox_full`, told to retry once what bob read is out of the duplicate window and trimmed
/// (6 s, then a round), not when bob's oldest DM ages out of the stream (a week by default);
/// the refusal asks for that round, which trims what bob read, and the DM sent again is
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_refused_by_an_inbox_full_of_read_dms_is_delivered_when_sent_again_after_its_retry_after(
) {
    let server = harness::run_server().await.unwrap();
    let hub = hub_with(&server, 60, 1).await;
    let js = support::js(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let alices = support::attach_collect(&hub, &alice).await;
    let bobs = support::attach_collect(&hub, &bob).await;
    for id in ["m1", "m2", "m3"] {
        send(&hub, &alice, &bob, id).await;
    }
    support::wait_for(&bobs, 3).await;
    support::wait_settled(&js, "inbox-bob").await;
    let asked = tokio::time::Instant::now();
    send(&hub, &alice, &bob, "m4").await;
    support::wait_for(&alices, 1).await;
    let refused = protocol::rejection::parse_rejection(&alices.lock().unwrap()[0].envelope)
        .expect("a refusal");
    assert_eq!(refused.error.kind, protocol::WireErrorKind::InboxFull);
    assert_eq!(refused.rejected_id.as_ref().unwrap().as_str(), "m4");
    let retry_after = refused.retry_after_secs.expect("a retry-after");
    // m1, stored a moment ago, is out of the window and the margin within 6 s; then two rounds
    // at most (5 s of settling each) and a second.
    assert!(
        (11..=17).contains(&retry_after),
        "retry after {retry_after} s"
    );
    // Trimmed within the retry-after, long before the minute's round.
    wait_stored(&js, &bob, 0).await;
    assert!(asked.elapsed() < Duration::from_secs(retry_after));
    let mut again = support::dm(&bob, "m4");
    again.meta.id = protocol::MessageId::new("m4-again").unwrap();
    // Alice's system holds her DMs to bob until the retry-after is over; then it is sent.
    harness::wait_until_async("alice's hold over", support::DEADLINE, || async {
        match hub.send_envelope(&alice, &Channel::Inbox, &again).await {
            Ok(_) => true,
            Err(runtime::SystemError::Held { .. }) => false,
            Err(e) => panic!("{e}"),
        }
    })
    .await
    .unwrap();
    assert!(asked.elapsed() >= Duration::from_secs(retry_after - 1));
    support::wait_for(&bobs, 4).await;
    assert_eq!(support::bodies(&bobs)[3], serde_json::json!("m4"));
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// The broker rebuilds its dedupe ids from what it stores within the duplicate window when it
/// restarts, so what an inbox read within the window is kept: bob read his three DMs, rounds
/// ran, the broker restarted, and a router's retry of alice's first DM (its stored id) is still
/// a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_inbox_read_within_the_duplicate_window_still_dedupes_a_retry_after_a_broker_restart(
) {
    let mut server = harness::run_server().await.unwrap();
    let hub = hub_with(&server, 1, 60).await;
    let js = support::js(&server).await;
    let (alice, bob) = (support::agent("alice"), support::agent("bob"));
    let bobs = support::attach_collect(&hub, &bob).await;
    for id in ["m1", "m2", "m3"] {
        send(&hub, &alice, &bob, id).await;
    }
    support::wait_for(&bobs, 3).await;
    support::wait_settled(&js, "inbox-bob").await;
    let start = hub
        .history_snapshot()
        .await
        .expect("a history actor")
        .rounds;
    // Two whole rounds after bob read them (each settles 5 s before it purges).
    harness::wait_until_async("three more rounds", support::DEADLINE, || async {
        hub.history_snapshot()
            .await
            .is_some_and(|s| s.rounds >= start + 3)
    })
    .await
    .unwrap();
    wait_stored(&js, &bob, 3).await;
    server.restart().await.unwrap();
    let js = support::js(&server).await;
    let retry = protocol::encode(&support::dm(&bob, "m1"), protocol::Codec::Json).unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        protocol::headers::NATS_MSG_ID,
        subjects::router_msg_id(&alice, &protocol::MessageId::new("m1").unwrap()).as_str(),
    );
    let ack = js
        .publish_with_headers(subjects::inbox(&bob), headers, retry.into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(ack.duplicate, "{ack:?}");
    assert_eq!(
        support::count_on(&js, "HUB_INBOX", &subjects::inbox(&bob)).await,
        3
    );
    hub.shutdown(Duration::from_secs(10)).await.unwrap();
}
