//! The compatibility check of a consumer a worker binds: the router creates the consumers,
//! the worker refuses one whose settings would break its delivery contract.

use async_nats::jetstream::consumer::{self, AckPolicy};

/// A consumer setting the worker cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("incompatible consumer: {field} {reason}")]
pub struct IncompatibleConsumer {
    /// The offending field (consumer config name).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> Result<(), IncompatibleConsumer> {
    Err(IncompatibleConsumer {
        field,
        reason: reason.into(),
    })
}

/// The fewest deliveries a worker accepts of a consumer with a finite `max_deliver`: a task
/// whose deliveries run out is dead-lettered (`task_max_deliver`), and one crash must not do it.
pub const MIN_MAX_DELIVER: i64 = 2;

/// The shortest consumer ack wait a worker accepts: it heartbeats long work at a third of the
/// ack wait, and a shorter one would leave no room for a heartbeat to arrive in time.
pub const MIN_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Checks a consumer's configuration (from `consumer_info`) against what a worker needs:
/// a pull consumer (`deliver_subject` unset), explicit acks, unlimited deliveries or at least
/// [`MIN_MAX_DELIVER`] (the router dead-letters a task whose deliveries ran out), no backoff
/// (redelivery timing is the heartbeat's job), an ack wait of at least [`MIN_ACK_WAIT`] (the
/// worker heartbeats at a third of the consumer's own ack wait), never deleted for
/// inactivity, and exactly the `expected_filter`.
pub fn check_consumer(
    config: &consumer::Config,
    expected_filter: &str,
) -> Result<(), IncompatibleConsumer> {
    if let Some(subject) = &config.deliver_subject {
        return refuse(
            "deliver_subject",
            format!("is {subject}: a push consumer, workers pull"),
        );
    }
    if config.ack_policy != AckPolicy::Explicit {
        return refuse(
            "ack_policy",
            format!("is {:?}, must be explicit", config.ack_policy),
        );
    }
    if (1..MIN_MAX_DELIVER).contains(&config.max_deliver) {
        return refuse(
            "max_deliver",
            format!(
                "is {}: a task would be dead-lettered after its first delivery (at least \
                 {MIN_MAX_DELIVER}, or unlimited)",
                config.max_deliver
            ),
        );
    }
    if !config.backoff.is_empty() {
        return refuse("backoff", format!("is {:?}, must be empty", config.backoff));
    }
    if config.ack_wait < MIN_ACK_WAIT {
        return refuse(
            "ack_wait",
            format!(
                "is {:?}: too short for heartbeats at a third of it (at least {MIN_ACK_WAIT:?})",
                config.ack_wait
            ),
        );
    }
    if !config.inactive_threshold.is_zero() {
        return refuse(
            "inactive_threshold",
            format!(
                "is {:?}: the consumer would be deleted while idle",
                config.inactive_threshold
            ),
        );
    }
    let filters_ok = config.filter_subject == expected_filter
        || (config.filter_subject.is_empty()
            && config.filter_subjects.len() == 1
            && config.filter_subjects[0] == expected_filter);
    if !filters_ok {
        return refuse(
            "filter_subject",
            format!(
                "is {:?}/{:?}, expected {expected_filter}",
                config.filter_subject, config.filter_subjects
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn good() -> consumer::Config {
        consumer::Config {
            durable_name: Some("queue-q".into()),
            ack_policy: AckPolicy::Explicit,
            max_deliver: -1,
            filter_subject: "work.q".into(),
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        }
    }

    fn field(config: consumer::Config) -> &'static str {
        check_consumer(&config, "work.q").unwrap_err().field
    }

    #[test]
    fn compatible_consumer_is_accepted() {
        check_consumer(&good(), "work.q").unwrap();
        let mut zero = good();
        zero.max_deliver = 0;
        check_consumer(&zero, "work.q").unwrap();
    }

    #[test]
    fn compat_refuses_push_consumer() {
        let mut c = good();
        c.deliver_subject = Some("deliver.x".into());
        assert_eq!(field(c), "deliver_subject");
    }

    #[test]
    fn compat_refuses_non_explicit_ack_policy() {
        for policy in [AckPolicy::None, AckPolicy::All] {
            let mut c = good();
            c.ack_policy = policy;
            assert_eq!(field(c), "ack_policy");
        }
    }

    #[test]
    fn compat_refuses_a_max_deliver_of_one_and_takes_a_larger_one() {
        let mut c = good();
        c.max_deliver = 1;
        assert_eq!(field(c), "max_deliver");
        let mut c = good();
        c.max_deliver = 5;
        check_consumer(&c, "work.q").unwrap();
    }

    #[test]
    fn compat_refuses_backoff() {
        let mut c = good();
        c.backoff = vec![Duration::from_secs(1)];
        assert_eq!(field(c), "backoff");
    }

    #[test]
    fn compat_refuses_an_ack_wait_too_short_for_heartbeats() {
        let mut c = good();
        c.ack_wait = Duration::from_millis(500);
        assert_eq!(field(c), "ack_wait");
        let mut c = good();
        c.ack_wait = MIN_ACK_WAIT;
        check_consumer(&c, "work.q").unwrap();
    }

    #[test]
    fn compat_refuses_inactive_threshold() {
        let mut c = good();
        c.inactive_threshold = Duration::from_secs(60);
        assert_eq!(field(c), "inactive_threshold");
    }

    #[test]
    fn compat_refuses_wrong_filter() {
        let mut c = good();
        c.filter_subject = "work.other".into();
        assert_eq!(field(c), "filter_subject");
        let mut c = good();
        c.filter_subject = String::new();
        assert_eq!(field(c), "filter_subject");
    }
}
