//! `runtime send` and `runtime inbox`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::attach::DurableInboxMode;
use protocol::config::DeliveryConfig;
use protocol::{AgentId, Envelope, MessageId, Meta};
use runtime::system::messaging::Receipt;
use runtime::SystemError;

use super::{InboxArgs, ListenArgs, SendArgs};

pub(super) fn agent(flag: &str, value: &str) -> Result<AgentId, SystemError> {
    AgentId::new(value).map_err(|e| super::invalid(flag, &e))
}

/// How long a client waits for the hub to say what it is.
const HUB_INFO_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the hub is durable, as its routers say (`hub.delivery.<id>.hub`; no stream info is
/// needed, which a least-privilege agent may not read): answered on a durable hub, nobody
/// answers on a core hub. While no router runs, `id`'s own inbox consumer (one consumer info
/// request, which `id` may make) tells a durable hub it attached to before; a durable hub
/// `id` never attached to then looks like a core one: the ingress stream still stores a plain
/// publish, but no receipt proves it.
///
/// # Errors
/// [`SystemError::Timeout`] when a router took the request and did not answer.
async fn hub_is_durable(
    client: &async_nats::Client,
    id: &AgentId,
    delivery: &DeliveryConfig,
) -> Result<bool, SystemError> {
    let subject = protocol::subjects::hub_info_request(id);
    match tokio::time::timeout(HUB_INFO_TIMEOUT, client.request(subject.clone(), "".into())).await {
        Ok(Ok(reply)) => {
            Ok(serde_json::from_slice::<protocol::attach::HubInfo>(&reply.payload).is_ok())
        }
        Ok(Err(e)) if e.kind() == async_nats::client::RequestErrorKind::NoResponders => {
            let js = async_nats::jetstream::new(client.clone());
            let own = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    protocol::subjects::inbox_consumer(id),
                    delivery.inbox.name.clone(),
                );
            Ok(matches!(
                tokio::time::timeout(HUB_INFO_TIMEOUT, own).await,
                Ok(Ok(_))
            ))
        }
        Ok(Err(e)) => Err(SystemError::Request {
            subject,
            source: Box::new(e),
        }),
        Err(_) => Err(SystemError::Timeout {
            what: format!("the hub's answer on {subject}"),
        }),
    }
}

/// `runtime send --as alice --to bob TEXT`: a JetStream publish to the ingress when the hub is
/// durable (the receipt carries the ingress sequence), a core publish otherwise.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid identity or id; connection and publish
/// errors.
pub async fn send(args: SendArgs) -> Result<Receipt, SystemError> {
    let from = agent("--as", &args.as_id)?;
    let to = agent("--to", &args.to)?;
    let id = match args.id {
        Some(id) => MessageId::new(id).map_err(|e| super::invalid("--id", &e))?,
        None => runtime::system::messaging::new_message_id(),
    };
    let delivery = args.hub.delivery()?;
    let nats = args.nats.settings();
    let client = nats.connect("runtime-send").await?;
    let durable = hub_is_durable(&client, &from, &delivery).await?;
    let system = super::client_builder(client, &nats, delivery, durable)
        .build()
        .await?;
    // The trace of a DM starts here: the publish carries this span's `traceparent`, so the
    // router's `route` span and the recipient's handler span join this trace.
    let span = tracing::info_span!("send", from = %from, to = %to, id = %id);
    let mut meta = Meta::new(id);
    meta.set_expires_at(
        args.expires_in_secs
            .map(|secs| protocol::expiry::now_ms().saturating_add(secs.saturating_mul(1000))),
    );
    // A refusal for a limit this sender was told of holds the DM back: nothing is sent.
    system.load_holds(&from, &to).await;
    meta.to = Some(to);
    let envelope = Envelope {
        meta,
        body: serde_json::Value::String(args.text),
        extra: Default::default(),
    };
    let receipt = tracing::Instrument::instrument(
        system.send_envelope(&from, &protocol::Channel::Inbox, &envelope),
        span,
    )
    .await?;
    let _ = system.client().flush().await;
    Ok(receipt)
}

