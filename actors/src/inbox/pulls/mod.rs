//! Shared pulls: every durable inbox of one connection pulls through one subscription.
//!
//! An inbox registers its consumer ([`InboxPulls::register`]) and gets a [`Puller`], which
//! issues the inbox's own pull requests (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`) with
//! the reply subject `<prefix>.<consumer>.<pull>`. One wildcard subscription on `<prefix>.>`
//! receives the messages of every inbox's pulls, and its demultiplexer puts each on the queue
//! of the consumer its subject names, in the order the broker sent them. Per inbox there is no
//! task, no subscription and no channel block: only a slot (a queue, a wake-up and two flags).
//!
//! - **Heartbeats** stop at the demultiplexer: they only mark their slot alive, so an idle
//!   inbox's pump never wakes for them.
//! - **One watchdog**, every [`WATCH_EVERY`], flags a slot for a new pull when its pulls have
//!   been silent for two heartbeats ([`SILENCE`]: the broker holds no pull of ours), and every
//!   slot when the connection was replaced (a new connection's broker holds none).
//! - **Accounting is per pull.** A pull's messages and its end (`408` at expiry, `409`) come on
//!   its own reply subject, so the puller knows exactly what each pull still owes; it tops up
//!   to its batch when what is owed and queued falls to half of it. The inbox never holds more
//!   than its batch of unacked DMs.
//! - **A stopped inbox's pulls live on at the broker** until they expire (the shared
//!   subscription keeps their reply subjects' interest), so messages still come for it. Its
//!   slot is *parked*, not removed: what comes is held there, kept from redelivery with
//!   progress acks ([`WATCH_EVERY`]), and handed to the next registration of the same
//!   consumer in this process (a restart, a new attach) as if it were its own, delivered once.
//!   A parked slot that nobody takes once its last pull expired is let go: what it holds is
//!   nak'd, and comes back to the consumer's next pull delivered twice. A nak at once would
//!   not do: the broker would hand the message to the next of the dead pulls, once per message
//!   they still owe, and a DM would run out of deliveries.
//!
//! The subscription and the two tasks are started by the first registration, and again by a
//! registration after they ended (the connection closed); they end when the last clone of the
//! [`InboxPulls`] is dropped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{Client, StatusCode};
use dashmap::DashMap;
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::pull::{classify, PullBook, PullReply};
use protocol::subjects;

use crate::background::Owned;

/// Idle heartbeat asked of every pull.
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(5);
/// Expiry of one pull request.
pub const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// How long a slot with pulls open may stay silent (no message, no heartbeat) before it pulls
/// again: two heartbeats.
pub const SILENCE: Duration = Duration::from_secs(10);
/// How often the watchdog looks at every slot.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long a puller waits after the broker refused a pull (no JetStream) or ended one with a
/// `409` (max waiting exceeded, a leadership change) before the next: the next would meet the
/// same answer at once.
const REFUSED_PAUSE: Duration = Duration::from_millis(250);

/// The pulls of one connection's durable inboxes (cheap to clone).
#[derive(Clone)]
pub struct InboxPulls(Arc<Shared>);

struct Shared {
    client: Client,
    /// The root of every pull's reply subject: a fresh inbox of the connection.
    prefix: String,
    slots: Arc<Slots>,
    /// The demultiplexer and the watchdog, while they run.
    running: tokio::sync::Mutex<Option<Running>>,
    /// Expiry of each pull ([`PULL_EXPIRES`]; shorter in tests).
    expires: Duration,
}

type Slots = DashMap<Box<str>, Arc<Slot>>;

struct Running {
    demux: Owned,
    _watchdog: Owned,
}

/// One registered consumer (or a parked one: its puller stopped).
#[derive(Default)]
struct Slot {
    /// The registration that holds it; 0 while parked.
    owner: AtomicU64,
    /// When its last pull was issued (ms, as `alive_ms`): a parked slot is let go once that
    /// pull expired.
    last_pull_ms: AtomicU64,
    queue: Mutex<VecDeque<async_nats::Message>>,
    wake: tokio::sync::Notify,
    /// When a message or a heartbeat last came for it, or a pull was last issued (ms since
    /// the process's first slot).
    alive_ms: AtomicU64,
    /// The watchdog asks for a new pull.
    repull: AtomicBool,
    /// The subscription ended: no message will come again.
    closed: AtomicBool,
    /// A message came since the watchdog last looked: the inbox is not idle, and its queue
    /// keeps its room.
    busy: AtomicBool,
}

