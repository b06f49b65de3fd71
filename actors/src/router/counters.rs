//! The router's counters: shared between the actor and its pump task, read by snapshots.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Live counters of one router incarnation (lock-free; the pump increments, snapshots read).
#[derive(Debug, Default)]
pub struct RouterCounters {
    stored: AtomicU64,
    duplicates: AtomicU64,
    broadcast: AtomicU64,
    dropped_by_guard: AtomicU64,
    malformed: AtomicU64,
    rejections_sent: AtomicU64,
    naks: AtomicU64,
    in_flight: AtomicU64,
    reconnects: AtomicU64,
}

/// A point-in-time copy of [`RouterCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterCountersSnapshot {
    /// Envelopes stored in an inbox or task channel (store acked, ingress acked).
    pub stored: u64,
    /// Of those, how many the stream reported as duplicates (already stored).
    pub duplicates: u64,
    /// Envelopes published to a broadcast channel.
    pub broadcast: u64,
    /// Ingress messages dropped by the replay guard.
    pub dropped_by_guard: u64,
    /// Envelopes refused as malformed (terminated).
    pub malformed: u64,
    /// Rejection notices stored in a sender's inbox.
    pub rejections_sent: u64,
    /// Ingress messages nak'd for redelivery (store failed or timed out).
    pub naks: u64,
    /// Envelopes currently between pull and ingress ack.
    pub in_flight: u64,
    /// Times the pull loop re-issued its pulls (missed heartbeats, reconnects).
    pub reconnects: u64,
}

macro_rules! bump {
    ($($name:ident),*) => {
        $(
            #[doc = concat!("Adds one to `", stringify!($name), "`.")]
            pub fn $name(&self) {
                self.$name.fetch_add(1, Ordering::Relaxed);
            }
        )*
    };
}

impl RouterCounters {
    /// Increments used by the pumps (named after the counter they bump).
    pub fn add_stored(&self, duplicate: bool) {
        self.stored.fetch_add(1, Ordering::Relaxed);
        if duplicate {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
        }
    }

    bump!(
        broadcast,
        dropped_by_guard,
        malformed,
        rejections_sent,
        naks,
        reconnects
    );

    /// One more envelope in flight.
    pub fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// One envelope left the pipeline.
    pub fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Copies the counters.
    pub fn snapshot(&self) -> RouterCountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RouterCountersSnapshot {
            stored: get(&self.stored),
            duplicates: get(&self.duplicates),
            broadcast: get(&self.broadcast),
            dropped_by_guard: get(&self.dropped_by_guard),
            malformed: get(&self.malformed),
            rejections_sent: get(&self.rejections_sent),
            naks: get(&self.naks),
            in_flight: get(&self.in_flight),
            reconnects: get(&self.reconnects),
        }
    }
}
