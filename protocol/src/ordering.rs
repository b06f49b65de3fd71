//! What an inbox tells its handler about where a DM stands in the order of its inbox.
//!
//! An inbox consumer hands DMs over in stream-sequence order within its in-flight window. A
//! redelivery (a retry the handler asked for, a lost ack) comes back after later DMs: it is
//! still handed over (at-least-once wins over ordering), flagged `out_of_order` when its
//! sequence is below the last one handed over, and every handoff says whether it is a
//! redelivery (the broker delivered it more than once).
//!
//! ```
//! use protocol::ordering::{handoff_flags, HandoffFlags};
//!
//! assert_eq!(handoff_flags(Some(5), 1, Some(4)), HandoffFlags { redelivered: false, out_of_order: false });
//! assert_eq!(handoff_flags(Some(3), 2, Some(4)), HandoffFlags { redelivered: true, out_of_order: true });
//! ```

use serde::{Deserialize, Serialize};

/// The flags of one handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HandoffFlags {
    /// The broker delivered it more than once.
    pub redelivered: bool,
    /// Its stream sequence is below that of a DM handed over before it.
    pub out_of_order: bool,
}

/// The flags of handing over the DM at `stream_seq`, delivered `delivered` times, when the
/// highest sequence handed over so far is `last_handed` (both unknown in core mode).
pub fn handoff_flags(
    stream_seq: Option<u64>,
    delivered: u64,
    last_handed: Option<u64>,
) -> HandoffFlags {
    HandoffFlags {
        redelivered: delivered > 1,
        out_of_order: matches!((stream_seq, last_handed), (Some(seq), Some(last)) if seq < last),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn out_of_order_exactly_when_below_the_last_handed(seq in 1u64..100, last in 1u64..100, delivered in 1u64..5) {
            let flags = handoff_flags(Some(seq), delivered, Some(last));
            prop_assert_eq!(flags.out_of_order, seq < last);
            prop_assert_eq!(flags.redelivered, delivered > 1);
            prop_assert!(!handoff_flags(Some(seq), delivered, None).out_of_order);
            prop_assert!(!handoff_flags(None, delivered, Some(last)).out_of_order);
        }
    }
}
