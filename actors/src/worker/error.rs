//! Why a worker could not start or run.

use std::time::Duration;

use protocol::WireError;

use super::compat;
use crate::journal::JournalError;

/// Why a join failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No router answered in time.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// No router listens (a core hub, or none running).
    #[error("no responders (is a durable router running?)")]
    NoResponders,
    /// The request failed.
    #[error("request failed")]
    Request(#[source] async_nats::RequestError),
    /// The router refused.
    #[error("refused: {}: {}", .0.kind.as_str(), .0.detail)]
    Refused(WireError),
    /// The reply does not decode.
    #[error("unreadable join reply")]
    Unreadable(#[source] serde_json::Error),
}

/// Worker failures.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The configuration is invalid.
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// The journal could not be opened (e.g. locked by another process).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The join request failed or was refused.
    #[error("join of queue {queue} failed")]
    Join {
        /// The queue.
        queue: String,
        /// Why.
        #[source]
        source: JoinError,
    },
    /// A consumer could not be bound.
    #[error("cannot bind consumer {consumer}")]
    Consumer {
        /// Its name.
        consumer: String,
        /// Why.
        #[source]
        source: async_nats::Error,
    },
    /// A consumer has settings the worker refuses.
    #[error("consumer {consumer} has a setting the worker refuses")]
    Incompatible {
        /// Its name.
        consumer: String,
        /// The refused setting.
        #[source]
        source: compat::IncompatibleConsumer,
    },
    /// A control subscription could not be made.
    #[error("cannot subscribe to {subject}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The fetch loop failed.
    #[error("worker fetch loop failed")]
    Pump(#[source] crate::background::PumpFailure),
}
