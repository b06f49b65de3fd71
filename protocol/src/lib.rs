//! Wire types, subject names, codecs and configuration of the hub runtime.
//!
//! `protocol` is a pure leaf crate: it has no I/O, no async runtime, no
//! actors and no NATS client. Everything that crosses the wire or names a
//! NATS resource is defined here, once, so that every other crate agrees on
//! it:
//!
//! - [`ids`]: validated identifiers ([`AgentId`], [`MessageId`], ...);
//! - [`subjects`]: every subject, stream and consumer name, built and
//!   parsed in one place;
//! - [`headers`]: NATS header names;
//! - [`envelope`]: the message envelope and its JSON / MessagePack codecs;
//! - [`config`]: the durable delivery config file;
//! - [`wire_error`]: the stable error kinds that travel in envelopes;
//! - [`trace`]: W3C trace context propagation through headers;
//! - [`routing`]: the router's decision for one ingress message
//!   ([`route`], [`RouteDecision`]), including the replay guard;
//! - [`rejection`](mod@rejection): the system envelope telling a sender
//!   why its envelope was refused;
//! - [`backpressure`]: full inboxes, sender rate limits and when to try again;
//! - [`presence`]: whether an agent is online, from its inbox's heartbeats;
//! - [`pull`]: an inbox's pull requests and what each reply to one means;
//! - [`removal`]: removing an agent (its tombstone, the fate of its stored DMs, the routers'
//!   set of removed agents);
//! - [`audit`]: the audit trail's events and the timeline of one message or task;
//! - [`dedupe`]: the bounded [`SeenSet`] inboxes drop redeliveries with;
//! - [`attach`]: attaching to a durable inbox and the client fallback rules
//!   ([`DurableInboxMode`], [`attach_fallback`]);
//! - [`security`]: the identities file, each role's broker grants and the rendered
//!   nats-server configuration.
//!
//! Fallible functions return typed errors ([`IdError`], [`SubjectError`],
//! [`EnvelopeError`], [`ConfigError`], [`TraceError`], [`InvalidInboxMode`]).
//!
//! ```
//! use protocol::subjects::{self, Channel};
//! use protocol::{decode, AgentId, Codec};
//!
//! // What `nats pub hub.pub.alice.inbox '{"meta":{"id":"m1","to":"bob"},"body":"hi"}'` sends.
//! let alice = AgentId::new("alice")?;
//! let subject = subjects::ingress(&alice, &Channel::Inbox);
//! assert_eq!(subject, "hub.pub.alice.inbox");
//!
//! let payload = br#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#;
//! let env = decode(payload, Codec::from_content_type(None)?)?;
//! let (from, channel) = subjects::parse_ingress(&subject)?;
//! assert_eq!((from, channel), (alice, Channel::Inbox));
//! let bob = env.meta.to.expect("a direct message has a recipient");
//! assert_eq!(subjects::inbox(&bob), "channel.inbox.bob");
//! assert_eq!(env.body, "hi");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod attach;
pub mod audit;
pub mod backpressure;
pub mod clock;
pub mod config;
pub mod dedupe;
pub mod envelope;
pub mod error_chain;
pub mod expiry;
pub mod headers;
pub mod history;
pub mod ids;
pub mod ordering;
pub mod presence;
pub mod pull;
pub mod receipt;
pub mod rejection;
pub mod removal;
pub mod routing;
pub mod security;
pub mod store_ack;
pub mod subjects;
pub mod task;
pub mod trace;
pub mod watchdog;
pub mod wire_error;

pub use attach::{
    attach_fallback, when_consumer_missing, AttachOutcome, AttachReply, AttachResponse,
    DurableInboxMode, InboxFailure, InboxPlan, InvalidInboxMode, ENV_DURABLE_INBOX,
};
pub use config::{ConfigError, DeliveryConfig, StorageKind};
pub use dedupe::{SeenSet, DEFAULT_DEDUPE_CAPACITY};
pub use envelope::{
    decode, decode_with_content_type, encode, Codec, Envelope, EnvelopeError, Meta,
    MAX_ENVELOPE_BYTES,
};
pub use ids::{AgentId, ChannelName, IdError, MessageId, QueueName, TaskId, WorkerId};
pub use rejection::{is_system, parse_rejection, rejection, Rejection, SYSTEM_MSG_ID_PREFIX};
pub use routing::{route, DropReason, IngressView, RouteDecision};
pub use subjects::{Channel, SubjectError, TaskKey};
pub use task::{AttemptId, TaskError};
pub use trace::{HeaderCarrier, TraceError, TraceParent};
pub use wire_error::{WireError, WireErrorKind};
