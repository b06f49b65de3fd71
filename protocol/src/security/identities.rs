//! The identities file of `runtime render-config`: who may connect, in which role.
//!
//! ```json
//! {
//!   "agents": ["alice", "bob"],
//!   "workers": [{"id": "w1", "queues": ["q"]}],
//!   "hosts": [{"id": "gw", "agents": ["carol", "dave"], "agent_prefix": "bot-"}],
//!   "routers": 1,
//!   "admins": ["ops"]
//! }
//! ```
//!
//! Decoding is strict: an unknown key is refused and named. `routers` is a count (named
//! `router-1` …) or a list of names; `agents`, `workers`, `hosts` and `admins` default to none.
//! Every name follows the agent id rules ([`AgentId`]: `[A-Za-z0-9_-]`, at most 64 bytes, not
//! starting with the system prefix `hub-`), queues the queue name rules, and a name is used
//! once across all roles (it names the broker user and its credentials file).
//!
//! A host acts for many agents over one connection (a gateway, an MCP server, a process of
//! many inboxes): the agents it lists, and those of `agents` whose names start with its
//! `agent_prefix`. A hosted agent needs no credentials of its own (listed under `agents` too,
//! it gets them), and may not be the name of a worker, router, admin or host.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::ids::{AgentId, IdError, QueueName, WorkerId};

/// The file as written ([`IdentitiesFile::parse`] validates it into [`Identities`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentitiesFile {
    /// Agent names.
    #[serde(default)]
    pub agents: Vec<String>,
    /// Workers and the queues each serves.
    #[serde(default)]
    pub workers: Vec<WorkerEntry>,
    /// Routers: a count, or names.
    pub routers: Routers,
    /// Hosts of many agents.
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    /// Operators.
    #[serde(default)]
    pub admins: Vec<String>,
}

/// One host of the identities file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// The host's name.
    pub id: String,
    /// The agents it acts for.
    #[serde(default)]
    pub agents: Vec<String>,
    /// It also acts for every agent of the file's `agents` whose name starts with this.
    #[serde(default)]
    pub agent_prefix: Option<String>,
}

/// One worker of the identities file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerEntry {
    /// The worker id.
    pub id: String,
    /// The queues it serves (at least one).
    pub queues: Vec<String>,
}

/// The routers of the identities file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Routers {
    /// How many: named `router-1`, `router-2`, ….
    Count(u32),
    /// Their names.
    Names(Vec<String>),
}

/// What each identity does on the hub, and so what the broker lets it do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Sends and reads its own messages, delegates tasks.
    Agent,
    /// Runs the tasks of its queues.
    Worker {
        /// The queues it serves.
        queues: Vec<QueueName>,
    },
    /// Acts for many agents over one connection: exactly what each of them may do.
    Host {
        /// The agents it acts for, in order, each once.
        agents: Vec<AgentId>,
    },
    /// Routes the ingress and makes every stream and consumer.
    Router,
    /// Runs the operator commands.
    Admin,
}

impl Role {
    /// The role's name, as the docs and errors say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Worker { .. } => "worker",
            Role::Host { .. } => "host",
            Role::Router => "router",
            Role::Admin => "admin",
        }
    }
}

/// One identity: a broker user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its name (the user, the reply prefix `_INBOX.<name>`, `hub.pub.<name>`).
    pub name: AgentId,
    /// Its role.
    pub role: Role,
}

impl Identity {
    /// The worker id of a worker identity.
    pub fn worker_id(&self) -> Option<WorkerId> {
        matches!(self.role, Role::Worker { .. })
            .then(|| WorkerId::new(self.name.as_str()).ok())
            .flatten()
    }
}

/// The validated identities, in file order: agents, workers, routers, admins, hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identities(Vec<Identity>);

impl Identities {
    /// Every identity.
    pub fn all(&self) -> &[Identity] {
        &self.0
    }

    /// The identity named `name`.
    pub fn get(&self, name: &str) -> Option<&Identity> {
        self.0.iter().find(|i| i.name.as_str() == name)
    }
}

/// Why an identities file is refused.
#[derive(Debug, thiserror::Error)]
pub enum IdentitiesError {
    /// Not JSON of the expected shape (an unknown key is named here).
    #[error("identities file is not valid")]
    Decode(#[source] serde_json::Error),
    /// A name breaks the id rules.
    #[error("identities file: {role} `{name}` is not a valid name")]
    InvalidName {
        /// The role it was listed under.
        role: &'static str,
        /// The name.
        name: String,
        /// Why.
        #[source]
        source: IdError,
    },
    /// A queue name breaks the queue rules.
    #[error("identities file: worker `{worker}`: queue `{queue}` is not a valid queue name")]
    InvalidQueue {
        /// The worker.
        worker: String,
        /// The queue.
        queue: String,
        /// Why.
        #[source]
        source: IdError,
    },
    /// A worker serves no queue.
    #[error("identities file: worker `{worker}` has no queues")]
    NoQueues {
        /// The worker.
        worker: String,
    },
    /// A host acts for no agent (none listed, none matching its prefix).
    #[error("identities file: host `{host}` acts for no agent")]
    NoHostedAgents {
        /// The host.
        host: String,
    },
    /// A host lists the name of an identity that is not an agent.
    #[error("identities file: host `{host}` lists `{name}`, which is a {role}, not an agent")]
    HostedNotAnAgent {
        /// The host.
        host: String,
        /// The name.
        name: String,
        /// Its role.
        role: &'static str,
    },
    /// A name is listed twice (in one role or two).
    #[error("identities file: `{name}` is listed more than once")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// No router: nothing would route, attach or make consumers.
    #[error("identities file: at least one router is needed")]
    NoRouter,
}

impl IdentitiesFile {
    /// Decodes and validates `json`.
    ///
    /// # Errors
    /// [`IdentitiesError`]: the first problem found.
    pub fn parse(json: &str) -> Result<Identities, IdentitiesError> {
        let file: IdentitiesFile = serde_json::from_str(json).map_err(IdentitiesError::Decode)?;
        file.validate()
    }

