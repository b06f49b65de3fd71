//! A task's claim entry in `HUB_CLAIMS` ([`protocol::task::Claim`]): read with a
//! subject-suffixed direct get of its key, written with publishes that expect the key's last
//! sequence (0 to create it) and carry a `Nats-TTL`, within what a worker's grants allow (its
//! own queues' keys; no stream info, no KV handle).
//!
//! A read or write that times out or finds no responder (an election, a restarting node) is
//! tried again until [`CLAIM_WINDOW`] has passed; a write that lost its ack and is sent again
//! meets its own first copy (a conflict), and the re-read finds its own claim, which it then
//! renews: [`take`] is idempotent.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream::DirectGetErrorKind};
use async_nats::HeaderMap;
use protocol::subjects::{self, TaskChannel};
use protocol::task::{
    claim_step, claim_ttl, stand_down_delay, ttl_header, Claim, ClaimStep, Stored,
};
use protocol::QueueName;

/// How long one read or write may take.
pub const CLAIM_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long [`take`] keeps trying through timeouts and missing responders: two elections.
pub const CLAIM_WINDOW: Duration = Duration::from_secs(20);
/// How many conflicting writes [`take`] reads again after (another attempt raced it).
const CONFLICTS: u32 = 4;

const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const TTL: &str = "Nats-TTL";
const KV_OPERATION: &str = "KV-Operation";
const MARKER_REASON: &str = "Nats-Marker-Reason";

/// Why a claim could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The direct get failed.
    #[error("cannot read the claim {key}")]
    Read {
        /// The claim key.
        key: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The write was refused (other than by a conflict) or not acked.
    #[error("cannot write the claim {key}")]
    Write {
        /// The claim key.
        key: String,
        /// The client's or broker's error.
        #[source]
        source: jetstream::context::PublishError,
    },
    /// Reads and writes kept timing out or finding no responder.
    #[error("the claim {key} could not be read or written within {window:?}")]
    Unavailable {
        /// The claim key.
        key: String,
        /// The window tried.
        window: Duration,
    },
    /// Other attempts kept taking the key between a read and a write.
    #[error("the claim {key} kept changing under its writes")]
    Contended {
        /// The claim key.
        key: String,
    },
}

impl ClaimError {
    /// Whether the same request may succeed a moment later.
    fn is_transient(&self) -> bool {
        match self {
            ClaimError::Write { source, .. } => crate::streams::is_transient(source),
            ClaimError::Read { source, .. } => source
                .downcast_ref::<jetstream::stream::DirectGetError>()
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        DirectGetErrorKind::TimedOut | DirectGetErrorKind::Request
                    )
                }),
            ClaimError::Unavailable { .. } | ClaimError::Contended { .. } => false,
        }
    }
}

/// A claim as read: what the key holds, when it was written (the broker's clock) and its TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// What the key holds.
    pub stored: Stored,
    /// The write time of its value, unix milliseconds.
    pub written_at_ms: Option<u64>,
    /// The value's TTL.
    pub ttl: Option<Duration>,
}

/// What a write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored at this revision.
    Stored(u64),
    /// The key's last sequence was not the one expected.
    Conflict,
}

/// The outcome of [`take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The claim is this attempt's, at this revision.
    Mine(u64),
    /// Another attempt holds the task; its claim lapses in about `delay`.
    Held {
        /// How long to leave the input before it comes back.
        delay: Duration,
    },
}

/// One task's claim entry: `$KV.HUB_CLAIMS.<queue>.<delegator>.<key>`.
#[derive(Debug, Clone)]
pub struct ClaimEntry {
    js: jetstream::Context,
    key: String,
    subject: String,
}

impl ClaimEntry {
    /// The claim entry of the task on `channel`, taken from `queue`'s work.
    pub fn new(client: &async_nats::Client, queue: &QueueName, channel: &TaskChannel) -> Self {
        let key = subjects::claim_key(queue, channel);
        ClaimEntry {
            js: jetstream::new(client.clone()),
            subject: subjects::kv_subject(subjects::CLAIMS_BUCKET, &key),
            key,
        }
    }

