//! Provisioning against a real nats-server.

use super::*;
use async_nats::jetstream;
use async_nats::jetstream::stream::DiscardPolicy;
use protocol::subjects;

#[tokio::test]
async fn creates_then_updates_streams_to_configured_limits() {
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let mut cfg = DeliveryConfig::default();
    let first = ensure_streams(&js, &cfg).await.unwrap();
    assert!(first.iter().all(|r| r.action == Provisioned::Created));
    assert_eq!(
        first.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        [
            "HUB_INGRESS",
            "HUB_INBOX",
            "HUB_TASKS",
            "HUB_WORK",
            "HUB_ANSWERS",
            "HUB_SCHEDULES",
            "HUB_ADVISORIES",
            "HUB_DLQ",
            "HUB_AUDIT"
        ]
    );

    cfg.inbox.max_msgs_per_subject = 7;
    cfg.duplicate_window_secs = 60;
    let second = ensure_streams(&js, &cfg).await.unwrap();
    assert!(second.iter().all(|r| r.action == Provisioned::Updated));
    let info = js
        .get_stream("HUB_INBOX")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.max_messages_per_subject, 7);
    assert_eq!(info.config.duplicate_window, Duration::from_secs(60));
    assert_eq!(info.config.subjects, vec!["channel.inbox.>".to_string()]);
}

#[tokio::test]
async fn an_inbox_stream_of_an_earlier_version_is_updated_to_refuse_new_dms_when_full() {
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let cfg = DeliveryConfig::default();
    // What earlier versions made: limits retention that drops the oldest.
    let [_, mut old, ..] = stream_configs(&cfg);
    old.discard = DiscardPolicy::Old;
    old.discard_new_per_subject = false;
    js.create_stream(old).await.unwrap();
    ensure_streams(&js, &cfg).await.unwrap();
    let info = inbox_config(&js).await;
    assert_eq!(info.discard, DiscardPolicy::New);
    assert!(info.discard_new_per_subject);
    // Unlimited per subject: discard new still holds for the stream's own limits.
    let mut unlimited = cfg.clone();
    unlimited.inbox.max_msgs_per_subject = -1;
    ensure_streams(&js, &unlimited).await.unwrap();
    let info = inbox_config(&js).await;
    assert_eq!(info.discard, DiscardPolicy::New);
    assert!(!info.discard_new_per_subject);
}

/// Creates every consumer, 32 at a time, and checks that none was refused.
async fn all_created(
    consumers: impl Iterator<Item = (jetstream::stream::Stream, jetstream::consumer::pull::Config)>,
) {
    use futures::StreamExt;
    let made = futures::stream::iter(consumers)
        .map(|(stream, config)| async move { stream.create_consumer(config).await })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let refused: Vec<_> = made.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} refused: {:?}",
        refused.len(),
        refused.first()
    );
}

async fn inbox_config(js: &jetstream::Context) -> Config {
    stream_config(js, "HUB_INBOX").await
}

/// The configuration `name` has now.
async fn stream_config(js: &jetstream::Context, name: &str) -> Config {
    let mut stream = js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().config.clone()
}

#[tokio::test]
async fn the_inbox_stream_holds_more_consumers_than_the_brokers_default_limit() {
    // nats-server 2.15 limits a stream that sets no `max_consumers` of its own to 1,000
    // consumers (`default_max_consumers`): one host of 1,000 agents, then every attach is
    // refused with `maximum consumers limit reached`. The inbox stream sets its own limit.
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let cfg = DeliveryConfig::default();
    ensure_streams(&js, &cfg).await.unwrap();
    let stream = js.get_stream(&cfg.inbox.name).await.unwrap();
    all_created((0..1_001).map(|i| {
        let agent = protocol::AgentId::new(format!("agent{i}")).unwrap();
        (
            stream.clone(),
            crate::consumers::inbox_consumer(&cfg, &agent),
        )
    }))
    .await;
    assert_eq!(
        inbox_config(&js).await.max_consumers,
        i32::try_from(cfg.inbox.max_consumers).unwrap()
    );
}

