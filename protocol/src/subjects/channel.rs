//! What follows the sender identity in an ingress subject.

use std::fmt;

use crate::ids::{validated_id, AgentId, ChannelName, TaskId, MAX_TOKEN_LEN};

validated_id! {
    /// The key of a stored task channel: the `<key>` in `channel.task.<delegator>.<key>`.
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

/// Where a task's channel lives: under the identity that delegated the task, so that a
/// delegator may be granted its own task channels (`channel.task.<self>.>`) and nobody else's.
///
/// The delegator is the router's stamp on the task input (`meta.from`), which the worker
/// reads from the input it runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskChannel {
    /// The identity that delegated the task.
    pub delegator: AgentId,
    /// The task's key (its full id).
    pub key: TaskKey,
}

impl TaskChannel {
    /// The channel of task `id` delegated by `delegator`.
    pub fn of(delegator: &AgentId, id: &TaskId) -> TaskChannel {
        TaskChannel {
            delegator: delegator.clone(),
            key: TaskKey::from_task_id(id),
        }
    }

    /// Its stored subject, `channel.task.<delegator>.<key>` ([`super::task`]).
    pub fn subject(&self) -> String {
        super::task(self)
    }
}

/// `<delegator>.<key>`.
impl fmt::Display for TaskChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.delegator, self.key)
    }
}

/// The channel an agent publishes to, after its identity in
/// `hub.pub.<id>.<channel>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A direct message; `meta.to` picks the recipient inbox. Token `inbox`.
    Inbox,
    /// A stored task channel. Tokens `task.<delegator>.<key>`.
    Task(TaskChannel),
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

/// Formats the tokens that follow the identity: `inbox`, `task.<delegator>.<key>` or
/// `<name>`.
impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Channel::Inbox => f.write_str(super::INBOX_TOKEN),
            Channel::Task(channel) => write!(f, "{}.{channel}", super::TASK_TOKEN),
            Channel::Broadcast(name) => f.write_str(name.as_str()),
        }
    }
}
