//! The task claim of an attempt ([`protocol::task::Claim`], [`crate::task_claim`]): taken off
//! the mailbox before the handler runs (or an expired task's result goes out), renewed with
//! the input's heartbeats, released only when a graceful shutdown hands the input back (else
//! it lapses one ack wait after the attempt ends).
//! A claim held by another attempt makes the attempt stand down: its input is nak'd until the
//! claim lapses, so a task in flight runs once, however often it is delivered.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use protocol::error_chain::ErrorChain;
use protocol::task::{claim_ttl, Claim, DeliveryPlan};
use ractor::ActorRef;

use super::{now_ms, Attempt, AttemptError, AttemptMsg, AttemptState, Phase, RETRY_DELAY};
use crate::task_claim::{ClaimEntry, ClaimError, Taken, Written};

impl Attempt {
    /// Takes the task's claim before acting on `plan`, off the mailbox:
    /// [`AttemptMsg::Claimed`] brings the outcome. An input that names no queue (none does)
    /// is acted on unclaimed.
    pub(super) fn take_claim(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        plan: DeliveryPlan,
    ) {
        state.planned = Some(plan);
        let (Some(entry), Some(ack_wait)) = (self.claim_entry(state), self.ack_wait.clone()) else {
            tracing::warn!(task_id = %state.task.task_id, "a task input without a queue in its subject runs unclaimed");
            let _ = myself.cast(AttemptMsg::Claimed(Ok(Taken::Mine(0))));
            return;
        };
        let mine = self.claim_of(state);
        let me = myself.clone();
        // Run unread, the input is provably fresh: its key is free, so one write takes it.
        let fresh = !state.record_read;
        state.pending = Some(crate::background::spawn(async move {
            let ack_wait = *ack_wait.borrow();
            let taken = if fresh {
                crate::task_claim::take_fresh(&entry, &mine, ack_wait, now_ms).await
            } else {
                crate::task_claim::take(&entry, &mine, ack_wait, now_ms).await
            };
            let _ = me.cast(AttemptMsg::Claimed(taken));
        }));
    }

    /// The claim was taken, is held elsewhere, or could not be read or written.
    pub(super) async fn on_claimed(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        taken: Result<Taken, ClaimError>,
    ) -> Result<(), AttemptError> {
        let Some(plan) = state.planned.take() else {
            return Ok(());
        };
        match taken {
            Ok(Taken::Mine(revision)) => {
                self.counters.claims_taken.bump();
                state.claimed = true;
                if revision > 0 {
                    self.start_lease(state, revision);
                }
                if state.cancel_requested() {
                    return self
                        .finish(myself, state, protocol::task::Outcome::Cancelled)
                        .await;
                }
                self.act_on(myself, state, plan).await
            }
            Ok(Taken::Held { delay }) => {
                self.counters.stood_down.bump();
                if !state.record_read {
                    // Run unread as provably fresh, yet held: read what the holder stored
                    // (a final result settles the input at once).
                    self.spawn_read(myself, state, true);
                    return Ok(());
                }
                tracing::info!(task_id = %state.task.task_id, ?delay, "the task is claimed by another attempt: stood down");
                self.stand_down(myself, state, delay, "task claimed by another attempt")
                    .await;
                Ok(())
            }
            Err(e) => {
                self.counters.claim_errors.bump();
                tracing::warn!(task_id = %state.task.task_id, error = %ErrorChain(&e), "cannot take the task's claim; the input is nak'd");
                self.stand_down(myself, state, RETRY_DELAY * 2, "task claim unavailable")
                    .await;
                Ok(())
            }
        }
    }

    /// Leaves the input for later without running anything: nak'd with `delay`, a fresh
    /// admission forgotten (unless parked), the actor stopped.
    pub(super) async fn stand_down(
        &self,
        myself: &ActorRef<AttemptMsg>,
        state: &mut AttemptState,
        delay: Duration,
        why: &str,
    ) {
        state.phase = Phase::Settling;
        state.heartbeat = None;
        if state.fresh_admission {
            self.forget_unless_parked(state);
        }
        if let Some(input) = state.input.take() {
            let _ = input.ack_with(AckKind::Nak(Some(delay))).await;
        }
        myself.stop(Some(why.into()));
    }

    /// Renews the claim (at `revision`) at every heartbeat, with the TTL of the input's ack
    /// wait then; a renewal that finds another attempt's claim (this one lapsed: renewals
    /// failed for an ack wait) stops renewing and is counted.
    fn start_lease(&self, state: &mut AttemptState, revision: u64) {
        let (Some(entry), Some(ack_wait)) = (self.claim_entry(state), self.ack_wait.clone()) else {
            return;
        };
        let (claim, counters) = (self.claim_of(state), self.counters.clone());
        let task_id = state.task.task_id.clone();
        let last = state.claim_revision.clone();
        last.store(revision, Ordering::SeqCst);
        let paced = ack_wait.clone();
        state.lease = Some(crate::background::spawn(
            super::super::ack_waits::heartbeat(paced, move || {
                let (entry, claim, counters, last) =
                    (entry.clone(), claim.clone(), counters.clone(), last.clone());
                let (ttl, task_id) = (claim_ttl(*ack_wait.borrow()), task_id.clone());
                async move {
                    let expect = last.load(Ordering::SeqCst);
                    if expect == 0 {
                        return;
                    }
                    match entry.write(&claim, expect, ttl).await {
                        Ok(Written::Stored(revision)) => {
                            last.store(revision, Ordering::SeqCst);
                            counters.claim_renewals.bump();
                        }
                        Ok(Written::Conflict) => {
                            last.store(0, Ordering::SeqCst);
                            counters.claims_lost.bump();
                            tracing::warn!(%task_id, "the task's claim lapsed and another attempt took it: this run may overlap another");
                        }
                        Err(e) => {
                            tracing::warn!(%task_id, error = %ErrorChain(&e), "claim renewal failed; tried again at the next heartbeat")
                        }
                    }
                }
            }),
        ));
    }

    /// Releases the claim this attempt holds (a delete marker expecting its last revision,
    /// lapsing like a claim), so that another worker takes the task at once; called once the
    /// handler has ended. A claim lost meanwhile, or a release that fails, is left to lapse.
    pub(super) async fn release_claim(&self, state: &mut AttemptState) {
        state.lease = None;
        let revision = state.claim_revision.swap(0, Ordering::SeqCst);
        let (Some(entry), Some(ack_wait)) = (self.claim_entry(state), self.ack_wait.as_ref())
        else {
            return;
        };
        if revision == 0 {
            return;
        }
        let ttl = claim_ttl(*ack_wait.borrow());
        match entry.release(revision, ttl).await {
            Ok(Written::Stored(_)) => self.counters.claims_released.bump(),
            Ok(Written::Conflict) => {
                tracing::debug!(task_id = %state.task.task_id, "the claim changed before its release: left as it is")
            }
            Err(e) => {
                tracing::warn!(task_id = %state.task.task_id, error = %ErrorChain(&e), "cannot release the task's claim; it lapses after the ack wait")
            }
        }
    }

    /// The claim entry of the attempt's task, under its input's queue.
    fn claim_entry(&self, state: &AttemptState) -> Option<ClaimEntry> {
        let input = state.input.as_ref()?;
        let (queue, _) = protocol::subjects::parse_work(&input.subject).ok()?;
        Some(ClaimEntry::new(&self.client, &queue, &state.channel))
    }

    fn claim_of(&self, state: &AttemptState) -> Claim {
        Claim {
            attempt_id: state.attempt_id.clone(),
            worker_id: self.worker_id.clone(),
        }
    }
}
