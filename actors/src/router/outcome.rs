//! What the pump and its helpers (refusals, schedules, store acks, the audit trail) share,
//! apart from the pump itself: a pulled message's delivery ([`Pulled`]), the outcome of one
//! routed envelope ([`Done`]), resolved in pull order, and the store of a notice for a sender.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use async_nats::jetstream::{self, context::PublishErrorKind, Message};

use crate::PUBLISH_ACK_TIMEOUT;

/// What a pulled ingress message's ack subject says, read once per message.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pulled {
    /// Its ingress stream sequence (the count of messages pulled, when the subject does not
    /// parse).
    pub seq: u64,
    /// What the subject says (its delivery count, when the broker stored it), when it parses.
    pub info: Option<protocol::subjects::AckInfo>,
}

impl Pulled {
    /// What `msg`'s ack subject says; its sequence is `fallback` when it does not parse.
    pub(super) fn of(msg: &Message, fallback: u64) -> Pulled {
        match msg
            .reply
            .as_deref()
            .and_then(protocol::subjects::parse_ack_info)
        {
            Some(i) => Pulled {
                seq: i.stream_seq,
                info: Some(i),
            },
            None => Pulled {
                seq: fallback,
                info: None,
            },
        }
    }
}

/// The outcome of one envelope, resolved in pull order.
pub(super) enum Done {
    /// Store (or rejection notice) acked by the stream: ack (or terminate) the ingress message.
    /// `seq` is the stored message's stream sequence (the original's, for a duplicate).
    Stored {
        duplicate: bool,
        terminate: bool,
        seq: u64,
    },
    /// Every item of a bundle acked by the stream (`duplicates` of them were duplicates).
    StoredAll { stored: u64, duplicates: u64 },
    /// Nothing to wait for: ack or terminate now.
    Immediate { terminate: bool },
    /// The store failed or timed out: nak with a delay.
    Failed(String),
    /// The broker refused the store for a limit (retrying cannot help): a DM's sender is told
    /// (the DM it names: [`super::refusal::Refusals::refuse`]); anything else is terminated.
    Refused(
        protocol::backpressure::StoreRefusal,
        Option<Box<super::refusal::Refusable>>,
    ),
}

/// Resolves to the outcome of one envelope; the message itself waits, in the same order, in
/// the pump's `held` queue with its audit trail (so a shutdown can nak what never resolved).
pub(super) type Pending = Pin<Box<dyn Future<Output = Done> + Send>>;

/// A [`Pending`] already resolved.
pub(super) fn ready(done: Done) -> Pending {
    Box::pin(std::future::ready(done))
}

/// Publishes a notice (a rejection or a refusal, for its sender) through the JetStream context
/// and returns the future of its store ack (bounded by [`PUBLISH_ACK_TIMEOUT`], the context's
/// timeout); once stored, the ingress message it answers is terminated. The publish itself is
/// sent before this returns, which keeps the store order equal to the pull order. The routed
/// stores go through [`super::store_acks::StoreAcks`] instead.
pub(super) async fn store_notice(
    js: &jetstream::Context,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: Vec<u8>,
) -> Pending {
    let ack = match js
        .publish_with_headers(subject, headers, payload.into())
        .await
    {
        Ok(ack) => ack.into_future(),
        Err(e) => return ready(Done::Failed(e.to_string())),
    };
    Box::pin(async move {
        match ack.await {
            Ok(ack) => Done::Stored {
                duplicate: ack.duplicate,
                terminate: true,
                seq: ack.sequence,
            },
            Err(e) if e.kind() == PublishErrorKind::TimedOut => {
                Done::Failed(format!("no store ack within {PUBLISH_ACK_TIMEOUT:?}"))
            }
            Err(e) => match crate::streams::store_refusal(&e) {
                Some(what) => Done::Refused(what, None),
                None => Done::Failed(e.to_string()),
            },
        }
    })
}
