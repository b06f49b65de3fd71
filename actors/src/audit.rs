//! The audit emitter of one actor ([`protocol::audit`]): events are queued without waiting
//! and published in batches, so emitting never makes the hot path wait.
//!
//! [`Auditor::spawn`] returns the handle the actor (and its pumps) emit through, and the
//! flusher task, which the actor's state owns. An emit encodes the event into a shared
//! buffer ([`EncodedEvents`]; an uncontended lock; only the first event after a flush wakes
//! the flusher); [`FLUSH_EVERY`] after that event the flusher takes the buffer and publishes
//! it as batches of up to [`MAX_BATCH`](protocol::audit::MAX_BATCH) events on
//! `hub.audit.<role>.<name>`, with core publishes (no store ack is
//! awaited: the audit trail is best effort). An event that finds [`QUEUE`] events waiting is
//! dropped and counted ([`Auditor::dropped`]); once every handle is dropped the flusher
//! publishes what is left and ends. An emitter with nothing to say costs nothing: its flusher
//! sleeps without a timer until an event comes.
//!
//! Many emitters of one process that are mostly idle (the inboxes of a host of thousands of
//! agents) share one flusher instead, an [`AuditHub`]: each emitter keeps its own events,
//! subject and actor, and only the first event of a window puts it on the hub's list of what
//! to flush. Per emitter there is then no task at all, and no buffer while it is idle: the
//! buffers of published batches go back to the hub (a few), for any emitter's next batch.
//! Each flusher writes its payloads into one buffer whose room it takes back once the
//! connection sent them, so a steady stream allocates nothing per batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::audit::{AuditBatch, AuditEvent, EncodedEvents, EventRef, MAX_BATCH};
use protocol::error_chain::ErrorChain;

use crate::background::Owned;

/// The longest an event waits before its batch is published.
pub const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// Events held at most between two flushes (a burst beyond it is dropped and counted): a
/// window's worth at several hundred thousand events a second.
pub const QUEUE: usize = 32 * MAX_BATCH;
/// How long a flusher (or a hub's) finds nothing to publish before it gives back its buffers'
/// room.
const REST_AFTER: Duration = Duration::from_millis(100);

/// What the handles and the flusher share: the events since the last flush, encoded.
#[derive(Default)]
struct Shared {
    pending: Mutex<Queue>,
    dropped: AtomicU64,
    /// Wakes the flusher: for the first event after a flush, and when the last handle goes.
    wake: tokio::sync::Notify,
    /// Flushed by a hub's task, not by a task of its own.
    link: Option<HubLink>,
}

/// Where a hub's emitter publishes.
struct HubLink {
    hub: Arc<Hub>,
    subject: String,
    actor: Arc<str>,
}

/// The events since the last flush, encoded as they came: batches of at most [`MAX_BATCH`],
/// and emptied batches' buffers for the next ones (a steady stream allocates nothing).
#[derive(Default)]
struct Queue {
    batches: Vec<EncodedEvents>,
    events: usize,
    spare: Vec<EncodedEvents>,
}

impl Queue {
    /// Appends `event` to the last batch, or to a new one when that one is full: an emptied
    /// one of this emitter's, or of its `hub`'s, before a fresh one.
    fn push(&mut self, event: &EventRef<'_>, hub: Option<&Hub>) {
        if self.batches.last().is_none_or(|b| b.len() >= MAX_BATCH) {
            let batch = self
                .spare
                .pop()
                .or_else(|| hub.and_then(Hub::spare))
                .unwrap_or_default();
            self.batches.push(batch);
        }
        self.batches
            .last_mut()
            .expect("a batch was just ensured")
            .push(event);
        self.events += 1;
    }
}

/// What every clone of one emitter holds: when the last one goes, the flusher is woken to
/// publish what is left and end.
struct Handles(Arc<Shared>);

impl Drop for Handles {
    fn drop(&mut self) {
        self.0.wake.notify_one();
    }
}

