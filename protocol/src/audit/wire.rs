//! How a batch is stored: MessagePack maps with one-letter keys, each event's name as its
//! index in [`EVENTS`], each time after the batch's earliest, and the details under one-letter
//! keys too. About half the bytes of named keys and full names, and far less to encode.
//!
//! Earlier batches (the event's name under `e`, details under their full names in `d`) still
//! read back: `runtime trace` shows a trail written before an upgrade.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{AuditBatch, AuditEvent, Details, EventRef};
use crate::task::TaskState;

/// Every event the runtime emits, in the order of their one-byte codes on the wire. Append
/// only: a stored batch names its events by their index here. A name not in it is stored in
/// full.
pub const EVENTS: &[&str] = &[
    "accepted",
    "deduplicated",
    "routed",
    "rejected",
    "fetched",
    "redelivered",
    "delivered",
    "nacked",
    "read",
    "expired",
    "dead_lettered",
    "replayed",
    "discarded",
    "started",
    "state_changed",
    "result_published",
    "answered",
    "cancelled",
];

/// Why a stored audit message cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// It is not a batch.
    #[error("unreadable audit batch")]
    Decode(#[source] rmp_serde::decode::Error),
    /// An event has neither a known code nor a name.
    #[error("audit event with unknown code {0}")]
    UnknownCode(u8),
}

/// One event on the wire. Written from borrowed fields (encoding copies nothing), read back
/// owned.
#[derive(Serialize, Deserialize)]
struct WireEvent<'a> {
    /// Its index in [`EVENTS`].
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    code: Option<u8>,
    /// Its name, when it is not in [`EVENTS`] (and in earlier batches).
    #[serde(rename = "e", default, borrow, skip_serializing_if = "Option::is_none")]
    event: Option<Cow<'a, str>>,
    #[serde(rename = "m", default, borrow, skip_serializing_if = "Option::is_none")]
    msg_id: Option<Cow<'a, str>>,
    #[serde(rename = "k", default, borrow, skip_serializing_if = "Option::is_none")]
    task_id: Option<Cow<'a, str>>,
    #[serde(rename = "r", default, borrow, skip_serializing_if = "Option::is_none")]
    trace_id: Option<Cow<'a, str>>,
    /// Milliseconds after the batch's base (signed; earlier batches' are never negative).
    #[serde(rename = "t")]
    after_base: i64,
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    attempt: Option<u64>,
    #[serde(
        rename = "x",
        default,
        borrow,
        skip_serializing_if = "WireDetails::is_empty"
    )]
    details: WireDetails<'a>,
    /// Earlier batches' details, under their full names.
    #[serde(rename = "d", default, skip_serializing)]
    named_details: Option<Details>,
}

/// [`Details`] under one-letter keys (the same fields, in the same order).
#[derive(Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
    #[serde(rename = "k", borrow, skip_serializing_if = "Option::is_none")]
    kind: Option<Cow<'a, str>>,
    #[serde(rename = "r", borrow, skip_serializing_if = "Option::is_none")]
    reason: Option<Cow<'a, str>>,
    #[serde(rename = "z", skip_serializing_if = "Option::is_none")]
    state: Option<TaskState>,
}

impl WireDetails<'_> {
    fn is_empty(&self) -> bool {
        *self == WireDetails::default()
    }
}

impl<'a> From<&'a Details> for WireDetails<'a> {
    fn from(d: &'a Details) -> Self {
        WireDetails {
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
            kind: d.kind.as_deref().map(Cow::Borrowed),
            reason: d.reason.as_deref().map(Cow::Borrowed),
            state: d.state,
        }
    }
}

impl From<WireDetails<'_>> for Details {
    fn from(d: WireDetails<'_>) -> Self {
        Details {
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
            kind: d.kind.map(Cow::into_owned),
            reason: d.reason.map(Cow::into_owned),
            state: d.state,
        }
    }
}

/// A batch on the wire, as it is read ([`EncodedEvents::write_batch`] writes it).
#[derive(Deserialize)]
struct WireBatch<'a> {
    #[serde(rename = "a", borrow)]
    actor: Cow<'a, str>,
    #[serde(rename = "b")]
    base_ms: u64,
    #[serde(rename = "v", borrow)]
    events: Vec<WireEvent<'a>>,
}

/// Events encoded one by one as they are emitted, for one batch: its header is written
/// around them when it is published ([`Self::write_batch`]). An emitter queues these bytes,
/// not the events, so emitting allocates nothing once its buffer has grown.
///
/// Each event's time is relative to the first one's, signed: an `accepted` dated at the
/// ingress's store time may precede an event emitted before it.
#[derive(Debug, Default)]
pub struct EncodedEvents {
    base_ms: u64,
    count: usize,
    bytes: Vec<u8>,
}

impl EncodedEvents {
    /// Appends `event`, encoded: by hand ([`super::fast::write_event`]), or through serde for
    /// the rare event the hand encoder leaves to it. Both write the same bytes.
    pub fn push(&mut self, event: &EventRef<'_>) {
        if self.count == 0 {
            self.base_ms = event.at;
        }
        let code = code_of(event.event);
        // Two's complement: the signed difference of two unix-ms times.
        let after_base = event.at.wrapping_sub(self.base_ms) as i64;
        if !super::fast::write_event(&mut self.bytes, event, code, after_base) {
            write_event_serde(&mut self.bytes, event, code, after_base);
        }
        self.count += 1;
    }

