//! The consumer watchdog (router side, durable mode): every [`Watchdog::interval`] it reads
//! each consumer of the work-queue streams that allow direct gets (the ingress, the work and
//! the answers streams), with the oldest message its stream holds on the consumer's filter,
//! and lets [`protocol::watchdog::judge`] say whether the consumer stopped delivering what the
//! stream holds for it. A consumer found stalled at two checks in a row is reset to that
//! message (`$JS.API.CONSUMER.RESET`, nats-server 2.14+), so it delivers it, and what follows
//! it, again: copies of what was in flight meanwhile are redeliveries, which the routers'
//! dedupe, the workers' channel reads and task claims already take care of.
//!
//! The checks run off the mailbox, in a task the actor's state owns; a check that fails (a
//! broker request timing out, a consumer deleted meanwhile) is counted and tried at the next
//! round. Every router runs one; two that reset the same consumer only redeliver twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream::DirectGetErrorKind};
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::subjects;
use protocol::watchdog::{judge, Sight, Verdict};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::background::Owned;
use crate::fault::{self, FaultPoint};

/// How long one broker request of a check may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Watchdog actor configuration.
#[derive(Clone)]
pub struct Watchdog {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The shared connection.
    pub client: async_nats::Client,
    /// Stream names.
    pub delivery: Arc<DeliveryConfig>,
    /// Time between two checks of a consumer (`consumer_watchdog_secs`).
    pub interval: Duration,
    /// Its counters, shared with the router's snapshot (they outlive a restart of the actor).
    pub counters: Arc<WatchdogCounters>,
}

/// Messages of the watchdog actor.
pub enum WatchdogMsg {
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<WatchdogSnapshot>),
}

crate::counters! {
    /// Counters of the watchdog actor.
    pub struct WatchdogCounters => WatchdogSnapshot {
        /// Consumers checked (one per consumer per round).
        checks,
        /// Checks that found the oldest held message unaccounted for (once: suspected).
        suspects,
        /// Consumers found stalled (the same message unaccounted for twice) and reset.
        resets,
        /// Resets the broker refused or did not answer (tried again at the next round).
        reset_errors,
        /// Checks that could not read a consumer or its stream (tried at the next round).
        read_errors,
    }
}

/// State of one incarnation.
pub struct WatchdogState {
    counters: Arc<WatchdogCounters>,
    _rounds: Owned,
}

/// Why a consumer could not be checked or reset.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A broker request failed.
    #[error("cannot {what} of {stream}")]
    Broker {
        /// What was asked.
        what: &'static str,
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: async_nats::Error,
    },
    /// A request did not come back in time.
    #[error("{what} of {stream} timed out")]
    TimedOut {
        /// What was asked.
        what: &'static str,
        /// The stream.
        stream: String,
    },
    /// The broker refused a reset.
    #[error("the reset of {consumer} on {stream} was refused: {reason}")]
    ResetRefused {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The broker's error description.
        reason: String,
    },
}

#[ractor::async_trait]
impl Actor for Watchdog {
    type Msg = WatchdogMsg;
    type State = WatchdogState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<WatchdogMsg>,
        _: (),
    ) -> Result<WatchdogState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let counters = self.counters.clone();
        let rounds = Rounds {
            js: jetstream::new(self.client.clone()),
            client: self.client.clone(),
            streams: vec![
                self.delivery.ingress.name.clone(),
                subjects::WORK_STREAM.to_owned(),
                subjects::ANSWERS_STREAM.to_owned(),
            ],
            counters: counters.clone(),
            verdicts: HashMap::new(),
        };
        let interval = self.interval;
        Ok(WatchdogState {
            counters,
            _rounds: crate::background::spawn(rounds.run(interval)),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<WatchdogMsg>,
        msg: WatchdogMsg,
        state: &mut WatchdogState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            WatchdogMsg::Snapshot(port) => {
                let _ = port.send(state.counters.snapshot());
            }
        }
        Ok(())
    }
}

