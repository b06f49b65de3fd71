//! NATS connection settings: URL, one authentication method, connect timeout.
//!
//! Secrets (token, password, seed, creds file contents) are never printed: the `Debug` impl
//! redacts them and no error or log message contains them. A URL is shown only through
//! [`redact_url`], which hides credentials embedded in it (`user:pass@`, a query, a fragment)
//! and keeps the rest, so the operator still sees which server is meant.

use std::path::PathBuf;
use std::time::Duration;

/// Connection failures and invalid settings.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// More than one authentication method was given.
    #[error("only one nats authentication method may be set, got {0}")]
    ConflictingAuth(String),
    /// A password without a username.
    #[error("a nats password needs a username (NATS_USERNAME / --nats-username)")]
    PasswordWithoutUsername,
    /// A client certificate without its key, or a key without its certificate.
    #[error("a tls client certificate and its key go together (--tls-cert and --tls-key)")]
    TlsCertWithoutKey,
    /// The URL is not a usable NATS server address.
    #[error("invalid nats url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given, through [`redact_url`].
        url: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The inbox prefix is not a literal subject prefix.
    #[error("invalid inbox prefix {0:?}: dot-separated tokens without wildcards or whitespace")]
    InvalidInboxPrefix(String),
    /// The credentials file could not be read.
    #[error("cannot read nats credentials file {path}")]
    Creds {
        /// The file.
        path: PathBuf,
        /// Why: async-nats' read or parse error, which names the file but never shows its
        /// contents.
        #[source]
        source: std::io::Error,
    },
    /// The server could not be reached in time, or refused the connection.
    #[error("cannot connect to nats at {url}")]
    Unreachable {
        /// The URL, through [`redact_url`].
        url: String,
        /// Why.
        #[source]
        source: ConnectFailure,
    },
}

/// Why the server could not be reached ([`ConnectError::Unreachable`]).
///
/// Holds no secret: the URL async-nats was given has no credentials ([`validate`] refuses a
/// userinfo, query or fragment), and its errors show no token, password or seed (the
/// `*_show_no_secret_*` tests check both `Display` and `Debug`).
///
/// [`validate`]: NatsSettings::validate
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    /// async-nats' error: a refusal (authentication, TLS...), or the last of the retried
    /// failures (connection refused, DNS, timed out).
    #[error(transparent)]
    Refused(async_nats::ConnectError),
    /// No connection came within the connect timeout.
    #[error("no connection within {0:?}")]
    TimedOut(Duration),
}

impl ConnectError {
    /// Whether this is the operator's configuration mistake (exit 64) rather than an unreachable
    /// server (exit 69).
    pub fn is_usage(&self) -> bool {
        !matches!(self, ConnectError::Unreachable { .. })
    }
}

/// How long a connection's server may be silent before the client pings it, unless the
/// settings say otherwise. Three silent intervals (two pings unanswered) and the client
/// reconnects, to another node of a cluster: a frozen node (paused, or its host stalled, its
/// sockets still open) is left within about 6 s. async-nats's own default of 60 s kept a client
/// on one for three minutes, every publish through it failing.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// The server a lost connection reconnects to: the one with the fewest failed attempts, and
/// among those any but the server just lost. A server taken for dead by its pings may only be
/// frozen: its kernel still accepts the connection, and the handshake then waits the whole
/// connect timeout for an INFO that does not come; async-nats's own choice (a shuffle) picked
/// it again one time in three. `None` leaves the choice to async-nats, which tries every
/// server in turn: so for the first connection (no server was connected yet, `last` names
/// none), where one pick that fails would fail the whole connect.
pub fn next_server(
    servers: &[async_nats::Server],
    last: &async_nats::ServerInfo,
) -> Option<async_nats::ReconnectToServer> {
    if last.port == 0 {
        return None;
    }
    let is_last = |s: &async_nats::Server| s.addr.host() == last.host && s.addr.port() == last.port;
    servers
        .iter()
        .min_by_key(|s| (s.failed_attempts, is_last(s)))
        .map(|s| async_nats::ReconnectToServer {
            addr: s.addr.clone(),
            delay: None,
        })
}

