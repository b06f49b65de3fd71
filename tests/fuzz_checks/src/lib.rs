//! The assertions behind the fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer, nightly): one
//! `check_<target>(data)` per reader of bytes that come from the network or the disk. Each
//! panics when what must hold of its reader does not: a decoded value re-encodes to something
//! that decodes to the same value, a hand-written parser reads what serde (or async-nats)
//! reads, a parsed subject re-builds to the same subject, a journal replays to the same
//! attempts. Never panicking on any input is the least of it.
//!
//! They build on stable Rust, so `cargo test` replays the committed corpus and every crash the
//! fuzzer kept (`tests/replay.rs`); `scripts/fuzz.sh` runs the targets themselves.

mod audit;
mod bytes;
mod config;
mod envelope;
mod journal;
mod store_ack;
mod subjects;
mod task;

pub use audit::check_audit;
pub use config::check_config;
pub use envelope::{check_envelope_json, check_envelope_msgpack, check_envelope_spliced};
pub use journal::check_journal;
pub use store_ack::check_store_ack;
pub use subjects::check_subjects;
pub use task::{check_control, check_task, check_task_wire};

/// A fuzz target's check.
pub type Check = fn(&[u8]);

/// Every target, by the name of its `fuzz/fuzz_targets/<name>.rs` and its corpus directory
/// `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Check)] = &[
    ("envelope_json", check_envelope_json),
    ("envelope_msgpack", check_envelope_msgpack),
    ("envelope_spliced", check_envelope_spliced),
    ("task", check_task),
    ("task_wire", check_task_wire),
    ("control", check_control),
    ("subjects", check_subjects),
    ("store_ack", check_store_ack),
    ("audit", check_audit),
    ("journal", check_journal),
    ("config", check_config),
];
