//! The attempts running in a worker, with the indexes the worker looks them up by: the actor,
//! the task (its delegator and id: two identities' tasks may share an id), the attempt id, and
//! the input message each one holds (heartbeats and will ack).

use std::collections::HashMap;

use protocol::task::AttemptId;
use protocol::{AgentId, TaskId};
use ractor::{ActorId, ActorRef};

use super::attempt::AttemptMsg;

/// The input message an attempt holds: a task input of the work stream, or the answer that
/// resumes a waiting attempt, by stream sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Input {
    /// A task input (work stream sequence).
    Task(u64),
    /// An answer (answers stream sequence).
    Answer(u64),
}

/// One running attempt.
pub(super) struct Running {
    pub actor: ActorRef<AttemptMsg>,
    pub task_id: TaskId,
    /// Who delegated the task (only it, or an admin, may query, cancel or answer it).
    pub delegator: AgentId,
    pub attempt_id: AttemptId,
    pub input: Option<Input>,
}

/// The running attempts. Every index is updated by [`insert`](Self::insert) and
/// [`remove`](Self::remove) together, so they cannot drift apart.
#[derive(Default)]
pub(super) struct RunningSet {
    by_actor: HashMap<ActorId, Running>,
    by_task: HashMap<(AgentId, TaskId), ActorId>,
    by_attempt: HashMap<AttemptId, ActorId>,
    by_input: HashMap<Input, ActorId>,
}

impl RunningSet {
    /// Adds an attempt (replacing nothing: a task or input already running is the caller's
    /// check).
    pub fn insert(
        &mut self,
        actor: ActorRef<AttemptMsg>,
        task_id: TaskId,
        delegator: AgentId,
        attempt_id: AttemptId,
        input: Option<Input>,
    ) {
        let id = actor.get_id();
        self.by_task
            .insert((delegator.clone(), task_id.clone()), id);
        self.by_attempt.insert(attempt_id.clone(), id);
        if let Some(input) = input {
            self.by_input.insert(input, id);
        }
        self.by_actor.insert(
            id,
            Running {
                actor,
                task_id,
                delegator,
                attempt_id,
                input,
            },
        );
    }

    /// Removes the attempt of actor `id`.
    pub fn remove(&mut self, id: ActorId) -> Option<Running> {
        let running = self.by_actor.remove(&id)?;
        let task = (running.delegator.clone(), running.task_id.clone());
        if self.by_task.get(&task) == Some(&id) {
            self.by_task.remove(&task);
        }
        if self.by_attempt.get(&running.attempt_id) == Some(&id) {
            self.by_attempt.remove(&running.attempt_id);
        }
        if let Some(input) = running.input {
            if self.by_input.get(&input) == Some(&id) {
                self.by_input.remove(&input);
            }
        }
        Some(running)
    }

    /// The attempt running `delegator`'s task `task_id` (one per task: its actor is named
    /// after it).
    pub fn by_task(&self, delegator: &AgentId, task_id: &TaskId) -> Option<&Running> {
        let id = self.by_task.get(&(delegator.clone(), task_id.clone()))?;
        self.by_actor.get(id)
    }

    /// The running attempt `attempt_id` of task `task_id`.
    pub fn by_attempt(&self, task_id: &TaskId, attempt_id: &AttemptId) -> Option<&Running> {
        let id = self.by_attempt.get(attempt_id)?;
        self.by_actor.get(id).filter(|r| &r.task_id == task_id)
    }

    /// Whether an attempt holds `input`.
    pub fn holds(&self, input: Input) -> bool {
        self.by_input.contains_key(&input)
    }

    /// How many attempts run.
    pub fn len(&self) -> usize {
        self.by_actor.len()
    }

    /// Every running attempt's actor.
    pub fn actors(&self) -> Vec<ActorRef<AttemptMsg>> {
        self.by_actor.values().map(|r| r.actor.clone()).collect()
    }
}
