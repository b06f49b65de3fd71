//! JetStream consumer configurations the router creates. Agents and workers never create
//! consumers; only the router does, always as pull consumers with a fixed filter.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use protocol::config::DeliveryConfig;
use protocol::subjects;
use protocol::{AgentId, QueueName, WorkerId};

/// The shared router consumer on the ingress stream: pull, explicit ack, deliver all, filter
/// `hub.pub.>`, no inactivity threshold (it must never be deleted while work is pending).
///
/// It and the worker-facing consumers leave `num_replicas` at 0, their stream's replicas:
/// they are few and carry everyone's messages, and JetStream requires it of a consumer on a
/// work-queue stream.
pub fn router_consumer(cfg: &DeliveryConfig) -> pull::Config {
    pull::Config {
        durable_name: Some(cfg.router_consumer.clone()),
        description: Some("hub routers (shared)".into()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: cfg.ack_wait(),
        max_deliver: cfg.router_max_deliver,
        filter_subject: subjects::INGRESS_FILTER.to_string(),
        max_ack_pending: cfg.router_max_ack_pending,
        inactive_threshold: Duration::ZERO,
        ..Default::default()
    }
}

/// The inbox consumer `inbox-<id>` created on attach: pull, explicit ack, deliver all, filter
/// `channel.inbox.<id>`, `max_ack_pending` = `inbox_max_ack_pending`, inactive threshold =
/// `inbox_inactive_secs` (none when -1), `max_deliver` = `inbox_max_deliver` and backoff =
/// `inbox_backoff_secs` (a DM whose deliveries ran out is dead-lettered); replicas
/// `inbox.consumer_replicas` (the stream's unless fewer are configured: see CAPACITY.md).
pub fn inbox_consumer(cfg: &DeliveryConfig, id: &AgentId) -> pull::Config {
    pull::Config {
        durable_name: Some(subjects::inbox_consumer(id)),
        description: Some(format!("durable inbox of {id}")),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: cfg.ack_wait(),
        max_deliver: cfg.inbox_max_deliver,
        backoff: cfg.inbox_backoff(),
        filter_subject: subjects::inbox(id),
        max_ack_pending: cfg.inbox_max_ack_pending,
        inactive_threshold: cfg.inbox_inactive().unwrap_or(Duration::ZERO),
        // 0 (unset): the stream's, following it when it is scaled.
        num_replicas: cfg.inbox.consumer_replicas.unwrap_or(0),
        ..Default::default()
    }
}

/// Settings every worker-facing consumer shares: pull, explicit ack, deliver all, no backoff
/// list, no inactivity threshold (a queue with work pending is never
/// deleted), ack wait from the config (workers heartbeat at a third of it).
fn work_consumer(
    cfg: &DeliveryConfig,
    durable: String,
    filter: String,
    max_ack_pending: i64,
    max_deliver: i64,
) -> pull::Config {
    pull::Config {
        durable_name: Some(durable),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: cfg.ack_wait(),
        max_deliver,
        filter_subject: filter,
        max_ack_pending,
        inactive_threshold: Duration::ZERO,
        ..Default::default()
    }
}

/// The shared consumer `queue-<queue>` on `work.<queue>` (untargeted tasks); an input
/// delivered `task_max_deliver` times is dead-lettered.
pub fn queue_consumer(cfg: &DeliveryConfig, queue: &QueueName) -> pull::Config {
    work_consumer(
        cfg,
        subjects::queue_consumer(queue),
        subjects::work(queue, None),
        10_000,
        cfg.task_max_deliver,
    )
}

/// The worker's own consumer `worker-<worker>` on `work.*.<worker>` (targeted tasks).
pub fn targeted_consumer(cfg: &DeliveryConfig, worker: &WorkerId) -> pull::Config {
    work_consumer(
        cfg,
        subjects::targeted_consumer(worker),
        subjects::targeted_filter(worker),
        1_024,
        cfg.task_max_deliver,
    )
}

/// The worker's own consumer `answers-<worker>` on `answer.<worker>`.
pub fn answer_consumer(cfg: &DeliveryConfig, worker: &WorkerId) -> pull::Config {
    work_consumer(
        cfg,
        subjects::answer_consumer(worker),
        subjects::answer(worker),
        1_024,
        // Answers are nak'd while their attempt is busy: no finite count fits them.
        -1,
    )
}

/// Whether a consumer lookup or deletion failed because the consumer does not exist.
pub fn is_consumer_not_found(e: &async_nats::jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), async_nats::jetstream::stream::ConsumerErrorKind::JetStream(err)
        if err.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND)
}

/// The ack wait a consumer really has: its first backoff step when it has a backoff list
/// (nats-server then redelivers after it), else its ack wait. What anything holding its
/// messages heartbeats at a third of.
pub fn effective_ack_wait(config: &async_nats::jetstream::consumer::Config) -> Duration {
    config
        .backoff
        .first()
        .copied()
        .unwrap_or(config.ack_wait)
        .min(config.ack_wait.max(Duration::from_millis(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_names_have_no_dots_and_filters_are_exact() {
        let cfg = DeliveryConfig::default();
        let bob = AgentId::new("bob").unwrap();
        let router = router_consumer(&cfg);
        let inbox = inbox_consumer(&cfg, &bob);
        for name in [&router.durable_name, &inbox.durable_name] {
            subjects::validate_durable_name(name.as_deref().unwrap()).unwrap();
        }
        assert_eq!(router.filter_subject, "hub.pub.>");
        assert_eq!(inbox.filter_subject, "channel.inbox.bob");
        assert_eq!(inbox.durable_name.as_deref(), Some("inbox-bob"));
        assert_eq!(router.inactive_threshold, Duration::ZERO);
        assert_eq!(inbox.max_ack_pending, 256);
        assert_eq!(inbox.inactive_threshold, Duration::from_secs(604_800));
    }
}