/// How to reach NATS. Build it by hand or from the CLI flags.
#[derive(Clone, Default)]
pub struct NatsSettings {
    /// Server URL (`nats://`, `tls://`, `ws://` or `wss://`), or a cluster's comma-separated
    /// list of them: the client connects to one and reconnects across all.
    pub url: String,
    /// Token auth.
    pub token: Option<String>,
    /// User for user/password auth.
    pub username: Option<String>,
    /// Password for user/password auth.
    pub password: Option<String>,
    /// User NKey seed.
    pub nkey_seed: Option<String>,
    /// Credentials file (JWT + seed).
    pub creds_file: Option<PathBuf>,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
    /// How long the server may be silent before the client pings it; after three silent
    /// intervals the connection is taken for dead and the client moves to another server
    /// (`None`: [`PING_INTERVAL`]).
    pub ping_interval: Option<Duration>,
    /// The connection's inbox prefix (its request reply subjects are `<prefix>.<...>`); `None`
    /// for `_INBOX`. The services of a system on this connection answer requests only on
    /// replies under it.
    pub inbox_prefix: Option<String>,
    /// A CA (PEM) to verify the server's certificate with, beside the system's roots. Any TLS
    /// setting, like a `tls://` URL, requires TLS.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for servers that verify clients; with [`tls_key`](Self::tls_key).
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
}

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |v: &Option<String>| v.as_ref().map(|_| REDACTED);
        f.debug_struct("NatsSettings")
            .field("url", &redact_url(&self.url))
            .field("token", &redact(&self.token))
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("nkey_seed", &redact(&self.nkey_seed))
            .field("creds_file", &self.creds_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("ping_interval", &self.ping_interval)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .finish()
    }
}

/// The one authentication method in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// No authentication.
    None,
    /// Token.
    Token,
    /// User and password.
    UserPassword,
    /// NKey seed.
    NKey,
    /// Credentials file.
    Creds,
}

impl NatsSettings {
    /// The connection's inbox prefix: `inbox_prefix`, else `_INBOX`.
    pub fn reply_prefix(&self) -> &str {
        self.inbox_prefix
            .as_deref()
            .unwrap_or(protocol::subjects::DEFAULT_REPLY_PREFIX)
    }

    /// Settings for `url` with no auth and a 10 s connect timeout.
    pub fn new(url: impl Into<String>) -> Self {
        NatsSettings {
            url: url.into(),
            connect_timeout: Duration::from_secs(10),
            ..Default::default()
        }
    }

