//! `runtime dlq list|replay|discard`: the dead letters in `HUB_DLQ` (docs/PROTOCOL.md, "Dead
//! letters"). An operator's command: it reads and deletes with direct gets and message
//! deletes on the dead-letter stream, which only admins are granted.

use async_nats::jetstream::{self, stream::DirectGetErrorKind};
use clap::{Args, Subcommand};
use protocol::error_chain::ErrorChain;
use protocol::headers::CONTENT_TYPE;
use protocol::subjects;
use runtime::SystemError;
use serde::Serialize;

use super::{HubArgs, NatsArgs};

/// `runtime dlq`.
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: DlqAction,
    /// Where the hub keeps its streams.
    #[command(flatten)]
    pub hub: HubArgs,
    /// How to reach NATS.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `runtime dlq list|replay|discard`.
#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// List the dead letters, oldest first.
    List {
        /// Only those addressed to this agent.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Deliver a dead letter again, and take it off the dead-letter stream: a DM is stored in
    /// its recipient's inbox once more, a task input in its queue (its worker reads the task's
    /// channel first: it may have run), an answer for its worker (checked again after
    /// `answer_max_wait_secs`). Under a fresh dedupe id, with its `meta.id` unchanged.
    Replay {
        /// The dead letter's id (its sequence in the dead-letter stream, as `list` prints it).
        id: u64,
    },
    /// Delete a dead letter for good.
    Discard {
        /// The dead letter's id.
        id: u64,
    },
}

/// One dead letter, as `list` prints it.
#[derive(Debug, Serialize)]
pub struct DeadLetter {
    /// Its id: the sequence in the dead-letter stream.
    pub id: u64,
    /// Its recipient's inbox subject.
    pub subject: String,
    /// Its sender (the router's stamp).
    pub from: Option<String>,
    /// Its `meta.id`.
    pub message_id: Option<String>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// How many times it was delivered.
    pub deliveries: u64,
    /// Its sequence in the inbox stream.
    pub original_seq: u64,
}

/// Runs `runtime dlq`, printing what it did on stdout.
///
/// # Errors
/// [`SystemError::InvalidSetting`] for an invalid agent id or an unknown dead letter;
/// connection and request errors.
pub async fn dlq(args: DlqArgs, print: impl Fn(&str)) -> Result<(), SystemError> {
    let _ = args.hub.delivery()?;
    let client = args.nats.settings().connect("runtime-dlq").await?;
    let js = jetstream::new(client.clone());
    let stream = js
        .get_stream_no_info(subjects::DLQ_STREAM)
        .await
        .map_err(|e| failed(subjects::DLQ_STREAM, e))?;
    match args.action {
        DlqAction::List { agent, json } => {
            let filter = match agent {
                Some(id) => subjects::dlq(
                    &protocol::AgentId::new(id).map_err(|e| super::invalid("--agent", &e))?,
                ),
                None => subjects::DLQ_FILTER.to_owned(),
            };
            let mut next = 1;
            loop {
                let msg = match stream
                    .direct_get_next_for_subject(&filter, Some(next))
                    .await
                {
                    Ok(msg) => msg,
                    Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                    Err(e) => return Err(failed(&filter, e)),
                };
                next = msg.sequence + 1;
                let letter = dead_letter(&msg);
                if json {
                    print(&serde_json::to_string(&letter).unwrap_or_default());
                } else {
                    print(&format!(
                        "{} {} -> {} {} ({}, {} deliveries)",
                        letter.id,
                        letter.from.as_deref().unwrap_or("?"),
                        letter.subject,
                        letter.message_id.as_deref().unwrap_or("?"),
                        letter.reason,
                        letter.deliveries
                    ));
                }
            }
        }
        DlqAction::Replay { id } => {
            let delivery = args.hub.delivery()?;
            let msg = get(&stream, id).await?;
            let letter = dead_letter(&msg);
            let (seq, subject) = replay(&client, &js, &msg, &letter, &delivery).await?;
            delete(&stream, id).await?;
            audit(
                &client,
                "replayed",
                &letter,
                protocol::audit::Details {
                    dlq_id: Some(id),
                    inbox_seq: subject.starts_with("channel.inbox.").then_some(seq),
                    ..Default::default()
                },
            )
            .await;
            print(
                &serde_json::json!({"replayed": id, "subject": subject, "seq": seq, "inbox_seq": seq})
                    .to_string(),
            );
        }
        DlqAction::Discard { id } => {
            let letter = dead_letter(&get(&stream, id).await?);
            delete(&stream, id).await?;
            audit(
                &client,
                "discarded",
                &letter,
                protocol::audit::Details {
                    dlq_id: Some(id),
                    ..Default::default()
                },
            )
            .await;
            print(&serde_json::json!({ "discarded": id }).to_string());
        }
    }
    Ok(())
}

