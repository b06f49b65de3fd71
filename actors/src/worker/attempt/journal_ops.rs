//! An attempt's journal operations: durable ones awaited on the journal's syncer thread
//! (group commit), hints appended inline, and compaction on the blocking pool.

use std::sync::{Arc, Mutex};

use protocol::error_chain::ErrorChain;
use protocol::task::{TaskResult, TaskSpec};
use serde::{Deserialize, Serialize};

use super::AttemptError;
use crate::journal::{Journal, JournalError};

/// What the journal holds as an attempt's saved result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedResult {
    /// The state-change sequence the result was published under
    /// ([`result_msg_id`](protocol::task::result_msg_id)).
    pub seq: u32,
    /// The result.
    pub result: TaskResult,
}

/// A waiting attempt as its worker's journal holds it, input acked: what an answer (or a
/// cancel) needs to go on with it.
#[derive(Debug, Clone)]
pub(crate) struct Parked {
    /// The journal key: the sequence of the task input that started the attempt.
    pub record_seq: u64,
    /// The task.
    pub task: TaskSpec,
    /// Who delegated it (journalled at admission).
    pub delegator: protocol::AgentId,
    /// The attempt.
    pub attempt_id: protocol::task::AttemptId,
    /// The latest saved result (`waiting`; none while a resume is interrupted).
    pub saved: Option<SavedResult>,
    /// The answers journalled so far, oldest first.
    pub answers: Vec<protocol::task::Answer>,
}

impl Parked {
    /// The parked attempt `attempt_id` of `task_id` in `journal`, when there is one.
    pub fn find(journal: &Journal, task_id: &str, attempt_id: &str) -> Option<Parked> {
        Self::of(journal.lookup_attempt(task_id, attempt_id)?)
    }

    /// The parked attempt `record` is, when it is one (its task and its delegator are kept; a
    /// record of an earlier version, without its delegator, is none: its task channel is not
    /// known).
    pub fn of(record: &crate::journal::AttemptRecord) -> Option<Parked> {
        let task: TaskSpec = serde_json::from_value(record.task.clone()?).ok()?;
        Some(Parked {
            record_seq: record.input_seq,
            task,
            delegator: protocol::AgentId::new(record.delegator.as_deref()?).ok()?,
            attempt_id: protocol::task::AttemptId::new(&record.attempt_id).ok()?,
            saved: saved_of(record),
            answers: answers_of(record),
        })
    }
}

/// The saved result of a journal record, when it has one that decodes.
pub fn saved_of(record: &crate::journal::AttemptRecord) -> Option<SavedResult> {
    serde_json::from_value(record.result.clone()?).ok()
}

/// The answers journalled in a record, oldest first (those that decode).
pub fn answers_of(record: &crate::journal::AttemptRecord) -> Vec<protocol::task::Answer> {
    record
        .answers
        .iter()
        .filter_map(|a| serde_json::from_value(a.payload.clone()).ok())
        .collect()
}

/// Runs a journal operation: its appends are written here, under the journal's lock (a
/// `write` into the page cache each), and its durable records are fsync'd by the journal's
/// syncer thread after the lock is released, so that attempts finishing together share one
/// fsync (group commit). The records are durable when this returns.
pub(crate) async fn durable<T>(
    journal: &Arc<Mutex<Journal>>,
    op: impl FnOnce(&mut Journal) -> Result<T, JournalError>,
) -> Result<T, AttemptError> {
    let (out, token, dir) = {
        let mut guard = journal.lock().unwrap_or_else(|e| e.into_inner());
        let (out, token) = guard.deferring(op);
        (out, token, guard.dir().to_path_buf())
    };
    if let Some(token) = token {
        token
            .synced()
            .await
            .map_err(|source| JournalError::Io { path: dir, source })?;
    }
    Ok(out?)
}

/// Runs a journal operation that appends no durable record (admissions and
/// `done` hints) right here: such an append is one `write` into the page cache, cheaper than a
/// trip to the blocking pool.
pub(crate) fn lazy<T>(
    journal: &Arc<Mutex<Journal>>,
    op: impl FnOnce(&mut Journal) -> Result<T, JournalError>,
) -> Result<T, AttemptError> {
    let mut guard = journal.lock().unwrap_or_else(|e| e.into_inner());
    Ok(op(&mut guard)?)
}

/// Compacts the journal on the blocking pool once `every` attempts were forgotten (checked
/// again under the lock, so concurrent finishers compact once); `done` is called after a
/// compaction.
pub(crate) fn compact_when_due(
    journal: &Arc<Mutex<Journal>>,
    every: usize,
    done: impl FnOnce() + Send + 'static,
) {
    let every = every.max(1);
    let due = lazy(journal, |j| Ok(j.forgotten_since_compaction() >= every)).unwrap_or(false);
    if !due {
        return;
    }
    let journal = journal.clone();
    tokio::task::spawn_blocking(move || {
        let mut j = journal.lock().unwrap_or_else(|e| e.into_inner());
        if j.forgotten_since_compaction() < every {
            return;
        }
        match j.compact() {
            Ok(()) => done(),
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "journal compaction failed; retried later")
            }
        }
    });
}