    /// The events it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes to `out` the batch of these events emitted by `actor`, as stored.
    ///
    /// # Errors
    /// What `out` returns; writing to memory (a `Vec`, a `BytesMut`'s writer) cannot fail.
    pub fn write_batch(&self, actor: &str, out: &mut impl std::io::Write) -> std::io::Result<()> {
        self.write_header(actor, out)?;
        out.write_all(&self.bytes)
    }

    /// The room the batch takes written ([`Self::write_batch`]), at most.
    pub fn batch_len(&self, actor: &str) -> usize {
        // A map marker (1), three one-letter keys (2 each), the actor (5 + its length), a
        // u64 (9) and an array marker (5).
        26 + actor.len() + self.bytes.len()
    }

    /// A batch's map up to its events' array (`{"a": actor, "b": base, "v": [` in
    /// MessagePack), as [`WireBatch`] reads it.
    fn write_header<W: std::io::Write>(
        &self,
        actor: &str,
        out: &mut W,
    ) -> Result<(), rmp::encode::ValueWriteError<std::io::Error>> {
        use rmp::encode::{write_array_len, write_map_len, write_str, write_uint};
        let count = u32::try_from(self.count).expect("a batch holds fewer than 2^32 events");
        write_map_len(out, 3)?;
        write_str(out, "a")?;
        write_str(out, actor)?;
        write_str(out, "b")?;
        write_uint(out, self.base_ms)?;
        write_str(out, "v")?;
        write_array_len(out, count)?;
        Ok(())
    }

    /// Empties it, keeping its room.
    pub fn clear(&mut self) {
        self.count = 0;
        self.bytes.clear();
    }

    /// The room its buffer holds, in bytes.
    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// Gives back room beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        self.bytes.shrink_to(bytes);
    }
}

/// `event` (whose code is `code`, dated `after_base` ms after its batch's base) encoded through
/// serde: [`WireEvent`] is what a batch is read with, and what the hand encoder matches byte
/// for byte.
pub(super) fn write_event_serde(
    out: &mut Vec<u8>,
    event: &EventRef<'_>,
    code: Option<u8>,
    after_base: i64,
) {
    let wire = WireEvent {
        code,
        event: code.is_none().then_some(Cow::Borrowed(event.event)),
        msg_id: event.msg_id.map(Cow::Borrowed),
        task_id: event.task_id.map(Cow::Borrowed),
        trace_id: event.trace_id.map(Cow::Borrowed),
        after_base,
        attempt: event.attempt,
        details: WireDetails::from(event.details),
        named_details: None,
    };
    rmp_serde::encode::write_named(out, &wire).expect("an audit event encodes");
}

/// The code of `event`, if it has one.
pub(super) fn code_of(event: &str) -> Option<u8> {
    EVENTS
        .iter()
        .position(|e| *e == event)
        .and_then(|i| u8::try_from(i).ok())
}

impl AuditBatch {
    /// The batch as stored (the module's doc).
    pub fn encode(&self) -> Vec<u8> {
        AuditBatch::encode_events(&self.actor, &self.events)
    }

    /// The batch of `events` emitted by `actor` as stored (for a few events; an emitter
    /// encodes each event as it comes, into [`EncodedEvents`]).
    pub fn encode_events(actor: &str, events: &[AuditEvent]) -> Vec<u8> {
        let mut encoded = EncodedEvents::default();
        for event in events {
            encoded.push(&event.borrowed());
        }
        let mut out = Vec::with_capacity(encoded.batch_len(actor));
        encoded
            .write_batch(actor, &mut out)
            .expect("writing to a vector cannot fail");
        out
    }

