//! The sender rate limit (`sender_rate_per_min`): one token bucket per sender in the
//! [`RATE_BUCKET`](protocol::subjects::RATE_BUCKET) KV bucket, shared by every router and kept
//! across their restarts.
//!
//! Taking a token is a read and a compare-and-set write of the sender's entry (retried on a
//! conflict with another router); the decision itself is
//! [`protocol::backpressure::take_token`]. An entry untouched for longer than the bucket's
//! max age is gone, which reads as a full bucket: by then it has refilled anyway.

use async_nats::jetstream::{self, kv};
use protocol::backpressure::{take_token, Bucket, Taken};
use protocol::AgentId;

use crate::PUBLISH_ACK_TIMEOUT;

/// Compare-and-set tries before a take gives up (the DM is tried again later).
const TRIES: usize = 8;

/// One router's handle on the shared buckets.
pub(super) struct RateLimiter {
    kv: kv::Store,
    per_min: u32,
}

impl RateLimiter {
    /// Opens the bucket (made by [`crate::streams::ensure_streams`]).
    ///
    /// # Errors
    /// The broker's error when the bucket cannot be opened in time.
    pub async fn open(
        js: &jetstream::Context,
        per_min: u32,
    ) -> Result<RateLimiter, async_nats::Error> {
        let kv = tokio::time::timeout(
            PUBLISH_ACK_TIMEOUT,
            js.get_key_value(protocol::subjects::RATE_BUCKET),
        )
        .await
        .map_err(|_| "the rate bucket did not answer in time")??;
        Ok(RateLimiter { kv, per_min })
    }

    /// Takes one of `sender`'s tokens: `Ok(None)` when it may send, `Ok(Some(secs))` when it
    /// is over its rate (a token is back in `secs`).
    ///
    /// # Errors
    /// The reason, when the bucket cannot be read or written (the DM is tried again later).
    pub async fn take(&self, sender: &AgentId) -> Result<Option<u64>, String> {
        let key = sender.as_str();
        for _ in 0..TRIES {
            let entry = tokio::time::timeout(PUBLISH_ACK_TIMEOUT, self.kv.entry(key))
                .await
                .map_err(|_| "the rate bucket did not answer in time".to_owned())?
                .map_err(|e| e.to_string())?;
            let (bucket, revision) = match &entry {
                Some(e) if e.operation == kv::Operation::Put => (
                    serde_json::from_slice::<Bucket>(&e.value).ok(),
                    Some(e.revision),
                ),
                Some(e) => (None, Some(e.revision)),
                None => (None, None),
            };
            let bucket = match take_token(bucket, self.per_min, protocol::expiry::now_ms()) {
                Taken::Limited { retry_after_secs } => return Ok(Some(retry_after_secs)),
                Taken::Granted(bucket) => bucket,
            };
            let value = serde_json::to_vec(&bucket)
                .expect("a bucket serializes")
                .into();
            let written = match revision {
                Some(revision) => {
                    tokio::time::timeout(PUBLISH_ACK_TIMEOUT, self.kv.update(key, value, revision))
                        .await
                        .map(|r| r.is_ok())
                }
                None => tokio::time::timeout(PUBLISH_ACK_TIMEOUT, self.kv.create(key, value))
                    .await
                    .map(|r| r.is_ok()),
            };
            match written {
                Ok(true) => return Ok(None),
                // Another router wrote first (or the write failed): read again.
                Ok(false) => continue,
                Err(_) => return Err("the rate bucket did not ack in time".to_owned()),
            }
        }
        Err(format!("the rate bucket of {sender} stayed contended"))
    }
}
