//! Secrets for the tests that prove no secret is ever printed: one per authentication method,
//! each distinctive enough that finding it in an output can only mean it leaked.

use std::path::{Path, PathBuf};

/// A real user nkey seed (the async-nats test suite's `TestUser`), so the nkey and creds
/// methods get as far as the server.
pub const SEED: &str = "SUACH75SWCM5D2JMJM6EKLR2WDARVGZT4QC6LX3AGHSWOMVAKERABBBRWM";
/// A token.
pub const TOKEN: &str = "tok-5ec12e7-token";
/// A password.
pub const PASSWORD: &str = "pw-5ec12e7-password";
/// The JWT of [`creds_file`].
pub const JWT: &str = "eyJ5ec12e7.jwt-payload.sig";

/// Writes `dir/user.creds`, the creds file of the creds method ([`JWT`] and [`SEED`]), and
/// returns its path.
///
/// # Panics
/// When the file cannot be written.
pub fn creds_file(dir: &Path) -> PathBuf {
    let path = dir.join("user.creds");
    std::fs::write(
        &path,
        format!(
            "-----BEGIN NATS USER JWT-----\n{JWT}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{SEED}\n------END USER NKEY SEED------\n"
        ),
    )
    .expect("the creds file is written");
    path
}
