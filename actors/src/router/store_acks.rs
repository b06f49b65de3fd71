//! The store acks of the pump's pipeline, read on one subscription of the pump's own.
//!
//! A JetStream publish through async-nats makes a reply subject (a formatted string), files a
//! oneshot under it in the connection's request table, takes an ack permit, and reads the
//! reply as an untagged enum, which first copies the whole reply into owned values. Per
//! routed DM that was about as much CPU as the router's own routing. The pump instead
//! publishes each store with the reply subject `<prefix><token>` (tokens count up from 0),
//! reads the replies on `<prefix>*` in its own loop ([`StoreAcks::settle`]), and hands each
//! to the store waiting for it, which reads it with [`protocol::store_ack::parse_store_ack`].
//!
//! What a store is told is what async-nats would tell it: stored (with the duplicate flag),
//! refused with the broker's error, no stream (`503`, no responders), or no ack within
//! [`crate::PUBLISH_ACK_TIMEOUT`]. A reply for a store that gave up waiting is dropped.
//!
//! Only the routed stores use it (a DM, a task, an item of a bundle), whose outcomes the pump's
//! pipeline awaits: their acks arrive only while the pump's loop reads the subscription. The
//! notices and schedules the router stores besides use the JetStream context.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_nats::{Client, HeaderMap, StatusCode, Subscriber};
use protocol::store_ack::{parse_store_ack, StoreAck};
use tokio::sync::oneshot;

use super::outcome::{ready, Done, Pending};
use super::refusal::Refusable;
use crate::PUBLISH_ACK_TIMEOUT;
use protocol::config::DeliveryConfig;

/// The pump's stores waiting for their acks.
pub(super) struct StoreAcks {
    client: Client,
    /// `<inbox prefix>.<unique>.`: a store's reply subject is this and its token.
    prefix: String,
    waiting: Arc<Mutex<Waiting>>,
}

/// The waiting stores, by token: the front is the oldest token still waited for.
#[derive(Default)]
struct Waiting {
    /// The token of `slots[0]`.
    first: u64,
    slots: VecDeque<Option<oneshot::Sender<async_nats::Message>>>,
}

impl Waiting {
    /// Takes the sender of `token`, if its store still waits.
    fn take(&mut self, token: u64) -> Option<oneshot::Sender<async_nats::Message>> {
        let index = usize::try_from(token.checked_sub(self.first)?).ok()?;
        let sender = self.slots.get_mut(index)?.take();
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.first += 1;
        }
        sender
    }
}

/// Lets go of a store's slot when its wait ends without a reply (timed out, or dropped).
struct Slot {
    waiting: Arc<Mutex<Waiting>>,
    token: u64,
    replied: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.replied {
            drop(self.waiting.lock().expect("not poisoned").take(self.token));
        }
    }
}

impl StoreAcks {
    /// Subscribes to the replies of the pump's stores (on a reply prefix of `client`'s inbox
    /// prefix, so the router's permission to receive replies covers it). The pump reads the
    /// returned subscription and hands each message to [`Self::settle`].
    ///
    /// # Errors
    /// The subscription's error.
    pub(super) async fn open(
        client: Client,
    ) -> Result<(StoreAcks, Subscriber), async_nats::SubscribeError> {
        let prefix = format!("{}.", client.new_inbox());
        let subscription = client.subscribe(format!("{prefix}*")).await?;
        let acks = StoreAcks {
            client,
            prefix,
            waiting: Arc::default(),
        };
        Ok((acks, subscription))
    }

