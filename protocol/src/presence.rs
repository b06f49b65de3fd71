//! Presence: whether an agent is online, from the heartbeats of its attached inbox.
//!
//! An inbox consumer bound to a durable inbox writes its agent's [`PresenceRecord`] into the
//! KV bucket [`PRESENCE_BUCKET`](crate::subjects::PRESENCE_BUCKET) under the agent's identity
//! every `presence_beat_secs` (default 20 s), and an `offline` record when it stops cleanly. A
//! record is good for [`BEATS_VALID`] beats: an `online` record older than that (its process died
//! without a word) reads as offline ([`state_of`]). The record itself is kept as the agent's last
//! sighting, for `runtime presence`.
//!
//! ```
//! use protocol::presence::{state_of, PresenceRecord, PresenceState};
//!
//! let beat = PresenceRecord::online(1_000, 20);
//! assert_eq!(state_of(Some(&beat), 30_000), PresenceState::Online);
//! assert_eq!(state_of(Some(&beat), 61_001), PresenceState::Offline);
//! assert_eq!(state_of(Some(&PresenceRecord::offline(1_000, 20)), 2_000), PresenceState::Offline);
//! assert_eq!(state_of(None, 2_000), PresenceState::Unknown);
//! ```

use serde::{Deserialize, Serialize};

/// How many beats a record is good for: an `online` record is believed for three beats.
pub const BEATS_VALID: u64 = 3;

/// What an agent's last record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PresenceState {
    /// Its inbox beat within the last three beats.
    Online,
    /// It stopped cleanly, or its last beat is older than three beats.
    Offline,
    /// Never seen (within the bucket's max age), or the record cannot be read.
    Unknown,
}

/// What a beat (or a clean stop) writes, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceRecord {
    /// `online` (a beat) or `offline` (a clean stop).
    pub state: PresenceState,
    /// When it was written, unix ms (the writer's clock).
    pub at_ms: u64,
    /// The writer's beat, seconds: how long the record is good for is three of them.
    pub beat_secs: u64,
}

impl PresenceRecord {
    /// A beat at `at_ms`.
    pub fn online(at_ms: u64, beat_secs: u64) -> PresenceRecord {
        PresenceRecord {
            state: PresenceState::Online,
            at_ms,
            beat_secs,
        }
    }

    /// A clean stop at `at_ms`.
    pub fn offline(at_ms: u64, beat_secs: u64) -> PresenceRecord {
        PresenceRecord {
            state: PresenceState::Offline,
            at_ms,
            beat_secs,
        }
    }
}

/// The state `record` (none: never seen) says at `now_ms`.
pub fn state_of(record: Option<&PresenceRecord>, now_ms: u64) -> PresenceState {
    let Some(record) = record else {
        return PresenceState::Unknown;
    };
    let valid_ms = record
        .beat_secs
        .saturating_mul(BEATS_VALID)
        .saturating_mul(1000);
    match record.state {
        PresenceState::Online if now_ms.saturating_sub(record.at_ms) <= valid_ms => {
            PresenceState::Online
        }
        PresenceState::Unknown => PresenceState::Unknown,
        _ => PresenceState::Offline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_have_a_stable_shape() {
        let wire = serde_json::to_value(PresenceRecord::online(5, 20)).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"state": "online", "at_ms": 5, "beat_secs": 20})
        );
        assert!(serde_json::from_str::<PresenceRecord>(
            r#"{"state":"online","at_ms":5,"beat_secs":20,"x":1}"#
        )
        .is_err());
    }

    proptest! {
        /// A beat is believed for exactly three beats, never after; an offline record never
        /// reads as online.
        #[test]
        fn a_beat_is_good_for_three_beats(at in 0u64..1u64 << 40, beat in 1u64..3_600, late in 0u64..1u64 << 30) {
            let now = at + late;
            let online = state_of(Some(&PresenceRecord::online(at, beat)), now);
            prop_assert_eq!(online == PresenceState::Online, late <= beat * 3_000);
            prop_assert_eq!(state_of(Some(&PresenceRecord::offline(at, beat)), now), PresenceState::Offline);
        }
    }
}