    /// The claim key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Reads the entry once.
    ///
    /// # Errors
    /// [`ClaimError::Read`].
    pub async fn read(&self) -> Result<Read, ClaimError> {
        let failed = |source: async_nats::Error| ClaimError::Read {
            key: self.key.clone(),
            source,
        };
        let stream = self
            .js
            .get_stream_no_info(subjects::kv_stream(subjects::CLAIMS_BUCKET))
            .await
            .map_err(|e| failed(e.into()))?;
        let got = tokio::time::timeout(
            CLAIM_REQUEST_TIMEOUT,
            stream.direct_get_last_for_subject(self.subject.as_str()),
        )
        .await
        .unwrap_or_else(|_| Err(DirectGetErrorKind::TimedOut.into()));
        let message = match got {
            Ok(message) => message,
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                return Ok(Read {
                    stored: Stored::Empty,
                    written_at_ms: None,
                    ttl: None,
                })
            }
            Err(e) => return Err(failed(e.into())),
        };
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        let released = header(MARKER_REASON).is_some()
            || header(KV_OPERATION).is_some_and(|op| op == "DEL" || op == "PURGE");
        let stored = if released {
            Stored::Released {
                revision: message.sequence,
            }
        } else {
            Stored::Value {
                revision: message.sequence,
                claim: Claim::decode(&message.payload),
            }
        };
        Ok(Read {
            stored,
            written_at_ms: u64::try_from(message.time.unix_timestamp_nanos() / 1_000_000).ok(),
            ttl: header(TTL).as_deref().and_then(parse_ttl),
        })
    }

    /// Writes `claim` with `ttl`, expecting the key's last sequence to be `expect`; once.
    ///
    /// # Errors
    /// [`ClaimError::Write`] when the broker refuses it otherwise or no ack comes in time.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled write may be stored (a later [`take`] finds it its own).
    pub async fn write(
        &self,
        claim: &Claim,
        expect: u64,
        ttl: Duration,
    ) -> Result<Written, ClaimError> {
        let mut headers = HeaderMap::new();
        headers.insert(EXPECTED_LAST_SUBJECT_SEQUENCE, expect.to_string().as_str());
        headers.insert(TTL, ttl_header(ttl).as_str());
        self.publish(headers, claim.encode().into()).await
    }

    /// Releases the claim: a delete marker with `ttl`, expecting the key's last sequence to be
    /// `expect` (the releasing attempt's last write); once. A read then finds
    /// [`Stored::Released`], which any attempt takes.
    ///
    /// # Errors
    /// [`ClaimError::Write`] when the broker refuses it otherwise or no ack comes in time.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled release may be stored.
    pub async fn release(&self, expect: u64, ttl: Duration) -> Result<Written, ClaimError> {
        let mut headers = HeaderMap::new();
        headers.insert(EXPECTED_LAST_SUBJECT_SEQUENCE, expect.to_string().as_str());
        headers.insert(TTL, ttl_header(ttl).as_str());
        headers.insert(KV_OPERATION, "DEL");
        self.publish(headers, bytes::Bytes::new()).await
    }

    async fn publish(
        &self,
        headers: HeaderMap,
        payload: bytes::Bytes,
    ) -> Result<Written, ClaimError> {
        let stored = crate::streams::publish_acked(
            &self.js,
            self.subject.clone(),
            headers,
            payload,
            CLAIM_REQUEST_TIMEOUT,
        )
        .await;
        match stored {
            Ok(ack) => Ok(Written::Stored(ack.sequence)),
            Err(crate::streams::AckedError::Publish(e))
                if e.kind() == PublishErrorKind::WrongLastSequence =>
            {
                Ok(Written::Conflict)
            }
            Err(crate::streams::AckedError::Publish(source)) => Err(ClaimError::Write {
                key: self.key.clone(),
                source,
            }),
            Err(crate::streams::AckedError::TimedOut(_)) => Err(ClaimError::Write {
                key: self.key.clone(),
                source: PublishErrorKind::TimedOut.into(),
            }),
        }
    }
}

