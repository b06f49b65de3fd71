//! The worker channel's wire types (`protocol::task`): submitted tasks, answers, task channel
//! bodies, control requests and replies, join requests and replies.

use std::fmt::Debug;

use protocol::ids::MessageId;
use protocol::task::{
    decode_task, decode_task_json, Answer, AnswerRefusal, CancelStatus, ControlRequest,
    JoinRequest, JoinResponse, QueryReply, TaskChannelBody, TaskSpec, TASK_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// A submitted task read strictly ([`decode_task_json`], what the router runs on the body of
/// every `hub.pub.<me>.work.<queue>`).
///
/// Asserts that a task it takes keeps its rules (version 1, a non-blank text, a valid
/// idempotency key) and re-encodes to JSON that it reads back as the same task, as does
/// `TaskSpec`'s `Deserialize`; that it agrees with that `Deserialize` wherever both read a
/// task; and that the derive takes nothing (one value per field) whose rules hold that the
/// strict decode refuses.
pub fn check_task(data: &[u8]) {
    let derived = serde_json::from_slice::<TaskSpec>(data);
    match decode_task_json(data) {
        Ok(task) => {
            assert_eq!(task.version, TASK_VERSION);
            assert!(!task.text.trim().is_empty(), "a blank text was taken");
            if let Some(key) = &task.idempotency_key {
                MessageId::validate(key).expect("the idempotency key is a valid message id");
            }
            let value = serde_json::to_value(&task).expect("a task serializes");
            assert_eq!(
                decode_task(&value).as_ref(),
                Ok(&task),
                "re-read as a value"
            );
            let bytes = serde_json::to_vec(&task).expect("a task serializes");
            assert_eq!(decode_task_json(&bytes).as_ref(), Ok(&task), "re-read");
            let back: TaskSpec = serde_json::from_slice(&bytes).expect("the derive reads it");
            assert_eq!(back, task, "the derive reads the re-encoded task otherwise");
            if let Ok(derived) = derived {
                assert_eq!(derived, task, "the derive and the strict decode differ");
            }
        }
        Err(error) => {
            let _ = (error.to_string(), error.to_wire());
            if let Ok(derived) = derived {
                let keeps_rules = derived.version == TASK_VERSION
                    && !derived.text.trim().is_empty()
                    && derived
                        .idempotency_key
                        .as_deref()
                        .is_none_or(|k| MessageId::validate(k).is_ok());
                assert!(
                    !keeps_rules,
                    "the strict decode refuses ({error}) a task the derive takes: {derived:?}"
                );
            }
        }
    }
}

/// What the router, the worker and the trackers read from a task channel and an answer
/// subject: [`Answer`], [`TaskChannelBody`] (results, statuses, answer refusals) and
/// [`AnswerRefusal`], each read with `serde_json` from the bytes (a worker's control and
/// intake) and from a [`Value`] (the router and the trackers read an envelope's body).
///
/// Asserts, for each type that reads the bytes, that reading the bytes and reading their
/// [`Value`] agree (where the bytes are JSON text: `serde_json` skips an unknown field without
/// checking its string's UTF-8 or escapes), and that the value re-encodes to JSON that reads back the same; and that a
/// task channel body names the task and worker of the result, status or refusal it holds.
pub fn check_task_wire(data: &[u8]) {
    round_trip::<Answer>(data);
    round_trip::<AnswerRefusal>(data);
    if let Some(body) = round_trip::<TaskChannelBody>(data) {
        let (task_id, worker_id) = match &body {
            TaskChannelBody::Result(r) => (&r.task_id, &r.worker_id),
            TaskChannelBody::Status(s) => (&s.task_id, &s.worker_id),
            TaskChannelBody::AnswerRefused(a) => (&a.task_id, &a.worker_id),
        };
        assert_eq!((body.task_id(), body.worker_id()), (task_id, worker_id));
        assert!(body.is_from(Some(worker_id.as_str())));
        assert!(!body.is_from(None));
    }
}

/// The bodies of the worker channel's requests and replies: [`ControlRequest`] (a worker's
/// control subjects), [`QueryReply`] and [`CancelStatus`] (what a requester reads back),
/// [`JoinRequest`] (the router's join handler) and [`JoinResponse`] (the worker's join).
///
/// Asserts what [`check_task_wire`] asserts, for each of these types.
pub fn check_control(data: &[u8]) {
    round_trip::<ControlRequest>(data);
    round_trip::<QueryReply>(data);
    round_trip::<CancelStatus>(data);
    round_trip::<JoinRequest>(data);
    round_trip::<JoinResponse>(data);
}

/// `data` read as a `T`, when it is one: read from the bytes and from their [`Value`] alike,
/// and read back the same from its own JSON.
fn round_trip<T>(data: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let read: T = serde_json::from_slice(data).ok()?;
    let name = std::any::type_name::<T>();
    // `serde_json` skips an unknown field's string without checking it (its UTF-8, its
    // escapes): only bytes that are JSON text have a `Value` to compare with.
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        match serde_json::from_value::<T>(value) {
            Ok(from_value) => assert_eq!(from_value, read, "{name} from its value differs"),
            Err(e) => panic!("a {name} read from the bytes is refused from their value: {e}"),
        }
    }
    let bytes = serde_json::to_vec(&read).unwrap_or_else(|e| panic!("{name} serializes: {e}"));
    let back: T = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("a {name} does not read its own JSON back: {e}"));
    assert_eq!(back, read, "{name} changed through its JSON");
    Some(read)
}