/// The rounds of checks: what they read, and each consumer's last verdict.
struct Rounds {
    js: jetstream::Context,
    client: async_nats::Client,
    streams: Vec<String>,
    counters: Arc<WatchdogCounters>,
    /// By (stream, consumer).
    verdicts: HashMap<(String, String), Verdict>,
}

impl Rounds {
    async fn run(mut self, interval: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let mut seen = HashMap::new();
            for stream in self.streams.clone() {
                if let Err(e) = self.round(&stream, &mut seen).await {
                    self.counters.read_errors.bump();
                    tracing::debug!(%stream, error = %ErrorChain(&e), "watchdog round failed; tried again at the next");
                }
            }
            // Consumers gone since are forgotten.
            self.verdicts = seen;
        }
    }

    /// Checks every consumer of `stream`, recording its verdict in `seen`.
    async fn round(
        &mut self,
        stream: &str,
        seen: &mut HashMap<(String, String), Verdict>,
    ) -> Result<(), WatchError> {
        let handle = timed("read the stream", stream, async {
            self.js
                .get_stream_no_info(stream)
                .await
                .map_err(async_nats::Error::from)
        })
        .await?;
        let infos: Vec<_> = timed("list the consumers", stream, async {
            Ok(handle.consumers().collect::<Vec<_>>().await)
        })
        .await?;
        for info in infos {
            let (name, config) = match info {
                Ok(info) => (info.name, info.config),
                Err(e) => {
                    self.counters.read_errors.bump();
                    tracing::debug!(%stream, error = %ErrorChain(&e), "a consumer could not be listed");
                    continue;
                }
            };
            self.counters.checks.bump();
            let key = (stream.to_owned(), name.clone());
            let sight = match sight_of(&handle, stream, &name, &config).await {
                Ok(Some(sight)) => sight,
                // The stream moved on between the reads: no judgement this round.
                Ok(None) => {
                    seen.insert(key, Verdict::Healthy);
                    continue;
                }
                Err(e) => {
                    self.counters.read_errors.bump();
                    tracing::debug!(%stream, consumer = %name, error = %ErrorChain(&e), "the consumer or its oldest held message could not be read");
                    continue;
                }
            };
            let verdict = judge(self.verdicts.get(&key).copied(), &sight);
            match verdict {
                Verdict::Healthy => {}
                Verdict::Suspect { seq, why } => {
                    self.counters.suspects.bump();
                    tracing::info!(%stream, consumer = %name, seq, ?why, ?sight, "a held message the consumer does not account for; checked again");
                }
                Verdict::Stalled { seq, why } => {
                    tracing::warn!(%stream, consumer = %name, seq, ?why, ?sight, "consumer stalled: reset to deliver again from the message it lost");
                    match reset(&self.client, stream, &name, seq).await {
                        Ok(()) => self.counters.resets.bump(),
                        Err(e) => {
                            self.counters.reset_errors.bump();
                            tracing::warn!(%stream, consumer = %name, error = %ErrorChain(&e), "consumer reset failed; tried at the next round");
                        }
                    }
                }
            }
            seen.insert(key, verdict);
        }
        Ok(())
    }
}

/// What `stream` and its consumer `name` say, read in the order that keeps a message stored
/// or acked meanwhile from looking lost: the oldest held message, the consumer's state, the
/// oldest held message again. `None` when the two reads of the oldest differ (the stream moved
/// on: nothing to judge).
async fn sight_of(
    handle: &jetstream::stream::Stream<()>,
    stream: &str,
    name: &str,
    config: &jetstream::consumer::Config,
) -> Result<Option<Sight>, WatchError> {
    let before = oldest_held(handle, stream, config).await?;
    let info = timed("read a consumer", stream, async {
        handle
            .consumer_info(name)
            .await
            .map_err(async_nats::Error::from)
    })
    .await?;
    let after = oldest_held(handle, stream, config).await?;
    if before != after {
        return Ok(None);
    }
    Ok(Some(Sight {
        oldest_held: after,
        pending: info.num_pending,
        ack_pending: u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
        delivered_stream_seq: info.delivered.stream_sequence,
        ack_floor_stream_seq: info.ack_floor.stream_sequence,
    }))
}

