//! Fault injection: crash a named actor on purpose, at a chosen point, a chosen number of times.
//!
//! Actors call [`check`] at the top of `pre_start` and `handle`:
//!
//! ```ignore
//! async fn handle(&self, myself: ActorRef<Self::Msg>, msg: Self::Msg, state: &mut Self::State)
//!     -> Result<(), ActorProcessingErr>
//! {
//!     actors::fault::check(&self.name, FaultPoint::Handle)?;
//!     // ...
//! }
//! ```
//!
//! Tests (and crash tests of the `runtime` binary) then [`arm`] a fault for an actor name:
//! the next `times` checks of that name and point either panic ([`Fault::Panic`]) or return
//! [`FaultError::Injected`] ([`Fault::Error`]).
//!
//! The registry is process-global and keyed by actor name and point, so parallel tests that use
//! different actor names do not interfere with each other.
//!
//! The hook is compiled only under `cfg(test)` or with the `fault-injection` feature. Without
//! them, the same functions exist as inlined no-ops ([`check`] always returns `Ok(())`), so call
//! sites need no `cfg` of their own.

use std::fmt;

/// Where in an actor's life a fault is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPoint {
    /// At the top of `Actor::pre_start`: makes the (re)start itself fail.
    PreStart,
    /// At the top of `Actor::handle`: makes the handling of the next message fail.
    Handle,
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultPoint::PreStart => "pre_start",
            FaultPoint::Handle => "handle",
        })
    }
}

/// How an armed fault manifests when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// [`check`] panics (ractor turns the panic into an actor failure).
    Panic,
    /// [`check`] returns [`FaultError::Injected`].
    Error,
}

/// The error returned by [`check`] when an armed [`Fault::Error`] fires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// A fault armed with [`arm`] fired.
    #[error("injected fault in actor '{actor}' at {point}")]
    Injected {
        /// Name of the actor the fault was armed for.
        actor: String,
        /// Point at which it fired.
        point: FaultPoint,
    },
}

#[cfg(any(test, feature = "fault-injection"))]
mod imp {
    use super::{Fault, FaultError, FaultPoint};
    use dashmap::DashMap;
    use std::sync::LazyLock;

    #[derive(Debug, Clone, Copy)]
    struct Armed {
        fault: Fault,
        remaining: u32,
    }

    static REGISTRY: LazyLock<DashMap<(String, FaultPoint), Armed>> = LazyLock::new(DashMap::new);

    pub fn arm(actor_name: &str, point: FaultPoint, fault: Fault, times: u32) {
        let key = (actor_name.to_owned(), point);
        if times == 0 {
            REGISTRY.remove(&key);
        } else {
            REGISTRY.insert(
                key,
                Armed {
                    fault,
                    remaining: times,
                },
            );
        }
    }

    pub fn disarm(actor_name: &str, point: FaultPoint) {
        REGISTRY.remove(&(actor_name.to_owned(), point));
    }

    pub fn disarm_all() {
        REGISTRY.clear();
    }

    pub fn remaining(actor_name: &str, point: FaultPoint) -> u32 {
        REGISTRY
            .get(&(actor_name.to_owned(), point))
            .map_or(0, |armed| armed.remaining)
    }

    pub fn check(actor_name: &str, point: FaultPoint) -> Result<(), FaultError> {
        let key = (actor_name.to_owned(), point);
        // Decrement under the shard lock, but act (possibly panic) only after releasing it.
        let fired = REGISTRY.remove_if_mut(&key, |_, armed| {
            armed.remaining = armed.remaining.saturating_sub(1);
            armed.remaining == 0
        });
        let fault = match fired {
            // The last remaining shot: the entry was removed.
            Some((_, armed)) => Some(armed.fault),
            // Either not armed, or armed with shots left (then it was decremented above).
            None => REGISTRY.get(&key).map(|armed| armed.fault),
        };
        match fault {
            None => Ok(()),
            Some(Fault::Panic) => panic!("injected panic in actor '{actor_name}' at {point}"),
            Some(Fault::Error) => Err(FaultError::Injected {
                actor: actor_name.to_owned(),
                point,
            }),
        }
    }
}

#[cfg(not(any(test, feature = "fault-injection")))]
mod imp {
    use super::{Fault, FaultError, FaultPoint};

    #[inline]
    pub fn arm(_actor_name: &str, _point: FaultPoint, _fault: Fault, _times: u32) {}

