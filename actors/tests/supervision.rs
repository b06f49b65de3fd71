//! Behaviour of `actors::supervision` trees, on paused tokio time, crashing actors with the
//! `actors::fault` hook (which integration tests only get with the `fault-injection` feature:
//! `cargo test -p actors --features fault-injection`).
//!
//! Child ids are ractor registry names and fault-registry keys, both process-global: every test
//! uses its own ids, so the tests can run in parallel.
#![cfg(feature = "fault-injection")]

mod supervision_support;

use std::time::Duration;

use actors::fault::{self, Fault, FaultPoint};
use actors::supervision::{
    self, Backoff, ChildSpec, Intensity, Restart, SnapshotError, Strategy, SupervisorSpec,
};
use ractor::{Actor, ActorStatus};
use tokio::sync::mpsc;
use tokio::time::Instant;

use supervision_support::*;

#[tokio::test(start_paused = true)]
async fn restart_after_panic() {
    let (child, starts) = counter("rp-c", 5);
    let (sup, _join) =
        supervision::spawn_supervisor(None, SupervisorSpec::new(Strategy::OneForOne).child(child))
            .await
            .unwrap();
    let first = wait_running_other_than("rp-c", None).await;

    crash("rp-c", Fault::Panic);

    let second = wait_running_other_than("rp-c", Some(first)).await;
    assert_ne!(first, second);
    assert_eq!(start_count(&starts), 2);
    assert_eq!(value("rp-c").await, 5);
    let snap = child_snapshot(&sup, "rp-c").await;
    assert_eq!((snap.restarts, snap.running), (1, true));
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn restart_after_error_in_pre_start() {
    // The first two starts fail in pre_start: the supervisor does not give up (intensity 5),
    // it retries after each backoff delay.
    fault::arm("rpe-c", FaultPoint::PreStart, Fault::Error, 2);
    let (child, starts) = counter("rpe-c", 7);
    let (sup, _join) =
        supervision::spawn_supervisor(None, SupervisorSpec::new(Strategy::OneForOne).child(child))
            .await
            .unwrap();

    wait_running_other_than("rpe-c", None).await;

    assert_eq!(start_count(&starts), 3);
    assert_eq!(value("rpe-c").await, 7);
    let snap = child_snapshot(&sup, "rpe-c").await;
    assert_eq!((snap.restarts, snap.running), (2, true));
    assert_eq!(sup.get_status(), ActorStatus::Running);
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn backoff_delays_are_observed() {
    let backoff = Backoff::new(100 * MS, 500 * MS, 2);
    let (child, starts) = counter("bo-c", 0);
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .with_intensity(Intensity::new(10, Duration::from_secs(60)))
        .child(child.with_backoff(backoff));
    let (sup, _join) = supervision::spawn_supervisor(None, spec).await.unwrap();
    wait_running_other_than("bo-c", None).await;

    // One crash while running, then four restarts that panic in pre_start, then success.
    fault::arm("bo-c", FaultPoint::PreStart, Fault::Panic, 4);
    let crashed_at = Instant::now();
    crash("bo-c", Fault::Error);
    wait_until("the sixth start", || async { start_count(&starts) == 6 }).await;
    wait_running_other_than("bo-c", None).await;

    let times = starts.lock().unwrap().clone();
    let mut previous = crashed_at;
    let mut observed = Vec::new();
    for start in &times[1..] {
        observed.push(start.duration_since(previous));
        previous = *start;
    }
    let expected = [100, 200, 400, 500, 500].map(|ms| ms * MS);
    for (n, (got, want)) in observed.iter().zip(expected).enumerate() {
        assert!(
            *got >= want && *got <= want + 5 * MS,
            "restart #{}: waited {got:?}, expected {want:?} (all: {observed:?})",
            n + 1
        );
    }
    assert_eq!(child_snapshot(&sup, "bo-c").await.restarts, 5);
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn intensity_exceeded_escalates() {
    let (child, starts) = counter("esc-c", 0);
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .with_intensity(Intensity::new(2, Duration::from_secs(10)))
        .child(child.with_backoff(Backoff::constant(10 * MS)));
    let (failures_tx, mut failures) = mpsc::unbounded_channel();
    let (probe, _probe_join) = Actor::spawn(
        None,
        Probe,
        ProbeArgs {
            supervisor_name: "esc-sup".into(),
            spec,
            failures: failures_tx,
        },
    )
    .await
    .unwrap();
    wait_running_other_than("esc-c", None).await;
    let supervisor = supervisor_ref("esc-sup");

    // Crash, then every restart fails: restarts 1 and 2 are tolerated, the third is one too many.
    fault::arm("esc-c", FaultPoint::PreStart, Fault::Error, 100);
    crash("esc-c", Fault::Error);

    let failed = tokio::time::timeout(DEADLINE, failures.recv())
        .await
        .expect("the parent sees the supervisor fail in time")
        .expect("probe alive");
    assert_eq!(
        failed.0, "esc-sup",
        "failure seen by the parent: {failed:?}"
    );
    assert_eq!(
        start_count(&starts),
        3,
        "initial start + 2 tolerated restarts"
    );
    wait_until("the supervisor to stop", || async {
        supervisor.get_status() == ActorStatus::Stopped
    })
    .await;
    assert!(running("esc-c").is_none());
    assert!(matches!(
        supervision::snapshot(&supervisor).await,
        Err(SnapshotError::NotRunning(_))
    ));
    fault::disarm("esc-c", FaultPoint::PreStart);
    probe.stop(None);
}

#[tokio::test(start_paused = true)]
async fn one_for_all_restarts_siblings() {
    let (a, _) = counter("ofa-a", 1);
    let (b, b_starts) = counter("ofa-b", 10);
    let spec = SupervisorSpec::new(Strategy::OneForAll)
        .child(a.with_backoff(Backoff::constant(10 * MS)))
        .child(b);
    let (sup, _join) = supervision::spawn_supervisor(None, spec).await.unwrap();
    let a_first = wait_running_other_than("ofa-a", None).await;
    let b_first = wait_running_other_than("ofa-b", None).await;
    send("ofa-b", CounterMsg::Increment);
    send("ofa-b", CounterMsg::Increment);
    assert_eq!(value("ofa-b").await, 12);

    crash("ofa-a", Fault::Error);

    wait_running_other_than("ofa-a", Some(a_first)).await;
    let b_second = wait_running_other_than("ofa-b", Some(b_first)).await;
    assert_ne!(b_first, b_second, "the healthy sibling was restarted too");
    assert_eq!(start_count(&b_starts), 2);
    assert_eq!(value("ofa-b").await, 10);
    let snapshot = supervision::snapshot(&sup).await.unwrap();
    assert_eq!(
        snapshot
            .children
            .iter()
            .map(|c| (c.id.as_str(), c.restarts, c.running))
            .collect::<Vec<_>>(),
        [("ofa-a", 1, true), ("ofa-b", 0, true)]
    );
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_restarts_later_siblings_only() {
    let (a, a_starts) = counter("rfo-a", 1);
    let (b, _) = counter("rfo-b", 2);
    let (c, c_starts) = counter("rfo-c", 3);
    let spec = SupervisorSpec::new(Strategy::RestForOne)
        .child(a)
        .child(b)
        .child(c);
    let (sup, _join) = supervision::spawn_supervisor(None, spec).await.unwrap();
    let a_first = wait_running_other_than("rfo-a", None).await;
    let b_first = wait_running_other_than("rfo-b", None).await;
    let c_first = wait_running_other_than("rfo-c", None).await;
    send("rfo-a", CounterMsg::Increment);

    crash("rfo-b", Fault::Panic);

    wait_running_other_than("rfo-b", Some(b_first)).await;
    wait_running_other_than("rfo-c", Some(c_first)).await;
    assert_eq!(running("rfo-a").map(|cell| cell.get_id()), Some(a_first));
    assert_eq!(start_count(&a_starts), 1);
    assert_eq!(start_count(&c_starts), 2);
    assert_eq!(
        value("rfo-a").await,
        2,
        "the earlier sibling kept its state"
    );
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn state_is_rebuilt_from_arguments() {
    let (child, _) = counter("srb-c", 41);
    let (sup, _join) =
        supervision::spawn_supervisor(None, SupervisorSpec::new(Strategy::OneForOne).child(child))
            .await
            .unwrap();
    let first = wait_running_other_than("srb-c", None).await;
    for _ in 0..3 {
        send("srb-c", CounterMsg::Increment);
    }
    assert_eq!(value("srb-c").await, 44);

    crash("srb-c", Fault::Error);

    wait_running_other_than("srb-c", Some(first)).await;
    assert_eq!(value("srb-c").await, 41);
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn normal_stop_not_restarted_unless_permanent() {
    let backoff = Backoff::constant(50 * MS);
    let (transient, transient_starts) = counter("ns-t", 0);
    let (permanent, permanent_starts) = counter("ns-p", 0);
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(
            transient
                .with_restart(Restart::Transient)
                .with_backoff(backoff),
        )
        .child(permanent.with_backoff(backoff));
    let (sup, _join) = supervision::spawn_supervisor(None, spec).await.unwrap();
    wait_running_other_than("ns-t", None).await;
    let permanent_first = wait_running_other_than("ns-p", None).await;

    send("ns-t", CounterMsg::Stop);
    send("ns-p", CounterMsg::Stop);

    wait_running_other_than("ns-p", Some(permanent_first)).await;
    // Both had the same backoff: let virtual time run far past it before checking that the
    // transient child is still stopped (waiting for a non-event).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(running("ns-t").is_none());
    assert_eq!(start_count(&transient_starts), 1);
    assert_eq!(start_count(&permanent_starts), 2);
    let snapshot = supervision::snapshot(&sup).await.unwrap();
    let t = snapshot.child("ns-t").unwrap();
    let p = snapshot.child("ns-p").unwrap();
    assert_eq!((t.restarts, t.running), (0, false));
    assert_eq!((p.restarts, p.running), (1, true));
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn temporary_child_not_restarted_after_failure() {
    let (child, starts) = counter("tmp-c", 0);
    let spec = SupervisorSpec::new(Strategy::OneForOne).child(
        child
            .with_restart(Restart::Temporary)
            .with_backoff(Backoff::constant(10 * MS)),
    );
    let (sup, _join) = supervision::spawn_supervisor(None, spec).await.unwrap();
    wait_running_other_than("tmp-c", None).await;

    crash("tmp-c", Fault::Panic);

    wait_until("the temporary child to be gone", || async {
        running("tmp-c").is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(running("tmp-c").is_none());
    assert_eq!(start_count(&starts), 1);
    let snap = child_snapshot(&sup, "tmp-c").await;
    assert_eq!((snap.restarts, snap.running), (0, false));
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn nested_supervisor_restarts_subtree() {
    let (a, _) = counter("nest-a", 1);
    let (b, b_starts) = counter("nest-b", 10);
    // The inner supervisor tolerates no restart at all: one crash makes it fail upward.
    let inner = SupervisorSpec::new(Strategy::OneForOne)
        .with_intensity(Intensity::new(0, Duration::from_secs(10)))
        .child(a.with_backoff(Backoff::constant(10 * MS)))
        .child(b);
    let outer =
        SupervisorSpec::new(Strategy::OneForOne).child(ChildSpec::supervisor("nest-inner", inner));
    let (outer_ref, _join) = supervision::spawn_supervisor(Some("nest-outer".into()), outer)
        .await
        .unwrap();
    let inner_first = wait_running_other_than("nest-inner", None).await;
    let a_first = wait_running_other_than("nest-a", None).await;
    let b_first = wait_running_other_than("nest-b", None).await;
    send("nest-b", CounterMsg::Increment);
    assert_eq!(value("nest-b").await, 11);

    crash("nest-a", Fault::Error);

    let inner_second = wait_running_other_than("nest-inner", Some(inner_first)).await;
    wait_running_other_than("nest-a", Some(a_first)).await;
    wait_running_other_than("nest-b", Some(b_first)).await;
    assert_ne!(inner_first, inner_second);
    assert_eq!(
        start_count(&b_starts),
        2,
        "the healthy child was restarted with its subtree"
    );
    assert_eq!(value("nest-b").await, 10);
    assert_eq!(value("nest-a").await, 1);

    let inner_snap = child_snapshot(&outer_ref, "nest-inner").await;
    assert_eq!((inner_snap.restarts, inner_snap.running), (1, true));
    let subtree = supervision::snapshot(&supervisor_ref("nest-inner"))
        .await
        .unwrap();
    assert!(
        subtree
            .children
            .iter()
            .all(|c| c.running && c.restarts == 0),
        "{subtree:?}"
    );
    // Stopping the root stops the whole tree.
    outer_ref.stop(None);
    wait_until("the tree to stop", || async {
        running("nest-inner").is_none()
            && running("nest-a").is_none()
            && running("nest-b").is_none()
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn snapshot_of_stopped_supervisor_is_an_error() {
    let (sup, join) = supervision::spawn_supervisor(None, SupervisorSpec::default())
        .await
        .unwrap();
    assert_eq!(
        supervision::snapshot(&sup).await,
        Ok(supervision::SupervisorSnapshot::default())
    );
    sup.stop(None);
    tokio::time::timeout(DEADLINE, join).await.unwrap().unwrap();
    assert!(matches!(
        supervision::snapshot(&sup).await,
        Err(SnapshotError::NotRunning(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_tree_in_reverse_order_without_restarts() {
    let stops = Stops::default();
    let (a, a_starts) = counter_logging_stops("sd-a", 0, &stops);
    let (b, b_starts) = counter_logging_stops("sd-b", 0, &stops);
    let (c, c_starts) = counter_logging_stops("sd-c", 0, &stops);
    let (d, d_starts) = counter_logging_stops("sd-d", 0, &stops);
    let inner = SupervisorSpec::new(Strategy::OneForOne).child(b).child(c);
    let root = SupervisorSpec::new(Strategy::OneForAll)
        .child(a)
        .child(ChildSpec::supervisor("sd-inner", inner))
        .child(d);
    let (root_ref, join) = supervision::spawn_supervisor(None, root).await.unwrap();
    for id in ["sd-a", "sd-b", "sd-c", "sd-d"] {
        wait_running_other_than(id, None).await;
    }

    supervision::shutdown(&root_ref, Duration::from_secs(1)).await;

    tokio::time::timeout(DEADLINE, join).await.unwrap().unwrap();
    assert_eq!(root_ref.get_status(), ActorStatus::Stopped);
    // Every child ran its post_stop (it was stopped, not killed), last started first.
    assert_eq!(*stops.lock().unwrap(), ["sd-d", "sd-c", "sd-b", "sd-a"]);
    // Let virtual time run past any backoff: nothing was restarted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, starts) in [
        ("sd-a", &a_starts),
        ("sd-b", &b_starts),
        ("sd-c", &c_starts),
        ("sd-d", &d_starts),
    ] {
        assert!(running(id).is_none(), "{id} still running");
        assert_eq!(start_count(starts), 1, "{id} was restarted");
    }
    assert!(running("sd-inner").is_none());
}
