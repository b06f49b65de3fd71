//! Messaging through an [`ActorSystem`]: `send` and `broadcast` (inboxes are in
//! [`super::inboxes`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use actors::streams::{is_transient, publish_acked, AckedError};
use async_nats::HeaderMap;
use protocol::error_chain::ErrorChain;
use protocol::subjects::{self, Channel};
use protocol::{headers, AgentId, ChannelName, Codec, Envelope, MessageId, Meta};
use serde::{Deserialize, Serialize};

use super::{ActorSystem, SystemError};

pub use super::inboxes::{ATTACH_TIMEOUT, INBOX_BATCH};

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Proof that the hub accepted an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The envelope's `meta.id`.
    pub id: MessageId,
    /// Sequence in the ingress stream (durable mode): the envelope is stored and will be
    /// routed even if no router runs now. `None` in core mode (fire and forget).
    pub ingress_seq: Option<u64>,
    /// The ingress stream already had this `meta.id` from this sender, sent by this process,
    /// within the duplicate window (a retried send). A retry from another process is not
    /// flagged here; the router's store deduplicates it.
    pub duplicate: bool,
    /// For a DM on a durable hub: whether its recipient is online, from its presence record
    /// (read at most once per beat's fifth, at most 5 s; `unknown` when never seen or the
    /// record cannot be read). `None` for a broadcast or in core mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_state: Option<protocol::presence::PresenceState>,
}

/// A fresh message id: milliseconds since the epoch and a process-local counter, hex.
pub fn new_message_id() -> MessageId {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let salt = std::process::id();
    MessageId::new(format!("{ms:x}-{salt:x}-{n:x}")).expect("hex ids are valid message ids")
}

impl ActorSystem {
    /// Sends a DM from `from` to `to` with a fresh `meta.id`; see [`send_envelope`](Self::send_envelope).
    ///
    /// # Errors
    /// As [`send_envelope`](Self::send_envelope).
    pub async fn send(
        &self,
        from: &AgentId,
        to: &AgentId,
        body: serde_json::Value,
    ) -> Result<Receipt, SystemError> {
        let mut meta = Meta::new(new_message_id());
        meta.to = Some(to.clone());
        let envelope = Envelope {
            meta,
            body,
            extra: Default::default(),
        };
        self.send_envelope(from, &Channel::Inbox, &envelope).await
    }

    /// Broadcasts `body` from `from` on `channel` (live only: nobody stores broadcasts).
    ///
    /// # Errors
    /// As [`send_envelope`](Self::send_envelope).
    pub async fn broadcast(
        &self,
        from: &AgentId,
        channel: &ChannelName,
        body: serde_json::Value,
    ) -> Result<Receipt, SystemError> {
        let envelope = Envelope::new(new_message_id(), body);
        self.send_envelope(from, &Channel::Broadcast(channel.clone()), &envelope)
            .await
    }