/// A cheap handle to emit audit events through (clone it into every pump).
#[derive(Clone)]
pub struct Auditor {
    shared: Option<Arc<Handles>>,
    actor: Arc<str>,
}

impl Auditor {
    /// An emitter that emits nothing (audit events off, or core mode).
    pub fn off() -> Auditor {
        Auditor {
            shared: None,
            actor: Arc::from(""),
        }
    }

    /// An emitter for the actor `name` of `role` on `client`, and its flusher task.
    pub fn spawn(client: async_nats::Client, role: &str, name: &str) -> (Auditor, Owned) {
        let shared = Arc::new(Shared::default());
        let subject = protocol::subjects::audit(role, name);
        let actor: Arc<str> = Arc::from(format!("{role}:{name}"));
        let flusher =
            crate::background::spawn(flush(client, subject, actor.clone(), shared.clone()));
        let auditor = Auditor {
            shared: Some(Arc::new(Handles(shared))),
            actor,
        };
        (auditor, flusher)
    }

    /// Whether events go anywhere (builders can skip their work when not).
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// `<role>:<name>`: what events name as their actor.
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// Keeps `event` for the next flush, never waiting on I/O: when [`QUEUE`] events are
    /// already waiting it is dropped (counted).
    pub fn emit(&self, event: AuditEvent) {
        self.emit_refs([event.borrowed()]);
    }

    /// Keeps borrowed `events` for the next flush, in order, under one lock: each is encoded
    /// at once, so a hot path that builds [`EventRef`]s allocates nothing ([`Self::emit`]).
    pub fn emit_refs<'a>(&self, events: impl IntoIterator<Item = EventRef<'a>>) {
        if let Some(handles) = &self.shared {
            let shared = &handles.0;
            let first = {
                let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                let was_empty = pending.events == 0;
                let hub = shared.link.as_ref().map(|link| &*link.hub);
                for event in events {
                    if pending.events >= QUEUE {
                        shared.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    pending.push(&event, hub);
                }
                was_empty && pending.events > 0
            };
            // One wake-up per flush window, none per event: the flusher sleeps while idle.
            if first {
                match &shared.link {
                    None => shared.wake.notify_one(),
                    Some(link) => link.hub.mark(shared),
                }
            }
        }
    }

    /// A DM event of this actor, now (its batch names the actor).
    pub fn msg(&self, event: &'static str, msg_id: &str) -> AuditEvent {
        AuditEvent::msg(event, msg_id, protocol::expiry::now_ms(), "")
    }

    /// A task event of this actor, now (its batch names the actor).
    pub fn task(&self, event: &'static str, task_id: &str) -> AuditEvent {
        AuditEvent::task(event, task_id, protocol::expiry::now_ms(), "")
    }

    /// Events dropped because too many were waiting.
    pub fn dropped(&self) -> u64 {
        self.shared
            .as_ref()
            .map_or(0, |s| s.0.dropped.load(Ordering::Relaxed))
    }
}

/// One flusher for the emitters of many actors (cheap to clone): each keeps its events, and
/// the first event of a window puts it on the hub's list; [`FLUSH_EVERY`] later the hub's task
/// publishes what every listed emitter holds, on that emitter's subject. The task ends when
/// the last clone of the hub goes (what is still listed then is not published:
/// [`AuditHub::flush`] first).
#[derive(Clone)]
pub struct AuditHub(Arc<HubOwner>);

struct HubOwner {
    hub: Arc<Hub>,
    _task: Owned,
}

struct Hub {
    client: async_nats::Client,
    /// The emitters with events since the last flush, each once.
    dirty: Mutex<Vec<Arc<Shared>>>,
    wake: tokio::sync::Notify,
    /// Held while a flush publishes, with the buffer it writes payloads into: flushes follow
    /// one another, so an emitter's batches go out in order, and [`AuditHub::flush`] returns
    /// only once what was taken before it is published too.
    publishing: tokio::sync::Mutex<Payloads>,
    /// Published batches' buffers, emptied, for the emitters' next batches (at most
    /// [`HUB_SPARE`]): a busy emitter of the hub does not grow a fresh one every window, and an
    /// idle one holds none.
    spare: Mutex<Vec<EncodedEvents>>,
}

