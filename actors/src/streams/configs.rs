//! The hub's stream configurations, derived from the delivery config ([`stream_configs`]).

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use protocol::config::{DeliveryConfig, StorageKind};
use protocol::subjects;

/// The three stream configurations the runtime needs, derived from the delivery config.
///
/// - ingress (`hub.pub.>`): work-queue retention, so a routed (acked) envelope is removed; its
///   only consumer is the shared router consumer.
/// - inbox (`channel.inbox.>`): limits retention with the configured limits, discarding new
///   messages (per subject too): a DM past a limit is refused, never an older one dropped.
/// - tasks (`channel.task.>`): limits retention with the configured limits.
/// - work (`work.>`) and answers (`answer.>`): work-queue retention, max age of the tasks.
/// - schedules (`hub.sched.>`): the DMs' deadline checks, as nats-server message schedules
///   (`allow_msg_schedules`; nats-server 2.12+) and what they fire; work-queue retention, max
///   age of the inbox.
/// - advisories (the broker's termination and max-deliveries advisories of inbox deliveries):
///   work-queue retention, max age of the ingress.
/// - dead letters (`dlq.>`): limits retention, max age of the inbox.
/// - audit (`hub.audit.>`): the audit trail's event batches; limits retention, max age of the
///   inbox.
///
/// Every stream gets the configured duplicate window and `replicas` (the inbox
/// `inbox.replicas` when set); inbox and tasks allow per-message TTL.
/// An unlimited max age (`-1`) is JetStream's 0.
pub fn stream_configs(cfg: &DeliveryConfig) -> [Config; 9] {
    let dup = cfg.duplicate_window();
    let ingress = Config {
        name: cfg.ingress.name.clone(),
        subjects: vec![subjects::INGRESS_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.ingress.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        discard: DiscardPolicy::Old,
        // Workers read it for a result stored here but not routed yet (`hub.pub.*.task.<delegator>.<key>`)
        // before they run a task. A direct get's reply carries `Nats-Stream` headers, which
        // the replay guard drops should one be aimed back at the ingress.
        allow_direct: true,
        ..Default::default()
    };
    let inbox = Config {
        name: cfg.inbox.name.clone(),
        subjects: vec![subjects::INBOX_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        max_messages_per_subject: cfg.inbox.max_msgs_per_subject,
        // A full inbox (or a full stream) refuses the new DM, which the router reports to its
        // sender as `inbox_full`; nothing stored is dropped to make room.
        discard: DiscardPolicy::New,
        discard_new_per_subject: cfg.inbox.max_msgs_per_subject > 0,
        max_bytes: cfg.inbox.max_bytes,
        max_messages: cfg.inbox.max_msgs,
        max_message_size: i32::try_from(cfg.inbox.max_msg_size).unwrap_or(i32::MAX),
        // Its own limit: one consumer per agent, past the broker's default (1,000 since
        // nats-server 2.15, for a stream that sets none).
        max_consumers: i32::try_from(cfg.inbox.max_consumers).unwrap_or(i32::MAX),
        num_replicas: cfg.inbox_replicas(),
        storage: match cfg.inbox.storage {
            StorageKind::File => StorageType::File,
            StorageKind::Memory => StorageType::Memory,
        },
        duplicate_window: dup,
        allow_message_ttl: true,
        allow_direct: true,
        ..Default::default()
    };
    let tasks = Config {
        name: cfg.tasks.name.clone(),
        subjects: vec![subjects::TASKS_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.tasks.max_age().unwrap_or_default(),
        max_messages_per_subject: cfg.tasks.max_msgs_per_subject,
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        allow_message_ttl: true,
        allow_direct: true,
        ..Default::default()
    };
    // Work and answers: work-queue retention (an acked task or answer is removed), kept as long
    // as the task channels. Their consumers' filters never overlap (`work.<queue>` vs
    // `work.*.<worker>`; `answer.<worker>` per worker), as a work queue requires.
    let work = Config {
        name: subjects::WORK_STREAM.to_string(),
        subjects: vec![subjects::WORK_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.tasks.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        // A dead-lettered input is read back by sequence (only routers may).
        allow_direct: true,
        // Its own limit: a consumer per queue and per pinned worker (and on the answers
        // stream, per worker), past the broker's default of 1,000 for a stream that sets none.
        max_consumers: i32::try_from(cfg.tasks.work_max_consumers).unwrap_or(i32::MAX),
        ..Default::default()
    };
    let answers = Config {
        name: subjects::ANSWERS_STREAM.to_string(),
        subjects: vec![subjects::ANSWERS_FILTER.to_string()],
        ..work.clone()
    };
    let schedules = Config {
        name: subjects::SCHEDULES_STREAM.to_string(),
        subjects: vec![subjects::SCHEDULES_FILTER.to_string()],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        allow_message_schedules: true,
        ..Default::default()
    };
    let advisories = Config {
        name: subjects::ADVISORIES_STREAM.to_string(),
        subjects: vec![
            subjects::terminated_advisories(&cfg.inbox.name),
            subjects::max_deliveries_advisories(&cfg.inbox.name),
            subjects::max_deliveries_advisories(subjects::WORK_STREAM),
        ],
        retention: RetentionPolicy::WorkQueue,
        max_age: cfg.ingress.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        ..Default::default()
    };
    // The audit trail: batches of events (`protocol::audit`), kept as long as the inbox.
    let audit = Config {
        name: subjects::AUDIT_STREAM.to_string(),
        subjects: vec![subjects::AUDIT_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        ..Default::default()
    };
    let dlq = Config {
        name: subjects::DLQ_STREAM.to_string(),
        subjects: vec![subjects::DLQ_FILTER.to_string()],
        retention: RetentionPolicy::Limits,
        max_age: cfg.inbox.max_age().unwrap_or_default(),
        storage: StorageType::File,
        duplicate_window: dup,
        num_replicas: cfg.replicas,
        allow_direct: true,
        ..Default::default()
    };
    [
        ingress, inbox, tasks, work, answers, schedules, advisories, dlq, audit,
    ]
}
