//! Application receipts (the second level of acknowledgement): a sender that sets
//! `meta.requires_ack: true` on a DM gets, once the recipient's handler is done with it, a DM
//! back from the recipient whose body is `{"receipt": {"kind": "read", "message_id": <id>}}`.
//! The transport ack (the inbox consumer's ack) and this receipt are separate events.
//!
//! ```
//! use protocol::receipt::{read_receipt, REQUIRES_ACK_FIELD};
//! use protocol::{AgentId, Envelope, MessageId};
//!
//! let mut dm = Envelope::new(MessageId::new("m1")?, "hi".into());
//! dm.meta.from = Some(AgentId::new("alice")?);
//! assert!(read_receipt(&dm).is_none(), "not asked for");
//! dm.meta.extra.insert(REQUIRES_ACK_FIELD.into(), true.into());
//! let receipt = read_receipt(&dm).unwrap();
//! assert_eq!(receipt.meta.to.unwrap().as_str(), "alice");
//! assert_eq!(receipt.body["receipt"]["kind"], "read");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde_json::{json, Value};

use crate::envelope::Envelope;
use crate::ids::MessageId;

/// The `meta` field asking for a read receipt (`true`).
pub const REQUIRES_ACK_FIELD: &str = "requires_ack";
/// The `kind` of a read receipt.
pub const READ_KIND: &str = "read";

/// The read receipt the recipient of `dm` sends back through its ingress once its handler is
/// done with it: `None` unless `dm` asks for one (`meta.requires_ack: true`) and names its
/// sender (a system notice never does). Its `meta.id` is `read:<sender>:<dm's id>` (stable, so
/// a receipt sent again is stored once) and `meta.to` the sender.
pub fn read_receipt(dm: &Envelope) -> Option<Envelope> {
    if dm.meta.extra.get(REQUIRES_ACK_FIELD) != Some(&Value::Bool(true)) {
        return None;
    }
    let sender = dm.meta.from.clone()?;
    let id = MessageId::new(format!("read:{sender}:{}", dm.meta.id)).ok()?;
    let mut receipt = Envelope::new(
        id,
        json!({"receipt": {"kind": READ_KIND, "message_id": dm.meta.id}}),
    );
    receipt.meta.to = Some(sender);
    Some(receipt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AgentId;

    #[test]
    fn only_a_dm_that_asks_and_names_its_sender_gets_a_receipt() {
        let mut dm = Envelope::new(MessageId::new("m1").unwrap(), json!("hi"));
        dm.meta.extra.insert(REQUIRES_ACK_FIELD.into(), json!(true));
        assert!(read_receipt(&dm).is_none(), "no sender: a system notice");
        dm.meta.from = Some(AgentId::new("alice").unwrap());
        let receipt = read_receipt(&dm).unwrap();
        assert_eq!(receipt.meta.id.as_str(), "read:alice:m1");
        assert_eq!(
            receipt.body,
            json!({"receipt": {"kind": "read", "message_id": "m1"}})
        );
        dm.meta
            .extra
            .insert(REQUIRES_ACK_FIELD.into(), json!("yes"));
        assert!(read_receipt(&dm).is_none(), "only `true` asks");
    }
}
