//! A steady load of DMs and tasks on a 3-node cluster with every stream R3, through real
//! router and worker processes (issue 29 §4): faults are applied while it runs, and what it
//! sent is checked once it stops and the system drains.
//!
//! Two `runtime` routers and two workers run as processes on every node's URL. An in-process
//! system (its router not started) sends DMs from alice to bob and carol, whose inboxes it
//! holds, and delegates tasks to the workers' queue, tracking each. Every send and delegation
//! is spawned on a steady clock, so a publish held up by an election does not slow the load.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{Cluster, RuntimeProcess};
use protocol::config::DeliveryConfig;
use protocol::task::{TaskResult, TaskState};
use protocol::{AgentId, QueueName, TaskId};
use runtime::{new_task, ActorSystem, NatsSettings};
use tokio::task::JoinSet;

use super::processes::{logs, Scene};

/// How long the system may take to drain once the load stops.
pub const DRAIN: Duration = Duration::from_secs(90);
/// Pause between two DMs of the load.
const DM_EVERY: Duration = Duration::from_millis(50);
/// Pause between two tasks of the load.
const TASK_EVERY: Duration = Duration::from_millis(250);
/// The workers' queue.
const QUEUE: &str = "load";

/// What the load sent and what came of it, shared with its spawned sends and handlers.
#[derive(Default)]
struct Ledger {
    /// Per DM number: when its send began, and whether the ingress acknowledged it.
    sent: BTreeMap<u64, (Instant, bool)>,
    /// Per DM number: how many times a handler got it, and when first.
    handled: HashMap<u64, (u32, Instant)>,
    /// Per task: what came of its delegation.
    tasks: BTreeMap<TaskId, Delegated>,
    /// Why sends and delegations were not acknowledged, with how many.
    refused: BTreeMap<String, usize>,
}

/// One task of the load.
struct Delegated {
    /// When its delegation began.
    at: Instant,
    /// Whether the ingress acknowledged it.
    acked: bool,
    /// Its final result, and when it came.
    result: Option<(TaskResult, Instant)>,
}

/// The cluster, its processes and the load's ledger.
pub struct Load {
    pub cluster: Cluster,
    pub scene: Scene,
    pub routers: Vec<RuntimeProcess>,
    pub workers: Vec<RuntimeProcess>,
    hub: Arc<ActorSystem>,
    ledger: Arc<Mutex<Ledger>>,
    driver: Option<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
}

/// How long after a fault the hub did something again, by what was sent after it.
#[derive(Debug)]
pub struct Recovery {
    /// From the fault to the moment each recipient had been handed a DM sent after it.
    pub dm: Duration,
    /// From the fault to the first task delegated after it having its result.
    pub task: Duration,
}

