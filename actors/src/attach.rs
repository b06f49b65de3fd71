//! The attach actor: answers `hub.delivery.<id>.inbox` (queue group `hub-delivery`) by creating
//! or updating the pull consumer `inbox-<id>` and replying with the stream and consumer names,
//! and worker joins on `hub.work.<queue>.join.<worker>` by creating the queue's shared consumer and the
//! worker's targeted-task and answer consumers.
//!
//! It also serves task channel reads (`hub.delivery.<id>.task`): a delegator's read of one of
//! its own task channels is forwarded, with the requester's reply subject, to the tasks
//! stream's direct-get API as a get of `channel.task.<id>.<key>`, so the broker answers the
//! requester itself ([`protocol::attach::TaskRead`]). These are served by the listener, off the
//! actor's mailbox (a consumer creation does not hold up a read).
//!
//! Attaches and joins are served beside the mailbox, [`ATTACHES_IN_FLIGHT`] at a time, so a
//! host that attaches thousands of agents at once waits on their consumer creations in
//! parallel, and one join a busy cluster is slow to serve (up to
//! [`crate::streams::STREAM_API_TIMEOUT`]) holds up no other worker's; hub info requests are
//! served in the mailbox's order.
//!
//! An attach of a removed agent (its tombstone in `HUB_REMOVED`, `runtime agent remove`) is
//! refused with the kind `recipient_deleted`.
//!
//! Only the router side ever creates consumers; agents and workers never do. Runs in durable
//! mode only.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::Client;
use futures::StreamExt;
use protocol::attach::{AttachReply, AttachResponse};
use protocol::config::DeliveryConfig;
use protocol::error_chain::ErrorChain;
use protocol::subjects;
use protocol::task::{JoinReply, JoinRequest, JoinResponse};
use protocol::{WireError, WireErrorKind};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::background::Owned;
use crate::fault::{self, FaultPoint};

/// Attach actor configuration.
#[derive(Clone)]
pub struct Attach {
    /// Actor name, also the fault-injection key.
    pub name: String,
    /// The shared connection.
    pub client: Client,
    /// Stream names and inbox consumer limits.
    pub delivery: Arc<DeliveryConfig>,
    /// The root of the reply subjects requests are answered on (the requesters' connections'
    /// inbox prefix; [`subjects::DEFAULT_REPLY_PREFIX`], `_INBOX`, by default). A request with
    /// a reply elsewhere is counted and ignored.
    pub reply_prefix: String,
}

/// Attach messages.
pub enum AttachMsg {
    /// An attach request arrived.
    Request(async_nats::Message),
    /// A worker join request arrived.
    Join(async_nats::Message),
    /// A hub info request arrived.
    Info(async_nats::Message),
    /// Snapshot for a local caller.
    Snapshot(RpcReplyPort<AttachSnapshot>),
}

/// State of one incarnation.
pub struct AttachState {
    /// The queue-group listeners (attach, join): owned, so that a failed incarnation's
    /// subscriptions end with it and take no request they would never answer.
    listeners: Vec<Owned>,
    counters: Arc<AttachCounters>,
    /// The attaches and joins being served (aborted with the state).
    serving: tokio::task::JoinSet<()>,
}

/// How many attaches and joins one attach actor serves at once.
pub const ATTACHES_IN_FLIGHT: usize = 64;

crate::counters! {
    /// Counters of the attach actor.
    pub struct AttachCounters => AttachSnapshot {
        /// Consumers created or updated and replied.
        attached,
        /// Requests refused (invalid identity, JetStream error).
        refused,
        /// Worker joins answered.
        joined,
        /// Hub info requests answered.
        infos,
        /// Task channel reads forwarded to the tasks stream.
        task_reads,
        /// Task channel reads refused (an invalid request).
        task_reads_refused,
        /// Requests ignored because their reply subject is not under the inbox prefix.
        replies_refused,
    }
}

