//! Worker tests against a real nats-server with the production shapes: the streams are made by
//! [`ensure_streams`](crate::streams::ensure_streams), the consumers by the real
//! [`Attach`](crate::attach::Attach) actor answering the worker's join (so by
//! [`crate::consumers`]), and the worker's results are routed into `HUB_TASKS` by the real
//! [`Router`](crate::router::Router). Tests store task inputs and answers straight into the
//! work and answer streams (as the router would), so that they can also store bad ones.

mod answers;
mod basics;
mod claims;
mod control;
mod faults;
mod parked;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, Context};
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::subjects;
use protocol::task::{Answer, AttemptId, TaskChannelBody, TaskResult, TaskSpec};
use protocol::{QueueName, WorkerId};
use ractor::{Actor, ActorRef};

use super::*;

/// The consumers' ack wait in these tests (the hub's `ack_wait_secs`).
pub(super) const ACK_WAIT: Duration = Duration::from_secs(1);
/// How long any awaited event may take.
pub(super) const DEADLINE: Duration = Duration::from_secs(20);

/// The hub's delivery config of these tests: a 1 s ack wait.
pub(super) fn delivery() -> DeliveryConfig {
    DeliveryConfig {
        ack_wait_secs: ACK_WAIT.as_secs(),
        ..DeliveryConfig::default()
    }
}

pub(super) struct TestHandler {
    pub calls: AtomicUsize,
    pub resumes: AtomicUsize,
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
    pub sleep: Duration,
    pub wait_first: bool,
}

impl TestHandler {
    pub fn new(sleep: Duration) -> Arc<TestHandler> {
        Arc::new(TestHandler {
            calls: AtomicUsize::new(0),
            resumes: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
            sleep,
            wait_first: false,
        })
    }

    /// A handler whose first run parks on the question `approve?` (tool call `call-1`).
    pub fn waiting(sleep: Duration) -> Arc<TestHandler> {
        Arc::new(TestHandler {
            wait_first: true,
            ..Arc::into_inner(TestHandler::new(sleep)).expect("fresh")
        })
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn resumes(&self) -> usize {
        self.resumes.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TaskHandler for TestHandler {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        tokio::select! {
            () = tokio::time::sleep(self.sleep) => {}
            () = ctx.cancelled() => {
                self.running.fetch_sub(1, Ordering::SeqCst);
                return Outcome::Cancelled;
            }
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        if self.wait_first || task.text.contains("[ask]") || task.text.contains("[ask2]") {
            return Outcome::Waiting {
                question: "approve?".into(),
                tool_call_id: "call-1".into(),
            };
        }
        Outcome::Completed(serde_json::json!({ "echo": task.text, "rerun": ctx.rerun }))
    }

    async fn resume(&self, task: TaskSpec, answers: Vec<Answer>, ctx: AttemptContext) -> Outcome {
        self.resumes.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.sleep).await;
        if task.text.contains("[ask2]") && answers.len() == 1 {
            return Outcome::Waiting {
                question: "and then?".into(),
                tool_call_id: "call-2".into(),
            };
        }
        Outcome::Completed(serde_json::json!({ "answers": answers.len(), "rerun": ctx.rerun }))
    }
}

/// Which parts of the hub run beside the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hub {
    /// The attach actor (joins) and the router (results into `HUB_TASKS`).
    Full,
    /// The attach actor only: the worker's ingress messages stay in `HUB_INGRESS` for the test
    /// to read.
    AttachOnly,
    /// Nothing: the test answers joins itself.
    None,
}

pub(super) struct Env {
    pub server: harness::NatsServer,
    pub client: async_nats::Client,
    pub js: Context,
    pub delivery: Arc<DeliveryConfig>,
    pub queue: QueueName,
    pub worker_id: WorkerId,
    pub dir: PathBuf,
    hub: Vec<ractor::ActorCell>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for actor in &self.hub {
            actor.stop(None);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::env::temp_dir().join(format!("worker-{name}-{}-{nanos}", std::process::id()))
}

/// A nats-server with the production streams, and the hub parts `hub` says.
pub(super) async fn env_with(name: &str, hub: Hub) -> Env {
    let server = harness::run_server().await.expect("nats-server");
    let client = server.client().await.unwrap();
    let js = jetstream::new(client.clone());
    let delivery = Arc::new(delivery());
    crate::streams::ensure_streams(&js, &delivery)
        .await
        .expect("streams");
    let mut actors = Vec::new();
    if hub != Hub::None {
        let attach = crate::attach::Attach {
            name: format!("{name}/attach"),
            client: client.clone(),
            delivery: delivery.clone(),
            reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
        };
        let (attach, _) = Actor::spawn(Some(attach.name.clone()), attach, ())
            .await
            .expect("attach actor");
        actors.push(attach.get_cell());
    }
    if hub == Hub::Full {
        let router = crate::router::Router {
            name: format!("{name}/router"),
            client: client.clone(),
            durable: true,
            delivery: delivery.clone(),
            reply_prefix: protocol::subjects::DEFAULT_REPLY_PREFIX.into(),
            history: Default::default(),
            watchdog: None,
        };
        let (router, _) = Actor::spawn(Some(router.name.clone()), router, ())
            .await
            .expect("router actor");
        actors.push(router.get_cell());
    }
    Env {
        server,
        client,
        js,
        delivery,
        queue: QueueName::new("q").unwrap(),
        worker_id: WorkerId::new(format!("w-{name}").replace('_', "-")).unwrap(),
        dir: temp_dir(name),
        hub: actors,
    }
}

/// [`env_with`] the full hub.
pub(super) async fn env(name: &str) -> Env {
    env_with(name, Hub::Full).await
}

impl Env {
    pub fn worker(&self, name: &str, handler: Arc<dyn TaskHandler>, concurrency: usize) -> Worker {
        self.worker_as(name, self.worker_id.clone(), handler, concurrency)
    }

