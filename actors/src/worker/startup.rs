//! What a worker does before it runs anything, and again when a consumer is found gone: open
//! its journal (one process per identity), ask the router to create its consumers (the join),
//! and bind them after checking each one ([`compat::check_consumer`]).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer};
use protocol::error_chain::ErrorChain;
use protocol::subjects;
use protocol::task::{JoinReply, JoinRequest, JoinResponse};
use ractor::ActorRef;

use super::attempt::Streams;
use super::compat;
use super::fetch::Consumers;
use super::{JoinError, Worker, WorkerError, WorkerMsg, JOURNAL_LOCK_RETRY};
use crate::background::Owned;
use crate::journal::{Journal, JournalError};
use crate::supervision::Backoff;

/// The consumers a worker bound, with the streams the join named.
#[derive(Clone)]
pub struct Bound {
    /// The consumers.
    pub(super) consumers: Consumers,
    /// The task channel and ingress streams (from the join reply).
    pub(super) streams: Streams,
    /// The work stream the queue and targeted consumers read.
    pub(super) work_stream: String,
}

/// The pause after the `n`-th failed re-join in a row: 0.5 s, doubling, at most 10 s.
const REJOIN_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(10),
    factor: 2,
    reset_after: None,
};

impl Worker {
    /// Opens the journal. A lock held by this very process is retried for up to
    /// [`JOURNAL_LOCK_RETRY`]: the attempts of a previous incarnation of this worker (killed
    /// with it) may still be dropping their handle when a supervisor restarts the worker.
    pub(super) async fn open_journal(&self) -> Result<Journal, WorkerError> {
        let deadline = Instant::now() + JOURNAL_LOCK_RETRY;
        loop {
            let (dir, id) = (self.journal_dir.clone(), self.worker_id.to_string());
            let opened = tokio::task::spawn_blocking(move || Journal::open(&dir, &id))
                .await
                .map_err(|e| WorkerError::Config(format!("journal open panicked: {e}")))?;
            match opened {
                Err(JournalError::Locked {
                    holder: Some(pid), ..
                }) if pid == std::process::id() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return Ok(other?),
            }
        }
    }

    /// Asks the router to create (or update) the worker's consumers.
    async fn join(&self) -> Result<JoinReply, WorkerError> {
        let fail = |source: JoinError| WorkerError::Join {
            queue: self.queue.to_string(),
            source,
        };
        let body = serde_json::to_vec(&JoinRequest {
            worker_id: self.worker_id.clone(),
        })
        .expect("a join request serializes");
        let request = self.client.request(
            subjects::join_request(&self.queue, &self.worker_id),
            body.into(),
        );
        let reply = match tokio::time::timeout(self.join_timeout, request).await {
            Err(_) => return Err(fail(JoinError::Timeout(self.join_timeout))),
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(fail(JoinError::NoResponders))
            }
            Ok(Err(e)) => return Err(fail(JoinError::Request(e))),
            Ok(Ok(reply)) => reply,
        };
        match serde_json::from_slice::<JoinResponse>(&reply.payload) {
            Ok(JoinResponse::Joined(join)) => Ok(join),
            Ok(JoinResponse::Refused { error }) => Err(fail(JoinError::Refused(error))),
            Err(e) => Err(fail(JoinError::Unreadable(e))),
        }
    }

    /// Joins the queue and binds the three consumers the router names.
    pub(super) async fn join_and_bind(&self) -> Result<Bound, WorkerError> {
        let join = self.join().await?;
        let js = jetstream::new(self.client.clone());
        let answers = bind(
            &js,
            &join.answers_stream,
            &join.answer_consumer,
            &subjects::answer(&self.worker_id),
        )
        .await?;
        let targeted = bind(
            &js,
            &join.work_stream,
            &join.targeted_consumer,
            &subjects::targeted_filter(&self.worker_id),
        )
        .await?;
        let queue = bind(
            &js,
            &join.work_stream,
            &join.queue_consumer,
            &subjects::work(&self.queue, None),
        )
        .await?;
        Ok(Bound {
            consumers: Consumers {
                answers,
                targeted,
                queue,
            },
            streams: Streams {
                tasks: join.tasks_stream,
                ingress: join.ingress_stream,
            },
            work_stream: join.work_stream,
        })
    }

    /// Re-joins the queue in the background until it works (backing off between tries), then
    /// hands the new consumers to the worker as [`WorkerMsg::Rejoined`].
    pub(super) fn spawn_rejoin(&self, me: ActorRef<WorkerMsg>) -> Owned {
        let worker = self.clone();
        crate::background::spawn(async move {
            let mut failures = 0;
            loop {
                match worker.join_and_bind().await {
                    Ok(bound) => {
                        let _ = me.cast(WorkerMsg::Rejoined(Box::new(bound)));
                        return;
                    }
                    Err(e) => {
                        failures += 1;
                        let pause = REJOIN_BACKOFF.delay(failures);
                        tracing::warn!(worker = %worker.worker_id, error = %ErrorChain(&e), ?pause, "re-join failed; trying again");
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        })
    }
}

/// Looks a consumer up, checks its configuration, and binds it as a pull consumer (its info,
/// the ack wait among it, cached in it).
async fn bind(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    filter: &str,
) -> Result<PullConsumer, WorkerError> {
    let fail = |source: async_nats::Error| WorkerError::Consumer {
        consumer: name.to_owned(),
        source,
    };
    // One consumer info request: a worker may not read the stream's info.
    let consumer: PullConsumer = js
        .get_consumer_from_stream(name, stream)
        .await
        .map_err(|e| fail(e.into()))?;
    compat::check_consumer(&consumer.cached_info().config, filter).map_err(|source| {
        WorkerError::Incompatible {
            consumer: name.to_owned(),
            source,
        }
    })?;
    Ok(consumer)
}