    /// The broadcasts on `channel` from now on, as the router stamped them (`meta.from` is the
    /// sender): live only, nobody stores broadcasts, so what was broadcast before this returns
    /// (or while the connection is down) is not seen. An agent may receive every channel
    /// (docs/SECURITY.md). A message that is not an envelope is skipped.
    ///
    /// # Errors
    /// [`SystemError::Request`] when the subscription cannot be made.
    pub async fn listen(&self, channel: &ChannelName) -> Result<Broadcasts, SystemError> {
        let subject = protocol::subjects::broadcast(channel);
        let fail = |e: async_nats::Error| SystemError::Request {
            subject: subject.clone(),
            source: e,
        };
        let sub = self
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| fail(e.into()))?;
        // Registered at the broker before this returns: a broadcast made after it is seen.
        self.client.flush().await.map_err(|e| fail(e.into()))?;
        Ok(Broadcasts { sub })
    }

    /// Publishes `envelope` to `hub.pub.<from>.<channel>` with the current span's trace
    /// context. In durable mode it is a JetStream publish to the ingress stream with
    /// `Nats-Msg-Id: <from>:<meta.id>~<seal>` (a retried send is stored once;
    /// [`protocol::subjects::ingress_msg_id`]), and the receipt carries
    /// the ingress sequence; in core mode it is a core publish.
    ///
    /// A DM is not published while a refusal for a limit holds it back: after an `inbox_full`
    /// refusal (to that recipient) or a `rate_limited` one (to anyone), until its
    /// `retry_after_secs` has passed. The system learns those from the refusals reaching the
    /// inboxes it attached, and from [`load_holds`](Self::load_holds).
    ///
    /// # Errors
    /// [`SystemError::Held`] while a hold is in force (nothing is published);
    /// [`SystemError::RecipientDeleted`] when the recipient is removed (nothing is published);
    /// [`SystemError::Publish`] when the envelope cannot be encoded or the ingress does not
    /// ack in time.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled send may or may not have been stored; send it again with
    /// the same `meta.id` (it is stored once within the duplicate window).
    pub async fn send_envelope(
        &self,
        from: &AgentId,
        channel: &Channel,
        envelope: &Envelope,
    ) -> Result<Receipt, SystemError> {
        if let (Channel::Inbox, Some(to)) = (channel, envelope.meta.to.as_ref()) {
            if let Some(held) = self.holds.check(from, to) {
                return Err(SystemError::Held {
                    from: from.clone(),
                    to: held.to,
                    retry_after_secs: held.retry_after_secs,
                });
            }
        }
        let subject = subjects::ingress(from, channel);
        let payload = protocol::encode(envelope, Codec::Json)
            .map_err(|e| SystemError::publish(&subject, e))?;
        if !self.durable {
            let mut h = HeaderMap::new();
            actors::trace_context::inject_current(&mut h);
            self.client
                .publish_with_headers(subject.clone(), h, payload.into())
                .await
                .map_err(|e| SystemError::publish(&subject, e))?;
            return Ok(Receipt {
                id: envelope.meta.id.clone(),
                ingress_seq: None,
                duplicate: false,
                recipient_state: None,
            });
        }
        // A removed recipient is refused before anything is published (its tombstone, read
        // at most once per cache period).
        if let (Channel::Inbox, Some(to)) = (channel, envelope.meta.to.as_ref()) {
            if self.presence.is_removed(&self.client, to).await {
                return Err(SystemError::RecipientDeleted { to: to.clone() });
            }
        }
        let msg_id = format!("{from}:{}", envelope.meta.id);
        let published = self.publish_ingress(&subject, &msg_id, payload, Retry::No);
        // The recipient's presence is read beside the publish, not after it.
        let recipient = async {
            match (channel, envelope.meta.to.as_ref()) {
                (Channel::Inbox, Some(to)) => Some(self.presence.state(&self.client, to).await),
                _ => None,
            }
        };
        let (ack, recipient_state) = tokio::join!(published, recipient);
        let ack = ack?;
        Ok(Receipt {
            id: envelope.meta.id.clone(),
            ingress_seq: Some(ack.sequence),
            duplicate: ack.duplicate,
            recipient_state,
        })
    }

    /// Reads the holds the router stored for `from`'s DMs to `to` (its inbox full, or `from`
    /// over its rate), so that [`send_envelope`](Self::send_envelope) honours them: what a
    /// client that has not attached `from`'s inbox, and so saw no refusal, calls before it
    /// sends (`runtime send` does). Two direct gets; a hold that cannot be read counts as none
    /// (the router refuses such a DM again).
    pub async fn load_holds(&self, from: &AgentId, to: &AgentId) {
        if self.durable {
            self.holds.load(&self.client, from, to).await;
        }
    }
}

/// How long an ingress publish is sent again while the stream does not acknowledge it: two
/// elections of a stream leader (4 to 9 s each), well inside the duplicate window.
pub const INGRESS_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(20);

/// The pause before each new attempt of an ingress publish: 100 ms, doubling, at most 2 s.
const INGRESS_RETRY_BACKOFF: actors::supervision::Backoff = actors::supervision::Backoff {
    initial: std::time::Duration::from_millis(100),
    max: std::time::Duration::from_secs(2),
    factor: 2,
    reset_after: None,
};

