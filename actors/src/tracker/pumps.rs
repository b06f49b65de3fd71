//! The tasks of a [`Trackers`](super::Trackers) incarnation: one live pump per delegator with
//! a task tracked (one core subscription of `channel.task.<delegator>.>`), and one reader that
//! reads the tasks' stored channels when their [`RereadSchedule`] says, a bounded number at a
//! time. Both hand what they find to the task's [`Entry`](super::table::Entry) at once; neither
//! waits on the actor's mailbox.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream;
use async_nats::{Client, HeaderMap, Subscriber};
use futures::StreamExt;
use protocol::error_chain::ErrorChain;
use protocol::task::{RereadSchedule, TaskChannelBody};
use protocol::AgentId;
use ractor::ActorRef;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::table::TrackerTable;
use super::{Source, TrackerEvent, TrackersCounters, TrackersMsg};
use crate::fault::{self, FaultPoint};
use crate::task_channel::{Reader, Stored};

/// Stored reads in flight at once, across all tasks (10,000 tasks tracked after a restart are
/// read this many at a time). A task's first read goes before the re-reads waiting. A read
/// holds its slot for at most its timeout ([`READ_TIMEOUT`](crate::task_channel::READ_TIMEOUT),
/// 10 s): while the router that serves the reads hangs, each pass over many tasks takes
/// tasks × 10 s / this.
pub const READS_IN_FLIGHT: usize = 32;

/// How the stored channels are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadAs {
    /// Through a router, as each task's delegator (`hub.delivery.<delegator>.task`): what an
    /// agent may do.
    Delegator,
    /// Direct gets on the tasks stream, named here (a client with read access to the stream).
    Direct(String),
}

impl ReadAs {
    fn reader(&self, delegator: &AgentId) -> Reader {
        match self {
            ReadAs::Delegator => Reader::Routed(delegator.clone()),
            ReadAs::Direct(stream) => Reader::Direct(stream.clone()),
        }
    }
}

/// What the pumps of one incarnation share.
pub(super) struct Ctx {
    /// The actor's name: the prefix of each task's fault-injection key.
    pub name: String,
    pub client: Client,
    pub read_as: ReadAs,
    pub reread: RereadSchedule,
    pub table: Arc<TrackerTable>,
    pub counters: Arc<TrackersCounters>,
}

/// A pump failed on purpose (fault injection) or the live subscription ended.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    /// The live subscription of a delegator's task channels ended (the connection closed).
    #[error("the live subscription of {0}'s task channels ended")]
    LiveEnded(AgentId),
    /// An injected fault.
    #[error(transparent)]
    Fault(#[from] fault::FaultError),
    /// A stored read's task panicked.
    #[error("a stored read panicked")]
    ReadPanicked,
}

/// The fault-injection key of one tracked task: `<actor name>:<delegator>:<task id>`.
pub fn fault_key(name: &str, delegator: &AgentId, task_id: &protocol::TaskId) -> String {
    format!("{name}:{delegator}:{task_id}")
}

impl Ctx {
    fn connects(&self) -> u64 {
        self.client.statistics().connects.load(Ordering::Acquire)
    }

    /// Hands one body of the task of channel `subject` to its entry; drops the entry once its
    /// final result is delivered.
    fn deliver(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        body: TaskChannelBody,
        source: Source,
    ) -> Result<(), PumpError> {
        let Some(mut entry) = self.tasks_entry(subject) else {
            return Ok(());
        };
        if fault::ENABLED {
            fault::check(
                &fault_key(&self.name, &entry.delegator, &entry.task_id),
                FaultPoint::Handle,
            )?;
        }
        match source {
            Source::Live => entry.counters.live_seen += 1,
            Source::Stored => entry.counters.stored_seen += 1,
        }
        let span = match &body {
            TaskChannelBody::Result(result) => {
                let span = tracing::info_span!(
                    "tracker.result",
                    task_id = %entry.task_id,
                    state = result.state.as_str(),
                    source = ?source,
                );
                crate::trace_context::set_parent_from(&span, headers);
                span
            }
            _ => tracing::Span::none(),
        };
        let done = span.in_scope(|| entry.on_body(body));
        drop(entry);
        if done {
            // Only if it is still the delivered one (a track may have replaced it meanwhile).
            self.table.remove_done(subject);
        }
        Ok(())
    }

