//! Test support for `tests/supervision.rs`: a counter actor, a probe parent, and helpers that
//! wait for events with a deadline (never a bare sleep).
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::fault::{self, Fault, FaultPoint};
use actors::supervision::{self, ChildSnapshot, ChildSpec, SupervisorRef, SupervisorSpec};
use ractor::rpc::CallResult;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, ActorStatus, RpcReplyPort,
    SupervisionEvent,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Upper bound of every wait on an event (virtual time: it costs nothing when things work).
pub const DEADLINE: Duration = Duration::from_secs(60);
pub const MS: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------------
// A trivial counter actor whose initial value comes from its arguments.
// ---------------------------------------------------------------------------------------------

/// Times of every `pre_start` attempt of one counter (successful or not).
pub type Starts = Arc<Mutex<Vec<Instant>>>;

/// Names of the counters whose `post_stop` ran, in order (shared by several counters).
pub type Stops = Arc<Mutex<Vec<String>>>;

#[derive(Clone)]
pub struct Counter;

#[derive(Clone)]
pub struct CounterArgs {
    pub initial: i64,
    pub starts: Starts,
    pub stops: Stops,
}

pub enum CounterMsg {
    Increment,
    Get(RpcReplyPort<i64>),
    Stop,
}

pub struct CounterState {
    value: i64,
    stops: Stops,
}

#[ractor::async_trait]
impl Actor for Counter {
    type Msg = CounterMsg;
    type State = CounterState;
    type Arguments = CounterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CounterMsg>,
        args: CounterArgs,
    ) -> Result<CounterState, ActorProcessingErr> {
        args.starts.lock().unwrap().push(Instant::now());
        fault::check(&myself.get_name().unwrap_or_default(), FaultPoint::PreStart)?;
        Ok(CounterState {
            value: args.initial,
            stops: args.stops,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<CounterMsg>,
        msg: CounterMsg,
        state: &mut CounterState,
    ) -> Result<(), ActorProcessingErr> {
        fault::check(&myself.get_name().unwrap_or_default(), FaultPoint::Handle)?;
        match msg {
            CounterMsg::Increment => state.value += 1,
            CounterMsg::Get(reply) => reply.send(state.value)?,
            CounterMsg::Stop => myself.stop(None),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<CounterMsg>,
        state: &mut CounterState,
    ) -> Result<(), ActorProcessingErr> {
        let name = myself.get_name().unwrap_or_default();
        state.stops.lock().unwrap().push(name);
        Ok(())
    }
}

/// A counter child spec (Permanent, default backoff) and its record of start attempts.
pub fn counter(id: &str, initial: i64) -> (ChildSpec, Starts) {
    counter_logging_stops(id, initial, &Stops::default())
}

/// Like [`counter`], recording its normal stops (`post_stop`) in `stops`.
pub fn counter_logging_stops(id: &str, initial: i64, stops: &Stops) -> (ChildSpec, Starts) {
    let starts = Starts::default();
    let args = CounterArgs {
        initial,
        starts: starts.clone(),
        stops: stops.clone(),
    };
    (ChildSpec::actor(id, Counter, move || args.clone()), starts)
}

pub fn start_count(starts: &Starts) -> usize {
    starts.lock().unwrap().len()
}

// ---------------------------------------------------------------------------------------------
// Observation helpers: wait with a deadline, never a bare sleep.
// ---------------------------------------------------------------------------------------------

/// Polls `condition` (yielding 1 ms of virtual time between polls) until it holds.
pub async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let polled = tokio::time::timeout(DEADLINE, async {
        while !condition().await {
            tokio::time::sleep(MS).await;
        }
    })
    .await;
    assert!(
        polled.is_ok(),
        "timed out after {DEADLINE:?} waiting for {what}"
    );
}

/// The running actor registered as `name`, if any.
pub fn running(name: &str) -> Option<ActorCell> {
    ractor::registry::where_is(name).filter(|cell| cell.get_status() == ActorStatus::Running)
}

/// Waits until an actor named `name` runs, other than `previous`; returns its id.
pub async fn wait_running_other_than(name: &str, previous: Option<ActorId>) -> ActorId {
    let what = format!("'{name}' to run (other than {previous:?})");
    wait_until(&what, || async {
        running(name).is_some_and(|cell| Some(cell.get_id()) != previous)
    })
    .await;
    running(name).expect("running").get_id()
}

pub fn counter_ref(name: &str) -> ActorRef<CounterMsg> {
    running(name)
        .unwrap_or_else(|| panic!("'{name}' is not running"))
        .into()
}

pub async fn value(name: &str) -> i64 {
    match counter_ref(name)
        .call(CounterMsg::Get, Some(Duration::from_secs(1)))
        .await
    {
        Ok(CallResult::Success(value)) => value,
        other => panic!("'{name}' did not answer: {other:?}"),
    }
}

pub fn send(name: &str, msg: CounterMsg) {
    counter_ref(name)
        .cast(msg)
        .unwrap_or_else(|_| panic!("cannot send to '{name}'"));
}

/// Crashes the running counter `name` once at its next message, at `Handle`.
pub fn crash(name: &str, fault_kind: Fault) {
    fault::arm(name, FaultPoint::Handle, fault_kind, 1);
    send(name, CounterMsg::Increment);
}

pub async fn child_snapshot(supervisor: &SupervisorRef, id: &str) -> ChildSnapshot {
    let snapshot = supervision::snapshot(supervisor).await.expect("snapshot");
    snapshot.child(id).expect("child in snapshot").clone()
}

pub fn supervisor_ref(name: &str) -> SupervisorRef {
    running(name)
        .unwrap_or_else(|| panic!("supervisor '{name}' is not running"))
        .into()
}

// ---------------------------------------------------------------------------------------------
// A parent that records the supervision events of the supervisor it spawns linked.
// ---------------------------------------------------------------------------------------------

pub struct Probe;

pub struct ProbeArgs {
    pub supervisor_name: String,
    pub spec: SupervisorSpec,
    pub failures: mpsc::UnboundedSender<(String, String)>,
}

#[ractor::async_trait]
impl Actor for Probe {
    type Msg = ();
    type State = mpsc::UnboundedSender<(String, String)>;
    type Arguments = ProbeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<()>,
        args: ProbeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        supervision::spawn_supervisor_linked(
            Some(args.supervisor_name),
            args.spec,
            myself.get_cell(),
        )
        .await?;
        Ok(args.failures)
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        failures: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            let _ = failures.send((cell.get_name().unwrap_or_default(), err.to_string()));
        }
        Ok(())
    }
}