    /// Validates the file.
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn validate(self) -> Result<Identities, IdentitiesError> {
        let name = |role: &'static str, name: &str| {
            AgentId::new(name).map_err(|source| IdentitiesError::InvalidName {
                role,
                name: name.to_owned(),
                source,
            })
        };
        let mut out = Vec::new();
        for agent in &self.agents {
            out.push(Identity {
                name: name("agent", agent)?,
                role: Role::Agent,
            });
        }
        for worker in &self.workers {
            let id = name("worker", &worker.id)?;
            WorkerId::new(&worker.id).map_err(|source| IdentitiesError::InvalidName {
                role: "worker",
                name: worker.id.clone(),
                source,
            })?;
            if worker.queues.is_empty() {
                return Err(IdentitiesError::NoQueues {
                    worker: worker.id.clone(),
                });
            }
            let queues = worker
                .queues
                .iter()
                .map(|q| {
                    QueueName::new(q).map_err(|source| IdentitiesError::InvalidQueue {
                        worker: worker.id.clone(),
                        queue: q.clone(),
                        source,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.push(Identity {
                name: id,
                role: Role::Worker { queues },
            });
        }
        let routers = match &self.routers {
            Routers::Count(n) => (1..=*n).map(|i| format!("router-{i}")).collect(),
            Routers::Names(names) => names.clone(),
        };
        if routers.is_empty() {
            return Err(IdentitiesError::NoRouter);
        }
        for router in &routers {
            out.push(Identity {
                name: name("router", router)?,
                role: Role::Router,
            });
        }
        for admin in &self.admins {
            out.push(Identity {
                name: name("admin", admin)?,
                role: Role::Admin,
            });
        }
        let mut hosts = Vec::new();
        for host in &self.hosts {
            let id = name("host", &host.id)?;
            let mut agents: Vec<AgentId> = Vec::new();
            for agent in &host.agents {
                agents.push(name("hosted agent", agent)?);
            }
            if let Some(prefix) = host.agent_prefix.as_deref().filter(|p| !p.is_empty()) {
                for agent in self.agents.iter().filter(|a| a.starts_with(prefix)) {
                    agents.push(name("agent", agent)?);
                }
            }
            let mut seen = BTreeSet::new();
            agents.retain(|a| seen.insert(a.clone()));
            if agents.is_empty() {
                return Err(IdentitiesError::NoHostedAgents {
                    host: host.id.clone(),
                });
            }
            hosts.push(Identity {
                name: id,
                role: Role::Host { agents },
            });
        }
        // A host acts as each of its agents: none may be an identity of another role.
        for host in &hosts {
            let Role::Host { agents } = &host.role else {
                unreachable!("hosts are hosts")
            };
            let clash = agents.iter().find_map(|a| {
                out.iter()
                    .chain(&hosts)
                    .find(|i| &i.name == a && i.role != Role::Agent)
                    .map(|i| (a, i.role.as_str()))
            });
            if let Some((agent, role)) = clash {
                return Err(IdentitiesError::HostedNotAnAgent {
                    host: host.name.to_string(),
                    name: agent.to_string(),
                    role,
                });
            }
        }
        out.extend(hosts);
        let mut seen = BTreeSet::new();
        for identity in &out {
            if !seen.insert(identity.name.as_str()) {
                return Err(IdentitiesError::Duplicate {
                    name: identity.name.to_string(),
                });
            }
        }
        Ok(Identities(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_lists_every_identity_in_order() {
        let ids = IdentitiesFile::parse(
            r#"{"agents": ["alice", "bob"], "workers": [{"id": "w1", "queues": ["q", "r"]}],
                "routers": 2, "admins": ["ops"]}"#,
        )
        .unwrap();
        let names: Vec<_> = ids.all().iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["alice", "bob", "w1", "router-1", "router-2", "ops"]);
        assert_eq!(ids.get("w1").unwrap().worker_id().unwrap().as_str(), "w1");
        assert!(
            matches!(&ids.get("w1").unwrap().role, Role::Worker { queues } if queues.len() == 2)
        );
        assert_eq!(ids.get("ops").unwrap().role, Role::Admin);
        assert_eq!(ids.get("alice").unwrap().worker_id(), None);
    }

    #[test]
    fn a_host_acts_for_its_listed_agents_and_those_its_prefix_names() {
        let ids = IdentitiesFile::parse(
            r#"{"agents": ["bot-1", "bot-2", "alice"], "routers": 1,
                "hosts": [{"id": "gw", "agents": ["carol", "bot-1"], "agent_prefix": "bot-"}]}"#,
        )
        .unwrap();
        let Role::Host { agents } = &ids.get("gw").unwrap().role else {
            panic!("gw is a host")
        };
        let names: Vec<_> = agents.iter().map(AgentId::as_str).collect();
        assert_eq!(names, ["carol", "bot-1", "bot-2"]);
        assert_eq!(ids.get("gw").unwrap().role.as_str(), "host");
        // carol has no credentials of her own: she is not an identity.
        assert!(ids.get("carol").is_none());
    }

    #[test]
    fn a_host_of_no_agent_or_of_another_role_is_refused() {
        let err = IdentitiesFile::parse(r#"{"routers": 1, "hosts": [{"id": "gw"}]}"#).unwrap_err();
        assert!(
            matches!(err, IdentitiesError::NoHostedAgents { .. }),
            "{err}"
        );
        let err = IdentitiesFile::parse(
            r#"{"routers": 1, "hosts": [{"id": "gw", "agent_prefix": "nobody"}]}"#,
        )
        .unwrap_err();
        assert!(
            matches!(err, IdentitiesError::NoHostedAgents { .. }),
            "{err}"
        );
        for (file, name) in [
            (
                r#"{"routers": 1, "workers": [{"id": "w1", "queues": ["q"]}], "hosts": [{"id": "gw", "agents": ["w1"]}]}"#,
                "w1",
            ),
            (
                r#"{"routers": 1, "hosts": [{"id": "gw", "agents": ["router-1"]}]}"#,
                "router-1",
            ),
            (
                r#"{"routers": 1, "hosts": [{"id": "gw", "agents": ["gw2"]}, {"id": "gw2", "agents": ["a"]}]}"#,
                "gw2",
            ),
        ] {
            let err = IdentitiesFile::parse(file).unwrap_err();
            assert!(
                matches!(&err, IdentitiesError::HostedNotAnAgent { name: n, .. } if n == name),
                "{err}"
            );
        }
        let err = IdentitiesFile::parse(
            r#"{"routers": 1, "hosts": [{"id": "gw", "agents": ["a"], "agnets": []}]}"#,
        )
        .unwrap_err();
        assert!(
            crate::error_chain::ErrorChain(&err)
                .to_string()
                .contains("agnets"),
            "{err}"
        );
    }

    #[test]
    fn routers_may_be_named_and_the_other_roles_left_out() {
        let ids = IdentitiesFile::parse(r#"{"routers": ["edge-a"]}"#).unwrap();
        assert_eq!(ids.all().len(), 1);
        assert_eq!(ids.get("edge-a").unwrap().role, Role::Router);
    }

    #[test]
    fn an_unknown_key_is_refused_and_named() {
        let err = IdentitiesFile::parse(r#"{"routers": 1, "agnets": ["alice"]}"#).unwrap_err();
        assert!(matches!(err, IdentitiesError::Decode(_)), "{err:?}");
        assert!(
            crate::error_chain::ErrorChain(&err)
                .to_string()
                .contains("agnets"),
            "{err}"
        );
        let err = IdentitiesFile::parse(
            r#"{"routers": 1, "workers": [{"id": "w", "queues": ["q"], "x": 1}]}"#,
        )
        .unwrap_err();
        assert!(
            crate::error_chain::ErrorChain(&err)
                .to_string()
                .contains("`x`"),
            "{err}"
        );
    }

    #[test]
    fn bad_names_duplicates_and_missing_parts_are_refused() {
        let cases = [
            (r#"{"routers": 1, "agents": ["a.b"]}"#, "agent `a.b`"),
            (r#"{"routers": 1, "agents": ["hub-x"]}"#, "reserved prefix"),
            (
                r#"{"routers": 1, "workers": [{"id": "w", "queues": []}]}"#,
                "has no queues",
            ),
            (
                r#"{"routers": 1, "workers": [{"id": "w", "queues": ["q.x"]}]}"#,
                "queue `q.x`",
            ),
            (
                r#"{"routers": 1, "agents": ["x"], "admins": ["x"]}"#,
                "`x` is listed more than once",
            ),
            (
                r#"{"routers": ["router-1"], "agents": ["router-1"]}"#,
                "more than once",
            ),
            (r#"{"routers": 0}"#, "at least one router"),
            (r#"{"routers": []}"#, "at least one router"),
            (r#"{"agents": ["a"]}"#, "routers"),
        ];
        for (json, expected) in cases {
            let err = IdentitiesFile::parse(json).unwrap_err();
            assert!(
                crate::error_chain::ErrorChain(&err)
                    .to_string()
                    .contains(expected),
                "{json}: {err}"
            );
        }
    }
}
