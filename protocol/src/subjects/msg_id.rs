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