impl ActorSystem {
    /// JetStream-publishes an encoded envelope to the ingress `subject` with the current span's
    /// trace context and `Nats-Msg-Id: msg_id`, and awaits the stream ack for at most
    /// [`actors::PUBLISH_ACK_TIMEOUT`]; a publish no stream answered (`503`) or acknowledged
    /// is sent again, same id, until its retry window (default [`INGRESS_RETRY_WINDOW`]) has
    /// passed (an attempt after
    /// the first is flagged `Hub-Check`: it may have been stored).
    ///
    /// # Errors
    /// [`SystemError::Publish`] when the publish is refused, or not acked within the window.
    pub(super) async fn publish_ingress(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Vec<u8>,
        retry: Retry,
    ) -> Result<async_nats::jetstream::publish::PublishAck, SystemError> {
        let mut h = HeaderMap::new();
        actors::trace_context::inject_current(&mut h);
        h.insert(
            headers::NATS_MSG_ID,
            actors::ingress_seal::ingress_msg_id(msg_id),
        );
        if retry == Retry::OutcomeUnknown {
            // It may have been stored (and run) already: the worker is to check first.
            h.insert(headers::HUB_CHECK, "retry");
        }
        let js = async_nats::jetstream::new(self.client.clone());
        let payload = bytes::Bytes::from(payload);
        // Through a stream leader's election a publish gets `503 no responders` or no ack at
        // all, and async-nats retries neither: it is sent again, under the same id (the
        // stream stores it once), until the window closes.
        let deadline = tokio::time::Instant::now() + self.ingress_retry_window;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // The first attempt waits its full time whatever the window.
            let wait = match attempt {
                1 => actors::PUBLISH_ACK_TIMEOUT,
                _ => actors::PUBLISH_ACK_TIMEOUT.min(left),
            };
            let sent = publish_acked(&js, subject.to_owned(), h.clone(), payload.clone(), wait);
            let failure = match sent.await {
                Ok(ack) => return Ok(ack),
                Err(AckedError::Publish(e)) if !is_transient(&e) => {
                    return Err(SystemError::publish(subject, e))
                }
                Err(e) => SystemError::publish(subject, e),
            };
            let pause = INGRESS_RETRY_BACKOFF.delay(attempt);
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(failure);
            }
            tracing::debug!(%subject, attempt, "ingress publish not acknowledged; sending it again");
            // It may have been stored: a task sent again is checked by the worker first.
            h.insert(headers::HUB_CHECK, "retry");
            tokio::time::sleep(pause).await;
        }
    }

    /// [`publish_ingress`](Self::publish_ingress) of `envelope` (JSON).
    ///
    /// # Errors
    /// As [`publish_ingress`](Self::publish_ingress).
    pub(super) async fn publish_envelope(
        &self,
        subject: &str,
        msg_id: &str,
        envelope: &Envelope,
        retry: Retry,
    ) -> Result<async_nats::jetstream::publish::PublishAck, SystemError> {
        let payload = protocol::encode(envelope, Codec::Json)
            .map_err(|e| SystemError::publish(subject, e))?;
        self.publish_ingress(subject, msg_id, payload, retry).await
    }
}

/// Whether an ingress publish repeats one whose outcome the sender never learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// A first publish.
    No,
    /// A publish again of a task that may have been stored and run: flagged `Hub-Check`.
    OutcomeUnknown,
}

/// The broadcasts of one channel ([`ActorSystem::listen`]): a stream of envelopes, ending when
/// the connection closes.
pub struct Broadcasts {
    sub: async_nats::Subscriber,
}

impl futures::Stream for Broadcasts {
    type Item = Envelope;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Envelope>> {
        loop {
            let Some(msg) = futures::ready!(std::pin::Pin::new(&mut self.sub).poll_next(cx)) else {
                return std::task::Poll::Ready(None);
            };
            let content_type = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::CONTENT_TYPE))
                .map(|v| v.as_str());
            match protocol::decode_with_content_type(&msg.payload, content_type) {
                Ok(envelope) => return std::task::Poll::Ready(Some(envelope)),
                Err(e) => {
                    tracing::warn!(subject = %msg.subject, error = %ErrorChain(&e), "not an envelope on a broadcast channel; skipped")
                }
            }
        }
    }
}
