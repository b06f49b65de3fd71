//! Removing an agent from a durable hub (`runtime agent remove|restore`; docs/PROTOCOL.md,
//! "Removing an agent"). An operator's command: it writes the removed bucket, deletes a
//! consumer, reads and deletes inbox messages and copies dead letters, which admins are
//! granted (docs/SECURITY.md).
//!
//! [`remove`], in this order, each step safe to run again after a crash:
//!
//! 1. the tombstone ([`protocol::removal::tombstone_for`]) in `HUB_REMOVED`, with how far the
//!    agent's inbox consumer had got: from then on the routers refuse its DMs and its attach;
//! 2. the consumer `inbox-<id>` is deleted;
//! 3. every DM stored on `channel.inbox.<id>` above the consumer's ack floor is copied to
//!    `HUB_DLQ` (reason `recipient_deleted`, `Nats-Msg-Id: hub-dlq:<inbox seq>`, as the
//!    routers' dead letters: [`actors::dead_letter`]), its sender gets an `undeliverable`
//!    notice (`hub-system:undeliverable:<inbox seq>`), its deadline check is cancelled, and it
//!    is deleted from the inbox; the dead letters already stored for the agent are read first,
//!    so a DM copied before (by an earlier run, or dead-lettered by its deliveries) is never
//!    copied twice, whatever the duplicate window ([`protocol::removal::fate`]);
//! 4. the subject is purged up to the last DM swept; after [`SETTLE`], what routers stored in
//!    the instant before they saw the tombstone is swept the same way.
//!
//! [`restore`] deletes the tombstone.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, stream::DirectGetErrorKind};
use async_nats::Client;
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::removal::{self, Fate, Tombstone, RECIPIENT_DELETED};
use protocol::{headers, subjects, AgentId};
use serde::Serialize;

use super::SystemError;
use actors::dead_letter::{copy_dm, store_notice, NoticeStored};

/// How long the sweep waits before it looks again for DMs stored after its first pass: routers
/// learn a tombstone from their watch within milliseconds, and a DM one of them let through
/// just before is stored as soon.
pub const SETTLE: Duration = Duration::from_millis(500);
/// The longest audit batch the command publishes.
const AUDIT_BATCH: usize = 1024;

/// What [`remove`] did, printed as one JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removal {
    /// The agent removed.
    pub agent: AgentId,
    /// DMs this run copied to the dead-letter stream (a re-run counts only what an earlier
    /// run had not copied).
    pub dead_lettered: u64,
    /// `undeliverable` notices this run stored for the DMs' senders.
    pub notified: u64,
    /// Whether this run deleted the agent's inbox consumer (false: it had none, or an earlier
    /// run deleted it).
    pub consumer_deleted: bool,
}

/// Removes `agent` (module docs).
///
/// # Errors
/// [`SystemError::Request`] when a broker request fails (no durable router ever provisioned
/// the hub, or the grants are missing); the run can be made again.
pub async fn remove(
    client: &Client,
    delivery: &DeliveryConfig,
    agent: &AgentId,
) -> Result<Removal, SystemError> {
    let js = jetstream::new(client.clone());
    let bucket = subjects::REMOVED_BUCKET;
    let kv = removed_bucket(&js).await?;
    let existing = tombstone_entry(&kv, agent)
        .await?
        .and_then(|v| serde_json::from_slice::<Tombstone>(&v).ok());
    let inbox_name = &delivery.inbox.name;
    let inbox = js
        .get_stream(inbox_name)
        .await
        .map_err(|e| SystemError::request(inbox_name, e))?;
    let consumer = subjects::inbox_consumer(agent);
    let mark = match inbox.consumer_info(&consumer).await {
        Ok(info) => Some(removal::ConsumerMark {
            ack_floor: info.ack_floor.stream_sequence,
            delivered: info.delivered.stream_sequence,
        }),
        Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => None,
        Err(e) => return Err(SystemError::request(&consumer, e)),
    };
    let tomb = removal::tombstone_for(existing.as_ref(), mark, protocol::expiry::now_ms());
    let value = serde_json::to_vec(&tomb).expect("a tombstone serializes");
    kv.put(agent.as_str(), value.into())
        .await
        .map_err(|e| SystemError::request(bucket, e))?;
    let consumer_deleted = mark.is_some() && delete_consumer(&inbox, &consumer).await?;
    let mut sweep = Sweep {
        js: js.clone(),
        inbox,
        agent: agent.clone(),
        tomb,
        copies: copies_of(&js, agent).await?,
        out: Removal {
            agent: agent.clone(),
            dead_lettered: 0,
            notified: 0,
            consumer_deleted,
        },
        events: Vec::new(),
    };
    let mut next = tomb.ack_floor.saturating_add(1);
    next = sweep.pass(next).await?;
    tokio::time::sleep(SETTLE).await;
    next = sweep.pass(next).await?;
    let subject = subjects::inbox(agent);
    sweep
        .inbox
        .purge()
        .filter(subject.as_str())
        .sequence(next)
        .await
        .map_err(|e| SystemError::request(&subject, e))?;
    sweep.audit(client).await;
    tracing::info!(%agent, dead_lettered = sweep.out.dead_lettered, "agent removed");
    Ok(sweep.out)
}

