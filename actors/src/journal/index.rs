//! The journal's in-memory index of open attempts, rebuilt by replaying the log: one record
//! per (input sequence, task id).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::record::Record;
use super::{AnswerRecord, AttemptRecord};

/// What names an open attempt: its input's stream sequence and its task id.
pub(super) type Key = (u64, String);

/// The open attempts.
#[derive(Debug, Default)]
pub(super) struct Index {
    attempts: BTreeMap<Key, AttemptRecord>,
    by_task: HashMap<String, BTreeSet<u64>>,
    /// Attempts forgotten since the last compaction.
    pub forgotten: usize,
    /// How many open attempts are parked (their task kept): counted, not scanned for.
    pub parked: usize,
}

impl Index {
    pub fn get(&self, seq: u64, task_id: &str) -> Option<&AttemptRecord> {
        self.attempts.get(&(seq, task_id.to_owned()))
    }

    /// The open attempts of `task_id`, the most recently admitted input first.
    pub fn of_task<'a>(&'a self, task_id: &str) -> impl Iterator<Item = &'a AttemptRecord> {
        let seqs = self.by_task.get(task_id);
        let task_id = task_id.to_owned();
        seqs.into_iter()
            .flat_map(|seqs| seqs.iter().rev())
            .filter_map(move |seq| self.attempts.get(&(*seq, task_id.clone())))
    }

    /// The open attempts of sequence `seq` (one, unless the work stream was recreated).
    pub fn of_seq(&self, seq: u64) -> impl Iterator<Item = &AttemptRecord> {
        self.attempts
            .range((seq, String::new())..)
            .take_while(move |((s, _), _)| *s == seq)
            .map(|(_, r)| r)
    }

    pub fn values(&self) -> impl Iterator<Item = &AttemptRecord> {
        self.attempts.values()
    }

    /// The key a record names: its `tid`, or (a record of an earlier version) the only open
    /// attempt of its sequence.
    fn resolve(&self, seq: u64, tid: Option<String>) -> Option<Key> {
        match tid {
            Some(tid) => Some((seq, tid)),
            None => {
                let mut of_seq = self.of_seq(seq);
                let only = of_seq.next()?;
                of_seq.next().is_none().then(|| (seq, only.task_id.clone()))
            }
        }
    }

    fn open_mut(&mut self, seq: u64, tid: Option<String>) -> Option<&mut AttemptRecord> {
        let key = self.resolve(seq, tid);
        let attempt = key.and_then(|key| self.attempts.get_mut(&key));
        if attempt.is_none() {
            tracing::warn!(seq, "journal record for an input that is not open; ignored");
        }
        attempt
    }

    /// Applies one record (appended now, or replayed).
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Admitted {
                seq,
                task_id,
                attempt_id,
                from,
            } => {
                let key = (seq, task_id.clone());
                if let Some(existing) = self.attempts.get_mut(&key) {
                    if existing.delegator.is_none() && from.is_some() {
                        // A record of an earlier version learns its delegator.
                        existing.delegator = from;
                    } else {
                        tracing::warn!(seq, %task_id, "journal admits an open input twice; keeping the first");
                    }
                    return;
                }
                self.by_task.entry(task_id.clone()).or_default().insert(seq);
                self.attempts.insert(
                    key,
                    AttemptRecord {
                        input_seq: seq,
                        task_id,
                        attempt_id,
                        delegator: from,
                        result: None,
                        answers: Vec::new(),
                        task: None,
                    },
                );
            }
            Record::Parked { seq, tid, task } => {
                if let Some(attempt) = self.open_mut(seq, tid) {
                    let newly = attempt.task.is_none();
                    attempt.task = Some(task);
                    self.parked += usize::from(newly);
                }
            }
            Record::Result { seq, tid, result } => {
                if let Some(attempt) = self.open_mut(seq, tid) {
                    attempt.result = Some(result);
                }
            }
            Record::Answer {
                seq,
                tid,
                message_id,
                payload,
            } => {
                if let Some(attempt) = self.open_mut(seq, tid) {
                    if attempt.answers.iter().all(|a| a.message_id != message_id) {
                        attempt.answers.push(AnswerRecord {
                            message_id,
                            payload,
                        });
                        attempt.result = None;
                    }
                }
            }
            Record::Published { .. } => {}
            Record::Done { seq, tid } => {
                let Some(key) = self.resolve(seq, tid) else {
                    return;
                };
                if let Some(attempt) = self.attempts.remove(&key) {
                    self.parked -= usize::from(attempt.task.is_some());
                    if let Some(seqs) = self.by_task.get_mut(&attempt.task_id) {
                        seqs.remove(&seq);
                        if seqs.is_empty() {
                            self.by_task.remove(&attempt.task_id);
                        }
                    }
                    self.forgotten += 1;
                }
            }
        }
    }
}
