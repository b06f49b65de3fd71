//! Where each identity lives on the broker: the hub's account, or an account of its own.
//!
//! nats-server checks no permission on the reply subject of a publish or of a JetStream API
//! request, and sends the publish ack or the API reply there; a stream that captures that
//! subject stores it. Within one account, any identity could so make the broker write into any
//! of the hub's streams (a tombstone, a DM, a task input; docs/SECURITY.md, "Accounts").
//! Between accounts, a request crosses through a service import, and the broker gives it a
//! reply subject of its own (`_R_.…`) that it maps back into the requester's account: a reply
//! can never land in another account's stream.
//!
//! So the streams, the routers that make them and the admins live in the hub's account
//! ([`HUB_ACCOUNT`]), and every agent and worker in an account of its own
//! (`ID_<identity>`, [`account_name`]), which reaches the hub's only through imports:
//! - every subject it may publish to is a service it imports from the hub's account; the hub's
//!   JetStream API (`$JS.API.…`) is imported under [`HUB_API_PREFIX`] (`$JS.hub.API.…`), and
//!   the account maps its own `$JS.API.>` there, so clients use the usual subjects while the
//!   broker's answer for an account without JetStream ("not enabled") never comes first;
//! - every subject it subscribes to, besides its own replies, is a stream it imports;
//! - every subject it serves (a worker's control requests) it exports to the hub's account,
//!   which imports it and exports it on to the agents (query and cancel of their tasks).
//!
//! The grants stay what they are ([`super::grants`]): the imports are derived from them, and
//! the broker still checks each user's permissions within its own account.

use super::grants::Grants;
use super::server_conf::User;

/// The hub's account: the streams, the routers and the admins.
pub const HUB_ACCOUNT: &str = "HUB";
/// The system account.
pub const SYSTEM_ACCOUNT: &str = "SYS";
/// The prefix of an identity account's names: `ID_<identity>`.
pub const IDENTITY_ACCOUNT_PREFIX: &str = "ID_";
/// The hub's JetStream API as an identity's account imports it.
pub const HUB_API_PREFIX: &str = "$JS.hub.API";
/// The JetStream API as clients name it.
const API_PREFIX: &str = "$JS.API";

/// What the hub's account exports to the identities' accounts as services: (subject, whether
/// a request may be answered by more than one message). Every service an identity imports is
/// within exactly one of them (tested).
const HUB_SERVICES: &[(&str, bool)] = &[
    // Their ingress: DMs, broadcasts, tasks, answers, results.
    ("hub.pub.>", false),
    // Attach, hub info and task channel reads, served by a router.
    ("hub.delivery.>", false),
    // A worker joining its queues.
    ("hub.work.*.join.*", false),
    // Their own audit events.
    ("hub.audit.>", false),
    // Query and cancel, served by the workers (imported from their accounts).
    ("hub.ctl.>", false),
    // The workers' answers to status requests.
    (crate::subjects::WORKER_STATUS_ANSWERS, false),
    // An agent's presence record.
    ("$KV.HUB_PRESENCE.>", false),
    // An agent's idempotency entries.
    ("$KV.HUB_IDEMPOTENCY.>", false),
    // A worker's task claims.
    ("$KV.HUB_CLAIMS.>", false),
    // Acks of the messages of their own consumers.
    ("$JS.ACK.>", false),
    // Pulls of their own consumers: a pull is answered by many messages.
    ("$JS.API.CONSUMER.MSG.NEXT.>", true),
    // Their own consumers' info.
    ("$JS.API.CONSUMER.INFO.>", false),
    // Direct reads: holds, presence, tombstones, a worker's task channel reads.
    ("$JS.API.DIRECT.GET.>", false),
    // A worker's baseline (the work stream's info).
    ("$JS.API.STREAM.INFO.>", false),
];

/// What the hub's account exports to the identities' accounts as streams.
const HUB_STREAMS: &[&str] = &[
    // An agent's tasks' results, live.
    "channel.task.>",
    // Status requests to the workers.
    crate::subjects::WORKER_STATUS_SUBJECT,
    // A queue's consumer changed (its workers read it again).
    crate::subjects::QUEUE_CHANGED_FILTER,
    // The broadcasts, live.
    crate::subjects::BROADCAST_FILTER,
];