/// The generation of the next registration (never 0: a parked slot's owner).
static REGISTRATIONS: AtomicU64 = AtomicU64::new(1);

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum PullsError {
    /// The shared subscription could not be made.
    #[error("cannot subscribe to the pull replies {subject}")]
    Subscribe {
        /// Its subject.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
}

impl InboxPulls {
    /// The pulls of `client`'s inboxes; nothing is subscribed until the first registration.
    pub fn new(client: Client) -> InboxPulls {
        InboxPulls::expiring(client, PULL_EXPIRES)
    }

    /// The same, with pulls that expire after `expires` (heartbeats at most a third of it).
    fn expiring(client: Client, expires: Duration) -> InboxPulls {
        let prefix = client.new_inbox();
        InboxPulls(Arc::new(Shared {
            client,
            prefix,
            slots: Arc::default(),
            running: tokio::sync::Mutex::new(None),
            expires,
        }))
    }

    /// Registers `consumer` of `stream` and returns the puller of its inbox, which issues
    /// pulls of at most `batch` messages. It takes over the slot of the consumer's previous
    /// registration, parked or not, with the messages held there (a previous puller still
    /// running ends: [`Pulled::Ended`]).
    ///
    /// # Errors
    /// [`PullsError::Subscribe`] when the shared subscription was not running and cannot be
    /// made.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is registered until it returns.
    pub async fn register(
        &self,
        stream: &str,
        consumer: &str,
        batch: usize,
    ) -> Result<Puller, PullsError> {
        self.ensure_running().await?;
        let generation = REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
        let slot = {
            let entry = self.0.slots.entry(consumer.into()).or_default();
            // Owned under the entry's lock, which the watchdog takes to let a parked slot go
            // (only while it is parked): it never lets go of one just taken. A puller still
            // running sees it is no longer the owner, and ends.
            entry.alive_ms.store(now_ms(), Ordering::Relaxed);
            entry.owner.store(generation, Ordering::Release);
            entry.value().clone()
        };
        #[cfg(test)]
        if let Some(hook) = ADOPTED.lock().unwrap().remove(consumer) {
            hook();
        }
        slot.wake.notify_one();
        Ok(Puller {
            pulls: self.clone(),
            consumer: consumer.into(),
            generation,
            slot,
            next_subject: subjects::consumer_next_request(stream, consumer),
            batch: batch.max(1),
            book: PullBook::default(),
            held_due: tokio::time::Instant::now(),
        })
    }

    /// How many consumers are registered, parked ones included (tests, snapshots).
    pub fn registered(&self) -> usize {
        self.0.slots.len()
    }

    /// How many of them are parked.
    pub fn parked(&self) -> usize {
        self.0
            .slots
            .iter()
            .filter(|s| s.owner.load(Ordering::Acquire) == 0)
            .count()
    }

    async fn ensure_running(&self) -> Result<(), PullsError> {
        let mut running = self.0.running.lock().await;
        if running.as_ref().is_some_and(|r| !r.demux.is_finished()) {
            return Ok(());
        }
        let subject = format!("{}.>", self.0.prefix);
        let subscriber = self
            .0
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|source| PullsError::Subscribe { subject, source })?;
        let demux = crate::background::spawn(demux(
            subscriber,
            self.0.client.clone(),
            self.0.prefix.len(),
            self.0.slots.clone(),
        ));
        let watchdog = crate::background::spawn(watchdog(
            self.0.client.clone(),
            self.0.slots.clone(),
            self.0.expires,
        ));
        *running = Some(Running {
            demux,
            _watchdog: watchdog,
        });
        Ok(())
    }
}