    fn tasks_entry(
        &self,
        subject: &str,
    ) -> Option<dashmap::mapref::one::RefMut<'_, String, super::table::Entry>> {
        self.table.tasks.get_mut(subject)
    }

    /// Counts and logs a body of `subject`'s task that its named worker did not publish.
    fn unstamped(&self, subject: &str) {
        if let Some(mut e) = self.tasks_entry(subject) {
            e.counters.unstamped += 1;
            tracing::warn!(task_id = %e.task_id, "ignored a task channel body not published by the worker it names");
        }
    }

    fn malformed(&self, subject: &str) {
        if let Some(mut e) = self.tasks_entry(subject) {
            e.counters.malformed += 1;
            tracing::debug!(task_id = %e.task_id, "ignored a message that is no task channel envelope of this task");
        }
    }
}

/// Whether a message of the live subscription is one the router published: it has no ack
/// reply (a JetStream delivery) and no replay headers (a direct or message get). Anything else
/// reached the subscription through the reply subject of someone's JetStream API request,
/// which nats-server does not permission-check. (Its subject is then looked up as a task
/// channel: a pull keeps its stored subject.)
fn is_published_here(msg: &async_nats::Message) -> bool {
    !msg.reply
        .as_ref()
        .is_some_and(|r| r.as_str().starts_with("$JS.ACK."))
        && !msg.headers.as_ref().is_some_and(|h| {
            h.iter()
                .any(|(name, _)| protocol::headers::is_replay_header(name.as_ref()))
        })
}

/// Reads `delegator`'s task channels live until stopped: each message goes to the task its
/// subject names, if tracked.
///
/// # Errors
/// [`PumpError::LiveEnded`] when the subscription ends; an injected fault.
pub(super) async fn live(
    ctx: Arc<Ctx>,
    delegator: AgentId,
    mut sub: Subscriber,
    mut stop: watch::Receiver<bool>,
) -> Result<(), PumpError> {
    loop {
        let msg = tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Ok(());
                }
                continue;
            }
            next = sub.next() => next.ok_or_else(|| PumpError::LiveEnded(delegator.clone()))?,
        };
        // A subject that is not one of the delegator's task channels did not come through this
        // subscription's own subject (a replay keeps its stored subject).
        let own = protocol::subjects::parse_task(msg.subject.as_str())
            .is_ok_and(|channel| channel.delegator == delegator);
        if !own || !is_published_here(&msg) {
            ctx.counters.replayed.bump();
            tracing::warn!(delegator = %delegator, subject = %msg.subject, "ignored a message replayed into the task channel subscription");
            continue;
        }
        let subject = msg.subject.as_str();
        let Some(task_id) = ctx.table.tasks.get(subject).map(|e| e.task_id.clone()) else {
            // A task not tracked here: its result was delivered, its caller left, or it is one
            // of the delegator's tasks this system does not track.
            ctx.counters.untracked.bump();
            continue;
        };
        match crate::task_channel::decode_checked(&task_id, msg.headers.as_ref(), &msg.payload) {
            Ok(body) => ctx.deliver(subject, msg.headers.as_ref(), body, Source::Live)?,
            Err(crate::task_channel::Undecoded::Unstamped) => ctx.unstamped(subject),
            Err(crate::task_channel::Undecoded::Other) => ctx.malformed(subject),
        }
    }
}

/// One stored read to make: the task's channel subject, its delegator and task, and the
/// sequence to start from.
struct Job {
    subject: String,
    generation: u64,
    delegator: AgentId,
    task_id: protocol::TaskId,
    from: u64,
}

type ReadDone = (
    String,
    u64,
    Result<Vec<Stored>, crate::task_channel::ReadError>,
);