/// The stream sequence of the oldest message `stream` holds on `config`'s filters (every
/// subject when it has none).
async fn oldest_held(
    handle: &jetstream::stream::Stream<()>,
    stream: &str,
    config: &jetstream::consumer::Config,
) -> Result<Option<u64>, WatchError> {
    let mut filters = config.filter_subjects.clone();
    if !config.filter_subject.is_empty() {
        filters.push(config.filter_subject.clone());
    }
    if filters.is_empty() {
        filters.push(">".to_owned());
    }
    let mut oldest: Option<u64> = None;
    for filter in filters {
        let got = tokio::time::timeout(
            REQUEST_TIMEOUT,
            handle.direct_get_next_for_subject(filter, Some(1)),
        )
        .await;
        match got {
            Err(_) => {
                return Err(WatchError::TimedOut {
                    what: "read the oldest message",
                    stream: stream.to_owned(),
                })
            }
            Ok(Ok(message)) => {
                oldest = Some(oldest.map_or(message.sequence, |o| o.min(message.sequence)));
            }
            Ok(Err(e)) if e.kind() == DirectGetErrorKind::NotFound => {}
            Ok(Err(e)) => {
                return Err(WatchError::Broker {
                    what: "read the oldest message",
                    stream: stream.to_owned(),
                    source: e.into(),
                })
            }
        }
    }
    Ok(oldest)
}

/// Resets `consumer` of `stream` to deliver again from stream sequence `seq`.
///
/// # Errors
/// [`WatchError`]: the request failed, timed out, or the broker refused it.
pub async fn reset(
    client: &async_nats::Client,
    stream: &str,
    consumer: &str,
    seq: u64,
) -> Result<(), WatchError> {
    let body = serde_json::json!({ "seq": seq }).to_string();
    let reply = timed("reset a consumer", stream, async {
        client
            .request(
                subjects::consumer_reset_request(stream, consumer),
                body.into(),
            )
            .await
            .map_err(async_nats::Error::from)
    })
    .await?;
    #[derive(serde::Deserialize)]
    struct Refusal {
        description: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        error: Option<Refusal>,
    }
    match serde_json::from_slice::<Answer>(&reply.payload) {
        Ok(Answer { error: None }) => Ok(()),
        Ok(Answer { error: Some(r) }) => Err(WatchError::ResetRefused {
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            reason: r.description.unwrap_or_default(),
        }),
        Err(e) => Err(WatchError::Broker {
            what: "read the reset's answer",
            stream: stream.to_owned(),
            source: e.into(),
        }),
    }
}

