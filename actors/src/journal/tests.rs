use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::*;

/// A unique temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "actors-journal-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn append_raw(dir: &Path, bytes: &[u8]) {
    let mut file = OpenOptions::new()
        .append(true)
        .open(dir.join("w-1").join(LOG_FILE))
        .unwrap();
    file.write_all(bytes).unwrap();
}

#[test]
fn journal_admission_survives_reopen_and_is_idempotent() {
    let tmp = TempDir::new("admit");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        let admission = journal.admit(5, "task-a", "att-1", None).unwrap();
        assert!(admission.new);
        assert_eq!(admission.result, None);
        // Dropped without any close: a crash.
    }
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let admission = journal.admit(5, "task-a", "att-other", None).unwrap();
    assert!(!admission.new);
    assert_eq!(admission.attempt_id, "att-1");
    assert_eq!(admission.result, None);
    assert!(
        !admission.new && admission.result.is_none(),
        "admitted before without a result: the same attempt runs again"
    );
    let record = journal.lookup(5, "task-a").unwrap();
    assert_eq!(record.task_id, "task-a");
    assert_eq!(record.attempt_id, "att-1");
    assert!(journal.lookup(6, "task-a").is_none());
    assert!(journal.lookup(5, "task-b").is_none());
}

#[test]
fn the_delegator_is_journalled_and_a_record_without_one_learns_it_from_its_input() {
    let tmp = TempDir::new("delegator");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        journal.admit(1, "task-a", "att-1", Some("alice")).unwrap();
        // What an earlier version wrote: no delegator.
        journal.admit(2, "task-b", "att-2", None).unwrap();
    }
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let delegator = |j: &Journal, seq, task| j.lookup(seq, task).unwrap().delegator.clone();
    assert_eq!(delegator(&journal, 1, "task-a").as_deref(), Some("alice"));
    assert_eq!(delegator(&journal, 2, "task-b"), None);
    // Its input comes back (stamped): the same attempt, and now its delegator.
    let admission = journal.admit(2, "task-b", "att-new", Some("bob")).unwrap();
    assert_eq!(
        (admission.attempt_id.as_str(), admission.new),
        ("att-2", false)
    );
    assert_eq!(delegator(&journal, 2, "task-b").as_deref(), Some("bob"));
    // A delegator once journalled is never replaced.
    journal
        .admit(1, "task-a", "att-x", Some("mallory"))
        .unwrap();
    assert_eq!(delegator(&journal, 1, "task-a").as_deref(), Some("alice"));
    drop(journal);
    // Kept across a reopen, and across a compaction.
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert_eq!(delegator(&journal, 2, "task-b").as_deref(), Some("bob"));
    journal.compact().unwrap();
    drop(journal);
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert_eq!(delegator(&journal, 1, "task-a").as_deref(), Some("alice"));
    assert_eq!(delegator(&journal, 2, "task-b").as_deref(), Some("bob"));
}

#[test]
fn journal_saved_result_survives_crash() {
    let tmp = TempDir::new("result");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        journal.admit(1, "task-a", "att-1", None).unwrap();
        journal
            .save_result(
                1,
                "task-a",
                &json!({"state": "completed", "response": "ok"}),
            )
            .unwrap();
        journal.admit(2, "task-b", "att-2", None).unwrap();
        journal
            .save_result(2, "task-b", &json!({"state": "failed"}))
            .unwrap();
    }
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let admission = journal.admit(1, "task-a", "att-x", None).unwrap();
    assert!(!admission.new);
    assert_eq!(
        admission.result,
        Some(json!({"state": "completed", "response": "ok"}))
    );
    let err = journal.save_result(99, "task-z", &json!(null)).unwrap_err();
    assert!(
        matches!(&err, JournalError::Unknown { input_seq: 99, task_id } if task_id == "task-z"),
        "{err:?}"
    );
}

