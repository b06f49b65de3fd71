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
}

impl Refusals<'_> {
    /// The broker refused `dm` for `what`: its sender's rejection notice is stored (and its
    /// hold), then the ingress message is terminated.
    pub(super) async fn refuse(&self, what: StoreRefusal, dm: Refusable) -> Done {
        // Its store acks are waited for as the pump's are ([`crate::PUBLISH_ACK_TIMEOUT`]).
        let js = jetstream::ContextBuilder::new()
            .timeout(crate::PUBLISH_ACK_TIMEOUT)
            .build(self.client.clone());
        let max_age = self.delivery.inbox.max_age().map(|d| d.as_secs());
        self.counters.refused_full.bump();
        let (kind, detail, retry_after) = match what {
            StoreRefusal::SubjectFull => (
                WireErrorKind::InboxFull,
                format!("the inbox of {} holds as many messages as it may", dm.to),
                Some(match self.history_retry_after(&js, &dm.to).await {
                    Some(secs) => secs,
                    None => retry_after(&js, &self.delivery.inbox.name, &dm.to, max_age).await,
                }),
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

    /// When `to`'s inbox is at its cap with DMs it has read among them: the seconds until a
    /// trim round ([`crate::history`]) made room, from its consumer's backlog (one consumer
    /// info). `None` when it holds as many unread DMs as its cap, trimming is off, or the
    /// consumer cannot be read.
    async fn history_retry_after(&self, js: &jetstream::Context, to: &AgentId) -> Option<u64> {
        let inbox = &self.delivery.inbox;
        let cap = inbox.max_msgs_per_subject_limit()?;
        let interval = inbox.trim_interval().map(|d| d.as_secs());
        let read = async {
            let consumer: jetstream::consumer::PullConsumer = js
                .get_consumer_from_stream(protocol::subjects::inbox_consumer(to), &inbox.name)
                .await
                .ok()?;
            Some(consumer.cached_info().clone())
        };
        let info = tokio::time::timeout(crate::PUBLISH_ACK_TIMEOUT, read)
            .await
            .ok()
            .flatten()?;
        let unread = info
            .num_pending
            .saturating_add(u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX));
        protocol::history::history_retry_after(unread, cap, interval)
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

/// When `to`'s full inbox has room again: from its oldest DM's age and TTL (one direct get), or
/// [`DEFAULT_RETRY_AFTER_SECS`] when it cannot be read.
async fn retry_after(
    js: &jetstream::Context,
    stream: &str,
    to: &AgentId,
    max_age: Option<u64>,
) -> u64 {
    let read = async {
        let stream = js.get_stream_no_info(stream).await.ok()?;
        stream
            .direct_get_first_for_subject(protocol::subjects::inbox(to))
            .await
            .ok()
    };
    let Ok(Some(oldest)) = tokio::time::timeout(crate::PUBLISH_ACK_TIMEOUT, read).await else {
        return DEFAULT_RETRY_AFTER_SECS;
    };
    let now = i64::try_from(protocol::expiry::now_ms() / 1000).unwrap_or(i64::MAX);
    let age = u64::try_from(now.saturating_sub(oldest.time.unix_timestamp())).unwrap_or(0);
    // The router stores a TTL as whole seconds; another form counts as none (max age decides).
    let ttl = oldest
        .headers
        .get(protocol::headers::NATS_TTL)
        .and_then(|v| v.as_str().parse::<u64>().ok());
    inbox_full_retry_after(age, max_age, ttl)
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
        tracing::warn!(error = %e, key, "a hold was not stored");
    }
}