/// Most emptied batch buffers a hub keeps for its emitters.
const HUB_SPARE: usize = 8;

impl AuditHub {
    /// A hub publishing on `client`, and its task.
    pub fn new(client: async_nats::Client) -> AuditHub {
        let hub = Arc::new(Hub {
            client,
            dirty: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
            publishing: tokio::sync::Mutex::new(Payloads::default()),
            spare: Mutex::new(Vec::new()),
        });
        let task = crate::background::spawn(hub_flush(hub.clone()));
        AuditHub(Arc::new(HubOwner { hub, _task: task }))
    }

    /// An emitter for the actor `name` of `role`, flushed by this hub: it has no task of its
    /// own.
    pub fn emitter(&self, role: &str, name: &str) -> Auditor {
        let actor: Arc<str> = Arc::from(format!("{role}:{name}"));
        let shared = Shared {
            link: Some(HubLink {
                hub: self.0.hub.clone(),
                subject: protocol::subjects::audit(role, name),
                actor: actor.clone(),
            }),
            ..Shared::default()
        };
        Auditor {
            shared: Some(Arc::new(Handles(Arc::new(shared)))),
            actor,
        }
    }

    /// Publishes at once what every emitter of the hub holds (a shutdown's last flush), after
    /// a flush already under way.
    ///
    /// # Cancel safety
    /// Not cancel safe: what a cancelled flush took and had not published yet is lost.
    pub async fn flush(&self) {
        self.0.hub.publish().await;
    }
}

impl Hub {
    /// An emptied batch buffer, if one is spare.
    fn spare(&self) -> Option<EncodedEvents> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Lists `shared` for the next flush (its first event of a window).
    fn mark(&self, shared: &Arc<Shared>) {
        let first = {
            let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
            dirty.push(shared.clone());
            dirty.len() == 1
        };
        if first {
            self.wake.notify_one();
        }
    }

    /// Publishes what every listed emitter holds, one flush at a time.
    async fn publish(&self) {
        let mut out = self.publishing.lock().await;
        let out = &mut *out;
        let listed = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
        for shared in listed {
            let Some(link) = &shared.link else {
                continue;
            };
            // An event emitted from here on lists the emitter again.
            let batches = {
                let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                pending.events = 0;
                std::mem::take(&mut pending.batches)
            };
            for mut batch in batches {
                let payload = out.write(&batch, &link.actor);
                if let Err(e) = self.client.publish(link.subject.clone(), payload).await {
                    tracing::debug!(error = %ErrorChain(&e), "audit batch not published");
                }
                batch.clear();
                let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
                if spare.len() < HUB_SPARE {
                    spare.push(batch);
                }
            }
        }
    }
}

/// The hub's task: idle until an emitter is listed, then [`FLUSH_EVERY`] later publishes what
/// is listed; for as long as it runs (its owner aborts it).
async fn hub_flush(hub: Arc<Hub>) {
    loop {
        let wake = hub.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let idle = hub
            .dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if idle {
            // Idle for a while: a burst's room is given back. Not the moment a flush finds
            // nothing new, which happens between two windows of a steady stream: a buffer
            // that shrank then would grow again at once, on pages the kernel must zero first.
            if tokio::time::timeout(REST_AFTER, wake.as_mut())
                .await
                .is_err()
            {
                if let Ok(mut out) = hub.publishing.try_lock() {
                    out.rest();
                }
                hub.spare.lock().unwrap_or_else(|e| e.into_inner()).clear();
                wake.await;
            }
        }
        tokio::time::sleep(FLUSH_EVERY).await;
        hub.publish().await;
    }
}

