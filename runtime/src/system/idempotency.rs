//! A delegator's idempotency entry in `HUB_IDEMPOTENCY` ([`protocol::task::idempotency`]),
//! read and written with what the delegator's grants allow: a subject-suffixed direct get of
//! its own key, and publishes to it that expect its last sequence (0 to create it, the
//! revision read to update it). No stream info and no KV handle, which need the bucket's
//! stream info: an agent is not granted it.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream::DirectGetErrorKind};
use async_nats::HeaderMap;
use protocol::subjects;

use super::SystemError;

/// How long one read or write of an entry may take.
const ENTRY_TIMEOUT: Duration = Duration::from_secs(5);

/// The header a write expects its subject's last sequence in.
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// One idempotency entry: `$KV.HUB_IDEMPOTENCY.<entry key>`.
pub(super) struct Entry {
    js: jetstream::Context,
    subject: String,
}

/// What [`Entry::create`] found.
pub(super) enum Created {
    /// The entry is new, at this revision.
    Revision(u64),
    /// It exists already.
    Exists,
}

impl Entry {
    /// The entry `key` (`protocol::task::idempotency::entry_key`) on `client`.
    pub(super) fn new(client: &async_nats::Client, key: &str) -> Entry {
        Entry {
            js: jetstream::new(client.clone()),
            subject: subjects::kv_subject(subjects::IDEMPOTENCY_BUCKET, key),
        }
    }

    /// Creates the entry with `value` unless it exists.
    ///
    /// # Errors
    /// [`SystemError::Publish`] when the bucket refuses or does not answer.
    pub(super) async fn create(&self, value: Vec<u8>) -> Result<Created, SystemError> {
        match self.write(value, 0).await {
            Ok(revision) => Ok(Created::Revision(revision)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(Created::Exists),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Replaces the entry with `value` if its revision is still `revision`.
    ///
    /// # Errors
    /// [`SystemError::Publish`] when the bucket refuses (another write came first) or does not
    /// answer.
    pub(super) async fn update(&self, value: Vec<u8>, revision: u64) -> Result<u64, SystemError> {
        self.write(value, revision)
            .await
            .map_err(|e| self.failed(e))
    }

    /// The entry's value and revision, `None` when there is none.
    ///
    /// # Errors
    /// [`SystemError::Publish`] when the bucket cannot be read.
    pub(super) async fn read(&self) -> Result<Option<(Vec<u8>, u64)>, SystemError> {
        let stream = self
            .js
            .get_stream_no_info(subjects::kv_stream(subjects::IDEMPOTENCY_BUCKET))
            .await
            .map_err(|e| self.failed(e))?;
        let got = tokio::time::timeout(
            ENTRY_TIMEOUT,
            stream.direct_get_last_for_subject(self.subject.as_str()),
        )
        .await
        .map_err(|_| self.failed("the bucket did not answer in time"))?;
        match got {
            Ok(message) => Ok(Some((message.payload.to_vec(), message.sequence))),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Publishes `value` expecting the subject's last sequence to be `last`.
    async fn write(
        &self,
        value: Vec<u8>,
        last: u64,
    ) -> Result<u64, async_nats::jetstream::context::PublishError> {
        let mut headers = HeaderMap::new();
        headers.insert(EXPECTED_LAST_SUBJECT_SEQUENCE, last.to_string().as_str());
        let stored = async {
            self.js
                .publish_with_headers(self.subject.clone(), headers, value.into())
                .await?
                .await
        };
        match tokio::time::timeout(ENTRY_TIMEOUT, stored).await {
            Ok(acked) => acked.map(|ack| ack.sequence),
            Err(_) => Err(PublishErrorKind::TimedOut.into()),
        }
    }

    fn failed(&self, e: impl Into<super::BoxError>) -> SystemError {
        SystemError::publish(&self.subject, e)
    }
}
