//! Publishing on a task channel through the ingress (`hub.pub.<worker>.task.<key>`): one
//! envelope, or a [bundle](protocol::routing::bundle_items) of several that the router stores
//! as separate messages. Publishes are started (sent) and confirmed (stream ack awaited)
//! separately, so that an attempt's publishes travel together.

use async_nats::jetstream;
use protocol::subjects::{self, Channel, TaskKey};
use protocol::task::TaskChannelBody;
use protocol::{AgentId, Envelope, MessageId, WorkerId};

use super::attempt::{AttemptError, ENVELOPE_HEADROOM, PUBLISH_ACK_TIMEOUT};

/// Publishes `body` as an envelope through the ingress of `worker` on the task channel of
/// `task_id`, with `Nats-Msg-Id` = `msg_id`, and awaits the stream ack. Returns whether the
/// stream reported a duplicate.
pub async fn publish_task_channel(
    client: &async_nats::Client,
    worker: &WorkerId,
    task_id: &protocol::TaskId,
    msg_id: &str,
    body: &TaskChannelBody,
    trace: Option<&tracing::Span>,
) -> Result<bool, AttemptError> {
    start_publish(client, worker, task_id, msg_id, body, trace)
        .await?
        .confirmed()
        .await
}

/// A task channel publish sent to the ingress whose stream ack is still to come.
pub struct PendingPublish {
    what: String,
    ack: jetstream::context::PublishAckFuture,
}

impl PendingPublish {
    /// Awaits the stream ack (bounded by [`PUBLISH_ACK_TIMEOUT`]); `Ok(duplicate)`.
    ///
    /// # Errors
    /// [`AttemptError::Publish`] when the stream refuses or does not answer in time.
    pub async fn confirmed(self) -> Result<bool, AttemptError> {
        let fail = |reason: String| AttemptError::Publish {
            what: self.what.clone(),
            reason,
        };
        match tokio::time::timeout(PUBLISH_ACK_TIMEOUT, self.ack).await {
            Ok(Ok(ack)) => Ok(ack.duplicate),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(fail(format!(
                "no stream ack within {PUBLISH_ACK_TIMEOUT:?}"
            ))),
        }
    }
}

/// Sends `body` as an envelope through the ingress of `worker` on the task channel of
/// `task_id`, with `Nats-Msg-Id` = `msg_id`, without waiting for the stream ack: several
/// publishes of one attempt travel together and are confirmed with
/// [`PendingPublish::confirmed`]. They reach the ingress in the order they were started.
pub async fn start_publish(
    client: &async_nats::Client,
    worker: &WorkerId,
    task_id: &protocol::TaskId,
    msg_id: &str,
    body: &TaskChannelBody,
    trace: Option<&tracing::Span>,
) -> Result<PendingPublish, AttemptError> {
    let body = serde_json::to_value(body).map_err(|e| AttemptError::Publish {
        what: msg_id.to_owned(),
        reason: e.to_string(),
    })?;
    let payload = encode(msg_id, body)?;
    send(client, worker, task_id, msg_id, payload, trace).await
}

/// Publishes an encoded envelope to the ingress of `worker` on `task_id`'s channel with
/// `Nats-Msg-Id` = `msg_id`, carrying the trace context of `trace`.
async fn send(
    client: &async_nats::Client,
    worker: &WorkerId,
    task_id: &protocol::TaskId,
    msg_id: &str,
    payload: Vec<u8>,
    trace: Option<&tracing::Span>,
) -> Result<PendingPublish, AttemptError> {
    let what = msg_id.to_owned();
    let me = AgentId::new(worker.as_str()).map_err(|e| AttemptError::Id(e.to_string()))?;
    let subject = subjects::ingress(&me, &Channel::Task(TaskKey::from_task_id(task_id)));
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(protocol::headers::NATS_MSG_ID, msg_id);
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
        .map_err(|e| AttemptError::Publish {
            what: what.clone(),
            reason: e.to_string(),
        })?;
    Ok(PendingPublish { what, ack })
}

/// Sends `items` (`(Nats-Msg-Id, body)`, in order) as one bundle envelope with `bundle_id` as
/// its `meta.id` and ingress `Nats-Msg-Id`; the router stores each item as its own message.
/// `Ok(None)` when the bundle would not fit in one envelope (the caller sends the items one by
/// one instead).
///
/// # Errors
/// [`AttemptError`] when an id is invalid or the publish cannot be sent.
pub async fn start_publish_bundle(
    client: &async_nats::Client,
    worker: &WorkerId,
    task_id: &protocol::TaskId,
    bundle_id: &str,
    items: &[(&str, &TaskChannelBody)],
    trace: Option<&tracing::Span>,
) -> Result<Option<PendingPublish>, AttemptError> {
    let mut envelopes = Vec::with_capacity(items.len());
    for (id, body) in items {
        let id = MessageId::new(*id).map_err(|e| AttemptError::Id(e.to_string()))?;
        let body = serde_json::to_value(body).map_err(|e| AttemptError::Publish {
            what: bundle_id.to_owned(),
            reason: e.to_string(),
        })?;
        envelopes.push(Envelope::new(id, body));
    }
    let body = protocol::routing::bundle_body(&envelopes);
    let payload = encode(bundle_id, body)?;
    if payload.len() > protocol::MAX_ENVELOPE_BYTES.saturating_sub(ENVELOPE_HEADROOM) {
        return Ok(None);
    }
    send(client, worker, task_id, bundle_id, payload, trace)
        .await
        .map(Some)
}

/// Encodes `body` as a JSON envelope with `meta.id` = `msg_id`.
fn encode(msg_id: &str, body: serde_json::Value) -> Result<Vec<u8>, AttemptError> {
    let id = MessageId::new(msg_id).map_err(|e| AttemptError::Id(e.to_string()))?;
    protocol::encode(&Envelope::new(id, body), protocol::Codec::Json).map_err(|e| {
        AttemptError::Publish {
            what: msg_id.to_owned(),
            reason: e.to_string(),
        }
    })
}