#[ractor::async_trait]
impl Actor for Attach {
    type Msg = AttachMsg;
    type State = AttachState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<AttachMsg>,
        _: (),
    ) -> Result<AttachState, ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::PreStart)?;
        let mut listeners = Vec::new();
        for (filter, wrap) in [
            (subjects::ATTACH_FILTER, AttachMsg::Request as fn(_) -> _),
            (subjects::JOIN_FILTER, AttachMsg::Join),
            (subjects::HUB_INFO_FILTER, AttachMsg::Info),
        ] {
            let mut sub = self
                .client
                .queue_subscribe(filter, subjects::ATTACH_QUEUE_GROUP.to_string())
                .await?;
            let me = myself.clone();
            listeners.push(crate::background::spawn(async move {
                while let Some(msg) = sub.next().await {
                    if me.cast(wrap(msg)).is_err() {
                        break;
                    }
                }
            }));
        }
        let counters = Arc::new(AttachCounters::default());
        let mut reads = self
            .client
            .queue_subscribe(
                subjects::TASK_READ_FILTER,
                subjects::ATTACH_QUEUE_GROUP.to_string(),
            )
            .await?;
        let server = TaskReads {
            client: self.client.clone(),
            api: subjects::direct_get_request(&self.delivery.tasks.name),
            reply_prefix: self.reply_prefix.clone(),
            counters: counters.clone(),
        };
        listeners.push(crate::background::spawn(async move {
            while let Some(msg) = reads.next().await {
                server.serve(msg).await;
            }
        }));
        Ok(AttachState {
            listeners,
            counters,
            serving: tokio::task::JoinSet::new(),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<AttachMsg>,
        state: &mut AttachState,
    ) -> Result<(), ActorProcessingErr> {
        // Wait until the listeners (and their subscriptions) are gone, so that "no
        // responders" is true as soon as the actor has stopped.
        for listener in state.listeners.drain(..) {
            crate::background::abort(listener).await;
        }
        let _ = self.client.flush().await;
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<AttachMsg>,
        msg: AttachMsg,
        state: &mut AttachState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&self.name, FaultPoint::Handle)?;
        match msg {
            AttachMsg::Request(msg) => {
                let Some(reply) = reply_of(&msg, &self.reply_prefix, state) else {
                    return Ok(());
                };
                let (me, counters) = (self.clone(), state.counters.clone());
                state.serve(async move {
                    let response = me.attach(msg.subject.as_str()).await;
                    match &response {
                        AttachResponse::Attached(_) => &counters.attached,
                        AttachResponse::Refused { .. } => &counters.refused,
                    }
                    .bump();
                    let body = serde_json::to_vec(&response).unwrap_or_default();
                    if let Err(e) = me.client.publish(reply, body.into()).await {
                        tracing::warn!(error = %ErrorChain(&e), "cannot answer an attach request");
                    }
                })
                .await;
            }
            AttachMsg::Join(msg) => {
                let Some(reply) = reply_of(&msg, &self.reply_prefix, state) else {
                    return Ok(());
                };
                let (me, counters) = (self.clone(), state.counters.clone());
                state
                    .serve(async move {
                        let response = me.join(msg.subject.as_str(), &msg.payload).await;
                        match &response {
                            JoinResponse::Joined(_) => &counters.joined,
                            JoinResponse::Refused { .. } => &counters.refused,
                        }
                        .bump();
                        let body = serde_json::to_vec(&response).unwrap_or_default();
                        if let Err(e) = me.client.publish(reply, body.into()).await {
                            tracing::warn!(error = %ErrorChain(&e), "cannot answer a join request");
                        }
                    })
                    .await;
            }
            AttachMsg::Info(msg) => {
                let Some(reply) = reply_of(&msg, &self.reply_prefix, state) else {
                    return Ok(());
                };
                let info = protocol::attach::HubInfo {
                    ingress_stream: self.delivery.ingress.name.clone(),
                    inbox_stream: self.delivery.inbox.name.clone(),
                    tasks_stream: self.delivery.tasks.name.clone(),
                };
                state.counters.infos.bump();
                let body = serde_json::to_vec(&info)?;
                if let Err(e) = self.client.publish(reply, body.into()).await {
                    tracing::warn!(error = %ErrorChain(&e), "cannot answer a hub info request");
                }
            }
            AttachMsg::Snapshot(port) => {
                let _ = port.send(state.counters.snapshot());
            }
        }
        Ok(())
    }
}

