//! An audit event encoded by hand: the bytes serde writes for [`super::wire`]'s `WireEvent`,
//! without serde's visitor calls per field. Every DM emits four events; through serde their
//! encoding was the larger part of what the audit trail costs a router and an inbox.
//!
//! The layout, as `rmp_serde::encode::write_named` writes it: a map of the fields present, in
//! declaration order, under one-letter keys (`c` code or `e` name, `m`, `k`, `r`, `t`, `n`,
//! and `x` the details' own map: `s i q b w y a n l u k r`). Integers take their most compact
//! form. An event with a task state (`z`) is left to serde ([`write_event`] returns `false`).
//! `the_hand_encoding_is_serde_s_byte_for_byte` proves the two agree.

use rmp::encode::{write_map_len, write_sint, write_str, write_uint, ValueWriteError};

use super::{Details, EventRef};

/// Writes `event` (of code `code`, `after_base` ms after its batch's base) to `out`; `false`,
/// writing nothing, when it is one for serde (it has a task state).
pub(super) fn write_event(
    out: &mut Vec<u8>,
    event: &EventRef<'_>,
    code: Option<u8>,
    after_base: i64,
) -> bool {
    if event.details.state.is_some() {
        return false;
    }
    write(out, event, code, after_base).expect("writing to a vector cannot fail");
    true
}

/// A one-letter key: a fixstr of one byte.
fn key(out: &mut Vec<u8>, k: u8) {
    out.extend_from_slice(&[0xa1, k]);
}

fn write(
    out: &mut Vec<u8>,
    e: &EventRef<'_>,
    code: Option<u8>,
    after_base: i64,
) -> Result<(), ValueWriteError> {
    let details = detail_count(e.details);
    let len = 1 // `c` or `e`
        + u32::from(e.msg_id.is_some())
        + u32::from(e.task_id.is_some())
        + u32::from(e.trace_id.is_some())
        + 1 // `t`
        + u32::from(e.attempt.is_some())
        + u32::from(details > 0);
    write_map_len(out, len)?;
    match code {
        Some(code) => {
            key(out, b'c');
            write_uint(out, u64::from(code))?;
        }
        None => {
            key(out, b'e');
            write_str(out, e.event)?;
        }
    }
    for (k, v) in [(b'm', e.msg_id), (b'k', e.task_id), (b'r', e.trace_id)] {
        if let Some(v) = v {
            key(out, k);
            write_str(out, v)?;
        }
    }
    key(out, b't');
    write_sint(out, after_base)?;
    if let Some(attempt) = e.attempt {
        key(out, b'n');
        write_uint(out, attempt)?;
    }
    if details > 0 {
        key(out, b'x');
        write_details(out, e.details, details)?;
    }
    Ok(())
}

/// The details' numbers, in the order of their keys.
fn numbers(d: &Details) -> [(u8, Option<u64>); 9] {
    [
        (b's', d.seq),
        (b'i', d.ingress_seq),
        (b'q', d.stream_seq),
        (b'b', d.inbox_seq),
        (b'w', d.work_seq),
        (b'y', d.delay_ms),
        (b'a', d.retry_after_secs),
        (b'n', d.items),
        (b'l', d.dlq_id),
    ]
}

/// How many details are set (the task state aside: such an event is serde's).
fn detail_count(d: &Details) -> u32 {
    let numbers = numbers(d).iter().filter(|(_, v)| v.is_some()).count();
    // At most 12: the cast cannot truncate.
    (numbers
        + usize::from(d.duplicate.is_some())
        + usize::from(d.kind.is_some())
        + usize::from(d.reason.is_some())) as u32
}

fn write_details(out: &mut Vec<u8>, d: &Details, len: u32) -> Result<(), ValueWriteError> {
    write_map_len(out, len)?;
    for (k, v) in numbers(d) {
        if let Some(v) = v {
            key(out, k);
            write_uint(out, v)?;
        }
    }
    if let Some(duplicate) = d.duplicate {
        key(out, b'u');
        rmp::encode::write_bool(out, duplicate).map_err(ValueWriteError::InvalidMarkerWrite)?;
    }
    for (k, v) in [(b'k', &d.kind), (b'r', &d.reason)] {
        if let Some(v) = v {
            key(out, k);
            write_str(out, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::wire::{code_of, write_event_serde};
    use super::*;
    use crate::task::TaskState;
    use proptest::prelude::*;

    fn details() -> impl Strategy<Value = Details> {
        let n = || proptest::option::of(any::<u64>());
        let text = || proptest::option::of("[a-z_ é]{0,40}");
        (
            (n(), n(), n(), n(), n(), n(), n(), n(), n()),
            proptest::option::of(any::<bool>()),
            text(),
            text(),
            proptest::option::of(prop_oneof![
                Just(TaskState::Running),
                Just(TaskState::Completed)
            ]),
        )
            .prop_map(
                |((s, i, q, b, w, y, a, n, l), duplicate, kind, reason, state)| Details {
                    seq: s,
                    ingress_seq: i,
                    stream_seq: q,
                    inbox_seq: b,
                    work_seq: w,
                    delay_ms: y,
                    retry_after_secs: a,
                    items: n,
                    dlq_id: l,
                    duplicate,
                    kind,
                    reason,
                    state,
                },
            )
    }

    proptest! {
        #[test]
        fn the_hand_encoding_is_serde_s_byte_for_byte(
            event in prop_oneof![
                proptest::sample::select(super::super::EVENTS).prop_map(str::to_owned),
                "[a-z_]{1,20}",
            ],
            msg_id in proptest::option::of("[A-Za-z0-9:.-]{0,300}"),
            task_id in proptest::option::of("[A-Za-z0-9-]{0,40}"),
            trace_id in proptest::option::of("[0-9a-f]{32}"),
            at in any::<u64>(),
            attempt in proptest::option::of(any::<u64>()),
            after_base in any::<i64>(),
            details in details(),
        ) {
            let e = EventRef {
                event: &event,
                msg_id: msg_id.as_deref(),
                task_id: task_id.as_deref(),
                trace_id: trace_id.as_deref(),
                at,
                attempt,
                details: &details,
            };
            let code = code_of(&event);
            let mut serde = Vec::new();
            write_event_serde(&mut serde, &e, code, after_base);
            let mut hand = Vec::new();
            if write_event(&mut hand, &e, code, after_base) {
                prop_assert_eq!(hand, serde);
            } else {
                prop_assert!(details.state.is_some() && hand.is_empty());
            }
        }
    }
}