impl Slot {
    fn push(&self, msg: async_nats::Message) {
        self.queue.lock().expect("not poisoned").push_back(msg);
        self.busy.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn take_all(&self) -> VecDeque<async_nats::Message> {
        std::mem::take(&mut *self.queue.lock().expect("not poisoned"))
    }
}

/// Hands every message of the pull replies to its slot, until the subscription ends; then
/// closes every slot (their pumps fail, and their restarts subscribe again).
async fn demux(
    mut subscriber: async_nats::Subscriber,
    client: Client,
    prefix_len: usize,
    slots: Arc<Slots>,
) {
    while let Some(msg) = subscriber.next().await {
        // A message comes on its own subject, its ack subject naming its consumer; a status
        // (a heartbeat, a pull's end) on its pull's reply subject.
        let consumer = match (&msg.status, &msg.reply) {
            (None, Some(ack)) => subjects::parse_ack_consumer(ack),
            _ => subjects::parse_pull_reply(&msg.subject, prefix_len).map(|(c, _)| c),
        };
        let slot = consumer.and_then(|c| slots.get(c).map(|s| s.value().clone()));
        let Some(slot) = slot else {
            // A pull of a slot let go an instant ago (its last pull was expiring): back to the
            // consumer.
            if msg.status.is_none() {
                if let Some(reply) = msg.reply {
                    let _ = client.publish(reply, "-NAK".into()).await;
                }
            }
            continue;
        };
        slot.alive_ms.store(now_ms(), Ordering::Relaxed);
        if msg.status == Some(StatusCode::IDLE_HEARTBEAT) {
            continue;
        }
        slot.push(msg);
    }
    // Registrations after this one subscribe again and start with fresh slots.
    let ended: Vec<Arc<Slot>> = slots.iter().map(|s| s.value().clone()).collect();
    slots.clear();
    for slot in ended {
        slot.close();
    }
}

/// Flags for a new pull every slot that was silent for [`SILENCE`], and every slot once the
/// connection was replaced; keeps what parked slots hold from redelivery, and lets a parked
/// slot go once its last pull expired.
async fn watchdog(client: Client, slots: Arc<Slots>, expires: Duration) {
    let connects = || client.statistics().connects.load(Ordering::Acquire);
    let mut last_connects = connects();
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = now_ms();
        let reconnected = connects() != last_connects;
        last_connects = connects();
        let mut parked = Vec::new();
        for slot in slots.iter() {
            if slot.owner.load(Ordering::Acquire) == 0 {
                parked.push((slot.key().clone(), slot.value().clone()));
                continue;
            }
            {
                // An idle inbox (nothing came for a whole tick) holds no buffer: the room of
                // its last messages is given back. Not sooner: a queue a steady stream empties
                // again and again would grow again at once, a reallocation per burst.
                let mut queue = slot.queue.lock().expect("not poisoned");
                let busy = slot.busy.swap(false, Ordering::Relaxed);
                if !busy && queue.is_empty() && queue.capacity() > 0 {
                    *queue = VecDeque::new();
                }
            }
            let alive = slot.alive_ms.load(Ordering::Relaxed);
            if reconnected || now.saturating_sub(alive) >= ms(SILENCE) {
                // Judged again one silence later, not at every tick.
                slot.alive_ms.store(now, Ordering::Relaxed);
                slot.repull.store(true, Ordering::Release);
                slot.wake.notify_one();
            }
        }
        for (consumer, slot) in parked {
            let gone = let_go_if_expired(&slots, &consumer, &slot, now, expires);
            let held: Vec<async_nats::Subject> = if gone {
                slot.take_all()
                    .into_iter()
                    .filter_map(|m| m.reply)
                    .collect()
            } else {
                let queue = slot.queue.lock().expect("not poisoned");
                queue.iter().filter_map(|m| m.reply.clone()).collect()
            };
            let ack: &'static str = if gone { "-NAK" } else { "+WPI" };
            for reply in held {
                let _ = client.publish(reply, ack.into()).await;
            }
        }
    }
}

/// Removes the parked `slot` of `consumer` when its last pull expired (at `now`, pulls
/// expiring after `expires`) and it is still parked and still the consumer's; whether it did.
fn let_go_if_expired(
    slots: &Slots,
    consumer: &str,
    slot: &Arc<Slot>,
    now: u64,
    expires: Duration,
) -> bool {
    let expired =
        now.saturating_sub(slot.last_pull_ms.load(Ordering::Relaxed)) > ms(expires + WATCH_EVERY);
    expired
        && slots
            .remove_if(consumer, |_, s| {
                Arc::ptr_eq(s, slot) && s.owner.load(Ordering::Acquire) == 0
            })
            .is_some()
}

/// A test's hook, run in [`InboxPulls::register`] once the slot is taken (tests: what the
/// watchdog may do right then).
#[cfg(test)]
type AdoptHook = Box<dyn FnOnce() + Send>;

/// The hooks of [`AdoptHook`], by consumer.
#[cfg(test)]
static ADOPTED: std::sync::LazyLock<Mutex<std::collections::HashMap<String, AdoptHook>>> =
    std::sync::LazyLock::new(Default::default);