    pub fn worker_as(
        &self,
        name: &str,
        worker_id: WorkerId,
        handler: Arc<dyn TaskHandler>,
        concurrency: usize,
    ) -> Worker {
        Worker {
            concurrency,
            ..Worker::new(
                name,
                self.client.clone(),
                worker_id,
                self.queue.clone(),
                self.dir.clone(),
                handler,
            )
        }
    }

    pub async fn start(
        &self,
        name: &str,
        handler: Arc<dyn TaskHandler>,
        concurrency: usize,
    ) -> ActorRef<WorkerMsg> {
        spawn(self.worker(name, handler, concurrency)).await
    }

    /// Stores a task input the way the router does; returns its stream sequence.
    pub async fn submit_raw(&self, body: serde_json::Value, id: &str) -> u64 {
        let env = serde_json::json!({ "meta": { "id": id, "from": "delegator" }, "body": body });
        self.store(
            &subjects::work(&self.queue, None),
            serde_json::to_vec(&env).unwrap(),
        )
        .await
    }

    /// Stores `payload` on `subject` (work or answer streams) and returns its stream sequence.
    pub async fn store(&self, subject: &str, payload: Vec<u8>) -> u64 {
        self.js
            .publish(subject.to_owned(), payload.into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence
    }

    pub async fn submit(&self, task_id: &str) -> u64 {
        self.submit_raw(
            serde_json::json!({ "version": 1, "task_id": task_id, "text": format!("do {task_id}") }),
            &format!("m-{task_id}"),
        )
        .await
    }

    /// Every task channel message the router stores from now on, in order (from the start
    /// of `HUB_TASKS`).
    pub async fn results(&self) -> Results {
        let stream = self.js.get_stream(subjects::TASKS_STREAM).await.unwrap();
        let consumer = stream
            .create_consumer(pull::Config {
                filter_subject: subjects::TASKS_FILTER.to_string(),
                ack_policy: AckPolicy::None,
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .unwrap();
        Results(consumer.messages().await.unwrap())
    }

    /// A control request (query or cancel) naming `task_id`/`attempt_id` on this worker; its
    /// reply decoded.
    pub async fn control(
        &self,
        kind: subjects::ControlKind,
        task_id: &str,
        attempt_id: &AttemptId,
    ) -> protocol::task::QueryReply {
        let request = serde_json::json!({
            "task_id": task_id, "attempt_id": attempt_id, "worker_id": self.worker_id,
        });
        let reply = self
            .client
            .request(
                subjects::control(&self.worker_id, kind),
                serde_json::to_vec(&request).unwrap().into(),
            )
            .await
            .unwrap();
        serde_json::from_slice(&reply.payload).unwrap()
    }

    /// A control request on the form naming `requester` (`hub.ctl.<worker>.<kind>.<requester>`);
    /// its raw JSON reply.
    pub async fn control_as(
        &self,
        kind: subjects::ControlKind,
        task_id: &str,
        attempt_id: &AttemptId,
        requester: &str,
    ) -> serde_json::Value {
        let request = serde_json::json!({
            "task_id": task_id, "attempt_id": attempt_id, "worker_id": self.worker_id,
        });
        let requester = protocol::AgentId::new(requester).unwrap();
        let reply = self
            .client
            .request(
                subjects::control_as(&self.worker_id, kind, &requester),
                serde_json::to_vec(&request).unwrap().into(),
            )
            .await
            .unwrap();
        serde_json::from_slice(&reply.payload).unwrap()
    }

    /// Stores an answer envelope for `worker` the way the router does.
    pub async fn answer_to(&self, worker: &WorkerId, envelope: &serde_json::Value) -> u64 {
        self.store(
            &subjects::answer(worker),
            serde_json::to_vec(envelope).unwrap(),
        )
        .await
    }

    /// Stores an answer envelope for this worker the way the router does.
    pub async fn answer(&self, envelope: &serde_json::Value) -> u64 {
        self.answer_to(&self.worker_id.clone(), envelope).await
    }

    /// The answer envelope of `message_id` to the `call-1` question of `waiting`.
    pub fn answer_envelope(&self, waiting: &TaskResult, message_id: &str) -> serde_json::Value {
        serde_json::json!({
            "meta": { "id": message_id, "from": "delegator" },
            "body": {
                "message_id": message_id, "task_id": waiting.task_id,
                "attempt_id": waiting.attempt_id, "worker_id": waiting.worker_id,
                "tool_call_id": "call-1", "responses": ["yes"],
            },
        })
    }

    pub async fn left(&self, stream: &str) -> u64 {
        let mut stream = self.js.get_stream(stream).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    pub async fn work_left(&self) -> u64 {
        self.left(subjects::WORK_STREAM).await
    }

    pub async fn wait_empty(&self, stream: &str) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.left(stream).await > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{stream} still holds {} messages",
                self.left(stream).await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_work_empty(&self) {
        self.wait_empty(subjects::WORK_STREAM).await;
    }

    /// Deletes the queue consumer and makes it again, as a broker that forgot its deliveries
    /// would have it: what the old one delivered comes again, counted once.
    pub async fn remake_queue_consumer(&self) {
        let work = self.js.get_stream(subjects::WORK_STREAM).await.unwrap();
        work.delete_consumer(&subjects::queue_consumer(&self.queue))
            .await
            .unwrap();
        work.create_consumer(crate::consumers::queue_consumer(
            &self.delivery,
            &self.queue,
        ))
        .await
        .unwrap();
    }

    /// The results stored on the channel of `task_id` (delegated by `delegator`), in order.
    pub async fn stored_results(&self, task_id: &protocol::TaskId) -> Vec<TaskResult> {
        crate::task_channel::read(
            &self.js,
            &crate::task_channel::Reader::Direct(subjects::TASKS_STREAM.into()),
            &protocol::AgentId::new("delegator").unwrap(),
            task_id,
            1,
        )
        .await
        .unwrap()
        .into_iter()
        .filter_map(|s| match s.body {
            Some(TaskChannelBody::Result(r)) => Some(r),
            _ => None,
        })
        .collect()
    }
}

pub(super) async fn spawn(worker: Worker) -> ActorRef<WorkerMsg> {
    let (actor, _) = Actor::spawn(Some(worker.name.clone()), worker, ())
        .await
        .expect("worker starts");
    actor
}

pub(super) struct Results(pull::Stream);

impl Results {
    /// The next task channel body, with its envelope's `meta.id` (the id the router derives
    /// the stored message's `Nats-Msg-Id` from).
    pub async fn next(&mut self, within: Duration) -> Option<(TaskChannelBody, String)> {
        let msg = tokio::time::timeout(within, self.0.next())
            .await
            .ok()??
            .unwrap();
        let env = protocol::decode(&msg.payload, protocol::Codec::Json).unwrap();
        let id = env.meta.id.to_string();
        Some((serde_json::from_value(env.body).unwrap(), id))
    }

    /// The next task channel body, with its envelope's sender (`meta.from`).
    pub async fn next_from(&mut self, within: Duration) -> Option<(TaskChannelBody, String)> {
        let msg = tokio::time::timeout(within, self.0.next())
            .await
            .ok()??
            .unwrap();
        let env = protocol::decode(&msg.payload, protocol::Codec::Json).unwrap();
        let from = env.meta.from.map(|f| f.to_string()).unwrap_or_default();
        Some((serde_json::from_value(env.body).unwrap(), from))
    }

    /// The next task channel body as raw JSON (bodies this version may not know included).
    pub async fn next_raw(&mut self, within: Duration) -> Option<serde_json::Value> {
        let msg = tokio::time::timeout(within, self.0.next())
            .await
            .ok()??
            .unwrap();
        let env = protocol::decode(&msg.payload, protocol::Codec::Json).unwrap();
        Some(env.body)
    }

    /// Waits for the first raw body that `pick` accepts, skipping others.
    pub async fn find_raw(
        &mut self,
        within: Duration,
        pick: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let body = self.next_raw(left).await?;
            if pick(&body) {
                return Some(body);
            }
        }
    }

    /// The next result (skipping status events).
    pub async fn result(&mut self, within: Duration) -> TaskResult {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some((TaskChannelBody::Result(r), _)) => return r,
                Some(_) => continue,
                None => panic!("no result within {within:?}"),
            }
        }
    }

    /// Every body that arrives within `within` (for asserting that nothing more came).
    pub async fn drain(&mut self, within: Duration) -> Vec<TaskChannelBody> {
        let mut out = Vec::new();
        while let Some((body, _)) = self.next(within).await {
            out.push(body);
        }
        out
    }
}

/// Submits a task whose handler asks a question (`[ask]` in its text).
pub(super) async fn submit_asking(env: &Env, task_id: &str) -> u64 {
    env.submit_raw(
        serde_json::json!({ "version": 1, "task_id": task_id, "text": format!("[ask] {task_id}") }),
        &format!("m-{task_id}"),
    )
    .await
}

/// The next result of `task_id` within [`DEADLINE`] (skipping other tasks' bodies).
pub(super) async fn result_of(results: &mut Results, task_id: &str) -> TaskResult {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let result = results.result(left).await;
        if result.task_id.as_str() == task_id {
            return result;
        }
    }
}

pub(super) async fn snapshot(worker: &ActorRef<WorkerMsg>) -> WorkerSnapshot {
    ractor::call_t!(worker, WorkerMsg::Snapshot, 2000).unwrap()
}

/// Waits until `cond` holds for the worker's snapshot; returns it.
pub(super) async fn wait_snapshot(
    worker: &ActorRef<WorkerMsg>,
    what: &str,
    cond: impl Fn(&WorkerSnapshot) -> bool,
) -> WorkerSnapshot {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let snap = snapshot(worker).await;
        if cond(&snap) {
            return snap;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: last snapshot {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn stop(worker: ActorRef<WorkerMsg>) {
    worker
        .stop_and_wait(None, Some(Duration::from_secs(10)))
        .await
        .unwrap();
}

/// Holds every run until the test opens it (then lets every run through); counts runs.
pub(super) struct Gate {
    calls: std::sync::atomic::AtomicUsize,
    open: tokio::sync::Semaphore,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate {
            calls: Default::default(),
            open: tokio::sync::Semaphore::new(0),
        })
    }

    pub fn open(&self) {
        self.open.add_permits(1 << 20);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub async fn wait_started(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.calls() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[async_trait::async_trait]
impl TaskHandler for Gate {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        if task.text.contains("[hold]") {
            // Keeps a slot busy, uncounted, until cancelled.
            ctx.cancelled().await;
            return Outcome::Cancelled;
        }
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::select! {
            _ = self.open.acquire() => Outcome::Completed(serde_json::json!({ "echo": task.text })),
            () = ctx.cancelled() => Outcome::Cancelled,
        }
    }
}
