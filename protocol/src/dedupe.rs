//! A bounded set of recently seen envelopes, for receiver-side dedupe.
//!
//! Delivery is at-least-once: a redelivered envelope carries the same
//! `meta.id`, and each inbox drops repeats with a [`SeenSet`].
//!
//! The key is `(meta.from, meta.id)`, not `meta.id` alone: ids are chosen by
//! senders, and two senders may reuse the same id (`m1`). Since the router
//! sets `meta.from` from the subject, one sender cannot suppress another's
//! messages by guessing its ids.
//!
//! ```
//! use protocol::dedupe::SeenSet;
//! use protocol::{AgentId, MessageId};
//!
//! let alice = AgentId::new("alice")?;
//! let bob = AgentId::new("bob")?;
//! let m1 = MessageId::new("m1")?;
//! let mut seen = SeenSet::default();
//! assert!(seen.first_time(Some(&alice), &m1));
//! assert!(!seen.first_time(Some(&alice), &m1)); // a redelivery
//! assert!(seen.first_time(Some(&bob), &m1)); // another sender's m1
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashSet, VecDeque};

use crate::ids::{AgentId, MessageId};

/// How many keys an inbox remembers by default.
pub const DEFAULT_DEDUPE_CAPACITY: usize = 4096;

type Key = (Option<AgentId>, MessageId);

/// The `capacity` most recently first-seen `(from, id)` keys.
///
/// Eviction is FIFO by first sighting: seeing a key again does not refresh
/// it. Every operation is O(1).
#[derive(Debug, Clone)]
pub struct SeenSet {
    capacity: usize,
    keys: HashSet<Key>,
    order: VecDeque<Key>,
}

impl SeenSet {
    /// An empty set remembering at most `capacity` keys. With capacity 0
    /// nothing is remembered and every key is seen for the first time.
    pub fn new(capacity: usize) -> SeenSet {
        // Pre-allocate modestly: a huge capacity should not cost memory
        // before it is used.
        let initial = capacity.min(DEFAULT_DEDUPE_CAPACITY);
        SeenSet {
            capacity,
            keys: HashSet::with_capacity(initial),
            order: VecDeque::with_capacity(initial),
        }
    }

    /// Records `(from, id)` and returns whether it was not among the last
    /// `capacity` distinct keys recorded. When the set is full, the oldest
    /// key is forgotten to make room.
    pub fn first_time(&mut self, from: Option<&AgentId>, id: &MessageId) -> bool {
        let key = (from.cloned(), id.clone());
        if self.keys.contains(&key) {
            return false;
        }
        if self.capacity == 0 {
            return true;
        }
        if self.order.len() == self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
        self.keys.insert(key.clone());
        self.order.push_back(key);
        true
    }

    /// Whether `(from, id)` is remembered, without recording it.
    pub fn contains(&self, from: Option<&AgentId>, id: &MessageId) -> bool {
        self.keys.contains(&(from.cloned(), id.clone()))
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The most keys remembered at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A set with [`DEFAULT_DEDUPE_CAPACITY`].
impl Default for SeenSet {
    fn default() -> SeenSet {
        SeenSet::new(DEFAULT_DEDUPE_CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn agent(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    fn mid(s: &str) -> MessageId {
        MessageId::new(s).unwrap()
    }

    #[test]
    fn repeats_are_caught_and_senders_are_kept_apart() {
        let mut seen = SeenSet::new(8);
        let (alice, bob) = (agent("alice"), agent("bob"));
        assert!(seen.first_time(Some(&alice), &mid("m1")));
        assert!(!seen.first_time(Some(&alice), &mid("m1")));
        assert!(seen.first_time(Some(&bob), &mid("m1")));
        assert!(seen.first_time(None, &mid("m1")));
        assert!(!seen.first_time(None, &mid("m1")));
        assert_eq!(seen.len(), 3);
        assert!(seen.contains(Some(&bob), &mid("m1")));
        assert!(!seen.contains(Some(&bob), &mid("m2")));
    }

    #[test]
    fn oldest_key_is_evicted_first_and_repeats_do_not_refresh() {
        let mut seen = SeenSet::new(2);
        let a = agent("a");
        assert!(seen.first_time(Some(&a), &mid("1")));
        assert!(seen.first_time(Some(&a), &mid("2")));
        assert!(!seen.first_time(Some(&a), &mid("1"))); // no refresh
        assert!(seen.first_time(Some(&a), &mid("3"))); // evicts 1
        assert_eq!(seen.len(), 2);
        assert!(!seen.contains(Some(&a), &mid("1")));
        assert!(!seen.first_time(Some(&a), &mid("2")));
        assert!(seen.first_time(Some(&a), &mid("1"))); // evicts 2
        assert!(seen.first_time(Some(&a), &mid("2")));
    }

    #[test]
    fn capacity_zero_remembers_nothing() {
        let mut seen = SeenSet::new(0);
        assert!(seen.first_time(None, &mid("m")));
        assert!(seen.first_time(None, &mid("m")));
        assert!(seen.is_empty());
    }

    #[test]
    fn default_capacity_is_4096() {
        let mut seen = SeenSet::default();
        assert_eq!(seen.capacity(), DEFAULT_DEDUPE_CAPACITY);
        assert_eq!(DEFAULT_DEDUPE_CAPACITY, 4096);
        for i in 0..=DEFAULT_DEDUPE_CAPACITY {
            assert!(seen.first_time(None, &mid(&i.to_string())));
        }
        assert_eq!(seen.len(), DEFAULT_DEDUPE_CAPACITY);
        assert!(seen.first_time(None, &mid("0")));
        assert!(!seen.first_time(None, &mid("2")));
    }

    proptest! {
        #[test]
        fn behaves_like_a_list_of_the_last_distinct_keys(
            capacity in 0usize..6,
            ops in proptest::collection::vec(
                (proptest::option::of(0u8..3), 0u8..6), 0..200),
        ) {
            let senders = [agent("a"), agent("b"), agent("c")];
            let mut seen = SeenSet::new(capacity);
            let mut model: Vec<(Option<u8>, u8)> = Vec::new();
            for (from, id) in ops {
                let sender = from.map(|i| &senders[usize::from(i)]);
                let expected = !model.contains(&(from, id));
                if expected && capacity > 0 {
                    if model.len() == capacity {
                        model.remove(0);
                    }
                    model.push((from, id));
                }
                prop_assert_eq!(seen.first_time(sender, &mid(&id.to_string())), expected);
                prop_assert_eq!(seen.len(), model.len());
                prop_assert!(seen.len() <= capacity);
            }
        }
    }
}
