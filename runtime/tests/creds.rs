//! The credentials-file method (`--nats-creds`) against a real nats-server in operator mode:
//! an operator, a system account, an account and its user are made here (nkeys), their JWTs
//! signed here, and the server resolves the accounts from memory.

mod support;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use support::oneshot::{assert_exit, one_stderr_line, send_hi};

/// A JWT of `claims` (`nats` is the type-specific part) for `subject`, signed by `issuer`.
fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let header = serde_json::json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut jti = [0u8; 16];
    getrandom::getrandom(&mut jti).unwrap();
    let claims = serde_json::json!({
        "jti": URL_SAFE_NO_PAD.encode(jti),
        "iat": now,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = issuer.sign(signing_input.as_bytes()).unwrap();
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str) -> String {
    jwt(
        operator,
        &account.public_key(),
        name,
        serde_json::json!({
            "type": "account", "version": 2,
            "limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                       "wildcards": true, "conn": -1, "leaf": -1},
        }),
    )
}

fn user_creds(account: &KeyPair, user: &KeyPair, name: &str) -> String {
    let jwt = jwt(
        account,
        &user.public_key(),
        name,
        serde_json::json!({"type": "user", "version": 2, "pub": {}, "sub": {},
                           "subs": -1, "data": -1, "payload": -1}),
    );
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    )
}

#[tokio::test]
async fn a_creds_file_connects_in_operator_mode_and_one_from_another_account_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let operator = KeyPair::new_operator();
    let (system, account) = (KeyPair::new_account(), KeyPair::new_account());
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "hub-operator",
        serde_json::json!({"type": "operator", "version": 2,
                           "system_account": system.public_key()}),
    );
    let conf = dir.path().join("operator.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: {operator_jwt}\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: {sys_jwt}\n  {acc}: {acc_jwt}\n}}\n",
            sys = system.public_key(),
            sys_jwt = account_jwt(&operator, &system, "SYS"),
            acc = account.public_key(),
            acc_jwt = account_jwt(&operator, &account, "HUB"),
        ),
    )
    .unwrap();
    let server = harness::NatsServer::run(harness::ServerOptions {
        config_file: Some(conf),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("operator-mode server: {e}"));
    let creds = dir.path().join("alice.creds");
    std::fs::write(&creds, user_creds(&account, &KeyPair::new_user(), "alice")).unwrap();
    let (url, path) = (server.url(), creds.display().to_string());
    let out = send_hi(&["--nats-url", &url, "--nats-creds", &path], &[]).await;
    assert_exit(&out, 0, "a creds file of the account");
    // A user signed by an account the operator never signed: refused, one line, no seed.
    let rogue = dir.path().join("rogue.creds");
    let user = KeyPair::new_user();
    std::fs::write(
        &rogue,
        user_creds(&KeyPair::new_account(), &user, "mallory"),
    )
    .unwrap();
    let path = rogue.display().to_string();
    let out = send_hi(&["--nats-url", &url, "--nats-creds", &path], &[]).await;
    assert_exit(&out, 69, "a creds file of an unknown account");
    let line = one_stderr_line(&out, "a creds file of an unknown account");
    assert!(!line.contains(&user.seed().unwrap()), "{line}");
}
