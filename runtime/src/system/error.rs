//! The embedding API's errors.

use protocol::AgentId;

use crate::config::ConfigLoadError;
use crate::connect::ConnectError;

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Failures of the embedding API.
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    /// The delivery config file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] ConfigLoadError),
    /// The connection settings are invalid or the server is unreachable.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Stream provisioning failed (including a retention policy that cannot be changed).
    #[error(transparent)]
    Streams(#[from] actors::streams::StreamError),
    /// An actor could not be spawned.
    #[error("cannot spawn {what}")]
    Spawn {
        /// Which actor.
        what: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// [`ActorSystem::attach_inbox`] of an identity whose inbox is attached here already.
    #[error("the inbox of {id} is attached already")]
    AlreadyAttached {
        /// The identity.
        id: AgentId,
    },
    /// [`ActorSystem::detach_inbox`] of an identity with no inbox attached here.
    #[error("no inbox of {id} is attached here")]
    NotAttached {
        /// The identity.
        id: AgentId,
    },
    /// An actor did not come up or answer in time.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What.
        what: String,
    },
    /// `runtime status` found no router on the server.
    #[error("no router answered on {subject} (is `runtime start --role router` running?)")]
    NoRouter {
        /// The status subject.
        subject: &'static str,
    },
    /// A NATS request failed, or its reply does not decode.
    #[error("request on {subject} failed")]
    Request {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A setting (environment variable or argument) has an invalid value.
    #[error("{0}")]
    InvalidSetting(String),
    /// A task the router would refuse (checked before anything is written or sent).
    #[error("invalid task")]
    InvalidTask(#[source] protocol::TaskError),
    /// A publish was not accepted by the ingress stream.
    #[error("publish to {subject} failed")]
    Publish {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The worker's journal is locked by another process or unreadable.
    #[error(transparent)]
    Journal(#[from] actors::journal::JournalError),
    /// A refusal for a limit told `from` to wait: its DMs to `to` (a full inbox), or all its
    /// DMs (`to` is `None`: over its rate), are held back for `retry_after_secs` more. Nothing
    /// was published; send again after that.
    #[error("{} for {retry_after_secs} s more", held_what(from, to.as_ref()))]
    Held {
        /// The sender held back.
        from: AgentId,
        /// The recipient whose inbox is full; `None` when the sender is over its rate.
        to: Option<AgentId>,
        /// Whole seconds left.
        retry_after_secs: u64,
    },
    /// The recipient was removed from the hub (`runtime agent remove`): nothing was
    /// published. Its tombstone is read before the send (cached for up to 5 s), so a send in
    /// the seconds after a removal may still be published, and then refused by the router
    /// with a `recipient_deleted` notice.
    #[error("recipient_deleted: {to} was removed from the hub")]
    RecipientDeleted {
        /// The removed recipient.
        to: AgentId,
    },
    /// The task is not in the state the operation needs (unknown, not waiting...).
    #[error("task {task_id}: {what}")]
    Task {
        /// The task.
        task_id: protocol::TaskId,
        /// What is the matter.
        what: String,
    },
}

fn held_what(from: &AgentId, to: Option<&AgentId>) -> String {
    match to {
        Some(to) => format!("the inbox of {to} is full: {from} may not send to it"),
        None => format!("{from} is over its rate: it may not send"),
    }
}

impl SystemError {
    /// An operator mistake in flags or config files: exit 64.
    pub fn is_usage(&self) -> bool {
        match self {
            SystemError::Config(_)
            | SystemError::InvalidSetting(_)
            | SystemError::InvalidTask(_)
            | SystemError::Journal(_) => true,
            SystemError::Connect(e) => e.is_usage(),
            SystemError::Streams(
                actors::streams::StreamError::RetentionMismatch { .. }
                | actors::streams::StreamError::Replicas { .. },
            ) => true,
            _ => false,
        }
    }

    /// The server is unreachable or refused: exit 69.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            SystemError::Connect(_)
                | SystemError::Streams(_)
                | SystemError::NoRouter { .. }
                | SystemError::Request { .. }
                | SystemError::Publish { .. }
                | SystemError::Timeout { .. }
                | SystemError::Task { .. }
        ) && !self.is_usage()
    }

    pub(crate) fn request(subject: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Request {
            subject: subject.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn publish(subject: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Publish {
            subject: subject.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn spawn(what: &str, source: impl Into<BoxError>) -> SystemError {
        SystemError::Spawn {
            what: what.to_owned(),
            source: source.into(),
        }
    }
}