/// Whether `agent` is removed now (a tombstone in `HUB_REMOVED`; none when the bucket does
/// not exist yet).
///
/// # Errors
/// [`SystemError::Request`] when the bucket cannot be read.
pub async fn is_removed(client: &Client, agent: &AgentId) -> Result<bool, SystemError> {
    let js = jetstream::new(client.clone());
    let kv = match js.get_key_value(subjects::REMOVED_BUCKET).await {
        Ok(kv) => kv,
        Err(e) if e.kind() == jetstream::context::KeyValueErrorKind::GetBucket => return Ok(false),
        Err(e) => return Err(SystemError::request(subjects::REMOVED_BUCKET, e)),
    };
    Ok(tombstone_entry(&kv, agent).await?.is_some())
}

/// The `HUB_REMOVED` bucket.
async fn removed_bucket(js: &jetstream::Context) -> Result<jetstream::kv::Store, SystemError> {
    let bucket = subjects::REMOVED_BUCKET;
    js.get_key_value(bucket)
        .await
        .map_err(|e| SystemError::request(bucket, e))
}

/// `agent`'s tombstone as stored, if it has one.
async fn tombstone_entry(
    kv: &jetstream::kv::Store,
    agent: &AgentId,
) -> Result<Option<Vec<u8>>, SystemError> {
    kv.get(agent.as_str())
        .await
        .map(|v| v.map(|b| b.to_vec()))
        .map_err(|e| SystemError::request(subjects::REMOVED_BUCKET, e))
}

/// Deletes `agent`'s tombstone (it may attach and receive DMs again); whether it had one.
///
/// # Errors
/// [`SystemError::Request`] when the bucket cannot be read or written.
pub async fn restore(client: &Client, agent: &AgentId) -> Result<bool, SystemError> {
    let bucket = subjects::REMOVED_BUCKET;
    let kv = removed_bucket(&jetstream::new(client.clone())).await?;
    let had = tombstone_entry(&kv, agent).await?.is_some();
    if had {
        kv.delete(agent.as_str())
            .await
            .map_err(|e| SystemError::request(bucket, e))?;
        tracing::info!(%agent, "agent restored");
    }
    Ok(had)
}

/// Deletes `consumer` of the inbox stream: whether it was there to delete.
async fn delete_consumer(
    inbox: &jetstream::stream::Stream,
    consumer: &str,
) -> Result<bool, SystemError> {
    match inbox.delete_consumer(consumer).await {
        Ok(_) => Ok(true),
        Err(e) if actors::consumers::is_consumer_not_found(&e) => Ok(false),
        Err(e) => Err(SystemError::request(consumer, e)),
    }
}

/// The dead letters already stored for `agent`'s DMs: inbox sequence → reason.
async fn copies_of(
    js: &jetstream::Context,
    agent: &AgentId,
) -> Result<HashMap<u64, String>, SystemError> {
    let dlq = js
        .get_stream_no_info(subjects::DLQ_STREAM)
        .await
        .map_err(|e| SystemError::request(subjects::DLQ_STREAM, e))?;
    let (filter, original) = (subjects::dlq(agent), subjects::inbox(agent));
    let mut out = HashMap::new();
    let mut next = 1;
    loop {
        let msg = match dlq.direct_get_next_for_subject(&filter, Some(next)).await {
            Ok(msg) => msg,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(SystemError::request(&filter, e)),
        };
        next = msg.sequence + 1;
        let letter = actors::dead_letter::provenance(&msg.headers);
        if letter.subject != original {
            continue;
        }
        if let Some(seq) = letter.original_seq {
            out.insert(seq, letter.reason);
        }
    }
}

/// One removal's sweep of the agent's inbox subject.
struct Sweep {
    js: jetstream::Context,
    inbox: jetstream::stream::Stream,
    agent: AgentId,
    tomb: Tombstone,
    /// Dead letters already stored (inbox sequence → reason).
    copies: HashMap<u64, String>,
    out: Removal,
    /// The `dead_lettered` audit events of this run.
    events: Vec<protocol::audit::AuditEvent>,
}

