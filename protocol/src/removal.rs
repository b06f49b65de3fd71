//! Removing an agent: its tombstone, what becomes of the DMs still stored for it, and the
//! routers' set of removed agents.
//!
//! `runtime agent remove <id>` writes a [`Tombstone`] under the agent's id in the KV bucket
//! [`REMOVED_BUCKET`](crate::subjects::REMOVED_BUCKET), deletes its inbox consumer, and sweeps
//! the DMs still stored on its inbox subject: each one its consumer had not acked is copied to
//! the dead-letter stream with the reason [`RECIPIENT_DELETED`] and its sender told
//! ([`fate`]). The tombstone keeps how far the consumer had got ([`tombstone_for`]), so a run
//! cut short and run again after the consumer is gone still knows which DMs were handled.
//! Routers keep a [`RemovedSet`] fed by a watch of the bucket and refuse a DM to a removed
//! agent with the wire error kind `recipient_deleted`; `runtime agent restore <id>` deletes the
//! tombstone.
//!
//! ```
//! use protocol::removal::{fate, tombstone_for, ConsumerMark, Fate, RemovedSet, Change};
//!
//! // Bob's consumer had acked up to sequence 4 and delivered up to 6.
//! let mark = ConsumerMark { ack_floor: 4, delivered: 6 };
//! let tomb = tombstone_for(None, Some(mark), 1_000);
//! assert_eq!(fate(&tomb, 3, None, None, 2_000), Fate::Handled);
//! assert_eq!(fate(&tomb, 5, None, None, 2_000), Fate::DeadLetter);
//! assert_eq!(fate(&tomb, 7, Some(1_500), None, 2_000), Fate::Expired);
//! // Run again once the consumer is gone: the tombstone still knows the floor.
//! assert_eq!(tombstone_for(Some(&tomb), None, 9_000), tomb);
//!
//! let mut removed = RemovedSet::default();
//! removed.apply("bob", Change::Put);
//! assert!(removed.contains_str("bob"));
//! removed.apply("bob", Change::Delete);
//! assert!(removed.is_empty());
//! ```

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::ids::AgentId;

/// The dead-letter reason (`Hub-Reason`) and the `undeliverable` notice's `reason` of a DM
/// whose recipient was removed; also the wire error kind a DM to a removed agent is refused
/// with ([`WireErrorKind::RecipientDeleted`](crate::WireErrorKind::RecipientDeleted)).
pub const RECIPIENT_DELETED: &str = "recipient_deleted";

/// How far a removed agent's inbox consumer had got, from its consumer info.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConsumerMark {
    /// Its ack floor's stream sequence: every DM up to it was acked (or terminated).
    pub ack_floor: u64,
    /// The last stream sequence it delivered.
    pub delivered: u64,
}

/// The value of a removed agent's key in the removed bucket (JSON). The key's presence is
/// what removes the agent; a value that does not decode still does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// When it was first written, unix ms (the admin's clock).
    pub removed_at_ms: u64,
    /// The inbox consumer's ack floor when it was deleted (0: it had none, or acked nothing):
    /// DMs up to it were handled and are not dead-lettered.
    pub ack_floor: u64,
    /// The last inbox sequence the consumer had delivered (0: none): a dead letter above it
    /// was never delivered (`Hub-Deliveries: 0`).
    pub delivered: u64,
}

/// The tombstone to write for an agent whose current one (if any) is `existing` and whose
/// inbox consumer (if it still exists) is at `consumer`. The first removal time is kept; the
/// consumer's marks are taken while it exists, never lower than the existing ones; once it is
/// gone (a run cut short after deleting it, then run again) the existing marks stay. With
/// neither, every DM stored for the agent counts as never delivered (its first attach would
/// have replayed them all).
pub fn tombstone_for(
    existing: Option<&Tombstone>,
    consumer: Option<ConsumerMark>,
    now_ms: u64,
) -> Tombstone {
    let old = existing.map_or(ConsumerMark::default(), |t| ConsumerMark {
        ack_floor: t.ack_floor,
        delivered: t.delivered,
    });
    let mark = consumer.unwrap_or(old);
    let ack_floor = mark.ack_floor.max(old.ack_floor);
    Tombstone {
        removed_at_ms: existing.map_or(now_ms, |t| t.removed_at_ms),
        ack_floor,
        delivered: mark.delivered.max(old.delivered).max(ack_floor),
    }
}

