//! Parsing with errors that name the dotted key.
//!
//! The text is parsed to a [`Value`] first, and the key sets are checked by
//! walking it against the serialized defaults, so an unknown or mistyped key
//! is reported with its full path. Only then is it deserialized.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{ConfigError, DeliveryConfig};

impl DeliveryConfig {
    /// Parses and validates a delivery config. Missing keys keep their
    /// defaults.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::Syntax`] if `json` is not a JSON object;
    /// - [`ConfigError::UnknownKey`] for a key the config does not have;
    /// - [`ConfigError::WrongType`] for a value of the wrong type;
    /// - [`ConfigError::Invalid`] if [`DeliveryConfig::validate`] fails.
    pub fn from_json_str(json: &str) -> Result<DeliveryConfig, ConfigError> {
        let value: Value = serde_json::from_str(json).map_err(|e| ConfigError::Syntax {
            reason: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(ConfigError::Syntax {
                reason: format!("expected an object, found {}", type_name(&value)),
            });
        }
        let config = deserialize(&value)?;
        config.validate()?;
        Ok(config)
    }
}

fn deserialize(value: &Value) -> Result<DeliveryConfig, ConfigError> {
    let template = serde_json::to_value(DeliveryConfig::default())
        .expect("the default delivery config serializes to json");
    check_keys(value, &template, "")?;
    DeliveryConfig::deserialize(value).map_err(|error| {
        // Deserialize each key on its own to find which one is mistyped.
        leaves(value, "")
            .into_iter()
            .find_map(|(key, alone)| {
                serde_json::from_value::<DeliveryConfig>(alone)
                    .err()
                    .map(|error| ConfigError::WrongType {
                        key,
                        reason: error.to_string(),
                    })
            })
            .unwrap_or_else(|| ConfigError::Syntax {
                reason: error.to_string(),
            })
    })
}

/// Rejects any key of `value` that `template` does not have, and any
/// section that is not an object.
fn check_keys(value: &Value, template: &Value, path: &str) -> Result<(), ConfigError> {
    let (Value::Object(value), Value::Object(template)) = (value, template) else {
        return Err(ConfigError::WrongType {
            key: path.to_owned(),
            reason: format!("expected an object, found {}", type_name(value)),
        });
    };
    for (key, child) in value {
        let key_path = join(path, key);
        match template.get(key) {
            None => return Err(ConfigError::UnknownKey { key: key_path }),
            Some(section @ Value::Object(_)) => check_keys(child, section, &key_path)?,
            Some(_) => {}
        }
    }
    Ok(())
}

/// Every leaf of `value` as its dotted key and a config holding only it.
fn leaves(value: &Value, path: &str) -> Vec<(String, Value)> {
    let Value::Object(map) = value else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (key, child) in map {
        let key_path = join(path, key);
        let nested = match child {
            Value::Object(_) => leaves(child, &key_path),
            _ => vec![(key_path, child.clone())],
        };
        for (leaf_path, alone) in nested {
            let mut wrapper = Map::new();
            wrapper.insert(key.clone(), alone);
            found.push((leaf_path, Value::Object(wrapper)));
        }
    }
    found
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
