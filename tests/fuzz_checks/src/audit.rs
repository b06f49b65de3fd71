//! The audit trail's wire format (`protocol::audit`): stored batches read back, and the hand
//! encoder of events (`audit/fast.rs`) against serde's encoding of the wire event.

use std::borrow::Cow;

use protocol::audit::{AuditBatch, AuditEvent, Details, EncodedEvents, EVENTS};
use protocol::task::TaskState;
use serde::Serialize;

use crate::bytes::Bytes;

/// Bytes read as a stored audit batch ([`AuditBatch::decode`], what `runtime trace` reads from
/// `HUB_AUDIT`), and a batch of events made from the same bytes.
///
/// Asserts, for the batch read (if any) and the batch made: that it encodes to exactly the
/// bytes serde writes for the wire's batch and events (the hand encoder of `audit/fast.rs` and
/// the serde one it leaves task states to write the same bytes), within [`EncodedEvents`]'s
/// room; and that those bytes read back as the same events, each named by the batch's actor.
/// An event's time is kept when it is within `i64` milliseconds of the batch's first event's
/// (the wire's relative times are signed 64-bit); farther, only its other fields are.
pub fn check_audit(data: &[u8]) {
    if let Ok(batch) = AuditBatch::decode(data) {
        assert!(
            batch.events.iter().all(|e| e.actor == batch.actor),
            "an event read without its batch's actor"
        );
        let json = serde_json::to_vec(&batch).expect("a batch serializes to JSON");
        let back: AuditBatch = serde_json::from_slice(&json).expect("and reads back");
        assert_eq!(back, batch, "the batch changed through its JSON");
        check_batch(&batch);
    }
    check_batch(&made(data));
}

fn check_batch(batch: &AuditBatch) {
    let actor = &batch.actor;
    let bytes = batch.encode();
    assert_eq!(
        bytes,
        by_serde(actor, &batch.events),
        "the hand encoding is not serde's"
    );
    let mut encoded = EncodedEvents::default();
    for event in &batch.events {
        encoded.push(&event.borrowed());
    }
    assert_eq!(encoded.len(), batch.events.len());
    let mut written = Vec::new();
    encoded
        .write_batch(actor, &mut written)
        .expect("writing to memory");
    assert_eq!(written, bytes);
    assert!(
        written.len() <= encoded.batch_len(actor),
        "batch_len is short"
    );

    let back = AuditBatch::decode(&bytes).expect("an encoded batch reads back");
    assert_eq!(&back.actor, actor);
    assert_eq!(back.events.len(), batch.events.len());
    let base = batch.events.first().map_or(0, |e| e.at);
    for (read, event) in back.events.iter().zip(&batch.events) {
        let mut want = event.clone();
        want.actor.clone_from(actor);
        let kept = i64::try_from(i128::from(event.at) - i128::from(base)).is_ok();
        if !kept {
            want.at = read.at;
        }
        assert_eq!(read, &want, "an event changed through the wire");
    }
}

/// A batch made from the fuzzer's bytes: an actor, then events until the bytes run out.
fn made(data: &[u8]) -> AuditBatch {
    let mut b = Bytes::new(data);
    let actor = b.text();
    let mut events = Vec::new();
    while !b.is_empty() && events.len() < 16 {
        let event = if b.flag() {
            Cow::Borrowed(EVENTS[usize::from(b.byte()) % EVENTS.len()])
        } else {
            Cow::Owned(b.text())
        };
        let details = Details {
            seq: b.opt_u64(),
            ingress_seq: b.opt_u64(),
            stream_seq: b.opt_u64(),
            inbox_seq: b.opt_u64(),
            work_seq: b.opt_u64(),
            delay_ms: b.opt_u64(),
            retry_after_secs: b.opt_u64(),
            items: b.opt_u64(),
            dlq_id: b.opt_u64(),
            duplicate: b.flag().then(|| b.flag()),
            kind: b.opt_text(),
            reason: b.opt_text(),
            state: b
                .flag()
                .then(|| TaskState::ALL[usize::from(b.byte()) % TaskState::ALL.len()]),
        };
        events.push(AuditEvent {
            event,
            msg_id: b.opt_text(),
            task_id: b.opt_text(),
            trace_id: b.opt_text(),
            at: b.u64(),
            actor: b.text(),
            attempt: b.opt_u64(),
            details,
        });
    }
    AuditBatch { actor, events }
}