impl AttachState {
    /// Serves one attach or join beside the mailbox, once fewer than [`ATTACHES_IN_FLIGHT`]
    /// are being served.
    async fn serve(&mut self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        while self.serving.try_join_next().is_some() {}
        while self.serving.len() >= ATTACHES_IN_FLIGHT {
            self.serving.join_next().await;
        }
        self.serving.spawn(work);
    }
}

/// Serves task channel reads ([`protocol::attach::TaskRead`]).
struct TaskReads {
    client: Client,
    /// `$JS.API.DIRECT.GET.<tasks stream>`.
    api: String,
    reply_prefix: String,
    counters: Arc<AttachCounters>,
}

/// How long a relayed direct get of a task read may take.
const TASK_READ_TIMEOUT: Duration = Duration::from_secs(5);

impl TaskReads {
    /// Serves one read: a direct get of the requester's own channel, whose answer it relays to
    /// the requester's reply ([`protocol::attach::TaskRead`]), or an error for a request it
    /// cannot serve.
    async fn serve(&self, msg: async_nats::Message) {
        let Some(reply) = crate::reply::answerable(
            msg.reply.as_ref(),
            &self.reply_prefix,
            msg.subject.as_str(),
            || self.counters.replies_refused.bump(),
        ) else {
            return;
        };
        let read = subjects::parse_task_read_request(msg.subject.as_str())
            .map_err(|e| {
                WireError::new(WireErrorKind::InvalidRecipient, ErrorChain(&e).to_string())
            })
            .and_then(|requester| {
                serde_json::from_slice::<protocol::attach::TaskRead>(&msg.payload)
                    .map(|read| (requester, read))
                    .map_err(|e| WireError::new(WireErrorKind::Malformed, e.to_string()))
            });
        let answer = match read {
            Ok((requester, read)) => {
                self.counters.task_reads.bump();
                let body = protocol::attach::task_read_direct_get(&requester, &read);
                let got = self.client.request(self.api.clone(), body.into());
                match tokio::time::timeout(TASK_READ_TIMEOUT, got).await {
                    Ok(Ok(m)) if m.status == Some(async_nats::StatusCode::NOT_FOUND) => {
                        Ok((None, protocol::attach::TASK_READ_END.to_vec().into()))
                    }
                    Ok(Ok(m)) if m.status.is_none() => Ok((m.headers, m.payload)),
                    Ok(Ok(m)) => Err(WireError::new(
                        WireErrorKind::Internal,
                        format!("the tasks stream answered status {:?}", m.status),
                    )),
                    Ok(Err(e)) => Err(WireError::new(WireErrorKind::Internal, e.to_string())),
                    Err(_) => Err(WireError::new(
                        WireErrorKind::Internal,
                        "the tasks stream did not answer in time",
                    )),
                }
            }
            Err(error) => {
                self.counters.task_reads_refused.bump();
                Err(error)
            }
        };
        let sent = match answer {
            Ok((Some(headers), payload)) => {
                self.client
                    .publish_with_headers(reply, headers, payload)
                    .await
            }
            Ok((None, payload)) => self.client.publish(reply, payload).await,
            Err(error) => {
                let body = serde_json::to_vec(&serde_json::json!({ "error": error }))
                    .expect("an error serializes");
                self.client.publish(reply, body.into()).await
            }
        };
        if let Err(e) = sent {
            tracing::warn!(error = %ErrorChain(&e), "cannot serve a task channel read");
        }
    }
}

/// The reply subject of a request when a service may answer on it (see [`crate::reply`]):
/// counted and ignored otherwise.
fn reply_of(
    msg: &async_nats::Message,
    prefix: &str,
    state: &mut AttachState,
) -> Option<async_nats::Subject> {
    crate::reply::answerable(msg.reply.as_ref(), prefix, msg.subject.as_str(), || {
        state.counters.replies_refused.bump()
    })
}

