//! Idempotency keys of task submissions: the KV entry `(delegator, queue, key)` records the
//! task it was taken for *and* whether the ingress stored that task, so that the key and the
//! stored task agree whatever fails between the two steps.
//!
//! A key is the delegator's own ([`entry_key`]): identities of one hub do not trust each other,
//! so another delegator's same key names a task of its own, and learns nothing of the first.
//! (The delivery-semantics design scopes keys to the recipient within one tenant.) On a
//! rendered hub each agent may read and write its own entries only.
//!
//! A submission with a key:
//!
//! 1. validates the whole task (key included) — nothing is written for an invalid task;
//! 2. creates the entry (create-only) as [`Submission::Pending`], holding the envelope it is
//!    about to publish (unless it is larger than [`MAX_RECORDED_ENVELOPE`]), its subject and
//!    its `Nats-Msg-Id`;
//! 3. publishes the envelope to the ingress and awaits the stream's ack;
//! 4. marks the entry [`Submission::Stored`].
//!
//! A later submission with the same key that finds the entry ([`on_existing`]): a stored task
//! is named, nothing is sent; a pending one (step 3 failed or timed out, or the submitter died
//! between 2 and 4) is published again — the same envelope under the same `Nats-Msg-Id`, so
//! a first publish that did reach the ingress is deduplicated — and then marked stored. A
//! record without its envelope (too large to keep) is republished from the later caller's
//! task, under the recorded task id ([`republished_body`]).

use serde::{Deserialize, Serialize};

use crate::envelope::Envelope;
use crate::ids::{AgentId, QueueName, TaskId};

/// The largest envelope (its JSON encoding) an idempotency record keeps: a KV value is one
/// message, and a task near the server's payload limit would not fit beside its record.
pub const MAX_RECORDED_ENVELOPE: usize = 64 * 1024;

/// Whether the ingress acknowledged the task an entry was taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Submission {
    /// The key is taken; the ingress has not acknowledged the task (yet).
    Pending,
    /// The ingress stored the task.
    Stored,
}

/// The value of an idempotency entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyRecord {
    /// The task the key is bound to.
    pub task_id: TaskId,
    /// Whether the ingress stored it.
    pub state: Submission,
    /// The ingress subject it is published on.
    pub subject: String,
    /// Its ingress `Nats-Msg-Id`.
    pub msg_id: String,
    /// The envelope published (and published again while pending); `None` when it was larger
    /// than [`MAX_RECORDED_ENVELOPE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope: Option<Envelope>,
}

/// The envelope a record keeps: `envelope` unless its encoding is larger than
/// [`MAX_RECORDED_ENVELOPE`].
pub fn recorded_envelope(envelope: &Envelope) -> Option<Envelope> {
    let size = serde_json::to_vec(envelope).map_or(usize::MAX, |v| v.len());
    (size <= MAX_RECORDED_ENVELOPE).then(|| envelope.clone())
}

/// The task body a pending record without its envelope is published again with: the later
/// caller's task (`caller`, the same key's submission) under the recorded task id, so that the
/// key and the stored task agree.
pub fn republished_body(
    record: &IdempotencyRecord,
    caller: &serde_json::Value,
) -> serde_json::Value {
    let mut body = caller.clone();
    if let Some(map) = body.as_object_mut() {
        map.insert(
            "task_id".into(),
            serde_json::Value::String(record.task_id.to_string()),
        );
    }
    body
}

/// What a submission that finds an existing entry does.
#[derive(Debug, Clone, PartialEq)]
pub enum Existing {
    /// The task exists: name it, send nothing.
    Stored(TaskId),
    /// The task may never have reached the ingress: publish this record's envelope again (same
    /// subject, same `Nats-Msg-Id`), then mark the entry stored.
    Republish(Box<IdempotencyRecord>),
}

/// An entry value that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable idempotency entry: {reason}")]
pub struct UnreadableEntry {
    /// Why.
    pub reason: String,
}

/// The KV key of `delegator`'s idempotency key `key` on `queue`:
/// `<delegator>.<queue>.<hex of the key>` (KV keys allow fewer characters than idempotency
/// keys). The delegator comes first, so that its grants can name all of its own entries
/// (`$KV.HUB_IDEMPOTENCY.<delegator>.>`) and none of anyone else's.
pub fn entry_key(delegator: &AgentId, queue: &QueueName, key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{delegator}.{queue}.{hex}")
}