/// Reads the stored channels of the tracked tasks until stopped: at each base tick, those
/// whose schedule says a read is due (and, at once, those `now` names: a task tracked that may
/// be stored already), at most [`READS_IN_FLIGHT`] at a time. Also drops the entries that are
/// done, and asks the actor to drop the subscriptions nobody needs any more.
pub(super) async fn reader(
    ctx: Arc<Ctx>,
    myself: ActorRef<TrackersMsg>,
    mut now: mpsc::UnboundedReceiver<String>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), PumpError> {
    let js = jetstream::new(ctx.client.clone());
    let mut tick = tokio::time::interval(ctx.reread.base);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut in_flight: JoinSet<ReadDone> = JoinSet::new();
    let mut last_removed = 0;
    let mut last_connects = ctx.connects();
    loop {
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Ok(());
                }
                continue;
            }
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                match done {
                    Ok((subject, generation, read)) => apply(&ctx, &subject, generation, read)?,
                    // Abandoned at a reconnect (below).
                    Err(e) if e.is_cancelled() => {}
                    // A read that panicked fails the pump (and the actor): its task would
                    // otherwise never be read again.
                    Err(_) => return Err(PumpError::ReadPanicked),
                }
            }
            Some(subject) = now.recv() => {
                let connects = ctx.connects();
                if let Some(mut e) = ctx.tasks_entry(&subject) {
                    let at = tokio::time::Instant::now();
                    if e.read.take_due(at, connects, &ctx.reread).is_some() {
                        // A first read goes before the re-reads waiting.
                        queue.push_front(job(&subject, &e));
                    }
                }
            }
            at = tick.tick() => {
                ctx.table.prune();
                // Delegators whose last task went (delivered, or its caller left) need no
                // subscription any more: looked at when tasks went since the last tick.
                let removed = ctx.table.removed();
                if removed != last_removed {
                    let _ = myself.cast(TrackersMsg::Prune);
                }
                last_removed = removed;
                let connects = ctx.connects();
                if connects != last_connects {
                    // The connection was replaced: a read in flight may wait out its timeout
                    // for a reply that is lost. Every read is abandoned and made again now.
                    in_flight.abort_all();
                    queue.clear();
                    for mut e in ctx.table.tasks.iter_mut() {
                        e.read.reading = false;
                    }
                    last_connects = connects;
                }
                for mut e in ctx.table.tasks.iter_mut() {
                    if let Some(reread) = e.read.take_due(at, connects, &ctx.reread) {
                        if reread {
                            e.counters.rereads += 1;
                        }
                        queue.push_back(job(e.key(), &e));
                    }
                }
            }
        }
        while in_flight.len() < READS_IN_FLIGHT {
            let Some(job) = queue.pop_front() else { break };
            ctx.counters.reads.bump();
            let (js, reader) = (js.clone(), ctx.read_as.reader(&job.delegator));
            in_flight.spawn(async move {
                let read =
                    crate::task_channel::read(&js, &reader, &job.delegator, &job.task_id, job.from)
                        .await;
                (job.subject, job.generation, read)
            });
        }
    }
}

fn job(subject: &str, e: &super::table::Entry) -> Job {
    Job {
        subject: subject.to_owned(),
        generation: e.generation,
        delegator: e.delegator.clone(),
        task_id: e.task_id.clone(),
        from: e.read.next_seq,
    }
}

