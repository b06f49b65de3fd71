//! Counters of an actor: lock-free [`Counter`]s that the actor and its tasks bump, and a
//! serializable copy for snapshots. Every actor declares its counters with [`counters!`](crate::counters!),
//! so they all have the same shape.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter (or gauge, with [`Counter::sub`]).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn bump(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts one (for gauges).
    pub fn sub(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Declares a struct of [`Counter`]s and its serializable snapshot (every field `u64`, missing
/// fields decode as 0), with a `snapshot()` method that copies one into the other. Each
/// field's doc comment documents both.
///
/// ```ignore
/// counters! {
///     /// Counters of the thing.
///     pub struct ThingCounters => ThingCountersSnapshot {
///         /// Things done.
///         done,
///     }
/// }
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $snapshot:ident {
            $( $(#[$field_meta:meta])* $field:ident ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$field_meta])* pub $field: $crate::counters::Counter, )*
        }

        #[doc = concat!("A copy of [`", stringify!($name), "`].")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        $vis struct $snapshot {
            $( $(#[$field_meta])* #[serde(default)] pub $field: u64, )*
        }

        impl $name {
            /// A copy of the counters.
            pub fn snapshot(&self) -> $snapshot {
                $snapshot {
                    $( $field: self.$field.get(), )*
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::counters! {
        /// Test counters.
        pub struct TestCounters => TestCountersSnapshot {
            /// One.
            one,
            /// Two.
            two,
        }
    }

    #[test]
    fn counters_copy_into_their_snapshot_and_old_snapshots_decode() {
        let c = TestCounters::default();
        c.one.bump();
        c.two.add(3);
        c.two.sub();
        assert_eq!(c.snapshot(), TestCountersSnapshot { one: 1, two: 2 });
        let old: TestCountersSnapshot = serde_json::from_str(r#"{"one": 5}"#).unwrap();
        assert_eq!(old, TestCountersSnapshot { one: 5, two: 0 });
    }
}