impl Attach {
    /// Creates or updates the queue's consumer and the worker's targeted and answer consumers.
    async fn join(&self, subject: &str, body: &[u8]) -> JoinResponse {
        let refuse = |kind, detail: String| JoinResponse::Refused {
            error: WireError::new(kind, detail),
        };
        let (queue, worker) = match subjects::parse_join_request(subject) {
            Ok(parts) => parts,
            Err(e) => return refuse(WireErrorKind::Malformed, ErrorChain(&e).to_string()),
        };
        let request: JoinRequest = match serde_json::from_slice(body) {
            Ok(request) => request,
            Err(e) => return refuse(WireErrorKind::Malformed, format!("join request: {e}")),
        };
        // The subject names the worker (the broker lets only that worker publish it): a body
        // naming another is someone joining as that worker.
        if request.worker_id != worker {
            return refuse(
                WireErrorKind::Unauthorized,
                format!(
                    "join on {subject} names worker {}, not {worker}",
                    request.worker_id
                ),
            );
        }
        let js = jetstream::new(self.client.clone());
        let work = [
            crate::consumers::queue_consumer(&self.delivery, &queue),
            crate::consumers::targeted_consumer(&self.delivery, &worker),
        ];
        let answer = crate::consumers::answer_consumer(&self.delivery, &worker);
        let queue_name = subjects::queue_consumer(&queue);
        let created = async {
            let stream = js.get_stream(subjects::WORK_STREAM).await?;
            // The queue's consumer is shared: the ack wait its other workers heartbeat at.
            let before = stream
                .consumer_info(&queue_name)
                .await
                .ok()
                .map(|info| crate::consumers::effective_ack_wait(&info.config));
            let mut after = None;
            for config in work {
                let made = stream.create_consumer(config).await?.cached_info().clone();
                if made.name == queue_name {
                    after = Some(crate::consumers::effective_ack_wait(&made.config));
                }
            }
            js.get_stream(subjects::ANSWERS_STREAM)
                .await?
                .create_consumer(answer)
                .await?;
            Ok::<_, async_nats::Error>(before.zip(after).is_some_and(|(b, a)| b != a))
        };
        match tokio::time::timeout(crate::streams::STREAM_API_TIMEOUT, created).await {
            Ok(Ok(changed)) => {
                if changed {
                    // Its workers read it again and heartbeat their running tasks at the new
                    // pace (a shorter one at once).
                    tracing::info!(%queue, "the queue's consumer changed its ack wait");
                    if let Err(e) = self
                        .client
                        .publish(subjects::queue_changed(&queue), "{}".into())
                        .await
                    {
                        tracing::warn!(error = %ErrorChain(&e), %queue, "cannot tell the queue's workers");
                    }
                }
                tracing::info!(%queue, %worker, "worker joined");
                JoinResponse::Joined(JoinReply {
                    work_stream: subjects::WORK_STREAM.to_string(),
                    queue_consumer: subjects::queue_consumer(&queue),
                    targeted_consumer: subjects::targeted_consumer(&worker),
                    answers_stream: subjects::ANSWERS_STREAM.to_string(),
                    answer_consumer: subjects::answer_consumer(&worker),
                    tasks_stream: self.delivery.tasks.name.clone(),
                    ingress_stream: self.delivery.ingress.name.clone(),
                })
            }
            Ok(Err(e)) => refuse(WireErrorKind::Internal, e.to_string()),
            Err(_) => refuse(
                WireErrorKind::Internal,
                "jetstream did not answer in time".to_string(),
            ),
        }
    }