/// Stores dead letter `msg` where it came from, under a fresh dedupe id (the original's may
/// still be in its stream's duplicate window), with its `meta.id` unchanged: a DM in its
/// recipient's inbox, a task input back in its queue (flagged `Hub-Check`: it may have run
/// before, so the worker reads its channel first), an answer back to its worker (with a new
/// wait check, so it is dead-lettered again if no worker takes it). The sequence it was stored
/// at and its subject.
async fn replay(
    client: &async_nats::Client,
    js: &jetstream::Context,
    msg: &jetstream::message::StreamMessage,
    letter: &DeadLetter,
    delivery: &protocol::config::DeliveryConfig,
) -> Result<(u64, String), SystemError> {
    let id = letter.id;
    let subject = letter.subject.clone();
    let from = letter.from.as_deref().unwrap_or("unknown");
    let message_id = letter.message_id.as_deref().unwrap_or("unknown");
    let unreadable =
        |what: &str| SystemError::InvalidSetting(format!("dead letter {id} on {subject}: {what}"));
    let mut headers = async_nats::HeaderMap::new();
    if let Some(ct) = msg.headers.get(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, ct.as_str());
    }
    let envelope = || {
        protocol::decode_with_content_type(
            &msg.payload,
            msg.headers.get(CONTENT_TYPE).map(|v| v.as_str()),
        )
        .map_err(|e| unreadable(&ErrorChain(&e).to_string()))
    };
    let mut check = None;
    let msg_id = if let Ok(to) = subjects::parse_inbox(&subject) {
        // Its recipient was removed: the router would refuse it again (and the letter would be
        // gone from here). It stays until the agent is restored.
        if runtime::system::removal::is_removed(client, &to).await? {
            return Err(SystemError::InvalidSetting(format!(
                "dead letter {id} is for {to}, which is removed: run `runtime agent restore {to}` first"
            )));
        }
        format!(
            "{}{from}:{message_id}:replay:{id}",
            subjects::ROUTER_MSG_ID_PREFIX
        )
    } else if subjects::parse_work(&subject).is_ok() {
        let task = protocol::task::decode_task(&envelope()?.body)
            .map_err(|e| unreadable(&format!("not a task: {e}")))?;
        headers.insert(protocol::headers::HUB_CHECK, "replay");
        format!(
            "{}{from}:{}:replay:{id}",
            protocol::task::TASK_MSG_ID_PREFIX,
            task.task_id
        )
    } else if let Ok(worker) = subjects::parse_answer(&subject) {
        let env = envelope()?;
        let answer: protocol::task::Answer = serde_json::from_value(env.body)
            .map_err(|e| unreadable(&format!("not an answer: {e}")))?;
        let sender = env
            .meta
            .from
            .ok_or_else(|| unreadable("an answer without its sender"))?;
        let wait_ms = delivery.answer_max_wait_secs.saturating_mul(1000);
        check = Some(actors::router::Planned::Answer {
            from: sender,
            worker,
            id: env.meta.id,
            task_id: answer.task_id,
            at_ms: protocol::expiry::now_ms().saturating_add(wait_ms),
        });
        format!(
            "{}{from}:{message_id}:replay:{id}",
            subjects::ROUTER_MSG_ID_PREFIX
        )
    } else {
        return Err(unreadable("not a DM, a task input or an answer"));
    };
    headers.insert(protocol::headers::NATS_MSG_ID, msg_id.as_str());
    let ack = actors::streams::publish_acked(
        js,
        subject.clone(),
        headers,
        msg.payload.clone(),
        actors::PUBLISH_ACK_TIMEOUT,
    )
    .await
    .map_err(|e| failed(&subject, e))?;
    if let Some(check) = check {
        let (schedule, headers, payload) = check.schedule(ack.sequence);
        actors::streams::publish_acked(
            js,
            schedule.clone(),
            headers,
            payload.into(),
            actors::PUBLISH_ACK_TIMEOUT,
        )
        .await
        .map_err(|e| failed(&schedule, e))?;
    }
    Ok((ack.sequence, subject))
}

fn failed(subject: &str, e: impl std::error::Error + Send + Sync + 'static) -> SystemError {
    SystemError::Request {
        subject: subject.to_owned(),
        source: Box::new(e),
    }
}

/// Dead letter `id`, or [`SystemError::InvalidSetting`] when there is none.
async fn get(
    stream: &jetstream::stream::Stream<()>,
    id: u64,
) -> Result<jetstream::message::StreamMessage, SystemError> {
    match stream.direct_get(id).await {
        Ok(msg) if msg.subject.starts_with("dlq.") => Ok(msg),
        Ok(_) => Err(SystemError::InvalidSetting(format!("no dead letter {id}"))),
        Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
            Err(SystemError::InvalidSetting(format!("no dead letter {id}")))
        }
        Err(e) => Err(failed(subjects::DLQ_STREAM, e)),
    }
}

async fn delete(stream: &jetstream::stream::Stream<()>, id: u64) -> Result<(), SystemError> {
    stream
        .delete_message(id)
        .await
        .map(|_| ())
        .map_err(|e| failed(subjects::DLQ_STREAM, e))
}

fn dead_letter(msg: &jetstream::message::StreamMessage) -> DeadLetter {
    let provenance = actors::dead_letter::provenance(&msg.headers);
    let env = protocol::decode_with_content_type(
        &msg.payload,
        msg.headers.get(CONTENT_TYPE).map(|v| v.as_str()),
    )
    .ok();
    DeadLetter {
        id: msg.sequence,
        subject: provenance.subject,
        from: env
            .as_ref()
            .and_then(|e| e.meta.from.as_ref().map(|f| f.to_string())),
        message_id: env.as_ref().map(|e| e.meta.id.to_string()),
        reason: provenance.reason,
        deliveries: provenance.deliveries,
        original_seq: provenance.original_seq.unwrap_or(0),
    }
}

/// Emits the audit event of a dlq command (`replayed`, `discarded`) about `letter`'s DM, as
/// `admin:cli`; best effort (a lost event is only a gap in `runtime trace`).
async fn audit(
    client: &async_nats::Client,
    event: &'static str,
    letter: &DeadLetter,
    details: protocol::audit::Details,
) {
    let Some(id) = &letter.message_id else {
        return;
    };
    let event = protocol::audit::AuditEvent::msg(event, id, protocol::expiry::now_ms(), "")
        .details(details);
    actors::audit::emit_one(client, "admin", "cli", event).await;
}
