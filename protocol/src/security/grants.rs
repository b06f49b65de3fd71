//! What the broker lets each identity publish and subscribe to: least privilege, written out
//! subject by subject (docs/SECURITY.md says why each grant is needed).
//!
//! The rules that shape them (from the durable-delivery design, "Permissions"):
//! - only the router makes streams and consumers, always pull consumers with a fixed filter:
//!   nats-server checks neither a push consumer's `deliver_subject` nor the reply subject of a
//!   JetStream API request against the creator's permissions, so an agent that could make a
//!   consumer could replay stored envelopes into anyone's subjects;
//! - an identity publishes only under `hub.pub.<self>.>` (the router stamps the sender from
//!   that subject), and receives replies only under its own prefix `_INBOX.<self>.>`;
//! - a client binds, pulls and acks only its own consumers. Ack subjects are granted in both
//!   forms: `$JS.ACK.<stream>.<consumer>.…` and nats-server's v2 form
//!   `$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.…`.

use crate::config::DeliveryConfig;
use crate::subjects;

use super::identities::{Identity, Role};
use crate::ids::AgentId;

/// The permissions of one broker user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grants {
    /// Subjects it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to, to read what is published there.
    pub subscribe: Vec<String>,
    /// Subjects whose requests it answers: it subscribes to them and may publish to the reply
    /// subject of a request it received (nats-server `allow_responses`: once, within a short
    /// time).
    pub serves: Vec<String>,
}

impl Grants {
    /// Whether it answers requests (nats-server `allow_responses`).
    pub fn allow_responses(&self) -> bool {
        !self.serves.is_empty()
    }

    /// Everything it subscribes to: what it reads and what it serves.
    pub fn subscriptions(&self) -> impl Iterator<Item = &String> {
        self.subscribe.iter().chain(&self.serves)
    }
}

/// `$JS.API.<verb>`.
fn api(verb: &str) -> String {
    format!("$JS.API.{verb}")
}

/// Both forms of the ack subjects of `consumer` on `stream`.
fn acks(stream: &str, consumer: &str) -> [String; 2] {
    [
        format!("$JS.ACK.{stream}.{consumer}.>"),
        format!("$JS.ACK.*.*.{stream}.{consumer}.>"),
    ]
}

/// What a client needs to bind (consumer info), pull and ack its own `consumer` on `stream`.
fn own_consumer(stream: &str, consumer: &str) -> Vec<String> {
    let mut out = vec![
        api(&format!("CONSUMER.INFO.{stream}.{consumer}")),
        api(&format!("CONSUMER.MSG.NEXT.{stream}.{consumer}")),
    ];
    out.extend(acks(stream, consumer));
    out
}

/// The reads of `me`'s own holds (`runtime send` honouring a refusal's `retry_after_secs`):
/// direct gets of `$KV.HUB_HOLDS.<me>.>` only.
fn own_holds(me: &str) -> String {
    api(&format!(
        "DIRECT.GET.{}.{}",
        subjects::kv_stream(subjects::HOLDS_BUCKET),
        subjects::kv_subject(subjects::HOLDS_BUCKET, &format!("{me}.>"))
    ))
}

/// Its own idempotency entries ([`crate::task::idempotency::entry_key`]): written (created
/// and compare-and-set) and read with a subject-suffixed direct get, under its own token only.
fn own_idempotency_keys(me: &str) -> [String; 2] {
    let keys = subjects::kv_subject(subjects::IDEMPOTENCY_BUCKET, &format!("{me}.>"));
    [
        keys.clone(),
        api(&format!(
            "DIRECT.GET.{}.{keys}",
            subjects::kv_stream(subjects::IDEMPOTENCY_BUCKET)
        )),
    ]
}

/// Anyone's tombstone read, never written: a send to a removed agent is refused before it is
/// published (who is removed is no secret among a hub's identities).
fn tombstone_reads() -> String {
    api(&format!(
        "DIRECT.GET.{}.{}",
        subjects::kv_stream(subjects::REMOVED_BUCKET),
        subjects::kv_subject(subjects::REMOVED_BUCKET, "*")
    ))
}

