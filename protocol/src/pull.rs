//! An inbox's pull requests: what to ask the broker for, and what each reply means.
//!
//! An inbox pulls its consumer with `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`
//! ([`crate::subjects::consumer_next_request`]), each pull with its own reply subject
//! ([`crate::subjects::pull_reply`]). A pull's heartbeats and its end (`408` at its expiry,
//! `409`) come on that subject, so they name the pull. Its messages come on their own
//! subjects (their ack subject names the consumer, [`crate::subjects::parse_ack_consumer`]):
//! the broker serves a consumer's pulls first come, first served, so [`PullBook`] counts each
//! message against the oldest open pull.

use std::collections::VecDeque;
use std::time::Duration;

/// The body of a pull request for `batch` messages, expiring after `expires`, with an idle
/// heartbeat every `heartbeat` (JSON, durations in nanoseconds).
pub fn next_request(batch: usize, expires: Duration, heartbeat: Duration) -> String {
    format!(
        r#"{{"batch":{batch},"expires":{},"idle_heartbeat":{}}}"#,
        expires.as_nanos(),
        heartbeat.as_nanos()
    )
}

/// What a message on a pull's reply subject is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullReply {
    /// A message of the consumer (no status, or 200).
    Message,
    /// An idle heartbeat (100): the broker holds the pull.
    Heartbeat,
    /// The pull ended and owes nothing more: its expiry (408).
    Ended,
    /// A 409 that ends one pull only, and may end the next the same way at once (max waiting
    /// exceeded, a leadership change...): it owes nothing more, and the next pull waits a
    /// moment.
    Interrupted,
    /// The broker ended it for a reason that holds for every pull of this consumer: it was
    /// deleted, it is a push consumer, or the pull asks more than the consumer allows. The
    /// description says which.
    Gone(String),
    /// Any other status (503: JetStream is not available): the pull is not held, and a new one
    /// may fail the same way.
    Refused,
}

/// What the status `status` (none for a plain message) with `description` says of a pull.
pub fn classify(status: Option<u16>, description: Option<&str>) -> PullReply {
    match status {
        None | Some(200) => PullReply::Message,
        Some(100) => PullReply::Heartbeat,
        Some(408) => PullReply::Ended,
        Some(409) => {
            let description = description.unwrap_or_default();
            if description == "Consumer Deleted"
                || description == "Consumer is push based"
                || description.starts_with("Exceeded MaxRequest")
            {
                PullReply::Gone(description.to_owned())
            } else {
                PullReply::Interrupted
            }
        }
        Some(_) => PullReply::Refused,
    }
}

/// The pulls one inbox has open, and what each still owes.
#[derive(Debug, Default, Clone)]
pub struct PullBook {
    /// Oldest first: the pull's number and the messages it still owes.
    open: VecDeque<(u64, usize)>,
    issued: u64,
}

impl PullBook {
    /// The messages the open pulls still owe.
    pub fn owed(&self) -> usize {
        self.open.iter().map(|(_, n)| n).sum()
    }

    /// Whether a pull is open.
    pub fn is_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// The pull to issue now, if one is due: when what the open pulls owe and what is held
    /// (received, not settled yet) is at most half of `batch`, a pull for what `batch` lacks.
    /// It is counted open at once. So an inbox holds at most `batch` messages, owed and
    /// received together (only late messages of pulls it forgot can come on top).
    pub fn top_up(&mut self, held: usize, batch: usize) -> Option<(u64, usize)> {
        let batch = batch.max(1);
        let have = self.owed().saturating_add(held);
        if have > batch / 2 {
            return None;
        }
        self.issued += 1;
        let want = batch - have;
        self.open.push_back((self.issued, want));
        Some((self.issued, want))
    }

    /// A message came: the oldest open pull owes one less (with no pull open, a late message
    /// of a forgotten pull, nothing changes).
    pub fn received(&mut self) {
        if let Some((_, owed)) = self.open.front_mut() {
            *owed -= 1;
            if *owed == 0 {
                self.open.pop_front();
            }
        }
    }

