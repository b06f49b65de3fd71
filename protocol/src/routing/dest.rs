//! Where the router stores one routed envelope, typed ([`Dest`]): [`route`](super::route)
//! parses the ingress subject once, builds the stored subject once, and hands both on, so no
//! reader of a [`RouteDecision`](super::RouteDecision) parses a subject or decodes a payload
//! again to learn where it went.
//!
//! A broadcast has no `Dest`: it is never stored, and
//! [`RouteDecision::Broadcast`](super::RouteDecision::Broadcast) says so by its variant.

use crate::audit::About;
use crate::ids::{AgentId, MessageId, QueueName, TaskId, WorkerId};
use crate::subjects::{self, TaskChannel};

/// The typed destination of a stored envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    /// A DM, stored in `to`'s inbox (`channel.inbox.<to>`).
    Inbox {
        /// The recipient, `meta.to`.
        to: AgentId,
        /// The `Nats-TTL` to store it with: the seconds left before its `meta.expires_at`
        /// (the router adds its grace, `expiry_grace_secs`).
        ttl_secs: Option<u64>,
        /// Its `meta.expires_at`: the router schedules its deadline check.
        expires_at: Option<u64>,
    },
    /// A worker's result, status or answer refusal, stored on the task's channel
    /// (`channel.task.<delegator>.<key>`).
    TaskChannel(TaskChannel),
    /// A task input for a queue, or for one worker of it (`work.<queue>[.<worker>]`).
    Work {
        /// The queue.
        queue: QueueName,
        /// The one worker it is for, if targeted.
        worker: Option<WorkerId>,
        /// The task's id (its `Nats-Msg-Id` is derived from it).
        task_id: TaskId,
    },
    /// An answer to a waiting attempt of `worker` (`answer.<worker>`).
    Answer {
        /// The worker that holds the waiting attempt.
        worker: WorkerId,
        /// The task it answers.
        task_id: TaskId,
    },
}

impl Dest {
    /// The stored subject ([`subjects`]).
    pub fn subject(&self) -> String {
        match self {
            Dest::Inbox { to, .. } => subjects::inbox(to),
            Dest::TaskChannel(channel) => channel.subject(),
            Dest::Work { queue, worker, .. } => subjects::work(queue, worker.as_ref()),
            Dest::Answer { worker, .. } => subjects::answer(worker),
        }
    }

    /// What the audit trail says the stored envelope (`meta.id` `id`) is about: a DM, a task
    /// input or a task channel message; `None` for an answer (its event, `answered`, names
    /// the task it answers: [`Dest::Answer::task_id`](Dest::Answer)).
    pub fn about(&self, id: &MessageId) -> Option<About> {
        match self {
            Dest::Inbox { .. } => Some(About::Msg(id.to_string())),
            Dest::Work { task_id, .. } => Some(About::Task {
                task_id: task_id.to_string(),
                channel: false,
            }),
            Dest::TaskChannel(channel) => Some(About::Task {
                task_id: channel.key.to_string(),
                channel: true,
            }),
            Dest::Answer { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subjects::TaskKey;

    fn id<T: std::str::FromStr>(s: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        s.parse().unwrap()
    }

    #[test]
    fn each_destination_builds_the_subject_its_parser_reads_back() {
        let to: AgentId = id("bob");
        let inbox = Dest::Inbox {
            to: to.clone(),
            ttl_secs: None,
            expires_at: None,
        };
        assert_eq!(subjects::parse_inbox(&inbox.subject()).unwrap(), to);
        let channel = TaskChannel {
            delegator: id("alice"),
            key: TaskKey::new("t1").unwrap(),
        };
        let task = Dest::TaskChannel(channel.clone());
        assert_eq!(subjects::parse_task(&task.subject()).unwrap(), channel);
        let (queue, worker): (QueueName, WorkerId) = (id("q"), id("w1"));
        for target in [None, Some(worker.clone())] {
            let work = Dest::Work {
                queue: queue.clone(),
                worker: target.clone(),
                task_id: id("t1"),
            };
            assert_eq!(
                subjects::parse_work(&work.subject()).unwrap(),
                (queue.clone(), target)
            );
        }
        let answer = Dest::Answer {
            worker: worker.clone(),
            task_id: id("t1"),
        };
        assert_eq!(subjects::parse_answer(&answer.subject()).unwrap(), worker);
    }

    #[test]
    fn a_destination_says_what_its_audit_events_are_about() {
        let m1: MessageId = id("m1");
        let inbox = Dest::Inbox {
            to: id("bob"),
            ttl_secs: None,
            expires_at: None,
        };
        assert_eq!(inbox.about(&m1), Some(About::Msg("m1".into())));
        let work = Dest::Work {
            queue: id("q"),
            worker: None,
            task_id: id("t1"),
        };
        let task = |channel| About::Task {
            task_id: "t1".into(),
            channel,
        };
        assert_eq!(work.about(&m1), Some(task(false)));
        let channel = Dest::TaskChannel(TaskChannel::of(&id("alice"), &id("t1")));
        assert_eq!(channel.about(&m1), Some(task(true)));
        let answer = Dest::Answer {
            worker: id("w1"),
            task_id: id("t1"),
        };
        assert_eq!(answer.about(&m1), None);
    }
}
