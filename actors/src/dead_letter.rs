//! Dead letters of DMs: the copy in `HUB_DLQ` and the `undeliverable` notice to the DM's
//! sender. Shared by the routers' advisories pump (a DM whose deliveries ran out, or that its
//! handler rejected: [`crate::expiry`]) and `runtime agent remove` (a DM whose recipient was
//! removed), so `runtime dlq list|replay|discard` read them all alike.
//!
//! A copy is stored on `dlq.<recipient>` with the headers `Hub-Original-Subject`,
//! `Hub-Original-Seq`, `Hub-Reason`, `Hub-Deliveries` (and the DM's `Content-Type`), under
//! `Nats-Msg-Id: hub-dlq:<inbox seq>`; the notice under
//! `hub-system:undeliverable:<inbox seq>` ([`protocol::rejection::undeliverable_notice`]). So a
//! retry after a crash stores each once within the duplicate window.

use async_nats::jetstream::{self, message::StreamMessage, publish::PublishAck};
use protocol::error_chain::ErrorChain;
use protocol::{headers, subjects, AgentId};

use crate::streams::{publish_acked, AckedError};

/// Copies the DM `stored` (read back from the inbox stream by sequence) to `to`'s dead-letter
/// subject, for `reason`, after `deliveries` deliveries; returns the copy's store ack (flagged
/// `duplicate` when it was stored before).
///
/// # Errors
/// [`AckedError`]: not stored, or not acked within [`crate::PUBLISH_ACK_TIMEOUT`].
pub async fn copy_dm(
    js: &jetstream::Context,
    to: &AgentId,
    stored: &StreamMessage,
    reason: &str,
    deliveries: u64,
) -> Result<PublishAck, AckedError> {
    let inbox_seq = stored.sequence;
    let mut map = async_nats::HeaderMap::new();
    map.insert(
        headers::NATS_MSG_ID,
        subjects::dlq_msg_id(inbox_seq).as_str(),
    );
    map.insert(headers::DLQ_ORIGINAL_SUBJECT, stored.subject.as_str());
    map.insert(headers::DLQ_ORIGINAL_SEQ, inbox_seq.to_string().as_str());
    map.insert(headers::DLQ_REASON, reason);
    map.insert(headers::DLQ_DELIVERIES, deliveries.to_string().as_str());
    if let Some(ct) = stored.headers.get(headers::CONTENT_TYPE) {
        map.insert(headers::CONTENT_TYPE, ct.as_str());
    }
    publish_acked(
        js,
        subjects::dlq(to),
        map,
        stored.payload.clone(),
        crate::PUBLISH_ACK_TIMEOUT,
    )
    .await
}

/// Where a dead letter came from and why, as [`copy_dm`] wrote it in its headers (a header
/// missing or unreadable reads as empty, or as 0 / `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The DM's inbox subject (`Hub-Original-Subject`).
    pub subject: String,
    /// Its sequence in the inbox stream (`Hub-Original-Seq`).
    pub original_seq: Option<u64>,
    /// Why it was dead-lettered (`Hub-Reason`).
    pub reason: String,
    /// How many times it was delivered (`Hub-Deliveries`).
    pub deliveries: u64,
}

/// Reads a dead letter's [`Provenance`] from its headers.
pub fn provenance(map: &async_nats::HeaderMap) -> Provenance {
    let header = |name: &str| map.get(name).map(|v| v.as_str()).unwrap_or_default();
    Provenance {
        subject: header(headers::DLQ_ORIGINAL_SUBJECT).to_owned(),
        original_seq: header(headers::DLQ_ORIGINAL_SEQ).parse().ok(),
        reason: header(headers::DLQ_REASON).to_owned(),
        deliveries: header(headers::DLQ_DELIVERIES).parse().unwrap_or(0),
    }
}

/// What became of a notice ([`store_notice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeStored {
    /// Stored (or already stored: its id dedupes it).
    Stored,
    /// The recipient's own inbox refused it for a limit: dropped (retrying cannot help).
    Dropped,
    /// Not sent, or not acked in time: try again.
    Failed,
    /// It does not encode (never for the hub's own notices).
    Unencodable,
}

/// Stores the system notice `notice` on `subject` (its recipient's inbox) under `msg_id`.
///
/// # Cancel safety
/// Not cancel safe: a cancelled store may or may not be stored; store it again (same id).
pub async fn store_notice(
    js: &jetstream::Context,
    subject: String,
    msg_id: &str,
    notice: &protocol::Envelope,
) -> NoticeStored {
    let Ok(payload) = protocol::encode(notice, protocol::Codec::Json) else {
        return NoticeStored::Unencodable;
    };
    let mut map = async_nats::HeaderMap::new();
    map.insert(headers::NATS_MSG_ID, msg_id);
    match publish_acked(js, subject, map, payload.into(), crate::PUBLISH_ACK_TIMEOUT).await {
        Ok(_) => NoticeStored::Stored,
        Err(AckedError::Publish(e)) if crate::streams::store_refusal(&e).is_some() => {
            tracing::warn!(error = %ErrorChain(&e), "the sender's inbox refused its notice; dropped");
            NoticeStored::Dropped
        }
        Err(_) => NoticeStored::Failed,
    }
}
