//! The nats-server configuration `runtime render-config` writes: the hub's account (with
//! JetStream on a durable hub) holding the routers and admins, an account of its own for each
//! agent and worker with the imports its [`Grants`] need ([`super::accounts`]), a system
//! account, one user per identity with its grants, and, on a durable hub, a `jetstream` block
//! that fsyncs before every ack (`sync_interval: always`).
//!
//! Pure text: the caller supplies the users' public material (an nkey's public key, or a
//! bcrypt hash of a password), never a secret.

use super::accounts::{self, Account, Import, SYSTEM_ACCOUNT};
use super::grants::Grants;
use super::identities::Identity;

/// How a user proves who it is. Only public material: the secret stays with the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserAuth {
    /// An nkey: its public key (`U…`); the user signs the server's nonce with the seed.
    Nkey {
        /// The public key.
        public: String,
    },
    /// A user name and a bcrypt hash of its password.
    Password {
        /// The bcrypt hash (`$2a$…`/`$2b$…`).
        bcrypt: String,
    },
}

/// One user of the rendered config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Who.
    pub identity: Identity,
    /// How it authenticates.
    pub auth: UserAuth,
    /// What it may do.
    pub grants: Grants,
}

/// The server's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The server certificate (PEM).
    pub cert_file: String,
    /// Its private key (PEM).
    pub key_file: String,
}

/// What the config holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConf {
    /// `host:port` to listen on.
    pub listen: String,
    /// The JetStream store directory: a durable hub (`None`: core NATS only).
    pub store_dir: Option<String>,
    /// TLS, if any.
    pub tls: Option<ServerTls>,
    /// The users, in order.
    pub users: Vec<User>,
}

