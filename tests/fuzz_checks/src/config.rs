//! The durable delivery config (`protocol::config`, `--delivery-config <file.json>`).

use protocol::config::{DeliveryConfig, REPLICAS};

/// A delivery config file read by [`DeliveryConfig::from_json_str`] (a file that is not UTF-8
/// is refused before it is parsed).
///
/// Asserts that what it takes validates, keeps the rules [`DeliveryConfig::validate`] names
/// (replicas, stream names that differ, a duplicate window within every finite retention) and
/// yields its durations and limits without panicking; that it re-serializes, compact and
/// pretty, to JSON that parses to the same config; that it agrees with `DeliveryConfig`'s own
/// `Deserialize` wherever both take the file; and that what it refuses has an error message.
pub fn check_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match DeliveryConfig::from_json_str(text) {
        Ok(config) => config,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    config.validate().expect("a parsed config validates");
    assert!(REPLICAS.contains(&config.replicas));
    assert!(REPLICAS.contains(&config.inbox_replicas()));
    assert!((1..=config.inbox_replicas()).contains(&config.inbox_consumer_replicas()));
    let names = [&config.ingress.name, &config.inbox.name, &config.tasks.name];
    assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2]);
    for max_age in [
        config.ingress.max_age(),
        config.inbox.max_age(),
        config.tasks.max_age(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(config.duplicate_window() <= max_age);
    }
    let _ = (
        config.inbox_backoff(),
        config.sender_rate(),
        config.presence_beat(),
        config.ack_wait(),
        config.inbox_inactive(),
        config.router_max_deliver_limit(),
        config.router_max_ack_pending_limit(),
        config.inbox_max_ack_pending_limit(),
        config.inbox.max_msgs_per_subject_limit(),
        config.inbox.max_bytes_limit(),
        config.inbox.trim_interval(),
        config.inbox.max_msgs_limit(),
        config.inbox.max_msg_size_limit(),
        config.tasks.max_msgs_per_subject_limit(),
    );
    for written in [
        serde_json::to_string(&config),
        serde_json::to_string_pretty(&config),
    ] {
        let written = written.expect("a config serializes");
        assert_eq!(
            DeliveryConfig::from_json_str(&written).as_ref(),
            Ok(&config),
            "the config changed through {written}"
        );
    }
    if let Ok(derived) = serde_json::from_str::<DeliveryConfig>(text) {
        assert_eq!(derived, config, "the derive reads another config");
    }
}
