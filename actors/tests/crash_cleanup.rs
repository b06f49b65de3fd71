//! An actor that fails (a `handle` error: ractor then skips `post_stop`), or an inbox whose
//! incarnation fails, leaves none of its background tasks behind: its old subscriptions and
//! pumps take no more messages, and the incarnation its supervisor restarts answers
//! everything. Real nats-server, the fault hook.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actors::fault::{self, Fault, FaultPoint};
use actors::supervision::{self, ChildSpec, Strategy, SupervisorSpec};
use protocol::config::DeliveryConfig;
use protocol::subjects;
use ractor::{ActorRef, RpcReplyPort};

const DEADLINE: Duration = Duration::from_secs(20);

fn delivery() -> Arc<DeliveryConfig> {
    Arc::new(DeliveryConfig {
        ack_wait_secs: 1,
        ..DeliveryConfig::default()
    })
}

/// Publishes a DM from alice to bob through the ingress and awaits its stream ack.
async fn send_dm(js: &async_nats::jetstream::Context, id: &str, body: serde_json::Value) {
    let dm = serde_json::json!({"meta": {"id": id, "to": "bob"}, "body": body});
    js.publish(
        "hub.pub.alice.inbox",
        serde_json::to_vec(&dm).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

/// Waits until an actor named `name` runs and answers `ask`, and is not `not`.
async fn restarted<M, T>(
    name: &str,
    not: Option<ractor::ActorId>,
    ask: impl Fn(RpcReplyPort<T>) -> M,
) -> ActorRef<M>
where
    M: ractor::Message,
    T: Send + 'static,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(cell) = ractor::registry::where_is(name) {
            if Some(cell.get_id()) != not {
                let actor: ActorRef<M> = cell.into();
                if actor
                    .call(&ask, Some(Duration::from_millis(500)))
                    .await
                    .is_ok()
                {
                    return actor;
                }
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} not running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_crashed_attach_actor_leaves_no_listener_behind() {
    use actors::attach::{Attach, AttachMsg};
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let delivery = delivery();
    let js = async_nats::jetstream::new(client.clone());
    actors::streams::ensure_streams(&js, &delivery)
        .await
        .unwrap();
    let name = "crash-attach";
    let attach = Attach {
        name: name.into(),
        client: client.clone(),
        delivery,
        reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
    };
    let spec =
        SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(name, attach, || ()));
    let (sup, _join) = supervision::spawn_supervisor(Some(format!("{name}-sup")), spec)
        .await
        .unwrap();
    let first = restarted(name, None, AttachMsg::Snapshot).await;
    fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    // The request that crashes it gets no answer.
    let crash = client.request(
        subjects::attach_request(&protocol::AgentId::new("bob").unwrap()),
        "{}".into(),
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), crash).await;
    restarted(name, Some(first.get_id()), AttachMsg::Snapshot).await;
    for i in 0..20 {
        let id = protocol::AgentId::new(format!("agent{i}")).unwrap();
        let reply = tokio::time::timeout(
            Duration::from_secs(3),
            client.request(subjects::attach_request(&id), "{}".into()),
        )
        .await;
        assert!(
            matches!(reply, Ok(Ok(_))),
            "attach request {i} was not answered: {reply:?}"
        );
    }
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_crashed_router_leaves_no_pump_behind() {
    use actors::router::{Router, RouterMsg};
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let name = "crash-router";
    let router = Router {
        name: name.into(),
        client: client.clone(),
        durable: true,
        delivery: delivery(),
        reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
        history: Default::default(),
        watchdog: None,
    };
    let spec =
        SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::actor(name, router, || ()));
    let (sup, _join) = supervision::spawn_supervisor(Some(format!("{name}-sup")), spec)
        .await
        .unwrap();
    let first = restarted(name, None, RouterMsg::Snapshot).await;
    // A status request fails it (its pump keeps running unless the failure ends it too).
    fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        client.request(subjects::STATUS_SUBJECT, "".into()),
    )
    .await;
    let second = restarted(name, Some(first.get_id()), RouterMsg::Snapshot).await;
    // Every DM sent now is routed by the new incarnation: no old pump takes a share.
    let js = async_nats::jetstream::new(client.clone());
    for i in 0..20 {
        send_dm(&js, &format!("m{i}"), serde_json::json!(i)).await;
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let snap = ractor::call_t!(second, RouterMsg::Snapshot, 2000).unwrap();
        let stored = snap.counters.stored;
        if stored == 20 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restarted router stored {stored} of 20: an old pump took the rest"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    supervision::shutdown(&sup, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_crashed_inbox_leaves_no_pump_behind() {
    use actors::inbox::{InboxConsumer, InboxShared, InboxView};
    use actors::supervision::{dynamic, DynamicSupervisor, Intensity};
    use protocol::attach::DurableInboxMode;
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let delivery = delivery();
    // A hub: router and attach.
    let hub = SupervisorSpec::new(Strategy::OneForOne)
        .child(ChildSpec::actor(
            "crash-inbox-router",
            actors::router::Router {
                name: "crash-inbox-router".into(),
                client: client.clone(),
                durable: true,
                delivery: delivery.clone(),
                reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
                history: Default::default(),
                watchdog: None,
            },
            || (),
        ))
        .child(ChildSpec::actor(
            "crash-inbox-attach",
            actors::attach::Attach {
                name: "crash-inbox-attach".into(),
                client: client.clone(),
                delivery: delivery.clone(),
                reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
            },
            || (),
        ));
    let (hub, _hub_join) = supervision::spawn_supervisor(Some("crash-inbox-hub".into()), hub)
        .await
        .unwrap();
    restarted(
        "crash-inbox-router",
        None,
        actors::router::RouterMsg::Snapshot,
    )
    .await;
    restarted(
        "crash-inbox-attach",
        None,
        actors::attach::AttachMsg::Snapshot,
    )
    .await;
    let handled = Arc::new(AtomicU64::new(0));
    let seen = handled.clone();
    let name = "crash-inbox";
    let bob = protocol::AgentId::new("bob").unwrap();
    let inbox = InboxConsumer {
        name: name.into(),
        id: bob.clone(),
        mode: DurableInboxMode::On,
        inbox_stream: delivery.inbox.name.clone(),
        hub_durable: true,
        attach_timeout: Duration::from_secs(2),
        batch: 16,
        handler: Arc::new(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { actors::inbox::Handled::Done })
        }),
        presence_beat: None,
        audit_events: false,
        shared: InboxShared::new(client.clone(), "crash-inbox/clock"),
    };
    let (sup, _join) = DynamicSupervisor::spawn(format!("{name}-sup"), Intensity::default())
        .await
        .unwrap();
    let view = Arc::new(InboxView::default());
    dynamic::add_task(&sup, inbox.task_spec(view.clone()))
        .await
        .unwrap();
    assert!(view.wait_bound(DEADLINE).await, "the inbox did not bind");
    // The first DM fails its incarnation before it is handed over (the pump is the
    // incarnation's task: nothing of it may go on pulling).
    fault::arm(name, FaultPoint::Handle, Fault::Error, 1);
    let js = async_nats::jetstream::new(client.clone());
    for i in 0..20 {
        send_dm(&js, &format!("m{i}"), serde_json::json!(i)).await;
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let restarts = dynamic::snapshot(&sup).await.unwrap().restarts;
        let delivered = view.snapshot(&bob).map_or(0, |s| s.counters.delivered);
        if restarts >= 1 && delivered == 20 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restarted inbox handed over {delivered} of 20 ({} handled in all, {restarts} restarts): an old pump took the rest",
            handled.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(handled.load(Ordering::SeqCst), 20, "each DM handled once");
    assert_eq!(fault::remaining(name, FaultPoint::Handle), 0);
    assert!(dynamic::remove_child(&sup, name, Duration::from_secs(5))
        .await
        .unwrap());
    assert!(view.snapshot(&bob).is_none());
    sup.stop(None);
    supervision::shutdown(&hub, Duration::from_secs(5)).await;
}