    /// Reads a stored batch back ([`Self::encode`], or an earlier version's).
    ///
    /// # Errors
    /// [`BatchError::Decode`] when `bytes` is not a batch, [`BatchError::UnknownCode`] when an
    /// event's code is not in [`EVENTS`] (a newer writer's).
    pub fn decode(bytes: &[u8]) -> Result<AuditBatch, BatchError> {
        let wire: WireBatch = rmp_serde::from_slice(bytes).map_err(BatchError::Decode)?;
        let actor = wire.actor.into_owned();
        let events = wire
            .events
            .into_iter()
            .map(|e| {
                let event = match (e.code, e.event) {
                    (Some(code), _) => Cow::Borrowed(
                        *EVENTS
                            .get(usize::from(code))
                            .ok_or(BatchError::UnknownCode(code))?,
                    ),
                    (None, Some(name)) => Cow::Owned(name.into_owned()),
                    (None, None) => return Err(BatchError::UnknownCode(u8::MAX)),
                };
                Ok(AuditEvent {
                    event,
                    msg_id: e.msg_id.map(Cow::into_owned),
                    task_id: e.task_id.map(Cow::into_owned),
                    trace_id: e.trace_id.map(Cow::into_owned),
                    at: wire.base_ms.saturating_add_signed(e.after_base),
                    actor: actor.clone(),
                    attempt: e.attempt,
                    details: e.named_details.unwrap_or_else(|| e.details.into()),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(AuditBatch { actor, events })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(i: u64) -> AuditEvent {
        AuditEvent::msg("routed", &format!("bob0-{i}"), 1_700_000_000_000 + i, "").details(
            Details {
                seq: Some(100_000 + i),
                ..Details::default()
            },
        )
    }

    #[test]
    fn known_events_are_stored_by_code_and_unknown_ones_by_name() {
        let mut custom = routed(1);
        custom.event = Cow::Borrowed("custom_event");
        custom.details = Details {
            kind: Some("inbox_full".into()),
            retry_after_secs: Some(3),
            state: Some(TaskState::Running),
            ..Details::default()
        };
        let batch = AuditBatch {
            actor: "router:r".into(),
            events: vec![routed(0), custom],
        };
        let back = AuditBatch::decode(&batch.encode()).unwrap();
        let mut want = batch.clone();
        want.events
            .iter_mut()
            .for_each(|e| e.actor = "router:r".into());
        assert_eq!(back, want);
    }

    #[test]
    fn batch_len_is_room_enough_for_the_written_batch() {
        for actor_len in [0, 31, 32, 255, 256, 65_535, 65_536] {
            for count in [0u64, 1, 15, 16, 1000] {
                let actor = "a".repeat(actor_len);
                let mut encoded = EncodedEvents::default();
                for i in 0..count {
                    let mut event = routed(i);
                    event.at = u64::MAX - i;
                    encoded.push(&event.borrowed());
                }
                let mut out = Vec::new();
                encoded.write_batch(&actor, &mut out).unwrap();
                assert!(
                    out.len() <= encoded.batch_len(&actor),
                    "actor of {actor_len}, {count} events: {} > {}",
                    out.len(),
                    encoded.batch_len(&actor)
                );
            }
        }
    }

    #[test]
    fn a_routed_event_takes_at_most_30_bytes() {
        let batch = AuditBatch {
            actor: "router:sys1/router.a".into(),
            events: (0..1000).map(routed).collect(),
        };
        let per_event = batch.encode().len() / 1000;
        assert!(per_event <= 30, "{per_event} bytes per event");
    }

    #[test]
    fn an_event_dated_before_the_first_reads_back_at_its_own_time() {
        // `accepted` is dated at the ingress's store time, which may precede the events
        // encoded before it in the same batch.
        let (late, early) = (routed(50), routed(0));
        let mut encoded = EncodedEvents::default();
        encoded.push(&late.borrowed());
        encoded.push(&early.borrowed());
        assert_eq!(encoded.len(), 2);
        let mut out = Vec::new();
        encoded.write_batch("router:r", &mut out).unwrap();
        assert!(out.len() <= encoded.batch_len("router:r"));
        let back = AuditBatch::decode(&out).unwrap();
        assert_eq!(
            back.events.iter().map(|e| e.at).collect::<Vec<_>>(),
            [late.at, early.at]
        );
        assert_eq!(back.events[1].details.seq, Some(100_000));
        // Emptied, it keeps nothing of them.
        encoded.clear();
        assert!(encoded.is_empty());
        encoded.push(&early.borrowed());
        let mut again = Vec::new();
        encoded.write_batch("router:r", &mut again).unwrap();
        assert_eq!(AuditBatch::decode(&again).unwrap().events.len(), 1);
    }

    #[test]
    fn an_earlier_versions_batch_still_reads_back() {
        // The shape before codes: the name under `e`, details under their full names.
        #[derive(Serialize)]
        struct Old<'a> {
            e: &'a str,
            m: &'a str,
            t: u64,
            d: Details,
        }
        #[derive(Serialize)]
        struct OldBatch<'a> {
            a: &'a str,
            b: u64,
            v: Vec<Old<'a>>,
        }
        let old = OldBatch {
            a: "inbox:bob",
            b: 1_000,
            v: vec![Old {
                e: "fetched",
                m: "m1",
                t: 5,
                d: Details {
                    stream_seq: Some(17),
                    ..Details::default()
                },
            }],
        };
        let back = AuditBatch::decode(&rmp_serde::to_vec_named(&old).unwrap()).unwrap();
        let e = &back.events[0];
        assert_eq!(
            (e.event.as_ref(), e.at, e.details.stream_seq),
            ("fetched", 1_005, Some(17))
        );
        assert_eq!(e.msg_id.as_deref(), Some("m1"));
    }

    #[test]
    fn an_unknown_code_is_an_error() {
        let mut bytes = AuditBatch {
            actor: "a".into(),
            events: vec![routed(0)],
        }
        .encode();
        // The code of `routed` (2) follows the key "c" (0xa1 0x63).
        let at = bytes.windows(2).position(|w| w == [0xa1, b'c']).unwrap() + 2;
        bytes[at] = 100; // a positive fixint, past the table
        assert!(matches!(
            AuditBatch::decode(&bytes),
            Err(BatchError::UnknownCode(100))
        ));
    }
}