/// Takes the task for `mine`, whose input's consumer has `ack_wait`: reads the entry and, as
/// [`claim_step`] says, writes the claim (TTL [`claim_ttl`]) or stands down. A conflicting
/// write is read again (a few times); a read or write that times out or finds no responder is
/// tried again after a pause (100 ms doubling to 2 s) until [`CLAIM_WINDOW`] has passed.
///
/// # Errors
/// [`ClaimError`]: the bucket refused, did not answer within the window, or the key kept
/// changing.
///
/// # Cancel safety
/// Not cancel safe: a cancelled take may leave the claim written (it lapses after its TTL, and
/// the same attempt takes it again).
pub async fn take(
    entry: &ClaimEntry,
    mine: &Claim,
    ack_wait: Duration,
    now_ms: impl Fn() -> u64,
) -> Result<Taken, ClaimError> {
    const PAUSE: crate::supervision::Backoff = crate::supervision::Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        factor: 2,
        reset_after: None,
    };
    let deadline = tokio::time::Instant::now() + CLAIM_WINDOW;
    let (mut conflicts, mut failures) = (0, 0);
    loop {
        let step = async {
            let read = entry.read().await?;
            match claim_step(&read.stored, mine) {
                ClaimStep::StandDown => Ok::<_, ClaimError>(Some(Taken::Held {
                    delay: stand_down_delay(read.written_at_ms, read.ttl, now_ms(), ack_wait),
                })),
                ClaimStep::Take { expect } => {
                    match entry.write(mine, expect, claim_ttl(ack_wait)).await? {
                        Written::Stored(revision) => Ok(Some(Taken::Mine(revision))),
                        Written::Conflict => Ok(None),
                    }
                }
            }
        };
        match step.await {
            Ok(Some(taken)) => return Ok(taken),
            Ok(None) => {
                conflicts += 1;
                if conflicts >= CONFLICTS {
                    return Err(ClaimError::Contended {
                        key: entry.key.clone(),
                    });
                }
            }
            Err(e) if e.is_transient() => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(ClaimError::Unavailable {
                        key: entry.key.clone(),
                        window: CLAIM_WINDOW,
                    });
                }
                tracing::debug!(key = %entry.key, error = %protocol::error_chain::ErrorChain(&e), "claim request failed; trying again");
                tokio::time::sleep(PAUSE.delay(failures)).await;
                failures += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// [`take`] for an input that is provably fresh (its first delivery, stored after the worker's
/// baseline: nothing of it ran before), whose key is free but for a copy that ran elsewhere:
/// one write expecting no entry, without the read; anything but a stored write (a conflict,
/// a failure) goes the whole way of [`take`].
///
/// # Errors
/// As [`take`].
///
/// # Cancel safety
/// As [`take`].
pub async fn take_fresh(
    entry: &ClaimEntry,
    mine: &Claim,
    ack_wait: Duration,
    now_ms: impl Fn() -> u64,
) -> Result<Taken, ClaimError> {
    if let Ok(Written::Stored(revision)) = entry.write(mine, 0, claim_ttl(ack_wait)).await {
        return Ok(Taken::Mine(revision));
    }
    take(entry, mine, ack_wait, now_ms).await
}

/// A `Nats-TTL` value: `30s`, `500ms`, `1m`, or whole seconds; `never` and unknown forms are
/// no TTL.
fn parse_ttl(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, unit) = value
        .find(|c: char| !c.is_ascii_digit())
        .map_or((value, ""), |at| value.split_at(at));
    let n: u64 = number.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => Some(Duration::from_secs(n.saturating_mul(60))),
        "h" => Some(Duration::from_secs(n.saturating_mul(3600))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::task::AttemptId;
    use protocol::{AgentId, TaskId, WorkerId};

    fn claim(attempt: &str, worker: &str) -> Claim {
        Claim {
            attempt_id: AttemptId::new(attempt).unwrap(),
            worker_id: WorkerId::new(worker).unwrap(),
        }
    }

    fn now_ms() -> u64 {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    }

    /// A nats-server with the hub's streams, and the claim entry of alice's `task` on queue `q`.
    async fn entry_on_a_fresh_hub(task: &str) -> (harness::NatsServer, ClaimEntry) {
        let server = harness::run_server().await.expect("nats-server");
        let client = server.client().await.unwrap();
        let js = jetstream::new(client.clone());
        crate::streams::ensure_streams(&js, &protocol::config::DeliveryConfig::default())
            .await
            .unwrap();
        let channel = TaskChannel::of(&AgentId::new("alice").unwrap(), &TaskId::new(task).unwrap());
        let entry = ClaimEntry::new(&client, &QueueName::new("q").unwrap(), &channel);
        (server, entry)
    }

    #[test]
    fn ttl_values_are_read_in_their_units() {
        assert_eq!(parse_ttl("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_ttl("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_ttl("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_ttl("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_ttl("never"), None);
        assert_eq!(parse_ttl("1y"), None);
    }

    #[tokio::test]
    async fn one_attempt_takes_a_task_another_stands_down_until_the_claim_lapses() {
        let (_server, entry) = entry_on_a_fresh_hub("t1").await;
        assert_eq!(entry.key(), "q.alice.t1");
        let (a, b) = (claim("a1", "w1"), claim("b1", "w2"));
        let ack_wait = Duration::from_secs(1);
        let Taken::Mine(first) = take(&entry, &a, ack_wait, now_ms).await.unwrap() else {
            panic!("a free key is taken");
        };
        // Taken again by the same attempt (a renewal, or a retry whose first copy landed).
        let Taken::Mine(renewed) = take(&entry, &a, ack_wait, now_ms).await.unwrap() else {
            panic!("its own claim is renewed");
        };
        assert!(renewed > first);
        let Taken::Held { delay } = take(&entry, &b, ack_wait, now_ms).await.unwrap() else {
            panic!("another attempt's claim is not taken");
        };
        assert!(
            delay <= ack_wait + protocol::task::LAPSE_MARGIN,
            "{delay:?}"
        );
        // A write expecting a stale revision conflicts.
        assert_eq!(
            entry.write(&b, first, ack_wait).await.unwrap(),
            Written::Conflict
        );
        // Unrenewed, the claim lapses after its TTL (1 s), and b takes the task.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match take(&entry, &b, ack_wait, now_ms).await.unwrap() {
                Taken::Mine(_) => break,
                Taken::Held { delay } => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "a's claim never lapsed"
                    );
                    tokio::time::sleep(delay.min(Duration::from_millis(200))).await;
                }
            }
        }
        let read = entry.read().await.unwrap();
        assert!(
            matches!(&read.stored, Stored::Value { claim: Some(c), .. } if *c == b),
            "{read:?}"
        );
        assert_eq!(read.ttl, Some(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn a_claim_lapses_after_the_broker_is_killed_and_restarted_on_its_store() {
        let (mut server, entry) = entry_on_a_fresh_hub("t3").await;
        let (a, b) = (claim("a1", "w1"), claim("b1", "w2"));
        let ack_wait = Duration::from_secs(2);
        assert!(matches!(
            take(&entry, &a, ack_wait, now_ms).await.unwrap(),
            Taken::Mine(_)
        ));
        // Its holder dies with the broker; the broker comes back on its store.
        server.restart().await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let mut held = 0;
        loop {
            match take(&entry, &b, ack_wait, now_ms).await {
                Ok(Taken::Mine(_)) => break,
                Ok(Taken::Held { delay }) => {
                    held += 1;
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "a's 2 s claim never lapsed after the restart ({held} stand-downs, last read {:?})",
                        entry.read().await
                    );
                    tokio::time::sleep(delay.min(Duration::from_millis(200))).await;
                }
                Err(e) => {
                    assert!(tokio::time::Instant::now() < deadline, "{e:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    #[tokio::test]
    async fn a_fresh_take_writes_at_once_and_still_stands_down_from_another_claim() {
        let (_server, entry) = entry_on_a_fresh_hub("t4").await;
        let (a, b) = (claim("a1", "w1"), claim("b1", "w2"));
        let ack_wait = Duration::from_secs(30);
        let Taken::Mine(first) = take_fresh(&entry, &a, ack_wait, now_ms).await.unwrap() else {
            panic!("a free key is taken by one write");
        };
        assert!(
            matches!(entry.read().await.unwrap().stored, Stored::Value { revision, claim: Some(ref c) } if revision == first && *c == a)
        );
        // Its own again (a write whose ack was lost, sent again): the write conflicts and the
        // read finds its own claim.
        assert!(matches!(
            take_fresh(&entry, &a, ack_wait, now_ms).await.unwrap(),
            Taken::Mine(r) if r > first
        ));
        // Another attempt's copy, believed fresh, still stands down.
        assert!(matches!(
            take_fresh(&entry, &b, ack_wait, now_ms).await.unwrap(),
            Taken::Held { .. }
        ));
    }

    #[tokio::test]
    async fn a_released_claim_is_taken_by_another_attempt_at_once() {
        let (_server, entry) = entry_on_a_fresh_hub("t2").await;
        let (a, b) = (claim("a1", "w1"), claim("b1", "w2"));
        let ack_wait = Duration::from_secs(30);
        let Taken::Mine(held) = take(&entry, &a, ack_wait, now_ms).await.unwrap() else {
            panic!("a free key is taken");
        };
        // A release expecting a stale revision changes nothing.
        assert_eq!(
            entry.release(held - 1, ack_wait).await.unwrap(),
            Written::Conflict
        );
        assert!(matches!(
            take(&entry, &b, ack_wait, now_ms).await.unwrap(),
            Taken::Held { .. }
        ));
        let Written::Stored(released) = entry.release(held, ack_wait).await.unwrap() else {
            panic!("the holder's release is stored");
        };
        assert_eq!(
            entry.read().await.unwrap().stored,
            Stored::Released { revision: released }
        );
        let Taken::Mine(taken) = take(&entry, &b, ack_wait, now_ms).await.unwrap() else {
            panic!("a released claim is taken at once, not after its 30 s TTL");
        };
        assert!(taken > released);
    }
}
