//! Writes the seeds of the fuzz corpus (`fuzz/corpus/<target>/seed-*`): real envelopes, tasks,
//! answers, subjects, store acks, audit batches, journal logs and configs, as the protocol's
//! own tests and fixtures have them. Run by hand before fuzzing a new target:
//! `cargo test -p fuzz_checks --test seeds -- --ignored`, then `scripts/fuzz.sh` and
//! `cargo fuzz cmin` keep what adds coverage.

use std::fs;
use std::path::{Path, PathBuf};

use actors::journal::{Journal, LOG_FILE};
use protocol::audit::{AuditBatch, AuditEvent, Details};
use protocol::envelope::{decode, encode, Codec};
use protocol::task::TaskState;
use serde_json::json;

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    fs::create_dir_all(&dir).expect("the corpus directory");
    dir
}

fn write(target: &str, seeds: &[Vec<u8>]) {
    let dir = corpus(target);
    for (i, seed) in seeds.iter().enumerate() {
        fs::write(dir.join(format!("seed-{i:02}")), seed).expect("a seed is written");
    }
}

fn texts(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

const ENVELOPES: &[&str] = &[
    r#"{"meta":{"id":"m1","to":"bob"},"body":"hi"}"#,
    r#"{"meta":{"id":"m1","from":"alice","to":"bob","thread":"t1","ttl":{"secs":5}},"body":{"text":"hi","n":[1,2.5,-3]},"x":true}"#,
    r#"{"x":[1,2,{"y":null}],"meta":{"thread":"t","from":"mallory","id":"m2","to":"bob","expires_at":17},"body":{"a":1.5,"b":[true]},"z":"\u00e9"}"#,
    r#" { "body" : null , "meta" : { "id" : "m3" } } "#,
    r#"{"meta":{ "id":"m1","to":"bob","thread":"t 1" },"body":"hi"}"#,
    r#"{"meta":{"id":"m1","\u0066rom":"mallory"},"body":1}"#,
    r#"{"meta":{"id":"m1","x":"\"from\""},"body":1}"#,
    r#"{"meta":{"id":"m1"},"body":1,"body":2}"#,
    r#"{"meta":{"id":"m1","to":"bob","expires_at":1700000000000},"body":"later"}"#,
    r#"{"meta":{"id":"m1"},"body":{"bundle":[{"meta":{"id":"i1"},"body":1}]}}"#,
    r#"{"meta":{"id":"m1","to":"bob"},"body":{"n":1e5,"m":-0.25E-3,"big":18446744073709551615,"deep":[[[{}]]]}}"#,
];

#[test]
#[ignore = "writes the seeds of fuzz/corpus; run by hand"]
fn write_the_seeds() {
    write("envelope_json", &texts(ENVELOPES));
    write("envelope_spliced", &texts(ENVELOPES));
    let msgpack: Vec<Vec<u8>> = ENVELOPES
        .iter()
        .filter_map(|e| decode(e.as_bytes(), Codec::Json).ok())
        .map(|env| encode(&env, Codec::MsgPack).expect("an envelope encodes"))
        .collect();
    write("envelope_msgpack", &msgpack);

    write(
        "task",
        &texts(&[
            r#"{"version":1,"task_id":"review-42","text":"Review the plan.","context":["Do not deploy."]}"#,
            r#"{"version":1,"task_id":"t1","text":"go","idempotency_key":"k-1","expires_at":1700000000000,"context":null}"#,
            r#"{"version":2,"task_id":"t1","text":"  "}"#,
        ]),
    );
    write(
        "task_wire",
        &texts(&[
            r#"{"message_id":"ans-1","task_id":"t1","attempt_id":"a1","worker_id":"w1","tool_call_id":"call-1","responses":["yes",{"n":1}]}"#,
            r#"{"result":{"task_id":"t1","attempt_id":"a1","worker_id":"w1","state":"waiting","suspend":{"question":"ok?","tool_call_id":"call-1"},"answer_route":"answer.w1"}}"#,
            r#"{"result":{"task_id":"t1","attempt_id":"a1","worker_id":"w1","state":"failed","error":{"kind":"internal","detail":"boom"}}}"#,
            r#"{"status":{"event_id":"t1:a1:1:running","type":"state_changed","seq":1,"task_id":"t1","attempt_id":"a1","worker_id":"w1","state":"running","at_ms":1700000000000}}"#,
            r#"{"answer_refused":{"task_id":"t1","attempt_id":"a1","worker_id":"w1","answer_id":"ans-1","error":{"kind":"stale_answer","detail":"stale answer"}}}"#,
        ]),
    );
    write(
        "control",
        &texts(&[
            r#"{"task_id":"t1","attempt_id":"a1","worker_id":"w1"}"#,
            r#"{"state":"waiting","active":false,"suspend":{"question":"ok?","tool_call_id":"c1"},"cancel":"not_active"}"#,
            r#""requested""#,
            r#"{"worker_id":"w1"}"#,
            r#"{"work_stream":"HUB_WORK","queue_consumer":"queue-q","targeted_consumer":"worker-w","answers_stream":"HUB_ANSWERS","answer_consumer":"answers-w"}"#,
            r#"{"error":{"kind":"internal","detail":"x"}}"#,
        ]),
    );
    write(
        "subjects",
        &texts(&[
            "hub.pub.alice.inbox",
            "hub.pub.alice.task.bob.t1",
            "hub.pub.alice.news",
            "hub.pub.alice.work.q",
            "hub.pub.alice.work.q.w1",
            "hub.pub.alice.answer.w1",
            "channel.inbox.bob",
            "channel.task.bob.t1",
            "channel.news",
            "hub.delivery.bob.inbox",
            "hub.delivery.bob.task",
            "inbox-bob",
            "hub-router:alice:m1",
            "work.q.w1",
            "answer.w1",
            "queue-q",
            "worker-w1",
            "answers-w1",
            "hub.ctl.w1.query",
            "hub.ctl.w1.cancel.alice",
            "hub.work.q.join.w1",
            "$JS.ACK.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4",
            "$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-bob.2.17.9.1700000000000000000.4.tok",
            "_INBOX.abc.inbox-bob.3.7",
            "hub.admin.workers.tok",
        ]),
    );
    write(
        "store_ack",
        &texts(&[
            r#"{"stream":"HUB_INBOX","seq":17}"#,
            r#"{"stream":"HUB_INBOX","domain":"hub","seq":3,"duplicate":true}"#,
            r#"{"error":{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"}}"#,
            r#"{"error":{"code":400,"description":"a \"b\""}}"#,
            r#"{"stream":"S","seq":1,"duplicate":"yes"}"#,
        ]),
    );
    write("audit", &audit_seeds());
    write("journal", &journal_seeds());
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protocol/fixtures");
    let mut configs: Vec<Vec<u8>> = [
        "delivery-full.json",
        "delivery-subset.json",
        "delivery-wrong-key.json",
        "delivery-wrong-type.json",
    ]
    .iter()
    .map(|f| fs::read(fixtures.join(f)).expect("a config fixture"))
    .collect();
    configs.extend(texts(&[
        r#"{"inbox": {"storage": "memory", "replicas": 3, "consumer_replicas": 1}, "replicas": 3}"#,
        r#"{"inbox_max_deliver": -1, "inbox_backoff_secs": [1, 2, 3], "duplicate_window_secs": 60}"#,
    ]));
    write("config", &configs);
}

fn audit_seeds() -> Vec<Vec<u8>> {
    let routed = |i: u64| {
        AuditEvent::msg("routed", &format!("bob0-{i}"), 1_700_000_000_000 + i, "").details(
            Details {
                seq: Some(100_000 + i),
                ..Details::default()
            },
        )
    };
    let mut custom = routed(1);
    custom.event = "custom_event".into();
    custom.details = Details {
        kind: Some("inbox_full".into()),
        retry_after_secs: Some(3),
        state: Some(TaskState::Running),
        ..Details::default()
    };
    let task = AuditEvent::task("state_changed", "t1", 1_700_000_000_005, "")
        .attempt(2)
        .traced(Some(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ))
        .details(Details {
            state: Some(TaskState::Completed),
            duplicate: Some(true),
            reason: Some("done".into()),
            ..Details::default()
        });
    let batch = AuditBatch {
        actor: "router:r".into(),
        events: vec![routed(0), custom, task],
    };
    // An earlier version's batch: the name under `e`, details under their full names.
    let old = rmp_serde::to_vec_named(&json!({
        "a": "inbox:bob", "b": 1000,
        "v": [{"e": "fetched", "m": "m1", "t": 5, "d": {"stream_seq": 17}}],
    }))
    .expect("an old batch encodes");
    vec![batch.encode(), old]
}

fn journal_seeds() -> Vec<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("fuzz-seeds-journal-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    {
        let mut journal = Journal::open(&dir, "w").expect("a journal opens");
        journal.admit(1, "t1", "a1", Some("alice")).unwrap();
        journal
            .save_result(1, "t1", &json!({"state": "running"}))
            .unwrap();
        journal.admit(2, "t2", "a2", None).unwrap();
        journal
            .park(
                2,
                "t2",
                &json!({"version": 1, "task_id": "t2", "text": "ask"}),
            )
            .unwrap();
        journal
            .record_answer(2, "t2", "ans-1", &json!({"responses": ["yes"]}))
            .unwrap();
        journal
            .save_result(2, "t2", &json!({"state": "completed", "response": 1.5}))
            .unwrap();
        journal.admit(3, "t3", "a3", Some("bob")).unwrap();
        journal.forget(3, "t3").unwrap();
    }
    let log = fs::read(dir.join("w").join(LOG_FILE)).expect("the journal's log");
    let _ = fs::remove_dir_all(&dir);
    // Odd first byte: the log as it is; even: the records, their checksums put back by the check.
    let mut raw = vec![1];
    raw.extend_from_slice(&log);
    let mut sealed = vec![0];
    for line in log.split(|b| *b == b'\n').filter(|l| l.len() > 9) {
        sealed.extend_from_slice(&line[9..]);
        sealed.push(b'\n');
    }
    let mut torn = sealed.clone();
    torn.truncate(torn.len() - 5);
    vec![raw, sealed, torn]
}
