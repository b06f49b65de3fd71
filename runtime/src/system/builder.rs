//! [`ActorSystemBuilder`]: how a host makes its [`ActorSystem`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::subjects;
use tokio::sync::Mutex;

use super::{presence, ActorSystem, SystemError, NEXT_SYSTEM};
use crate::connect::{ConnectError, NatsSettings};

/// Builder of an [`ActorSystem`].
#[derive(Debug, Default)]
pub struct ActorSystemBuilder {
    nats: Option<NatsSettings>,
    client: Option<async_nats::Client>,
    durable: bool,
    delivery: DeliveryConfig,
    inbox_prefix: Option<String>,
    inbox_mode: Option<DurableInboxMode>,
    ingress_retry_window: Option<std::time::Duration>,
}

impl ActorSystemBuilder {
    /// How inbox consumers bind (default: `NATS_HUB_DURABLE_INBOX`, else `auto`).
    #[must_use]
    pub fn inbox_mode(mut self, mode: DurableInboxMode) -> Self {
        self.inbox_mode = Some(mode);
        self
    }

    /// Connect with these settings (URL, one auth method, connect timeout).
    #[must_use]
    pub fn nats(mut self, settings: NatsSettings) -> Self {
        self.nats = Some(settings);
        self
    }

    /// The inbox prefix of the connection given with [`client`](Self::client) (with
    /// [`nats`](Self::nats) it is the settings' `inbox_prefix`). The system's services answer
    /// requests only on reply subjects under it; default `_INBOX`.
    #[must_use]
    pub fn inbox_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.inbox_prefix = Some(prefix.into());
        self
    }

    /// Use an existing connection instead of connecting.
    #[must_use]
    pub fn client(mut self, client: async_nats::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Durable delivery over JetStream (default off: plain core NATS, no JetStream traffic).
    #[must_use]
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Stream and consumer limits (default: [`DeliveryConfig::default`]).
    #[must_use]
    pub fn delivery_config(mut self, delivery: DeliveryConfig) -> Self {
        self.delivery = delivery;
        self
    }

    /// How long an ingress publish (a send, a delegation, an answer) that no stream answered or
    /// acknowledged is sent again, under the same id, before it fails (default
    /// [`INGRESS_RETRY_WINDOW`](super::messaging::INGRESS_RETRY_WINDOW), 20 s: two elections
    /// of a stream leader); zero fails at once.
    #[must_use]
    pub fn ingress_retry_window(mut self, window: std::time::Duration) -> Self {
        self.ingress_retry_window = Some(window);
        self
    }

    /// Connects (unless a client was given) and returns the system, with nothing started yet.
    ///
    /// # Errors
    /// [`SystemError::Connect`] when the settings are invalid or the server is unreachable.
    pub async fn build(self) -> Result<ActorSystem, SystemError> {
        let id = format!("sys{}", NEXT_SYSTEM.fetch_add(1, Ordering::Relaxed));
        let reply_prefix = match (&self.client, &self.nats, self.inbox_prefix) {
            (_, _, Some(prefix)) => prefix,
            (None, Some(settings), None) => settings.reply_prefix().to_owned(),
            _ => subjects::DEFAULT_REPLY_PREFIX.to_owned(),
        };
        if !subjects::is_valid_reply_prefix(&reply_prefix) {
            return Err(ConnectError::InvalidInboxPrefix(reply_prefix).into());
        }
        let client = match (self.client, self.nats) {
            (Some(client), _) => client,
            (None, Some(settings)) => settings.connect(&format!("runtime-{id}")).await?,
            (None, None) => {
                NatsSettings::new("nats://127.0.0.1:4222")
                    .connect(&format!("runtime-{id}"))
                    .await?
            }
        };
        let inbox_mode = match self.inbox_mode {
            Some(mode) => mode,
            None => match std::env::var(protocol::attach::ENV_DURABLE_INBOX) {
                Ok(v) => v.parse().map_err(|e: protocol::attach::InvalidInboxMode| {
                    SystemError::InvalidSetting(e.to_string())
                })?,
                Err(_) => DurableInboxMode::default(),
            },
        };
        let inbox_shared = actors::inbox::InboxShared::new(client.clone(), &format!("{id}/clock"));
        Ok(ActorSystem {
            id,
            client,
            durable: self.durable,
            presence: presence::PresenceCache::new(self.delivery.presence_beat()),
            delivery: Arc::new(self.delivery),
            reply_prefix,
            inbox_mode,
            trees: Mutex::new(Vec::new()),
            inboxes: Mutex::new(HashMap::new()),
            inbox_supervisor: Mutex::new(None),
            trackers: Mutex::new(None),
            tracker_table: Arc::default(),
            inbox_shared,
            holds: Arc::default(),
            ingress_retry_window: self
                .ingress_retry_window
                .unwrap_or(super::messaging::INGRESS_RETRY_WINDOW),
        })
    }
}