/// What an agent may publish as itself (`agent`), on a hub with `delivery`'s stream names:
/// an agent's grants, and a host's for each agent it acts for.
fn as_agent(agent: &AgentId, delivery: &DeliveryConfig) -> Vec<String> {
    let me = agent.as_str();
    [
        vec![
            // Not `hub.pub.<a>.task.>`: only workers publish on task channels.
            format!("hub.pub.{me}.*"),
            format!("hub.pub.{me}.work.>"),
            format!("hub.pub.{me}.answer.>"),
            subjects::attach_request(agent),
            subjects::hub_info_request(agent),
            // Reads of its own task channels, served by a router.
            subjects::task_read_request(agent),
            // Query and cancel, with itself as the requester (any worker).
            format!("hub.ctl.*.*.{me}"),
            own_holds(me),
            // Its inbox's audit events, and its own as a client (an idempotency key's hit),
            // under its own name.
            subjects::audit("inbox", me),
            subjects::audit("agent", me),
            // Its own presence (its inbox's beats and offline marker).
            subjects::kv_subject(subjects::PRESENCE_BUCKET, me),
        ],
        own_idempotency_keys(me).to_vec(),
        own_consumer(&delivery.inbox.name, &subjects::inbox_consumer(agent)),
    ]
    .concat()
}

/// What every agent may read of everyone: presence (the receipt of a send says whether its
/// recipient is online) and tombstones.
fn agents_reads() -> Vec<String> {
    vec![
        api(&format!(
            "DIRECT.GET.{}.{}",
            subjects::kv_stream(subjects::PRESENCE_BUCKET),
            subjects::kv_subject(subjects::PRESENCE_BUCKET, "*")
        )),
        tombstone_reads(),
    ]
}

