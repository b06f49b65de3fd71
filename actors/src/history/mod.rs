//! The history actor (router side, durable mode): trims what the inboxes have read, so that the
//! per-inbox cap counts the DMs an agent has not handled yet ([`protocol::history`] holds the
//! rules and why they are safe).
//!
//! A task owned by the actor's state runs a round every `inbox.trim_interval_secs`: it counts
//! the DMs stored per inbox, reads the ack floor of every inbox holding at least half its cap
//! and its first DM stored within the duplicate window, waits [`SETTLE`], reads the advisories
//! stream's last sequence, waits (at most [`CATCH_UP`]) until the advisories consumer acked up
//! to it, then purges each inbox's subject below the lower of its floor plus one and that first
//! DM (16 reads, then 16 purges, at a time). What fails of one inbox is
//! logged and counted and left to the next round; a failure that concerns every inbox (the
//! counts, the advisories) ends the round: nothing is purged on a guess. An inbox whose floor
//! has not moved since its last purge is not purged again. The router nudges the actor
//! ([`Nudge`]) for a round when it refuses a DM for an inbox's read history, as soon as that
//! history is out of the duplicate window. Every
//! router runs the rounds; purging twice removes nothing more.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use async_nats::Client;
use futures::StreamExt;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::history::{
    advisories_caught_up, first_since_request, keep_from, trim_threshold, window_start_ms,
    AdvisoryProgress, CATCH_UP, SETTLE,
};
use protocol::{subjects, AgentId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;

use crate::background::Owned;
use crate::fault::{self, FaultPoint};

mod nudge;

pub use nudge::Nudge;
use nudge::Waited;

/// How often the advisories consumer is looked at while the round waits for it.
const CATCH_UP_POLL: Duration = Duration::from_millis(500);
/// Inboxes whose consumers are read at once.
const CONCURRENT_READS: usize = 16;

/// History actor configuration.
#[derive(Clone)]
pub struct History {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The shared connection.
    pub client: Client,
    /// Stream names, the inbox cap and the trim interval.
    pub delivery: Arc<DeliveryConfig>,
    /// Starts a round before the interval is up (the router's, when it refused a DM for an
    /// inbox's read history).
    pub nudge: Nudge,
}

/// Messages of the history actor.
pub enum HistoryMsg {
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<HistorySnapshot>),
}

crate::counters! {
    /// Counters of the history actor.
    pub struct HistoryCounters => HistorySnapshot {
        /// Rounds started.
        rounds,
        /// Inbox subjects purged of what they had read.
        trimmed_inboxes,
        /// DMs purged (read, below their inbox's ack floor).
        trimmed,
        /// Rounds given up because the advisories consumer did not catch up in time.
        deferred,
        /// Broker requests that failed: an inbox's (its trim waits for the next round) or a
        /// round's (the next one starts over).
        failures,
    }
}

/// State of one incarnation.
pub struct HistoryState {
    counters: Arc<HistoryCounters>,
    stop: watch::Sender<bool>,
    /// The rounds, while inboxes are capped and trimming is on.
    rounds: Option<Owned>,
}

/// Why a round stopped.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A broker request failed.
    #[error("cannot {what}")]
    Request {
        /// What was asked.
        what: String,
        /// Why it failed.
        #[source]
        source: async_nats::Error,
    },
}

/// A [`HistoryError::Request`] for `what`.
fn failed(what: impl Into<String>, source: impl Into<async_nats::Error>) -> HistoryError {
    HistoryError::Request {
        what: what.into(),
        source: source.into(),
    }
}

