//! Read DMs leave the inbox (docs/SEMANTICS.md, "An inbox's cap counts what it has not read").
//!
//! The inbox stream keeps what it stores (limits retention), and its per-inbox cap
//! (`inbox.max_msgs_per_subject`, discard new per subject) counts every DM stored on an inbox
//! subject, read or not. So the routers trim what each inbox has read: every
//! `inbox.trim_interval_secs` a router counts the DMs stored per inbox and, for each inbox
//! holding at least half its cap ([`trim_threshold`]), reads its consumer's ack floor (every
//! DM at or below it was acked, terminated or ran out of deliveries). A DM below the floor may
//! still be wanted by the expiry actor: a terminated or undeliverable DM is read back, by
//! sequence, when its advisory is taken, for its dead-letter copy or its sender's notice. So
//! the router waits [`SETTLE`] (the broker has then stored the advisories of everything at or
//! below the floors it read), reads the last sequence of the advisories stream, and purges
//! only once the advisories consumer has acked everything up to it
//! ([`advisories_caught_up`]). Each inbox is then purged of the DMs below its floor plus one
//! ([`keep_from`]).

use std::time::Duration;

/// How long after reading the ack floors the router reads the advisories stream's last
/// sequence: the broker stores an advisory within this of the termination it reports.
pub const SETTLE: Duration = Duration::from_secs(5);

/// How long the router waits for the advisories consumer to catch up before it gives the round
/// up (counted `deferred`; the next round starts over).
pub const CATCH_UP: Duration = Duration::from_secs(60);

/// The number of DMs stored on an inbox from which its read history is trimmed: half its cap
/// (at least 1). `None` when inboxes are not capped: nothing is refused for history.
#[must_use]
pub fn trim_threshold(cap: Option<u64>) -> Option<u64> {
    cap.map(|cap| (cap / 2).max(1))
}

/// The sequence from which an inbox keeps its DMs when its consumer's ack floor is
/// `ack_floor`: everything below it was handled. `None` when nothing was.
#[must_use]
pub fn keep_from(ack_floor: u64) -> Option<u64> {
    (ack_floor > 0).then(|| ack_floor.saturating_add(1))
}

/// Where the advisories consumer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdvisoryProgress {
    /// The consumer's ack floor (stream sequence).
    pub ack_floor: u64,
    /// Advisories not yet delivered.
    pub pending: u64,
    /// Advisories delivered and not yet acked.
    pub ack_pending: u64,
}

/// Whether every advisory stored up to `last_seq` (the advisories stream's last sequence, read
/// [`SETTLE`] after the ack floors) was handled: the consumer's ack floor reached it, or it
/// holds nothing at all.
#[must_use]
pub fn advisories_caught_up(last_seq: u64, progress: AdvisoryProgress) -> bool {
    progress.ack_floor >= last_seq || (progress.pending == 0 && progress.ack_pending == 0)
}

/// The `retry_after_secs` of a DM refused for read history: the router asks for a round at
/// once, which may have to follow one already settling; each takes [`SETTLE`] and a little.
pub const HISTORY_RETRY_AFTER_SECS: u64 = 2 * SETTLE.as_secs() + 1;

/// Whether a DM refused because its recipient's inbox is at its cap was refused for read
/// history: the inbox's oldest DM (`oldest_seq`) is at or below its consumer's `ack_floor`, so
/// a round (asked for at once, when `trimming`) frees room. Then its `retry_after_secs`,
/// [`HISTORY_RETRY_AFTER_SECS`]. `None` when the oldest DM is not handled yet (a trim frees
/// nothing: room comes back as DMs are handled or age out), the floor is unknown, or nothing
/// trims.
#[must_use]
pub fn history_retry_after(oldest_seq: u64, ack_floor: Option<u64>, trimming: bool) -> Option<u64> {
    (trimming && ack_floor? >= oldest_seq).then_some(HISTORY_RETRY_AFTER_SECS)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_uncapped_inbox_is_not_trimmed_and_a_capped_one_from_half_its_cap() {
        assert_eq!(trim_threshold(None), None);
        assert_eq!(trim_threshold(Some(10_000)), Some(5_000));
        assert_eq!(trim_threshold(Some(3)), Some(1));
        assert_eq!(trim_threshold(Some(1)), Some(1));
    }

    #[test]
    fn an_inbox_that_handled_nothing_keeps_everything() {
        assert_eq!(keep_from(0), None);
        assert_eq!(keep_from(41), Some(42));
    }

    #[test]
    fn a_full_inbox_of_unread_dms_is_not_retried_soon() {
        // The oldest DM (seq 7) not handled yet: a DM handled out of order above a stuck floor
        // is not room a trim frees.
        assert_eq!(history_retry_after(7, Some(6), true), None);
        assert_eq!(history_retry_after(7, None, true), None);
        assert_eq!(history_retry_after(7, Some(7), true), Some(11));
        assert_eq!(history_retry_after(7, Some(9), false), None);
    }

    proptest! {
        #[test]
        fn advisories_are_caught_up_only_once_the_last_one_is_acked_or_none_is_left(
            last in 0u64..1_000,
            floor in 0u64..1_000,
            pending in 0u64..5,
            ack_pending in 0u64..5,
        ) {
            let progress = AdvisoryProgress { ack_floor: floor, pending, ack_pending };
            let caught_up = advisories_caught_up(last, progress);
            prop_assert_eq!(caught_up, floor >= last || pending + ack_pending == 0);
        }

        #[test]
        fn what_is_kept_starts_just_above_the_floor(floor in 1u64..u64::MAX) {
            prop_assert_eq!(keep_from(floor), Some(floor + 1));
        }
    }
}