    /// Checks the URL, the inbox prefix, and that at most one authentication method is set.
    ///
    /// # Errors
    /// [`ConnectError::ConflictingAuth`], [`ConnectError::PasswordWithoutUsername`] or
    /// [`ConnectError::InvalidUrl`], [`ConnectError::InvalidInboxPrefix`].
    pub fn validate(&self) -> Result<AuthMethod, ConnectError> {
        server_addrs(&self.url)?;
        if !protocol::subjects::is_valid_reply_prefix(self.reply_prefix()) {
            return Err(ConnectError::InvalidInboxPrefix(
                self.reply_prefix().to_owned(),
            ));
        }
        let mut set = Vec::new();
        if self.token.is_some() {
            set.push("token");
        }
        if self.username.is_some() || self.password.is_some() {
            set.push("username/password");
        }
        if self.nkey_seed.is_some() {
            set.push("nkey seed");
        }
        if self.creds_file.is_some() {
            set.push("credentials file");
        }
        if set.len() > 1 {
            return Err(ConnectError::ConflictingAuth(set.join(" and ")));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(ConnectError::PasswordWithoutUsername);
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConnectError::TlsCertWithoutKey);
        }
        Ok(match set.first().copied() {
            None => AuthMethod::None,
            Some("token") => AuthMethod::Token,
            Some("username/password") => AuthMethod::UserPassword,
            Some("nkey seed") => AuthMethod::NKey,
            _ => AuthMethod::Creds,
        })
    }

    /// Connects, retrying refused connections for at most `connect_timeout` (authentication
    /// failures are final at once). Afterwards the client reconnects on its own, forever.
    ///
    /// # Errors
    /// The validation errors of [`validate`](Self::validate), [`ConnectError::Creds`], or
    /// [`ConnectError::Unreachable`].
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind but a dropped connection attempt.
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, ConnectError> {
        let method = self.validate()?;
        let servers = server_addrs(&self.url)?;
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .custom_inbox_prefix(self.reply_prefix())
            .connection_timeout(self.connect_timeout)
            .ping_interval(self.ping_interval.unwrap_or(PING_INTERVAL))
            .reconnect_to_server_callback(
                |servers, last| async move { next_server(&servers, &last) },
            )
            .max_reconnects(None)
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Disconnected => tracing::warn!("nats disconnected"),
                    async_nats::Event::Connected => tracing::info!("nats connected"),
                    async_nats::Event::SlowConsumer(sid) => {
                        tracing::error!(sid, "nats slow consumer: messages were dropped")
                    }
                    other => tracing::info!(event = %other, "nats event"),
                }
            });
        options = match method {
            AuthMethod::None => options,
            AuthMethod::Token => options.token(self.token.clone().unwrap_or_default()),
            AuthMethod::UserPassword => options.user_and_password(
                self.username.clone().unwrap_or_default(),
                self.password.clone().unwrap_or_default(),
            ),
            AuthMethod::NKey => options.nkey(self.nkey_seed.clone().unwrap_or_default()),
            AuthMethod::Creds => {
                let path = self.creds_file.clone().unwrap_or_default();
                options
                    .credentials_file(&path)
                    .await
                    .map_err(|source| ConnectError::Creds { path, source })?
            }
        };
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        let tls_url = servers.iter().any(|s| s.as_url_str().starts_with("tls://"));
        if self.tls_ca.is_some() || self.tls_cert.is_some() || tls_url {
            options = options.require_tls(true);
        }
        // Retry refused connections until the timeout: a router started just before its
        // server (a supervisor starting both) waits instead of failing at once.
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let mut failures = 0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let connecting = options.clone().connect(servers.as_slice());
            let last = match tokio::time::timeout(left, connecting).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) => {
                    use async_nats::ConnectErrorKind as Kind;
                    let transient = matches!(e.kind(), Kind::Io | Kind::TimedOut | Kind::Dns);
                    if !transient {
                        return Err(ConnectError::Unreachable {
                            url: redact_url(&self.url),
                            source: ConnectFailure::Refused(e),
                        });
                    }
                    ConnectFailure::Refused(e)
                }
                Err(_) => ConnectFailure::TimedOut(self.connect_timeout),
            };
            failures += 1;
            let pause = CONNECT_BACKOFF.delay(failures);
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(ConnectError::Unreachable {
                    url: redact_url(&self.url),
                    source: last,
                });
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// The pause after the `n`-th refused connection in a row: 50 ms, doubling, at most 1 s.
const CONNECT_BACKOFF: actors::supervision::Backoff = actors::supervision::Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(1),
    factor: 2,
    reset_after: None,
};

/// What replaces the hidden parts of a URL in [`redact_url`].
const REDACTED: &str = "<redacted>";

/// `url` with whatever may carry credentials hidden: everything before its last `@` (userinfo,
/// whatever characters it holds), and its query and fragment (the rest parsed with the `url`
/// crate). The scheme, host, port and path stay, so an error still names the server; what does
/// not parse as a host is hidden whole. A comma-separated list of URLs is shown URL by URL.
///
/// ```
/// use runtime::connect::redact_url;
/// assert_eq!(redact_url("nats://u:secret@h:4222"), "nats://<redacted>@h:4222");
/// assert_eq!(redact_url("nats://h:4222?token=secret"), "nats://h:4222?<redacted>");
/// assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
/// assert_eq!(redact_url("u:secret@h:4222"), "<redacted>@h:4222");
/// ```
pub fn redact_url(url: &str) -> String {
    if url.contains(',') && url.split(',').all(|one| one.contains("://")) {
        // A cluster's list (`NATS_URL=nats://a:4222,nats://b:4222`): each shown as one. A comma
        // inside one URL's credentials (`nats://to,ken@h`) leaves a piece without a scheme,
        // and the whole is then taken as one URL.
        return url.split(',').map(redact_url).collect::<Vec<_>>().join(",");
    }
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    // Everything before the last `@` is credentials, whatever it holds (`/`, `?` or `#` end a
    // URL's host for the `url` crate, which would show them as a path or query).
    let (userinfo, location) = match rest.rsplit_once('@') {
        Some((_, location)) => (true, location),
        None => (false, rest),
    };
    let Some(parsed) = url::Url::parse(&format!("nats://{location}"))
        .ok()
        .filter(url::Url::has_host)
    else {
        return REDACTED.to_owned();
    };
    let mut shown = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        shown.push_str(scheme);
        shown.push_str("://");
    }
    if userinfo {
        shown.push_str(REDACTED);
        shown.push('@');
    }
    shown.push_str(parsed.host_str().unwrap_or_default());
    if let Some(port) = parsed.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(parsed.path());
    for (mark, part) in [('?', parsed.query()), ('#', parsed.fragment())] {
        if part.is_some() {
            shown.push(mark);
            shown.push_str(REDACTED);
        }
    }
    shown
}

