//! The nats-server configuration `runtime render-config` writes: one hub account (with
//! JetStream on a durable hub), a system account, one user per identity with its [`Grants`],
//! and, on a durable hub, a `jetstream` block that fsyncs before every ack
//! (`sync_interval: always`).
//!
//! Pure text: the caller supplies the users' public material (an nkey's public key, or a
//! bcrypt hash of a password), never a secret.

use super::grants::Grants;
use super::identities::Identity;

/// The hub's account.
pub const HUB_ACCOUNT: &str = "HUB";
/// The system account.
pub const SYSTEM_ACCOUNT: &str = "SYS";

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
    out.push_str(&format!("  {HUB_ACCOUNT} {{\n"));
    if conf.store_dir.is_some() {
        out.push_str("    jetstream: enabled\n");
    }
    out.push_str("    users: [\n");
    for user in &conf.users {
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
        out.push_str(&format!(
            "          subscribe: {{ allow: {} }}\n",
            list(&user.grants.subscribe)
        ));
        if user.grants.allow_responses {
            out.push_str("          allow_responses: true\n");
        }
        out.push_str("        }\n      }\n");
    }
    out.push_str("    ]\n  }\n");
    out.push_str(&format!("  {SYSTEM_ACCOUNT} {{}}\n"));
    out.push_str("}\n\n");
    out.push_str(&format!("system_account: {SYSTEM_ACCOUNT}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::identities::IdentitiesFile;

    #[test]
    fn the_config_has_both_accounts_synced_jetstream_and_one_user_per_identity() {
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
                grants: Grants {
                    publish: vec!["hub.pub.x.>".into(), "$JS.API.INFO".into()],
                    subscribe: vec!["_INBOX.x.>".into()],
                    allow_responses: identity.name.as_str() != "alice",
                },
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
        assert!(text.contains("HUB {\n    jetstream: enabled"), "{text}");
        assert!(text.contains("nkey: \"UALICE\""), "{text}");
        assert!(
            text.contains("user: \"router-1\", password: \"$2b$11$hash\""),
            "{text}"
        );
        assert!(text.contains("\"$JS.API.INFO\""), "{text}");
        assert_eq!(text.matches("allow_responses: true").count(), 1, "{text}");
        assert!(!text.contains("tls {"), "{text}");
    }
}
