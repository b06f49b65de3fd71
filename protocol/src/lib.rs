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
//! - [`trace`]: W3C trace context propagation through headers.
//!
//! Fallible functions return typed errors ([`IdError`], [`SubjectError`],
//! [`EnvelopeError`], [`ConfigError`], [`TraceError`]).
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

pub mod config;
pub mod envelope;
pub mod headers;
pub mod ids;
pub mod subjects;
pub mod trace;
pub mod wire_error;

pub use config::{ConfigError, DeliveryConfig, StorageKind};
pub use envelope::{decode, encode, Codec, Envelope, EnvelopeError, Meta, MAX_ENVELOPE_BYTES};
pub use ids::{AgentId, ChannelName, IdError, MessageId, QueueName, TaskId, WorkerId};
pub use subjects::{Channel, SubjectError, TaskKey};
pub use trace::{HeaderCarrier, TraceError, TraceParent};
pub use wire_error::{WireError, WireErrorKind};