    /// Publishes `payload` to `subject` with `headers` and returns the wait for its store ack,
    /// which ends with what the broker replied, or with why there is no reply (within
    /// [`PUBLISH_ACK_TIMEOUT`]).
    ///
    /// # Errors
    /// The publish could not be handed to the connection (it is closed), or not within
    /// [`PUBLISH_ACK_TIMEOUT`] (its queue stayed full, as while it reconnects).
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled publish may or may not have been sent.
    pub(super) async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Vec<u8>,
    ) -> Result<impl Future<Output = Result<StoreAck, String>> + Send + 'static, String> {
        let (tx, rx) = oneshot::channel();
        let token = {
            let mut waiting = self.waiting.lock().expect("not poisoned");
            waiting.slots.push_back(Some(tx));
            waiting.first + waiting.slots.len() as u64 - 1
        };
        let slot = Slot {
            waiting: self.waiting.clone(),
            token,
            replied: false,
        };
        let mut reply = String::with_capacity(self.prefix.len() + 20);
        reply.push_str(&self.prefix);
        write!(reply, "{token}").expect("a string takes any write");
        let send =
            self.client
                .publish_with_reply_and_headers(subject, reply, headers, payload.into());
        match tokio::time::timeout(PUBLISH_ACK_TIMEOUT, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => {
                return Err(format!(
                    "the store was not sent within {PUBLISH_ACK_TIMEOUT:?}"
                ))
            }
        }
        Ok(async move {
            // The whole slot moves in (not a copy of its flag): it lets go when the wait ends.
            let mut slot = slot;
            let reply = match tokio::time::timeout(PUBLISH_ACK_TIMEOUT, rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => return Err("the store ack was lost".to_owned()),
                Err(_) => return Err(format!("no store ack within {PUBLISH_ACK_TIMEOUT:?}")),
            };
            slot.replied = true;
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return Err("no stream stores the subject".to_owned());
            }
            parse_store_ack(&reply.payload).map_err(|e| e.to_string())
        })
    }

    /// Hands `reply` to the store waiting for it; a reply no store waits for (it gave up, or
    /// the subject is not one of ours) is dropped.
    pub(super) fn settle(&self, reply: async_nats::Message) {
        let Some(token) = reply
            .subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return;
        };
        let sender = self.waiting.lock().expect("not poisoned").take(token);
        if let Some(sender) = sender {
            let _ = sender.send(reply);
        }
    }

    /// How many stores wait for their acks (for tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.lock().expect("not poisoned").slots.len()
    }
}

/// One store of the pipeline, whose ack the pump's loop reads ([`StoreAcks`]).
pub(super) struct Outgoing {
    /// The stored subject.
    pub subject: String,
    /// Its headers ([`super::outbound::routed_headers`]).
    pub headers: async_nats::HeaderMap,
    /// The routed envelope.
    pub payload: Vec<u8>,
}

impl Outgoing {
    /// With the `Nats-TTL` of a DM that has a deadline: the broker frees it after its
    /// deadline (`meta.expires_at`, `ttl_secs` away) and the grace that lets an inbox which
    /// terminates it have its sender told.
    pub(super) fn ttl(mut self, ttl_secs: Option<u64>, delivery: &DeliveryConfig) -> Outgoing {
        if let Some(ttl) = ttl_secs {
            let ttl = ttl.saturating_add(delivery.expiry_grace_secs);
            self.headers
                .insert(protocol::headers::NATS_TTL, ttl.to_string().as_str());
        }
        self
    }

    /// Publishes it and returns the future of its outcome; `Err` when the publish could not
    /// even be sent. A refusal for a limit names `dm`, the DM stored, when it is one.
    pub(super) async fn sent(
        self,
        acks: &StoreAcks,
        dm: Option<Refusable>,
    ) -> Result<Pending, String> {
        let ack = acks
            .publish(self.subject, self.headers, self.payload)
            .await?;
        Ok(Box::pin(async move {
            match ack.await {
                Ok(StoreAck::Stored { seq, duplicate }) => Done::Stored {
                    duplicate,
                    terminate: false,
                    seq,
                },
                Ok(StoreAck::Refused {
                    code,
                    err_code,
                    description,
                }) => {
                    let description = description.unwrap_or_default();
                    match protocol::backpressure::store_refusal(err_code, &description) {
                        Some(what) => Done::Refused(what, dm.map(Box::new)),
                        None => Done::Failed(format!(
                            "store refused: {description} (code {code}, error code {err_code})"
                        )),
                    }
                }
                Err(reason) => Done::Failed(reason),
            }
        }))
    }

    /// [`Outgoing::sent`], a publish that could not be sent resolving at once as failed.
    pub(super) async fn send(self, acks: &StoreAcks, dm: Option<Refusable>) -> Pending {
        self.sent(acks, dm)
            .await
            .unwrap_or_else(|reason| ready(Done::Failed(reason)))
    }
}