impl Sweep {
    /// Sweeps every DM stored on the agent's subject from sequence `from`; returns the
    /// sequence after the last one.
    async fn pass(&mut self, from: u64) -> Result<u64, SystemError> {
        let subject = subjects::inbox(&self.agent);
        let mut next = from;
        loop {
            let msg = match self
                .inbox
                .direct_get_next_for_subject(&subject, Some(next))
                .await
            {
                Ok(msg) => msg,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(next),
                Err(e) => return Err(SystemError::request(&subject, e)),
            };
            next = msg.sequence + 1;
            self.one(msg).await?;
        }
    }

    /// What [`removal::fate`] says of `msg`.
    async fn one(&mut self, msg: jetstream::message::StreamMessage) -> Result<(), SystemError> {
        let seq = msg.sequence;
        let env = protocol::decode_with_content_type(
            &msg.payload,
            msg.headers.get(headers::CONTENT_TYPE).map(|v| v.as_str()),
        )
        .ok();
        let expires_at = env.as_ref().and_then(|e| e.meta.expires_at());
        let existing = self.copies.get(&seq).map(String::as_str);
        let now = protocol::expiry::now_ms();
        match removal::fate(&self.tomb, seq, expires_at, existing, now) {
            Fate::Handled | Fate::DeadLettered | Fate::Expired => return Ok(()),
            Fate::Notify => {}
            Fate::DeadLetter => {
                let deliveries = removal::deliveries(&self.tomb, seq);
                let dlq = subjects::dlq(&self.agent);
                let ack = copy_dm(&self.js, &self.agent, &msg, RECIPIENT_DELETED, deliveries)
                    .await
                    .map_err(|e| SystemError::request(&dlq, e))?;
                self.copies.insert(seq, RECIPIENT_DELETED.to_owned());
                if !ack.duplicate {
                    self.out.dead_lettered += 1;
                }
                if let Some(env) = &env {
                    self.events.push(
                        protocol::audit::AuditEvent::msg(
                            "dead_lettered",
                            env.meta.id.as_str(),
                            now,
                            "",
                        )
                        .details(protocol::audit::Details {
                            inbox_seq: Some(seq),
                            reason: Some(RECIPIENT_DELETED.to_owned()),
                            ..Default::default()
                        }),
                    );
                }
            }
        }
        if let Some(env) = &env {
            self.notify(env, seq).await?;
            if expires_at.is_some() {
                self.cancel_check(seq).await;
            }
        }
        self.inbox
            .delete_message(seq)
            .await
            .map_err(|e| SystemError::request(&subjects::inbox(&self.agent), e))?;
        Ok(())
    }

    /// Tells the sender of `env` (stored at `seq`) that it will not be delivered; a system
    /// notice has no sender.
    async fn notify(&mut self, env: &protocol::Envelope, seq: u64) -> Result<(), SystemError> {
        let Some(from) = &env.meta.from else {
            return Ok(());
        };
        let (subject, msg_id, notice) = protocol::rejection::undeliverable_notice(
            from,
            &self.agent,
            &env.meta.id,
            seq,
            RECIPIENT_DELETED,
        );
        match store_notice(&self.js, subject.clone(), &msg_id, &notice).await {
            NoticeStored::Stored => self.out.notified += 1,
            NoticeStored::Dropped | NoticeStored::Unencodable => {}
            NoticeStored::Failed => {
                return Err(SystemError::request(
                    &subject,
                    "the notice was not stored in time",
                ))
            }
        }
        Ok(())
    }

    /// Cancels the deadline check of the DM at `seq` (its sender is told `undeliverable`, not
    /// `expired` later). Best effort: a check left fires and tells the sender `expired` too.
    async fn cancel_check(&self, seq: u64) {
        let schedule = subjects::expiry_schedule(seq);
        let cancelled = async {
            self.js
                .get_stream_no_info(subjects::SCHEDULES_STREAM)
                .await?
                .purge()
                .filter(schedule.as_str())
                .await?;
            Ok::<_, async_nats::Error>(())
        };
        if let Err(e) = cancelled.await {
            tracing::warn!(error = %ErrorChain(&*e), seq, "a deadline check was not cancelled");
        }
    }

    /// Publishes this run's `dead_lettered` events as `admin:cli` (best effort, as every audit
    /// event: a gap in `runtime trace`, not an error).
    async fn audit(&self, client: &Client) {
        let subject = subjects::audit("admin", "cli");
        for chunk in self.events.chunks(AUDIT_BATCH) {
            let payload = protocol::audit::AuditBatch::encode_events("admin:cli", chunk);
            if let Err(e) = client.publish(subject.clone(), payload.into()).await {
                tracing::debug!(error = %ErrorChain(&e), "audit events not published");
            }
        }
        let _ = client.flush().await;
    }
}