/// Publishes `event` alone as process `name` of `role` (`hub.audit.<role>.<name>`) and flushes:
/// for a command or client whose events are rare (`runtime dlq`, an idempotency key's hit).
/// Best effort, as every audit event: a failure is a gap in `runtime trace`, not an error.
pub async fn emit_one(client: &async_nats::Client, role: &str, name: &str, event: AuditEvent) {
    let payload =
        AuditBatch::encode_events(&format!("{role}:{name}"), std::slice::from_ref(&event));
    let subject = protocol::subjects::audit(role, name);
    if let Err(e) = client.publish(subject, payload.into()).await {
        tracing::debug!(error = %ErrorChain(&e), "audit event not published");
    }
    let _ = client.flush().await;
}

/// [`FLUSH_EVERY`] after the first event of a window, takes what was emitted meanwhile and
/// publishes it, a batch of at most [`MAX_BATCH`] per message (core publishes: no store ack
/// is awaited); ends, after a last flush, once every handle is gone. Emitters only take an
/// uncontended lock to encode their events, and wake the flusher for a window's first event
/// only. Published batches' buffers go back to the queue for the next events, so a steady
/// stream allocates nothing per flush.
async fn flush(client: async_nats::Client, subject: String, actor: Arc<str>, shared: Arc<Shared>) {
    let mut taken: Vec<EncodedEvents> = Vec::new();
    let mut out = Payloads::default();
    loop {
        // Idle until the first event of a window (or the last handle's end): an emitter with
        // nothing to say costs no wake-ups.
        let mut rested = false;
        loop {
            let idle = shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .events
                == 0;
            if !idle || Arc::strong_count(&shared) == 1 {
                break;
            }
            if rested {
                shared.wake.notified().await;
                continue;
            }
            // Idle for a while: a burst's room is given back (an idle emitter holds little).
            // Not the moment a flush finds nothing new, which it mostly does between two
            // windows of a steady stream (the emitter has not run since): a buffer that shrank
            // then grew again at once, every window.
            if tokio::time::timeout(REST_AFTER, shared.wake.notified())
                .await
                .is_err()
            {
                let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                pending.spare.truncate(1);
                pending.spare.iter_mut().for_each(|b| b.shrink_to(KEEP));
                pending.spare.shrink_to_fit();
                pending.batches.shrink_to(1);
                drop(pending);
                taken.shrink_to(1);
                out.rest();
                rested = true;
            }
        }
        tokio::time::sleep(FLUSH_EVERY).await;
        let last = Arc::strong_count(&shared) == 1;
        {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut pending.batches, &mut taken);
            pending.events = 0;
        }
        for batch in &mut taken {
            let payload = out.write(batch, &actor);
            batch.clear();
            if let Err(e) = client.publish(subject.clone(), payload).await {
                tracing::debug!(error = %ErrorChain(&e), "audit batch not published");
            }
        }
        if last {
            return;
        }
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.spare.append(&mut taken);
    }
}

/// The bytes a buffer keeps while its emitter is idle (a few dozen events).
const KEEP: usize = 1024;

/// The buffer a flusher writes batches into, each split off as the payload it publishes. Once
/// the connection wrote (and dropped) the payloads of one flush, the next flush writes over
/// the same room: a steady stream of batches allocates none (a fresh buffer per batch was a
/// large allocation, on pages the kernel had to zero first).
#[derive(Default)]
struct Payloads(bytes::BytesMut);

impl Payloads {
    /// `batch`, written as emitted by `actor`, as a payload.
    fn write(&mut self, batch: &EncodedEvents, actor: &str) -> bytes::Bytes {
        use bytes::BufMut;
        // Takes back the whole room when no payload split off it is alive any more.
        self.0.reserve(batch.batch_len(actor));
        batch
            .write_batch(actor, &mut (&mut self.0).writer())
            .expect("writing to memory cannot fail");
        self.0.split().freeze()
    }

