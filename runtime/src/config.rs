//! Loading the delivery config file (`--delivery-config FILE` / `NATS_HUB_DELIVERY_CONFIG`).
//!
//! Parsing and validation are [`protocol::config`]'s; this module only reads the file and adds
//! its path to the error.

use std::path::{Path, PathBuf};

use protocol::config::{ConfigError, DeliveryConfig};

/// Why a delivery config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLoadError {
    /// The file could not be read.
    #[error("cannot read delivery config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file's content is invalid (unknown key, wrong type, bad value).
    #[error("delivery config {path}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        source: ConfigError,
    },
}

/// Loads `path`, or returns the defaults when `None`.
///
/// # Errors
/// [`ConfigLoadError::Read`] or [`ConfigLoadError::Invalid`].
pub fn load_delivery_config(path: Option<&Path>) -> Result<DeliveryConfig, ConfigLoadError> {
    let Some(path) = path else {
        return Ok(DeliveryConfig::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigLoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    DeliveryConfig::from_json_str(&text).map_err(|source| ConfigLoadError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../protocol/fixtures")
            .join(name)
    }

    #[test]
    fn no_file_means_defaults() {
        assert_eq!(
            load_delivery_config(None).unwrap(),
            DeliveryConfig::default()
        );
    }

    #[test]
    fn subset_file_loads() {
        let cfg = load_delivery_config(Some(&fixture("delivery-subset.json"))).unwrap();
        assert_ne!(cfg, DeliveryConfig::default());
    }

    #[test]
    fn wrong_key_names_the_key_and_the_file() {
        let err = load_delivery_config(Some(&fixture("delivery-wrong-key.json"))).unwrap_err();
        assert!(matches!(
            err,
            ConfigLoadError::Invalid {
                source: ConfigError::UnknownKey { .. },
                ..
            }
        ));
        assert!(err.to_string().contains("delivery-wrong-key.json"));
    }

    #[test]
    fn missing_file_is_a_read_error() {
        assert!(matches!(
            load_delivery_config(Some(Path::new("/nonexistent/delivery.json"))),
            Err(ConfigLoadError::Read { .. })
        ));
    }
}