/// Milliseconds on a monotonic clock shared by the slots and the presence beats.
pub(super) fn now_ms() -> u64 {
    static EPOCH: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);
    // From 1: 0 means never.
    ms(EPOCH.elapsed()).saturating_add(1)
}

/// `d` in whole milliseconds (saturating).
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the puller hands its pump.
// Returned by value, once per message: boxing the message would allocate once per DM.
#[allow(clippy::large_enum_variant)]
pub enum Pulled {
    /// A message of the consumer: a core message, whose ack subject says its delivery
    /// ([`protocol::subjects::parse_ack_info`]) and which is acked with [`ack_with`]. Not a
    /// `jetstream::Message`, which holds a clone of a JetStream context: making and dropping
    /// one was a tenth of an inbox's own work per DM.
    Message(async_nats::Message),
    /// The broker ended a pull for a reason that stops the inbox: the consumer was deleted
    /// or is a push consumer, or it refuses the pull itself (its description).
    Gone(String),
    /// The shared subscription ended (the connection closed), or another registration of the
    /// same consumer replaced this one.
    Ended,
}

/// Acks the message whose ack subject is `reply` with `kind` on `client` (`kind`'s body on
/// that subject), as `jetstream::Message::ack_with` does. A message's last ack takes its
/// subject (`msg.reply.take()`): the subject is then sent, not copied first.
///
/// # Errors
/// No ack subject (the message is not a JetStream one), or the publish's error.
///
/// # Cancel safety
/// Cancel safe: a cancelled ack was not sent, or was sent whole.
pub async fn ack_with(
    client: &Client,
    reply: Option<async_nats::Subject>,
    kind: async_nats::jetstream::AckKind,
) -> Result<(), async_nats::Error> {
    let reply = reply.ok_or("a JetStream message without an ack subject")?;
    client.publish(reply, kind.into()).await?;
    Ok(())
}

/// One inbox's side of a registration: its pulls and what each still owes. Dropping it
/// deregisters the consumer.
pub struct Puller {
    pulls: InboxPulls,
    consumer: Box<str>,
    /// Its registration: the slot's owner while it holds it.
    generation: u64,
    slot: Arc<Slot>,
    next_subject: String,
    batch: usize,
    book: PullBook,
    /// When the messages waiting in its queue are next kept from redelivery
    /// ([`Puller::keep_held_alive`]).
    held_due: tokio::time::Instant,
}

impl Puller {
    /// The next message, pulling as needed; `repulls` is bumped for every pull issued again
    /// after a silence or a reconnect, or after the broker refused one.
    ///
    /// # Cancel safety
    /// Cancel safe: a message is taken off the queue only when it is returned, and a pull
    /// counted open but not sent is found silent and issued again.
    pub async fn next(&mut self, repulls: &crate::counters::Counter) -> Pulled {
        loop {
            if self.slot.closed.load(Ordering::Acquire)
                || self.slot.owner.load(Ordering::Acquire) != self.generation
            {
                return Pulled::Ended;
            }
            if self.slot.repull.swap(false, Ordering::AcqRel) && self.book.forget_all() {
                // The broker holds none of them (silent, or a new connection); a late message
                // of one is still handed over.
                repulls.bump();
                tracing::warn!(consumer = %self.consumer, "inbox pull silent past two heartbeats, or the connection was replaced; pulling again");
            }
            // What is queued now; its room is kept until the inbox is idle (the watchdog).
            let held = self.slot.queue.lock().expect("not poisoned").len();
            // Before the message is taken: the future does not hold one across the pull.
            // What came meanwhile was owed by a pull, and is counted as such.
            self.top_up(held).await;
            let msg = self.slot.queue.lock().expect("not poisoned").pop_front();
            let Some(msg) = msg else {
                self.slot.wake.notified().await;
                continue;
            };
            // The message's scope ends before the pause below: the future holds none there.
            let refused = {
                // One of this registration's pulls (a late status of an earlier one's pull of
                // the same number ends nothing of this one's).
                let pull = || {
                    subjects::parse_pull_reply(&msg.subject, self.pulls.0.prefix.len())
                        .and_then(|(_, id)| id)
                        .filter(|id| id.incarnation == self.generation)
                        .map(|id| id.pull)
                };
                let earlier = || {
                    subjects::parse_pull_reply(&msg.subject, self.pulls.0.prefix.len())
                        .and_then(|(_, id)| id)
                        .is_some_and(|id| id.incarnation != self.generation)
                };
                match classify(msg.status.map(|s| s.as_u16()), msg.description.as_deref()) {
                    PullReply::Message => {
                        self.book.received();
                        return Pulled::Message(msg);
                    }
                    // Stopped at the demultiplexer; counted alive there.
                    PullReply::Heartbeat => false,
                    PullReply::Ended => {
                        self.book.ended(pull());
                        false
                    }
                    PullReply::Interrupted if earlier() => false,
                    PullReply::Interrupted => {
                        tracing::warn!(consumer = %self.consumer, description = ?msg.description, "inbox pull ended by the broker; pulling again shortly");
                        repulls.bump();
                        self.book.ended(pull());
                        true
                    }
                    PullReply::Gone(why) => return Pulled::Gone(why),
                    PullReply::Refused => {
                        tracing::warn!(consumer = %self.consumer, status = ?msg.status, description = ?msg.description, "inbox pull refused; pulling again");
                        repulls.bump();
                        self.book.ended(pull());
                        true
                    }
                }
            };
            if refused {
                // Not at once: a broker without JetStream answers the next one at once.
                // Boxed: a rare path, not held by an idle inbox's future.
                Box::pin(tokio::time::sleep(REFUSED_PAUSE)).await;
            }
        }
    }

