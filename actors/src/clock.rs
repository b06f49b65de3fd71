//! The broker's clock as this process sees it ([`protocol::clock`]): an inbox judges a DM's
//! deadline in server time, so a process whose clock is off does not hand over a DM the
//! broker has expired, nor expire one early.
//!
//! [`ServerClock::refresh`] measures the offset from a JetStream API reply's `ts` (the inbox
//! uses its own consumer's info, which its grants allow) once at once and then every
//! [`REFRESH_EVERY`]. Until the first measurement, or when a server names no time (before
//! nats-server 2.10), server time is taken to be the local clock. [`ServerClock::settled`]
//! lets a pump wait for the first measurement, within [`SETTLE_WITHIN`].
//!
//! Tests skew a process's clock per actor name with [`skew_for_tests`] (compiled under
//! `cfg(test)` or the `fault-injection` feature, as `actors::fault` is).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use protocol::clock::{measure, ClockError, Measured};
use protocol::error_chain::ErrorChain;

/// How often the offset is measured again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// How soon a measurement is tried again while none was ever kept (the first one's request
/// failed): deadlines are judged on the local clock until one is.
pub const RETRY_UNMEASURED: Duration = Duration::from_secs(5);
/// How long [`ServerClock::settled`] waits for the first measurement.
pub const SETTLE_WITHIN: Duration = Duration::from_secs(2);
/// How long one measurement's request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The request failed or timed out.
    #[error("server time request failed")]
    Request(#[source] async_nats::RequestError),
    /// The reply is not JSON with a `ts`.
    #[error("the reply names no server time")]
    NoServerTime,
    /// Its `ts` cannot be used.
    #[error(transparent)]
    Clock(#[from] ClockError),
}

/// The offset of the server's clock from this process's, shared by a pump and its refresher.
#[derive(Debug)]
pub struct ServerClock {
    offset_ms: AtomicI64,
    measured: AtomicBool,
    /// The first measurement was tried (kept or failed).
    tried: AtomicBool,
    settled: tokio::sync::Notify,
    /// What this process's clock is off by on purpose (tests only; 0 otherwise).
    local_skew_ms: i64,
}

impl ServerClock {
    /// A clock for the actor `name` (its test skew, if one is set), not measured yet.
    pub fn new(name: &str) -> Arc<ServerClock> {
        Arc::new(ServerClock {
            offset_ms: AtomicI64::new(0),
            measured: AtomicBool::new(false),
            tried: AtomicBool::new(false),
            settled: tokio::sync::Notify::new(),
            local_skew_ms: imp::skew(name),
        })
    }

    /// This process's clock, unix ms.
    pub fn local_ms(&self) -> u64 {
        protocol::expiry::now_ms().saturating_add_signed(self.local_skew_ms)
    }

    /// The server's time now, as last measured (the local clock until then).
    pub fn now_ms(&self) -> u64 {
        protocol::clock::server_now(self.local_ms(), self.offset_ms.load(Ordering::Relaxed))
    }

    /// The last offset measured (server minus local, ms), if one was.
    pub fn offset_ms(&self) -> Option<i64> {
        self.measured
            .load(Ordering::Relaxed)
            .then(|| self.offset_ms.load(Ordering::Relaxed))
    }

    /// Measures the offset with one request on `subject` (a JetStream API subject whose reply
    /// has `ts`, as `$JS.API.CONSUMER.INFO.<stream>.<consumer>`) and keeps it.
    ///
    /// # Errors
    /// [`MeasureError`] when the request fails or its reply has no usable time; the offset
    /// kept before stays.
    ///
    /// # Cancel safety
    /// Cancel safe: the offset is kept only once a reply was read.
    pub async fn measure(
        &self,
        client: &async_nats::Client,
        subject: &str,
    ) -> Result<Measured, MeasureError> {
        #[derive(serde::Deserialize)]
        struct Reply {
            ts: Option<String>,
        }
        let sent = self.local_ms();
        let request = async_nats::Request::new()
            .payload(bytes::Bytes::new())
            .timeout(Some(REQUEST_TIMEOUT));
        let reply = client
            .send_request(subject.to_owned(), request)
            .await
            .map_err(MeasureError::Request)?;
        let received = self.local_ms();
        let ts = serde_json::from_slice::<Reply>(&reply.payload)
            .ok()
            .and_then(|r| r.ts)
            .ok_or(MeasureError::NoServerTime)?;
        let m = measure(sent, &ts, received)?;
        self.offset_ms.store(m.offset_ms, Ordering::Relaxed);
        self.measured.store(true, Ordering::Relaxed);
        Ok(m)
    }

    /// Waits until the first measurement was tried (kept or failed), for at most
    /// [`SETTLE_WITHIN`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn settled(&self) {
        let notified = self.settled.notified();
        if self.tried.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(SETTLE_WITHIN, notified).await;
    }

    /// Measures now, then every [`REFRESH_EVERY`], for as long as it runs (its owner's task),
    /// each time on the subject `subject` names then (the inboxes of a host share one clock,
    /// measured on the consumer info of the inbox that registered last); without one, that
    /// measure is skipped. While no measurement was ever kept, it tries again every
    /// [`RETRY_UNMEASURED`].
    pub async fn refresh(
        self: Arc<Self>,
        client: async_nats::Client,
        subject: impl Fn() -> Option<String> + Send,
    ) {
        loop {
            let Some(subject) = subject() else {
                self.tried.store(true, Ordering::Release);
                self.settled.notify_waiters();
                tokio::time::sleep(self.next_refresh()).await;
                continue;
            };
            // Boxed: between measures the task holds only its timer.
            match Box::pin(self.measure(&client, &subject)).await {
                Ok(m)
                    if protocol::clock::skew_verdict(m.offset_ms)
                        == protocol::clock::SkewVerdict::Skewed =>
                {
                    tracing::warn!(offset_ms = m.offset_ms, "this process's clock is off the server's; deadlines are judged in server time");
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %ErrorChain(&e), "server time not measured"),
            }
            self.tried.store(true, Ordering::Release);
            self.settled.notify_waiters();
            tokio::time::sleep(self.next_refresh()).await;
        }
    }

    /// How long until the next measurement: [`REFRESH_EVERY`], or [`RETRY_UNMEASURED`] while
    /// none was kept.
    fn next_refresh(&self) -> Duration {
        if self.measured.load(Ordering::Relaxed) {
            REFRESH_EVERY
        } else {
            RETRY_UNMEASURED
        }
    }
}