#[test]
fn journal_ignores_torn_last_line() {
    let tmp = TempDir::new("torn");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        journal.admit(1, "task-a", "att-1", None).unwrap();
        journal.save_result(1, "task-a", &json!("done")).unwrap();
    }
    // A crash in the middle of writing a record.
    append_raw(tmp.path(), br#"0badc0de {"kind":"result","seq":1,"res"#);
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        assert_eq!(
            journal.lookup(1, "task-a").unwrap().result,
            Some(json!("done"))
        );
        // The torn tail was cut off: new records are not appended after garbage.
        journal.admit(2, "task-b", "att-2", None).unwrap();
    }
    // A complete last line with a bad checksum is also a torn write.
    append_raw(tmp.path(), b"garbage\n");
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert_eq!(journal.open_attempts().len(), 2);
    assert_eq!(journal.lookup(2, "task-b").unwrap().attempt_id, "att-2");
}

#[test]
fn journal_reports_corruption_before_the_last_line() {
    let tmp = TempDir::new("corrupt");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        journal.admit(1, "task-a", "att-1", None).unwrap();
    }
    append_raw(tmp.path(), b"garbage\n");
    append_raw(
        tmp.path(),
        &record::encode(&Record::Published {
            seq: 1,
            tid: Some("task-a".into()),
        }),
    );
    let err = Journal::open_when_free(tmp.path(), "w-1").unwrap_err();
    assert!(
        matches!(err, JournalError::Corrupt { line: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("is corrupt at line 2"), "{err}");
}

#[test]
fn journal_second_open_is_locked_until_first_is_dropped() {
    let tmp = TempDir::new("lock");
    let first = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    // `File::try_lock` conflicts between open file descriptions of one process, too.
    let err = Journal::open(tmp.path(), "w-1").unwrap_err();
    let pid = std::process::id();
    match &err {
        JournalError::Locked { path, holder } => {
            assert_eq!(path, &tmp.path().join("w-1"));
            assert_eq!(*holder, Some(pid));
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&format!("(pid {pid})")), "{message}");
    assert!(
        message.contains("one process per worker identity"),
        "{message}"
    );
    // Another worker identity in the same directory is independent.
    let other = Journal::open(tmp.path(), "w-2").unwrap();
    drop(other);
    drop(first);
    // Free once dropped (see `open_when_free` for the wait).
    Journal::open_when_free(tmp.path(), "w-1").unwrap();
}

#[test]
fn journal_duplicate_answers_detected_across_reopen() {
    let tmp = TempDir::new("answers");
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        journal.admit(3, "task-a", "att-1", None).unwrap();
        journal
            .save_result(3, "task-a", &json!({"state": "waiting"}))
            .unwrap();
        assert!(journal
            .record_answer(3, "task-a", "m-1", &json!({"text": "yes"}))
            .unwrap());
        // The answer supersedes the waiting result until the resume saves its own.
        let record = journal.lookup(3, "task-a").unwrap();
        assert_eq!(record.result, None);
        assert!(!journal
            .record_answer(3, "task-a", "m-1", &json!({"text": "changed"}))
            .unwrap());
        journal
            .save_result(3, "task-a", &json!({"state": "completed"}))
            .unwrap();
    }
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert!(!journal
        .record_answer(3, "task-a", "m-1", &json!({"text": "again"}))
        .unwrap());
    let record = journal.lookup(3, "task-a").unwrap();
    assert_eq!(record.answers.len(), 1);
    assert_eq!(record.answers[0].payload, json!({"text": "yes"}));
    assert_eq!(record.result, Some(json!({"state": "completed"})));
    assert_eq!(
        journal.answer(3, "task-a", "m-1").unwrap().payload,
        json!({"text": "yes"})
    );
    assert!(journal
        .record_answer(3, "task-a", "m-2", &json!({}))
        .unwrap());
    assert!(matches!(
        journal.record_answer(4, "task-a", "m-1", &json!({})),
        Err(JournalError::Unknown { input_seq: 4, .. })
    ));
    assert!(matches!(
        journal.record_answer(3, "task-b", "m-1", &json!({})),
        Err(JournalError::Unknown { input_seq: 3, .. })
    ));
}