    #[inline]
    pub fn disarm(_actor_name: &str, _point: FaultPoint) {}

    #[inline]
    pub fn disarm_all() {}

    #[inline]
    pub fn remaining(_actor_name: &str, _point: FaultPoint) -> u32 {
        0
    }

    #[inline]
    pub fn check(_actor_name: &str, _point: FaultPoint) -> Result<(), FaultError> {
        Ok(())
    }
}

/// Whether the hook is compiled in (`cfg(test)` or the `fault-injection` feature).
///
/// When `false`, every function of this module is a no-op.
pub const ENABLED: bool = cfg!(any(test, feature = "fault-injection"));

/// Arms `fault` for the actor named `actor_name` at `point`, for the next `times` checks.
///
/// Replaces any fault already armed for that name and point; `times == 0` disarms it.
/// A no-op when the hook is not compiled in (see [`ENABLED`]).
#[inline]
pub fn arm(actor_name: &str, point: FaultPoint, fault: Fault, times: u32) {
    imp::arm(actor_name, point, fault, times);
}

/// Disarms the fault armed for `actor_name` at `point`, if any.
#[inline]
pub fn disarm(actor_name: &str, point: FaultPoint) {
    imp::disarm(actor_name, point);
}

/// Disarms every armed fault, for every actor name.
///
/// Beware in tests that run in parallel: this also disarms the faults of the other tests.
/// Prefer [`disarm`] with the names a test owns.
#[inline]
pub fn disarm_all() {
    imp::disarm_all();
}

/// How many more times the fault armed for `actor_name` at `point` will fire (0 if none is armed).
#[inline]
#[must_use]
pub fn remaining(actor_name: &str, point: FaultPoint) -> u32 {
    imp::remaining(actor_name, point)
}

/// Fires the fault armed for `actor_name` at `point`, if any shot remains, after using one up.
///
/// Always `Ok(())` when nothing is armed or when the hook is not compiled in.
///
/// # Errors
///
/// Returns [`FaultError::Injected`] when a [`Fault::Error`] is armed for this name and point.
///
/// # Panics
///
/// Panics when a [`Fault::Panic`] is armed for this name and point.
#[inline]
pub fn check(actor_name: &str, point: FaultPoint) -> Result<(), FaultError> {
    imp::check(actor_name, point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unarmed_check_is_ok() {
        assert_eq!(check("fault-test-unarmed", FaultPoint::Handle), Ok(()));
        assert_eq!(remaining("fault-test-unarmed", FaultPoint::Handle), 0);
    }

    #[test]
    fn error_fires_exactly_the_armed_number_of_times() {
        let name = "fault-test-error";
        arm(name, FaultPoint::PreStart, Fault::Error, 2);
        assert_eq!(remaining(name, FaultPoint::PreStart), 2);
        // Another point of the same actor is not affected.
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
        let expected = Err(FaultError::Injected {
            actor: name.to_owned(),
            point: FaultPoint::PreStart,
        });
        assert_eq!(check(name, FaultPoint::PreStart), expected);
        assert_eq!(remaining(name, FaultPoint::PreStart), 1);
        assert_eq!(check(name, FaultPoint::PreStart), expected);
        assert_eq!(remaining(name, FaultPoint::PreStart), 0);
        assert_eq!(check(name, FaultPoint::PreStart), Ok(()));
    }

    #[test]
    fn panic_fault_panics_then_is_used_up() {
        let name = "fault-test-panic";
        arm(name, FaultPoint::Handle, Fault::Panic, 1);
        let caught = std::panic::catch_unwind(|| check(name, FaultPoint::Handle));
        assert!(caught.is_err(), "an armed panic fault must panic");
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
    }

    #[test]
    fn arming_zero_times_and_disarm_remove_the_fault() {
        let name = "fault-test-disarm";
        arm(name, FaultPoint::Handle, Fault::Error, 3);
        arm(name, FaultPoint::Handle, Fault::Error, 0);
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
        arm(name, FaultPoint::Handle, Fault::Error, 3);
        disarm(name, FaultPoint::Handle);
        assert_eq!(check(name, FaultPoint::Handle), Ok(()));
    }

    #[test]
    fn error_message_is_lowercase_and_names_actor_and_point() {
        let err = FaultError::Injected {
            actor: "a".into(),
            point: FaultPoint::PreStart,
        };
        assert_eq!(err.to_string(), "injected fault in actor 'a' at pre_start");
    }
}
