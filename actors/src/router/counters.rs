//! The router's counters: shared between the actor and its pump task, read by snapshots.

crate::counters! {
    /// Live counters of one router incarnation (lock-free; the pump increments, snapshots read).
    pub struct RouterCounters => RouterCountersSnapshot {
        /// Envelopes stored in an inbox or task channel (store acked, ingress acked).
        stored,
        /// Of those, how many the stream reported as duplicates (already stored).
        duplicates,
        /// Envelopes published to a broadcast channel.
        broadcast,
        /// Ingress messages dropped by the replay guard.
        dropped_by_guard,
        /// Envelopes refused as malformed (terminated).
        malformed,
        /// Rejection notices stored in a sender's inbox.
        rejections_sent,
        /// Ingress messages nak'd for redelivery (store failed or timed out).
        naks,
        /// Envelopes currently between pull and ingress ack.
        in_flight,
        /// Times the pull loop re-issued its pulls (missed heartbeats, reconnects).
        reconnects,
        /// Tasks stored flagged `Hub-Check` (the worker reads their task channel before running
        /// them: they may have been stored or run before).
        flagged,
        /// Status requests ignored because their reply subject is not under the inbox prefix.
        replies_refused,
        /// Deadline checks scheduled for DMs with a `meta.expires_at`.
        expiry_checks_scheduled,
        /// Deadline checks the broker refused to schedule (the DM is stored; its sender may
        /// not be told should it expire unread).
        expiry_checks_failed,
        /// DMs the broker refused for a limit (a full inbox or stream, or over its size); their
        /// senders were told (`inbox_full`, `too_large`).
        refused_full,
        /// DMs refused because their sender was over `sender_rate_per_min` (`rate_limited`).
        rate_limited,
        /// DMs refused because their recipient was removed (`recipient_deleted`).
        refused_deleted,
        /// Refusal notices that could not be stored because the sender's own inbox was full
        /// (the refused envelope is terminated; nothing is retried for ever).
        notices_dropped,
    }
}

impl RouterCounters {
    /// One more stored envelope, a duplicate or not.
    pub fn add_stored(&self, duplicate: bool) {
        self.stored.bump();
        if duplicate {
            self.duplicates.bump();
        }
    }
}
