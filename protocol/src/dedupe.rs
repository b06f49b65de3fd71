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

use std::collections::hash_map::RandomState;
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

use crate::ids::{AgentId, MessageId};

/// How many keys an inbox remembers by default.
pub const DEFAULT_DEDUPE_CAPACITY: usize = 4096;

/// What the set keeps of a key: two 64-bit SipHashes of it under two random keys of the set's
/// own. Two distinct keys share one with a chance of 2^-128 (a sender cannot aim at one: it
/// does not know the keys), and a key costs 16 bytes, with nothing allocated.
type Fingerprint = u128;

/// A key as a [`SeenSet`] keeps it ([`SeenSet::key_of`]); meaningful to that set only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenKey(Fingerprint);

/// The `capacity` most recently first-seen `(from, id)` keys.
///
/// Eviction is FIFO by first sighting: seeing a key again does not refresh
/// it. Every operation is O(1) and allocates nothing once the set has grown; an empty set
/// holds no room (an idle inbox costs nothing), a full one about 40 bytes per key.
#[derive(Debug, Clone)]
pub struct SeenSet {
    capacity: usize,
    hashers: (RandomState, RandomState),
    keys: HashSet<Fingerprint, BuildHasherDefault<Spread>>,
    order: VecDeque<Fingerprint>,
}

/// The hasher of the fingerprints, which are already uniformly spread: their low half.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u128` is used; anything else is folded in, still well spread.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

impl SeenSet {
    /// An empty set remembering at most `capacity` keys. With capacity 0
    /// nothing is remembered and every key is seen for the first time. It takes room as keys
    /// come, none before.
    pub fn new(capacity: usize) -> SeenSet {
        SeenSet {
            capacity,
            hashers: (RandomState::new(), RandomState::new()),
            keys: HashSet::default(),
            order: VecDeque::new(),
        }
    }

    fn fingerprint(&self, from: Option<&AgentId>, id: &MessageId) -> Fingerprint {
        let half = |state: &RandomState| {
            let mut h = state.build_hasher();
            from.map(AgentId::as_str).hash(&mut h);
            id.as_str().hash(&mut h);
            h.finish()
        };
        (u128::from(half(&self.hashers.0)) << 64) | u128::from(half(&self.hashers.1))
    }

    /// Records `(from, id)` and returns whether it was not among the last
    /// `capacity` distinct keys recorded. When the set is full, the oldest
    /// key is forgotten to make room.
    pub fn first_time(&mut self, from: Option<&AgentId>, id: &MessageId) -> bool {
        let key = self.key_of(from, id);
        self.first_time_key(key)
    }

    /// What this set keeps of `(from, id)`: taken before the envelope is handed away, so
    /// it can be recorded after without keeping the envelope's ids ([`Self::first_time_key`]).
    pub fn key_of(&self, from: Option<&AgentId>, id: &MessageId) -> SeenKey {
        SeenKey(self.fingerprint(from, id))
    }

    /// [`Self::first_time`] of the key [`Self::key_of`] took.
    pub fn first_time_key(&mut self, key: SeenKey) -> bool {
        let SeenKey(key) = key;
        if self.capacity == 0 {
            return true;
        }
        if self.keys.contains(&key) {
            return false;
        }
        if self.order.len() == self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
        self.keys.insert(key);
        self.order.push_back(key);
        true
    }

    /// Records the key `text` (any string; its own key space, apart from `(from, id)` keys) and
    /// returns whether it was not among the last `capacity` distinct keys recorded.
    pub fn first_time_text(&mut self, text: &str) -> bool {
        let half = |state: &RandomState| {
            let mut h = state.build_hasher();
            // A tag no `(from, id)` key writes first.
            2u8.hash(&mut h);
            text.hash(&mut h);
            h.finish()
        };
        let key = (u128::from(half(&self.hashers.0)) << 64) | u128::from(half(&self.hashers.1));
        self.first_time_key(SeenKey(key))
    }

    /// Whether `(from, id)` is remembered, without recording it.
    pub fn contains(&self, from: Option<&AgentId>, id: &MessageId) -> bool {
        self.contains_key(self.key_of(from, id))
    }

    /// [`Self::contains`] of the key [`Self::key_of`] took (a key costs two SipHashes: take it
    /// once per envelope).
    pub fn contains_key(&self, key: SeenKey) -> bool {
        self.capacity > 0 && self.keys.contains(&key.0)
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
    fn an_empty_set_holds_no_room_and_a_key_taken_before_is_recorded_after() {
        let mut seen = SeenSet::new(DEFAULT_DEDUPE_CAPACITY);
        assert_eq!((seen.keys.capacity(), seen.order.capacity()), (0, 0));
        let alice = agent("alice");
        let key = seen.key_of(Some(&alice), &mid("m1"));
        assert!(!seen.contains(Some(&alice), &mid("m1")));
        assert!(seen.first_time_key(key));
        assert!(!seen.first_time(Some(&alice), &mid("m1")));
        assert!(!seen.first_time_key(key));
        // No sender and an empty sender are two keys.
        assert!(seen.first_time(None, &mid("m2")));
        assert!(seen.first_time(Some(&agent("x")), &mid("m2")));
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
