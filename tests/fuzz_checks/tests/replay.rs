//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) and every crash the fuzzer kept
//! (`fuzz/artifacts/<target>/`) through the target's check, so that an ordinary `cargo test`
//! runs them. A target without a corpus fails: the corpus is what this test is for.
//!
//! A crash whose bug is still open is kept in `fuzz/findings/<target>/` instead, and must still
//! fail its check: once the bug is fixed, that test says so, and the input moves to
//! `fuzz/artifacts/<target>/`, where it must pass from then on.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use fuzz_checks::{Check, TARGETS};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `check` on every file; the failures, by file. On a thread of a fuzzer's stack (the
/// main thread's 8 MiB and more): unoptimized, a MessagePack value nested a thousand deep
/// takes more than a test thread's 2 MiB to read.
fn replay(check: Check, inputs: &[PathBuf]) -> Vec<String> {
    let inputs = inputs.to_vec();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || replay_here(check, &inputs))
        .expect("a replay thread")
        .join()
        .expect("the replay thread ends")
}

fn replay_here(check: Check, inputs: &[PathBuf]) -> Vec<String> {
    let mut failed = Vec::new();
    for path in inputs {
        let data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| check(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            failed.push(format!("{}: {why}", path.display()));
        }
    }
    failed
}

#[test]
fn every_target_has_a_fuzz_target_and_a_corpus() {
    let fuzz = fuzz_dir();
    for (name, _) in TARGETS {
        let target = fuzz.join("fuzz_targets").join(format!("{name}.rs"));
        assert!(target.is_file(), "no fuzz target {}", target.display());
        let corpus = fuzz.join("corpus").join(name);
        assert!(
            !files(&corpus).is_empty(),
            "the corpus of {name} ({}) is missing or empty",
            corpus.display()
        );
    }
    let listed = files(&fuzz.join("fuzz_targets")).len();
    assert_eq!(listed, TARGETS.len(), "a fuzz target without a check");
}

#[test]
fn the_corpus_and_the_crashes_pass_their_checks() {
    let fuzz = fuzz_dir();
    let mut failed = Vec::new();
    let mut replayed = 0;
    for (name, check) in TARGETS {
        let corpus = files(&fuzz.join("corpus").join(name));
        assert!(
            !corpus.is_empty(),
            "the corpus of {name} is missing or empty"
        );
        let crashes = files(&fuzz.join("artifacts").join(name));
        replayed += corpus.len() + crashes.len();
        failed.extend(replay(*check, &corpus));
        failed.extend(replay(*check, &crashes));
    }
    assert!(
        failed.is_empty(),
        "{} of {replayed} inputs fail:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn the_open_findings_still_fail_their_checks() {
    let fuzz = fuzz_dir();
    for (name, check) in TARGETS {
        for path in files(&fuzz.join("findings").join(name)) {
            let passed = replay(*check, std::slice::from_ref(&path)).is_empty();
            assert!(
                !passed,
                "{} passes its check now: the bug is fixed, move it to fuzz/artifacts/{name}/",
                path.display()
            );
        }
    }
}