    /// Keeps the messages waiting in its queue from redelivery: when `every` has passed since
    /// it last did, a progress ack for each (`+WPI`, which restarts its ack timer). The inbox
    /// calls it between DMs and at every heartbeat of a slow handler, with `every` a third of
    /// the consumer's effective ack wait: a pull takes up to a batch of DMs, and those behind
    /// a slow handler would otherwise be redelivered, and run out of deliveries, while they
    /// wait their turn. A message gets its first beat at most two `every`s after it came.
    ///
    /// # Cancel safety
    /// Cancel safe: a progress ack not sent is sent at the next call.
    pub async fn keep_held_alive(&mut self, every: Duration) {
        if !self.held_beat_due() {
            return;
        }
        self.held_due = tokio::time::Instant::now() + every;
        let held: Vec<async_nats::Subject> = {
            let queue = self.slot.queue.lock().expect("not poisoned");
            queue.iter().filter_map(|m| m.reply.clone()).collect()
        };
        for reply in held {
            let _ = self.pulls.0.client.publish(reply, "+WPI".into()).await;
        }
    }

    /// Whether [`keep_held_alive`](Self::keep_held_alive) has something to do now (checked
    /// without a future: an inbox's own future holds no publish between DMs).
    pub fn held_beat_due(&self) -> bool {
        tokio::time::Instant::now() >= self.held_due
    }

    /// Issues the pull [`PullBook::top_up`] says is due, with `held` messages received and not
    /// settled.
    async fn top_up(&mut self, held: usize) {
        let was_open = self.book.is_open();
        let Some((pull, want)) = self.book.top_up(held, self.batch) else {
            return;
        };
        let now = now_ms();
        if !was_open {
            // Silence is judged from the first open pull on.
            self.slot.alive_ms.store(now, Ordering::Relaxed);
        }
        self.slot.last_pull_ms.store(now, Ordering::Relaxed);
        let reply =
            subjects::pull_reply(&self.pulls.0.prefix, &self.consumer, self.generation, pull);
        let expires = self.pulls.0.expires;
        let heartbeat = PULL_HEARTBEAT.min(expires / 3);
        let request = protocol::pull::next_request(want, expires, heartbeat);
        // Boxed: an idle inbox's future does not hold a publish (600 bytes, once per idle
        // inbox of a host); one allocation per pull.
        let publish = self.pulls.0.client.publish_with_reply(
            self.next_subject.clone(),
            reply,
            request.into(),
        );
        if let Err(e) = Box::pin(publish).await {
            // Counted open all the same: the watchdog finds it silent, and it is issued again.
            tracing::warn!(consumer = %self.consumer, error = %ErrorChain(&e), "inbox pull not sent");
        }
    }
}

impl Drop for Puller {
    fn drop(&mut self) {
        // Parked, unless another registration took it over meanwhile; with no pull of its
        // own still open at the broker, nothing can come for it any more: let go at once.
        let parked = self
            .slot
            .owner
            .compare_exchange(self.generation, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if parked && self.slot.last_pull_ms.load(Ordering::Relaxed) == 0 {
            self.pulls.0.slots.remove_if(&self.consumer, |_, s| {
                Arc::ptr_eq(s, &self.slot) && s.owner.load(Ordering::Acquire) == 0
            });
        }
    }
}

#[cfg(test)]
mod tests;