    async fn attach(&self, subject: &str) -> AttachResponse {
        let id = match subjects::parse_attach_request(subject) {
            Ok(id) => id,
            Err(e) => {
                return AttachResponse::Refused {
                    error: WireError::new(WireErrorKind::InvalidRecipient, e.to_string()),
                }
            }
        };
        let js = jetstream::new(self.client.clone());
        if is_removed(&js, &id).await {
            tracing::info!(%id, "attach of a removed agent refused");
            return AttachResponse::Refused {
                error: WireError::new(
                    WireErrorKind::RecipientDeleted,
                    format!("{id} was removed from the hub"),
                ),
            };
        }
        let config = crate::consumers::inbox_consumer(&self.delivery, &id);
        let consumer = config.durable_name.clone().unwrap_or_default();
        let created = async {
            js.create_consumer_on_stream(config, &self.delivery.inbox.name)
                .await?;
            Ok::<_, async_nats::Error>(())
        };
        match tokio::time::timeout(crate::streams::STREAM_API_TIMEOUT, created).await {
            Ok(Ok(())) => {
                tracing::info!(%id, %consumer, "inbox attached");
                AttachResponse::Attached(AttachReply {
                    stream: self.delivery.inbox.name.clone(),
                    consumer,
                })
            }
            Ok(Err(e)) => AttachResponse::Refused {
                error: WireError::new(WireErrorKind::Internal, e.to_string()),
            },
            Err(_) => AttachResponse::Refused {
                error: WireError::new(WireErrorKind::Internal, "jetstream did not answer in time"),
            },
        }
    }
}