/// `runtime inbox --as bob [--follow] [--json]`: prints each DM on stdout (with `--json`, the
/// envelope with a `delivery` object beside it: `stream_seq`, `delivered`, `redelivered`,
/// `out_of_order`); without `--follow` exits once no DM arrived for `--idle-secs`.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid identity or mode; connection and bind errors.
pub async fn inbox(args: InboxArgs) -> Result<(), SystemError> {
    let id = agent("--as", &args.as_id)?;
    let mode: DurableInboxMode =
        args.durable_inbox
            .parse()
            .map_err(|e: protocol::attach::InvalidInboxMode| {
                SystemError::InvalidSetting(e.to_string())
            })?;
    let signals = super::signals()?;
    let delivery = args.hub.delivery()?;
    let nats = args.nats.settings();
    let client = nats.connect("runtime-inbox").await?;
    let durable = mode != DurableInboxMode::Off && hub_is_durable(&client, &id, &delivery).await?;
    let system = super::client_builder(client, &nats, delivery, durable)
        .inbox_mode(mode)
        .build()
        .await?;
    let json = args.json;
    let count = Arc::new(AtomicU64::new(0));
    let seen = count.clone();
    system
        .attach_inbox(&id, move |d| {
            let line = if json {
                // The envelope, and beside it where it stands in the inbox (`delivery`).
                let mut line = serde_json::to_value(&d.envelope).unwrap_or_default();
                line["delivery"] = serde_json::json!({
                    "stream_seq": d.stream_seq,
                    "delivered": d.delivered,
                    "redelivered": d.redelivered,
                    "out_of_order": d.out_of_order,
                });
                line.to_string()
            } else {
                let from = d
                    .envelope
                    .meta
                    .from
                    .as_ref()
                    .map_or("hub", |f| f.as_str())
                    .to_string();
                let body = match &d.envelope.body {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("{from}: {body}")
            };
            println!("{line}");
            seen.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {})
        })
        .await?;
    if args.follow {
        signals.recv().await;
    } else {
        let idle = Duration::from_secs(args.idle_secs);
        let mut last = count.load(Ordering::Relaxed);
        let wait_idle = async {
            loop {
                tokio::time::sleep(idle).await;
                let now = count.load(Ordering::Relaxed);
                if now == last {
                    break;
                }
                last = now;
            }
        };
        tokio::select! {
            _ = wait_idle => {}
            _ = signals.recv() => {}
        }
    }
    system.shutdown(Duration::from_secs(10)).await
}

/// `runtime listen --channel news`: prints each broadcast on the channel as it comes (one line
/// each, `from: body`, or the envelope as JSON with `--json`), until `--count` of them or
/// SIGINT/SIGTERM. Prints `listening on channel.<name>` on stderr once subscribed.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid channel name; connection errors.
pub async fn listen(args: ListenArgs) -> Result<(), SystemError> {
    use futures::StreamExt;
    let channel =
        protocol::ChannelName::new(&args.channel).map_err(|e| super::invalid("--channel", &e))?;
    let nats = args.nats.settings();
    let client = nats.connect("runtime-listen").await?;
    let system = super::client_builder(client, &nats, DeliveryConfig::default(), false)
        .build()
        .await?;
    let mut broadcasts = system.listen(&channel).await?;
    let signals = super::signals()?.recv();
    tokio::pin!(signals);
    eprintln!("listening on {}", protocol::subjects::broadcast(&channel));
    let mut seen = 0;
    while args.count.is_none_or(|n| seen < n) {
        let envelope = tokio::select! {
            next = broadcasts.next() => match next {
                Some(envelope) => envelope,
                None => break,
            },
            () = &mut signals => break,
        };
        seen += 1;
        if args.json {
            println!("{}", serde_json::to_string(&envelope).unwrap_or_default());
        } else {
            let from = envelope.meta.from.as_ref().map_or("?", AgentId::as_str);
            println!("{from}: {}", envelope.body);
        }
    }
    system.shutdown(Duration::from_secs(1)).await
}

/// `runtime send`, printing its receipt as JSON.
///
/// # Errors
/// As [`send`].
pub async fn print_send(args: SendArgs) -> anyhow::Result<()> {
    let receipt = send(args).await?;
    println!("{}", serde_json::to_string(&receipt)?);
    Ok(())
}