/// `request`, bounded by [`REQUEST_TIMEOUT`].
async fn timed<T>(
    what: &'static str,
    stream: &str,
    request: impl std::future::Future<Output = Result<T, async_nats::Error>>,
) -> Result<T, WatchError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Err(_) => Err(WatchError::TimedOut {
            what,
            stream: stream.to_owned(),
        }),
        Ok(Err(source)) => Err(WatchError::Broker {
            what,
            stream: stream.to_owned(),
            source,
        }),
        Ok(Ok(value)) => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};

    /// A hub's streams on a fresh nats-server and a queue consumer `queue-q` on the work
    /// stream.
    async fn hub() -> (harness::NatsServer, jetstream::Context, PullConsumer) {
        let server = harness::run_server().await.expect("nats-server");
        let client = server.client().await.unwrap();
        let js = jetstream::new(client);
        crate::streams::ensure_streams(&js, &DeliveryConfig::default())
            .await
            .unwrap();
        let consumer: PullConsumer = js
            .create_consumer_on_stream(
                pull::Config {
                    durable_name: Some("queue-q".into()),
                    filter_subject: "work.q".into(),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                },
                subjects::WORK_STREAM,
            )
            .await
            .unwrap();
        (server, js, consumer)
    }

    /// The watchdog of the hub of `js`, watching every 300 ms.
    async fn watch(js: &jetstream::Context) -> ActorRef<WatchdogMsg> {
        let (actor, _join) = Actor::spawn(
            None,
            Watchdog {
                name: "watchdog-test".into(),
                client: js.client(),
                delivery: Arc::new(DeliveryConfig::default()),
                interval: Duration::from_millis(300),
                counters: Arc::default(),
            },
            (),
        )
        .await
        .unwrap();
        actor
    }

    async fn snapshot(actor: &ActorRef<WatchdogMsg>) -> WatchdogSnapshot {
        ractor::call_t!(actor, WatchdogMsg::Snapshot, 1000).unwrap()
    }

    async fn fetch_one(consumer: &PullConsumer) -> Option<jetstream::Message> {
        let mut batch = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        batch.next().await.map(|m| m.unwrap())
    }

    #[tokio::test]
    async fn a_consumer_that_lost_a_held_message_is_reset_to_it_and_delivers_it() {
        let (_server, js, consumer) = hub().await;
        for n in 1..=3 {
            js.publish("work.q", format!("t{n}").into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        // The consumer's state goes ahead of its stream's, as after a power loss: it takes
        // the three held messages for acked and has nothing pending.
        reset(&js.client(), subjects::WORK_STREAM, "queue-q", 4)
            .await
            .unwrap();
        assert!(
            fetch_one(&consumer).await.is_none(),
            "the consumer lost them"
        );
        let actor = watch(&js).await;
        // The watchdog sees it twice, resets it to the oldest, and all three come again.
        harness::wait_until_async(
            "the watchdog resets the consumer",
            Duration::from_secs(10),
            || async { snapshot(&actor).await.resets >= 1 },
        )
        .await
        .unwrap();
        let mut got = Vec::new();
        while let Some(msg) = fetch_one(&consumer).await {
            got.push(String::from_utf8(msg.payload.to_vec()).unwrap());
            msg.double_ack().await.unwrap();
        }
        assert_eq!(got, ["t1", "t2", "t3"]);
        let s = snapshot(&actor).await;
        assert_eq!((s.resets, s.reset_errors), (1, 0), "{s:?}");
    }

    #[tokio::test]
    async fn a_busy_consumer_that_accounts_for_what_is_held_is_never_reset() {
        let (_server, js, consumer) = hub().await;
        let actor = watch(&js).await;
        // Messages stored and acked all along, one held unacked for a while (a long task),
        // and one nak'd with a delay: each is pending or awaiting its ack.
        js.publish("work.q", "long".into())
            .await
            .unwrap()
            .await
            .unwrap();
        let long = fetch_one(&consumer).await.unwrap();
        js.publish("work.q", "later".into())
            .await
            .unwrap()
            .await
            .unwrap();
        let later = fetch_one(&consumer).await.unwrap();
        later
            .ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(60))))
            .await
            .unwrap();
        let until = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut n = 0;
        while tokio::time::Instant::now() < until {
            js.publish("work.q", format!("m{n}").into())
                .await
                .unwrap()
                .await
                .unwrap();
            let msg = fetch_one(&consumer).await.expect("the new message");
            msg.double_ack().await.unwrap();
            long.ack_with(jetstream::AckKind::Progress).await.unwrap();
            n += 1;
        }
        let s = snapshot(&actor).await;
        assert!(s.checks >= 5, "the watchdog checked: {s:?}");
        assert_eq!((s.suspects, s.resets), (0, 0), "{s:?}");
    }
}
