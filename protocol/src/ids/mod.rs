//! Validated identifiers: agents, workers, messages, tasks, queues and
//! broadcast channels.
//!
//! Every id is a newtype over `String` that can only be built through
//! validation, and that is validated again when deserialized. Identity-like
//! ids ([`AgentId`], [`WorkerId`], [`TaskId`], [`QueueName`],
//! [`ChannelName`]) allow `[A-Za-z0-9_-]` only, at most
//! [`MAX_TOKEN_LEN`] bytes: they are safe as a NATS subject token, inside a
//! durable consumer name and as a file name. A [`MessageId`] travels only in
//! envelopes and `Nats-Msg-Id` headers, so it allows any printable ASCII
//! except space, at most [`MAX_MESSAGE_ID_LEN`] bytes.
//!
//! [`AgentId`] and [`WorkerId`] must not start with [`SYSTEM_ID_PREFIX`]
//! (`hub-`): a sender's ingress `Nats-Msg-Id` is `<from>:<meta.id>`, and every
//! id the hub stores under itself starts with `hub-…:` (`hub-router:`,
//! `hub-system:`, `hub-task:`, ...), so a sender named `hub-router` would have
//! its messages dropped by the router's replay guard. The other ids never start
//! a `Nats-Msg-Id` and do not reserve it.
//!
//! ```
//! use protocol::ids::{AgentId, IdError};
//!
//! let bob = AgentId::new("bob").unwrap();
//! assert_eq!(bob.as_str(), "bob");
//! assert!(matches!(
//!     AgentId::new("bo.b"),
//!     Err(IdError::InvalidChar { ch: '.', index: 2, .. })
//! ));
//! ```

mod error;
pub(crate) mod rules;

pub use error::IdError;

/// Maximum length in bytes of an identity-like id or name.
pub const MAX_TOKEN_LEN: usize = 128;

/// Maximum length in bytes of a [`MessageId`].
pub const MAX_MESSAGE_ID_LEN: usize = 256;

/// The prefix of every `Nats-Msg-Id` and system `meta.id` the hub stores under
/// (`hub-router:`, `hub-system:`, `hub-reject-`, `hub-task:`, `hub-result:`,
/// `hub-status:`, `hub-bundle:`, `hub-refusal:`). Reserved in [`AgentId`] and [`WorkerId`]:
/// refused with [`IdError::ReservedPrefix`].
pub const SYSTEM_ID_PREFIX: &str = "hub-";

/// Defines a validated `String` newtype.
///
/// `charset` is a [`rules::Charset`] variant; `reserved` lists exact values
/// that are rejected even though their characters are valid; the optional
/// `reserved_prefixes` lists prefixes rejected the same way.
macro_rules! validated_id {
    (
        $(#[$meta:meta])*
        $name:ident {
            kind: $kind:literal,
            max: $max:expr,
            charset: $charset:ident,
            reserved: [$($reserved:literal),* $(,)?]
            $(, reserved_prefixes: [$($prefix:expr),* $(,)?])? $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Deserialize,
        )]
        #[serde(try_from = "String")]
        pub struct $name(String);

        // A plain string, written from the borrowed id (`into = "String"` cloned it first:
        // three allocations per routed DM).
        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl $name {
            /// What this id is called in error messages.
            pub const KIND: &'static str = $kind;
            /// Maximum length in bytes.
            pub const MAX_LEN: usize = $max;
            /// Values that are rejected although their characters are valid.
            pub const RESERVED: &'static [&'static str] = &[$($reserved),*];
            /// Prefixes that are rejected although their characters are valid.
            pub const RESERVED_PREFIXES: &'static [&'static str] = &[$($($prefix),*)?];

            #[doc = concat!("Validates `value` and wraps it as a ", $kind, ".")]
            ///
            /// # Errors
            ///
            /// Returns an [`IdError`](crate::ids::IdError) naming the first
            /// rule `value` breaks.
            pub fn new(value: impl Into<String>) -> Result<Self, $crate::ids::IdError> {
                let value = value.into();
                Self::validate(&value)?;
                Ok(Self(value))
            }

            #[doc = concat!("Checks that `value` is a valid ", $kind, " without allocating.")]
            ///
            /// # Errors
            ///
            /// Returns an [`IdError`](crate::ids::IdError) naming the first
            /// rule `value` breaks.
            pub fn validate(value: &str) -> Result<(), $crate::ids::IdError> {
                $crate::ids::rules::check(
                    value,
                    Self::KIND,
                    Self::MAX_LEN,
                    $crate::ids::rules::Charset::$charset,
                    Self::RESERVED,
                )?;
                $crate::ids::rules::check_prefixes(value, Self::KIND, Self::RESERVED_PREFIXES)
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Unwraps the id into its `String`.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::ids::IdError;

            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::new(value)
            }
        }

        impl ::std::convert::TryFrom<String> for $name {
            type Error = $crate::ids::IdError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl ::std::convert::TryFrom<&str> for $name {
            type Error = $crate::ids::IdError;

            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl ::std::convert::From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl ::std::convert::AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl ::std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

pub(crate) use validated_id;

validated_id! {
    /// The identity of an agent: the `<id>` in `hub.pub.<id>.…` and
    /// `channel.inbox.<id>`. Must not start with [`SYSTEM_ID_PREFIX`].
    AgentId {
        kind: "agent id",
        max: MAX_TOKEN_LEN,
        charset: Token,
        reserved: [],
        reserved_prefixes: [SYSTEM_ID_PREFIX],
    }
}

validated_id! {
    /// The identity of a worker. Same rules as [`AgentId`] (a worker publishes
    /// under its id), kept as a separate type so the two are not mixed up.
    WorkerId {
        kind: "worker id",
        max: MAX_TOKEN_LEN,
        charset: Token,
        reserved: [],
        reserved_prefixes: [SYSTEM_ID_PREFIX],
    }
}

validated_id! {
    /// The id of an envelope (`meta.id`). Printable ASCII except space; it
    /// never becomes a subject token.
    MessageId { kind: "message id", max: MAX_MESSAGE_ID_LEN, charset: Printable, reserved: [] }
}

validated_id! {
    /// The id of a delegated task. Subject-safe, so it is also its own task
    /// channel key (see [`TaskKey`](crate::subjects::TaskKey)).
    TaskId { kind: "task id", max: MAX_TOKEN_LEN, charset: Token, reserved: [] }
}

validated_id! {
    /// The name of a work queue.
    QueueName { kind: "queue name", max: MAX_TOKEN_LEN, charset: Token, reserved: [] }
}

validated_id! {
    /// The name of a broadcast channel (`channel.<name>`).
    ///
    /// `inbox` and `task` are reserved: they name the stored channels, not
    /// broadcasts.
    ChannelName {
        kind: "channel name",
        max: MAX_TOKEN_LEN,
        charset: Token,
        reserved: ["inbox", "task"],
    }
}

#[cfg(test)]
pub(crate) mod strategies;
#[cfg(test)]
mod tests;