/// The servers of `urls`, a comma-separated list (a cluster's nodes, as the nats CLI takes
/// them), each checked by [`validate_url`].
fn server_addrs(urls: &str) -> Result<Vec<async_nats::ServerAddr>, ConnectError> {
    urls.split(',')
        .map(|url| {
            let url = url.trim();
            validate_url(url)?;
            url.parse().map_err(|_| ConnectError::InvalidUrl {
                url: redact_url(url),
                reason: "expected scheme://host[:port]",
            })
        })
        .collect()
}

fn validate_url(url: &str) -> Result<(), ConnectError> {
    let invalid = |reason: &'static str| ConnectError::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    if !url.contains("://") {
        return Err(invalid("expected scheme://host[:port]"));
    }
    let parsed = url::Url::parse(url).map_err(|_| invalid("expected scheme://host[:port]"))?;
    if !matches!(parsed.scheme(), "nats" | "tls" | "ws" | "wss") {
        return Err(invalid("the scheme must be nats, tls, ws or wss"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid(
            "credentials in the url are not allowed; use one of the auth options",
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() || parsed.fragment().is_some()
    {
        return Err(invalid("no path, query or fragment allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str, failed_attempts: usize) -> async_nats::Server {
        async_nats::Server {
            addr: url.parse().unwrap(),
            failed_attempts,
            did_connect: true,
            is_discovered: false,
            last_error: None,
        }
    }

    #[test]
    fn a_lost_connection_goes_to_another_server_unless_that_one_failed_more() {
        let last = async_nats::ServerInfo {
            host: "127.0.0.1".into(),
            port: 4001,
            ..Default::default()
        };
        let pick =
            |servers: &[async_nats::Server]| next_server(servers, &last).map(|s| s.addr.port());
        let frozen = server("nats://127.0.0.1:4001", 0);
        let (b, c) = (
            server("nats://127.0.0.1:4002", 0),
            server("nats://127.0.0.1:4003", 0),
        );
        assert_eq!(pick(&[frozen.clone(), b.clone(), c.clone()]), Some(4002));
        // 4002 failed once: the other one, then the lost one once both others failed.
        let b_failed = server("nats://127.0.0.1:4002", 1);
        assert_eq!(
            pick(&[frozen.clone(), b_failed.clone(), c.clone()]),
            Some(4003)
        );
        let c_failed = server("nats://127.0.0.1:4003", 1);
        assert_eq!(pick(&[frozen.clone(), b_failed, c_failed]), Some(4001));
        // A single server is the one to go back to.
        assert_eq!(pick(std::slice::from_ref(&frozen)), Some(4001));
        assert_eq!(pick(&[]), None);
        // The first connection, no server connected yet: async-nats tries them all (a pick of
        // a dead first server failed the connect).
        let first = next_server(&[frozen], &async_nats::ServerInfo::default());
        assert!(first.is_none());
    }

    #[test]
    fn two_auth_methods_are_rejected() {
        let mut s = NatsSettings::new("nats://127.0.0.1:4222");
        s.token = Some("t".into());
        s.nkey_seed = Some("SU...".into());
        assert!(matches!(
            s.validate(),
            Err(ConnectError::ConflictingAuth(ref m)) if m == "token and nkey seed"
        ));
    }

    #[test]
    fn password_needs_username() {
        let mut s = NatsSettings::new("nats://127.0.0.1:4222");
        s.password = Some("p".into());
        assert!(matches!(
            s.validate(),
            Err(ConnectError::PasswordWithoutUsername)
        ));
    }

    #[test]
    fn single_methods_are_accepted() {
        let mut s = NatsSettings::new("nats://127.0.0.1:4222");
        assert_eq!(s.validate().unwrap(), AuthMethod::None);
        s.username = Some("u".into());
        s.password = Some(String::new());
        assert_eq!(s.validate().unwrap(), AuthMethod::UserPassword);
    }

    #[test]
    fn redact_url_hides_credentials_and_keeps_the_server() {
        for (url, shown) in [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://u:p@h:1", "nats://<redacted>@h:1"),
            ("nats://tok@h:1", "nats://<redacted>@h:1"),
            ("nats://u:p@ss@h:1/", "nats://<redacted>@h:1/"),
            ("nats://u:a/b@h:1", "nats://<redacted>@h:1"),
            ("nats://tok/en@h:1", "nats://<redacted>@h:1"),
            ("nats://tok?en@h:1", "nats://<redacted>@h:1"),
            ("nats://to,ken@h:1", "nats://<redacted>@h:1"),
            ("ws://h:1/ws?token=t#f", "ws://h:1/ws?<redacted>#<redacted>"),
            ("nats://h:1#frag", "nats://h:1#<redacted>"),
            (
                "nats://u@h:1?x#y",
                "nats://<redacted>@h:1?<redacted>#<redacted>",
            ),
            ("u:p@h:1", "<redacted>@h:1"),
            ("h:1", "h:1"),
            ("nats://u:p@[::1", "<redacted>"),
            ("", "<redacted>"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_list_of_urls_is_each_checked_and_each_redacted() {
        let list = "nats://127.0.0.1:4222, nats://h:2";
        assert_eq!(server_addrs(list).unwrap().len(), 2);
        assert_eq!(
            NatsSettings::new(list).validate().unwrap(),
            AuthMethod::None
        );
        let bad = "nats://127.0.0.1:4222,nats://u:secret@h:2";
        let err = NatsSettings::new(bad).validate().unwrap_err();
        assert!(
            matches!(err, ConnectError::InvalidUrl { ref url, .. } if url == "nats://<redacted>@h:2"),
            "{err:?}"
        );
        assert_eq!(
            redact_url("nats://a:1,nats://u:p@b:2"),
            "nats://a:1,nats://<redacted>@b:2"
        );
        for bad in ["nats://a:1,", ",nats://a:1", "nats://a:1,,nats://b:2"] {
            assert!(NatsSettings::new(bad).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let mut s = NatsSettings::new("nats://127.0.0.1:4222");
        s.token = Some("supersecret".into());
        assert!(!format!("{s:?}").contains("supersecret"));
    }

    #[test]
    fn bad_urls_are_rejected() {
        for url in [
            "127.0.0.1:4222",
            "http://x",
            "nats://",
            "nats://h/path",
            "nats://u:p@h",
            "nats://h?token=t",
            "nats://h#f",
            "nats://h:port",
        ] {
            assert!(
                matches!(
                    NatsSettings::new(url).validate(),
                    Err(ConnectError::InvalidUrl { .. })
                ),
                "{url}"
            );
        }
    }

    use harness::secrets::{creds_file, JWT, PASSWORD, SEED, TOKEN};

    /// One settings per auth method for `url`, each with its secrets: `(method, settings,
    /// secrets)`.
    fn each_auth_method(
        url: &str,
        dir: &std::path::Path,
    ) -> Vec<(&'static str, NatsSettings, Vec<&'static str>)> {
        let base = || {
            let mut s = NatsSettings::new(url);
            s.connect_timeout = Duration::from_millis(500);
            s
        };
        let mut token = base();
        token.token = Some(TOKEN.into());
        let mut user = base();
        user.username = Some("alice".into());
        user.password = Some(PASSWORD.into());
        let mut nkey = base();
        nkey.nkey_seed = Some(SEED.into());
        let mut creds = base();
        creds.creds_file = Some(creds_file(dir));
        vec![
            ("token", token, vec![TOKEN]),
            ("user/password", user, vec![PASSWORD]),
            ("nkey seed", nkey, vec![SEED]),
            ("creds file", creds, vec![JWT, SEED]),
        ]
    }

    /// Asserts that neither `Display` nor `Debug` of `err` shows any of `secrets`.
    fn assert_no_secret(err: &ConnectError, secrets: &[&str], what: &str) {
        let shown = format!("{err} {err:?}");
        for secret in secrets {
            assert!(!shown.contains(secret), "{what}: secret shown in {shown}");
        }
    }

    #[tokio::test]
    async fn invalid_url_errors_show_no_secret_for_any_auth_method() {
        let dir = tempfile::tempdir().unwrap();
        for (method, _, secrets) in each_auth_method("nats://127.0.0.1:4222", dir.path()) {
            for secret in &secrets {
                for url in [
                    format!("nats://alice:{secret}@127.0.0.1:4222"),
                    format!("nats://{secret}@127.0.0.1:4222"),
                    format!("nats://alice:{secret}@127.0.0.1:4222/path"),
                    format!("nats://alice:a/{secret}@127.0.0.1:4222"),
                    format!("http://alice:{secret}@127.0.0.1:4222"),
                    format!("alice:{secret}@127.0.0.1:4222"),
                    format!("nats://127.0.0.1:4222?auth_token={secret}"),
                    format!("nats://127.0.0.1:4222#{secret}"),
                ] {
                    let (_, mut settings, _) = each_auth_method(&url, dir.path())
                        .into_iter()
                        .find(|(m, _, _)| *m == method)
                        .unwrap();
                    settings.url = url.clone();
                    let what = format!("{method}, {url}");
                    assert!(
                        !format!("{settings:?}").contains(secret),
                        "{what}: settings debug"
                    );
                    let err = settings.validate().expect_err(&what);
                    assert!(
                        matches!(err, ConnectError::InvalidUrl { .. }),
                        "{what}: {err}"
                    );
                    assert_no_secret(&err, &secrets, &what);
                    // The rest of the URL stays, so the operator knows which one is wrong.
                    let shown = err.to_string();
                    assert!(shown.contains("127.0.0.1:4222"), "{what}: {err}");
                    assert!(shown.contains(REDACTED), "{what}: {err}");
                    let err = settings.connect("test").await.expect_err(&what);
                    assert_no_secret(&err, &secrets, &what);
                }
            }
        }
    }

    #[tokio::test]
    async fn unreachable_server_errors_show_no_secret_for_any_auth_method() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("nats://127.0.0.1:{}", harness::free_port().unwrap());
        for (method, settings, secrets) in each_auth_method(&url, dir.path()) {
            let err = settings.connect("test").await.expect_err(method);
            assert!(
                matches!(err, ConnectError::Unreachable { .. }),
                "{method}: {err}"
            );
            assert_no_secret(&err, &secrets, method);
        }
        // A creds file that does not parse: its contents are not echoed either.
        let bad = dir.path().join("bad.creds");
        std::fs::write(
            &bad,
            format!(
                "-----BEGIN NATS USER JWT-----\n{JWT}\n------END NATS USER JWT------\n\n\
                     -----BEGIN USER NKEY SEED-----\nSU{TOKEN}\n------END USER NKEY SEED------\n"
            ),
        )
        .unwrap();
        let mut settings = NatsSettings::new(&url);
        settings.creds_file = Some(bad);
        let err = settings.connect("test").await.expect_err("bad creds");
        assert!(matches!(err, ConnectError::Creds { .. }), "{err}");
        assert_no_secret(&err, &[JWT, TOKEN], "bad creds file");
    }

    #[tokio::test]
    async fn refused_auth_errors_show_no_secret_for_any_auth_method() {
        let server = harness::NatsServer::run(harness::ServerOptions {
            token: Some("the-servers-own-token".into()),
            ..Default::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for (method, settings, secrets) in each_auth_method(&server.url(), dir.path()) {
            let err = settings.connect("test").await.expect_err(method);
            assert!(
                matches!(err, ConnectError::Unreachable { .. }),
                "{method}: {err}"
            );
            assert_no_secret(&err, &secrets, method);
        }
    }

    #[tokio::test]
    async fn connects_to_a_real_server_with_a_token() {
        let server = harness::NatsServer::run(harness::ServerOptions {
            token: Some("s3cret".into()),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut s = NatsSettings::new(server.url());
        s.connect_timeout = Duration::from_secs(5);
        // Without the token the server refuses.
        assert!(matches!(
            s.connect("test").await,
            Err(ConnectError::Unreachable { .. })
        ));
        s.token = Some("s3cret".into());
        let client = s.connect("test").await.unwrap();
        client.flush().await.unwrap();
    }
}
