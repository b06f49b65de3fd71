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
//! ([`advisories_caught_up`]). Each inbox is then purged of the DMs below its floor plus one,
//! and stored before the duplicate window ([`keep_from`], [`window_start_ms`]): nats-server
//! rebuilds its dedupe ids from the stored messages of the window when it restarts, so a DM
//! trimmed within the window would be stored again by a router's retry.

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

/// How much older than the duplicate window a DM must be before it is trimmed, for the clocks
/// of the router and the broker to differ.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// The sequence from which an inbox keeps its DMs: above its consumer's `ack_floor` (everything
/// at or below it was handled), and from `first_in_window`, its first DM stored within the
/// duplicate window (and [`CLOCK_MARGIN`]), if any. The broker rebuilds its dedupe ids from the
/// stored messages of the window when it restarts: a DM trimmed within the window would be
/// stored again by a router's retry afterwards. `None` when nothing is to be trimmed.
#[must_use]
pub fn keep_from(ack_floor: u64, first_in_window: Option<u64>) -> Option<u64> {
    let above_floor = ack_floor.saturating_add(1);
    let keep = first_in_window.map_or(above_floor, |first| first.min(above_floor));
    (keep > 1).then_some(keep)
}

/// When the DMs that are kept for the dedupe start, in unix ms: `duplicate_window` and
/// [`CLOCK_MARGIN`] before `now_ms`.
#[must_use]
pub fn window_start_ms(now_ms: u64, duplicate_window: Duration) -> u64 {
    let kept = duplicate_window.saturating_add(CLOCK_MARGIN);
    now_ms.saturating_sub(u64::try_from(kept.as_millis()).unwrap_or(u64::MAX))
}

/// The body of the direct get of the first DM stored on `subject` at or after `since_ms`
/// (unix ms): `{"start_time": <RFC 3339>, "next_by_subj": <subject>}`.
#[must_use]
pub fn first_since_request(subject: &str, since_ms: u64) -> String {
    let nanos = i128::from(since_ms) * 1_000_000;
    let since = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let since = since
        .format(&time::format_description::well_known::Rfc3339)
        .expect("a time after 1970 formats as RFC 3339");
    serde_json::json!({"start_time": since, "next_by_subj": subject}).to_string()
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

/// A DM refused for its recipient's read history: when a round can trim the inbox's oldest DM
/// (once it is older than the duplicate window), and when its sender may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryRetry {
    /// When to ask the history actor for a round.
    pub trim_in: Duration,
    /// The refusal's `retry_after_secs`: that round, which may have to follow one already
    /// settling, each taking [`SETTLE`] and a little.
    pub retry_after_secs: u64,
}

/// Whether a DM refused because its recipient's inbox is at its cap was refused for read
/// history: the inbox's oldest DM (`oldest_seq`, stored `oldest_age_secs` ago) is at or below
/// its consumer's `ack_floor`, so a round frees room once that DM is older than
/// `duplicate_window` and [`CLOCK_MARGIN`]. `None` when the oldest DM is not handled yet (a
/// trim frees nothing: room comes back as DMs are handled or age out), the floor is unknown, or
/// nothing trims.
#[must_use]
pub fn history_retry(
    oldest_seq: u64,
    oldest_age_secs: u64,
    ack_floor: Option<u64>,
    trimming: bool,
    duplicate_window: Duration,
) -> Option<HistoryRetry> {
    if !trimming || ack_floor? < oldest_seq {
        return None;
    }
    let kept = duplicate_window.saturating_add(CLOCK_MARGIN).as_secs();
    let trim_in = kept.saturating_sub(oldest_age_secs);
    Some(HistoryRetry {
        trim_in: Duration::from_secs(trim_in),
        retry_after_secs: trim_in + 2 * SETTLE.as_secs() + 1,
    })
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
        assert_eq!(keep_from(0, None), None);
        assert_eq!(keep_from(41, None), Some(42));
    }

    #[test]
    fn what_was_stored_within_the_duplicate_window_is_kept_even_when_read() {
        assert_eq!(keep_from(41, Some(30)), Some(30));
        assert_eq!(keep_from(41, Some(50)), Some(42));
        assert_eq!(keep_from(41, Some(1)), None);
    }

    #[test]
    fn the_window_starts_the_duplicate_window_and_the_margin_ago() {
        assert_eq!(
            window_start_ms(1_000_000, Duration::from_secs(120)),
            875_000
        );
        assert_eq!(window_start_ms(1_000, Duration::from_secs(120)), 0);
    }

    #[test]
    fn the_first_dm_since_a_time_is_asked_for_by_subject() {
        let body: serde_json::Value =
            serde_json::from_str(&first_since_request("channel.inbox.bob", 1_700_000_000_250))
                .unwrap();
        assert_eq!(body["next_by_subj"], "channel.inbox.bob");
        assert_eq!(body["start_time"], "2023-11-14T22:13:20.25Z");
    }

    #[test]
    fn a_full_inbox_of_unread_dms_is_not_retried_soon() {
        let window = Duration::from_secs(120);
        // The oldest DM (seq 7) not handled yet: a DM handled out of order above a stuck floor
        // is not room a trim frees.
        assert_eq!(history_retry(7, 500, Some(6), true, window), None);
        assert_eq!(history_retry(7, 500, None, true, window), None);
        assert_eq!(history_retry(7, 500, Some(9), false, window), None);
    }

    #[test]
    fn read_history_is_trimmed_once_out_of_the_duplicate_window() {
        let window = Duration::from_secs(120);
        // Old enough: a round now.
        let now = history_retry(7, 500, Some(7), true, window).unwrap();
        assert_eq!((now.trim_in, now.retry_after_secs), (Duration::ZERO, 11));
        // Stored 100 s ago: out of the window and the margin in 25 s.
        let later = history_retry(7, 100, Some(9), true, window).unwrap();
        assert_eq!(
            (later.trim_in, later.retry_after_secs),
            (Duration::from_secs(25), 36)
        );
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
        fn what_is_kept_starts_just_above_the_floor_or_at_the_window(
            floor in 1u64..u64::MAX - 1,
            first in proptest::option::of(2u64..u64::MAX),
        ) {
            let keep = keep_from(floor, first);
            let expected = first.map_or(floor + 1, |f| f.min(floor + 1));
            prop_assert_eq!(keep, Some(expected));
            // Nothing above the floor, nothing stored within the window, is trimmed.
            prop_assert!(keep.unwrap() <= floor + 1);
            if let Some(first) = first {
                prop_assert!(keep.unwrap() <= first);
            }
        }
    }
}