/// Stores every item of a bundle on `subject` now, in order; resolves once all are stored (a
/// failed item fails the whole: the nak'd retry dedupes the stored ones).
pub(super) async fn store_all(
    acks: &StoreAcks,
    subject: String,
    items: Vec<protocol::routing::StoredItem>,
    codec: protocol::Codec,
) -> Pending {
    let mut stores = Vec::with_capacity(items.len());
    for item in items {
        let out = Outgoing {
            subject: subject.clone(),
            headers: super::outbound::routed_headers(Some(&item.msg_id), codec),
            payload: item.payload,
        };
        match out.sent(acks, None).await {
            Ok(ack) => stores.push(ack),
            Err(reason) => {
                // A send that failed stops the bundle here: no later item is stored before
                // it (the nak'd retry stores them all, in order).
                stores.push(ready(Done::Failed(reason)));
                break;
            }
        }
    }
    Box::pin(async move {
        let (mut stored, mut duplicates) = (0, 0);
        for ack in stores {
            match ack.await {
                Done::Stored { duplicate, .. } => {
                    stored += 1;
                    duplicates += u64::from(duplicate);
                }
                Done::Failed(reason) => return Done::Failed(reason),
                other => return other,
            }
        }
        Done::StoredAll { stored, duplicates }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::{self, stream};
    use futures::StreamExt;
    use std::time::Duration;

    async fn server_with_stream() -> (harness::NatsServer, Client) {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        jetstream::new(client.clone())
            .create_stream(stream::Config {
                name: "S".into(),
                subjects: vec!["s.>".into()],
                max_messages_per_subject: 2,
                discard: stream::DiscardPolicy::New,
                discard_new_per_subject: true,
                duplicate_window: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .unwrap();
        (server, client)
    }

    /// Reads the subscription into `acks` until `wait` ends (as the pump's loop does).
    async fn settled<F: Future>(acks: &StoreAcks, sub: &mut Subscriber, wait: F) -> F::Output {
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                Some(reply) = sub.next() => acks.settle(reply),
                out = &mut wait => return out,
            }
        }
    }

    proptest::proptest! {
        /// Whatever the broker may reply to a publish, this reads what async-nats reads.
        #[test]
        fn a_reply_reads_as_async_nats_reads_it(
            error in proptest::option::of((0u64..1000, proptest::option::of(0u64..20_000), proptest::option::of(".{0,12}"))),
            stream in proptest::option::of("[A-Z_\"\\\\é]{0,8}"),
            seq in proptest::option::of(proptest::num::u64::ANY),
            duplicate in proptest::option::of(proptest::bool::ANY),
            domain in proptest::option::of("[a-z]{0,4}"),
        ) {
            let mut reply = serde_json::Map::new();
            if let Some((code, err_code, description)) = error {
                let mut e = serde_json::Map::new();
                e.insert("code".into(), code.into());
                if let Some(c) = err_code { e.insert("err_code".into(), c.into()); }
                if let Some(d) = description { e.insert("description".into(), d.into()); }
                reply.insert("error".into(), e.into());
            }
            if let Some(s) = stream { reply.insert("stream".into(), s.into()); }
            if let Some(s) = seq { reply.insert("seq".into(), s.into()); }
            if let Some(d) = duplicate { reply.insert("duplicate".into(), d.into()); }
            if let Some(d) = domain { reply.insert("domain".into(), d.into()); }
            let payload = serde_json::to_vec(&reply).unwrap();
            let theirs: Result<jetstream::response::Response<jetstream::publish::PublishAck>, _> =
                serde_json::from_slice(&payload);
            let ours = parse_store_ack(&payload);
            match (theirs, ours) {
                (Ok(jetstream::response::Response::Ok(ack)), Ok(StoreAck::Stored { seq, duplicate })) => {
                    proptest::prop_assert_eq!((ack.sequence, ack.duplicate), (seq, duplicate));
                }
                (Ok(jetstream::response::Response::Err { error }), Ok(StoreAck::Refused { code, err_code, description })) => {
                    proptest::prop_assert_eq!(error.code() as u64, code);
                    proptest::prop_assert_eq!(error.error_code().0, err_code);
                    // Their display writes the description (or "unknown") before the codes.
                    let described = format!(
                        "{} (code {code}, error code {err_code})",
                        description.as_deref().unwrap_or("unknown")
                    );
                    proptest::prop_assert_eq!(error.to_string(), described);
                }
                (Err(_), Err(_)) => {}
                (theirs, ours) => proptest::prop_assert!(false, "async-nats {:?}, ours {:?}", theirs.map(|_| ()), ours),
            }
        }
    }

    fn with_id(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", id);
        h
    }

    #[tokio::test]
    async fn each_store_is_told_its_own_sequence_duplicate_or_refusal() {
        let (_server, client) = server_with_stream().await;
        let (acks, mut sub) = StoreAcks::open(client.clone()).await.unwrap();
        let mut waits = Vec::new();
        for (subject, id) in [
            ("s.a", "1"),
            ("s.a", "2"),
            ("s.a", "1"),
            ("s.a", "3"),
            ("s.b", "4"),
        ] {
            let wait = acks
                .publish(subject.into(), with_id(id), b"x".to_vec())
                .await
                .unwrap();
            waits.push(wait);
        }
        let mut told = Vec::new();
        for wait in waits {
            told.push(settled(&acks, &mut sub, wait).await);
        }
        assert_eq!(
            told[0],
            Ok(StoreAck::Stored {
                seq: 1,
                duplicate: false
            })
        );
        assert_eq!(
            told[1],
            Ok(StoreAck::Stored {
                seq: 2,
                duplicate: false
            })
        );
        assert_eq!(
            told[2],
            Ok(StoreAck::Stored {
                seq: 1,
                duplicate: true
            })
        );
        match &told[3] {
            Ok(StoreAck::Refused {
                err_code,
                description,
                ..
            }) => assert_eq!(
                protocol::backpressure::store_refusal(
                    *err_code,
                    description.as_deref().unwrap_or("")
                ),
                Some(protocol::backpressure::StoreRefusal::SubjectFull)
            ),
            other => panic!("the third DM to a full subject is refused, not {other:?}"),
        }
        assert_eq!(
            told[4],
            Ok(StoreAck::Stored {
                seq: 3,
                duplicate: false
            })
        );
        assert_eq!(acks.waiting(), 0, "every slot let go");
    }

    #[tokio::test]
    async fn a_subject_no_stream_stores_is_told_so() {
        let (_server, client) = server_with_stream().await;
        let (acks, mut sub) = StoreAcks::open(client).await.unwrap();
        let wait = acks
            .publish("nowhere.x".into(), HeaderMap::new(), b"x".to_vec())
            .await
            .unwrap();
        let told = settled(&acks, &mut sub, wait).await;
        assert_eq!(told, Err("no stream stores the subject".to_owned()));
    }

    #[tokio::test]
    async fn a_store_whose_ack_never_comes_gives_up_and_lets_its_slot_go() {
        let (_server, client) = server_with_stream().await;
        let (acks, _unread) = StoreAcks::open(client).await.unwrap();
        // Paused once the server is up: the wait's timer fires as soon as nothing else runs.
        tokio::time::pause();
        // The subscription is never read: no reply reaches the store.
        let wait = acks
            .publish("s.a".into(), HeaderMap::new(), b"x".to_vec())
            .await
            .unwrap();
        assert_eq!(acks.waiting(), 1);
        let told = wait.await;
        assert_eq!(
            told,
            Err(format!("no store ack within {PUBLISH_ACK_TIMEOUT:?}"))
        );
        assert_eq!(acks.waiting(), 0);
    }

    #[tokio::test]
    async fn a_reply_for_a_store_that_gave_up_is_dropped() {
        let (_server, client) = server_with_stream().await;
        let (acks, mut sub) = StoreAcks::open(client).await.unwrap();
        let first = acks
            .publish("s.a".into(), with_id("1"), b"x".to_vec())
            .await
            .unwrap();
        let second = acks
            .publish("s.b".into(), with_id("2"), b"x".to_vec())
            .await
            .unwrap();
        // Given up before its reply came: its slot is let go (the oldest, so at once).
        drop(first);
        assert_eq!(acks.waiting(), 1);
        let told = settled(&acks, &mut sub, second).await;
        assert_eq!(
            told,
            Ok(StoreAck::Stored {
                seq: 2,
                duplicate: false
            })
        );
        // A stray reply on the prefix, and one past every token, change nothing.
        for token in ["0", "99", "x"] {
            acks.settle(async_nats::Message {
                subject: format!("{}{token}", acks.prefix).into(),
                reply: None,
                payload: b"{}"[..].into(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            });
        }
        assert_eq!(acks.waiting(), 0);
    }
}
