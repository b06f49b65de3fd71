//! The presence beats of attached inboxes ([`protocol::presence`]): a record `online` in the
//! presence bucket under the agent's identity every beat, and `offline` when the inbox stops
//! cleanly. A beat that cannot be written is counted and tried again at the next one.
//!
//! One task beats for every durable inbox of a connection ([`PresenceBeats`]): an inbox
//! registers when it is bound and gets a [`BeatGuard`]; its first beat is written at once,
//! the next ones every `every` after it, so the beats of many inboxes are spread as their
//! attaches were. A guard dropped (a crash) stops the beats and leaves the last one to time
//! out; [`BeatGuard::offline`] (a clean stop) stops them, waits out a beat in flight, and
//! writes `offline`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use dashmap::DashMap;
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::presence::PresenceRecord;
use protocol::{subjects, AgentId};

use super::pulls::{ms, now_ms};
use super::InboxCounters;
use crate::background::Owned;

/// How long one write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Beats written at once, at most.
const WRITES_IN_FLIGHT: usize = 64;
/// The longest the task sleeps between two looks at what is due.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Writes `record` as `id`'s presence.
///
/// # Errors
/// [`AckedError`](crate::streams::AckedError) when the broker did not store it in time.
pub(super) async fn write(
    js: &jetstream::Context,
    id: &AgentId,
    record: &PresenceRecord,
) -> Result<(), crate::streams::AckedError> {
    let subject = subjects::kv_subject(subjects::PRESENCE_BUCKET, id.as_str());
    let payload = serde_json::to_vec(record).expect("a presence record serializes");
    crate::streams::publish_acked(
        js,
        subject,
        async_nats::HeaderMap::new(),
        payload.into(),
        WRITE_TIMEOUT,
    )
    .await
    .map(|_| ())
}

/// The beats of every registered inbox of one connection (cheap to clone). The task ends
/// when the last clone goes.
#[derive(Clone)]
pub(super) struct PresenceBeats(Arc<Owner>);

struct Owner {
    beats: Arc<Beats>,
    /// The beating task, started by the first registration.
    task: Mutex<Option<Owned>>,
}

struct Beats {
    js: jetstream::Context,
    entries: DashMap<AgentId, Arc<Beat>>,
    /// Wakes the task for a registration's first beat.
    wake: tokio::sync::Notify,
    /// How long the task sleeps between two looks (a quarter of the shortest beat, at most
    /// [`LOOK_EVERY`]), ms.
    look_ms: AtomicU64,
}

/// One registered inbox.
struct Beat {
    id: AgentId,
    every: Duration,
    counters: Arc<InboxCounters>,
    /// When the next beat is due (ms on the process's monotonic clock; 0: at once).
    due_ms: AtomicU64,
    /// Still registered: a beat collected before its guard went is not written.
    alive: AtomicBool,
    /// Held while one of its beats is written: `offline` waits for it.
    writing: tokio::sync::Mutex<()>,
}

impl PresenceBeats {
    /// Beats through `js`; nothing runs until the first registration.
    pub(super) fn new(js: jetstream::Context) -> PresenceBeats {
        PresenceBeats(Arc::new(Owner {
            beats: Arc::new(Beats {
                js,
                entries: DashMap::new(),
                wake: tokio::sync::Notify::new(),
                look_ms: AtomicU64::new(ms(LOOK_EVERY)),
            }),
            task: Mutex::new(None),
        }))
    }

    /// Beats `online` for `id` every `every`, the first at once, until the guard goes. A
    /// registration of an `id` registered already replaces it (a new incarnation).
    pub(super) fn register(
        &self,
        id: &AgentId,
        every: Duration,
        counters: Arc<InboxCounters>,
    ) -> BeatGuard {
        let beat = Arc::new(Beat {
            id: id.clone(),
            every,
            counters,
            due_ms: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            writing: tokio::sync::Mutex::new(()),
        });
        let beats = &self.0.beats;
        if let Some(old) = beats.entries.insert(id.clone(), beat.clone()) {
            old.alive.store(false, Ordering::Release);
        }
        let look = ms(every / 4).clamp(50, ms(LOOK_EVERY));
        beats.look_ms.fetch_min(look, Ordering::Relaxed);
        self.ensure_running();
        beats.wake.notify_one();
        BeatGuard {
            beats: self.clone(),
            beat,
        }
    }

    /// How many inboxes beat (tests, snapshots).
    #[cfg(test)]
    fn registered(&self) -> usize {
        self.0.beats.entries.len()
    }

    fn ensure_running(&self) {
        let mut task = self.0.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(Owned::is_finished) {
            *task = Some(crate::background::spawn(run(self.0.beats.clone())));
        }
    }
}

/// An inbox's registration: its beats stop when it is dropped.
pub(super) struct BeatGuard {
    beats: PresenceBeats,
    beat: Arc<Beat>,
}

