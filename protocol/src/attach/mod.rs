//! Attaching to a durable inbox: the request/reply on
//! `hub.delivery.<id>.inbox`, the client mode, and what a client does with
//! each outcome.
//!
//! The request body is ignored by hub-server; send
//! [`ATTACH_REQUEST_BODY`] (an empty body works too). The reply is an
//! [`AttachResponse`] in JSON. The client then turns the outcome into an
//! [`InboxPlan`] with [`attach_fallback`]:
//!
//! | mode   | attached      | no responders   | timeout        | refused |
//! |--------|---------------|-----------------|----------------|---------|
//! | `off`  | core          | core            | core           | core    |
//! | `on`   | bind durable  | bind existing   | bind existing  | fail    |
//! | `auto` | bind durable  | core            | bind existing  | fail    |
//!
//! A client that knows the hub is durable (its ingress stream exists) uses
//! [`attach_fallback_on_durable_hub`]: there, "no responders" means the router
//! is down, not that the hub is core, so `auto` binds the existing consumer.
//!
//! With `off` the client should not even send the request. When
//! [`InboxPlan::BindExisting`] finds no consumer, the client follows
//! [`when_consumer_missing`].
//!
//! ```
//! use protocol::attach::{attach_fallback, AttachOutcome, DurableInboxMode, InboxPlan};
//! use protocol::AgentId;
//!
//! let bob = AgentId::new("bob")?;
//! let mode: DurableInboxMode = "AUTO".parse()?;
//! assert_eq!(attach_fallback(mode, &bob, AttachOutcome::NoResponders), InboxPlan::CoreSubscribe);
//! assert_eq!(
//!     attach_fallback(mode, &bob, AttachOutcome::Timeout),
//!     InboxPlan::BindExisting { consumer: "inbox-bob".into() }
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ids::AgentId;
use crate::subjects;
use crate::wire_error::WireError;

/// Environment variable that picks the client's [`DurableInboxMode`].
pub const ENV_DURABLE_INBOX: &str = "NATS_HUB_DURABLE_INBOX";

/// What a client sends as the attach request body. hub-server ignores the
/// body, so an empty one is just as good.
pub const ATTACH_REQUEST_BODY: &[u8] = b"{}";

/// A successful attach: where the client's inbox consumer lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachReply {
    /// The inbox stream, e.g. `HUB_INBOX`.
    pub stream: String,
    /// The consumer, `inbox-<id>`.
    pub consumer: String,
}

/// A durable hub's reply to a hub info request ([`subjects::hub_info_request`]): the names of
/// its streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubInfo {
    /// The ingress stream, e.g. `HUB_INGRESS`.
    pub ingress_stream: String,
    /// The inbox stream, e.g. `HUB_INBOX`.
    pub inbox_stream: String,
    /// The task channel stream, e.g. `HUB_TASKS`.
    pub tasks_stream: String,
}

/// A read of one of the requester's own task channels, sent as JSON on
/// [`subjects::task_read_request`] (`hub.delivery.<id>.task`). A router answers it with a direct
/// get of `channel.task.<id>.<key>` ([`task_read_direct_get`]), whose answer it relays: the
/// stored message with the broker's headers (`Nats-Sequence` among them), or
/// [`TASK_READ_END`] when the channel holds nothing more. A request the router cannot serve
/// is answered with an [`AttachResponse::Refused`]-shaped `{"error": ...}` body.
///
/// The router relays the answer rather than forwarding the request with the requester's reply
/// subject: a request from another account carries a reply the broker made (`_R_.…`), which
/// no client may name as the reply of a request of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRead {
    /// The task's channel key (its full id).
    pub key: crate::subjects::TaskKey,
    /// The first stream sequence to read from (the next stored message at or after it); when
    /// absent, the last stored message of the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_seq: Option<u64>,
}

/// A router's answer to a [`TaskRead`] when the channel holds no message at or after its
/// `from_seq` (or none at all): a body without the stored message's headers.
pub const TASK_READ_END: &[u8] = br#"{"end":true}"#;

/// The body of the direct get (`$JS.API.DIRECT.GET.<tasks stream>`) that serves `requester`'s
/// `read`: it names `channel.task.<requester>.<key>` and nothing else, since the key is one
/// subject token (no wildcard) and the delegator is the requester from the request subject.
pub fn task_read_direct_get(requester: &AgentId, read: &TaskRead) -> Vec<u8> {
    let subject = subjects::task(&subjects::TaskChannel {
        delegator: requester.clone(),
        key: read.key.clone(),
    });
    let body = match read.from_seq {
        Some(seq) => serde_json::json!({ "seq": seq.max(1), "next_by_subj": subject }),
        None => serde_json::json!({ "last_by_subj": subject }),
    };
    serde_json::to_vec(&body).expect("a direct get request serializes")
}

/// hub-server's reply to an attach request, in JSON:
/// `{"stream":..,"consumer":..}` or `{"error":{"kind":..,"detail":..}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttachResponse {
    /// The consumer exists now (created or updated).
    Attached(AttachReply),
    /// hub-server refused to attach.
    Refused {
        /// Why.
        error: WireError,
    },
}

/// How the attach request went, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOutcome {
    /// hub-server answered with the consumer.
    Attached(AttachReply),
    /// Nobody listens on the attach subject: a core hub.
    NoResponders,
    /// The request timed out: the router may be down right now.
    Timeout,
    /// hub-server answered with an error.
    Refused(WireError),
}

impl From<AttachResponse> for AttachOutcome {
    fn from(response: AttachResponse) -> AttachOutcome {
        match response {
            AttachResponse::Attached(reply) => AttachOutcome::Attached(reply),
            AttachResponse::Refused { error } => AttachOutcome::Refused(error),
        }
    }
}

