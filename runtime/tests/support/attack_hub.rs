//! The hub the attack suites (`attacks.rs`, `attacks_tasks.rs`) run against: a real
//! nats-server on the config `runtime render-config` writes, a real router process on its own
//! rendered credentials, an admin's view, and agents alice and bob, each connected with their
//! own rendered credentials.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use harness::RuntimeProcess;

use super::rendered::{Connected, Rendered};

pub const IDENTITIES: &str = r#"{
  "agents": ["alice", "bob"],
  "workers": [{"id": "w1", "queues": ["q"]}],
  "routers": 1,
  "admins": ["ops"]
}"#;

/// `who`'s attach request, answered (retried while the router's attach service starts).
pub async fn attach(who: &Connected, id: &str) -> String {
    let deadline = tokio::time::Instant::now() + super::DEADLINE;
    loop {
        match who
            .client
            .request(format!("hub.delivery.{id}.inbox"), "{}".into())
            .await
        {
            Ok(reply) => return String::from_utf8_lossy(&reply.payload).into_owned(),
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "{id}'s attach: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The hub under attack: the rendered server, its router, an admin's view, and alice with one
/// DM from bob waiting in her inbox (consumer `inbox-alice`, made by her attach).
pub struct Hub {
    pub rendered: Rendered,
    pub _router: RuntimeProcess,
    pub admin: jetstream::Context,
    pub alice: Connected,
    pub bob: Connected,
}

impl Hub {
    pub async fn start() -> Hub {
        Self::start_with("").await
    }

    /// [`start`](Self::start) on a config with `extra` appended.
    pub async fn start_with(extra: &str) -> Hub {
        let rendered = Rendered::start_with(IDENTITIES, &["--durable"], extra).await;
        let router = rendered.router();
        let admin = jetstream::new(rendered.connect("ops").await.client);
        harness::wait_until_async("the router's streams", super::DEADLINE, || async {
            admin.get_stream("HUB_INBOX").await.is_ok()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", router.log()));
        let alice = rendered.connect("alice").await;
        let bob = rendered.connect("bob").await;
        let hub = Hub {
            rendered,
            _router: router,
            admin,
            alice,
            bob,
        };
        // Alice attaches (the router makes inbox-alice) and bob sends her a DM.
        let reply = attach(&hub.alice, "alice").await;
        assert!(reply.contains("inbox-alice"), "{reply}");
        hub.send(&hub.bob, "bob", "alice", "m-for-alice").await;
        hub.wait_inbox("alice", 1).await;
        hub
    }

    /// `from` sends a DM to `to` through its ingress, awaiting the stream ack.
    pub async fn send(&self, from: &Connected, as_id: &str, to: &str, id: &str) {
        super::send_dm(&from.client, as_id, to, id).await;
    }

    pub async fn inbox_count(&self, id: &str) -> usize {
        super::count_on(&self.admin, "HUB_INBOX", &format!("channel.inbox.{id}")).await
    }

    pub async fn wait_inbox(&self, id: &str, n: usize) {
        harness::wait_until_async("the inbox count", super::DEADLINE, || async {
            self.inbox_count(id).await == n
        })
        .await
        .unwrap();
    }

    /// Alice's inbox consumer, as the admin sees it.
    pub async fn alice_consumer(&self) -> async_nats::jetstream::consumer::Info {
        let stream = self.admin.get_stream("HUB_INBOX").await.unwrap();
        let mut consumer: PullConsumer = stream.get_consumer("inbox-alice").await.unwrap();
        consumer.info().await.unwrap().clone()
    }

    /// Alice's data is as it was: one DM in her inbox, not delivered to anyone.
    pub async fn alice_intact(&self) {
        assert_eq!(self.inbox_count("alice").await, 1, "alice's inbox");
        let info = self.alice_consumer().await;
        assert_eq!(info.num_pending, 1, "{info:?}");
        assert_eq!(
            info.delivered.stream_sequence, 0,
            "nothing delivered: {info:?}"
        );
    }

    /// Bob publishes `payload` to `subject` (with `reply`): the broker refuses it.
    pub async fn bob_refused(&self, subject: &str, reply: Option<&str>, payload: &str) {
        let client = &self.bob.client;
        match reply {
            Some(reply) => client
                .publish_with_reply(
                    subject.to_owned(),
                    reply.to_owned(),
                    payload.to_owned().into(),
                )
                .await
                .unwrap(),
            None => client
                .publish(subject.to_owned(), payload.to_owned().into())
                .await
                .unwrap(),
        }
        self.bob.refused(subject).await;
    }

    /// Bob subscribes to `subject`: the broker refuses it.
    pub async fn bob_refused_subscription(&self, subject: &str) {
        let _sub = self.bob.client.subscribe(subject.to_owned()).await.unwrap();
        self.bob.refused(subject).await;
    }
}

/// The router's counters, from its status reply.
pub async fn router_counters(ops: &Connected) -> serde_json::Value {
    let Ok(reply) = ops.client.request("hub.admin.status", "".into()).await else {
        return serde_json::Value::Null;
    };
    let status: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
    status["counters"].clone()
}

/// Alice delegates a task to queue `q` (stored in the work stream; no worker runs it here) and
/// returns its task channel subject.
pub async fn alice_delegates(hub: &Hub) -> (protocol::TaskId, String) {
    let spec = runtime::system::tasks::new_task("alice's task", vec![]);
    let env = serde_json::json!({"meta": {"id": "m-task"}, "body": spec});
    jetstream::new(hub.alice.client.clone())
        .publish(
            "hub.pub.alice.work.q",
            serde_json::to_vec(&env).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let channel =
        protocol::subjects::TaskChannel::of(&super::agent("alice"), &spec.task_id).subject();
    (spec.task_id, channel)
}
