//! Publishing on a task channel through the ingress
//! (`hub.pub.<worker>.task.<delegator>.<key>`): one
//! envelope, or a [bundle](protocol::routing::bundle_items) of several that the router stores
//! as separate messages. Publishes are started (sent) and confirmed (stream ack awaited)
//! separately, so that an attempt's publishes travel together. Also the acks of inputs, and
//! the error results of refused answers.

use std::time::Duration;

use async_nats::jetstream;
use protocol::error_chain::ErrorChain;
use protocol::subjects::{self, Channel, TaskChannel};
use protocol::task::{AnswerRefusal, TaskChannelBody};
use protocol::{AgentId, Envelope, MessageId, WorkerId};

/// Why a publish or an ack was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The worker id is no valid sender identity, or a message id is invalid.
    #[error("invalid id")]
    Id(#[from] protocol::IdError),
    /// The envelope does not encode.
    #[error("cannot encode the envelope")]
    Encode(#[from] protocol::EnvelopeError),
    /// The publish could not be sent.
    #[error("publish of {what} not sent")]
    Send {
        /// What was published.
        what: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::PublishError,
    },
    /// The stream refused the publish.
    #[error("publish of {what} refused")]
    Refused {
        /// What was published.
        what: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::PublishError,
    },
    /// No stream ack came in time: the outcome is uncertain (it may be stored).
    #[error("no stream ack for {what} within {after:?}")]
    Uncertain {
        /// What was published.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// An ack of an input was not confirmed.
    #[error("ack not confirmed")]
    Ack(#[source] async_nats::Error),
}

/// A task channel publish sent to the ingress whose stream ack is still to come.
pub struct PendingPublish {
    what: String,
    ack: jetstream::context::PublishAckFuture,
}

impl PendingPublish {
    /// Awaits the stream ack for at most `within`; `Ok(duplicate)`.
    ///
    /// # Errors
    /// [`PublishError::Refused`] when the stream refuses, [`PublishError::Uncertain`] when it
    /// does not answer in time.
    pub async fn confirmed(self, within: Duration) -> Result<bool, PublishError> {
        match tokio::time::timeout(within, self.ack).await {
            Ok(Ok(ack)) => Ok(ack.duplicate),
            Ok(Err(source)) => Err(PublishError::Refused {
                what: self.what,
                source,
            }),
            Err(_) => Err(PublishError::Uncertain {
                what: self.what,
                after: within,
            }),
        }
    }
}

/// Publishes `body` through the ingress of `worker` on task channel `channel` with `Nats-Msg-Id`
/// = `msg_id` and awaits the stream ack for at most [`PUBLISH_ACK_TIMEOUT`](crate::PUBLISH_ACK_TIMEOUT).
///
/// # Errors
/// As [`start_publish`] and [`PendingPublish::confirmed`].
pub async fn publish_task_channel(
    client: &async_nats::Client,
    worker: &WorkerId,
    channel: &TaskChannel,
    msg_id: &str,
    body: &TaskChannelBody,
) -> Result<bool, PublishError> {
    start_publish(client, worker, channel, msg_id, body, None)
        .await?
        .confirmed(crate::PUBLISH_ACK_TIMEOUT)
        .await
}

/// Publishes the error result of a refused answer on the task channel of its task under
/// `owner` (the answerer: the refusal is its news; its id names the answer, so a redelivered
/// answer refused again is deduplicated).
///
/// # Errors
/// As [`publish_task_channel`].
pub async fn publish_refusal(
    client: &async_nats::Client,
    owner: &AgentId,
    refusal: AnswerRefusal,
) -> Result<bool, PublishError> {
    let msg_id = protocol::task::refusal_msg_id(
        &refusal.task_id,
        &refusal.worker_id,
        owner,
        &refusal.answer_id,
    );
    let worker = refusal.worker_id.clone();
    let channel = TaskChannel::of(owner, &refusal.task_id);
    publish_task_channel(
        client,
        &worker,
        &channel,
        &msg_id,
        &TaskChannelBody::AnswerRefused(refusal),
    )
    .await
}

/// Sends `body` as an envelope through the ingress of `worker` on task channel `channel`, with `Nats-Msg-Id` = `msg_id`, without waiting for the stream ack: several
/// publishes of one attempt travel together and are confirmed with
/// [`PendingPublish::confirmed`]. They reach the ingress in the order they were started.
///
/// # Errors
/// [`PublishError`] when an id is invalid or the publish cannot be sent.
pub async fn start_publish(
    client: &async_nats::Client,
    worker: &WorkerId,
    channel: &TaskChannel,
    msg_id: &str,
    body: &TaskChannelBody,
    trace: Option<&tracing::Span>,
) -> Result<PendingPublish, PublishError> {
    let payload = encode(msg_id, body_value(body))?;
    send(client, worker, channel, msg_id, payload, trace).await
}

fn body_value(body: &TaskChannelBody) -> serde_json::Value {
    // Serializing these plain types cannot fail (string keys, no non-finite floats).
    serde_json::to_value(body).expect("task channel bodies serialize")
}

/// Publishes an encoded envelope to the ingress of `worker` on task channel `channel` with
/// `Nats-Msg-Id` = `msg_id`, carrying the trace context of `trace`.
async fn send(
    client: &async_nats::Client,
    worker: &WorkerId,
    channel: &TaskChannel,
    msg_id: &str,
    payload: Vec<u8>,
    trace: Option<&tracing::Span>,
) -> Result<PendingPublish, PublishError> {
    let what = msg_id.to_owned();
    let me = AgentId::new(worker.as_str())?;
    let subject = subjects::ingress(&me, &Channel::Task(channel.clone()));
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        protocol::headers::NATS_MSG_ID,
        crate::ingress_seal::ingress_msg_id(msg_id),
    );
    headers.insert(
        protocol::headers::CONTENT_TYPE,
        protocol::headers::CONTENT_TYPE_JSON,
    );
    // The task's trace continues through its results: delegator -> router -> attempt ->
    // router -> tracker is one trace.
    if let Some((tp, state)) = trace.and_then(crate::trace_context::traceparent_of) {
        protocol::trace::inject(
            &tp,
            state.as_deref(),
            &mut crate::trace_context::NatsHeaders(&mut headers),
        );
    }
    let js = jetstream::new(client.clone());
    let ack = js
        .publish_with_headers(subject, headers, payload.into())
        .await
        .map_err(|source| PublishError::Send {
            what: what.clone(),
            source,
        })?;
    Ok(PendingPublish { what, ack })
}

/// Sends `items` (`(Nats-Msg-Id, body)`, in order) as one bundle envelope with `bundle_id` as
/// its `meta.id` and ingress `Nats-Msg-Id`; the router stores each item as its own message.
/// `Ok(None)` when the bundle would not fit in one envelope (the caller sends the items one by
/// one instead).
///
/// # Errors
/// [`PublishError`] when an id is invalid or the publish cannot be sent.
pub async fn start_publish_bundle(
    client: &async_nats::Client,
    worker: &WorkerId,
    channel: &TaskChannel,
    bundle_id: &str,
    items: &[(&str, &TaskChannelBody)],
    trace: Option<&tracing::Span>,
) -> Result<Option<PendingPublish>, PublishError> {
    let mut envelopes = Vec::with_capacity(items.len());
    for (id, body) in items {
        envelopes.push(Envelope::new(MessageId::new(*id)?, body_value(body)));
    }
    let body = protocol::routing::bundle_body(&envelopes);
    let payload = encode(bundle_id, body)?;
    if payload.len()
        > protocol::MAX_ENVELOPE_BYTES.saturating_sub(protocol::task::ENVELOPE_HEADROOM)
    {
        return Ok(None);
    }
    send(client, worker, channel, bundle_id, payload, trace)
        .await
        .map(Some)
}

/// Encodes `body` as a JSON envelope with `meta.id` = `msg_id`.
fn encode(msg_id: &str, body: serde_json::Value) -> Result<Vec<u8>, PublishError> {
    let id = MessageId::new(msg_id)?;
    Ok(protocol::encode(
        &Envelope::new(id, body),
        protocol::Codec::Json,
    )?)
}

/// How many times an input ack is tried before the attempt gives up (the input is then
/// redelivered, and its saved result republished or its task found settled).
const ACK_TRIES: u32 = 3;

/// Acks `msg` and waits for the server's confirmation (double ack), trying again after a
/// short pause when the confirmation does not come (a reconnect in between loses it; acking
/// an acked message again is harmless).
///
/// # Errors
/// [`PublishError::Ack`] when no try was confirmed.
pub async fn ack_confirmed(msg: &jetstream::Message) -> Result<(), PublishError> {
    let mut last = None;
    for attempt in 0..ACK_TRIES {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
        }
        match msg.double_ack().await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&*e), "input ack not confirmed; trying again");
                last = Some(e);
            }
        }
    }
    Err(PublishError::Ack(last.expect("at least one try")))
}