/// How a client reads its inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxPlan {
    /// Pull from the consumer hub-server just attached.
    BindDurable {
        /// The inbox stream.
        stream: String,
        /// The inbox consumer.
        consumer: String,
    },
    /// Pull from this already existing consumer on the configured inbox
    /// stream; if it does not exist, follow [`when_consumer_missing`].
    BindExisting {
        /// `inbox-<id>`.
        consumer: String,
    },
    /// Plain core-NATS subscription to `channel.inbox.<id>`.
    CoreSubscribe,
    /// Give up, for this reason.
    Fail(InboxFailure),
}

/// Why a client gives up binding its inbox ([`InboxPlan::Fail`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InboxFailure {
    /// hub-server refused the attach request.
    #[error("durable inbox attach for `{id}` refused: {error}")]
    Refused {
        /// Whose inbox.
        id: AgentId,
        /// hub-server's error.
        #[source]
        error: WireError,
    },
    /// The durable inbox is `on`, but nobody answered and the consumer does not exist.
    #[error(
        "durable inbox is on, but no hub-server answered the attach request \
         and the inbox consumer does not exist"
    )]
    NoConsumer,
}

/// Which inbox a client uses, from [`ENV_DURABLE_INBOX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DurableInboxMode {
    /// Durable when the hub is durable, core otherwise (the default).
    #[default]
    Auto,
    /// Durable or nothing.
    On,
    /// Always core; never send an attach request.
    Off,
}

/// The value of [`ENV_DURABLE_INBOX`] is not a mode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid durable inbox mode `{value}`, expected one of auto, on, off")]
pub struct InvalidInboxMode {
    /// The rejected value.
    pub value: String,
}

impl DurableInboxMode {
    /// Every mode.
    pub const ALL: [DurableInboxMode; 3] = [
        DurableInboxMode::Auto,
        DurableInboxMode::On,
        DurableInboxMode::Off,
    ];

    /// The lowercase name: `auto`, `on` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            DurableInboxMode::Auto => "auto",
            DurableInboxMode::On => "on",
            DurableInboxMode::Off => "off",
        }
    }

    /// The mode for an environment value: unset or blank gives the default,
    /// anything else is parsed with [`FromStr`].
    ///
    /// # Errors
    ///
    /// Returns [`InvalidInboxMode`] for a value that is not a mode.
    pub fn from_env_value(value: Option<&str>) -> Result<DurableInboxMode, InvalidInboxMode> {
        match value {
            Some(value) if !value.trim().is_empty() => value.parse(),
            _ => Ok(DurableInboxMode::default()),
        }
    }
}

/// Parses `auto`, `on` or `off`, case-insensitively, ignoring surrounding
/// whitespace.
impl FromStr for DurableInboxMode {
    type Err = InvalidInboxMode;

    fn from_str(value: &str) -> Result<DurableInboxMode, InvalidInboxMode> {
        let trimmed = value.trim();
        DurableInboxMode::ALL
            .into_iter()
            .find(|mode| mode.as_str().eq_ignore_ascii_case(trimmed))
            .ok_or_else(|| InvalidInboxMode {
                value: value.to_owned(),
            })
    }
}

impl fmt::Display for DurableInboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What client `id` does after its attach request had `outcome`; see the
/// table in the [module docs](self).
///
/// With [`DurableInboxMode::Off`] the result is always
/// [`InboxPlan::CoreSubscribe`]; the caller should not send the request at
/// all. A refusal fails in `auto` mode too: the hub is durable, and
/// silently reading core instead would mix modes for this identity.
pub fn attach_fallback(mode: DurableInboxMode, id: &AgentId, outcome: AttachOutcome) -> InboxPlan {
    let existing = || InboxPlan::BindExisting {
        consumer: subjects::inbox_consumer(id),
    };
    match (mode, outcome) {
        (DurableInboxMode::Off, _) => InboxPlan::CoreSubscribe,
        (_, AttachOutcome::Attached(AttachReply { stream, consumer })) => {
            InboxPlan::BindDurable { stream, consumer }
        }
        (DurableInboxMode::Auto, AttachOutcome::NoResponders) => InboxPlan::CoreSubscribe,
        (DurableInboxMode::On, AttachOutcome::NoResponders) | (_, AttachOutcome::Timeout) => {
            existing()
        }
        (_, AttachOutcome::Refused(error)) => InboxPlan::Fail(InboxFailure::Refused {
            id: id.clone(),
            error,
        }),
    }
}

/// [`attach_fallback`] for a client that knows the hub is durable: with
/// `auto`, "no responders" means the router is down (a durable hub's inbox
/// consumer may exist and hold DMs), so it binds the existing consumer
/// instead of falling back to core at once.
pub fn attach_fallback_on_durable_hub(
    mode: DurableInboxMode,
    id: &AgentId,
    outcome: AttachOutcome,
) -> InboxPlan {
    match (mode, &outcome) {
        (DurableInboxMode::Auto, AttachOutcome::NoResponders) => InboxPlan::BindExisting {
            consumer: subjects::inbox_consumer(id),
        },
        _ => attach_fallback(mode, id, outcome),
    }
}

/// What the client does when [`InboxPlan::BindExisting`] finds no
/// consumer: `auto` falls back to [`InboxPlan::CoreSubscribe`], `on` fails.
/// (`off` never binds; it gets `CoreSubscribe` too.)
pub fn when_consumer_missing(mode: DurableInboxMode) -> InboxPlan {
    match mode {
        DurableInboxMode::Auto | DurableInboxMode::Off => InboxPlan::CoreSubscribe,
        DurableInboxMode::On => InboxPlan::Fail(InboxFailure::NoConsumer),
    }
}

#[cfg(test)]
mod tests;
