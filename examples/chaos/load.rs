//! The load of a chaos run and its ledger: DMs between four senders and four recipients, and
//! tasks delegated to the workers' queue, each tracked; all from one in-process system (its
//! router not started: the router processes route).
//!
//! Every send and delegation is spawned on a steady clock, so one held up by a fault does not
//! slow the rest. The recipients' handlers write down every DM they are handed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::config::DeliveryConfig;
use protocol::task::TaskResult;
use protocol::{AgentId, QueueName, TaskId};
use runtime::{new_task, ActorSystem, Delivery, NatsSettings, SystemError};
use tokio::task::JoinSet;

use crate::processes::QUEUE;

/// The senders of DMs (and the delegator of tasks: the first).
pub const SENDERS: [&str; 4] = ["sender-0", "sender-1", "sender-2", "sender-3"];
/// The recipients of DMs, whose inboxes the load holds.
pub const RECIPIENTS: [&str; 4] = ["recipient-0", "recipient-1", "recipient-2", "recipient-3"];

/// What the load sent and what came of it.
#[derive(Default)]
pub struct Ledger {
    /// Per DM number: whether the ingress acknowledged it (`None` while its send runs).
    pub dms: BTreeMap<u64, Option<bool>>,
    /// Per DM number: how many times a handler was handed it.
    pub handled: HashMap<u64, u32>,
    /// Handovers flagged `redelivered` (the server delivered it before).
    pub flagged_redelivered: u64,
    /// DMs handed over that the load did not send (a body that is no DM number).
    pub foreign: u64,
    /// Per task: whether the ingress acknowledged it (`None` while its delegation runs), and
    /// the final result its tracker got.
    pub tasks: BTreeMap<TaskId, (Option<bool>, Option<TaskResult>)>,
    /// Why sends and delegations were not acknowledged, with how many.
    pub refused: BTreeMap<String, usize>,
}

impl Ledger {
    /// How much of the load has come through: DMs handed over and tasks with a result.
    pub fn through(&self) -> u64 {
        let tasks = self.tasks.values().filter(|(_, r)| r.is_some()).count();
        self.handled.len() as u64 + tasks as u64
    }

    /// Whether everything acknowledged came through.
    pub fn complete(&self) -> bool {
        let dms = self
            .dms
            .iter()
            .filter(|(_, acked)| **acked == Some(true))
            .all(|(n, _)| self.handled.contains_key(n));
        let tasks = self
            .tasks
            .values()
            .filter(|(acked, _)| *acked == Some(true))
            .all(|(_, result)| result.is_some());
        dms && tasks
    }
}

/// The in-process system that sends the load and holds the recipients' inboxes.
pub struct Load {
    /// The system.
    pub hub: Arc<ActorSystem>,
    /// The ledger, shared with the sends, trackers and handlers.
    pub ledger: Arc<Mutex<Ledger>>,
}

impl Load {
    /// Connects to `urls` and attaches the recipients' inboxes.
    ///
    /// # Errors
    /// When the system cannot be built or an inbox cannot be attached.
    pub async fn start(urls: &str, delivery: DeliveryConfig) -> Result<Load, SystemError> {
        let hub = ActorSystem::builder()
            .nats(NatsSettings::new(urls))
            .durable(true)
            .delivery_config(delivery)
            .build()
            .await?;
        let load = Load {
            hub: Arc::new(hub),
            ledger: Arc::default(),
        };
        for name in RECIPIENTS {
            let ledger = load.ledger.clone();
            let id = AgentId::new(name).expect("a valid agent id");
            load.hub
                .attach_inbox(&id, move |d: Delivery| {
                    let mut ledger = ledger.lock().unwrap();
                    match d.envelope.body.as_u64() {
                        Some(n) => *ledger.handled.entry(n).or_default() += 1,
                        None => ledger.foreign += 1,
                    }
                    ledger.flagged_redelivered += u64::from(d.redelivered);
                    async {}
                })
                .await?;
        }
        Ok(load)
    }

