//! Helpers shared by the messaging integration tests (each test binary uses a subset).
#![allow(dead_code)]

pub mod attack_hub;
pub mod cluster_load;
pub mod many;
pub mod oneshot;
pub mod processes;
pub mod rendered;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::inbox::Delivery;
use actors::router::RouterCountersSnapshot;
use async_nats::jetstream;
use async_nats::jetstream::stream::RawMessageErrorKind;
use futures::StreamExt;
use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::AgentId;
use runtime::{ActorSystem, NatsSettings};

/// How long any awaited event may take.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// Grace period of a system shutdown.
pub const GRACE: Duration = Duration::from_secs(10);

/// Every delivery a handler saw, in order.
pub type Seen = Arc<Mutex<Vec<Delivery>>>;

/// The delivery config of the tests: a 1 s ack wait and no backoff, so redeliveries come back
/// fast; no limit on an inbox's deliveries (the dead-letter tests set their own).
pub fn delivery() -> DeliveryConfig {
    DeliveryConfig {
        ack_wait_secs: 1,
        inbox_max_deliver: -1,
        inbox_backoff_secs: Vec::new(),
        ..DeliveryConfig::default()
    }
}

/// A system connected to `url`, durable or core, with the given inbox mode.
pub async fn system(url: String, durable: bool, mode: DurableInboxMode) -> ActorSystem {
    system_with(url, durable, mode, delivery()).await
}

/// [`system`] with `delivery` as its delivery config.
pub async fn system_with(
    url: String,
    durable: bool,
    mode: DurableInboxMode,
    delivery: DeliveryConfig,
) -> ActorSystem {
    ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(durable)
        .delivery_config(delivery)
        .inbox_mode(mode)
        .build()
        .await
        .unwrap()
}

/// A durable system in `auto` inbox mode.
pub async fn durable_system(url: String) -> ActorSystem {
    system(url, true, DurableInboxMode::Auto).await
}

/// A durable system on `server` with its router started (tasks and DMs are routed).
pub async fn durable_hub(server: &harness::NatsServer, mode: DurableInboxMode) -> ActorSystem {
    let hub = system(server.url(), true, mode).await;
    hub.start_router().await.unwrap();
    hub
}

/// An agent id.
pub fn agent(name: &str) -> AgentId {
    AgentId::new(name).unwrap()
}

/// Attaches `id`'s inbox with a handler that records every delivery.
pub async fn attach_collect(system: &ActorSystem, id: &AgentId) -> Seen {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    system
        .attach_inbox(id, move |d| {
            let sink = sink.clone();
            Box::pin(async move { sink.lock().unwrap().push(d) })
        })
        .await
        .unwrap();
    seen
}

/// The bodies of what a handler saw, in order.
pub fn bodies(seen: &Seen) -> Vec<serde_json::Value> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|d| d.envelope.body.clone())
        .collect()
}

