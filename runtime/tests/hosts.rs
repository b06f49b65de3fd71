//! A host of many agents on a secured hub (issue 28, A3): the host `gw` of the identities file
//! acts for 1,000 agents over its one connection, on the config `runtime render-config` writes
//! and its own rendered credentials. Each of its inboxes attaches, each DM reaches its own
//! agent once (checked once every inbox consumer has nothing pending and nothing unacked, so
//! no redelivery can come later), and the host can do nothing as an agent it does not list.
//!
//! Alone in its test binary: RSS is the whole process's.

mod support;

use std::time::Duration;

use async_nats::jetstream;
use protocol::attach::DurableInboxMode;
use protocol::{AgentId, Envelope, MessageId, Meta};
use runtime::ActorSystem;
use support::rendered::Rendered;

const AGENTS: usize = 1_000;
const DEADLINE: Duration = Duration::from_secs(120);
/// RSS per idle inbox this test allows, kB: the bound of `many_inboxes.rs` on the open broker
/// (a debug build there measured 6 kB).
const RSS_PER_INBOX_KB: u64 = 10;

fn hosted(i: usize) -> AgentId {
    AgentId::new(format!("h{i:04}")).unwrap()
}

fn identities() -> String {
    let agents: Vec<String> = (0..AGENTS).map(|i| hosted(i).to_string()).collect();
    serde_json::json!({
        "agents": ["bob"],
        "hosts": [{"id": "gw", "agents": agents}],
        "routers": 1,
        "admins": ["ops"],
    })
    .to_string()
}

/// DM `n` to agent `i`: its body is `n`.
fn dm(n: u64, i: usize) -> Vec<u8> {
    let mut meta = Meta::new(MessageId::new(format!("dm-{n}")).unwrap());
    meta.to = Some(hosted(i));
    let envelope = Envelope {
        meta,
        body: serde_json::json!(n),
        extra: Default::default(),
    };
    protocol::encode(&envelope, protocol::Codec::Json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_attaches_a_thousand_inboxes_on_the_rendered_config_and_acts_for_no_one_else() {
    let rendered = Rendered::start(&identities(), &["--durable"]).await;
    let router = rendered.router();
    let ops = rendered.connect("ops").await;
    let admin = jetstream::new(ops.client.clone());
    harness::wait_until_async("the router's streams", DEADLINE, || async {
        admin.get_stream("HUB_INBOX").await.is_ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", router.log()));

    let host = ActorSystem::builder()
        .nats(rendered.settings("gw"))
        .durable(true)
        .inbox_mode(DurableInboxMode::On)
        .build()
        .await
        .unwrap();
    let (seen, per_inbox) = support::many::attach_counting(&host, AGENTS, hosted).await;
    println!("RSS per idle inbox of a host on the rendered config: {per_inbox} kB (bound {RSS_PER_INBOX_KB} kB)");
    assert!(
        per_inbox <= RSS_PER_INBOX_KB,
        "an idle inbox costs {per_inbox} kB of RSS, above the bound of {RSS_PER_INBOX_KB} kB"
    );

    // Bob sends one DM to each hosted agent, on his own credentials.
    let bob = rendered.connect("bob").await;
    let js = jetstream::new(bob.client.clone());
    let messages = (0..AGENTS).map(|n| {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            protocol::headers::NATS_MSG_ID,
            format!("bob:dm-{n}").as_str(),
        );
        (headers, dm(n as u64, n))
    });
    support::publish_pipelined(&js, "hub.pub.bob.inbox", messages).await;
    harness::wait_until("every DM handled", DEADLINE, || {
        seen.lock().unwrap().len() >= AGENTS
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {} of {AGENTS}", seen.lock().unwrap().len()));
    // Every inbox consumer settled (nothing pending, nothing unacked): no DM can come again.
    for i in 0..AGENTS {
        support::wait_settled(&admin, &format!("inbox-{}", hosted(i))).await;
    }
    let seen = seen.lock().unwrap().clone();
    for n in 0..AGENTS {
        assert_eq!(
            seen.get(&(n, n as u64)),
            Some(&1),
            "{} handled its DM once",
            hosted(n)
        );
    }
    assert_eq!(seen.len(), AGENTS, "no inbox saw another's DM");

    // The host acts for no one else: not as bob, not as a name of its own.
    let gw = rendered.connect("gw").await;
    for (subject, body) in [
        (
            "hub.pub.bob.inbox",
            r#"{"meta":{"id":"x","to":"h0000"},"body":1}"#,
        ),
        ("hub.delivery.bob.inbox", "{}"),
        (
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            r#"{"batch":1}"#,
        ),
        ("$KV.HUB_PRESENCE.bob", "{}"),
        (
            "hub.pub.gw.inbox",
            r#"{"meta":{"id":"y","to":"h0000"},"body":1}"#,
        ),
    ] {
        gw.client
            .publish_with_reply(subject, "_INBOX.gw.x", body.into())
            .await
            .unwrap();
        gw.refused(subject).await;
    }
    // The broker refuses its attach request: the inbox never binds, and the attach gives up
    // after its deadline (30 s).
    let refused = tokio::time::timeout(
        DEADLINE,
        host.attach_inbox(&AgentId::new("bob").unwrap(), |_| Box::pin(async {})),
    )
    .await
    .expect("the attach of bob ends");
    assert!(
        matches!(refused, Err(runtime::SystemError::Timeout { .. })),
        "gw attached bob's inbox: {refused:?}"
    );
    host.shutdown(Duration::from_secs(30)).await.unwrap();
}
