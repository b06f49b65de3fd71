//! What follows the sender identity in an ingress subject.

use std::fmt;

use crate::ids::{validated_id, ChannelName, TaskId, MAX_TOKEN_LEN};

validated_id! {
    /// The key of a stored task channel: the `<key>` in `channel.task.<key>`.
    ///
    /// Same rules as [`TaskId`]. The key of a task is its full id (see
    /// [`TaskKey::from_task_id`]).
    TaskKey { kind: "task key", max: MAX_TOKEN_LEN, charset: Token, reserved: [] }
}

impl TaskKey {
    /// The task channel key of a task: the full task id.
    ///
    /// Not a prefix: time-ordered ids share their first characters, so a
    /// prefix would put unrelated tasks on one channel. A [`TaskId`] is
    /// already subject-safe, so no encoding is needed.
    pub fn from_task_id(id: &TaskId) -> TaskKey {
        TaskKey(id.as_str().to_owned())
    }
}

impl From<&TaskId> for TaskKey {
    fn from(id: &TaskId) -> TaskKey {
        TaskKey::from_task_id(id)
    }
}

/// The channel an agent publishes to, after its identity in
/// `hub.pub.<id>.<channel>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A direct message; `meta.to` picks the recipient inbox. Token `inbox`.
    Inbox,
    /// A stored task channel. Tokens `task.<key>`.
    Task(TaskKey),
    /// A live-only broadcast channel. Token `<name>`.
    Broadcast(ChannelName),
}

impl Channel {
    /// Whether messages on this channel are stored (inbox and task channels)
    /// rather than live-only (broadcasts).
    pub fn is_stored(&self) -> bool {
        !matches!(self, Channel::Broadcast(_))
    }
}

/// Formats the tokens that follow the identity: `inbox`, `task.<key>` or
/// `<name>`.
impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Channel::Inbox => f.write_str(super::INBOX_TOKEN),
            Channel::Task(key) => write!(f, "{}.{key}", super::TASK_TOKEN),
            Channel::Broadcast(name) => f.write_str(name.as_str()),
        }
    }
}
