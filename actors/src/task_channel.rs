//! Reading a stored task channel (`channel.task.<delegator>.<key>` in the tasks stream) with
//! direct gets: `next_by_subj` from a sequence, one request per stored message and one more to
//! learn there is nothing further, and no consumer. The tracker, the worker's check before it
//! runs a task, and the client commands all read a channel this way.
//!
//! A [`Reader`] says how the direct gets are made: straight to the stream (a worker, which is
//! granted direct gets on the tasks stream), or through a router as a delegator
//! ([`Reader::Routed`], `hub.delivery.<me>.task`): a delegator reads its own task channels and
//! no others, with no direct-get grant of its own.

use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage, stream::DirectGetErrorKind};
use async_nats::HeaderMap;
use protocol::attach::TaskRead;
use protocol::subjects::{self, TaskChannel};
use protocol::task::{ChannelView, TaskChannelBody};
use protocol::{AgentId, TaskId, WireError};

/// Upper bound of one whole read of a channel.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages one read takes (a task channel holds a few per attempt).
pub const MAX_READ: usize = 10_000;

/// A stored message of a task channel.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its stream sequence.
    pub seq: u64,
    /// Its headers (the trace context among them).
    pub headers: HeaderMap,
    /// The body, when it is a task channel body of the channel's task published by the worker
    /// it names.
    pub body: Option<TaskChannelBody>,
    /// It was such a body, but not published by the worker it names (a forgery): ignored.
    pub unstamped: bool,
}

/// Why a message of a task channel is not a body its readers trust ([`decode_checked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undecoded {
    /// A body of the task whose `meta.from` is not the worker it names: ignored.
    Unstamped,
    /// Anything else (another task's, not a task channel envelope).
    Other,
}

/// How a task channel is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reader {
    /// Direct gets on the tasks stream, named here (a worker; a router).
    Direct(String),
    /// Through a router, as this identity (`hub.delivery.<me>.task`): only the channels of the
    /// tasks it delegated.
    Routed(AgentId),
}

/// A read that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream could not be looked up.
    #[error("cannot look up task channel stream {stream}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::context::GetStreamError,
    },
    /// A direct get failed (the stream does not exist, or allows no direct gets...).
    #[error("cannot read {subject} from stream {stream}")]
    Get {
        /// The stream.
        stream: String,
        /// The task channel.
        subject: String,
        /// Why.
        #[source]
        source: async_nats::jetstream::stream::DirectGetError,
    },
    /// A read through a router failed: no router answered, or it refused the read.
    #[error("reading {subject} through a router: {reason}")]
    Routed {
        /// The task channel.
        subject: String,
        /// Why.
        reason: String,
    },
    /// The last message of a task's channel still in the ingress holds no result (a status, a
    /// refusal): an earlier message of the task there may hold one, which that read cannot
    /// see, so nothing can be concluded until the router has caught up.
    #[error("the last unrouted message of {subject} holds no result: read again once routed")]
    Inconclusive {
        /// The ingress filter read.
        subject: String,
    },
    /// The read took longer than [`READ_TIMEOUT`].
    #[error("reading {subject} took longer than {READ_TIMEOUT:?}")]
    Timeout {
        /// The task channel.
        subject: String,
    },
}