#[tokio::test]
async fn the_work_and_answer_streams_hold_more_consumers_than_the_brokers_default_limit() {
    // As for the inbox stream: 1,001 queues on one hub, and 1,001 workers' answer
    // consumers, each past the broker's default of 1,000.
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let cfg = DeliveryConfig::default();
    ensure_streams(&js, &cfg).await.unwrap();
    let (work, answers) = (
        js.get_stream(subjects::WORK_STREAM).await.unwrap(),
        js.get_stream(subjects::ANSWERS_STREAM).await.unwrap(),
    );
    all_created((0..1_001).flat_map(|i| {
        let queue = protocol::QueueName::new(format!("q{i}")).unwrap();
        let worker = protocol::WorkerId::new(format!("w{i}")).unwrap();
        [
            (work.clone(), crate::consumers::queue_consumer(&cfg, &queue)),
            (
                answers.clone(),
                crate::consumers::answer_consumer(&cfg, &worker),
            ),
        ]
    }))
    .await;
    for name in [subjects::WORK_STREAM, subjects::ANSWERS_STREAM] {
        let mut stream = js.get_stream(name).await.unwrap();
        assert_eq!(
            stream.info().await.unwrap().config.max_consumers,
            i32::try_from(cfg.tasks.work_max_consumers).unwrap(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn retention_change_is_refused_with_instructions() {
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    // Someone created HUB_INGRESS by hand with limits retention.
    js.create_stream(Config {
        name: "HUB_INGRESS".into(),
        subjects: vec!["hub.pub.>".into()],
        retention: RetentionPolicy::Limits,
        ..Default::default()
    })
    .await
    .unwrap();
    let err = ensure_streams(&js, &DeliveryConfig::default())
        .await
        .unwrap_err();
    match &err {
        StreamError::RetentionMismatch {
            stream,
            existing,
            wanted,
        } => {
            assert_eq!(stream, "HUB_INGRESS");
            assert_eq!(*existing, RetentionPolicy::Limits);
            assert_eq!(*wanted, RetentionPolicy::WorkQueue);
        }
        other => panic!("expected RetentionMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains("delete the stream"));
}

/// Every stream and KV bucket the runtime provisions, by stream name.
fn provisioned(cfg: &DeliveryConfig) -> Vec<String> {
    let buckets = [
        protocol::subjects::IDEMPOTENCY_BUCKET,
        protocol::subjects::BROKERS_BUCKET,
        protocol::subjects::RATE_BUCKET,
        protocol::subjects::HOLDS_BUCKET,
        protocol::subjects::PRESENCE_BUCKET,
        protocol::subjects::REMOVED_BUCKET,
        protocol::subjects::CLAIMS_BUCKET,
    ];
    stream_configs(cfg)
        .into_iter()
        .map(|c| c.name)
        .chain(buckets.into_iter().map(protocol::subjects::kv_stream))
        .collect()
}

/// Each provisioned stream's replicas, by name.
async fn replicas_of(js: &jetstream::Context, cfg: &DeliveryConfig) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for name in provisioned(cfg) {
        let mut stream = js.get_stream(&name).await.unwrap();
        let replicas = stream.info().await.unwrap().config.num_replicas;
        out.push((name, replicas));
    }
    out
}

#[tokio::test]
async fn more_replicas_than_a_single_server_holds_are_refused_naming_the_key() {
    let server = harness::run_server().await.unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let cfg = DeliveryConfig {
        replicas: 3,
        ..DeliveryConfig::default()
    };
    let err = ensure_streams(&js, &cfg).await.unwrap_err();
    assert!(
        matches!(
            &err,
            StreamError::Replicas { stream, replicas: 3, key: "replicas", .. } if stream == "HUB_INGRESS"
        ),
        "{err:?}"
    );
    let mut cfg = DeliveryConfig::default();
    cfg.inbox.replicas = Some(2);
    let err = ensure_streams(&js, &cfg).await.unwrap_err();
    assert!(
        matches!(
            &err,
            StreamError::Replicas { stream, replicas: 2, key: "inbox.replicas", .. } if stream == "HUB_INBOX"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("`inbox.replicas`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_and_bucket_is_replicated_as_configured_and_scaled_up_in_place() {
    let cluster = harness::Cluster::start(3).await.unwrap();
    let js = jetstream::new(cluster.client().await.unwrap());
    let one = DeliveryConfig::default();
    ensure_streams(&js, &one).await.unwrap();
    let all = |n: usize| -> Vec<(String, usize)> {
        provisioned(&one)
            .into_iter()
            .map(|name| (name, n))
            .collect()
    };
    assert_eq!(replicas_of(&js, &one).await, all(1));
    // The same hub configured for three replicas: every stream and bucket is updated in place.
    let three = DeliveryConfig {
        replicas: 3,
        ..DeliveryConfig::default()
    };
    let reports = ensure_streams(&js, &three).await.unwrap();
    assert!(reports.iter().all(|r| r.action == Provisioned::Updated));
    assert_eq!(replicas_of(&js, &three).await, all(3));
    // And the inbox alone at two.
    let mut two = three.clone();
    two.inbox.replicas = Some(2);
    ensure_streams(&js, &two).await.unwrap();
    let inbox = replicas_of(&js, &two)
        .await
        .into_iter()
        .find(|(name, _)| name == "HUB_INBOX");
    assert_eq!(inbox, Some(("HUB_INBOX".to_owned(), 2)));
}

/// A router started while its cluster has no quorum (an election, a node restarting) waits
/// for it instead of failing (issue 29 §2): with two of three nodes down every JetStream
/// request times out; the provisioning goes on until they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_provisioned_once_a_cluster_that_lost_its_quorum_has_it_again() {
    let mut cluster = harness::Cluster::start(3).await.unwrap();
    let js = jetstream::new(cluster.node(0).client().await.unwrap());
    cluster.kill(1).await;
    cluster.kill(2).await;
    let three = DeliveryConfig {
        replicas: 3,
        ..DeliveryConfig::default()
    };
    let provisioning = tokio::spawn({
        let js = js.clone();
        let three = three.clone();
        async move { ensure_streams(&js, &three).await }
    });
    // Longer than a JetStream request's own timeout (5 s): the old code had failed by then.
    tokio::time::sleep(Duration::from_secs(7)).await;
    cluster.restart(1).await.unwrap();
    cluster.restart(2).await.unwrap();
    let provisioned = tokio::time::timeout(
        PROVISION_RETRY_WINDOW + Duration::from_secs(10),
        provisioning,
    )
    .await
    .expect("provisioning ends")
    .unwrap();
    let reports = provisioned.unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs()));
    assert_eq!(reports.len(), 9);
    assert!(replicas_of(&js, &three).await.iter().all(|(_, n)| *n == 3));
}

/// Routers started together on a cluster both provision it: nats-server answers only one of
/// two concurrent creates of the same stream, and the other request times out
/// (nats-io/nats.go#949); it is tried again and finds the stream made (before, one of the two
/// routers failed to start with "cannot create stream ...: jetstream request timed out").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_provisioning_a_cluster_at_once_both_succeed() {
    let cluster = harness::Cluster::start(3).await.unwrap();
    let three = DeliveryConfig {
        replicas: 3,
        ..DeliveryConfig::default()
    };
    let mut provisioners = Vec::new();
    for node in 0..2 {
        let js = jetstream::new(cluster.node(node).client().await.unwrap());
        let three = three.clone();
        provisioners.push(tokio::spawn(
            async move { ensure_streams(&js, &three).await },
        ));
    }
    for provisioner in provisioners {
        let reports = provisioner
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs()));
        assert_eq!(reports.len(), 9);
    }
}

/// The subject of the next stream update request `updates` sees (within 5 s).
async fn next_update(updates: &mut async_nats::Subscriber) -> String {
    use futures::StreamExt;
    let next = tokio::time::timeout(Duration::from_secs(5), updates.next()).await;
    next.expect("an update").unwrap().subject.to_string()
}

/// A stream that has its configuration already is left alone: no update request, so that
/// routers started together on a cluster do not propose the same update at once (one of two
/// concurrent requests times out there); a stream whose configuration differs is updated.
#[tokio::test]
async fn a_stream_that_has_its_configuration_is_not_updated_again() {
    use futures::StreamExt;
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = jetstream::new(client.clone());
    let mut cfg = DeliveryConfig::default();
    ensure_streams(&js, &cfg).await.unwrap();
    let mut updates = client.subscribe("$JS.API.STREAM.UPDATE.>").await.unwrap();
    client.flush().await.unwrap();
    ensure_streams(&js, &cfg).await.unwrap();
    cfg.inbox.max_msgs_per_subject = 7;
    ensure_streams(&js, &cfg).await.unwrap();
    client.flush().await.unwrap();
    assert_eq!(
        next_update(&mut updates).await,
        "$JS.API.STREAM.UPDATE.HUB_INBOX"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), updates.next())
            .await
            .is_err(),
        "one update only"
    );
    // A setting the hub leaves at its default, changed by hand, is put back.
    let mut audit = stream_config(&js, "HUB_AUDIT").await;
    audit.allow_direct = true;
    js.update_stream(audit).await.unwrap();
    client.flush().await.unwrap();
    let _own = tokio::time::timeout(Duration::from_secs(5), updates.next()).await;
    ensure_streams(&js, &cfg).await.unwrap();
    client.flush().await.unwrap();
    assert_eq!(
        next_update(&mut updates).await,
        "$JS.API.STREAM.UPDATE.HUB_AUDIT"
    );
    let audit = stream_config(&js, "HUB_AUDIT").await;
    assert!(!audit.allow_direct);
}

