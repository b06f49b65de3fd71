//! The seal of every ingress `Nats-Msg-Id` this process publishes
//! ([`protocol::subjects::ingress_msg_id`]): the first 8 bytes of SHA-256 over a 32-byte key
//! drawn from the operating system once per process, then the logical id. Another identity,
//! which never sees the key, cannot publish first under the id of one of this process's
//! publishes. Agents never read the ingress; workers may read the task channel publishes in
//! it (their headers too), which shows them the seal of a logical id already stored, and of no
//! other.

use std::sync::LazyLock;

use sha2::{Digest, Sha256};

/// This process's key, drawn once.
static KEY: LazyLock<[u8; 32]> = LazyLock::new(|| {
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).expect("the operating system gives random bytes");
    key
});

/// The ingress `Nats-Msg-Id` of `logical`, sealed with this process's key: the same for the
/// same `logical` within this process, unguessable outside it.
#[must_use]
pub fn ingress_msg_id(logical: &str) -> String {
    protocol::subjects::ingress_msg_id(logical, seal(logical))
}

fn seal(logical: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(*KEY)
        .chain_update(logical.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logical_id_gets_one_seal_in_a_process_and_different_ids_get_different_ones() {
        let a = ingress_msg_id("alice:m-1");
        assert_eq!(a, ingress_msg_id("alice:m-1"));
        assert_ne!(a, ingress_msg_id("alice:m-2"));
        let seal = a
            .strip_prefix("alice:m-1~")
            .expect("the logical id, then the seal");
        assert_eq!(seal.len(), 16);
        assert!(seal.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