/// Decodes one message of `task_id`'s channel: an envelope (its codec from the `Content-Type`
/// header, one rule for every reader) whose body is a task channel body of that task, and
/// whose `meta.from` (the router's stamp) is the worker the body names.
///
/// # Errors
/// [`Undecoded`]: why the message is not such a body.
pub fn decode_checked(
    task_id: &TaskId,
    msg_headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<TaskChannelBody, Undecoded> {
    let env = crate::decode::envelope(msg_headers, payload).map_err(|_| Undecoded::Other)?;
    let (from, body) = (env.meta.from, env.body);
    match serde_json::from_value::<TaskChannelBody>(body) {
        Ok(body) if body.task_id() != task_id => Err(Undecoded::Other),
        Ok(body) if body.is_from(from.as_ref().map(|f| f.as_str())) => Ok(body),
        Ok(_) => Err(Undecoded::Unstamped),
        Err(_) => Err(Undecoded::Other),
    }
}

/// [`decode_checked`]'s body, if it is one to trust.
pub fn decode(
    task_id: &TaskId,
    msg_headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Option<TaskChannelBody> {
    decode_checked(task_id, msg_headers, payload).ok()
}

/// Reads the channel of `task_id` delegated by `delegator`, from sequence `from` (1: the start)
/// to its end, at most [`MAX_READ`] messages, within [`READ_TIMEOUT`].
///
/// # Errors
/// [`ReadError`] when the stream is unknown, a get fails, no router serves a routed read, or
/// the read takes too long.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn read(
    js: &jetstream::Context,
    reader: &Reader,
    delegator: &AgentId,
    task_id: &TaskId,
    from: u64,
) -> Result<Vec<Stored>, ReadError> {
    let channel = TaskChannel::of(delegator, task_id);
    let stored = match reader {
        Reader::Direct(stream) => read_subject(js, stream, &channel.subject(), from).await?,
        Reader::Routed(me) => read_routed(&js.client(), me, &channel, from).await?,
    };
    Ok(stored
        .into_iter()
        .map(|msg| {
            let decoded = decode_checked(task_id, Some(&msg.headers), &msg.payload);
            Stored {
                seq: msg.sequence,
                unstamped: decoded.as_ref().err() == Some(&Undecoded::Unstamped),
                body: decoded.ok(),
                headers: msg.headers,
            }
        })
        .collect())
}

/// The task channel bodies of `task_id` (delegated by `delegator`) in the last message of its
/// channel still in the `ingress` stream: published by some worker (a bundle's items expanded)
/// and not routed yet (a router acks an ingress message once it stored it, and the ingress
/// drops it then). Usually none.
///
/// Only the last such message is read, with the subject in the request subject
/// (`$JS.API.DIRECT.GET.<ingress>.hub.pub.*.task.<delegator>.<key>`): that is the form a
/// worker's grant allows (`…hub.pub.*.task.>`), so a worker reads task channel messages in the
/// ingress and never a DM waiting there. An attempt's last message is its latest state change
/// (its result, or its bundle with the result), which is what the caller needs; when the last
/// message holds no result (a status or a refusal came after), an earlier one may, unseen, so
/// the read is [`ReadError::Inconclusive`].
///
/// # Errors
/// As [`read`]; the ingress must allow direct gets (the router provisions it so).
/// [`ReadError::Inconclusive`] as above.
pub async fn unrouted(
    js: &jetstream::Context,
    ingress: &str,
    delegator: &AgentId,
    task_id: &TaskId,
) -> Result<Vec<TaskChannelBody>, ReadError> {
    let subject = subjects::task_ingress_filter(&TaskChannel::of(delegator, task_id));
    let Some(msg) = last_message(js, ingress, &subject).await? else {
        return Ok(Vec::new());
    };
    let Ok(env) = crate::decode::envelope(Some(&msg.headers), &msg.payload) else {
        return Ok(Vec::new());
    };
    // Not routed yet, so not stamped: the sender is the identity in the ingress subject.
    let sender = subjects::parse_ingress(&msg.subject)
        .ok()
        .map(|(from, _)| from);
    let bodies = match protocol::routing::bundle_items(&env.body) {
        Some(Ok(items)) => items.into_iter().map(|item| item.body).collect(),
        Some(Err(_)) => Vec::new(),
        None => vec![env.body],
    };
    let bodies: Vec<TaskChannelBody> = bodies
        .into_iter()
        .filter_map(|b| serde_json::from_value::<TaskChannelBody>(b).ok())
        .filter(|b| b.task_id() == task_id)
        .filter(|b| b.is_from(sender.as_ref().map(|s| s.as_str())))
        .collect();
    if !bodies
        .iter()
        .any(|b| matches!(b, TaskChannelBody::Result(_)))
    {
        return Err(ReadError::Inconclusive { subject });
    }
    Ok(bodies)
}

/// Every message of `me`'s own task channel `channel` from sequence `from` on, read through a
/// router (`hub.delivery.<me>.task`, one request per message and one more to learn there is
/// nothing further), at most [`MAX_READ`], within [`READ_TIMEOUT`].
async fn read_routed(
    client: &async_nats::Client,
    me: &AgentId,
    channel: &TaskChannel,
    from: u64,
) -> Result<Vec<StreamMessage>, ReadError> {
    let subject = channel.subject();
    let failed = |reason: String| ReadError::Routed {
        subject: subject.clone(),
        reason,
    };
    if &channel.delegator != me {
        return Err(failed(format!(
            "{me} reads only the task channels of the tasks it delegated"
        )));
    }
    let request = subjects::task_read_request(me);
    let read = async {
        let mut out = Vec::new();
        let mut next = from.max(1);
        while out.len() < MAX_READ {
            let body = TaskRead {
                key: channel.key.clone(),
                from_seq: Some(next),
            };
            let body = serde_json::to_vec(&body).expect("a task read serializes");
            let reply = client
                .request(request.clone(), body.into())
                .await
                .map_err(|e| match e.kind() {
                    async_nats::RequestErrorKind::NoResponders => {
                        failed("no router answered".to_owned())
                    }
                    _ => failed(e.to_string()),
                })?;
            if reply.headers.is_none() && &reply.payload[..] == protocol::attach::TASK_READ_END {
                break;
            }
            match StreamMessage::try_from(reply.clone()) {
                Ok(msg) => {
                    next = msg.sequence + 1;
                    out.push(msg);
                }
                Err(_) => return Err(failed(refusal(&reply))),
            }
        }
        Ok(out)
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| ReadError::Timeout {
            subject: subject.clone(),
        })?
}

/// Why a router's reply to a read is not a stored message: its error, or its status.
fn refusal(reply: &async_nats::Message) -> String {
    #[derive(serde::Deserialize)]
    struct Refused {
        error: WireError,
    }
    match serde_json::from_slice::<Refused>(&reply.payload) {
        Ok(refused) => format!(
            "refused ({}): {}",
            refused.error.kind.as_str(),
            refused.error.detail
        ),
        Err(_) => match (reply.status, reply.description.as_deref()) {
            (Some(status), description) => {
                format!("status {status} {}", description.unwrap_or_default())
            }
            (None, _) => "an unreadable reply".to_owned(),
        },
    }
}

/// A handle of `stream` for direct gets (no info request).
async fn handle(
    js: &jetstream::Context,
    stream: &str,
) -> Result<jetstream::stream::Stream<()>, ReadError> {
    js.get_stream_no_info(stream)
        .await
        .map_err(|source| ReadError::Stream {
            stream: stream.to_owned(),
            source,
        })
}

/// Every message of `stream` on `subject` (a filter) from sequence `from` on, by direct gets
/// (`next_by_subj`), at most [`MAX_READ`], within [`READ_TIMEOUT`].
async fn read_subject(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    from: u64,
) -> Result<Vec<async_nats::jetstream::message::StreamMessage>, ReadError> {
    let read = async {
        let handle = handle(js, stream).await?;
        let mut out = Vec::new();
        let mut next = from.max(1);
        while out.len() < MAX_READ {
            match handle
                .direct_get_next_for_subject(subject, Some(next))
                .await
            {
                Ok(msg) => {
                    next = msg.sequence + 1;
                    out.push(msg);
                }
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(source) => {
                    return Err(ReadError::Get {
                        stream: stream.to_owned(),
                        subject: subject.to_owned(),
                        source,
                    })
                }
            }
        }
        Ok(out)
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| ReadError::Timeout {
            subject: subject.to_owned(),
        })?
}

/// Whether the channel of `task_id` delegated by `delegator`, in `stream`, holds no message: one
/// direct get of its last message, with the subject in the request subject and no body to
/// decode on either side (cheaper for the broker than a `next_by_subj` read, which the worker
/// pays once per task).
///
/// # Errors
/// As [`read`].
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn is_empty(
    js: &jetstream::Context,
    stream: &str,
    delegator: &AgentId,
    task_id: &TaskId,
) -> Result<bool, ReadError> {
    let subject = TaskChannel::of(delegator, task_id).subject();
    Ok(last_message(js, stream, &subject).await?.is_none())
}

/// The last message of `stream` on `subject` (a filter): one direct get with the subject in
/// the request subject and no request body.
async fn last_message(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Option<StreamMessage>, ReadError> {
    let probe = async {
        match handle(js, stream)
            .await?
            .direct_get_last_for_subject(subject)
            .await
        {
            Ok(msg) => Ok(Some(msg)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(source) => Err(ReadError::Get {
                stream: stream.to_owned(),
                subject: subject.to_owned(),
                source,
            }),
        }
    };
    tokio::time::timeout(READ_TIMEOUT, probe)
        .await
        .map_err(|_| ReadError::Timeout {
            subject: subject.to_owned(),
        })?
}

/// The [`ChannelView`] of the whole channel of `task_id` delegated by `delegator`.
///
/// # Errors
/// As [`read`].
pub async fn view(
    js: &jetstream::Context,
    reader: &Reader,
    delegator: &AgentId,
    task_id: &TaskId,
) -> Result<ChannelView, ReadError> {
    let stored = read(js, reader, delegator, task_id, 1).await?;
    Ok(ChannelView::of(
        stored.iter().filter_map(|s| s.body.as_ref()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Publishes a task channel body of `t1` (delegated by `d`) as worker `w1` would, into an
    /// ingress stream no router drains.
    async fn unrouted_publish(js: &jetstream::Context, id: &str, body: serde_json::Value) {
        let env = serde_json::json!({"meta": {"id": id}, "body": body});
        js.publish("hub.pub.w1.task.d.t1", env.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn an_unrouted_result_is_found_and_a_later_message_without_one_is_inconclusive() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        js.create_stream(jetstream::stream::Config {
            name: "INGRESS".into(),
            subjects: vec!["hub.pub.>".into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let (d, t1) = (AgentId::new("d").unwrap(), TaskId::new("t1").unwrap());
        assert!(unrouted(&js, "INGRESS", &d, &t1).await.unwrap().is_empty());
        let ids = serde_json::json!({"task_id": "t1", "attempt_id": "a1", "worker_id": "w1"});
        let mut result = ids.clone();
        result["state"] = "completed".into();
        unrouted_publish(&js, "r1", serde_json::json!({ "result": result })).await;
        let found = unrouted(&js, "INGRESS", &d, &t1).await.unwrap();
        assert!(
            matches!(found.as_slice(), [TaskChannelBody::Result(r)] if r.state.is_final()),
            "{found:?}"
        );
        // A refusal published after it hides it from a last-message read: inconclusive.
        let mut refusal = ids;
        refusal["answer_id"] = "ans-late".into();
        refusal["error"] = serde_json::json!({"kind": "unknown_task_attempt", "detail": "x"});
        unrouted_publish(&js, "f1", serde_json::json!({ "answer_refused": refusal })).await;
        assert!(matches!(
            unrouted(&js, "INGRESS", &d, &t1).await,
            Err(ReadError::Inconclusive { .. })
        ));
        // Another delegator's task of the same id is another channel.
        let other = AgentId::new("e").unwrap();
        assert!(unrouted(&js, "INGRESS", &other, &t1)
            .await
            .unwrap()
            .is_empty());
    }

    /// Stores `body` on `d`'s channel of `t1` in `TASKS`, stamped `from` (as the router stamps
    /// the sender, or as someone writing there directly claims).
    async fn stored(js: &jetstream::Context, id: &str, from: &str, body: serde_json::Value) {
        let env = serde_json::json!({"meta": {"id": id, "from": from}, "body": body});
        js.publish("channel.task.d.t1", env.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_whereabouts_of_a_task_come_only_from_bodies_stamped_by_the_worker_they_name() {
        let server = harness::run_server().await.unwrap();
        let js = jetstream::new(server.client().await.unwrap());
        js.create_stream(jetstream::stream::Config {
            name: "TASKS".into(),
            subjects: vec!["channel.task.>".into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let waiting = |attempt: &str, worker: &str| {
            serde_json::json!({"result": {"task_id": "t1", "attempt_id": attempt,
                "worker_id": worker, "state": "waiting",
                "suspend": {"question": "?", "tool_call_id": "q1"},
                "answer_route": format!("answer.{worker}")}})
        };
        stored(&js, "r1", "w1", waiting("a1", "w1")).await;
        // Later, a body naming another worker than its stamp: a forgery, which would send the
        // answer (and a cancel) to `evil`.
        stored(&js, "r2", "bob", waiting("a2", "evil")).await;
        let reader = Reader::Direct("TASKS".into());
        let (d, t1) = (AgentId::new("d").unwrap(), TaskId::new("t1").unwrap());
        let view = view(&js, &reader, &d, &t1).await.unwrap();
        let at = view.latest.as_ref().unwrap();
        assert_eq!(
            (at.worker_id.as_str(), at.attempt_id.as_str()),
            ("w1", "a1")
        );
        assert_eq!(view.waiting().unwrap().worker_id.as_str(), "w1");
        let read = read(&js, &reader, &d, &t1, 1).await.unwrap();
        assert_eq!(
            read.iter().map(|s| s.unstamped).collect::<Vec<_>>(),
            [false, true]
        );
    }
}
