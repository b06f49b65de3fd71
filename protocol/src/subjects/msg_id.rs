//! Every prefix of the `Nats-Msg-Id`s (and system `meta.id`s) the hub stores under, in one
//! place: the replay guard tells the router's own stores by them
//! ([`super::is_router_msg_id`]), and they must never overlap.

/// Prefix of the `Nats-Msg-Id` of every message the router stores.
pub const ROUTER_MSG_ID_PREFIX: &str = "hub-router:";
/// Prefix of the `Nats-Msg-Id` of every system envelope the hub stores. Distinct from
/// [`ROUTER_MSG_ID_PREFIX`], so the replay guard never mistakes one for the other.
pub const SYSTEM_MSG_ID_PREFIX: &str = "hub-system:";
/// Prefix of the `meta.id` of a rejection: `hub-reject-<ingress_seq>`.
pub const REJECTION_ID_PREFIX: &str = "hub-reject-";
/// Prefix of the `Nats-Msg-Id` a task is stored under in the work stream.
pub const TASK_MSG_ID_PREFIX: &str = "hub-task:";
/// Prefix of the `Nats-Msg-Id` of a published task result.
pub const RESULT_MSG_ID_PREFIX: &str = "hub-result:";
/// Prefix of the `Nats-Msg-Id` of a published status event.
pub const STATUS_MSG_ID_PREFIX: &str = "hub-status:";
/// Prefix of the `Nats-Msg-Id` of the error result of a refused answer.
pub const REFUSAL_MSG_ID_PREFIX: &str = "hub-refusal:";
/// Prefix of the id of a bundle (state change + result) a worker publishes.
pub const BUNDLE_MSG_ID_PREFIX: &str = "hub-bundle:";

/// Prefix of the `Nats-Msg-Id` of a DM's dead letter ([`dlq_msg_id`]).
pub const DLQ_MSG_ID_PREFIX: &str = "hub-dlq:";
/// Prefix of the `Nats-Msg-Id` of a task input's or an answer's dead letter
/// ([`dead_letter_msg_id`]).
pub const DEAD_LETTER_MSG_ID_PREFIX: &str = "hub-dlq-";
/// Prefix of the `Nats-Msg-Id` of a check the router schedules ([`schedule_msg_id`]).
pub const SCHEDULE_MSG_ID_PREFIX: &str = "hub-sched:";

/// The `Nats-Msg-Id` of the dead letter of the DM stored at `inbox_seq`: `hub-dlq:<inbox seq>`
/// (one copy per DM, whoever makes it: the routers' advisories pump, `runtime agent remove`).
pub fn dlq_msg_id(inbox_seq: u64) -> String {
    format!("{DLQ_MSG_ID_PREFIX}{inbox_seq}")
}

/// The `Nats-Msg-Id` of the dead letter of a `kind` (task input or answer) stored at `seq` of
/// its stream: `hub-dlq-<kind>:<seq>`.
pub fn dead_letter_msg_id(kind: &str, seq: u64) -> String {
    format!("{DEAD_LETTER_MSG_ID_PREFIX}{kind}:{seq}")
}

/// The `Nats-Msg-Id` of the `kind` check (`expiry`, `answer`) the router schedules for what it
/// stored at `seq`: `hub-sched:<kind>:<seq>`.
pub fn schedule_msg_id(kind: &str, seq: u64) -> String {
    format!("{SCHEDULE_MSG_ID_PREFIX}{kind}:{seq}")
}

/// The `meta.id` of a system notice of `kind` about the DM stored at `inbox_seq`:
/// `hub-<kind>-<inbox seq>` (`hub-expired-9`).
pub fn notice_id(kind: &str, inbox_seq: u64) -> String {
    format!("hub-{kind}-{inbox_seq}")
}

/// Separates the logical id of an ingress `Nats-Msg-Id` from its seal
/// ([`ingress_msg_id`]).
pub const INGRESS_SEAL_SEPARATOR: char = '~';

/// The `Nats-Msg-Id` an ingress publish carries: `<logical>~<seal, 16 hex digits>`.
///
/// The ingress stream dedupes its ids across every identity that writes into it, so an id
/// another identity can guess (a `meta.id` or task id the sender chose, seen by whoever it
/// writes to) would let that identity publish first under it: the rightful publish would be
/// acked as a duplicate and dropped. The seal is a keyed hash of `logical` that only the
/// publishing process can compute: the same logical id gets the same seal in one process (its
/// retries are still deduplicated at the ingress), and the router's stores, whose ids derive
/// from the sender and the logical id alone, deduplicate across processes.
#[must_use]
pub fn ingress_msg_id(logical: &str, seal: u64) -> String {
    format!("{logical}{INGRESS_SEAL_SEPARATOR}{seal:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_ids_are_built_from_their_prefixes_and_none_is_a_routers() {
        assert_eq!(dlq_msg_id(7), "hub-dlq:7");
        assert_eq!(dead_letter_msg_id("task", 7), "hub-dlq-task:7");
        assert_eq!(schedule_msg_id("expiry", 7), "hub-sched:expiry:7");
        assert_eq!(notice_id("expired", 9), "hub-expired-9");
        for id in [
            dlq_msg_id(7),
            dead_letter_msg_id("task", 7),
            schedule_msg_id("answer", 7),
        ] {
            assert!(!super::super::is_router_msg_id(&id), "{id}");
        }
    }
}