/// nats-server 2.12 answers a publish whose `Nats-Msg-Id` is still being proposed (a retry
/// sent while the first copy is on its way through raft, as after a leader change) with
/// `409 duplicate message id is in process` (10158). The first copy may yet be stored: the
/// same publish is to be sent again, when it is acked as a duplicate. Seen in the chaos
/// program on a 3-node cluster: 56 of 10,000 DMs were reported not acknowledged that way, and
/// every one of them was delivered.
#[test]
fn a_duplicate_message_id_still_in_process_is_sent_again() {
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    let in_process: async_nats::jetstream::Error = serde_json::from_str(
        r#"{"code": 409, "err_code": 10158, "description": "duplicate message id is in process"}"#,
    )
    .unwrap();
    let e = PublishError::with_source(PublishErrorKind::Other, in_process);
    assert!(is_transient(&e));
    for kind in [
        PublishErrorKind::StreamNotFound,
        PublishErrorKind::TimedOut,
        PublishErrorKind::BrokenPipe,
        PublishErrorKind::MaxAckPending,
    ] {
        assert!(is_transient(&PublishError::new(kind)), "{kind:?}");
    }
    // A refusal that a retry cannot change is final.
    let full: async_nats::jetstream::Error = serde_json::from_str(
        r#"{"code": 503, "err_code": 10077, "description": "maximum messages exceeded"}"#,
    )
    .unwrap();
    assert!(!is_transient(&PublishError::with_source(
        PublishErrorKind::Other,
        full
    )));
}
