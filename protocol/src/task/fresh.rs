//! When an input is provably fresh: nothing of it can have run before, so the worker may run it
//! without reading its task channel first (one request per task saved, about a tenth of the
//! runtime's CPU per task; docs/PERFORMANCE.md). Every fact that could mean an earlier run
//! forces the read; the read itself decides (`on_delivery`).
//!
//! Why these facts are enough (docs/TASKS.md, "The task channel decides"): within one
//! broker run, a consumer counts deliveries, so `delivered == 1` means a first delivery —
//! unless the consumer's count started again, which happens when the broker restarts (its
//! consumer state is flushed lazily) or the consumer is deleted and created again. A worker
//! therefore keeps a baseline, the work stream's last sequence read on its current connection
//! and consumer, and reads the channel of anything stored at or before it. A task can also be
//! stored twice (the work stream forgets the `Nats-Msg-Id` of a consumed message when the
//! broker restarts); the router, which stores it, flags the inputs that may be such a copy.

/// What a router knows of a task input it is about to store in the work stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressFacts {
    /// The ingress delivery count (`> 1`: this input was routed, or tried, before).
    pub delivered: u64,
    /// The sender flagged it (`Hub-Check`): a retry of a publish whose outcome it never learned.
    pub sender_flagged: bool,
    /// Whether the router has a baseline on its current connection; without one, everything
    /// is suspect.
    pub baseline: Option<IngressBaseline>,
    /// The ingress sequence of this input.
    pub ingress_seq: u64,
}

/// The router's baseline, taken when its connection (re)started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressBaseline {
    /// The ingress stream's last sequence then: an input at or below it was stored before the
    /// connection, possibly before a broker restart that reset its delivery count.
    pub ingress_last_seq: u64,
    /// The work stream held messages then, and the duplicate window has not passed since:
    /// a broker restart may have made it forget the ids of tasks consumed before it.
    pub dedupe_may_be_lost: bool,
}

/// Whether the router flags a task it stores (`Hub-Check`), so that the worker reads the task
/// channel before it runs it.
pub fn router_flags(facts: &IngressFacts) -> bool {
    facts.delivered > 1
        || facts.sender_flagged
        || facts
            .baseline
            .is_none_or(|b| b.dedupe_may_be_lost || facts.ingress_seq <= b.ingress_last_seq)
}

/// What a worker knows of a task input before it runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputFacts {
    /// The journal had no record of this input (a first admission on this worker).
    pub fresh_admission: bool,
    /// The consumer's delivery count.
    pub delivered: u64,
    /// The router flagged it (`Hub-Check`).
    pub flagged: bool,
    /// The input's work stream sequence.
    pub seq: u64,
    /// The work stream's last sequence when the worker's current connection and consumer
    /// began (its baseline); `None` while it is not known.
    pub baseline_last_seq: Option<u64>,
}

/// Whether the worker must read the task channel before it runs the input: anything that
/// could mean an earlier run (an earlier admission, an earlier delivery, a router flag, or a
/// message stored before the worker's baseline) does.
pub fn must_read_channel(facts: &InputFacts) -> bool {
    !facts.fresh_admission
        || facts.delivered > 1
        || facts.flagged
        || facts.baseline_last_seq.is_none_or(|last| facts.seq <= last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fresh_input() -> InputFacts {
        InputFacts {
            fresh_admission: true,
            delivered: 1,
            flagged: false,
            seq: 10,
            baseline_last_seq: Some(9),
        }
    }

    #[test]
    fn only_a_first_unflagged_delivery_stored_after_the_baseline_skips_the_read() {
        assert!(!must_read_channel(&fresh_input()));
        for suspect in [
            InputFacts {
                fresh_admission: false,
                ..fresh_input()
            },
            InputFacts {
                delivered: 2,
                ..fresh_input()
            },
            InputFacts {
                flagged: true,
                ..fresh_input()
            },
            InputFacts {
                baseline_last_seq: None,
                ..fresh_input()
            },
            InputFacts {
                baseline_last_seq: Some(10),
                ..fresh_input()
            },
        ] {
            assert!(must_read_channel(&suspect), "{suspect:?}");
        }
    }

    fn fresh_ingress() -> IngressFacts {
        IngressFacts {
            delivered: 1,
            sender_flagged: false,
            baseline: Some(IngressBaseline {
                ingress_last_seq: 4,
                dedupe_may_be_lost: false,
            }),
            ingress_seq: 5,
        }
    }

    #[test]
    fn the_router_flags_every_input_that_may_have_been_stored_before() {
        assert!(!router_flags(&fresh_ingress()));
        let lost = IngressBaseline {
            ingress_last_seq: 4,
            dedupe_may_be_lost: true,
        };
        for suspect in [
            IngressFacts {
                delivered: 2,
                ..fresh_ingress()
            },
            IngressFacts {
                sender_flagged: true,
                ..fresh_ingress()
            },
            IngressFacts {
                baseline: None,
                ..fresh_ingress()
            },
            IngressFacts {
                baseline: Some(lost),
                ..fresh_ingress()
            },
            IngressFacts {
                ingress_seq: 4,
                ..fresh_ingress()
            },
        ] {
            assert!(router_flags(&suspect), "{suspect:?}");
        }
    }

    proptest! {
        /// Skipping the read is monotone: making any fact more suspect never skips it.
        #[test]
        fn a_skipped_read_needs_every_fact_clean(
            fresh_admission: bool,
            delivered in 0u64..4,
            flagged: bool,
            seq in 0u64..20,
            baseline in proptest::option::of(0u64..20),
        ) {
            let facts = InputFacts { fresh_admission, delivered, flagged, seq, baseline_last_seq: baseline };
            let skipped = !must_read_channel(&facts);
            prop_assert_eq!(
                skipped,
                fresh_admission && delivered <= 1 && !flagged && baseline.is_some_and(|b| seq > b)
            );
        }

        #[test]
        fn an_unflagged_store_needs_every_fact_clean(
            delivered in 0u64..4,
            sender_flagged: bool,
            baseline in proptest::option::of((0u64..20, any::<bool>())),
            ingress_seq in 0u64..20,
        ) {
            let facts = IngressFacts {
                delivered,
                sender_flagged,
                baseline: baseline.map(|(ingress_last_seq, dedupe_may_be_lost)| IngressBaseline { ingress_last_seq, dedupe_may_be_lost }),
                ingress_seq,
            };
            let unflagged = !router_flags(&facts);
            prop_assert_eq!(
                unflagged,
                delivered <= 1 && !sender_flagged && baseline.is_some_and(|(last, lost)| !lost && ingress_seq > last)
            );
        }
    }
}
