//! The worker's journal log as read from disk (`actors::journal`: `Journal::open` replays
//! `journal.log`, one `<crc32> <JSON record>` line per record).

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use actors::journal::{Journal, JournalError, LOG_FILE};

/// The worker id whose journal the check opens.
const WORKER: &str = "w";

/// A journal log made of the fuzzer's bytes, opened as a worker opens its journal at start.
///
/// The first byte picks how the rest is the log: odd, as it is (so almost every line fails its
/// checksum); even, one record per line with its checksum put in front by the check (so the
/// records behind the checksums are what is read), the last line left without its newline
/// when the bytes end without one.
///
/// Asserts that the journal opens, or refuses a damaged line that is not the last one (a
/// damaged or incomplete last line is a torn write, dropped); that an opened journal holds
/// consistent attempts (each found by its sequence and task, the parked ones counted, none
/// forgotten since the compaction at open); that the log it leaves is whole lines; and that
/// opening that log again reads the same attempts and leaves it as it was.
pub fn check_journal(data: &[u8]) {
    let log = match data.split_first() {
        Some((mode, rest)) if mode % 2 == 0 => sealed(rest),
        Some((_, rest)) => rest.to_vec(),
        None => Vec::new(),
    };
    SCRATCH.with(|scratch| check_log(&scratch.0, &log));
}

fn check_log(dir: &std::path::Path, log: &[u8]) {
    let journal_dir = dir.join(WORKER);
    fs::create_dir_all(&journal_dir).expect("the scratch directory");
    let log_path = journal_dir.join(LOG_FILE);
    fs::write(&log_path, log).expect("the log is written");
    // Replayed line by line, an incomplete last one included.
    let total = log.iter().filter(|b| **b == b'\n').count()
        + usize::from(!log.is_empty() && !log.ends_with(b"\n"));
    let journal = match Journal::open(dir, WORKER) {
        Ok(journal) => journal,
        Err(JournalError::Corrupt { line, source, .. }) => {
            assert!(
                line >= 1 && line < total,
                "line {line} of {total} refused ({source}): only a line before the last is"
            );
            return;
        }
        Err(other) => panic!("the journal does not open: {other}"),
    };
    let attempts = journal.open_attempts();
    assert_eq!(
        journal.forgotten_since_compaction(),
        0,
        "not compacted at open"
    );
    assert_eq!(
        journal.parked_count(),
        attempts.iter().filter(|a| a.task.is_some()).count(),
        "the parked count"
    );
    for attempt in &attempts {
        assert_eq!(
            journal.lookup(attempt.input_seq, &attempt.task_id),
            Some(attempt)
        );
        let found = journal
            .lookup_attempt(&attempt.task_id, &attempt.attempt_id)
            .expect("an open attempt is found by its task and attempt");
        assert_eq!(
            (&found.task_id, &found.attempt_id),
            (&attempt.task_id, &attempt.attempt_id)
        );
    }
    assert!(
        attempts
            .windows(2)
            .all(|w| w[0].input_seq <= w[1].input_seq),
        "open attempts out of sequence order"
    );
    drop(journal);
    let left = fs::read(&log_path).expect("the log is still there");
    assert!(
        left.is_empty() || left.ends_with(b"\n"),
        "the journal left a torn line"
    );
    let again = Journal::open(dir, WORKER).expect("the log the journal left opens again");
    assert_eq!(
        again.open_attempts(),
        attempts,
        "reopened, the attempts differ"
    );
    drop(again);
    assert_eq!(
        fs::read(&log_path).expect("the log is still there"),
        left,
        "reopening changed the log"
    );
}

/// Each line of `rest` with its checksum in front, as the journal writes a record.
fn sealed(rest: &[u8]) -> Vec<u8> {
    let mut log = Vec::with_capacity(rest.len() + 16);
    let mut lines = rest.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        if last && line.is_empty() {
            break;
        }
        log.extend_from_slice(format!("{:08x} ", crc32(line)).as_bytes());
        log.extend_from_slice(line);
        if !last {
            log.push(b'\n');
        }
    }
    log
}

/// CRC-32 (IEEE 802.3), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A directory of this thread's own (tests replay in parallel), in memory where there is a
/// tmpfs, removed when the thread ends.
struct Scratch(PathBuf);

thread_local! {
    static SCRATCH: Scratch = Scratch::new();
}

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let shm = PathBuf::from("/dev/shm");
        let root = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let dir = root.join(format!(
            "fuzz_checks-journal-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32_matches_the_reference_value() {
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
    }
}
