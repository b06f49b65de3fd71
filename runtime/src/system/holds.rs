//! The holds a client keeps after a refusal for a limit: no DM to a full inbox, or none at all
//! while over its rate, before the refusal's `retry_after_secs` has passed.
//!
//! An [`ActorSystem`](super::ActorSystem) learns them from the refusals reaching the inboxes it
//! has attached ([`Holds::note`]), and from the holds bucket the router writes them to
//! ([`Holds::load`], what the one-shot `runtime send` calls before it sends). A held send fails
//! at once with [`SystemError::Held`](super::SystemError::Held) and publishes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use protocol::backpressure::{hold_of, Hold, HoldScope};
use protocol::rejection::Rejection;
use protocol::subjects;
use protocol::AgentId;

/// One system's holds, by sender and scope.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// Whether any hold may be in force (a send skips the lock while none is).
    any: AtomicBool,
    map: Mutex<HashMap<(AgentId, HoldScope), Hold>>,
}

/// A hold in force: what it holds back and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// `None`: every DM of the sender (rate limited); else the recipient whose inbox is full.
    pub to: Option<AgentId>,
    /// Whole seconds left.
    pub retry_after_secs: u64,
}

impl Holds {
    /// Keeps the hold `rejection` tells `from` (the refused DM's sender) of, if any.
    pub fn note(&self, from: &AgentId, rejection: &Rejection) {
        if let Some((scope, hold)) = hold_of(rejection, protocol::expiry::now_ms()) {
            self.insert(from.clone(), scope, hold);
        }
    }

    fn insert(&self, from: AgentId, scope: HoldScope, hold: Hold) {
        let mut map = self.map.lock().expect("holds lock");
        let kept = map.entry((from, scope)).or_insert(hold);
        kept.until_ms = kept.until_ms.max(hold.until_ms);
        self.any.store(true, Ordering::Release);
    }

    /// The hold in force on a DM from `from` to `to` now, the longer one if both are.
    pub fn check(&self, from: &AgentId, to: &AgentId) -> Option<Held> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let now = protocol::expiry::now_ms();
        let mut map = self.map.lock().expect("holds lock");
        map.retain(|_, hold| hold.left_secs(now).is_some());
        if map.is_empty() {
            self.any.store(false, Ordering::Release);
            return None;
        }
        [HoldScope::All, HoldScope::To(to.clone())]
            .into_iter()
            .filter_map(|scope| {
                let left = map.get(&(from.clone(), scope.clone()))?.left_secs(now)?;
                Some(Held {
                    to: match scope {
                        HoldScope::To(to) => Some(to),
                        HoldScope::All => None,
                    },
                    retry_after_secs: left,
                })
            })
            .max_by_key(|h| h.retry_after_secs)
    }

    /// Reads `from`'s holds on DMs to `to` from the holds bucket (two direct gets; what a
    /// one-shot client, which saw no refusal itself, calls before it sends). A hold that
    /// cannot be read counts as none: the router refuses such a DM again anyway.
    pub async fn load(&self, client: &async_nats::Client, from: &AgentId, to: &AgentId) {
        let js = async_nats::jetstream::new(client.clone());
        let Ok(stream) = js
            .get_stream_no_info(subjects::kv_stream(subjects::HOLDS_BUCKET))
            .await
        else {
            return;
        };
        for scope in [HoldScope::All, HoldScope::To(to.clone())] {
            let subject = subjects::kv_subject(subjects::HOLDS_BUCKET, &scope.key(from));
            let read = tokio::time::timeout(
                actors::PUBLISH_ACK_TIMEOUT,
                stream.direct_get_last_for_subject(subject),
            )
            .await;
            if let Ok(Ok(message)) = read {
                if let Ok(hold) = serde_json::from_slice::<Hold>(&message.payload) {
                    self.insert(from.clone(), scope, hold);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use protocol::rejection::{parse_rejection, refusal};
    use protocol::{MessageId, WireError, WireErrorKind};

    use super::*;

    fn agent(s: &str) -> AgentId {
        AgentId::new(s).unwrap()
    }

    fn refused(kind: WireErrorKind, secs: u64, to: &AgentId) -> Rejection {
        let id = MessageId::new("m1").unwrap();
        let (_, _, env) = refusal(
            &agent("alice"),
            Some(&id),
            &WireError::new(kind, "limit"),
            1,
            Some(secs),
            Some(to),
        );
        parse_rejection(&env).unwrap()
    }

    #[test]
    fn a_full_inbox_holds_back_dms_to_it_only_and_a_rate_limit_all() {
        let holds = Holds::default();
        let (alice, bob, carol) = (agent("alice"), agent("bob"), agent("carol"));
        assert_eq!(holds.check(&alice, &bob), None);
        holds.note(&alice, &refused(WireErrorKind::InboxFull, 30, &bob));
        let held = holds.check(&alice, &bob).unwrap();
        assert_eq!(held.to, Some(bob.clone()));
        assert!((29..=30).contains(&held.retry_after_secs));
        assert_eq!(holds.check(&alice, &carol), None);
        assert_eq!(
            holds.check(&carol, &bob),
            None,
            "another sender is not held"
        );
        holds.note(&alice, &refused(WireErrorKind::RateLimited, 60, &bob));
        let held = holds.check(&alice, &carol).unwrap();
        assert_eq!(held.to, None);
        // The longer of the two.
        assert!(holds.check(&alice, &bob).unwrap().retry_after_secs > 30);
    }

    #[test]
    fn a_passed_hold_holds_nothing() {
        let holds = Holds::default();
        let (alice, bob) = (agent("alice"), agent("bob"));
        holds.insert(
            alice.clone(),
            HoldScope::To(bob.clone()),
            Hold { until_ms: 1 },
        );
        assert_eq!(holds.check(&alice, &bob), None);
        assert!(!holds.any.load(Ordering::Acquire));
    }
}
