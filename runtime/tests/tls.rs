//! TLS against a real nats-server: a server certificate from a custom CA (`--tls-ca`), a server
//! that verifies client certificates (`--tls-cert`/`--tls-key`), and `tls://` URLs. The
//! certificates are made here with rcgen.

mod support;

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use support::oneshot::{assert_exit, one_stderr_line};

/// A CA, a server certificate for 127.0.0.1 signed by it, and a client certificate.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "hub test ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let signed = |names: Vec<String>, cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server, server_key) = signed(vec!["127.0.0.1".into(), "localhost".into()], "hub");
        let (client, client_key) = signed(vec![], "alice");
        let write = |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).unwrap();
        write("ca.pem", &ca.pem());
        write("server.pem", &server);
        write("server-key.pem", &server_key);
        write("client.pem", &client);
        write("client-key.pem", &client_key);
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// A nats-server requiring TLS with the server certificate (`verify`: client certificates
    /// too).
    async fn server(&self, verify: bool) -> harness::NatsServer {
        let conf: PathBuf = self.dir.path().join(format!("nats-{verify}.conf"));
        std::fs::write(
            &conf,
            format!(
                "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: {verify}\n}}\n",
                self.path("server.pem"),
                self.path("server-key.pem"),
                self.path("ca.pem"),
            ),
        )
        .unwrap();
        harness::NatsServer::run(harness::ServerOptions {
            config_file: Some(conf),
            ..Default::default()
        })
        .await
        .unwrap()
    }
}

fn tls_url(server: &harness::NatsServer) -> String {
    format!("tls://127.0.0.1:{}", server.port())
}

/// `runtime send` to `url` with the `tls` flags ([`support::oneshot::send_hi`]).
async fn send(url: &str, tls: &[&str]) -> std::process::Output {
    let mut extra = vec!["--nats-url", url];
    extra.extend_from_slice(tls);
    support::oneshot::send_hi(&extra, &[]).await
}

fn exists(path: &str) -> bool {
    Path::new(path).is_file()
}

#[tokio::test]
async fn a_server_certificate_from_a_custom_ca_is_verified_with_tls_ca() {
    let pki = Pki::new();
    let server = pki.server(false).await;
    let ca = pki.path("ca.pem");
    assert!(exists(&ca));
    let out = send(&tls_url(&server), &["--tls-ca", &ca]).await;
    assert_exit(&out, 0, "tls:// with the custom CA");
    // `--tls-ca` alone requires TLS, whatever the scheme.
    let plain_scheme = format!("nats://127.0.0.1:{}", server.port());
    let out = send(&plain_scheme, &["--tls-ca", &ca]).await;
    assert_exit(&out, 0, "nats:// with --tls-ca");
    // Without the CA the certificate is unknown: refused, exit 69, one line.
    let out = send(&tls_url(&server), &[]).await;
    assert_exit(&out, 69, "an unknown CA");
    let line = one_stderr_line(&out, "an unknown CA");
    assert!(line.contains("cannot connect"), "{line}");
}

#[tokio::test]
async fn a_server_that_verifies_clients_takes_the_client_certificate() {
    let pki = Pki::new();
    let server = pki.server(true).await;
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem"),
    );
    let out = send(
        &tls_url(&server),
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
    )
    .await;
    assert_exit(&out, 0, "with the client certificate");
    let out = send(&tls_url(&server), &["--tls-ca", &ca]).await;
    assert_exit(&out, 69, "without a client certificate");
}

#[tokio::test]
async fn a_client_certificate_without_its_key_is_a_usage_error() {
    let pki = Pki::new();
    let out = send(
        "tls://127.0.0.1:1",
        &["--tls-cert", &pki.path("client.pem")],
    )
    .await;
    assert_exit(&out, 64, "a certificate without its key");
    let line = one_stderr_line(&out, "a certificate without its key");
    assert!(line.contains("--tls-key"), "{line}");
}