/// What the removal sweep does with one DM stored for the removed agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// At or below the consumer's ack floor: handled. Only purged.
    Handled,
    /// A dead letter of it exists for another reason (its deliveries ran out, its handler
    /// rejected it): its sender was told then. Only purged.
    DeadLettered,
    /// An earlier run copied it (a dead letter with reason [`RECIPIENT_DELETED`]) and may have
    /// stopped before telling its sender: the notice is stored again (its id dedupes it).
    Notify,
    /// Its deadline has come: not worth a dead letter; its deadline check tells its sender
    /// (`expired`). Only purged.
    Expired,
    /// Copied to the dead-letter stream with reason [`RECIPIENT_DELETED`], its sender told.
    DeadLetter,
}

/// The fate of the DM stored at `seq` for an agent removed with `tomb`, whose deadline is
/// `expires_at` (`meta.expires_at`), and of which a dead letter with reason `existing` already
/// exists (`None`: none), at `now_ms`.
pub fn fate(
    tomb: &Tombstone,
    seq: u64,
    expires_at: Option<u64>,
    existing: Option<&str>,
    now_ms: u64,
) -> Fate {
    if seq <= tomb.ack_floor {
        return Fate::Handled;
    }
    match existing {
        Some(RECIPIENT_DELETED) => Fate::Notify,
        Some(_) => Fate::DeadLettered,
        None if expires_at.is_some_and(|at| at <= now_ms) => Fate::Expired,
        None => Fate::DeadLetter,
    }
}

/// The `Hub-Deliveries` of the dead letter of the DM at `seq`: 0 when the consumer never
/// delivered it, else 1 (delivered at least once; the broker does not say how often).
pub fn deliveries(tomb: &Tombstone, seq: u64) -> u64 {
    u64::from(seq <= tomb.delivered)
}

/// A change to one key of the removed bucket, as a watch sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A tombstone was written (the agent is removed).
    Put,
    /// The tombstone was deleted or purged (the agent may be re-added).
    Delete,
}

/// The change a message of the removed bucket's stream makes, from its `KV-Operation` header
/// (`DEL` or `PURGE`: deleted) and `Nats-Marker-Reason` (a marker the broker wrote when the
/// key was removed or aged out: deleted); anything else is a put.
pub fn change_of(kv_operation: Option<&str>, marker_reason: Option<&str>) -> Change {
    match (kv_operation, marker_reason) {
        (Some("DEL" | "PURGE"), _) | (None, Some(_)) => Change::Delete,
        _ => Change::Put,
    }
}

/// The agents removed, as a router knows them from the removed bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemovedSet {
    agents: HashSet<AgentId>,
}

impl RemovedSet {
    /// Applies a change of `key`; a key that is no agent id is ignored. Whether the set
    /// changed.
    pub fn apply(&mut self, key: &str, change: Change) -> bool {
        let Ok(agent) = AgentId::new(key) else {
            return false;
        };
        match change {
            Change::Put => self.agents.insert(agent),
            Change::Delete => self.agents.remove(&agent),
        }
    }

    /// Whether `agent` is removed.
    pub fn contains(&self, agent: &AgentId) -> bool {
        self.agents.contains(agent)
    }

    /// Whether the agent named `agent` is removed.
    pub fn contains_str(&self, agent: &str) -> bool {
        AgentId::new(agent).is_ok_and(|a| self.agents.contains(&a))
    }