/// The batch of `events` by `actor` as serde writes the wire's types (`audit/wire.rs`:
/// `WireBatch` with its `WireEvent`s, `rmp_serde::encode::write_named`).
fn by_serde(actor: &str, events: &[AuditEvent]) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_map_len, write_str, write_uint};
    let base = events.first().map_or(0, |e| e.at);
    let mut out = Vec::new();
    let count = u32::try_from(events.len()).expect("a small batch");
    write_map_len(&mut out, 3).expect("writing to memory");
    write_str(&mut out, "a").expect("writing to memory");
    write_str(&mut out, actor).expect("writing to memory");
    write_str(&mut out, "b").expect("writing to memory");
    write_uint(&mut out, base).expect("writing to memory");
    write_str(&mut out, "v").expect("writing to memory");
    write_array_len(&mut out, count).expect("writing to memory");
    for e in events {
        let code = EVENTS
            .iter()
            .position(|name| *name == e.event)
            .and_then(|i| u8::try_from(i).ok());
        let d = &e.details;
        let wire = WireEvent {
            code,
            event: code.is_none().then_some(&*e.event),
            msg_id: e.msg_id.as_deref(),
            task_id: e.task_id.as_deref(),
            trace_id: e.trace_id.as_deref(),
            after_base: e.at.wrapping_sub(base) as i64,
            attempt: e.attempt,
            details: WireDetails {
                seq: d.seq,
                ingress_seq: d.ingress_seq,
                stream_seq: d.stream_seq,
                inbox_seq: d.inbox_seq,
                work_seq: d.work_seq,
                delay_ms: d.delay_ms,
                retry_after_secs: d.retry_after_secs,
                items: d.items,
                dlq_id: d.dlq_id,
                duplicate: d.duplicate,
                kind: d.kind.as_deref(),
                reason: d.reason.as_deref(),
                state: d.state,
            },
        };
        rmp_serde::encode::write_named(&mut out, &wire).expect("an event encodes");
    }
    out
}

/// `audit/wire.rs`'s `WireEvent` as it is written: the same keys, order and omissions.
#[derive(Serialize)]
struct WireEvent<'a> {
    #[serde(rename = "c", skip_serializing_if = "Option::is_none")]
    code: Option<u8>,
    #[serde(rename = "e", skip_serializing_if = "Option::is_none")]
    event: Option<&'a str>,
    #[serde(rename = "m", skip_serializing_if = "Option::is_none")]
    msg_id: Option<&'a str>,
    #[serde(rename = "k", skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(rename = "r", skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
    #[serde(rename = "t")]
    after_base: i64,
    #[serde(rename = "n", skip_serializing_if = "Option::is_none")]
    attempt: Option<u64>,
    #[serde(rename = "x", skip_serializing_if = "WireDetails::is_empty")]
    details: WireDetails<'a>,
}

/// `audit/wire.rs`'s `WireDetails`.
#[derive(Serialize, Default, PartialEq)]
struct WireDetails<'a> {
    #[serde(rename = "s", skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(rename = "i", skip_serializing_if = "Option::is_none")]
    ingress_seq: Option<u64>,
    #[serde(rename = "q", skip_serializing_if = "Option::is_none")]
    stream_seq: Option<u64>,
    #[serde(rename = "b", skip_serializing_if = "Option::is_none")]
    inbox_seq: Option<u64>,
    #[serde(rename = "w", skip_serializing_if = "Option::is_none")]
    work_seq: Option<u64>,
    #[serde(rename = "y", skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    #[serde(rename = "a", skip_serializing_if = "Option::is_none")]
    retry_after_secs: Option<u64>,
    #[serde(rename = "n", skip_serializing_if = "Option::is_none")]
    items: Option<u64>,
    #[serde(rename = "l", skip_serializing_if = "Option::is_none")]
    dlq_id: Option<u64>,
    #[serde(rename = "u", skip_serializing_if = "Option::is_none")]
    duplicate: Option<bool>,
    #[serde(rename = "k", skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    #[serde(rename = "r", skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(rename = "z", skip_serializing_if = "Option::is_none")]
    state: Option<TaskState>,
}

impl WireDetails<'_> {
    fn is_empty(&self) -> bool {
        *self == WireDetails::default()
    }
}
