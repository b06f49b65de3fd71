use std::time::Duration;

use serde_json::Value;

use super::*;

const FULL: &str = include_str!("../../fixtures/delivery-full.json");
const SUBSET: &str = include_str!("../../fixtures/delivery-subset.json");
const WRONG_KEY: &str = include_str!("../../fixtures/delivery-wrong-key.json");
const WRONG_TYPE: &str = include_str!("../../fixtures/delivery-wrong-type.json");

fn parse(json: &str) -> Result<DeliveryConfig, ConfigError> {
    DeliveryConfig::from_json_str(json)
}

fn invalid_key(json: &str) -> String {
    match parse(json) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected an invalid value in {json}, got {other:?}"),
    }
}

#[test]
fn default_matches_the_design() {
    let expected = DeliveryConfig {
        ingress: IngressStreamConfig {
            name: "HUB_INGRESS".into(),
            max_age_secs: 86_400,
        },
        inbox: InboxStreamConfig {
            name: "HUB_INBOX".into(),
            max_age_secs: 604_800,
            max_msgs_per_subject: 10_000,
            max_bytes: -1,
            max_msgs: -1,
            max_msg_size: -1,
            max_consumers: 100_000,
            replicas: None,
            consumer_replicas: None,
            storage: StorageKind::File,
            trim_interval_secs: 60,
        },
        tasks: TasksStreamConfig {
            name: "HUB_TASKS".into(),
            max_age_secs: 86_400,
            max_msgs_per_subject: 10_000,
            work_max_consumers: 100_000,
        },
        duplicate_window_secs: 120,
        router_consumer: "router".into(),
        ack_wait_secs: 30,
        router_max_deliver: -1,
        router_max_ack_pending: 1000,
        inbox_max_ack_pending: 256,
        inbox_inactive_secs: 604_800,
        expiry_grace_secs: 60,
        inbox_max_deliver: 6,
        inbox_backoff_secs: vec![5, 15, 60, 300, 900],
        sender_rate_per_min: -1,
        presence_beat_secs: 20,
        task_max_deliver: 20,
        answer_max_wait_secs: 3600,
        consumer_watchdog_secs: 10,
        audit_events: true,
        replicas: 1,
    };
    assert_eq!(DeliveryConfig::default(), expected);
    DeliveryConfig::default().validate().unwrap();
    assert_eq!(parse("{}").unwrap(), expected);
}

#[test]
fn full_fixture_sets_every_key() {
    let config = parse(FULL).unwrap();
    let expected = DeliveryConfig {
        ingress: IngressStreamConfig {
            name: "T1_INGRESS".into(),
            max_age_secs: 172_800,
        },
        inbox: InboxStreamConfig {
            name: "T1_INBOX".into(),
            max_age_secs: 1_209_600,
            max_msgs_per_subject: 5000,
            max_bytes: 1_073_741_824,
            max_msgs: 1_000_000,
            max_msg_size: 2_097_152,
            max_consumers: 20_000,
            replicas: Some(3),
            consumer_replicas: Some(2),
            storage: StorageKind::Memory,
            trim_interval_secs: 30,
        },
        tasks: TasksStreamConfig {
            name: "T1_TASKS".into(),
            max_age_secs: 43_200,
            max_msgs_per_subject: 2000,
            work_max_consumers: 5000,
        },
        duplicate_window_secs: 300,
        router_consumer: "t1-router".into(),
        ack_wait_secs: 45,
        router_max_deliver: 20,
        router_max_ack_pending: 500,
        inbox_max_ack_pending: 64,
        inbox_inactive_secs: 86_400,
        expiry_grace_secs: 30,
        inbox_max_deliver: 4,
        inbox_backoff_secs: vec![1, 2],
        sender_rate_per_min: 600,
        presence_beat_secs: 10,
        task_max_deliver: 5,
        answer_max_wait_secs: 600,
        consumer_watchdog_secs: 0,
        audit_events: false,
        replicas: 2,
    };
    assert_eq!(config, expected);
    // The fixture has every key: it is exactly the serialized config.
    let fixture: Value = serde_json::from_str(FULL).unwrap();
    assert_eq!(serde_json::to_value(&config).unwrap(), fixture);
    // And every value differs from its default.
    let defaults = serde_json::to_value(DeliveryConfig::default()).unwrap();
    for (section, value) in fixture.as_object().unwrap() {
        match value {
            Value::Object(keys) => {
                for (key, value) in keys {
                    assert_ne!(&defaults[section][key], value, "{section}.{key}");
                }
            }
            _ => assert_ne!(&defaults[section], value, "{section}"),
        }
    }
}

#[test]
fn subset_fixture_keeps_defaults_for_the_rest() {
    let config = parse(SUBSET).unwrap();
    let mut expected = DeliveryConfig::default();
    expected.inbox.max_age_secs = 86_400;
    expected.inbox.storage = StorageKind::Memory;
    expected.tasks.max_msgs_per_subject = -1;
    expected.ack_wait_secs = 10;
    assert_eq!(config, expected);
}

