//! `runtime render-config`: the nats-server configuration of a hub whose broker binds every
//! connection to its identity, and each identity's credentials (docs/SECURITY.md).
//!
//! Writes, under `--out DIR`:
//! - `nats-server.conf` (mode 0600): the hub account (JetStream with `--durable`), the system
//!   account, one user per identity with its grants ([`protocol::security`]);
//! - `users/<identity>.env` (mode 0600, in a 0700 directory): the environment the runtime's
//!   own CLI reads to connect as that identity (`NATS_URL`, the secret, `NATS_INBOX_PREFIX`,
//!   and the identity's `RUNTIME_AGENT_ID` or `RUNTIME_WORKER_ID`);
//! - `jetstream/`: the store directory the config names (with `--durable`).
//!
//! A re-render keeps each identity's existing secret (read back from its `.env` file) unless
//! `--rotate` is given or the auth method changed. No secret is printed: the command lists
//! the files it wrote.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use protocol::config::DeliveryConfig;
use protocol::security::{self, IdentitiesError, IdentitiesFile, Identity, Role, UserAuth};

use super::{AuthMethod, RenderConfigArgs};

/// The bcrypt cost of rendered passwords.
const BCRYPT_COST: u32 = 11;

/// Why nothing (or not everything) was rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The identities file could not be read.
    #[error("cannot read the identities file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The identities file is invalid.
    #[error(transparent)]
    Identities(#[from] IdentitiesError),
    /// The delivery config (stream names) is invalid.
    #[error(transparent)]
    Delivery(#[from] runtime::config::ConfigLoadError),
    /// A flag is missing its partner or is out of range.
    #[error("{0}")]
    Usage(String),
    /// An existing credentials file holds a secret that is not valid (its value is not shown).
    #[error("{path}: {what} is not valid; fix or delete the file, or render with --rotate")]
    BadSecret {
        /// The file.
        path: PathBuf,
        /// Which variable.
        what: &'static str,
    },
    /// A file or directory could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A key could not be made.
    #[error("cannot generate the secret of {identity}: {reason}")]
    Generate {
        /// Whose.
        identity: String,
        /// Why (no secret in it).
        reason: &'static str,
    },
}

impl RenderError {
    /// The exit code: a usage or configuration error (64), else a file that cannot be written
    /// (73).
    pub fn exit_code(&self) -> i32 {
        match self {
            RenderError::Write { .. } => runtime::exit::CANT_CREATE,
            RenderError::Generate { .. } => runtime::exit::SOFTWARE,
            _ => runtime::exit::USAGE,
        }
    }
}

/// One identity's secret.
enum Secret {
    /// An nkey seed (`SU…`).
    Seed(String),
    /// A password.
    Password(String),
}

/// Renders the config and the credentials; returns the files written.
///
/// # Errors
/// [`RenderError`]; a failure part-way leaves the files written so far (a re-render, which
/// keeps their secrets, completes them).
pub fn render(args: &RenderConfigArgs) -> Result<Vec<PathBuf>, RenderError> {
    let text = fs::read_to_string(&args.identities).map_err(|source| RenderError::Read {
        path: args.identities.clone(),
        source,
    })?;
    let identities = IdentitiesFile::parse(&text)?;
    let delivery = match &args.delivery_config {
        Some(path) => runtime::config::load_delivery_config(Some(path))?,
        None => DeliveryConfig::default(),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(security::ServerTls {
            cert_file: absolute(cert)?,
            key_file: absolute(key)?,
        }),
        (None, None) if args.tls_ca.is_none() => None,
        _ => {
            return Err(RenderError::Usage(
                "--tls-cert and --tls-key go together (and --tls-ca needs them)".into(),
            ))
        }
    };
    let tls_ca = args.tls_ca.as_deref().map(absolute).transpose()?;
    let out = &args.out;
    // Only a directory made here gets a mode: an existing one (`/srv`, `/tmp`) keeps its own.
    if !out.exists() {
        make_dir(out, 0o755)?;
    }
    let out = fs::canonicalize(out).map_err(|source| RenderError::Write {
        path: out.clone(),
        source,
    })?;
    let users_dir = out.join("users");
    make_dir(&users_dir, 0o700)?;
    let store_dir = out.join("jetstream");
    if args.durable {
        make_dir(&store_dir, 0o700)?;
    }
    let mut written = Vec::new();
    let mut users = Vec::new();
    for identity in identities.all() {
        let path = users_dir.join(format!("{}.env", identity.name));
        let secret = match (args.rotate, existing_secret(&path, args.auth)?) {
            (false, Some(secret)) => secret,
            _ => new_secret(identity, args.auth)?,
        };
        let auth = match &secret {
            Secret::Seed(seed) => UserAuth::Nkey {
                public: nkeys::KeyPair::from_seed(seed)
                    .map_err(|_| RenderError::BadSecret {
                        path: path.clone(),
                        what: "NATS_NKEY_SEED",
                    })?
                    .public_key(),
            },
            Secret::Password(password) => UserAuth::Password {
                bcrypt: bcrypt::hash(password, BCRYPT_COST).map_err(|_| RenderError::Generate {
                    identity: identity.name.to_string(),
                    reason: "bcrypt failed",
                })?,
            },
        };
        write_private(
            &path,
            env_file(identity, &secret, args, tls_ca.as_deref()).as_bytes(),
        )?;
        written.push(path);
        users.push(security::User {
            identity: identity.clone(),
            auth,
            grants: security::grants(identity, &delivery),
        });
    }
    let conf = security::ServerConf {
        listen: args.listen.clone(),
        store_dir: args.durable.then(|| store_dir.display().to_string()),
        tls,
        users,
    };
    let conf_path = out.join("nats-server.conf");
    write_private(&conf_path, security::render(&conf).as_bytes())?;
    written.insert(0, conf_path);
    Ok(written)
}

fn absolute(path: &Path) -> Result<String, RenderError> {
    std::path::absolute(path)
        .map(|p| p.display().to_string())
        .map_err(|e| RenderError::Usage(format!("{}: {e}", path.display())))
}

fn make_dir(path: &Path, mode: u32) -> Result<(), RenderError> {
    let write = |source| RenderError::Write {
        path: path.to_owned(),
        source,
    };
    fs::create_dir_all(path).map_err(write)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(write)
}

/// Writes `bytes` to `path`, readable by its owner only (also when it existed with a looser
/// mode).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), RenderError> {
    let write = |source| RenderError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(write)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(write)?;
    file.write_all(bytes).map_err(write)?;
    file.sync_all().map_err(write)
}