/// Hands what one read found to its task.
/// Hands what one read found to its task. The read's state (its next sequence, whether it
/// failed) is its entry's only: an entry that replaced it (the task tracked again) keeps its
/// own. The bodies go to whichever entry tracks the task now: they are its channel's, and
/// each entry passes each on once.
fn apply(
    ctx: &Ctx,
    subject: &str,
    generation: u64,
    read: Result<Vec<Stored>, crate::task_channel::ReadError>,
) -> Result<(), PumpError> {
    match read {
        Ok(stored) => {
            if let Some(mut e) = ctx
                .tasks_entry(subject)
                .filter(|e| e.generation == generation)
            {
                let read = &mut e.read;
                read.reading = false;
                read.failing = false;
                read.quiet = if stored.is_empty() {
                    read.quiet.saturating_add(1)
                } else {
                    0
                };
                if let Some(last) = stored.iter().map(|m| m.seq).max() {
                    read.next_seq = read.next_seq.max(last + 1);
                }
            }
            for msg in stored {
                if msg.unstamped {
                    ctx.unstamped(subject);
                    continue;
                }
                match msg.body {
                    Some(body) => ctx.deliver(subject, Some(&msg.headers), body, Source::Stored)?,
                    None => ctx.malformed(subject),
                }
            }
        }
        Err(error) => {
            let Some(mut e) = ctx
                .tasks_entry(subject)
                .filter(|e| e.generation == generation)
            else {
                return Ok(());
            };
            e.read.reading = false;
            e.counters.read_errors += 1;
            tracing::warn!(task_id = %e.task_id, error = %ErrorChain(&error), "stored task channel read failed; relying on the live subscription until the next read");
            if !e.read.failing {
                e.read.failing = true;
                let key = format!("read-failed\u{0}{}", e.counters.read_errors);
                e.progress(
                    key,
                    TrackerEvent::StoredReadFailed(ErrorChain(&error).to_string()),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context on `client` whose table holds alice's `t1`, tracked, dropped by its caller and
    /// tracked again: returns it, the subject, the first entry's generation and the second's
    /// progress receiver.
    async fn tracked_twice(
        client: Client,
    ) -> (
        Ctx,
        String,
        u64,
        mpsc::Receiver<TrackerEvent>,
        tokio::sync::oneshot::Receiver<protocol::task::TaskResult>,
    ) {
        let ctx = Ctx {
            name: "trackers-generations".into(),
            client,
            read_as: ReadAs::Direct("HUB_TASKS".into()),
            reread: super::super::DEFAULT_REREAD,
            table: Arc::default(),
            counters: Arc::default(),
        };
        let (alice, t1) = (
            AgentId::new("alice").unwrap(),
            protocol::TaskId::new("t1").unwrap(),
        );
        let (subject, first) = ctx.table.insert(&alice, &t1, false, 0).unwrap();
        let old = ctx.table.tasks.get(&subject).unwrap().generation;
        // A read of the first entry starts; then its caller leaves and the task is tracked
        // again before any prune.
        let at = tokio::time::Instant::now();
        assert_eq!(
            ctx.table
                .tasks
                .get_mut(&subject)
                .unwrap()
                .read
                .take_due(at, 0, &ctx.reread),
            Some(false)
        );
        drop(first);
        let (_, (result, events)) = ctx.table.insert(&alice, &t1, true, 0).unwrap();
        (ctx, subject, old, events, result)
    }

    #[tokio::test]
    async fn a_read_made_for_a_replaced_entry_does_not_touch_the_entry_that_replaced_it() {
        let server = harness::run_server().await.unwrap();
        let (ctx, subject, old, mut events, _result) =
            tracked_twice(server.client().await.unwrap()).await;
        let failed = crate::task_channel::ReadError::Timeout {
            subject: subject.clone(),
        };
        apply(&ctx, &subject, old, Err(failed)).unwrap();
        let e = ctx.table.tasks.get(&subject).unwrap();
        assert!(e.generation > old);
        assert_eq!(
            (e.read.failing, e.read.reading, e.counters.read_errors),
            (false, false, 0),
            "the new entry's read state is its own"
        );
        assert!(
            events.try_recv().is_err(),
            "no failure told to the new caller"
        );
        drop(e);
        // Its own read is applied.
        let new = ctx.table.tasks.get(&subject).unwrap().generation;
        let failed = crate::task_channel::ReadError::Timeout {
            subject: subject.clone(),
        };
        apply(&ctx, &subject, new, Err(failed)).unwrap();
        assert_eq!(
            ctx.table.tasks.get(&subject).unwrap().counters.read_errors,
            1
        );
        assert!(matches!(
            events.try_recv(),
            Ok(TrackerEvent::StoredReadFailed(_))
        ));
    }
}
