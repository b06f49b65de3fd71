//! A DM the broker refused for a limit: its sender is told, and the ingress message ends.
//!
//! `HUB_INBOX` discards new messages (per subject too), so a DM to a full inbox is refused by
//! the broker instead of an older DM being dropped. The router reads that publish-ack error
//! ([`protocol::backpressure::store_refusal`]), stores a rejection for the sender in its own
//! inbox (kind `inbox_full` with `retry_after_secs`, or `too_large`), and terminates the ingress
//! message. A refusal notice the sender's own full inbox refuses too is dropped and counted
//! (`notices_dropped`): retrying it could never end. A DM of a sender over its rate
//! (`sender_rate_per_min`) is refused the same way, kind `rate_limited`, before it is stored,
//! and a DM to a removed agent (its tombstone in `HUB_REMOVED`) with kind `recipient_deleted`.

use async_nats::jetstream;
use protocol::backpressure::{
    hold_of, inbox_full_retry_after, Hold, StoreRefusal, DEFAULT_RETRY_AFTER_SECS,
};
use protocol::error_chain::ErrorChain;
use protocol::history::history_retry;
use protocol::rejection::refusal;
use protocol::{AgentId, Codec, MessageId, WireError, WireErrorKind};

use super::counters::RouterCounters;
use super::outbound::routed_headers;
use super::outcome::{store_notice, Done, Pending};

/// The DM a refusal would be about.
#[derive(Clone)]
pub(super) struct Refusable {
    /// Its sender (who is told).
    pub from: AgentId,
    /// Its recipient.
    pub to: AgentId,
    /// Its `meta.id`.
    pub id: MessageId,
    /// Its ingress sequence (the notice's id).
    pub seq: u64,
}

/// Refuses DMs: what the pump lends to tell their senders.
pub(super) struct Refusals<'a> {
    /// The connection.
    pub client: &'a async_nats::Client,
    /// The inbox stream and its limits.
    pub delivery: &'a protocol::config::DeliveryConfig,
    /// Where refusals and dropped notices are counted.
    pub counters: &'a std::sync::Arc<RouterCounters>,
    /// Where a refusal's `rejected` event goes.
    pub audit: &'a crate::audit::Auditor,
    /// Asks for a trim round when the refusal is for read history.
    pub history: &'a crate::history::Nudge,
}

impl Refusals<'_> {
    /// The broker refused `dm` for `what`: its sender's rejection notice is stored (and its
    /// hold), then the ingress message is terminated.
    pub(super) async fn refuse(&self, what: StoreRefusal, dm: Refusable) -> Done {
        // Its store acks are waited for as the pump's are ([`crate::PUBLISH_ACK_TIMEOUT`]).
        let js = jetstream::ContextBuilder::new()
            .timeout(crate::PUBLISH_ACK_TIMEOUT)
            .build(self.client.clone());
        self.counters.refused_full.bump();
        let (kind, detail, retry_after) = match what {
            StoreRefusal::SubjectFull => (
                WireErrorKind::InboxFull,
                format!("the inbox of {} holds as many messages as it may", dm.to),
                Some(self.subject_full_retry_after(&js, &dm.to).await),
            ),
            StoreRefusal::StreamFull => (
                WireErrorKind::InboxFull,
                "the hub's inbox stream is full".to_owned(),
                Some(DEFAULT_RETRY_AFTER_SECS),
            ),
            StoreRefusal::TooLarge => (
                WireErrorKind::TooLarge,
                "the message is over the inbox stream's max_msg_size".to_owned(),
                None,
            ),
        };
        let error = WireError::new(kind, detail);
        notify(&js, self.counters, self.audit, &dm, &error, retry_after).await
    }

    /// When `to`'s inbox, at its cap, has room again. Its oldest DM (one direct get) at or below
    /// its consumer's ack floor (one consumer info, beside it) was read: a trim round
    /// ([`crate::history`]), asked for as soon as that DM is out of the duplicate window, makes
    /// room ([`history_retry`]). Otherwise when
    /// that DM leaves the stream, from its age and TTL; [`DEFAULT_RETRY_AFTER_SECS`] when it
    /// cannot be read. Each read waits at most [`READ_TIMEOUT`]: the pump waits for this.
    async fn subject_full_retry_after(&self, js: &jetstream::Context, to: &AgentId) -> u64 {
        let inbox = &self.delivery.inbox;
        let trimming = inbox.trim_interval().is_some();
        // The ack floor only matters while trims run.
        let floor = async {
            match trimming {
                true => bounded(ack_floor(js, &inbox.name, to)).await,
                false => None,
            }
        };
        let (oldest, floor) = tokio::join!(bounded(oldest_dm(js, &inbox.name, to)), floor);
        let Some(oldest) = oldest else {
            return DEFAULT_RETRY_AFTER_SECS;
        };
        // In whole seconds rounded down from milliseconds: never older than it is, so the round
        // asked for never comes before the DM has left the duplicate window.
        let now_ms = i128::from(protocol::expiry::now_ms());
        let oldest_ms = oldest.time.unix_timestamp_nanos() / 1_000_000;
        let age = u64::try_from(now_ms.saturating_sub(oldest_ms) / 1000).unwrap_or(0);
        let window = self.delivery.duplicate_window();
        if let Some(retry) = history_retry(oldest.sequence, age, floor, trimming, window) {
            self.history.trim_in(retry.trim_in);
            return retry.retry_after_secs;
        }
        // The router stores a TTL as whole seconds; another form counts as none (max age
        // decides).
        let ttl = oldest
            .headers
            .get(protocol::headers::NATS_TTL)
            .and_then(|v| v.as_str().parse::<u64>().ok());
        inbox_full_retry_after(age, inbox.max_age().map(|d| d.as_secs()), ttl)
    }

    /// Refuses `dm` now, before any store, because its sender is over its rate.
    pub(super) fn rate_limited(
        &self,
        js: &jetstream::Context,
        dm: Refusable,
        retry_after_secs: u64,
    ) -> Pending {
        let error = WireError::new(
            WireErrorKind::RateLimited,
            format!("{} is over its rate of DMs a minute", dm.from),
        );
        self.refuse_now(js, dm, |c| &c.rate_limited, error, Some(retry_after_secs))
    }

    /// Refuses `dm` now, before any store, because its recipient was removed (`runtime agent
    /// remove`): no `retry_after_secs`, sending again does not help until it is restored.
    pub(super) fn recipient_deleted(&self, js: &jetstream::Context, dm: Refusable) -> Pending {
        let error = WireError::new(
            WireErrorKind::RecipientDeleted,
            format!("{} was removed from the hub", dm.to),
        );
        self.refuse_now(js, dm, |c| &c.refused_deleted, error, None)
    }

    /// Refuses `dm` now, before any store, with `error`, counted in `counter`.
    fn refuse_now(
        &self,
        js: &jetstream::Context,
        dm: Refusable,
        counter: fn(&RouterCounters) -> &crate::counters::Counter,
        error: WireError,
        retry_after: Option<u64>,
    ) -> Pending {
        let js = js.clone();
        let counters = self.counters.clone();
        let audit = self.audit.clone();
        Box::pin(async move {
            counter(&counters).bump();
            notify(&js, &counters, &audit, &dm, &error, retry_after).await
        })
    }
}