/// Where an identity's connections live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// The hub's account: the routers (which make every stream) and the admins.
    Hub,
    /// An account of its own: agents, workers and hosts.
    Own,
}

/// Where `role`'s connections live.
pub fn home(role: &super::Role) -> Home {
    match role {
        super::Role::Router | super::Role::Admin => Home::Hub,
        super::Role::Agent | super::Role::Worker { .. } | super::Role::Host { .. } => Home::Own,
    }
}

/// The account of `identity`.
pub fn account_name(identity: &super::Identity) -> String {
    match home(&identity.role) {
        Home::Hub => HUB_ACCOUNT.to_owned(),
        Home::Own => format!("{IDENTITY_ACCOUNT_PREFIX}{}", identity.name),
    }
}

/// An import of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Import {
    /// Requests and publishes on `subject` (named `local` in the importing account) go to
    /// `account`, their replies mapped back.
    Service {
        /// The exporting account.
        account: String,
        /// The subject in the exporting account.
        subject: String,
        /// The subject in the importing account, when it differs.
        local: Option<String>,
    },
    /// Messages published on `subject` in `account` are delivered in the importing account too.
    Stream {
        /// The exporting account.
        account: String,
        /// The subject.
        subject: String,
    },
}

/// An export of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The subject (wildcards allowed).
    pub subject: String,
    /// A service (`Some(streamed)`: whether a request may be answered by many messages) or a
    /// stream (`None`).
    pub service: Option<bool>,
    /// The accounts that may import it.
    pub accounts: Vec<String>,
}

/// One account of the rendered config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Whether it has JetStream (the hub's account, on a durable hub).
    pub jetstream: bool,
    /// Its users, with their grants as the broker checks them in this account.
    pub users: Vec<User>,
    /// What it exports.
    pub exports: Vec<Export>,
    /// What it imports.
    pub imports: Vec<Import>,
    /// Subject mappings applied to what its clients publish: (from, to).
    pub mappings: Vec<(String, String)>,
}

/// `subject` as an identity's account names it: the hub's JetStream API under
/// [`HUB_API_PREFIX`], anything else as it is.
pub fn local_subject(subject: &str) -> String {
    match subject.strip_prefix(API_PREFIX) {
        Some(rest) if rest.is_empty() || rest.starts_with('.') => format!("{HUB_API_PREFIX}{rest}"),
        _ => subject.to_owned(),
    }
}

