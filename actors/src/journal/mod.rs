//! The worker's local durable journal (JetStream mode).
//!
//! Each worker identity owns one journal directory, `<dir>/<worker_id>/`, that holds
//!
//! - `LOCK`: an exclusive, non-blocking file lock ([`std::fs::File::try_lock`]) held for the
//!   lifetime of the [`Journal`], with the holder's pid written in it. A second process (or a
//!   second [`Journal::open`] in the same process) on the same journal refuses to start with
//!   [`JournalError::Locked`], which names the holder's pid.
//! - `journal.log`: an append-only log, one record per line:
//!   `<crc32 as 8 hex digits> <JSON record>\n`, where the JSON record is tagged by `kind`:
//!   `admitted`, `result`, `answer`, `parked`, or `done` (a `published` record,
//!   written by earlier versions, is read and ignored). A result, an answer or a
//!   parked task is `write_all` plus `sync_data` before it counts (before the call returns, or,
//!   under [`Journal::deferring`], once its [`SyncToken`] is waited on: the group commit the
//!   worker uses), so it survives a crash or power loss. An
//!   admission is written (it survives the process: the page cache does) and becomes durable
//!   with the next durable record; a power loss before that may lose it, which only changes
//!   the re-run's attempt id (the re-run itself is flagged from the broker's delivery count).
//!   The `done` hint is appended without its own fsync, since losing it only republishes a
//!   result the stream dedupes.
//!
//! On [`Journal::open`] the log is replayed to rebuild the in-memory index, and compacted when
//! it holds finished attempts, so a worker restarted often keeps a small log. A damaged or
//! incomplete *last* line is the torn write of a crash: it was never acknowledged, so it is
//! dropped and cut off the file. A damaged line anywhere else is reported as
//! [`JournalError::Corrupt`].
//!
//! The attempt life cycle, keyed by the input stream sequence *and* the task id (the work
//! stream's sequences start over when it is deleted and recreated):
//!
//! 1. [`Journal::admit`] before the handler runs (idempotent: a redelivered input gets the
//!    same attempt back with [`Admission::result`], if any; an open record of the same
//!    sequence for another task is a stale one and is forgotten, unless it is parked);
//! 2. [`Journal::save_result`] when the handler returns, before publishing;
//! 3. [`Journal::forget`] once the input is acknowledged; [`Journal::compact`] later rewrites
//!    the log without forgotten attempts.
//!
//! A waiting attempt is [`park`](Journal::park)ed with its task before its input is acked: its
//! record stays open (task, attempt id, saved waiting result, answers) until an answer resumes
//! it to a final result or it is cancelled.
//!
//! Answers: [`Journal::record_answer`] journals an answer before resuming; it returns `false`
//! for a duplicate `message_id`, which must be answered with the saved result instead of a
//! second resume. Recording an answer clears the attempt's saved result (it is superseded by
//! the resume), so "answer recorded, no result" means the resume did not finish.
//!
//! Payloads are kept as [`serde_json::Value`] so this module does not depend on task types.
//! The API is synchronous (`std::fs`); call it from a blocking context or accept a short
//! fsync on the actor's thread.

mod error;
mod group_sync;
mod index;
mod lock;
mod record;
#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::{CorruptLine, JournalError};
use group_sync::GroupSync;
pub use group_sync::SyncToken;
use index::Index;
use record::Record;

/// File name of the lock file inside the worker's journal directory.
pub const LOCK_FILE: &str = "LOCK";
/// File name of the log inside the worker's journal directory.
pub const LOG_FILE: &str = "journal.log";
const COMPACT_TMP_FILE: &str = "journal.log.tmp";

/// An answer accepted for an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRecord {
    /// The answer's stable identity (deduplication key within the attempt).
    pub message_id: String,
    /// The accepted answer content, as received.
    pub payload: Value,
}

/// What the journal knows about one open (admitted, not forgotten) attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Stream sequence of the input message that started the attempt.
    pub input_seq: u64,
    /// The task's correlation id.
    pub task_id: String,
    /// The attempt's identity.
    pub attempt_id: String,
    /// Who delegated the task (its task channel is under this identity); `None` in records
    /// of earlier versions.
    pub delegator: Option<String>,
    /// The latest saved result, if the handler (or the latest resume) finished.
    pub result: Option<Value>,
    /// Accepted answers, in the order they were recorded.
    pub answers: Vec<AnswerRecord>,
    /// The task, once the attempt is parked waiting for an answer (its input is acked).
    pub task: Option<Value>,
}