#[test]
fn wrong_key_fixture_names_the_dotted_key() {
    let err = parse(WRONG_KEY).unwrap_err();
    assert_eq!(
        err,
        ConfigError::UnknownKey {
            key: "inbox.max_age".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "unknown key `inbox.max_age` in delivery config"
    );
    assert_eq!(
        parse(r#"{"replica": 3}"#),
        Err(ConfigError::UnknownKey {
            key: "replica".into()
        })
    );
}

#[test]
fn wrong_type_fixture_names_the_key() {
    match parse(WRONG_TYPE).unwrap_err() {
        ConfigError::WrongType { key, reason } => {
            assert_eq!(key, "ack_wait_secs");
            assert!(reason.contains("string \"30\""), "{reason}");
        }
        other => panic!("expected a wrong type, got {other:?}"),
    }
    for (json, key) in [
        (r#"{"inbox": {"storage": "disk"}}"#, "inbox.storage"),
        (r#"{"inbox": {"replicas": 1.5}}"#, "inbox.replicas"),
        (r#"{"replicas": "3"}"#, "replicas"),
        (
            r#"{"tasks": {"max_msgs_per_subject": null}}"#,
            "tasks.max_msgs_per_subject",
        ),
        (r#"{"ingress": []}"#, "ingress"),
        (r#"{"router_consumer": 7}"#, "router_consumer"),
        (r#"{"duplicate_window_secs": -1}"#, "duplicate_window_secs"),
    ] {
        assert!(
            matches!(parse(json), Err(ConfigError::WrongType { key: ref k, .. }) if k == key),
            "{json}: {:?}",
            parse(json)
        );
    }
}

#[test]
fn syntax_errors() {
    assert!(matches!(parse("{"), Err(ConfigError::Syntax { .. })));
    assert!(matches!(parse("[]"), Err(ConfigError::Syntax { .. })));
    assert!(matches!(parse(""), Err(ConfigError::Syntax { .. })));
}

#[test]
fn invalid_values_name_the_key() {
    for (json, key) in [
        (r#"{"ingress": {"name": "HUB.INGRESS"}}"#, "ingress.name"),
        (r#"{"inbox": {"name": ""}}"#, "inbox.name"),
        (r#"{"tasks": {"name": "HUB_INBOX"}}"#, "tasks.name"),
        (r#"{"router_consumer": "router>"}"#, "router_consumer"),
        (
            r#"{"ingress": {"max_age_secs": 0}}"#,
            "ingress.max_age_secs",
        ),
        (r#"{"tasks": {"max_age_secs": -2}}"#, "tasks.max_age_secs"),
        (r#"{"ack_wait_secs": 0}"#, "ack_wait_secs"),
        (r#"{"duplicate_window_secs": 0}"#, "duplicate_window_secs"),
        (r#"{"ack_wait_secs": 9223372037}"#, "ack_wait_secs"),
        (r#"{"inbox_inactive_secs": 0}"#, "inbox_inactive_secs"),
        (
            r#"{"inbox": {"max_age_secs": 60}}"#,
            "duplicate_window_secs",
        ),
        (r#"{"inbox": {"replicas": 0}}"#, "inbox.replicas"),
        (r#"{"inbox": {"max_consumers": -1}}"#, "inbox.max_consumers"),
        (r#"{"inbox": {"max_consumers": 0}}"#, "inbox.max_consumers"),
        (
            r#"{"inbox": {"max_consumers": 2147483648}}"#,
            "inbox.max_consumers",
        ),
        (
            r#"{"tasks": {"work_max_consumers": 0}}"#,
            "tasks.work_max_consumers",
        ),
        (
            r#"{"tasks": {"work_max_consumers": 2147483648}}"#,
            "tasks.work_max_consumers",
        ),
        (r#"{"inbox": {"replicas": 6}}"#, "inbox.replicas"),
        (r#"{"replicas": 0}"#, "replicas"),
        (r#"{"replicas": 6}"#, "replicas"),
        (
            r#"{"inbox": {"consumer_replicas": 0}}"#,
            "inbox.consumer_replicas",
        ),
        (
            r#"{"inbox": {"consumer_replicas": 2}}"#,
            "inbox.consumer_replicas",
        ),
        (
            r#"{"replicas": 3, "inbox": {"replicas": 1, "consumer_replicas": 3}}"#,
            "inbox.consumer_replicas",
        ),
        (r#"{"inbox": {"max_bytes": 0}}"#, "inbox.max_bytes"),
        (r#"{"inbox": {"max_msgs": -5}}"#, "inbox.max_msgs"),
        (r#"{"inbox": {"max_msg_size": 0}}"#, "inbox.max_msg_size"),
        (
            r#"{"inbox": {"max_msg_size": 4294967296}}"#,
            "inbox.max_msg_size",
        ),
        (
            r#"{"inbox": {"max_msgs_per_subject": 0}}"#,
            "inbox.max_msgs_per_subject",
        ),
        (
            r#"{"tasks": {"max_msgs_per_subject": 0}}"#,
            "tasks.max_msgs_per_subject",
        ),
        (r#"{"router_max_deliver": 0}"#, "router_max_deliver"),
        (r#"{"router_max_ack_pending": 0}"#, "router_max_ack_pending"),
        (r#"{"inbox_max_ack_pending": -2}"#, "inbox_max_ack_pending"),
        (r#"{"sender_rate_per_min": 0}"#, "sender_rate_per_min"),
        (r#"{"presence_beat_secs": 0}"#, "presence_beat_secs"),
        (r#"{"task_max_deliver": 0}"#, "task_max_deliver"),
        (r#"{"task_max_deliver": 1}"#, "task_max_deliver"),
        (r#"{"answer_max_wait_secs": 0}"#, "answer_max_wait_secs"),
        (
            r#"{"consumer_watchdog_secs": 99999999999}"#,
            "consumer_watchdog_secs",
        ),
        (
            r#"{"sender_rate_per_min": 4294967296}"#,
            "sender_rate_per_min",
        ),
    ] {
        assert_eq!(invalid_key(json), key, "{json}");
    }
    assert_eq!(
        parse(r#"{"inbox": {"replicas": 7}}"#)
            .unwrap_err()
            .to_string(),
        "invalid value for `inbox.replicas` in delivery config: must be between 1 and 5, got 7"
    );
}

#[test]
fn an_inbox_consumer_takes_its_stream_s_replicas_unless_told_fewer() {
    let like_stream = parse(r#"{"replicas": 3}"#).unwrap();
    assert_eq!(like_stream.inbox_consumer_replicas(), 3);
    let own_stream = parse(r#"{"replicas": 3, "inbox": {"replicas": 5}}"#).unwrap();
    assert_eq!(own_stream.inbox_consumer_replicas(), 5);
    let fewer = parse(r#"{"replicas": 3, "inbox": {"consumer_replicas": 1}}"#).unwrap();
    assert_eq!(fewer.inbox_consumer_replicas(), 1);
    assert_eq!(fewer.inbox_replicas(), 3);
}

#[test]
fn unlimited_values_are_accepted() {
    let config = parse(
        r#"{
            "ingress": {"max_age_secs": -1},
            "inbox": {"max_age_secs": -1, "max_msgs_per_subject": -1},
            "tasks": {"max_age_secs": -1},
            "duplicate_window_secs": 100000,
            "router_max_ack_pending": -1,
            "inbox_max_ack_pending": -1,
            "inbox_inactive_secs": -1
        }"#,
    )
    .unwrap();
    assert_eq!(config.ingress.max_age(), None);
    assert_eq!(config.inbox.max_msgs_per_subject_limit(), None);
    assert_eq!(config.router_max_ack_pending_limit(), None);
    assert_eq!(config.inbox_max_ack_pending_limit(), None);
    assert_eq!(config.inbox_inactive(), None);
}

#[test]
fn helpers_convert_limits_and_durations() {
    assert_eq!(limit(-1), None);
    assert_eq!(limit(0), Some(0));
    assert_eq!(limit(42), Some(42));
    assert_eq!(seconds(-1), None);
    assert_eq!(seconds(3), Some(Duration::from_secs(3)));
    let config = parse(FULL).unwrap();
    assert_eq!(config.duplicate_window(), Duration::from_secs(300));
    assert_eq!(config.ack_wait(), Duration::from_secs(45));
    assert_eq!(config.inbox_inactive(), Some(Duration::from_secs(86_400)));
    assert_eq!(config.router_max_deliver_limit(), Some(20));
    assert_eq!(config.router_max_ack_pending_limit(), Some(500));
    assert_eq!(config.inbox_max_ack_pending_limit(), Some(64));
    assert_eq!(config.ingress.max_age(), Some(Duration::from_secs(172_800)));
    assert_eq!(config.inbox.max_age(), Some(Duration::from_secs(1_209_600)));
    assert_eq!(config.inbox.max_bytes_limit(), Some(1_073_741_824));
    assert_eq!(config.inbox.max_msgs_limit(), Some(1_000_000));
    assert_eq!(config.inbox.max_msg_size_limit(), Some(2_097_152));
    assert_eq!(config.inbox.max_msgs_per_subject_limit(), Some(5000));
    assert_eq!(config.tasks.max_age(), Some(Duration::from_secs(43_200)));
    assert_eq!(config.tasks.max_msgs_per_subject_limit(), Some(2000));
    assert_eq!(DeliveryConfig::default().router_max_deliver_limit(), None);
    assert_eq!(StorageKind::Memory.to_string(), "memory");
}

#[test]
fn serde_round_trips_and_rejects_unknown_keys() {
    let config = parse(FULL).unwrap();
    let json = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<DeliveryConfig>(&json).unwrap(),
        config
    );
    assert!(serde_json::from_str::<DeliveryConfig>(r#"{"inbox": {"max_age": 1}}"#).is_err());
}
