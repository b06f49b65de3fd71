//! Which reply subjects a service answers on ([`subjects::is_answerable_reply`]): those under
//! the root of its inbox prefix (`_INBOX.alice.…` for a service whose own prefix is
//! `_INBOX.router-1`), and those the broker made for a request from another account
//! (`_R_.…`, which it maps back to the requester's own reply). A reply subject is chosen by the
//! requester and is not permission-checked, so a reply aimed at, say, `hub.pub.<other>.inbox`
//! within the hub's account would be stored as `<other>`'s message.

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
    if subjects::is_answerable_reply(reply.as_str(), prefix) {
        return Some(reply.clone());
    }
    refused();
    tracing::warn!(%subject, %reply, %prefix, "request with a reply outside the inbox prefix ignored");
    None
}