/// The outcome of [`Journal::admit`].
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// The attempt id: the requested one when `new`, the journalled one otherwise.
    pub attempt_id: String,
    /// `true` when this call admitted the input; `false` when it was already admitted.
    pub new: bool,
    /// The saved result of an earlier admission, to be republished instead of running again.
    pub result: Option<Value>,
}

/// The worker's local journal. See the [module documentation](self).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    log_path: PathBuf,
    log: File,
    /// Length of the log up to the last acknowledged record.
    len: u64,
    /// The open attempts, by (input sequence, task id).
    index: Index,
    /// Group commit of the log.
    sync: Arc<GroupSync>,
    /// While true (inside [`Journal::deferring`]), durable appends leave their fsync to the
    /// returned [`SyncToken`] instead of doing it before they return.
    defer: bool,
    /// The token of the last durable append made while deferring.
    pending: Option<SyncToken>,
    /// Holds the exclusive lock until the journal is dropped.
    _lock: File,
}

impl Journal {
    /// Opens (creating if needed) the journal of `worker_id` under `dir`, takes its exclusive
    /// lock, and replays its log.
    pub fn open(dir: &Path, worker_id: &str) -> Result<Journal, JournalError> {
        validate_worker_id(dir, worker_id)?;
        let journal_dir = dir.join(worker_id);
        let existed = journal_dir.is_dir();
        fs::create_dir_all(&journal_dir).map_err(|e| JournalError::io(&journal_dir, e))?;
        if !existed {
            sync_dir(dir)?;
        }
        let lock = lock::acquire(&journal_dir, &journal_dir.join(LOCK_FILE))?;

        // A temporary file of an interrupted compaction was never renamed into place.
        let tmp = journal_dir.join(COMPACT_TMP_FILE);
        if tmp.exists() {
            fs::remove_file(&tmp).map_err(|e| JournalError::io(&tmp, e))?;
        }

        let log_path = journal_dir.join(LOG_FILE);
        let data = match fs::read(&log_path) {
            Ok(data) => Some(data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(JournalError::io(&log_path, e)),
        };
        let log = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(|e| JournalError::io(&log_path, e))?;
        if data.is_none() {
            sync_dir(&journal_dir)?;
        }

        let sync = GroupSync::new(
            log.try_clone()
                .map_err(|e| JournalError::io(&log_path, e))?,
            0,
        );
        let mut journal = Journal {
            dir: journal_dir,
            log_path,
            sync,
            defer: false,
            pending: None,
            log,
            len: 0,
            index: Index::default(),
            _lock: lock,
        };
        if let Some(data) = data {
            journal.replay(&data)?;
        }
        journal.reset_sync()?;
        if journal.index.forgotten > 0 {
            // Finished attempts are still in the log: start from a compact one, so that a
            // worker restarted more often than it compacts while running keeps a small log.
            journal.compact()?;
        }
        Ok(journal)
    }

    /// [`open`](Self::open), waiting up to 2 s for a lock held by this very process: tests
    /// reopen a journal right after dropping it, while other tests of the same binary spawn
    /// processes, each of which holds a copy of every descriptor (the lock's among them)
    /// between its fork and its exec.
    #[cfg(test)]
    pub(crate) fn open_when_free(dir: &Path, worker_id: &str) -> Result<Journal, JournalError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match Journal::open(dir, worker_id) {
                Err(JournalError::Locked {
                    holder: Some(pid), ..
                }) if pid == std::process::id() && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => return other,
            }
        }
    }

    /// The worker's journal directory (`<dir>/<worker_id>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records the admission of input `input_seq` as attempt `attempt_id` of `task_id`, or,
    /// if the input was already admitted, returns the journalled attempt (its id and saved
    /// result) without writing anything.
    ///
    /// An attempt is named by (input sequence, task id): the work stream's sequences start over
    /// when it is recreated. An open record of the same sequence for *another* task is of an
    /// input that no longer exists: unless that attempt is parked (its input acked long ago; it
    /// lives on until answered), it is forgotten.
    pub fn admit(
        &mut self,
        input_seq: u64,
        task_id: &str,
        attempt_id: &str,
        delegator: Option<&str>,
    ) -> Result<Admission, JournalError> {
        if let Some(existing) = self.index.get(input_seq, task_id) {
            let admission = Admission {
                attempt_id: existing.attempt_id.clone(),
                new: false,
                result: existing.result.clone(),
            };
            // A record of an earlier version, which did not journal the delegator: the input
            // brought it back, so the record learns it (a second `admitted` record fills in a
            // missing delegator, and changes nothing else).
            if existing.delegator.is_none() && delegator.is_some() {
                self.write_lazy(Record::Admitted {
                    seq: input_seq,
                    task_id: task_id.to_owned(),
                    attempt_id: admission.attempt_id.clone(),
                    from: delegator.map(str::to_owned),
                })?;
            }
            return Ok(admission);
        }
        let stale: Vec<String> = self
            .index
            .of_seq(input_seq)
            .filter(|r| r.task.is_none())
            .map(|r| r.task_id.clone())
            .collect();
        for old in stale {
            tracing::warn!(
                input_seq,
                journalled = %old,
                task_id,
                "input sequence reused by another task (work stream recreated?): the old record is forgotten"
            );
            self.write_lazy(Record::Done {
                seq: input_seq,
                tid: Some(old),
            })?;
        }
        // Written, not fsync'd: it survives the process (the page cache does), and the next
        // durable record (the attempt's result) makes it durable. A power loss mid-run may lose
        // it; the re-run is then still flagged from the broker's delivery count.
        self.write_lazy(Record::Admitted {
            seq: input_seq,
            task_id: task_id.to_owned(),
            attempt_id: attempt_id.to_owned(),
            from: delegator.map(str::to_owned),
        })?;
        Ok(Admission {
            attempt_id: attempt_id.to_owned(),
            new: true,
            result: None,
        })
    }

    /// The open attempt of input `input_seq` for `task_id`.
    pub fn lookup(&self, input_seq: u64, task_id: &str) -> Option<&AttemptRecord> {
        self.index.get(input_seq, task_id)
    }

    /// The open attempt of `task_id` (the most recently admitted one, if several inputs carry
    /// the same task id).
    #[cfg(test)]
    pub fn lookup_by_task(&self, task_id: &str) -> Option<&AttemptRecord> {
        self.index.of_task(task_id).next()
    }

    /// The open attempt `attempt_id` of `task_id`.
    pub fn lookup_attempt(&self, task_id: &str, attempt_id: &str) -> Option<&AttemptRecord> {
        self.index
            .of_task(task_id)
            .find(|r| r.attempt_id == attempt_id)
    }

    /// Saves the (latest) result of the attempt of `input_seq`/`task_id`, durably, replacing
    /// an earlier one.
    pub fn save_result(
        &mut self,
        input_seq: u64,
        task_id: &str,
        result: &Value,
    ) -> Result<(), JournalError> {
        self.require(input_seq, task_id)?;
        self.write(Record::Result {
            seq: input_seq,
            tid: Some(task_id.to_owned()),
            result: result.clone(),
        })
    }

    /// Journals an answer for the attempt of `input_seq`/`task_id` before it is resumed.
    /// Returns `false`, writing nothing, when an answer with the same `message_id` was already
    /// recorded (a duplicate: answer it with the saved result, do not resume again).
    pub fn record_answer(
        &mut self,
        input_seq: u64,
        task_id: &str,
        message_id: &str,
        payload: &Value,
    ) -> Result<bool, JournalError> {
        let attempt = self.require(input_seq, task_id)?;
        if attempt.answers.iter().any(|a| a.message_id == message_id) {
            return Ok(false);
        }
        self.write(Record::Answer {
            seq: input_seq,
            tid: Some(task_id.to_owned()),
            message_id: message_id.to_owned(),
            payload: payload.clone(),
        })?;
        Ok(true)
    }

    /// The recorded answer `message_id` of the attempt of `input_seq`/`task_id`.
    #[cfg(test)]
    pub fn answer(&self, input_seq: u64, task_id: &str, message_id: &str) -> Option<&AnswerRecord> {
        self.index
            .get(input_seq, task_id)?
            .answers
            .iter()
            .find(|a| a.message_id == message_id)
    }

    /// Parks the attempt of `input_seq`/`task_id`, durably: it waits for an answer and its
    /// input is about to be acked, so the journal keeps `task` to resume it with. Idempotent.
    pub fn park(
        &mut self,
        input_seq: u64,
        task_id: &str,
        task: &Value,
    ) -> Result<(), JournalError> {
        if self.require(input_seq, task_id)?.task.as_ref() == Some(task) {
            return Ok(());
        }
        self.write(Record::Parked {
            seq: input_seq,
            tid: Some(task_id.to_owned()),
            task: task.clone(),
        })
    }

    /// How many open attempts are parked (waiting for an answer, input acked).
    pub fn parked_count(&self) -> usize {
        self.index.parked
    }

    /// Marks the attempt of `input_seq`/`task_id` finished (its input was acknowledged, or it
    /// was settled elsewhere). Returns `false` when there was no such open attempt. The entry
    /// leaves the log at the next [`compact`](Self::compact).
    pub fn forget(&mut self, input_seq: u64, task_id: &str) -> Result<bool, JournalError> {
        if self.index.get(input_seq, task_id).is_none() {
            return Ok(false);
        }
        // Written after the input was acked: lost in a crash, the entry merely stays open in
        // the journal (nothing can redeliver an acked input), so it is not fsync'd on its own.
        self.write_lazy(Record::Done {
            seq: input_seq,
            tid: Some(task_id.to_owned()),
        })?;
        Ok(true)
    }

    /// The open attempts (admitted, not forgotten), by input sequence.
    pub fn open_attempts(&self) -> Vec<AttemptRecord> {
        self.index.values().cloned().collect()
    }

    /// How many attempts were forgotten since the log was last compacted (or opened); a hint
    /// for when to call [`compact`](Self::compact).
    pub fn forgotten_since_compaction(&self) -> usize {
        self.index.forgotten
    }

    /// Rewrites the log with only the open attempts: writes a temporary file, fsyncs it,
    /// renames it over the log and fsyncs the directory.
    pub fn compact(&mut self) -> Result<(), JournalError> {
        let mut data = Vec::new();
        for attempt in self.index.values() {
            let seq = attempt.input_seq;
            let tid = || Some(attempt.task_id.clone());
            data.extend(record::encode(&Record::Admitted {
                seq,
                task_id: attempt.task_id.clone(),
                attempt_id: attempt.attempt_id.clone(),
                from: attempt.delegator.clone(),
            }));
            if let Some(task) = &attempt.task {
                data.extend(record::encode(&Record::Parked {
                    seq,
                    tid: tid(),
                    task: task.clone(),
                }));
            }
            // Answers before the result: replaying an answer clears the result.
            for answer in &attempt.answers {
                data.extend(record::encode(&Record::Answer {
                    seq,
                    tid: tid(),
                    message_id: answer.message_id.clone(),
                    payload: answer.payload.clone(),
                }));
            }
            if let Some(result) = &attempt.result {
                data.extend(record::encode(&Record::Result {
                    seq,
                    tid: tid(),
                    result: result.clone(),
                }));
            }
        }
        let tmp = self.dir.join(COMPACT_TMP_FILE);
        let write_tmp = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(&data)?;
            file.sync_all()
        };
        if let Err(e) = write_tmp() {
            let _ = fs::remove_file(&tmp);
            return Err(JournalError::io(&tmp, e));
        }
        // Both handles on the new log are opened before it takes the log's name: once renamed,
        // nothing that can fail stands between the rename and switching to them (appends to,
        // or fsyncs of, the unlinked old log would be lost while reported durable).
        let handles = OpenOptions::new()
            .append(true)
            .open(&tmp)
            .and_then(|log| Ok((log.try_clone()?, log)));
        let (sync_handle, log) = match handles {
            Ok(handles) => handles,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(JournalError::io(&tmp, e));
            }
        };
        fs::rename(&tmp, &self.log_path).map_err(|e| JournalError::io(&self.log_path, e))?;
        self.log = log;
        self.len = data.len() as u64;
        self.index.forgotten = 0;
        self.sync = GroupSync::new(sync_handle, self.len);
        self.pending = None;
        if let Err(e) = sync_dir(&self.dir) {
            // The rename may not be durable yet: no later record counts as durable until the
            // directory is synced (the next fsync retries it, and fails while it fails).
            self.sync.require_dir_sync(self.dir.clone());
            return Err(e);
        }
        Ok(())
    }

    /// A fresh group-sync handle on the current log, everything in it durable.
    fn reset_sync(&mut self) -> Result<(), JournalError> {
        let file = self
            .log
            .try_clone()
            .map_err(|e| JournalError::io(&self.log_path, e))?;
        self.sync = GroupSync::new(file, self.len);
        self.pending = None;
        Ok(())
    }

    /// Runs `op` with durable appends deferred: they are written but not fsync'd, and the
    /// returned [`SyncToken`] (when `op` made one) must be waited on — typically after the
    /// caller released its lock on the journal, so that concurrent attempts share one fsync
    /// (group commit). A record is durable only once its token's `wait` returned.
    pub fn deferring<T>(
        &mut self,
        op: impl FnOnce(&mut Journal) -> Result<T, JournalError>,
    ) -> (Result<T, JournalError>, Option<SyncToken>) {
        self.defer = true;
        let out = op(self);
        self.defer = false;
        (out, self.pending.take())
    }

    fn require(&self, input_seq: u64, task_id: &str) -> Result<&AttemptRecord, JournalError> {
        self.index
            .get(input_seq, task_id)
            .ok_or_else(|| JournalError::Unknown {
                input_seq,
                task_id: task_id.to_owned(),
            })
    }

    /// Appends `record` durably (fsync), then applies it to the index.
    fn write(&mut self, record: Record) -> Result<(), JournalError> {
        self.append(record, true)
    }

    /// Appends `record` without its own fsync (the next durable write, or the OS, syncs it).
    fn write_lazy(&mut self, record: Record) -> Result<(), JournalError> {
        self.append(record, false)
    }

    fn append(&mut self, record: Record, durable: bool) -> Result<(), JournalError> {
        let line = record::encode(&record);
        let appended = self.log.write_all(&line).and_then(|()| {
            let token = self.sync.appended(self.len + line.len() as u64);
            match (durable, self.defer) {
                (true, false) => token.wait(),
                (true, true) => {
                    self.pending = Some(token);
                    Ok(())
                }
                (false, _) => Ok(()),
            }
        });
        if let Err(e) = appended {
            // Cut a partial write off so that later appends do not follow garbage.
            let _ = self.log.set_len(self.len);
            return Err(JournalError::io(&self.log_path, e));
        }
        self.len += line.len() as u64;
        self.index.apply(record);
        Ok(())
    }

    fn replay(&mut self, data: &[u8]) -> Result<(), JournalError> {
        let mut pos = 0;
        let mut line_no = 0;
        while pos < data.len() {
            line_no += 1;
            let (line, next, complete) = match data[pos..].iter().position(|&b| b == b'\n') {
                Some(i) => (&data[pos..pos + i], pos + i + 1, true),
                None => (&data[pos..], data.len(), false),
            };
            let decoded = if complete {
                record::decode(line)
            } else {
                Err(CorruptLine::Incomplete)
            };
            match decoded {
                Ok(record) => self.index.apply(record),
                Err(reason) if next >= data.len() => {
                    tracing::warn!(
                        path = %self.log_path.display(),
                        line = line_no,
                        %reason,
                        "dropping the torn last record of the journal"
                    );
                    break;
                }
                Err(source) => {
                    return Err(JournalError::Corrupt {
                        path: self.log_path.clone(),
                        line: line_no,
                        source,
                    })
                }
            }
            pos = next;
        }
        self.len = pos as u64;
        if pos < data.len() {
            let cut = self
                .log
                .set_len(self.len)
                .and_then(|()| self.log.sync_data());
            cut.map_err(|e| JournalError::io(&self.log_path, e))?;
        }
        Ok(())
    }
}

fn validate_worker_id(dir: &Path, worker_id: &str) -> Result<(), JournalError> {
    let valid = !worker_id.is_empty()
        && worker_id != "."
        && worker_id != ".."
        && !worker_id.contains(['/', '\\', '\0']);
    if valid {
        Ok(())
    } else {
        Err(JournalError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid worker id {worker_id:?} for a journal directory"),
            ),
        ))
    }
}

/// Makes the directory's entries (created or renamed files) durable.
fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| JournalError::io(dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