/// Stores the refusal of `dm` in its sender's inbox; the ingress message is then terminated.
async fn notify(
    js: &jetstream::Context,
    counters: &RouterCounters,
    audit: &crate::audit::Auditor,
    dm: &Refusable,
    error: &WireError,
    retry_after: Option<u64>,
) -> Done {
    tracing::info!(from = %dm.from, to = %dm.to, kind = error.kind.as_str(), ?retry_after, "dm refused");
    audit.emit(
        audit
            .msg("rejected", dm.id.as_str())
            .details(protocol::audit::Details {
                ingress_seq: Some(dm.seq),
                kind: Some(error.kind.as_str().to_owned()),
                retry_after_secs: retry_after,
                ..Default::default()
            }),
    );
    let (subject, msg_id, notice) = refusal(
        &dm.from,
        Some(&dm.id),
        error,
        dm.seq,
        retry_after,
        Some(&dm.to),
    );
    if let Some(rejection) = protocol::rejection::parse_rejection(&notice) {
        if let Some((scope, hold)) = hold_of(&rejection, protocol::expiry::now_ms()) {
            put_hold(js, &scope.key(&dm.from), &hold).await;
        }
    }
    let Ok(payload) = protocol::encode(&notice, Codec::Json) else {
        return Done::Immediate { terminate: true };
    };
    let headers = routed_headers(Some(&msg_id), Codec::Json);
    match store_notice(js, subject, headers, payload).await.await {
        Done::Refused(..) => {
            counters.notices_dropped.bump();
            tracing::warn!(sender = %dm.from, "the sender's inbox is full too; its refusal notice is dropped");
            Done::Immediate { terminate: true }
        }
        other => other,
    }
}

/// How long each read of a refusal's retry-after may take (the pump's pipeline waits for it).
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// `read`, or `None` past [`READ_TIMEOUT`].
async fn bounded<T>(read: impl std::future::Future<Output = Option<T>>) -> Option<T> {
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .ok()
        .flatten()
}

/// The oldest DM stored for `to` (one direct get).
async fn oldest_dm(
    js: &jetstream::Context,
    stream: &str,
    to: &AgentId,
) -> Option<jetstream::message::StreamMessage> {
    let stream = js.get_stream_no_info(stream).await.ok()?;
    stream
        .direct_get_first_for_subject(protocol::subjects::inbox(to))
        .await
        .ok()
}

/// The ack floor (stream sequence) of `to`'s inbox consumer (one consumer info).
async fn ack_floor(js: &jetstream::Context, stream: &str, to: &AgentId) -> Option<u64> {
    let consumer: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(protocol::subjects::inbox_consumer(to), stream)
        .await
        .ok()?;
    Some(consumer.cached_info().ack_floor.stream_sequence)
}

/// Stores `hold` under `key` in the holds bucket, for a one-shot client to read. Best effort:
/// the notice is what tells the sender; a hold that is not stored is logged.
async fn put_hold(js: &jetstream::Context, key: &str, hold: &Hold) {
    let subject = protocol::subjects::kv_subject(protocol::subjects::HOLDS_BUCKET, key);
    let payload = serde_json::to_vec(hold).expect("a hold serializes");
    let stored = crate::streams::publish_acked(
        js,
        subject,
        async_nats::HeaderMap::new(),
        payload.into(),
        crate::PUBLISH_ACK_TIMEOUT,
    )
    .await;
    if let Err(e) = stored {
        tracing::warn!(error = %ErrorChain(&e), key, "a hold was not stored");
    }
}