    /// How many agents are removed.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether no agent is removed.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tomb(ack_floor: u64, delivered: u64) -> Tombstone {
        Tombstone {
            removed_at_ms: 1,
            ack_floor,
            delivered,
        }
    }

    #[test]
    fn a_tombstone_is_json_with_its_marks() {
        let t = tomb(4, 6);
        let json = serde_json::to_value(t).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"removed_at_ms": 1, "ack_floor": 4, "delivered": 6})
        );
        assert_eq!(serde_json::from_value::<Tombstone>(json).unwrap(), t);
    }

    #[test]
    fn the_fate_of_each_stored_dm() {
        let t = tomb(4, 6);
        assert_eq!(fate(&t, 4, None, None, 10), Fate::Handled);
        assert_eq!(
            fate(&t, 4, None, Some(RECIPIENT_DELETED), 10),
            Fate::Handled
        );
        assert_eq!(fate(&t, 5, None, None, 10), Fate::DeadLetter);
        assert_eq!(fate(&t, 5, Some(11), None, 10), Fate::DeadLetter);
        assert_eq!(fate(&t, 5, Some(10), None, 10), Fate::Expired);
        assert_eq!(
            fate(&t, 5, None, Some("max_deliver"), 10),
            Fate::DeadLettered
        );
        assert_eq!(
            fate(&t, 5, Some(1), Some(RECIPIENT_DELETED), 10),
            Fate::Notify
        );
        assert_eq!((deliveries(&t, 6), deliveries(&t, 7)), (1, 0));
    }

    #[test]
    fn deletes_purges_and_markers_are_deletions() {
        assert_eq!(change_of(None, None), Change::Put);
        assert_eq!(change_of(Some("PUT"), None), Change::Put);
        assert_eq!(change_of(Some("DEL"), None), Change::Delete);
        assert_eq!(change_of(Some("PURGE"), None), Change::Delete);
        assert_eq!(change_of(None, Some("MaxAge")), Change::Delete);
    }

    #[test]
    fn keys_that_are_no_agent_ids_are_ignored() {
        let mut set = RemovedSet::default();
        assert!(!set.apply("bo.b", Change::Put));
        assert!(!set.apply("hub-router", Change::Put));
        assert!(set.is_empty());
        assert!(set.apply("bob", Change::Put));
        assert!(!set.apply("bob", Change::Put));
        assert_eq!(set.len(), 1);
        assert!(set.contains(&AgentId::new("bob").unwrap()));
        assert!(!set.contains_str("alice"));
    }

    proptest! {
        /// After any sequence of changes, an agent is removed exactly when the last change of
        /// its key was a put.
        #[test]
        fn the_set_follows_the_last_change_of_each_key(
            changes in proptest::collection::vec((0usize..4, any::<bool>()), 0..40)
        ) {
            let keys = ["alice", "bob", "carol", "bad.key"];
            let mut set = RemovedSet::default();
            let mut last = std::collections::HashMap::new();
            for (k, put) in &changes {
                let change = if *put { Change::Put } else { Change::Delete };
                set.apply(keys[*k], change);
                last.insert(keys[*k], *put);
            }
            for key in &keys[..3] {
                prop_assert_eq!(set.contains_str(key), last.get(key).copied().unwrap_or(false));
            }
            prop_assert!(!set.contains_str("bad.key"));
        }

        /// A rewritten tombstone never forgets how far the consumer had got, keeps its first
        /// removal time, and takes a living consumer's marks.
        #[test]
        fn a_tombstone_never_moves_back(
            old in proptest::option::of((0u64..100, 0u64..100, 0u64..1000)),
            consumer in proptest::option::of((0u64..100, 0u64..100)),
            now in 0u64..1000,
        ) {
            let existing = old.map(|(ack_floor, delivered, at)| Tombstone {
                removed_at_ms: at, ack_floor, delivered,
            });
            let consumer = consumer.map(|(ack_floor, delivered)| ConsumerMark { ack_floor, delivered });
            let t = tombstone_for(existing.as_ref(), consumer, now);
            if let Some(e) = existing {
                prop_assert!(t.ack_floor >= e.ack_floor && t.delivered >= e.delivered);
                prop_assert_eq!(t.removed_at_ms, e.removed_at_ms);
            } else {
                prop_assert_eq!(t.removed_at_ms, now);
            }
            if let Some(c) = consumer {
                prop_assert!(t.ack_floor >= c.ack_floor && t.delivered >= c.delivered);
            }
            prop_assert!(t.delivered >= t.ack_floor);
            // Written again with the consumer gone, it stays as it is.
            prop_assert_eq!(tombstone_for(Some(&t), None, now + 1), t);
        }

        /// A DM the consumer had acked is never dead-lettered, one already dead-lettered is
        /// never copied again, and only a DM of neither kind whose deadline has not come is.
        #[test]
        fn only_unhandled_live_dms_without_a_copy_are_dead_lettered(
            floor in 0u64..50, seq in 1u64..100,
            expires_at in proptest::option::of(0u64..200), now in 0u64..200,
            existing in proptest::option::of(prop_oneof![
                Just(RECIPIENT_DELETED), Just("max_deliver"), Just("rejected: no")
            ]),
        ) {
            let t = tomb(floor, floor);
            let f = fate(&t, seq, expires_at, existing, now);
            if seq <= floor {
                prop_assert_eq!(f, Fate::Handled);
            }
            if f == Fate::DeadLetter {
                prop_assert!(seq > floor && existing.is_none());
                prop_assert!(expires_at.is_none_or(|at| at > now));
            }
            if existing.is_some() {
                prop_assert_ne!(f, Fate::DeadLetter);
            }
        }
    }
}