/// One inbox's view of a shared [`ServerClock`]: its own local skew (tests: several
/// "processes" in one), the measured offset corrected by it. The server's time it gives is the
/// shared clock's; its local clock and offset are this inbox's.
#[derive(Debug, Clone)]
pub struct ClockView {
    clock: Arc<ServerClock>,
    skew_ms: i64,
}

impl ClockView {
    /// `clock` as the actor `name` sees it (its test skew, if one is set).
    pub fn new(clock: Arc<ServerClock>, name: &str) -> ClockView {
        ClockView {
            clock,
            skew_ms: imp::skew(name),
        }
    }

    /// A clock of its own for the actor `name`, never measured: its local clock is taken for
    /// the server's (a core-mode inbox has no consumer to ask).
    pub fn unmeasured(name: &str) -> ClockView {
        ClockView::new(ServerClock::new(""), name)
    }

    /// This inbox's local clock, unix ms.
    pub fn local_ms(&self) -> u64 {
        self.clock.local_ms().saturating_add_signed(self.skew_ms)
    }

    /// The server's time now, as last measured (this inbox's local clock until then).
    pub fn now_ms(&self) -> u64 {
        match self.offset_ms() {
            Some(offset) => protocol::clock::server_now(self.local_ms(), offset),
            None => self.local_ms(),
        }
    }

    /// The server's clock minus this inbox's, as last measured, if it was.
    pub fn offset_ms(&self) -> Option<i64> {
        self.clock
            .offset_ms()
            .map(|o| o.saturating_sub(self.skew_ms))
    }

    /// [`ServerClock::settled`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn settled(&self) {
        self.clock.settled().await;
    }
}

/// Skews the clock of the actor named `name` by `ms` (tests: a process whose clock is off).
/// A no-op when the hook is not compiled in.
pub fn skew_for_tests(name: &str, ms: i64) {
    imp::set(name, ms);
}

#[cfg(any(test, feature = "fault-injection"))]
mod imp {
    use dashmap::DashMap;
    use std::sync::LazyLock;

    static SKEWS: LazyLock<DashMap<String, i64>> = LazyLock::new(DashMap::new);

    pub fn set(name: &str, ms: i64) {
        SKEWS.insert(name.to_owned(), ms);
    }

    pub fn skew(name: &str) -> i64 {
        SKEWS.get(name).map_or(0, |s| *s)
    }
}

#[cfg(not(any(test, feature = "fault-injection")))]
mod imp {
    #[inline]
    pub fn set(_: &str, _: i64) {}

    #[inline]
    pub fn skew(_: &str) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream `CLK` with the durable consumer `c`.
    async fn stream_with_consumer(client: &async_nats::Client) {
        let js = async_nats::jetstream::new(client.clone());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "CLK".into(),
            subjects: vec!["clk.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
        js.create_consumer_on_stream(
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("c".into()),
                ..Default::default()
            },
            "CLK",
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_skewed_clock_measures_its_offset_from_consumer_info() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        stream_with_consumer(&client).await;
        skew_for_tests("clock-test-ahead", 600_000);
        let clock = ServerClock::new("clock-test-ahead");
        assert_eq!(clock.offset_ms(), None);
        let m = clock
            .measure(&client, "$JS.API.CONSUMER.INFO.CLK.c")
            .await
            .unwrap();
        assert!((m.offset_ms + 600_000).abs() <= 1_000, "{m:?}");
        // Server time is the real time again, within the measurement's slack.
        let real = protocol::expiry::now_ms();
        assert!(clock.now_ms().abs_diff(real) <= 1_000);
        assert!(clock.local_ms() >= real + 599_000);
        assert_eq!(clock.offset_ms(), Some(m.offset_ms));
    }

    #[tokio::test]
    async fn a_first_measurement_that_failed_is_tried_again_within_seconds() {
        let server = harness::run_server().await.unwrap();
        let client = server.client().await.unwrap();
        stream_with_consumer(&client).await;
        // First on a consumer that does not exist: the reply names no server time.
        let subject = Arc::new(std::sync::Mutex::new(
            "$JS.API.CONSUMER.INFO.CLK.missing".to_owned(),
        ));
        let clock = ServerClock::new("clock-retry");
        let _refresh = crate::background::spawn(clock.clone().refresh(client, {
            let subject = subject.clone();
            move || Some(subject.lock().unwrap().clone())
        }));
        clock.settled().await;
        assert_eq!(clock.offset_ms(), None);
        *subject.lock().unwrap() = "$JS.API.CONSUMER.INFO.CLK.c".to_owned();
        let deadline = tokio::time::Instant::now() + RETRY_UNMEASURED + Duration::from_secs(3);
        while clock.offset_ms().is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not measured again within {RETRY_UNMEASURED:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