    /// Pull `pull` ended: it owes nothing more (a pull not open changes nothing).
    pub fn ended(&mut self, pull: Option<u64>) {
        if let Some(i) = pull.and_then(|p| self.open.iter().position(|(q, _)| *q == p)) {
            self.open.remove(i);
        }
    }

    /// Every open pull is forgotten (the broker holds none of them: they were silent, or the
    /// connection was replaced). Returns whether any was open.
    pub fn forget_all(&mut self) -> bool {
        let any = self.is_open();
        self.open.clear();
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_request_names_its_batch_expiry_and_heartbeat_in_nanoseconds() {
        assert_eq!(
            next_request(256, Duration::from_secs(30), Duration::from_secs(5)),
            r#"{"batch":256,"expires":30000000000,"idle_heartbeat":5000000000}"#
        );
    }

    #[test]
    fn statuses_are_classified_as_the_broker_means_them() {
        assert_eq!(classify(None, None), PullReply::Message);
        assert_eq!(
            classify(Some(100), Some("Idle Heartbeat")),
            PullReply::Heartbeat
        );
        assert_eq!(
            classify(Some(408), Some("Request Timeout")),
            PullReply::Ended
        );
        assert_eq!(
            classify(Some(409), Some("Exceeded MaxWaiting")),
            PullReply::Interrupted
        );
        assert_eq!(
            classify(Some(409), Some("Leadership Change")),
            PullReply::Interrupted
        );
        for gone in [
            "Consumer Deleted",
            "Consumer is push based",
            "Exceeded MaxRequestBatch of 100",
        ] {
            assert_eq!(
                classify(Some(409), Some(gone)),
                PullReply::Gone(gone.into())
            );
        }
        assert_eq!(classify(Some(503), None), PullReply::Refused);
    }

    #[test]
    fn a_pull_is_topped_up_at_half_the_batch_for_what_it_lacks() {
        let mut book = PullBook::default();
        assert_eq!(book.top_up(0, 256), Some((1, 256)));
        assert_eq!(book.top_up(0, 256), None);
        for _ in 0..127 {
            book.received();
        }
        // 129 owed: above half.
        assert_eq!(book.top_up(0, 256), None);
        book.received();
        assert_eq!(book.top_up(0, 256), Some((2, 128)));
        // Messages count against the oldest pull first.
        book.received();
        assert_eq!(book.owed(), 255);
        // Pull 1 expires with 127 owed: only pull 2 is counted.
        book.ended(Some(1));
        assert_eq!(book.owed(), 128);
        assert!(book.forget_all());
        assert!(!book.forget_all());
        assert_eq!(book.top_up(3, 256), Some((3, 253)));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Receive,
        End(u8),
        Settle,
        Forget,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => Just(Step::Receive),
            1 => any::<u8>().prop_map(Step::End),
            4 => Just(Step::Settle),
            1 => Just(Step::Forget),
        ]
    }

    proptest! {
        /// Whatever comes back, owed and held together never exceed the batch, and a pull is
        /// open while something is owed and held is at most half the batch.
        #[test]
        fn owed_and_held_never_exceed_the_batch(
            batch in 1usize..300,
            steps in proptest::collection::vec(step(), 0..400),
        ) {
            let mut book = PullBook::default();
            let mut held = 0usize;
            for s in steps {
                if let Some((_, want)) = book.top_up(held, batch) {
                    prop_assert!(want >= 1);
                }
                match s {
                    // Only what a pull owes comes (late messages of forgotten pulls aside).
                    Step::Receive if book.is_open() => {
                        book.received();
                        held += 1;
                    }
                    Step::Receive => {}
                    Step::End(p) => book.ended(Some(u64::from(p % 4) + 1)),
                    Step::Settle => held = held.saturating_sub(1),
                    Step::Forget => { book.forget_all(); }
                }
                prop_assert!(book.owed() + held <= batch);
            }
            book.top_up(held, batch);
            prop_assert!(book.owed() + held > batch / 2);
        }
    }
}
