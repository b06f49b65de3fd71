//! Which reply subjects a service answers on: only those under the root of its inbox prefix
//! ([`subjects::reply_root`], [`subjects::is_reply_subject_under`]): `_INBOX.alice.…` for a
//! service whose own prefix is `_INBOX.router-1`. A reply subject is chosen by the requester and is
//! not permission-checked, so a reply aimed at, say, `hub.pub.<other>.inbox` would be stored as
//! `<other>`'s message.

use async_nats::Subject;
use protocol::subjects;

/// `reply` when a service may answer on it (under `prefix`). A reply elsewhere is logged
/// (naming the request's `subject`) and `refused` is called, for the service to count it; a
/// request without a reply gives `None` quietly.
pub(crate) fn answerable(
    reply: Option<&Subject>,
    prefix: &str,
    subject: &str,
    refused: impl FnOnce(),
) -> Option<Subject> {
    let reply = reply?;
    if subjects::is_reply_subject_under(reply.as_str(), subjects::reply_root(prefix)) {
        return Some(reply.clone());
    }
    refused();
    tracing::warn!(%subject, %reply, %prefix, "request with a reply outside the inbox prefix ignored");
    None
}
