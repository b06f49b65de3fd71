//! The broker's clock, as a process measures it: deadlines (`meta.expires_at`) are judged in
//! server time, so a process whose own clock is off still expires messages when the broker
//! says they expire (design: Expiry_UsesServerTime), and `runtime doctor` reports a skew.
//!
//! A JetStream API reply names the server's time (`ts`, RFC 3339). A process sends a request
//! at local time `sent`, reads the reply at `received`, and takes the server's `ts` as the
//! middle of that round trip: the offset is `ts - (sent + received) / 2`, uncertain by half
//! the round trip. Server time is then the local clock plus the offset.
//!
//! ```
//! use protocol::clock::{measure, skew_verdict, SkewVerdict};
//!
//! // The local clock runs 10 minutes ahead: the server said 1,000 when we read 601,000.
//! let m = measure(600_990, "1970-01-01T00:00:01Z", 601_010).unwrap();
//! assert_eq!((m.offset_ms, m.uncertainty_ms), (-600_000, 10));
//! assert_eq!(skew_verdict(m.offset_ms), SkewVerdict::Skewed);
//! ```

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// An offset above this (either way) is a skew worth reporting (the design's 30 s).
pub const SKEW_WARN_MS: i64 = 30_000;

/// One measurement of the server's clock against the local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Server time minus local time, ms.
    pub offset_ms: i64,
    /// Half the round trip, ms: the offset is right within it.
    pub uncertainty_ms: i64,
}

/// Why a server time cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    /// The reply's `ts` is not an RFC 3339 time.
    #[error("server time {0:?} is not an rfc 3339 time")]
    Unreadable(String, #[source] time::error::Parse),
    /// The reply was read before the request was sent (the local clock stepped back).
    #[error("the local clock went back during the measurement")]
    WentBack,
}

/// The offset of the server's time `server_ts` (RFC 3339) read between local times `sent_ms`
/// and `received_ms`.
///
/// # Errors
/// [`ClockError::Unreadable`] for a `ts` that is not RFC 3339, [`ClockError::WentBack`] when
/// `received_ms < sent_ms`.
pub fn measure(sent_ms: u64, server_ts: &str, received_ms: u64) -> Result<Measured, ClockError> {
    if received_ms < sent_ms {
        return Err(ClockError::WentBack);
    }
    let server = OffsetDateTime::parse(server_ts, &Rfc3339)
        .map_err(|e| ClockError::Unreadable(server_ts.to_owned(), e))?;
    let server_ms = i64::try_from(server.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
    let mid = i64::try_from(sent_ms / 2 + received_ms / 2 + (sent_ms % 2 + received_ms % 2) / 2)
        .unwrap_or(i64::MAX);
    let half_trip = i64::try_from((received_ms - sent_ms) / 2).unwrap_or(i64::MAX);
    Ok(Measured {
        offset_ms: server_ms.saturating_sub(mid),
        uncertainty_ms: half_trip,
    })
}

/// The server's time now, from the local time and the last offset measured.
pub fn server_now(local_ms: u64, offset_ms: i64) -> u64 {
    local_ms.saturating_add_signed(offset_ms)
}

/// What an offset says about the local clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkewVerdict {
    /// Within [`SKEW_WARN_MS`] of the server's.
    Ok,
    /// Off by more: deadlines are still judged in server time, but the clock wants fixing
    /// (and `expires_at` set from it is off by as much).
    Skewed,
}

/// The verdict on `offset_ms`.
pub fn skew_verdict(offset_ms: i64) -> SkewVerdict {
    if offset_ms.unsigned_abs() > SKEW_WARN_MS.unsigned_abs() {
        SkewVerdict::Skewed
    } else {
        SkewVerdict::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_brokers_nanosecond_times_are_read() {
        let m = measure(
            1_796_164_453_000,
            "2026-12-01T22:34:13.016340398Z",
            1_796_164_453_020,
        )
        .unwrap();
        assert_eq!(m.offset_ms, 1_796_164_453_016 - 1_796_164_453_010);
        assert_eq!(m.uncertainty_ms, 10);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            measure(0, "yesterday", 1),
            Err(ClockError::Unreadable(..))
        ));
        assert!(matches!(
            measure(5, "1970-01-01T00:00:00Z", 4),
            Err(ClockError::WentBack)
        ));
    }

    #[test]
    fn thirty_seconds_is_the_line() {
        assert_eq!(skew_verdict(30_000), SkewVerdict::Ok);
        assert_eq!(skew_verdict(-30_000), SkewVerdict::Ok);
        assert_eq!(skew_verdict(30_001), SkewVerdict::Skewed);
        assert_eq!(skew_verdict(-600_000), SkewVerdict::Skewed);
    }

    proptest! {
        /// Whatever the local clock's error, the measured server time is within the
        /// uncertainty of the true one.
        #[test]
        fn server_time_is_recovered_within_half_the_round_trip(
            true_server_ms in 1_000_000_000_000u64..2_000_000_000_000,
            skew_ms in -3_600_000i64..3_600_000,
            to_server in 0u64..500,
            back in 0u64..500,
        ) {
            let sent = true_server_ms.saturating_add_signed(skew_ms);
            let at_server = true_server_ms + to_server;
            let received = sent + to_server + back;
            let secs = i64::try_from(at_server / 1000).unwrap();
            let ts = OffsetDateTime::from_unix_timestamp(secs).unwrap()
                + time::Duration::milliseconds(i64::try_from(at_server % 1000).unwrap());
            let ts = ts.format(&Rfc3339).unwrap();
            let m = measure(sent, &ts, received).unwrap();
            // Server time at `received`, as estimated, against the truth.
            let estimated = server_now(received, m.offset_ms);
            let truth = at_server + back;
            prop_assert!(estimated.abs_diff(truth) <= u64::try_from(m.uncertainty_ms).unwrap() + 1,
                "estimated {estimated} truth {truth} {m:?}");
        }
    }
}
