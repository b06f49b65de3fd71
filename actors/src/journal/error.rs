//! Errors of the worker journal.

use std::path::PathBuf;

/// Why a journal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another process (or another open [`Journal`](super::Journal)) holds the journal lock.
    #[error(
        "journal {} is in use by another process ({}); one process per worker identity",
        path.display(),
        describe_holder(*holder)
    )]
    Locked {
        /// The journal directory.
        path: PathBuf,
        /// The pid written into the lock file by the holder, when it could be read.
        holder: Option<u32>,
    },
    /// A file system operation failed.
    #[error("journal i/o error on {}", path.display())]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A record that is not the last one of the log is damaged. A damaged *last* record is a
    /// torn write of a crash and is dropped silently instead.
    #[error("journal {} is corrupt at line {line}", path.display())]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        #[source]
        source: CorruptLine,
    },
    /// The operation names an input sequence that is not an open (admitted, not forgotten)
    /// attempt.
    #[error("journal has no open attempt for input sequence {input_seq} of task {task_id}")]
    Unknown {
        /// The input stream sequence.
        input_seq: u64,
        /// The task id.
        task_id: String,
    },
}

/// What is wrong with a line of the journal log.
#[derive(Debug, thiserror::Error)]
pub enum CorruptLine {
    /// The line has no trailing newline (a torn write).
    #[error("incomplete line")]
    Incomplete,
    /// The line does not start with a checksum and a space.
    #[error("missing checksum")]
    MissingChecksum,
    /// The checksum is not 8 hex digits.
    #[error("bad checksum")]
    BadChecksum,
    /// The checksum does not match the record.
    #[error("checksum mismatch (expected {expected:08x}, got {actual:08x})")]
    ChecksumMismatch {
        /// The checksum written on the line.
        expected: u32,
        /// The checksum of the record as read.
        actual: u32,
    },
    /// The checksum matches but the record does not decode.
    #[error("invalid record")]
    InvalidRecord(#[source] serde_json::Error),
}

fn describe_holder(holder: Option<u32>) -> String {
    match holder {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    }
}

impl JournalError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        JournalError::Io {
            path: path.into(),
            source,
        }
    }
}