#[ractor::async_trait]
impl Actor for History {
    type Msg = HistoryMsg;
    type State = HistoryState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<HistoryMsg>,
        _: (),
    ) -> Result<HistoryState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let counters = Arc::new(HistoryCounters::default());
        let (stop, stop_rx) = watch::channel(false);
        let inbox = &self.delivery.inbox;
        let rounds = match (
            inbox.trim_interval(),
            trim_threshold(inbox.max_msgs_per_subject_limit()),
        ) {
            (Some(interval), Some(threshold)) => {
                let trimmer = Trimmer {
                    js: jetstream::new(self.client.clone()),
                    delivery: self.delivery.clone(),
                    counters: counters.clone(),
                    threshold,
                    nudge: self.nudge.clone(),
                    kept: HashMap::new(),
                };
                Some(crate::background::spawn(trimmer.run(interval, stop_rx)))
            }
            _ => None,
        };
        Ok(HistoryState {
            counters,
            stop,
            rounds,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<HistoryMsg>,
        state: &mut HistoryState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop.send(true);
        if let Some(rounds) = state.rounds.take() {
            crate::background::join_within(rounds, Duration::from_secs(2)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<HistoryMsg>,
        msg: HistoryMsg,
        state: &mut HistoryState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            HistoryMsg::Snapshot(port) => {
                let _ = port.send(state.counters.snapshot());
            }
        }
        Ok(())
    }
}

/// What a round needs.
struct Trimmer {
    js: jetstream::Context,
    delivery: Arc<DeliveryConfig>,
    counters: Arc<HistoryCounters>,
    /// DMs stored on an inbox from which it is trimmed.
    threshold: u64,
    nudge: Nudge,
    /// Where each inbox was last purged from: a floor that has not moved since is not purged
    /// again.
    kept: HashMap<AgentId, u64>,
}

impl Trimmer {
    /// A round every `interval`, or at a nudge, until `stop`.
    async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        loop {
            if let Waited::Stopped = self.nudge.wait(interval, &mut stop).await {
                return;
            }
            self.counters.rounds.bump();
            if let Err(e) = self.round(&mut stop).await {
                self.counters.failures.bump();
                tracing::warn!(error = %ErrorChain(&e), "trimming what the inboxes read failed; the next round starts over");
            }
        }
    }

    /// One round: what it could not read or purge of one inbox is logged, counted and left to
    /// the next round; a failure that concerns them all ends the round.
    async fn round(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), HistoryError> {
        let inbox_stream = &self.delivery.inbox.name;
        let stream = self
            .js
            .get_stream_no_info(inbox_stream)
            .await
            .map_err(|e| failed(format!("open stream {inbox_stream}"), e))?;
        let candidates = self.candidates(&stream).await?;
        // Inboxes under the threshold are forgotten (they are read again when back over it).
        let wanted: std::collections::HashSet<&AgentId> = candidates.iter().collect();
        self.kept.retain(|id, _| wanted.contains(id));
        let read: Vec<_> = futures::stream::iter(candidates)
            .map(|id| self.keep_from(id))
            .buffer_unordered(CONCURRENT_READS)
            .collect()
            .await;
        let mut floors = Vec::new();
        for kept in read {
            match kept {
                Ok(Some((id, keep))) if self.kept.get(&id) != Some(&keep) => {
                    floors.push((id, keep))
                }
                Ok(_) => {}
                Err(e) => self.failed(&e),
            }
        }
        if floors.is_empty() {
            return Ok(());
        }
        // Every advisory of a DM at or below these floors is stored by then.
        if !pause(SETTLE, stop).await {
            return Ok(());
        }
        if !self.advisories_caught_up(stop).await? {
            return Ok(());
        }
        let purged: Vec<_> = futures::stream::iter(floors)
            .map(|(id, keep)| {
                let stream = &stream;
                async move {
                    let subject = subjects::inbox(&id);
                    let purged = stream.purge().filter(subject.clone()).sequence(keep).await;
                    (
                        id,
                        keep,
                        purged.map_err(|e| failed(format!("purge {subject}"), e)),
                    )
                }
            })
            .buffer_unordered(CONCURRENT_READS)
            .collect()
            .await;
        for (id, keep, purged) in purged {
            match purged {
                Ok(purged) => {
                    self.counters.trimmed_inboxes.bump();
                    self.counters.trimmed.add(purged.purged);
                    tracing::debug!(%id, keep, purged = purged.purged, "read DMs trimmed");
                    self.kept.insert(id, keep);
                }
                Err(e) => self.failed(&e),
            }
        }
        Ok(())
    }

    /// Counts and logs what failed of one inbox (tried again next round).
    fn failed(&self, e: &HistoryError) {
        self.counters.failures.bump();
        tracing::warn!(error = %ErrorChain(e), "an inbox's read DMs were not trimmed; tried again next round");
    }

    /// The inboxes holding at least [`Self::threshold`] DMs.
    async fn candidates(
        &self,
        stream: &jetstream::stream::Stream<()>,
    ) -> Result<Vec<AgentId>, HistoryError> {
        const WHAT: &str = "count the DMs stored per inbox";
        let mut counts = stream
            .info_with_subjects(subjects::INBOX_FILTER)
            .await
            .map_err(|e| failed(WHAT, e))?;
        let mut candidates = Vec::new();
        while let Some(entry) = counts.next().await {
            let (subject, stored) = entry.map_err(|e| failed(WHAT, e))?;
            if u64::try_from(stored).unwrap_or(u64::MAX) < self.threshold {
                continue;
            }
            if let Ok(id) = subjects::parse_inbox(&subject) {
                candidates.push(id);
            }
        }
        Ok(candidates)
    }

    /// Where `id`'s inbox keeps its DMs from: above its consumer's ack floor, and from its
    /// first DM stored within the duplicate window ([`keep_from`]). `None` when it has no
    /// consumer (an agent that never attached has read nothing) or nothing is to be trimmed.
    async fn keep_from(&self, id: AgentId) -> Result<Option<(AgentId, u64)>, HistoryError> {
        let name = subjects::inbox_consumer(&id);
        let consumer = self
            .js
            .get_consumer_from_stream::<pull::Config, _, _>(&name, &self.delivery.inbox.name)
            .await;
        let floor = match consumer {
            Ok(consumer) => consumer.cached_info().ack_floor.stream_sequence,
            Err(e) if crate::consumers::is_consumer_not_found(&e) => return Ok(None),
            Err(e) => return Err(failed(format!("read consumer {name}"), e)),
        };
        if keep_from(floor, None).is_none() {
            return Ok(None);
        }
        let first_in_window = self.first_in_window(&id).await?;
        Ok(keep_from(floor, first_in_window).map(|keep| (id, keep)))
    }

    /// The sequence of `id`'s first DM stored within the duplicate window (one direct get by
    /// time); `None` when there is none.
    async fn first_in_window(&self, id: &AgentId) -> Result<Option<u64>, HistoryError> {
        let since = window_start_ms(protocol::expiry::now_ms(), self.delivery.duplicate_window());
        let subject = subjects::inbox(id);
        let what = || format!("read the first DM of {subject} within the duplicate window");
        let request = subjects::direct_get_request(&self.delivery.inbox.name);
        let reply = self
            .js
            .client()
            .request(request, first_since_request(&subject, since).into())
            .await
            .map_err(|e| failed(what(), e))?;
        if reply.status == Some(async_nats::StatusCode::NOT_FOUND) {
            return Ok(None);
        }
        let seq = reply
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_SEQUENCE))
            .and_then(|v| v.as_str().parse::<u64>().ok());
        match seq {
            Some(seq) => Ok(Some(seq)),
            None => Err(failed(
                what(),
                format!(
                    "no sequence in the reply (status {:?}: {:?})",
                    reply.status, reply.description
                ),
            )),
        }
    }

    /// Whether the advisories consumer acked everything the advisories stream holds now, within
    /// [`CATCH_UP`] (`false`, counted `deferred`, when it did not, or the actor stops).
    async fn advisories_caught_up(
        &self,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, HistoryError> {
        let stream_name = subjects::ADVISORIES_STREAM;
        let last_seq = self
            .js
            .get_stream(stream_name)
            .await
            .map_err(|e| failed(format!("read stream {stream_name}"), e))?
            .cached_info()
            .state
            .last_sequence;
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            let name = subjects::ADVISORIES_CONSUMER;
            let consumer = self
                .js
                .get_consumer_from_stream::<pull::Config, _, _>(name, stream_name)
                .await
                .map_err(|e| failed(format!("read consumer {name}"), e))?;
            let info = consumer.cached_info();
            let progress = AdvisoryProgress {
                ack_floor: info.ack_floor.stream_sequence,
                pending: info.num_pending,
                ack_pending: u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
            };
            if advisories_caught_up(last_seq, progress) {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                self.counters.deferred.bump();
                tracing::warn!(
                    last_seq,
                    ?progress,
                    "the advisories consumer did not catch up; no inbox trimmed this round"
                );
                return Ok(false);
            }
            if !pause(CATCH_UP_POLL, stop).await {
                return Ok(false);
            }
        }
    }
}

/// Waits `period`, or until `stop` (`false`).
async fn pause(period: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        _ = stop.changed() => false,
        () = tokio::time::sleep(period) => true,
    }
}