#[test]
fn journal_forget_and_compact_keep_open_attempts() {
    let tmp = TempDir::new("compact");
    let log = tmp.path().join("w-1").join(LOG_FILE);
    {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        for seq in 1..=4 {
            journal
                .admit(seq, &format!("task-{seq}"), &format!("att-{seq}"), None)
                .unwrap();
            journal
                .save_result(seq, &format!("task-{seq}"), &json!({"seq": seq}))
                .unwrap();
        }
        journal
            .record_answer(3, "task-3", "m-1", &json!("answer"))
            .unwrap();
        journal.save_result(3, "task-3", &json!("resumed")).unwrap();
        assert!(journal.forget(1, "task-1").unwrap());
        assert!(journal.forget(2, "task-2").unwrap());
        assert!(!journal.forget(2, "task-2").unwrap());
        assert_eq!(journal.forgotten_since_compaction(), 2);
        let before = fs::metadata(&log).unwrap().len();
        let open_before = journal.open_attempts();
        journal.compact().unwrap();
        assert!(fs::metadata(&log).unwrap().len() < before);
        assert_eq!(journal.forgotten_since_compaction(), 0);
        assert_eq!(journal.open_attempts(), open_before);
    }
    let text = fs::read_to_string(&log).unwrap();
    assert!(!text.contains("att-1") && !text.contains("att-2"), "{text}");
    assert!(!text.contains(r#""kind":"done""#), "{text}");
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert!(journal.lookup(1, "task-1").is_none() && journal.lookup(2, "task-2").is_none());
    let seqs: Vec<u64> = journal
        .open_attempts()
        .iter()
        .map(|a| a.input_seq)
        .collect();
    assert_eq!(seqs, [3, 4]);
    let three = journal.lookup(3, "task-3").unwrap();
    assert_eq!(three.result, Some(json!("resumed")));
    assert_eq!(three.answers.len(), 1);
    assert!(!tmp.path().join("w-1").join(COMPACT_TMP_FILE).exists());
}

#[test]
fn journal_lookup_by_task_finds_open_attempt() {
    let tmp = TempDir::new("by-task");
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    journal.admit(10, "task-a", "att-1", None).unwrap();
    journal.admit(11, "task-b", "att-2", None).unwrap();
    assert_eq!(journal.lookup_by_task("task-a").unwrap().input_seq, 10);
    // A duplicate task id on a new input: the latest open attempt wins.
    journal.admit(12, "task-a", "att-3", None).unwrap();
    assert_eq!(
        journal.lookup_by_task("task-a").unwrap().attempt_id,
        "att-3"
    );
    journal.forget(12, "task-a").unwrap();
    assert_eq!(
        journal.lookup_by_task("task-a").unwrap().attempt_id,
        "att-1"
    );
    journal.forget(10, "task-a").unwrap();
    assert!(journal.lookup_by_task("task-a").is_none());
    drop(journal);
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert_eq!(
        journal.lookup_by_task("task-b").unwrap().attempt_id,
        "att-2"
    );
    assert!(journal.lookup_by_task("task-a").is_none());
}

#[test]
fn journal_rejects_path_like_worker_ids() {
    let tmp = TempDir::new("worker-id");
    for bad in ["", ".", "..", "a/b", "a\\b"] {
        assert!(
            matches!(Journal::open(tmp.path(), bad), Err(JournalError::Io { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn admitting_a_reused_sequence_for_another_task_starts_a_new_attempt() {
    // HUB_WORK was deleted and recreated: its sequences start over while this journal still
    // holds an open record (with a saved result) of input 3 for another task.
    let tmp = TempDir::new("reused-seq");
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    journal.admit(3, "task-old", "att-old", None).unwrap();
    journal
        .save_result(3, "task-old", &json!({"old": true}))
        .unwrap();
    let admission = journal.admit(3, "task-new", "att-new", None).unwrap();
    assert!(admission.new, "a new input, not the old attempt");
    assert_eq!(admission.attempt_id, "att-new");
    assert_eq!(journal.lookup(3, "task-new").unwrap().attempt_id, "att-new");
    assert_eq!(
        admission.result, None,
        "task-old's result is not task-new's"
    );
    assert!(journal.lookup_by_task("task-old").is_none());
    assert_eq!(journal.lookup_by_task("task-new").unwrap().input_seq, 3);
    drop(journal);
    // And so it replays.
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let open = journal.open_attempts();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].task_id, "task-new");
    assert_eq!(open[0].result, None);
}

#[test]
fn a_journal_reopened_often_is_compacted_on_open_and_stays_small() {
    let tmp = TempDir::new("reopen-compact");
    let log = tmp.path().join("w-1").join(LOG_FILE);
    let mut sizes = Vec::new();
    let mut seq = 0;
    for _ in 0..10 {
        let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
        sizes.push(fs::metadata(&log).unwrap().len());
        for _ in 0..5 {
            seq += 1;
            journal.admit(seq, &format!("t{seq}"), "a", None).unwrap();
            let task = format!("t{seq}");
            journal.save_result(seq, &task, &json!({"n": seq})).unwrap();
            journal.forget(seq, &task).unwrap();
        }
        // One attempt stays open across restarts.
        if seq == 5 {
            journal.admit(1000, "t-open", "a-open", None).unwrap();
        }
    }
    // Opened ten times, 50 attempts finished: the log holds only what is open after each
    // open, so its size does not grow with the restarts.
    let first_open = sizes[1];
    assert!(
        sizes[2..].iter().all(|&s| s <= first_open),
        "the log grows across restarts: {sizes:?}"
    );
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    assert_eq!(journal.open_attempts().len(), 1);
}

#[test]
fn a_parked_attempt_is_found_by_task_and_attempt_beside_a_newer_admission() {
    let tmp = TempDir::new("parked");
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    journal.admit(1, "task-a", "att-1", None).unwrap();
    journal
        .save_result(1, "task-a", &json!({"waiting": true}))
        .unwrap();
    journal.park(1, "task-a", &json!({"task": "a"})).unwrap();
    // The same task delivered again (a second copy of its input): a newer open record.
    journal.admit(2, "task-a", "att-2", None).unwrap();
    assert_eq!(journal.lookup_by_task("task-a").unwrap().input_seq, 2);
    assert_eq!(
        journal.lookup_attempt("task-a", "att-1").unwrap().input_seq,
        1
    );
    assert!(journal.lookup_attempt("task-a", "att-9").is_none());
    assert_eq!(journal.parked_count(), 1);
    drop(journal);
    // Parked survives a reopen (and its compaction).
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let parked = journal.lookup_attempt("task-a", "att-1").unwrap();
    assert_eq!(parked.task, Some(json!({"task": "a"})));
    assert_eq!(parked.result, Some(json!({"waiting": true})));
}

#[test]
fn a_parked_attempt_survives_the_reuse_of_its_sequence_by_another_task() {
    // The work stream was recreated: its sequences start over. Input 1 of task-a was acked
    // long ago and its attempt is parked waiting for an answer; a new input 1 of task-b must
    // not take its place.
    let tmp = TempDir::new("parked-reuse");
    let mut journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    journal.admit(1, "task-a", "att-a", None).unwrap();
    journal
        .save_result(1, "task-a", &json!({"state": "waiting"}))
        .unwrap();
    journal.park(1, "task-a", &json!({"task": "a"})).unwrap();
    let admission = journal.admit(1, "task-b", "att-b", None).unwrap();
    assert!(admission.new);
    assert_eq!(journal.lookup(1, "task-b").unwrap().attempt_id, "att-b");
    // Both live side by side, each under its own key, and each is settled on its own.
    journal
        .record_answer(1, "task-a", "m-1", &json!("yes"))
        .unwrap();
    journal
        .save_result(1, "task-b", &json!({"state": "completed"}))
        .unwrap();
    assert!(journal.forget(1, "task-b").unwrap());
    drop(journal);
    let journal = Journal::open_when_free(tmp.path(), "w-1").unwrap();
    let parked = journal.lookup_attempt("task-a", "att-a").unwrap();
    assert_eq!(parked.answers.len(), 1);
    assert_eq!(parked.task, Some(json!({"task": "a"})));
    assert!(journal.lookup(1, "task-b").is_none());
    assert_eq!(journal.parked_count(), 1);
}