/// Waits until the handler saw at least `n` deliveries.
pub async fn wait_for(seen: &Seen, n: usize) {
    harness::wait_until(&format!("{n} deliveries"), DEADLINE, || {
        seen.lock().unwrap().len() >= n
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: got {:?}", bodies(seen)));
}

/// The router's counters (panics when no router runs).
pub async fn router_counters(system: &ActorSystem) -> RouterCountersSnapshot {
    system
        .snapshot()
        .await
        .unwrap()
        .router
        .expect("a router runs")
        .counters
}

/// Waits until `cond` holds for the router's counters; returns them.
pub async fn wait_router(
    system: &ActorSystem,
    what: &str,
    cond: impl Fn(&RouterCountersSnapshot) -> bool,
) -> RouterCountersSnapshot {
    wait_counters(what, cond, || async {
        system.snapshot().await.ok()?.router.map(|r| r.counters)
    })
    .await
}

/// Waits until `cond` holds for `id`'s inbox counters (an inbox attached to `system`);
/// returns them.
pub async fn wait_inbox(
    system: &ActorSystem,
    id: &AgentId,
    what: &str,
    cond: impl Fn(&actors::inbox::InboxCountersSnapshot) -> bool,
) -> actors::inbox::InboxCountersSnapshot {
    wait_counters(what, cond, || async {
        system.inbox_snapshot(id).await.map(|s| s.counters)
    })
    .await
}

/// Waits until `cond` holds for the counters `read` returns (`None`: not there yet); panics
/// with the last ones read past the deadline.
async fn wait_counters<T: Clone + std::fmt::Debug, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    cond: impl Fn(&T) -> bool,
    read: impl Fn() -> F,
) -> T {
    let last = Mutex::new(None);
    let waited = harness::wait_until_async(what, DEADLINE, || {
        let (last, cond, read) = (&last, &cond, &read);
        async move {
            let Some(counters) = read().await else {
                return false;
            };
            let ok = cond(&counters);
            *last.lock().unwrap() = Some(counters);
            ok
        }
    })
    .await;
    let last = last.into_inner().unwrap();
    match waited {
        Ok(()) => last.unwrap(),
        Err(e) => panic!("{e}: last counters {last:?}"),
    }
}

/// Restarts of `child` under the supervisor `sup`, as the system reports them.
pub async fn restarts(system: &ActorSystem, sup: &str, child: &str) -> usize {
    let snap = system.snapshot().await.unwrap();
    snap.supervisors
        .get(sup)
        .and_then(|s| s.child(child))
        .map_or(0, |c| c.restarts)
}

/// Name of the router's supervisor.
pub fn router_sup(system: &ActorSystem) -> String {
    format!("{}/router-sup", system.id())
}

/// Restarts of `id`'s inbox under the system's inbox supervisor.
pub async fn inbox_restarts(system: &ActorSystem, id: &AgentId) -> u64 {
    let snap = system.snapshot().await.unwrap();
    snap.inbox_supervisor
        .and_then(|s| s.restarted.get(&system.inbox_name(id)).copied())
        .unwrap_or(0)
}

/// A JetStream context on a fresh connection to `url`.
pub async fn js(server: &harness::NatsServer) -> jetstream::Context {
    jetstream::new(server.client().await.unwrap())
}

/// How many messages `stream` holds now.
pub async fn stream_messages(js: &jetstream::Context, stream: &str) -> u64 {
    let mut stream = js.get_stream(stream).await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// How many messages `stream` holds on exactly `subject`.
pub async fn count_on(js: &jetstream::Context, stream: &str, subject: &str) -> usize {
    let stream = js.get_stream(stream).await.unwrap();
    let mut subjects = stream.info_with_subjects(subject).await.unwrap();
    let mut total = 0;
    while let Some(entry) = subjects.next().await {
        let (name, n) = entry.unwrap();
        if name == subject {
            total += n;
        }
    }
    total
}

/// Every message `stream` holds on `subject` (a filter; wildcards allowed), in order.
pub async fn stored_on(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Vec<jetstream::message::StreamMessage> {
    let stream = js.get_stream(stream).await.unwrap();
    let mut out = Vec::new();
    let mut seq = 1;
    loop {
        match stream
            .raw_message_builder()
            .sequence(seq)
            .next_by_subject(subject)
            .send()
            .await
        {
            Ok(msg) => {
                seq = msg.sequence + 1;
                out.push(msg);
            }
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return out,
            Err(e) => panic!("reading {subject} from the stream: {e}"),
        }
    }
}

/// Publishes `payload` to `subject` through JetStream with `Nats-Msg-Id: msg_id` and waits for
/// the ack; returns (stream sequence, duplicate).
pub async fn js_publish(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Vec<u8>,
) -> (u64, bool) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(protocol::headers::NATS_MSG_ID, msg_id);
    let ack = js
        .publish_with_headers(subject.to_string(), headers, payload.into())
        .await
        .unwrap()
        .await
        .unwrap();
    (ack.sequence, ack.duplicate)
}

/// A DM to `to` with `meta.id` `id` and its id as its body (set more `meta` on it as needed).
pub fn dm(to: &AgentId, id: &str) -> protocol::Envelope {
    let mut meta = protocol::Meta::new(protocol::MessageId::new(id).unwrap());
    meta.to = Some(to.clone());
    protocol::Envelope {
        meta,
        body: serde_json::json!(id),
        extra: Default::default(),
    }
}

/// `from` sends a DM `{"meta": {"id", "to"}, "body": "hi"}` to `to` through its ingress
/// (`hub.pub.<from>.inbox`) on `client`, and waits for the stream ack.
pub async fn send_dm(client: &async_nats::Client, from: &str, to: &str, id: &str) {
    publish_dm(
        client,
        from,
        serde_json::json!({"meta": {"id": id, "to": to}, "body": "hi"}),
    )
    .await;
}

/// `from` publishes the envelope `dm` through its ingress and waits for the stream ack.
pub async fn publish_dm(client: &async_nats::Client, from: &str, dm: serde_json::Value) {
    jetstream::new(client.clone())
        .publish(
            format!("hub.pub.{from}.inbox"),
            serde_json::to_vec(&dm).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Pending and unacked counts of a consumer.
pub async fn consumer_backlog(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> (u64, usize) {
    let stream = js.get_stream(stream).await.unwrap();
    let info = stream.consumer_info(consumer).await.unwrap();
    (info.num_pending, info.num_ack_pending)
}

/// Waits until the inbox consumer `consumer` has nothing pending and nothing unacked: every DM
/// stored for it was handed over and settled.
pub async fn wait_settled(js: &jetstream::Context, consumer: &str) {
    harness::wait_until_async(&format!("{consumer} settled"), DEADLINE, || async {
        consumer_backlog(js, "HUB_INBOX", consumer).await == (0, 0)
    })
    .await
    .unwrap();
}

/// Starts worker `id` on `queue` in `system` with `handler`, its journal under `journal`.
pub async fn start_worker(
    system: &ActorSystem,
    id: &str,
    queue: &protocol::QueueName,
    concurrency: usize,
    handler: Arc<dyn actors::worker::TaskHandler>,
    journal: &std::path::Path,
) {
    system
        .start_worker(runtime::system::worker::WorkerSettings {
            worker_id: protocol::WorkerId::new(id).unwrap(),
            queue: queue.clone(),
            concurrency,
            journal_dir: journal.to_path_buf(),
            handler,
            shutdown_grace: actors::worker::DEFAULT_SHUTDOWN_GRACE,
        })
        .await
        .unwrap();
}

/// Installs a process-wide tracing subscriber that exports spans to memory (a test binary may
/// do this once), and returns the provider (to flush) and the exporter (to read the spans).
pub fn memory_tracing() -> (
    opentelemetry_sdk::trace::SdkTracerProvider,
    opentelemetry_sdk::trace::InMemorySpanExporter,
) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::set_global_default(subscriber).unwrap();
    (provider, exporter)
}

/// The finished spans named `name`.
pub fn spans_named<'a>(
    spans: &'a [opentelemetry_sdk::trace::SpanData],
    name: &str,
) -> Vec<&'a opentelemetry_sdk::trace::SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// Waits until a router (a separate `runtime` process) answers `runtime status` on `client`.
pub async fn wait_router_answers(client: &async_nats::Client) {
    harness::wait_until_async("a router answers status", DEADLINE, || async {
        runtime::request_status(client, Duration::from_millis(500))
            .await
            .is_ok()
    })
    .await
    .unwrap();
}

/// Every result stored on `task_id`'s channel in `HUB_TASKS` (whoever delegated it:
/// `channel.task.*.<task id>`), in order.
pub async fn results_on(
    js: &jetstream::Context,
    task_id: &protocol::TaskId,
) -> Vec<protocol::task::TaskResult> {
    let subject = format!("channel.task.*.{task_id}");
    stored_on(js, protocol::subjects::TASKS_STREAM, &subject)
        .await
        .into_iter()
        .filter_map(|m| {
            let env = protocol::decode(&m.payload, protocol::Codec::Json).ok()?;
            match serde_json::from_value(env.body).ok()? {
                protocol::task::TaskChannelBody::Result(r) => Some(r),
                _ => None,
            }
        })
        .collect()
}

/// A task handler that counts runs per task id and completes after `delay` with
/// `{"echo": <text>, "worker": <worker id>}`.
#[derive(Clone, Default)]
pub struct Counting {
    /// How long each run takes.
    pub delay: Duration,
    /// Runs per task id (shared by clones, and by handlers built with the same map).
    pub runs: Arc<Mutex<std::collections::HashMap<String, u32>>>,
}

impl Counting {
    /// How often `task_id` ran.
    pub fn runs(&self, task_id: &str) -> u32 {
        self.runs.lock().unwrap().get(task_id).copied().unwrap_or(0)
    }

    /// How many runs in all.
    pub fn total(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }
}

#[async_trait::async_trait]
impl actors::worker::TaskHandler for Counting {
    async fn run(
        &self,
        task: protocol::task::TaskSpec,
        ctx: actors::worker::AttemptContext,
    ) -> actors::worker::Outcome {
        *self
            .runs
            .lock()
            .unwrap()
            .entry(task.task_id.to_string())
            .or_default() += 1;
        tokio::time::sleep(self.delay).await;
        actors::worker::Outcome::Completed(
            serde_json::json!({"echo": task.text, "worker": ctx.worker_id.as_str()}),
        )
    }
}

/// `id`'s attach request, answered: the router makes `inbox-<id>`, which nobody reads yet (an
/// offline agent with a consumer).
pub async fn make_consumer(hub: &ActorSystem, id: &AgentId) {
    let reply = hub
        .client()
        .request(protocol::subjects::attach_request(id), "{}".into())
        .await
        .unwrap();
    let reply = String::from_utf8_lossy(&reply.payload).into_owned();
    assert!(reply.contains(&format!("inbox-{id}")), "{reply}");
}

/// JetStream-publishes each `(headers, payload)` to `subject`, pipelined (at most 256 store acks
/// in flight), and waits until every one is stored.
pub async fn publish_pipelined(
    js: &jetstream::Context,
    subject: &str,
    messages: impl IntoIterator<Item = (async_nats::HeaderMap, Vec<u8>)>,
) {
    let mut acks = futures::stream::FuturesOrdered::new();
    for (headers, payload) in messages {
        let ack = js
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await
            .unwrap();
        acks.push_back(std::future::IntoFuture::into_future(ack));
        if acks.len() >= 256 {
            acks.next().await.unwrap().unwrap();
        }
    }
    while let Some(ack) = acks.next().await {
        ack.unwrap();
    }
}