    /// Sends `dms` DMs and delegates `tasks` tasks, each spread evenly over `over`. The task
    /// ends once every send and delegation is acknowledged or refused, and hands back the
    /// trackers still waiting for results (they end when dropped).
    pub fn drive(
        &self,
        dms: u64,
        tasks: u64,
        over: Duration,
    ) -> tokio::task::JoinHandle<JoinSet<()>> {
        let (hub, ledger) = (self.hub.clone(), self.ledger.clone());
        tokio::spawn(async move {
            let senders: Vec<AgentId> = SENDERS.iter().map(|s| AgentId::new(*s).unwrap()).collect();
            let recipients: Vec<AgentId> = RECIPIENTS
                .iter()
                .map(|s| AgentId::new(*s).unwrap())
                .collect();
            let queue = QueueName::new(QUEUE).expect("a valid queue name");
            let mut sends = JoinSet::new();
            let mut trackers = JoinSet::new();
            let mut dm_clock =
                tokio::time::interval(over / u32::try_from(dms.max(1)).unwrap_or(u32::MAX));
            let mut task_clock =
                tokio::time::interval(over / u32::try_from(tasks.max(1)).unwrap_or(u32::MAX));
            let (mut sent, mut delegated) = (0u64, 0u64);
            while sent < dms || delegated < tasks {
                tokio::select! {
                    _ = dm_clock.tick(), if sent < dms => {
                        let n = sent;
                        sent += 1;
                        // Every sender writes to every recipient: DM n goes from n % 4 to n / 4 % 4.
                        let from = senders[usize::try_from(n % 4).unwrap()].clone();
                        let to = recipients[usize::try_from(n / 4 % 4).unwrap()].clone();
                        ledger.lock().unwrap().dms.insert(n, None);
                        let (hub, ledger) = (hub.clone(), ledger.clone());
                        sends.spawn(async move {
                            let sent = hub.send(&from, &to, serde_json::json!(n)).await;
                            let mut ledger = ledger.lock().unwrap();
                            ledger.dms.insert(n, Some(sent.is_ok()));
                            if let Err(e) = sent {
                                let why = protocol::error_chain::ErrorChain(&e).to_string();
                                *ledger.refused.entry(why).or_default() += 1;
                            }
                            None
                        });
                    }
                    _ = task_clock.tick(), if delegated < tasks => {
                        delegated += 1;
                        let spec = new_task("chaos", vec![]);
                        let id = spec.task_id.clone();
                        ledger.lock().unwrap().tasks.insert(id.clone(), (None, None));
                        let (hub, ledger) = (hub.clone(), ledger.clone());
                        let (from, queue) = (senders[0].clone(), queue.clone());
                        sends.spawn(async move {
                            let delegated = hub.delegate_tracked(&from, &queue, None, &spec).await;
                            let mut ledger_now = ledger.lock().unwrap();
                            ledger_now.tasks.get_mut(&id).unwrap().0 = Some(delegated.is_ok());
                            match delegated {
                                Ok((_, tracking)) => Some((id, tracking)),
                                Err(e) => {
                                    let why = protocol::error_chain::ErrorChain(&e).to_string();
                                    *ledger_now.refused.entry(why).or_default() += 1;
                                    None
                                }
                            }
                            .map(|(id, tracking)| (id, tracking, ledger.clone()))
                        });
                    }
                    Some(done) = sends.join_next(), if !sends.is_empty() => {
                        track(&mut trackers, done);
                    }
                }
            }
            while let Some(done) = sends.join_next().await {
                track(&mut trackers, done);
            }
            trackers
        })
    }
}

/// What a finished send or delegation hands back: a delegation's tracking, to wait on.
type Sent = Option<(TaskId, runtime::system::tasks::Tracking, Arc<Mutex<Ledger>>)>;

/// Spawns the wait for a delegated task's final result, written to the ledger when it comes.
fn track(trackers: &mut JoinSet<()>, done: Result<Sent, tokio::task::JoinError>) {
    let Ok(Some((id, tracking, ledger))) = done else {
        return;
    };
    trackers.spawn(async move {
        if let Ok(result) = tracking.result.await {
            let mut ledger = ledger.lock().unwrap();
            ledger.tasks.get_mut(&id).unwrap().1.get_or_insert(result);
        }
    });
}