/// The `KEY=VALUE` lines of an env file.
fn read_env(path: &Path) -> Option<BTreeMap<String, String>> {
    let text = fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect(),
    )
}

/// The secret an existing credentials file holds for `auth`, if any.
fn existing_secret(path: &Path, auth: AuthMethod) -> Result<Option<Secret>, RenderError> {
    let Some(env) = read_env(path) else {
        return Ok(None);
    };
    Ok(match auth {
        AuthMethod::Nkey => match env.get("NATS_NKEY_SEED") {
            Some(seed) => {
                if nkeys::KeyPair::from_seed(seed).is_err() {
                    return Err(RenderError::BadSecret {
                        path: path.to_owned(),
                        what: "NATS_NKEY_SEED",
                    });
                }
                Some(Secret::Seed(seed.clone()))
            }
            None => None,
        },
        AuthMethod::Password => env
            .get("NATS_PASSWORD")
            .filter(|p| !p.is_empty())
            .map(|p| Secret::Password(p.clone())),
    })
}

fn new_secret(identity: &Identity, auth: AuthMethod) -> Result<Secret, RenderError> {
    let failed = |reason| RenderError::Generate {
        identity: identity.name.to_string(),
        reason,
    };
    match auth {
        AuthMethod::Nkey => nkeys::KeyPair::new_user()
            .seed()
            .map(Secret::Seed)
            .map_err(|_| failed("no nkey seed")),
        AuthMethod::Password => {
            let mut bytes = [0u8; 24];
            getrandom::getrandom(&mut bytes).map_err(|_| failed("no randomness"))?;
            Ok(Secret::Password(
                bytes.iter().map(|b| format!("{b:02x}")).collect(),
            ))
        }
    }
}

/// The credentials file of `identity`.
fn env_file(
    identity: &Identity,
    secret: &Secret,
    args: &RenderConfigArgs,
    tls_ca: Option<&str>,
) -> String {
    // No comment line: `env $(cat X.env) runtime …` takes every word as a variable.
    let mut out = format!("NATS_URL={}\n", args.client_url);
    match secret {
        Secret::Seed(seed) => out.push_str(&format!("NATS_NKEY_SEED={seed}\n")),
        Secret::Password(password) => {
            out.push_str(&format!("NATS_USERNAME={}\n", identity.name));
            out.push_str(&format!("NATS_PASSWORD={password}\n"));
        }
    }
    out.push_str(&format!(
        "NATS_INBOX_PREFIX={}.{}\n",
        protocol::subjects::DEFAULT_REPLY_PREFIX,
        identity.name
    ));
    if let Some(ca) = tls_ca {
        out.push_str(&format!("NATS_TLS_CA={ca}\n"));
    }
    match &identity.role {
        Role::Agent => out.push_str(&format!("RUNTIME_AGENT_ID={}\n", identity.name)),
        Role::Worker { .. } => out.push_str(&format!("RUNTIME_WORKER_ID={}\n", identity.name)),
        Role::Host { .. } | Role::Router | Role::Admin => {}
    }
    out
}

/// `runtime render-config`, printing each file written (never a secret).
///
/// # Errors
/// As [`render`].
pub fn print_render(args: &RenderConfigArgs) -> anyhow::Result<()> {
    for path in render(args)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
