//! Security: who may connect to the hub's broker and what each identity may do there — the
//! identities file, the least-privilege grants of each role and the nats-server configuration
//! that `runtime render-config` writes (docs/SECURITY.md).
//!
//! Pure: the runtime generates the keys and writes the files.

pub mod accounts;
pub mod grants;
pub mod identities;
pub mod server_conf;

pub use accounts::{Account, Home, HUB_ACCOUNT, SYSTEM_ACCOUNT};
pub use grants::{grants, Grants};
pub use identities::{Identities, IdentitiesError, IdentitiesFile, Identity, Role, Routers};
pub use server_conf::{render, ServerConf, ServerTls, User, UserAuth};