    /// Idle: gives back the room.
    fn rest(&mut self) {
        self.0 = bytes::BytesMut::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn events_are_published_in_batches_on_the_actors_subject() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let mut sub = client.subscribe("hub.audit.>").await.unwrap();
        client.flush().await.unwrap();
        let (auditor, flusher) = Auditor::spawn(client.clone(), "router", "sys1/router.a");
        for n in 0..650 {
            auditor.emit(auditor.msg("routed", &format!("m{n}")));
        }
        // Several under one lock keep their order too.
        let more: Vec<_> = (650..1300)
            .map(|n| auditor.msg("routed", &format!("m{n}")))
            .collect();
        auditor.emit_refs(more.iter().map(AuditEvent::borrowed));
        let mut seen = Vec::new();
        while seen.len() < 1300 {
            let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(msg.subject.as_str(), "hub.audit.router.sys1/router_a");
            let batch = AuditBatch::decode(&msg.payload).unwrap();
            assert!(batch.events.len() <= MAX_BATCH);
            seen.extend(batch.into_events());
        }
        let ids: Vec<_> = seen.iter().map(|e| e.msg_id.clone().unwrap()).collect();
        assert_eq!(ids, (0..1300).map(|n| format!("m{n}")).collect::<Vec<_>>());
        assert!(seen.iter().all(|e| e.actor == "router:sys1/router.a"));
        assert_eq!(auditor.dropped(), 0);
        // What was emitted just before the last handle went is still published.
        auditor.emit(auditor.msg("delivered", "m-last"));
        drop(auditor);
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .unwrap()
            .unwrap();
        let last = AuditBatch::decode(&msg.payload).unwrap().into_events();
        assert_eq!(last[0].msg_id.as_deref(), Some("m-last"));
        crate::background::join_within(flusher, Duration::from_secs(1)).await;
        let off = Auditor::off();
        off.emit(off.msg("x", "y"));
        assert!(!off.is_on());
    }

