//! Strict decoding of a submitted task.

use serde_json::{Map, Value};

use super::{TaskError, TaskSpec, TASK_VERSION};
use crate::ids::{MessageId, TaskId};

/// The fields a version-1 task may carry.
const FIELDS: [&str; 6] = [
    "version",
    "task_id",
    "text",
    "context",
    "idempotency_key",
    "expires_at",
];

/// Decodes a task body strictly.
///
/// Checks, in order: the body is an object; it has no unknown field;
/// `version` is [`TASK_VERSION`]; `task_id` is a valid [`TaskId`]; `text` is
/// a non-blank string; `context` (optional, `null` = absent) is an array of
/// strings; `idempotency_key` (optional) follows the [`MessageId`] rules;
/// `expires_at` (optional) is unix milliseconds.
///
/// # Errors
///
/// Returns the [`TaskError`] of the first check that fails.
pub fn decode_task(body: &Value) -> Result<TaskSpec, TaskError> {
    let Value::Object(map) = body else {
        return Err(TaskError::Malformed {
            reason: "a task is a json object".to_owned(),
        });
    };
    if let Some(field) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(TaskError::UnknownField {
            field: field.clone(),
        });
    }
    let version = match required(map, "version")? {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| invalid("version", "not an integer"))?,
        _ => return Err(invalid("version", "not an integer")),
    };
    if version != u64::from(TASK_VERSION) {
        return Err(TaskError::WrongVersion { found: version });
    }
    let task_id = TaskId::new(string(required(map, "task_id")?, "task_id")?)
        .map_err(|e| invalid("task_id", &e.to_string()))?;
    let text = string(required(map, "text")?, "text")?;
    if text.trim().is_empty() {
        return Err(TaskError::BlankText);
    }
    let context = match optional(map, "context") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| string(item, "context").map(str::to_owned))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("context", "not an array of strings")),
    };
    let idempotency_key = match optional(map, "idempotency_key") {
        None => None,
        Some(value) => {
            let key = string(value, "idempotency_key")?;
            MessageId::validate(key).map_err(|e| invalid("idempotency_key", &e.to_string()))?;
            Some(key.to_owned())
        }
    };
    let expires_at = match optional(map, "expires_at") {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .ok_or_else(|| invalid("expires_at", "not unix milliseconds"))?,
        ),
    };
    Ok(TaskSpec {
        version: TASK_VERSION,
        task_id,
        text: text.to_owned(),
        context,
        idempotency_key,
        expires_at,
    })
}

/// Parses `payload` as exactly one JSON value, then [`decode_task`]s it.
///
/// # Errors
///
/// [`TaskError::Malformed`] if `payload` is not a single JSON value
/// (trailing values are refused), else as [`decode_task`].
pub fn decode_task_json(payload: &[u8]) -> Result<TaskSpec, TaskError> {
    let value: Value = serde_json::from_slice(payload).map_err(|e| TaskError::Malformed {
        reason: e.to_string(),
    })?;
    decode_task(&value)
}

fn required<'a>(map: &'a Map<String, Value>, field: &'static str) -> Result<&'a Value, TaskError> {
    optional(map, field).ok_or(TaskError::MissingField { field })
}

fn optional<'a>(map: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    map.get(field).filter(|v| !v.is_null())
}

fn string<'a>(value: &'a Value, field: &'static str) -> Result<&'a str, TaskError> {
    value.as_str().ok_or_else(|| invalid(field, "not a string"))
}

fn invalid(field: &'static str, reason: &str) -> TaskError {
    TaskError::InvalidField {
        field,
        reason: reason.to_owned(),
    }
}