impl Load {
    /// Starts the cluster, the routers, the workers and the load.
    pub async fn start() -> Load {
        let cluster = Cluster::start(3).await.unwrap();
        let scene = Scene::new(0)
            .with_delivery(r#"{"replicas": 3}"#)
            .with_script(
                "cat > /dev/null\n\
                 printf '%s %s %s %s\\n' \"$TASK_ID\" \"$WORKER_ID\" \"$ATTEMPT_ID\" \"$TASK_RERUN\" >> '{markers}'/runs\n\
                 printf '{\"response\": \"%s\"}\\n' \"$WORKER_ID\"\n",
            );
        let urls = cluster.urls();
        let routers = vec![scene.router(&urls), scene.router(&urls)];
        let client = cluster.client().await.unwrap();
        let answers = harness::wait_until_async("a router answers status", DRAIN, || async {
            runtime::request_status(&client, Duration::from_millis(500))
                .await
                .is_ok()
        })
        .await;
        if let Err(e) = answers {
            let named: Vec<_> = ["router 0", "router 1"].into_iter().zip(&routers).collect();
            panic!("{e}\n{}\n{}", logs(&named), cluster.logs());
        }
        let workers = vec![
            scene.worker(&urls, "lw1", QUEUE),
            scene.worker(&urls, "lw2", QUEUE),
        ];
        // Both workers take part from the start: a worker that never joined would leave the
        // load to the other, and its exit would show only at the end.
        let joined = harness::wait_until_async("both workers joined", DRAIN, || async {
            let answered = runtime::request_worker_status(&client, Duration::from_millis(500))
                .await
                .unwrap_or_default();
            ["lw1", "lw2"]
                .iter()
                .all(|id| answered.iter().any(|w| w.worker_id == *id))
        })
        .await;
        if let Err(e) = joined {
            let named: Vec<_> = ["worker lw1", "worker lw2"]
                .into_iter()
                .zip(&workers)
                .collect();
            panic!("{e}\n{}\n{}", logs(&named), cluster.logs());
        }
        let hub = ActorSystem::builder()
            .nats(NatsSettings::new(urls))
            .durable(true)
            .delivery_config(DeliveryConfig {
                replicas: 3,
                ..DeliveryConfig::default()
            })
            .build()
            .await
            .unwrap();
        let mut load = Load {
            cluster,
            scene,
            routers,
            workers,
            hub: Arc::new(hub),
            ledger: Arc::default(),
            driver: None,
        };
        for name in ["bob", "carol"] {
            load.attach(name).await;
        }
        load.drive();
        load.wait_flowing().await;
        load
    }

    /// Attaches `name`'s inbox with a handler that writes down each DM it is handed.
    async fn attach(&self, name: &str) {
        let ledger = self.ledger.clone();
        self.hub
            .attach_inbox(&AgentId::new(name).unwrap(), move |d| {
                let n = d.envelope.body.as_u64().expect("a numbered DM");
                let mut ledger = ledger.lock().unwrap();
                let entry = ledger.handled.entry(n).or_insert((0, Instant::now()));
                entry.0 += 1;
                Box::pin(async {})
            })
            .await
            .unwrap();
    }

    /// Starts the clock that spawns a DM every 50 ms and a task every 250 ms until
    /// [`stop`](Self::stop).
    fn drive(&mut self) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (hub, ledger) = (self.hub.clone(), self.ledger.clone());
        let driver = tokio::spawn(async move {
            let alice = AgentId::new("alice").unwrap();
            let recipients = [AgentId::new("bob").unwrap(), AgentId::new("carol").unwrap()];
            let queue = QueueName::new(QUEUE).unwrap();
            let mut sends = JoinSet::new();
            let mut dm_clock = tokio::time::interval(DM_EVERY);
            let mut task_clock = tokio::time::interval(TASK_EVERY);
            let mut n = 0u64;
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = dm_clock.tick() => {
                        let (hub, ledger, alice) = (hub.clone(), ledger.clone(), alice.clone());
                        let to = recipients[usize::try_from(n % 2).unwrap()].clone();
                        let i = n;
                        n += 1;
                        ledger.lock().unwrap().sent.insert(i, (Instant::now(), false));
                        sends.spawn(async move {
                            let sent = hub.send(&alice, &to, serde_json::json!(i)).await;
                            let mut ledger = ledger.lock().unwrap();
                            ledger.sent.get_mut(&i).unwrap().1 = sent.is_ok();
                            if let Err(e) = sent {
                                let why = protocol::error_chain::ErrorChain(&e).to_string();
                                *ledger.refused.entry(why).or_default() += 1;
                            }
                        });
                    }
                    _ = task_clock.tick() => {
                        let (hub, ledger, alice, queue) =
                            (hub.clone(), ledger.clone(), alice.clone(), queue.clone());
                        let spec = new_task("load", vec![]);
                        let id = spec.task_id.clone();
                        ledger.lock().unwrap().tasks.insert(
                            id.clone(),
                            Delegated { at: Instant::now(), acked: false, result: None },
                        );
                        sends.spawn(async move {
                            let tracking =
                                match hub.delegate_tracked(&alice, &queue, None, &spec).await {
                                    Ok((_, tracking)) => tracking,
                                    Err(e) => {
                                        let why = protocol::error_chain::ErrorChain(&e).to_string();
                                        *ledger.lock().unwrap().refused.entry(why).or_default() += 1;
                                        return;
                                    }
                                };
                            ledger.lock().unwrap().tasks.get_mut(&id).unwrap().acked = true;
                            if let Ok(result) = tracking.result.await {
                                let mut ledger = ledger.lock().unwrap();
                                let entry = &mut ledger.tasks.get_mut(&id).unwrap().result;
                                entry.get_or_insert((result, Instant::now()));
                            }
                        });
                    }
                    Some(_) = sends.join_next(), if !sends.is_empty() => {}
                }
            }
            // Sends and trackers still under way finish (or give up) on their own.
            while sends.join_next().await.is_some() {}
        });
        self.driver = Some((stop, driver));
    }

    /// Waits until a DM and a task sent from now on have come through.
    async fn wait_flowing(&self) {
        let since = Instant::now();
        self.wait_recovered(since, super::DEADLINE).await;
    }

    /// Waits until a DM and a task sent after `fault` have come through, and says how long
    /// after `fault` each did.
    pub async fn recovered(&self, fault: Instant) -> Recovery {
        self.wait_recovered(fault, DRAIN).await
    }

    async fn wait_recovered(&self, since: Instant, deadline: Duration) -> Recovery {
        let first = || {
            let ledger = self.ledger.lock().unwrap();
            // Every recipient (DM n goes to recipient n % 2) handed a DM sent since.
            let first_to = |recipient: u64| {
                ledger
                    .sent
                    .iter()
                    .filter(|(n, (at, _))| *n % 2 == recipient && *at >= since)
                    .filter_map(|(n, _)| ledger.handled.get(n).map(|(_, at)| *at))
                    .min()
            };
            let dm = first_to(0)
                .zip(first_to(1))
                .map(|(bob, carol)| bob.max(carol));
            let task = ledger
                .tasks
                .values()
                .filter(|task| task.at >= since)
                .filter_map(|task| task.result.as_ref().map(|(_, at)| *at))
                .min();
            dm.zip(task)
        };
        let waited = harness::wait_until("a DM and a task sent since through", deadline, || {
            first().is_some()
        })
        .await;
        if let Err(e) = waited {
            panic!("{e}\n{}", self.logs());
        }
        let (dm, task) = first().unwrap();
        Recovery {
            dm: dm.saturating_duration_since(since),
            task: task.saturating_duration_since(since),
        }
    }

    /// Waits until every replica of every stream the hub made is current: a node restarted
    /// has caught up, so the next one may go (a rolling restart's rule).
    pub async fn wait_current(&self) {
        let js = async_nats::jetstream::new(self.cluster.client().await.unwrap());
        let streams = protocol::config::DeliveryConfig::default();
        let names: Vec<String> = actors::streams::stream_configs(&streams)
            .into_iter()
            .map(|c| c.name)
            .collect();
        let current = || async {
            for name in &names {
                let info = tokio::time::timeout(Duration::from_secs(2), js.get_stream(name)).await;
                let Ok(Ok(stream)) = info else {
                    return false;
                };
                let Some(cluster) = stream.cached_info().cluster.clone() else {
                    return false;
                };
                let replicas_current = cluster.replicas.iter().all(|r| r.current && !r.offline);
                if cluster.leader.is_none() || cluster.replicas.len() != 2 || !replicas_current {
                    return false;
                }
            }
            true
        };
        let waited =
            harness::wait_until_async("every stream's replicas current", DRAIN, current).await;
        if let Err(e) = waited {
            panic!("{e}\n{}", self.logs());
        }
    }

    /// Stops the load, waits until everything acknowledged came through, and checks it: every
    /// acknowledged DM handed to its handler exactly once, every acknowledged task with one
    /// completed result (on its channel too), any run of its handler after the first flagged as
    /// a re-run, and every router
    /// and worker process still running.
    pub async fn stop_and_check(mut self) {
        let (stop, driver) = self.driver.take().expect("the load runs");
        stop.send(true).unwrap();
        let drained = tokio::time::timeout(DRAIN, driver).await;
        assert!(drained.is_ok(), "the load's sends end\n{}", self.logs());
        let complete = || {
            let ledger = self.ledger.lock().unwrap();
            let dms = ledger
                .sent
                .iter()
                .filter(|(_, (_, acked))| *acked)
                .all(|(n, _)| ledger.handled.contains_key(n));
            let tasks = ledger
                .tasks
                .values()
                .filter(|task| task.acked)
                .all(|task| task.result.is_some());
            dms && tasks
        };
        if let Err(e) =
            harness::wait_until("everything acknowledged through", DRAIN, complete).await
        {
            panic!("{e}: {}\n{}", self.summary(), self.logs());
        }
        // A copy redelivered later would still be counted: judge once both inbox consumers
        // hold nothing pending and nothing unacknowledged.
        let js = async_nats::jetstream::new(self.cluster.client().await.unwrap());
        let consumers = ["inbox-bob".to_string(), "inbox-carol".to_string()];
        let settled = harness::wait_until_async("the inboxes settled", DRAIN, || {
            harness::consumers_settled(&js, "HUB_INBOX", &consumers)
        })
        .await;
        if let Err(e) = settled {
            panic!("{e}\n{}", self.logs());
        }
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap());
        let twice: Vec<_> = ledger.handled.iter().filter(|(_, (c, _))| *c > 1).collect();
        assert!(twice.is_empty(), "DMs handed over twice: {twice:?}");
        let runs = std::fs::read_to_string(self.scene.markers().join("runs")).unwrap_or_default();
        let mut run_counts: HashMap<&str, u32> = HashMap::new();
        for line in runs.lines() {
            let id = line.split(' ').next().unwrap_or_default();
            *run_counts.entry(id).or_default() += 1;
        }
        // A task run more than once (the work consumer handed it to a second worker while a
        // leader was lost): the semantics allow it only flagged as a re-run (TASK_RERUN=1),
        // which each later run must be.
        let mut reruns = 0;
        for (id, n) in &run_counts {
            if *n < 2 {
                continue;
            }
            let lines: Vec<&str> = runs.lines().filter(|l| l.starts_with(id)).collect();
            let unflagged = lines.iter().skip(1).any(|l| !l.ends_with(" 1"));
            assert!(
                !unflagged,
                "a task run again without the re-run flag: {lines:?}\n{}",
                self.logs()
            );
            reruns += n - 1;
        }
        eprintln!("task re-runs (flagged): {reruns}");
        for (id, task) in &ledger.tasks {
            if !task.acked {
                continue;
            }
            let (result, _) = task.result.as_ref().unwrap();
            assert_eq!(result.state, TaskState::Completed, "{result:?}");
            assert!(run_counts.contains_key(id.as_str()), "{id} ran");
            // A direct get may be answered by a replica still catching up (a node just
            // resumed): read until the result the tracker got is there, then count.
            let finals =
                |stored: &[TaskResult]| stored.iter().filter(|r| r.state.is_final()).count();
            let mut stored = super::results_on(&js, id).await;
            let deadline = Instant::now() + super::DEADLINE;
            while finals(&stored) == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                stored = super::results_on(&js, id).await;
            }
            // One final result: the task claim keeps a task handed to a second worker while it
            // runs from running there too (docs/TASKS.md, "One attempt runs a task at a
            // time"), which a leader change did before it.
            assert_eq!(
                finals(&stored),
                1,
                "{id}: one final result stored: {stored:?}"
            );
        }
        for (name, p) in self
            .routers
            .iter_mut()
            .map(|p| ("router", p))
            .chain(self.workers.iter_mut().map(|p| ("worker", p)))
        {
            assert!(!p.has_exited(), "a {name} exited\n{}", p.log());
        }
        eprintln!("{}", summary_of(&ledger));
        let hub = Arc::into_inner(self.hub).expect("the load's sends ended");
        hub.shutdown(Duration::from_secs(10)).await.unwrap();
    }

    /// The ledger's counts, for failure messages.
    fn summary(&self) -> String {
        summary_of(&self.ledger.lock().unwrap())
    }

    /// Every process's and node's log, for failure messages.
    pub fn logs(&self) -> String {
        let names = ["router 0", "router 1", "worker lw1", "worker lw2"];
        let processes: Vec<(&str, &RuntimeProcess)> = names
            .iter()
            .copied()
            .zip(self.routers.iter().chain(self.workers.iter()))
            .collect();
        format!("{}\n{}", logs(&processes), self.cluster.logs())
    }
}

fn summary_of(ledger: &Ledger) -> String {
    let acked = ledger.sent.values().filter(|(_, a)| *a).count();
    let handled = ledger
        .sent
        .iter()
        .filter(|(n, (_, a))| *a && ledger.handled.contains_key(n))
        .count();
    let tasks_acked = ledger.tasks.values().filter(|t| t.acked).count();
    let results = ledger
        .tasks
        .values()
        .filter(|t| t.acked && t.result.is_some())
        .count();
    format!(
        "DMs sent {}, acknowledged {acked}, handled {handled}; tasks delegated {}, \
         acknowledged {tasks_acked}, with a result {results}; not acknowledged: {:?}",
        ledger.sent.len(),
        ledger.tasks.len(),
        ledger.refused
    )
}
