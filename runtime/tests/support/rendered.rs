//! A hub on the config `runtime render-config` writes: the rendered nats-server and clients
//! connected with an identity's rendered `.env` file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::oneshot::{assert_exit, run_cli, stdout};

/// A rendered config and the server running on it.
pub struct Rendered {
    /// What `--out` pointed at.
    pub dir: tempfile::TempDir,
    /// The server (its own loopback port; the rendered store).
    pub server: harness::NatsServer,
    /// What `render-config` printed.
    pub printed: String,
}

impl Rendered {
    /// Renders `identities` (JSON) with `args` after `--identities F --out D`, and starts a
    /// nats-server on the result.
    pub async fn start(identities: &str, args: &[&str]) -> Rendered {
        Self::start_with(identities, args, "").await
    }

    /// [`start`](Self::start), with `extra` appended to the rendered config first (e.g. a
    /// server feature flag).
    pub async fn start_with(identities: &str, args: &[&str], extra: &str) -> Rendered {
        let dir = tempfile::tempdir().unwrap();
        let (printed, out) = render_into(dir.path(), identities, args).await;
        if !extra.is_empty() {
            let conf = out.join("nats-server.conf");
            let text = std::fs::read_to_string(&conf).unwrap();
            std::fs::write(&conf, format!("{text}\n{extra}\n")).unwrap();
        }
        let server = harness::NatsServer::run(harness::ServerOptions {
            config_file: Some(dir.path().join("out/nats-server.conf")),
            ..Default::default()
        })
        .await
        .unwrap();
        Rendered {
            dir,
            server,
            printed,
        }
    }

    /// The rendered `.env` file of `identity`.
    pub fn env_file(&self, identity: &str) -> PathBuf {
        self.dir.path().join(format!("out/users/{identity}.env"))
    }

    /// The variables of `identity`'s `.env` file.
    pub fn env(&self, identity: &str) -> BTreeMap<String, String> {
        read_env(&self.env_file(identity))
    }

    /// The connection settings of `identity`'s `.env` file, on this server: what an
    /// [`runtime::ActorSystem`] of `identity` is built with.
    pub fn settings(&self, identity: &str) -> runtime::NatsSettings {
        let env = self.env(identity);
        let mut settings = runtime::NatsSettings::new(self.server.url());
        settings.nkey_seed = Some(env["NATS_NKEY_SEED"].clone());
        settings.inbox_prefix = Some(env["NATS_INBOX_PREFIX"].clone());
        settings
    }

    /// The environment a `runtime` process of `identity` gets: its `.env` file, with the URL
    /// of this server.
    pub fn process_env(&self, identity: &str) -> Vec<(String, String)> {
        let mut env = self.env(identity);
        env.insert("NATS_URL".into(), self.server.url());
        env.into_iter().collect()
    }

    /// A `runtime` process (`args`) running as `identity`, on its `.env` file alone.
    pub fn spawn_as(&self, identity: &str, args: &[&str]) -> harness::RuntimeProcess {
        let env = self.process_env(identity);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        harness::RuntimeProcess::spawn(args.iter().copied(), &env).unwrap()
    }

    /// Worker `identity` running on queue `q`, each attempt running `script` (`sh <file>`; see
    /// `actors::worker::ExecHandler`), its journal in this directory.
    pub fn worker(&self, identity: &str, script: &str) -> harness::RuntimeProcess {
        let path = self.dir.path().join(format!("{identity}-task.sh"));
        std::fs::write(&path, script).unwrap();
        let exec = format!("sh {}", path.display());
        let journal = self.dir.path().join(format!("{identity}-journal"));
        let journal = journal.display().to_string();
        let args = [
            "start",
            "--role",
            "worker",
            "--durable",
            "--queue",
            "q",
            "--exec",
            &exec,
            "--journal-dir",
            &journal,
        ];
        self.spawn_as(identity, &args)
    }

    /// The rendered router `router-1`, running.
    pub fn router(&self) -> harness::RuntimeProcess {
        self.spawn_as("router-1", &["start", "--role", "router", "--durable"])
    }

    /// Runs the one-shot command `args` as `identity`, on its `.env` file alone.
    pub async fn run_as(&self, identity: &str, args: &[&str]) -> std::process::Output {
        let env = self.process_env(identity);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        super::oneshot::run_cli_env(args, &env).await
    }

    /// The server log's permission violations.
    pub fn violations(&self) -> Vec<String> {
        self.server
            .log()
            .lines()
            .filter(|l| l.contains("Violation"))
            .map(str::to_owned)
            .collect()
    }

    /// A client connected as `identity` with its rendered credentials and inbox prefix.
    ///
    /// # Panics
    /// When it cannot connect.
    pub async fn connect(&self, identity: &str) -> Connected {
        self.try_connect(identity).await.unwrap()
    }

    /// [`connect`](Self::connect), or the error.
    pub async fn try_connect(&self, identity: &str) -> Result<Connected, async_nats::ConnectError> {
        let env = self.env(identity);
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = errors.clone();
        let options = match (env.get("NATS_NKEY_SEED"), env.get("NATS_PASSWORD")) {
            (Some(seed), _) => async_nats::ConnectOptions::with_nkey(seed.clone()),
            (None, Some(password)) => async_nats::ConnectOptions::with_user_and_password(
                env["NATS_USERNAME"].clone(),
                password.clone(),
            ),
            (None, None) => panic!("{identity}.env holds no secret"),
        };
        let client = options
            .custom_inbox_prefix(env["NATS_INBOX_PREFIX"].clone())
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        seen.lock().unwrap().push(e.to_string());
                    }
                }
            })
            .connection_timeout(Duration::from_secs(5))
            .connect(self.server.url())
            .await?;
        Ok(Connected { client, errors })
    }
}

/// Runs `render-config --identities <dir>/identities.json --out <dir>/out <args>`, asserts it
/// succeeded, and returns what it printed and the out directory.
pub async fn render_into(dir: &Path, identities: &str, args: &[&str]) -> (String, PathBuf) {
    let file = dir.join("identities.json");
    std::fs::write(&file, identities).unwrap();
    let out = dir.join("out");
    let (file_arg, out_arg) = (file.display().to_string(), out.display().to_string());
    let mut all = vec![
        "render-config",
        "--identities",
        &file_arg,
        "--out",
        &out_arg,
    ];
    all.extend_from_slice(args);
    let output = run_cli(&all).await;
    assert_exit(&output, 0, "render-config");
    (stdout(&output), out)
}

/// The `KEY=VALUE` lines of an env file.
pub fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A client of one identity, and the errors the server sent it (permission violations).
pub struct Connected {
    /// The connection.
    pub client: async_nats::Client,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Connected {
    /// Waits (flushing, with a deadline) until the server reported a permission violation
    /// that names `subject` (a JetStream API subject as the identity's own account names it,
    /// `$JS.hub.API.…`: `protocol::security::accounts::local_subject`).
    pub async fn refused(&self, subject: &str) {
        let _ = self.client.flush().await;
        let local = protocol::security::accounts::local_subject(subject);
        harness::wait_until("a permissions violation", super::DEADLINE, || {
            self.errors.lock().unwrap().iter().any(|e| {
                e.contains("Permissions Violation") && (e.contains(subject) || e.contains(&local))
            })
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no permissions violation for {subject}; errors: {:?}",
                self.errors.lock().unwrap()
            )
        });
    }

    /// Every error the server sent so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }
}