/// The grants of `identity` on a hub with `delivery`'s stream names.
pub fn grants(identity: &Identity, delivery: &DeliveryConfig) -> Grants {
    let me = identity.name.as_str();
    let reply = format!("{}.{me}.>", subjects::DEFAULT_REPLY_PREFIX);
    let own_ingress = format!("hub.pub.{me}.>");
    match &identity.role {
        Role::Agent => Grants {
            publish: [as_agent(&identity.name, delivery), agents_reads()].concat(),
            // The live results of the tasks it delegated, and the broadcasts.
            subscribe: vec![
                reply,
                subjects::tasks_of(&identity.name),
                subjects::BROADCAST_FILTER.to_owned(),
            ],
            serves: Vec::new(),
        },
        // Exactly the union of its agents' grants, with replies under its own prefix.
        Role::Host { agents } => {
            let mut publish = agents_reads();
            let mut subscribe = vec![reply, subjects::BROADCAST_FILTER.to_owned()];
            for agent in agents {
                publish.extend(as_agent(agent, delivery));
                subscribe.push(subjects::tasks_of(agent));
            }
            Grants {
                publish,
                subscribe,
                serves: Vec::new(),
            }
        }
        Role::Worker { queues } => {
            let worker = identity
                .worker_id()
                .expect("a worker identity has a worker id");
            let mut publish = vec![
                own_ingress,
                own_holds(me),
                subjects::audit("worker", me),
                tombstone_reads(),
                // Its answers to status requests (`runtime status`), on a subject of its own.
                format!("{}.*.{me}", subjects::WORKER_STATUS_SUBJECT),
            ];
            let mut subscribe = vec![reply, subjects::WORKER_STATUS_SUBJECT.to_owned()];
            for queue in queues {
                // A router changed the queue's consumer (its ack wait): read it again.
                subscribe.push(subjects::queue_changed(queue));
                publish.push(subjects::join_request(queue, &worker));
                publish.extend(own_consumer(
                    subjects::WORK_STREAM,
                    &subjects::queue_consumer(queue),
                ));
                // Its queue's task claims: written (compare-and-set, with a TTL) and read
                // back by key, never another queue's.
                let claims = subjects::kv_subject(subjects::CLAIMS_BUCKET, &format!("{queue}.>"));
                publish.push(api(&format!(
                    "DIRECT.GET.{}.{claims}",
                    subjects::kv_stream(subjects::CLAIMS_BUCKET)
                )));
                publish.push(claims);
            }
            publish.extend(own_consumer(
                subjects::WORK_STREAM,
                &subjects::targeted_consumer(&worker),
            ));
            publish.extend(own_consumer(
                subjects::ANSWERS_STREAM,
                &subjects::answer_consumer(&worker),
            ));
            // The baseline (the work stream's last sequence) and the task channel reads before
            // a task runs: its stored results (any task's: a `next_by_subj` direct get cannot
            // be limited to subjects), and the last of those still in the ingress, in the
            // subject-suffixed form limited to task channel messages (never a DM waiting in
            // the ingress).
            publish.push(api(&format!("STREAM.INFO.{}", subjects::WORK_STREAM)));
            publish.push(api(&format!("DIRECT.GET.{}", delivery.tasks.name)));
            publish.push(api(&format!("DIRECT.GET.{}.>", delivery.tasks.name)));
            publish.push(api(&format!(
                "DIRECT.GET.{}.hub.pub.*.task.>",
                delivery.ingress.name
            )));
            Grants {
                publish,
                subscribe,
                // Its control requests (query, cancel).
                serves: vec![format!("hub.ctl.{me}.>")],
            }
        }
        Role::Router => {
            let mut publish = vec![
                // Streams and buckets: made and updated at start-up.
                api("INFO"),
                api("STREAM.INFO.*"),
                api("STREAM.CREATE.*"),
                api("STREAM.UPDATE.*"),
                // Every consumer (pull, fixed filter): the router's own, inboxes, queues.
                api("CONSUMER.CREATE.>"),
                api("CONSUMER.INFO.>"),
                api(&format!(
                    "CONSUMER.MSG.NEXT.{}.{}",
                    delivery.ingress.name, delivery.router_consumer
                )),
                // The broker-incarnation bucket (reads and creates).
                format!("$KV.{}.>", subjects::BROKERS_BUCKET),
                api(&format!("DIRECT.GET.KV_{}.>", subjects::BROKERS_BUCKET)),
                // The senders' token buckets (`sender_rate_per_min`): read and compare-and-set.
                format!("$KV.{}.>", subjects::RATE_BUCKET),
                api(&format!("DIRECT.GET.KV_{}.>", subjects::RATE_BUCKET)),
                // The holds it tells senders of (written only).
                format!("$KV.{}.>", subjects::HOLDS_BUCKET),
                // Its audit events (router, expiry actor).
                "hub.audit.router.>".to_owned(),
                // Task channel reads it serves ([`subjects::task_read_request`]): the request
                // is forwarded with the requester's reply, scoped to its own channels.
                api(&format!("DIRECT.GET.{}", delivery.tasks.name)),
                // What it routes: inboxes, task channels, broadcasts, work, answers.
                "channel.>".to_owned(),
                "work.>".to_owned(),
                "answer.>".to_owned(),
                // Tells a queue's workers it changed the queue's consumer.
                subjects::QUEUE_CHANGED_FILTER.to_owned(),
            ];
            publish.extend(acks(&delivery.ingress.name, &delivery.router_consumer));
            // DM deadlines: their checks scheduled and taken, the inbox's termination
            // advisories taken, an expired DM read back by sequence for its notice.
            publish.push("hub.sched.>".to_owned());
            // Dead letters: the copies of DMs their inbox could not take.
            publish.push(subjects::DLQ_FILTER.to_owned());
            // The removed agents: read only. Its watch is an ordered pull consumer on the
            // bucket's stream (made with `CONSUMER.CREATE.>`, named by the server: hence `*`),
            // pulled to learn every tombstone and each change; an attach request is checked
            // with one subject-suffixed direct get of the agent's own key. No write.
            let removed = subjects::kv_stream(subjects::REMOVED_BUCKET);
            publish.push(api(&format!("CONSUMER.MSG.NEXT.{removed}.*")));
            publish.push(api(&format!(
                "DIRECT.GET.{removed}.{}",
                subjects::kv_subject(subjects::REMOVED_BUCKET, "*")
            )));
            for (stream, consumer) in [
                (subjects::SCHEDULES_STREAM, subjects::EXPIRY_CONSUMER),
                (subjects::ADVISORIES_STREAM, subjects::ADVISORIES_CONSUMER),
            ] {
                publish.push(api(&format!("CONSUMER.MSG.NEXT.{stream}.{consumer}")));
                publish.extend(acks(stream, consumer));
            }
            publish.push(api(&format!("DIRECT.GET.{}", delivery.inbox.name)));
            // What the inboxes have read, trimmed (below each consumer's ack floor, once the
            // advisories consumer has caught up; `crate::history`). No more than its
            // `STREAM.UPDATE` of the inbox stream's limits could already remove.
            publish.push(api(&format!("STREAM.PURGE.{}", delivery.inbox.name)));
            // A task input whose deliveries ran out, an answer no worker took: read back,
            // copied, then removed.
            for stream in [subjects::WORK_STREAM, subjects::ANSWERS_STREAM] {
                publish.push(api(&format!("DIRECT.GET.{stream}")));
                publish.push(api(&format!("STREAM.MSG.DELETE.{stream}")));
            }
            // The consumer watchdog (`crate::watchdog`): the work-queue streams' consumers
            // listed, the oldest message each holds read, a stalled consumer reset.
            for stream in [
                delivery.ingress.name.as_str(),
                subjects::WORK_STREAM,
                subjects::ANSWERS_STREAM,
            ] {
                publish.push(api(&format!("CONSUMER.LIST.{stream}")));
                publish.push(api(&format!("CONSUMER.RESET.{stream}.*")));
            }
            publish.push(api(&format!("DIRECT.GET.{}", delivery.ingress.name)));
            Grants {
                publish,
                subscribe: vec![reply],
                serves: vec![
                    subjects::ATTACH_FILTER.to_owned(),
                    subjects::HUB_INFO_FILTER.to_owned(),
                    subjects::TASK_READ_FILTER.to_owned(),
                    subjects::JOIN_FILTER.to_owned(),
                    subjects::STATUS_SUBJECT.to_owned(),
                ],
            }
        }
        // An admin may also delegate and follow its own tasks as an agent does.
        Role::Admin => Grants {
            publish: [
                vec![own_ingress],
                // Its own idempotency keys (its `$JS.API.>` reads them).
                own_idempotency_keys(me)[..1].to_vec(),
                vec![
                    api(">"),
                    "hub.admin.>".to_owned(),
                    "hub.ctl.>".to_owned(),
                    subjects::hub_info_request(&identity.name),
                    subjects::task_read_request(&identity.name),
                    // `runtime dlq replay`: a dead letter stored in its recipient's inbox again.
                    format!("{}*", "channel.inbox."),
                    // The audit events of its dlq commands (replayed, discarded), and its own
                    // as a client (an idempotency key's hit).
                    "hub.audit.admin.>".to_owned(),
                    subjects::audit("agent", identity.name.as_str()),
                    // `runtime agent remove|restore`: a removed agent's tombstone written or
                    // deleted (one key per agent; routers only read the bucket)...
                    subjects::kv_subject(subjects::REMOVED_BUCKET, "*"),
                    // ...and the dead-letter copies of its waiting DMs, on agents' dead-letter
                    // subjects only (`dlq.<agent>`, not the routers' `dlq.work.>`/`dlq.answer.>`).
                    "dlq.*".to_owned(),
                    // `runtime dlq replay` of a task input or an answer: back in its stream, an
                    // answer's wait check scheduled again.
                    subjects::WORK_FILTER.to_owned(),
                    subjects::ANSWERS_FILTER.to_owned(),
                    "hub.sched.answer.*".to_owned(),
                ],
            ]
            .concat(),
            subscribe: vec![
                reply,
                subjects::tasks_of(&identity.name),
                // The workers' answers to its status requests (`runtime status`).
                subjects::WORKER_STATUS_ANSWERS.to_owned(),
            ],
            serves: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::identities::IdentitiesFile;

    fn identities() -> crate::security::Identities {
        IdentitiesFile::parse(
            r#"{"agents": ["alice"], "workers": [{"id": "w1", "queues": ["q"]}],
                "routers": 1, "admins": ["ops"]}"#,
        )
        .unwrap()
    }

    fn of(name: &str) -> Grants {
        grants(identities().get(name).unwrap(), &DeliveryConfig::default())
    }

    /// A NATS subject pattern match (`*` one token, `>` the rest).
    fn matches(pattern: &str, subject: &str) -> bool {
        let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    fn may_publish(g: &Grants, subject: &str) -> bool {
        g.publish.iter().any(|p| matches(p, subject))
    }

    fn may_subscribe(g: &Grants, subject: &str) -> bool {
        g.subscriptions().any(|p| matches(p, subject))
    }

    #[test]
    fn an_agent_publishes_only_as_itself_and_uses_only_its_own_consumer() {
        let g = of("alice");
        assert!(may_publish(&g, "hub.pub.alice.inbox"));
        assert!(may_publish(&g, "hub.pub.alice.news"));
        assert!(may_publish(&g, "hub.pub.alice.work.q"));
        assert!(may_publish(&g, "hub.pub.alice.work.q.w1"));
        assert!(may_publish(&g, "hub.pub.alice.answer.w1"));
        assert!(may_publish(&g, "hub.delivery.alice.inbox"));
        assert!(may_publish(&g, "hub.delivery.alice.hub"));
        assert!(may_publish(&g, "hub.delivery.alice.task"));
        assert!(may_publish(&g, "hub.ctl.w1.cancel.alice"));
        assert!(may_publish(&g, "hub.ctl.w1.query.alice"));
        assert!(may_subscribe(&g, "channel.task.alice.k1"));
        assert!(may_publish(
            &g,
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-alice"
        ));
        assert!(may_publish(&g, "$JS.ACK.HUB_INBOX.inbox-alice.1.2.3.4.5"));
        assert!(may_publish(
            &g,
            "$JS.ACK.hub.ABCDEF.HUB_INBOX.inbox-alice.1.2.3.4.5.tok"
        ));
        assert!(may_subscribe(&g, "_INBOX.alice.x.y"));
        assert!(may_publish(&g, "$KV.HUB_IDEMPOTENCY.alice.q.6b31"));
        assert!(may_publish(
            &g,
            "$JS.API.DIRECT.GET.KV_HUB_IDEMPOTENCY.$KV.HUB_IDEMPOTENCY.alice.q.6b31"
        ));
        for denied in [
            "$KV.HUB_IDEMPOTENCY.bob.q.6b31",
            "$KV.HUB_IDEMPOTENCY.q.6b31",
            "$JS.API.DIRECT.GET.KV_HUB_IDEMPOTENCY.$KV.HUB_IDEMPOTENCY.bob.q.6b31",
            "$JS.API.DIRECT.GET.KV_HUB_IDEMPOTENCY",
            "$JS.API.STREAM.INFO.KV_HUB_IDEMPOTENCY",
            "hub.pub.bob.inbox",
            "hub.pub.alice.task.k1",
            "channel.inbox.bob",
            "channel.inbox.alice",
            "hub.delivery.bob.inbox",
            "hub.delivery.bob.hub",
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-bob",
            "$JS.API.CONSUMER.INFO.HUB_INBOX.inbox-bob",
            "$JS.API.CONSUMER.DELETE.HUB_INBOX.inbox-alice",
            "$JS.API.CONSUMER.CREATE.HUB_INBOX.x",
            "$JS.API.CONSUMER.DURABLE.CREATE.HUB_INBOX.x",
            "$JS.API.STREAM.INFO.HUB_INGRESS",
            "$JS.API.STREAM.MSG.GET.HUB_INBOX",
            "$JS.API.DIRECT.GET.HUB_INBOX",
            "$JS.API.STREAM.PURGE.HUB_INBOX",
            "$JS.ACK.HUB_INBOX.inbox-bob.1.2.3.4.5",
            "hub.ctl.w1.cancel",
            "hub.ctl.w1.cancel.bob",
            "hub.delivery.bob.task",
            "$JS.API.DIRECT.GET.HUB_TASKS",
            "$JS.API.DIRECT.GET.HUB_TASKS.channel.task.bob.k1",
        ] {
            assert!(!may_publish(&g, denied), "alice may publish {denied}");
        }
        for denied in [
            "_INBOX.bob.x",
            "_INBOX.x",
            "channel.inbox.bob",
            "hub.ctl.w1.cancel",
            "channel.task.bob.k1",
            "channel.task.>",
        ] {
            assert!(!may_subscribe(&g, denied), "alice may subscribe {denied}");
        }
    }

    #[test]
    fn a_worker_uses_only_its_own_consumers_and_makes_none() {
        let g = of("w1");
        assert!(may_publish(&g, "hub.pub.w1.task.alice.abc"));
        assert!(may_publish(
            &g,
            "$JS.API.DIRECT.GET.HUB_INGRESS.hub.pub.*.task.alice.abc"
        ));
        assert!(may_publish(&g, "hub.work.q.join.w1"));
        assert!(may_publish(
            &g,
            "$JS.API.CONSUMER.MSG.NEXT.HUB_WORK.queue-q"
        ));
        assert!(may_publish(
            &g,
            "$JS.API.CONSUMER.MSG.NEXT.HUB_WORK.worker-w1"
        ));
        assert!(may_publish(
            &g,
            "$JS.API.CONSUMER.MSG.NEXT.HUB_ANSWERS.answers-w1"
        ));
        assert!(may_subscribe(&g, "hub.ctl.w1.cancel"));
        assert!(g.allow_responses());
        assert!(may_publish(&g, "hub.admin.workers.t1.w1"));
        assert!(!may_publish(&g, "hub.admin.workers.t1.w2"));
        assert!(may_publish(&g, "$KV.HUB_CLAIMS.q.alice.abc"));
        assert!(may_publish(
            &g,
            "$JS.API.DIRECT.GET.KV_HUB_CLAIMS.$KV.HUB_CLAIMS.q.alice.abc"
        ));
        for denied in [
            // Another queue's claims, and the bucket as a whole.
            "$KV.HUB_CLAIMS.other.alice.abc",
            "$JS.API.DIRECT.GET.KV_HUB_CLAIMS.$KV.HUB_CLAIMS.other.alice.abc",
            "$JS.API.DIRECT.GET.KV_HUB_CLAIMS",
            "$JS.API.STREAM.PURGE.KV_HUB_CLAIMS",
            "hub.pub.alice.inbox",
            "hub.work.other.join.w1",
            "hub.work.q.join.w2",
            "hub.work.q.join",
            "$JS.API.CONSUMER.MSG.NEXT.HUB_WORK.queue-other",
            "$JS.API.CONSUMER.MSG.NEXT.HUB_WORK.worker-w2",
            "$JS.API.CONSUMER.CREATE.HUB_WORK.x",
            "$JS.API.STREAM.DELETE.HUB_WORK",
            "channel.task.alice.abc",
            "work.q",
            // No DM waiting in the ingress is readable.
            "$JS.API.DIRECT.GET.HUB_INGRESS",
            "$JS.API.DIRECT.GET.HUB_INGRESS.hub.pub.alice.inbox",
            "$JS.API.DIRECT.GET.HUB_INGRESS.hub.pub.>",
            "$JS.API.STREAM.MSG.GET.HUB_INGRESS",
        ] {
            assert!(!may_publish(&g, denied), "w1 may publish {denied}");
        }
        assert!(!may_subscribe(&g, "hub.ctl.w2.cancel"));
    }

    #[test]
    fn the_router_reads_the_removed_agents_and_only_the_admins_write_them() {
        let router = grants(
            identities().get("router-1").unwrap(),
            &DeliveryConfig::default(),
        );
        assert!(may_publish(
            &router,
            "$JS.API.CONSUMER.CREATE.KV_HUB_REMOVED.abc.$KV.HUB_REMOVED.>"
        ));
        assert!(may_publish(
            &router,
            "$JS.API.CONSUMER.MSG.NEXT.KV_HUB_REMOVED.abc"
        ));
        assert!(may_publish(
            &router,
            "$JS.API.DIRECT.GET.KV_HUB_REMOVED.$KV.HUB_REMOVED.bob"
        ));
        for denied in [
            "$KV.HUB_REMOVED.bob",
            "$JS.API.CONSUMER.DELETE.HUB_INBOX.inbox-bob",
            "$JS.API.STREAM.PURGE.HUB_TASKS",
            "$JS.API.STREAM.DELETE.HUB_INBOX",
        ] {
            assert!(
                !may_publish(&router, denied),
                "the router may publish {denied}"
            );
        }
        let admin = of("ops");
        for allowed in [
            "$KV.HUB_REMOVED.bob",
            "dlq.bob",
            "channel.inbox.alice",
            "$JS.API.CONSUMER.DELETE.HUB_INBOX.inbox-bob",
            "$JS.API.STREAM.PURGE.HUB_INBOX",
        ] {
            assert!(
                may_publish(&admin, allowed),
                "ops may not publish {allowed}"
            );
        }
        assert!(!may_publish(&admin, "dlq.work.q"));
        // An agent reads a tombstone (its send is refused before it is published).
        assert!(may_publish(
            &of("alice"),
            "$JS.API.DIRECT.GET.KV_HUB_REMOVED.$KV.HUB_REMOVED.bob"
        ));
        for denied in ["$KV.HUB_REMOVED.bob", "dlq.bob"] {
            assert!(
                !may_publish(&of("alice"), denied),
                "alice may publish {denied}"
            );
            assert!(!may_publish(&of("w1"), denied), "w1 may publish {denied}");
        }
    }

    #[test]
    fn a_host_may_do_exactly_what_its_agents_may() {
        let ids = IdentitiesFile::parse(
            r#"{"agents": ["alice", "bob", "carol"], "routers": 1,
                "hosts": [{"id": "gw", "agents": ["alice", "bob"]}]}"#,
        )
        .unwrap();
        let of = |name| grants(ids.get(name).unwrap(), &DeliveryConfig::default());
        let gw = of("gw");
        for agent in ["alice", "bob"] {
            let g = of(agent);
            for subject in &g.publish {
                assert!(gw.publish.contains(subject), "gw may not {subject}");
            }
            assert!(may_subscribe(&gw, &format!("channel.task.{agent}.k1")));
        }
        let union: std::collections::BTreeSet<_> = of("alice")
            .publish
            .into_iter()
            .chain(of("bob").publish)
            .collect();
        let hosted: std::collections::BTreeSet<_> = gw.publish.iter().cloned().collect();
        assert_eq!(hosted, union, "nothing more than its agents'");
        assert!(may_subscribe(&gw, "_INBOX.gw.x"));
        assert!(!may_subscribe(&gw, "_INBOX.alice.x"));
        for denied in [
            "hub.pub.carol.inbox",
            "hub.delivery.carol.inbox",
            "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-carol",
            "$KV.HUB_PRESENCE.carol",
            "hub.pub.gw.inbox",
        ] {
            assert!(!may_publish(&gw, denied), "gw may publish {denied}");
        }
        assert!(!may_subscribe(&gw, "channel.task.carol.k1"));
        assert!(!gw.allow_responses());
    }

    #[test]
    fn no_grant_but_the_admins_is_a_bare_wildcard() {
        for identity in identities().all() {
            let g = grants(identity, &DeliveryConfig::default());
            for subject in g.publish.iter().chain(g.subscriptions()) {
                assert_ne!(subject, ">", "{}", identity.name);
            }
        }
    }
}