impl BeatGuard {
    /// A clean stop: no beat after this, and `offline` written (a failure is logged).
    pub(super) async fn offline(self) {
        self.stop();
        // A beat collected before the stop finishes first, so that it cannot land after the
        // offline record.
        let _writing = self.beat.writing.lock().await;
        let record = PresenceRecord::offline(protocol::expiry::now_ms(), self.beat.every.as_secs());
        if let Err(e) = write(&self.beats.0.beats.js, &self.beat.id, &record).await {
            tracing::warn!(id = %self.beat.id, error = %ErrorChain(&e), "offline marker not stored");
        }
    }

    fn stop(&self) {
        self.beat.alive.store(false, Ordering::Release);
        self.beats
            .0
            .beats
            .entries
            .remove_if(&self.beat.id, |_, b| Arc::ptr_eq(b, &self.beat));
    }
}

impl Drop for BeatGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes every beat that is due, [`WRITES_IN_FLIGHT`] at a time, then sleeps until the next
/// look (or a registration), for as long as it runs (its owner aborts it).
async fn run(beats: Arc<Beats>) {
    loop {
        let wake = beats.wake.notified();
        tokio::pin!(wake);
        // Registered before the look: a registration during the writes is not missed.
        wake.as_mut().enable();
        let now = now_ms();
        let due: Vec<Arc<Beat>> = beats
            .entries
            .iter()
            .filter(|b| b.due_ms.load(Ordering::Relaxed) <= now)
            .map(|b| b.value().clone())
            .collect();
        for beat in &due {
            beat.due_ms
                .store(now.saturating_add(ms(beat.every)), Ordering::Relaxed);
        }
        let js = &beats.js;
        // Boxed: between looks the task holds only its wait.
        Box::pin(futures::stream::iter(due).for_each_concurrent(
            WRITES_IN_FLIGHT,
            |beat| async move {
                let _writing = beat.writing.lock().await;
                if !beat.alive.load(Ordering::Acquire) {
                    return;
                }
                let record =
                    PresenceRecord::online(protocol::expiry::now_ms(), beat.every.as_secs());
                match write(js, &beat.id, &record).await {
                    Ok(()) => beat.counters.presence_beats.bump(),
                    Err(e) => {
                        beat.counters.presence_failures.bump();
                        tracing::warn!(id = %beat.id, error = %ErrorChain(&e), "presence beat not stored");
                    }
                }
            },
        ))
        .await;
        if beats.entries.is_empty() {
            // Nothing to beat for: asleep until a registration.
            wake.await;
            continue;
        }
        let look = Duration::from_millis(beats.look_ms.load(Ordering::Relaxed));
        let _ = tokio::time::timeout(look, wake).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::presence::PresenceState;

    const WITHIN: Duration = Duration::from_secs(10);

    async fn state(kv: &jetstream::kv::Store, id: &str) -> PresenceState {
        let value = kv.get(id).await.unwrap().expect("a record");
        serde_json::from_slice::<PresenceRecord>(&value)
            .unwrap()
            .state
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn one_task_beats_for_every_inbox_and_a_clean_stop_writes_offline_last() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        let kv = js
            .create_key_value(jetstream::kv::Config {
                bucket: subjects::PRESENCE_BUCKET.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let beats = PresenceBeats::new(js.clone());
        let (a, b) = (AgentId::new("a").unwrap(), AgentId::new("b").unwrap());
        let (ca, cb) = (
            Arc::new(InboxCounters::default()),
            Arc::new(InboxCounters::default()),
        );
        let every = Duration::from_secs(1);
        let ga = beats.register(&a, every, ca.clone());
        // The first beat comes at once, not a beat later.
        until("a's first beat", || ca.presence_beats.get() == 1).await;
        let gb = beats.register(&b, every, cb.clone());
        until("b's first beat", || cb.presence_beats.get() == 1).await;
        assert_eq!(beats.registered(), 2);
        // Then once a beat each.
        until("more beats", || {
            ca.presence_beats.get() >= 3 && cb.presence_beats.get() >= 3
        })
        .await;
        assert_eq!(state(&kv, "a").await, PresenceState::Online);
        // A crash (the guard dropped): no more beats.
        drop(ga);
        let after = ca.presence_beats.get();
        tokio::time::sleep(every * 2).await;
        assert_eq!(ca.presence_beats.get(), after);
        // A clean stop: offline, and no beat lands after it.
        gb.offline().await;
        assert_eq!(state(&kv, "b").await, PresenceState::Offline);
        tokio::time::sleep(every * 2).await;
        assert_eq!(state(&kv, "b").await, PresenceState::Offline);
        assert_eq!(beats.registered(), 0);
        assert_eq!(
            (ca.presence_failures.get(), cb.presence_failures.get()),
            (0, 0)
        );
    }
}