/// Decides what a submission does with the existing entry value `value`. An entry of an
/// earlier version holds the bare task id: such a task was stored.
///
/// # Errors
/// [`UnreadableEntry`] when the value is neither a record nor a task id.
pub fn on_existing(value: &[u8]) -> Result<Existing, UnreadableEntry> {
    match serde_json::from_slice::<IdempotencyRecord>(value) {
        Ok(record) if record.state == Submission::Stored => Ok(Existing::Stored(record.task_id)),
        Ok(record) => Ok(Existing::Republish(Box::new(record))),
        Err(e) => {
            let legacy = std::str::from_utf8(value)
                .ok()
                .and_then(|s| TaskId::new(s).ok());
            legacy.map(Existing::Stored).ok_or(UnreadableEntry {
                reason: e.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MessageId;

    fn record(state: Submission) -> IdempotencyRecord {
        IdempotencyRecord {
            task_id: TaskId::new("t1").unwrap(),
            state,
            subject: "hub.pub.alice.work.q".into(),
            msg_id: "alice:task:t1".into(),
            envelope: Some(Envelope::new(
                MessageId::new("m1").unwrap(),
                serde_json::json!({"x": 1}),
            )),
        }
    }

    #[test]
    fn a_large_envelope_is_not_kept_and_is_republished_from_the_callers_task_under_the_recorded_id()
    {
        let small = Envelope::new(MessageId::new("m1").unwrap(), serde_json::json!({"x": 1}));
        assert_eq!(recorded_envelope(&small), Some(small));
        let text = "x".repeat(MAX_RECORDED_ENVELOPE);
        let large = Envelope::new(
            MessageId::new("m2").unwrap(),
            serde_json::json!({ "text": text }),
        );
        assert_eq!(recorded_envelope(&large), None);
        let mut pending = record(Submission::Pending);
        pending.envelope = None;
        let bytes = serde_json::to_vec(&pending).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("envelope"));
        match on_existing(&bytes).unwrap() {
            Existing::Republish(r) => assert_eq!(r.envelope, None),
            other => panic!("{other:?}"),
        }
        let caller = serde_json::json!({"version": 1, "task_id": "t-later", "text": "same"});
        assert_eq!(
            republished_body(&pending, &caller),
            serde_json::json!({"version": 1, "task_id": "t1", "text": "same"})
        );
    }

    #[test]
    fn entries_are_valid_kv_keys_per_delegator_and_queue() {
        let alice = AgentId::new("alice").unwrap();
        let q = QueueName::new("builds").unwrap();
        let entry = entry_key(&alice, &q, "order #42/α");
        assert!(entry.starts_with("alice.builds."));
        assert!(entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'));
        assert_ne!(
            entry,
            entry_key(&alice, &QueueName::new("other").unwrap(), "order #42/α")
        );
        assert_ne!(
            entry,
            entry_key(&AgentId::new("bob").unwrap(), &q, "order #42/α")
        );
    }

    proptest::proptest! {
        /// Two submissions share an entry only when delegator, queue and key are all the same,
        /// and every entry is under its delegator's own token (what its grants name).
        #[test]
        fn an_entry_is_one_delegators_one_queues_one_key(
            d1 in "[A-Za-z0-9_-]{1,12}", d2 in "[A-Za-z0-9_-]{1,12}",
            q1 in "[a-z0-9_-]{1,8}", q2 in "[a-z0-9_-]{1,8}",
            k1 in "\\PC{1,16}", k2 in "\\PC{1,16}",
        ) {
            let (Ok(a1), Ok(a2)) = (AgentId::new(&d1), AgentId::new(&d2)) else { return Ok(()) };
            let (Ok(n1), Ok(n2)) = (QueueName::new(&q1), QueueName::new(&q2)) else { return Ok(()) };
            let (e1, e2) = (entry_key(&a1, &n1, &k1), entry_key(&a2, &n2, &k2));
            proptest::prop_assert_eq!(e1 == e2, (a1.as_str(), n1.as_str(), k1.as_str()) == (a2.as_str(), n2.as_str(), k2.as_str()));
            let prefix = format!("{}.", a1);
            proptest::prop_assert!(e1.starts_with(&prefix));
        }
    }

    #[test]
    fn a_stored_entry_names_its_task_and_a_pending_one_is_republished() {
        let stored = serde_json::to_vec(&record(Submission::Stored)).unwrap();
        assert_eq!(
            on_existing(&stored).unwrap(),
            Existing::Stored(TaskId::new("t1").unwrap())
        );
        let pending = serde_json::to_vec(&record(Submission::Pending)).unwrap();
        match on_existing(&pending).unwrap() {
            Existing::Republish(r) => assert_eq!(*r, record(Submission::Pending)),
            other => panic!("{other:?}"),
        }
        // An entry of an earlier version: the bare task id.
        assert_eq!(
            on_existing(b"t-old").unwrap(),
            Existing::Stored(TaskId::new("t-old").unwrap())
        );
        assert!(on_existing(b"not a task id!").is_err());
    }
}