    #[tokio::test]
    async fn an_idle_flusher_wakes_for_an_event_and_ends_with_its_last_handle() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let mut sub = client.subscribe("hub.audit.inbox.>").await.unwrap();
        client.flush().await.unwrap();
        let (auditor, flusher) = Auditor::spawn(client.clone(), "inbox", "idle");
        // Idle, then one event: published within a window.
        tokio::time::sleep(FLUSH_EVERY * 5).await;
        let clone = auditor.clone();
        clone.emit(clone.msg("fetched", "m1"));
        let msg = tokio::time::timeout(Duration::from_secs(2), sub.next())
            .await
            .expect("the event is published")
            .unwrap();
        let events = AuditBatch::decode(&msg.payload).unwrap().events;
        assert_eq!(events.len(), 1);
        // Every handle gone while idle: the flusher ends by itself.
        drop((auditor, clone));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            crate::background::join_within(flusher, Duration::from_secs(30)).await;
            let _ = done_tx.send(());
        });
        tokio::time::timeout(Duration::from_secs(2), done_rx)
            .await
            .expect("the flusher ended once its last handle went")
            .unwrap();
    }

    #[tokio::test]
    async fn a_hub_flushes_each_emitter_on_its_own_subject_and_outlives_a_dropped_one() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let mut sub = client.subscribe("hub.audit.inbox.>").await.unwrap();
        client.flush().await.unwrap();
        let hub = AuditHub::new(client.clone());
        let (bob, carol) = (hub.emitter("inbox", "bob"), hub.emitter("inbox", "carol"));
        for n in 0..3 {
            bob.emit(bob.msg("fetched", &format!("b{n}")));
            carol.emit(carol.msg("fetched", &format!("c{n}")));
        }
        // Emitted, then gone at once (a stopped inbox): still published.
        carol.emit(carol.msg("delivered", "c-last"));
        drop(carol);
        let mut got: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        while got.values().map(Vec::len).sum::<usize>() < 7 {
            let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .expect("the hub publishes")
                .unwrap();
            let batch = AuditBatch::decode(&msg.payload).unwrap();
            for event in batch.into_events() {
                got.entry(msg.subject.to_string())
                    .or_default()
                    .push(format!("{}:{}", event.actor, event.msg_id.unwrap()));
            }
        }
        assert_eq!(
            got["hub.audit.inbox.bob"],
            ["inbox:bob:b0", "inbox:bob:b1", "inbox:bob:b2"]
        );
        assert_eq!(
            got["hub.audit.inbox.carol"],
            [
                "inbox:carol:c0",
                "inbox:carol:c1",
                "inbox:carol:c2",
                "inbox:carol:c-last"
            ]
        );
        // A later window lists the emitter again; a flush publishes without waiting for it.
        bob.emit(bob.msg("delivered", "b-later"));
        hub.flush().await;
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("the flush publishes")
            .unwrap();
        let events = AuditBatch::decode(&msg.payload).unwrap().into_events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].msg_id.as_deref(), Some("b-later"));
        // Nothing else was waiting.
        assert!(
            tokio::time::timeout(FLUSH_EVERY * 10, sub.next())
                .await
                .is_err(),
            "published twice"
        );
    }

    #[test]
    fn a_flusher_writes_over_the_room_of_payloads_already_sent() {
        let mut events = EncodedEvents::default();
        for i in 0..3 {
            events.push(&AuditEvent::msg("routed", &format!("m{i}"), 1_000 + i, "").borrowed());
        }
        let mut out = Payloads::default();
        let first = out.write(&events, "router:r");
        // While it is not sent, the next payload takes other room.
        let second = out.write(&events, "router:r");
        assert_eq!(first, second);
        let second_at = second.as_ptr();
        assert_ne!(first.as_ptr(), second_at);
        drop((first, second));
        // Sent (dropped): the next is written where the last one was.
        let third = out.write(&events, "router:r");
        assert_eq!(third.as_ptr(), second_at);
        let batch = AuditBatch::decode(&third).unwrap();
        assert_eq!(batch.actor, "router:r");
        assert_eq!(
            batch
                .events
                .iter()
                .map(|e| e.msg_id.as_deref().unwrap())
                .collect::<Vec<_>>(),
            ["m0", "m1", "m2"]
        );
    }

    #[tokio::test]
    async fn a_flusher_keeps_its_batches_room_between_windows_and_gives_it_back_once_idle() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let (auditor, _flusher) = Auditor::spawn(client, "router", "r");
        let shared = auditor.shared.as_ref().unwrap().0.clone();
        let room = || {
            let pending = shared.pending.lock().unwrap();
            pending.spare.iter().map(EncodedEvents::capacity).max()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let until = |what: &str| {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
        };
        for n in 0..200 {
            auditor.emit(auditor.msg("routed", &format!("m{n}")));
        }
        // Published: its batch's buffer is spare, with the room of 200 events, for the next
        // window (the flusher found nothing new at once, as between two windows of a stream).
        while room().is_none() {
            until("the window was not flushed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let kept = room().unwrap();
        assert!(
            kept > KEEP,
            "the room of a window was given back at once: {kept}"
        );
        // The next window writes into it.
        auditor.emit(auditor.msg("routed", "again"));
        assert_eq!(room(), None);
        while room().is_none() {
            until("the second window was not flushed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(room(), Some(kept));
        // Idle for a while: given back.
        while room().is_some_and(|r| r > KEEP) {
            until("an idle flusher kept its room");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_hub_s_emitters_reuse_published_batches_buffers_and_an_idle_hub_keeps_none() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let hub = AuditHub::new(client.clone());
        let spare = || hub.0.hub.spare.lock().unwrap().len();
        let bob = hub.emitter("inbox", "bob");
        bob.emit(bob.msg("fetched", "b0"));
        hub.flush().await;
        assert_eq!(spare(), 1);
        // The next window's batch is the published one's buffer.
        bob.emit(bob.msg("fetched", "b1"));
        assert_eq!(spare(), 0);
        hub.flush().await;
        assert_eq!(spare(), 1);
        // Idle: given back.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while spare() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "an idle hub kept its buffers"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