/// Whether NATS subject pattern `outer` covers every subject `inner` matches.
pub fn covers(outer: &str, inner: &str) -> bool {
    let (mut o, mut i) = (outer.split('.'), inner.split('.'));
    loop {
        match (o.next(), i.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The hub's service export that covers `subject`, if any.
fn hub_service_for(subject: &str) -> Option<&'static str> {
    HUB_SERVICES
        .iter()
        .map(|(s, _)| *s)
        .find(|s| covers(s, subject))
}

/// The accounts of a hub with `users` (in order): the hub's first, then one per agent and
/// worker, then the system account. `jetstream`: the hub's account has JetStream.
///
/// # Panics
/// When a grant is outside every export of the hub's account: the grants and
/// [`HUB_SERVICES`] are written together, and a test renders every role.
pub fn layout(users: &[User], jetstream: bool) -> Vec<Account> {
    let mut hub = Account {
        name: HUB_ACCOUNT.to_owned(),
        jetstream,
        users: Vec::new(),
        exports: Vec::new(),
        imports: Vec::new(),
        mappings: Vec::new(),
    };
    let mut own = Vec::new();
    for user in users {
        if home(&user.identity.role) == Home::Hub {
            hub.users.push(user.clone());
            continue;
        }
        let name = account_name(&user.identity);
        let reply = format!(
            "{}.{}.>",
            crate::subjects::DEFAULT_REPLY_PREFIX,
            user.identity.name
        );
        let mut imports = Vec::new();
        for subject in &user.grants.publish {
            assert!(
                hub_service_for(subject).is_some(),
                "{}: no export of the hub covers {subject}",
                user.identity.name
            );
            let local = local_subject(subject);
            imports.push(Import::Service {
                account: HUB_ACCOUNT.to_owned(),
                subject: subject.clone(),
                local: (local != *subject).then_some(local),
            });
        }
        for subject in user.grants.subscribe.iter().filter(|s| **s != reply) {
            assert!(
                HUB_STREAMS.iter().any(|s| covers(s, subject)),
                "{}: no stream export of the hub covers {subject}",
                user.identity.name
            );
            imports.push(Import::Stream {
                account: HUB_ACCOUNT.to_owned(),
                subject: subject.clone(),
            });
        }
        let mut exports = Vec::new();
        for subject in &user.grants.serves {
            exports.push(Export {
                subject: subject.clone(),
                service: Some(false),
                accounts: vec![HUB_ACCOUNT.to_owned()],
            });
            hub.imports.push(Import::Service {
                account: name.clone(),
                subject: subject.clone(),
                local: None,
            });
        }
        let grants = Grants {
            publish: user
                .grants
                .publish
                .iter()
                .map(|s| local_subject(s))
                .collect(),
            subscribe: user.grants.subscribe.clone(),
            serves: user.grants.serves.clone(),
        };
        own.push(Account {
            name,
            jetstream: false,
            users: vec![User {
                identity: user.identity.clone(),
                auth: user.auth.clone(),
                grants,
            }],
            exports,
            imports,
            mappings: vec![(format!("{API_PREFIX}.>"), format!("{HUB_API_PREFIX}.>"))],
        });
    }
    let importers: Vec<String> = own.iter().map(|a| a.name.clone()).collect();
    if !importers.is_empty() {
        for (subject, streamed) in HUB_SERVICES {
            hub.exports.push(Export {
                subject: (*subject).to_owned(),
                service: Some(*streamed),
                accounts: importers.clone(),
            });
        }
        for subject in HUB_STREAMS {
            hub.exports.push(Export {
                subject: (*subject).to_owned(),
                service: None,
                accounts: importers.clone(),
            });
        }
    }
    let mut out = vec![hub];
    out.extend(own);
    out.push(Account {
        name: SYSTEM_ACCOUNT.to_owned(),
        jetstream: false,
        users: Vec::new(),
        exports: Vec::new(),
        imports: Vec::new(),
        mappings: Vec::new(),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeliveryConfig;
    use crate::security::identities::IdentitiesFile;
    use crate::security::{grants, UserAuth};

    fn users() -> Vec<User> {
        IdentitiesFile::parse(
            r#"{"agents": ["alice", "bob"], "workers": [{"id": "w1", "queues": ["q", "r"]}],
                "routers": 2, "admins": ["ops"]}"#,
        )
        .unwrap()
        .all()
        .iter()
        .map(|identity| User {
            identity: identity.clone(),
            auth: UserAuth::Nkey {
                public: format!("U{}", identity.name),
            },
            grants: grants(identity, &DeliveryConfig::default()),
        })
        .collect()
    }

    fn account<'a>(accounts: &'a [Account], name: &str) -> &'a Account {
        accounts.iter().find(|a| a.name == name).unwrap()
    }

    #[test]
    fn routers_and_admins_share_the_hubs_account_and_every_other_identity_has_its_own() {
        let accounts = layout(&users(), true);
        let names: Vec<_> = accounts.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["HUB", "ID_alice", "ID_bob", "ID_w1", "SYS"]);
        let hub = account(&accounts, "HUB");
        assert!(hub.jetstream);
        let hub_users: Vec<_> = hub.users.iter().map(|u| u.identity.name.as_str()).collect();
        assert_eq!(hub_users, ["router-1", "router-2", "ops"]);
        for name in ["ID_alice", "ID_bob", "ID_w1"] {
            let a = account(&accounts, name);
            assert!(!a.jetstream, "{name}");
            assert_eq!(a.users.len(), 1, "{name}");
            assert_eq!(
                a.mappings,
                [("$JS.API.>".to_owned(), "$JS.hub.API.>".to_owned())]
            );
        }
    }

    #[test]
    fn every_import_is_within_exactly_one_export_of_the_account_it_names() {
        let accounts = layout(&users(), true);
        for importer in &accounts {
            for import in &importer.imports {
                let (from, subject, service) = match import {
                    Import::Service {
                        account, subject, ..
                    } => (account, subject, true),
                    Import::Stream { account, subject } => (account, subject, false),
                };
                let exporter = account(&accounts, from);
                let covering: Vec<_> = exporter
                    .exports
                    .iter()
                    .filter(|e| e.service.is_some() == service && covers(&e.subject, subject))
                    .collect();
                assert_eq!(covering.len(), 1, "{}: {import:?}", importer.name);
                assert!(
                    covering[0].accounts.contains(&importer.name),
                    "{}: {import:?}",
                    importer.name
                );
            }
        }
    }

    #[test]
    fn an_agent_imports_exactly_its_grants_and_reaches_the_api_under_the_hubs_prefix() {
        let accounts = layout(&users(), true);
        let alice = account(&accounts, "ID_alice");
        let granted = grants(
            IdentitiesFile::parse(r#"{"agents": ["alice"], "routers": 1}"#)
                .unwrap()
                .get("alice")
                .unwrap(),
            &DeliveryConfig::default(),
        );
        let services: Vec<_> = alice
            .imports
            .iter()
            .filter_map(|i| match i {
                Import::Service { subject, .. } => Some(subject.clone()),
                Import::Stream { .. } => None,
            })
            .collect();
        assert_eq!(services, granted.publish);
        assert!(alice.imports.contains(&Import::Service {
            account: "HUB".into(),
            subject: "$JS.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-alice".into(),
            local: Some("$JS.hub.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-alice".into()),
        }));
        assert!(alice.imports.contains(&Import::Stream {
            account: "HUB".into(),
            subject: "channel.task.alice.>".into(),
        }));
        // Her user may publish the API under the prefix it is mapped to, and nothing of bob's.
        let user = &alice.users[0].grants;
        assert!(user
            .publish
            .contains(&"$JS.hub.API.CONSUMER.MSG.NEXT.HUB_INBOX.inbox-alice".to_owned()));
        assert!(!user.publish.iter().any(|s| s.starts_with("$JS.API.")));
        assert!(!alice
            .imports
            .iter()
            .any(|i| format!("{i:?}").contains("bob")));
        assert!(alice.exports.is_empty());
    }

    #[test]
    fn a_worker_exports_its_control_requests_and_the_hub_imports_them() {
        let accounts = layout(&users(), true);
        let w1 = account(&accounts, "ID_w1");
        assert_eq!(
            w1.exports,
            [Export {
                subject: "hub.ctl.w1.>".into(),
                service: Some(false),
                accounts: vec!["HUB".into()],
            }]
        );
        let hub = account(&accounts, "HUB");
        assert_eq!(
            hub.imports,
            [Import::Service {
                account: "ID_w1".into(),
                subject: "hub.ctl.w1.>".into(),
                local: None,
            }]
        );
        assert!(w1.imports.contains(&Import::Stream {
            account: "HUB".into(),
            subject: "hub.admin.workers".into(),
        }));
    }

    #[test]
    fn a_hub_of_routers_and_admins_alone_exports_nothing() {
        let users: Vec<User> = users()
            .into_iter()
            .filter(|u| home(&u.identity.role) == Home::Hub)
            .collect();
        let accounts = layout(&users, false);
        assert_eq!(accounts.len(), 2);
        assert!(accounts[0].exports.is_empty() && !accounts[0].jetstream);
    }

    #[test]
    fn the_api_is_renamed_and_nothing_else() {
        assert_eq!(
            local_subject("$JS.API.DIRECT.GET.X"),
            "$JS.hub.API.DIRECT.GET.X"
        );
        assert_eq!(local_subject("$JS.ACK.X.y.>"), "$JS.ACK.X.y.>");
        assert_eq!(local_subject("$JS.APIX.y"), "$JS.APIX.y");
        assert_eq!(local_subject("hub.pub.a.*"), "hub.pub.a.*");
    }

    #[test]
    fn covers_is_subject_containment() {
        assert!(covers("hub.pub.>", "hub.pub.alice.*"));
        assert!(covers("hub.work.*.join.*", "hub.work.q.join.w1"));
        assert!(!covers("hub.work.*.join.*", "hub.work.>"));
        assert!(!covers("hub.pub.>", "hub.pub"));
        assert!(covers("hub.admin.workers", "hub.admin.workers"));
        assert!(!covers("hub.admin.workers.*.*", "hub.admin.workers"));
        assert!(covers("hub.admin.workers.*.*", "hub.admin.workers.*.w1"));
    }
}
