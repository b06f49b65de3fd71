//! How an attempt publishes its status events and results: the acceptance on its own, or a
//! state change as one bundle (with the acceptance when still due), confirmed by the stream,
//! and sent again with the same ids while the outcome is uncertain.

use std::time::Duration;

use protocol::error_chain::ErrorChain;
use protocol::task::{bundle_msg_id, result_msg_id, status_msg_id, StatusEvent, TaskChannelBody};

use super::{Attempt, AttemptError, AttemptState, SavedResult};
use crate::worker::publish::{start_publish, start_publish_bundle, PendingPublish, PublishError};

/// How many times a state change is sent while it is not confirmed.
const PUBLISH_TRIES: u32 = 4;
/// The pause before a try after an error (times the tries so far).
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// How long one try waits for each of its stream acks (a bundle, or each item of a state change
/// too large to bundle, and a status sent before): a quarter of
/// [`PUBLISH_ACK_TIMEOUT`](crate::PUBLISH_ACK_TIMEOUT).
fn try_timeout() -> Duration {
    crate::PUBLISH_ACK_TIMEOUT / PUBLISH_TRIES
}

impl Attempt {
    /// Sends a status event on its own (the acceptance, or a resume's `running`; its ack is
    /// awaited with the next state change's).
    pub(super) async fn send_status(
        &self,
        state: &AttemptState,
        event: StatusEvent,
    ) -> Result<PendingPublish, AttemptError> {
        let msg_id = status_msg_id(&event.event_id);
        start_publish(
            &self.client,
            &self.worker_id,
            &state.channel,
            &msg_id,
            &TaskChannelBody::Status(event),
            Some(&state.span),
        )
        .await
        .map_err(|source| unconfirmed("acceptance", source))
    }

    /// Sends the status event of the state change of `saved` and `saved` itself (one bundle,
    /// with the acceptance first when `acceptance` is still due; or one message per item for
    /// a result too large to share an envelope), and awaits their stream acks together with
    /// `accepted`'s (a status sent while the handler ran). The ids are stable, so sending the
    /// same state change again is deduplicated: a try that is not confirmed — no ack in time
    /// (an uncertain outcome is not a failure), or an error that may pass (no responders
    /// during a leader election, a broken connection) — is sent again after a short pause, up
    /// to [`PUBLISH_TRIES`] times.
    pub(super) async fn send_state_change(
        &self,
        state: &AttemptState,
        saved: &SavedResult,
        acceptance: Option<StatusEvent>,
        accepted: Option<PendingPublish>,
    ) -> Result<(), AttemptError> {
        let mut acceptance = acceptance;
        let mut accepted = accepted;
        let mut tries = 0;
        loop {
            tries += 1;
            let sent = self
                .try_state_change(state, saved, acceptance.clone(), accepted.take())
                .await;
            match sent {
                Ok(()) => return Ok(()),
                Err(
                    e @ (PublishError::Uncertain { .. }
                    | PublishError::Send { .. }
                    | PublishError::Refused { .. }),
                ) if tries < PUBLISH_TRIES => {
                    self.counters.publish_retries.bump();
                    tracing::warn!(task_id = %state.task.task_id, error = %ErrorChain(&e), "state change not confirmed; sending it again");
                    // The acceptance goes in the bundle now (its own publish may be lost too).
                    acceptance = acceptance.or_else(|| Some(self.acceptance_event(state)));
                    // No ack in time already took its time; an error that may pass (no
                    // responders during a leader election, a broken connection) waits a little.
                    if !matches!(e, PublishError::Uncertain { .. }) {
                        tokio::time::sleep(RETRY_PAUSE * tries).await;
                    }
                }
                Err(e) => return Err(unconfirmed("state change", e)),
            }
        }
    }

    async fn try_state_change(
        &self,
        state: &AttemptState,
        saved: &SavedResult,
        acceptance: Option<StatusEvent>,
        accepted: Option<PendingPublish>,
    ) -> Result<(), PublishError> {
        // One status event per state change, with a stable id (the result's seq), stored
        // before the result so that a tracker that stops at the final result has seen it.
        let event = self.status_event(state, saved.seq.max(1), saved.result.state);
        let msg_id = result_msg_id(&state.task.task_id, &state.attempt_id, saved.seq);
        let (task_id, worker, span) = (&state.task.task_id, &self.worker_id, &state.span);
        let channel = &state.channel;
        let status_id = status_msg_id(&event.event_id);
        let status = TaskChannelBody::Status(event);
        let result = TaskChannelBody::Result(saved.result.clone());
        // The acceptance, when still due, goes first.
        let acceptance = acceptance.map(|event| {
            (
                status_msg_id(&event.event_id),
                TaskChannelBody::Status(event),
            )
        });
        let mut items: Vec<(&str, &TaskChannelBody)> = Vec::with_capacity(3);
        if let Some((id, body)) = &acceptance {
            items.push((id, body));
        }
        items.push((&status_id, &status));
        items.push((&msg_id, &result));
        // One ingress message (a bundle the router stores as separate messages), or one per
        // item when the result is too large to share an envelope.
        let bundle = start_publish_bundle(
            &self.client,
            worker,
            channel,
            &bundle_msg_id(task_id, &state.attempt_id, saved.seq, acceptance.is_some()),
            &items,
            Some(span),
        )
        .await?;
        let mut pending = Vec::with_capacity(items.len());
        match bundle {
            Some(bundle) => pending.push(bundle),
            None => {
                for (id, body) in &items {
                    pending.push(
                        start_publish(&self.client, worker, channel, id, body, Some(span)).await?,
                    );
                }
            }
        }
        let within = try_timeout();
        let mut duplicates = 0;
        if let Some(accepted) = accepted {
            duplicates += u64::from(accepted.confirmed(within).await?);
        }
        for publish in pending {
            duplicates += u64::from(publish.confirmed(within).await?);
        }
        self.counters.publish_duplicates.add(duplicates);
        Ok(())
    }
}

fn unconfirmed(what: &str, source: PublishError) -> AttemptError {
    AttemptError::Unconfirmed {
        what: what.to_owned(),
        source,
    }
}