/// A quoted config string (JSON escapes, which the nats-server config parser reads; a quoted
/// `$` is not a variable reference).
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| q(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// The config file's text.
pub fn render(conf: &ServerConf) -> String {
    let mut out = String::new();
    out.push_str("# Rendered by `runtime render-config`; docs/SECURITY.md explains every grant.\n");
    out.push_str("# Re-render instead of editing: existing keys are kept unless --rotate.\n\n");
    out.push_str(&format!("listen: {}\n\n", q(&conf.listen)));
    if let Some(store_dir) = &conf.store_dir {
        out.push_str("jetstream {\n");
        out.push_str(&format!("  store_dir: {}\n", q(store_dir)));
        out.push_str("  # fsync before every ack: acknowledged data survives a power loss.\n");
        out.push_str("  sync_interval: always\n");
        out.push_str("}\n\n");
    }
    if let Some(tls) = &conf.tls {
        out.push_str("tls {\n");
        out.push_str(&format!("  cert_file: {}\n", q(&tls.cert_file)));
        out.push_str(&format!("  key_file: {}\n", q(&tls.key_file)));
        out.push_str("}\n\n");
    }
    out.push_str("accounts {\n");
    for account in accounts::layout(&conf.users, conf.store_dir.is_some()) {
        render_account(&mut out, &account);
    }
    out.push_str("}\n\n");
    out.push_str(&format!("system_account: {SYSTEM_ACCOUNT}\n"));
    out
}

/// One account's block.
fn render_account(out: &mut String, account: &Account) {
    if account.users.is_empty() && account.imports.is_empty() && account.exports.is_empty() {
        out.push_str(&format!("  {} {{}}\n", q(&account.name)));
        return;
    }
    out.push_str(&format!("  {} {{\n", q(&account.name)));
    if account.jetstream {
        out.push_str("    jetstream: enabled\n");
    }
    if !account.mappings.is_empty() {
        out.push_str("    mappings: {\n");
        for (from, to) in &account.mappings {
            out.push_str(&format!("      {}: {}\n", q(from), q(to)));
        }
        out.push_str("    }\n");
    }
    if !account.exports.is_empty() {
        out.push_str("    exports: [\n");
        for export in &account.exports {
            let kind = match export.service {
                Some(true) => format!("service: {}, response_type: stream", q(&export.subject)),
                Some(false) => format!("service: {}", q(&export.subject)),
                None => format!("stream: {}", q(&export.subject)),
            };
            out.push_str(&format!(
                "      {{ {kind}, accounts: {} }}\n",
                list(&export.accounts)
            ));
        }
        out.push_str("    ]\n");
    }
    if !account.imports.is_empty() {
        out.push_str("    imports: [\n");
        for import in &account.imports {
            let line = match import {
                Import::Service {
                    account,
                    subject,
                    local,
                } => {
                    let to = local
                        .as_ref()
                        .map(|l| format!(", to: {}", q(l)))
                        .unwrap_or_default();
                    format!(
                        "{{ service: {{ account: {}, subject: {} }}{to} }}",
                        q(account),
                        q(subject)
                    )
                }
                Import::Stream { account, subject } => format!(
                    "{{ stream: {{ account: {}, subject: {} }} }}",
                    q(account),
                    q(subject)
                ),
            };
            out.push_str(&format!("      {line}\n"));
        }
        out.push_str("    ]\n");
    }
    out.push_str("    users: [\n");
    for user in &account.users {
        render_user(out, user);
    }
    out.push_str("    ]\n  }\n");
}

/// One user's entry.
fn render_user(out: &mut String, user: &User) {
    out.push_str(&format!(
        "      # {} ({})\n",
        user.identity.name,
        user.identity.role.as_str()
    ));
    let auth = match &user.auth {
        UserAuth::Nkey { public } => format!("nkey: {}", q(public)),
        UserAuth::Password { bcrypt } => format!(
            "user: {}, password: {}",
            q(user.identity.name.as_str()),
            q(bcrypt)
        ),
    };
    out.push_str(&format!(
        "      {{\n        {auth}\n        permissions: {{\n"
    ));
    out.push_str(&format!(
        "          publish: {{ allow: {} }}\n",
        list(&user.grants.publish)
    ));
    let subscribe: Vec<String> = user.grants.subscriptions().cloned().collect();
    out.push_str(&format!(
        "          subscribe: {{ allow: {} }}\n",
        list(&subscribe)
    ));
    if user.grants.allow_responses() {
        out.push_str("          allow_responses: true\n");
    }
    out.push_str("        }\n      }\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DeliveryConfig;
    use crate::security::grants;
    use crate::security::identities::IdentitiesFile;

    #[test]
    fn the_config_has_the_hubs_account_one_account_per_agent_synced_jetstream_and_each_user() {
        let ids = IdentitiesFile::parse(r#"{"agents": ["alice"], "routers": 1}"#).unwrap();
        let users = ids
            .all()
            .iter()
            .map(|identity| User {
                identity: identity.clone(),
                auth: if identity.name.as_str() == "alice" {
                    UserAuth::Nkey {
                        public: "UALICE".into(),
                    }
                } else {
                    UserAuth::Password {
                        bcrypt: "$2b$11$hash".into(),
                    }
                },
                grants: grants(identity, &DeliveryConfig::default()),
            })
            .collect();
        let text = render(&ServerConf {
            listen: "0.0.0.0:4222".into(),
            store_dir: Some("/srv/hub/store".into()),
            tls: None,
            users,
        });
        assert!(text.contains("sync_interval: always"), "{text}");
        assert!(text.contains("store_dir: \"/srv/hub/store\""), "{text}");
        assert!(text.contains("system_account: SYS"), "{text}");
        assert!(text.contains("\"HUB\" {\n    jetstream: enabled"), "{text}");
        assert!(text.contains("\"ID_alice\" {\n    mappings"), "{text}");
        assert!(text.contains("\"$JS.API.>\": \"$JS.hub.API.>\""), "{text}");
        assert!(text.contains("nkey: \"UALICE\""), "{text}");
        assert!(
            text.contains("user: \"router-1\", password: \"$2b$11$hash\""),
            "{text}"
        );
        assert!(
            text.contains(
                "{ service: \"$JS.API.CONSUMER.MSG.NEXT.>\", response_type: stream, accounts: [\"ID_alice\"] }"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "{ service: { account: \"HUB\", subject: \"$JS.API.CONSUMER.INFO.HUB_INBOX.inbox-alice\" }, to: \"$JS.hub.API.CONSUMER.INFO.HUB_INBOX.inbox-alice\" }"
            ),
            "{text}"
        );
        // Only the router answers requests.
        assert_eq!(text.matches("allow_responses: true").count(), 1, "{text}");
        assert!(!text.contains("tls {"), "{text}");
    }
}