/// Whether `id` has a tombstone in the removed bucket: one direct get per attach (attaches
/// are rare; the router's per-DM check is the in-memory set of [`crate::removed`]), so an
/// agent restored a moment ago attaches at once. A read that fails lets the attach through
/// (logged): the router still refuses every DM to a removed agent, and its inbox was emptied.
async fn is_removed(js: &jetstream::Context, id: &protocol::AgentId) -> bool {
    crate::removed::is_removed(js, id)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %ErrorChain(&*e), %id, "cannot read whether the agent was removed; attaching");
            false
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{AgentId, QueueName, WorkerId};

    async fn started(name: &str) -> (harness::NatsServer, Client, ActorRef<AttachMsg>) {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        let delivery = Arc::new(DeliveryConfig::default());
        crate::streams::ensure_streams(&jetstream::new(client.clone()), &delivery)
            .await
            .unwrap();
        let attach = Attach {
            name: name.into(),
            client: client.clone(),
            delivery,
            reply_prefix: subjects::DEFAULT_REPLY_PREFIX.into(),
        };
        let (actor, _) = Actor::spawn(None, attach, ()).await.unwrap();
        (server, client, actor)
    }

    async fn join(client: &Client, subject: String, worker: &str) -> JoinResponse {
        let body = serde_json::to_vec(&JoinRequest {
            worker_id: WorkerId::new(worker).unwrap(),
        })
        .unwrap();
        let reply = client.request(subject, body.into()).await.unwrap();
        serde_json::from_slice(&reply.payload).unwrap()
    }

    #[tokio::test]
    async fn a_join_whose_body_names_another_worker_than_its_subject_is_refused() {
        let (_server, client, actor) = started("attach-join-test").await;
        let q = QueueName::new("q").unwrap();
        let w2 = WorkerId::new("w2").unwrap();
        // w2's subject (its grant), w1 in the body: someone joining as w1.
        let refused = join(&client, subjects::join_request(&q, &w2), "w1").await;
        assert!(
            matches!(&refused, JoinResponse::Refused { error } if error.kind == WireErrorKind::Unauthorized),
            "{refused:?}"
        );
        let js = jetstream::new(client.clone());
        let answers = js.get_stream(subjects::ANSWERS_STREAM).await.unwrap();
        assert!(
            answers.consumer_info("answers-w1").await.is_err(),
            "no consumer made for w1"
        );
        let joined = join(&client, subjects::join_request(&q, &w2), "w2").await;
        assert!(matches!(joined, JoinResponse::Joined(_)), "{joined:?}");
        let snap = ractor::call_t!(actor, AttachMsg::Snapshot, 2000).unwrap();
        assert_eq!((snap.joined, snap.refused), (1, 1), "{snap:?}");
        actor.stop(None);
    }

    #[tokio::test]
    async fn the_attach_of_a_removed_agent_is_refused_until_it_is_restored() {
        let (_server, client, actor) = started("attach-removed-test").await;
        let bob = AgentId::new("bob").unwrap();
        let attach = || async {
            let reply = client
                .request(subjects::attach_request(&bob), "{}".into())
                .await
                .unwrap();
            serde_json::from_slice::<AttachResponse>(&reply.payload).unwrap()
        };
        let js = jetstream::new(client.clone());
        let kv = js.get_key_value(subjects::REMOVED_BUCKET).await.unwrap();
        kv.put("bob", "{}".into()).await.unwrap();
        let refused = attach().await;
        assert!(
            matches!(&refused, AttachResponse::Refused { error } if error.kind == WireErrorKind::RecipientDeleted),
            "{refused:?}"
        );
        let inbox = js.get_stream(subjects::INBOX_STREAM).await.unwrap();
        assert!(
            inbox.consumer_info("inbox-bob").await.is_err(),
            "no consumer made"
        );
        kv.delete("bob").await.unwrap();
        let attached = attach().await;
        assert!(
            matches!(attached, AttachResponse::Attached(_)),
            "{attached:?}"
        );
        actor.stop(None);
    }

    #[tokio::test]
    async fn a_hub_info_request_is_answered_with_the_stream_names() {
        let (_server, client, actor) = started("attach-info-test").await;
        let alice = AgentId::new("alice").unwrap();
        let reply = client
            .request(subjects::hub_info_request(&alice), "".into())
            .await
            .unwrap();
        let info: protocol::attach::HubInfo = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(info.ingress_stream, "HUB_INGRESS");
        assert_eq!(info.inbox_stream, "HUB_INBOX");
        assert_eq!(info.tasks_stream, "HUB_TASKS");
        actor.stop(None);
    }

    /// Stores a task channel message of `task` under `delegator`, as the router would.
    async fn stored(js: &jetstream::Context, delegator: &str, task: &str, id: &str) {
        let env = serde_json::json!({
            "meta": {"id": id, "from": "w1"},
            "body": {"status": {"task_id": task, "attempt_id": "a1", "worker_id": "w1",
                "event_id": id, "seq": 0, "state": "running", "at": 1}},
        });
        js.publish(
            format!("channel.task.{delegator}.{task}"),
            serde_json::to_vec(&env).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_task_read_returns_the_requesters_own_channel_and_no_one_elses() {
        let (_server, client, actor) = started("attach-read-test").await;
        let js = jetstream::new(client.clone());
        stored(&js, "alice", "t1", "s-alice-1").await;
        stored(&js, "bob", "t1", "s-bob-1").await;
        stored(&js, "alice", "t1", "s-alice-2").await;
        let (alice, bob) = (AgentId::new("alice").unwrap(), AgentId::new("bob").unwrap());
        let t1 = protocol::TaskId::new("t1").unwrap();
        let read = |me: &AgentId, of: &AgentId| {
            let reader = crate::task_channel::Reader::Routed(me.clone());
            let (js, of) = (js.clone(), of.clone());
            let t1 = t1.clone();
            async move { crate::task_channel::read(&js, &reader, &of, &t1, 1).await }
        };
        let ids = |stored: Vec<crate::task_channel::Stored>| -> Vec<u64> {
            stored.iter().map(|s| s.seq).collect()
        };
        assert_eq!(ids(read(&alice, &alice).await.unwrap()), vec![1, 3]);
        assert_eq!(ids(read(&bob, &bob).await.unwrap()), vec![2]);
        // Reading someone else's channel through the router is not even asked for.
        assert!(matches!(
            read(&bob, &alice).await,
            Err(crate::task_channel::ReadError::Routed { .. })
        ));
        // A request the router cannot serve is answered with an error, and reads nothing.
        for bad in [
            r#"{"key": "*"}"#,
            r#"{"key": "t1", "next_by_subj": "channel.task.alice.t1"}"#,
            "not json",
        ] {
            let reply = client
                .request(subjects::task_read_request(&bob), bad.into())
                .await
                .unwrap();
            assert!(reply.headers.is_none(), "{bad}: a stored message came back");
            let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
            assert!(body.get("error").is_some(), "{bad}: {body}");
        }
        let snap = ractor::call_t!(actor, AttachMsg::Snapshot, 2000).unwrap();
        assert_eq!(
            (snap.task_reads, snap.task_reads_refused),
            (5, 3),
            "{snap:?}"
        );
        actor.stop(None);
    }
}
