use super::*;
use crate::supervision::Backoff;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A child that fails its first `fail_first` starts, then runs until told to stop.
#[derive(Clone)]
struct Flaky {
    starts: Arc<AtomicUsize>,
    fail_first: usize,
}

#[ractor::async_trait]
impl Actor for Flaky {
    type Msg = ();
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        let n = self.starts.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.fail_first {
            return Err(format!("start {n} fails").into());
        }
        Ok(())
    }
    async fn handle(
        &self,
        myself: ActorRef<()>,
        _: (),
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        myself.stop(None);
        Ok(())
    }
}

async fn wait_for(
    sup: &DynamicRef,
    what: &str,
    ok: impl Fn(&DynamicSnapshot) -> bool,
) -> DynamicSnapshot {
    for _ in 0..10_000 {
        let snap = snapshot(sup).await.unwrap();
        if ok(&snap) {
            return snap;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached");
}

fn flaky(id: &str, fail_first: usize) -> (ChildSpec, Arc<AtomicUsize>) {
    let starts = Arc::new(AtomicUsize::new(0));
    let child = Flaky {
        starts: starts.clone(),
        fail_first,
    };
    let spec = ChildSpec::actor(id, child, || ())
        .with_restart(Restart::Transient)
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    (spec, starts)
}

#[tokio::test(start_paused = true)]
async fn failed_child_is_restarted_after_its_backoff_then_forgotten_when_it_stops() {
    let (sup, _join) = DynamicSupervisor::spawn(
        "dyn-restart".into(),
        Intensity::new(5, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let (spec, starts) = flaky("dyn-restart-child", 2);
    add_child(&sup, spec).await.unwrap();
    let snap = wait_for(&sup, "two restarts", |s| s.restarts == 2).await;
    assert_eq!(starts.load(Ordering::SeqCst), 3);
    assert_eq!((snap.children, snap.given_up), (1, 0));
    // A normal stop of a transient child removes it from the table.
    let child: ActorRef<()> =
        ractor::registry::where_is(ractor::ActorName::from("dyn-restart-child"))
            .unwrap()
            .into();
    child.cast(()).unwrap();
    wait_for(&sup, "child forgotten", |s| s.children == 0).await;
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn child_over_its_intensity_is_given_up_and_siblings_keep_running() {
    let (sup, join) = DynamicSupervisor::spawn(
        "dyn-giveup".into(),
        Intensity::new(2, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let (bad, bad_starts) = flaky("dyn-giveup-bad", usize::MAX);
    let (good, _) = flaky("dyn-giveup-good", 0);
    add_child(&sup, good).await.unwrap();
    add_child(&sup, bad).await.unwrap();
    let snap = wait_for(&sup, "given up", |s| s.given_up == 1).await;
    // First start plus two restarts, then no more.
    assert_eq!(bad_starts.load(Ordering::SeqCst), 3);
    assert_eq!(snap.children, 1, "the good sibling is still supervised");
    assert!(ractor::registry::where_is(ractor::ActorName::from("dyn-giveup-good")).is_some());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(bad_starts.load(Ordering::SeqCst), 3);
    sup.stop(None);
    join.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_removed_child_is_stopped_and_never_restarted_and_its_restarts_were_counted() {
    let (sup, _join) = DynamicSupervisor::spawn(
        "dyn-remove".into(),
        Intensity::new(5, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let (spec, starts) = flaky("dyn-remove-child", 1);
    let (sibling, _) = flaky("dyn-remove-sibling", 0);
    add_child(&sup, spec.with_restart(Restart::Permanent))
        .await
        .unwrap();
    add_child(&sup, sibling).await.unwrap();
    let snap = wait_for(&sup, "one restart", |s| s.restarts == 1).await;
    assert_eq!(
        snap.restarted,
        BTreeMap::from([("dyn-remove-child".to_string(), 1)])
    );
    assert!(
        remove_child(&sup, "dyn-remove-child", Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert!(ractor::registry::where_is(ractor::ActorName::from("dyn-remove-child")).is_none());
    let snap = snapshot(&sup).await.unwrap();
    assert_eq!((snap.children, snap.restarts), (1, 1), "{snap:?}");
    assert!(snap.restarted.is_empty(), "{snap:?}");
    // A permanent child stopped by hand would be restarted; a removed one is not.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    assert!(ractor::registry::where_is(ractor::ActorName::from("dyn-remove-sibling")).is_some());
    // Removing it again finds nothing.
    assert!(
        !remove_child(&sup, "dyn-remove-child", Duration::from_secs(1))
            .await
            .unwrap()
    );
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn a_restart_due_before_a_remove_leaves_the_child_added_again_alone() {
    let (sup, _join) = DynamicSupervisor::spawn("dyn-readd".into(), Intensity::default())
        .await
        .unwrap();
    // Fails its first start: a restart is due in 1 s.
    let starts = Arc::new(AtomicUsize::new(0));
    let failing = Flaky {
        starts: starts.clone(),
        fail_first: 1,
    };
    let spec = ChildSpec::actor("dyn-readd-child", failing, || ())
        .with_backoff(Backoff::constant(Duration::from_secs(1)));
    add_child(&sup, spec).await.unwrap();
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    assert!(
        !remove_child(&sup, "dyn-readd-child", Duration::from_secs(1))
            .await
            .unwrap()
    );
    // Added again before that restart is due: it starts and runs.
    let (again, again_starts) = flaky("dyn-readd-child", 0);
    add_child(&sup, again.with_restart(Restart::Permanent))
        .await
        .unwrap();
    let running = ractor::registry::where_is(ractor::ActorName::from("dyn-readd-child"))
        .expect("the child added again runs");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The stale restart touched nothing: the same incarnation runs, started once, and a
    // remove still stops it.
    let now = ractor::registry::where_is(ractor::ActorName::from("dyn-readd-child"))
        .expect("still running");
    assert_eq!(now.get_id(), running.get_id());
    assert_eq!(again_starts.load(Ordering::SeqCst), 1);
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    let snap = snapshot(&sup).await.unwrap();
    assert_eq!((snap.children, snap.restarts), (1, 0), "{snap:?}");
    assert!(
        remove_child(&sup, "dyn-readd-child", Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert!(ractor::registry::where_is(ractor::ActorName::from("dyn-readd-child")).is_none());
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_id_is_refused() {
    let (sup, _join) = DynamicSupervisor::spawn("dyn-dup".into(), Intensity::default())
        .await
        .unwrap();
    let (a, _) = flaky("dyn-dup-child", 0);
    let (b, _) = flaky("dyn-dup-child", 0);
    add_child(&sup, a).await.unwrap();
    assert_eq!(
        add_child(&sup, b).await,
        Err(DynamicError::Duplicate("dyn-dup-child".into()))
    );
    sup.stop(None);
}

/// A task child that fails (an error, then a panic) its first `fail_first` incarnations,
/// then runs until stopped, counting its clean stops in `stopped`.
fn flaky_task(id: &str, fail_first: usize) -> (TaskSpec, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (starts, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, t) = (starts.clone(), stopped.clone());
    let spec = TaskSpec::new(id, move |stop: super::super::task::StopSignal| {
        let n = s.fetch_add(1, Ordering::SeqCst) + 1;
        let stopped = t.clone();
        async move {
            if n <= fail_first {
                if n % 2 == 0 {
                    panic!("incarnation {n} panics");
                }
                return Err(std::io::Error::other(format!("incarnation {n} fails")));
            }
            stop.stopped().await;
            stopped.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })
    .with_backoff(Backoff::constant(Duration::from_millis(100)));
    (spec, starts, stopped)
}

#[tokio::test(start_paused = true)]
async fn a_task_child_is_restarted_after_errors_and_panics_and_removed_with_a_clean_stop() {
    let (sup, _join) = DynamicSupervisor::spawn(
        "dyn-task".into(),
        Intensity::new(5, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let (spec, starts, stopped) = flaky_task("dyn-task-child", 2);
    add_task(&sup, spec).await.unwrap();
    let snap = wait_for(&sup, "two restarts", |s| s.restarts == 2).await;
    assert_eq!(starts.load(Ordering::SeqCst), 3);
    assert_eq!(
        snap.restarted,
        BTreeMap::from([("dyn-task-child".to_string(), 2)])
    );
    let (again, _, _) = flaky_task("dyn-task-child", 0);
    assert_eq!(
        add_task(&sup, again).await,
        Err(DynamicError::Duplicate("dyn-task-child".into()))
    );
    // Removed: its stop signal ends it cleanly, and it is never restarted.
    assert!(remove_child(&sup, "dyn-task-child", Duration::from_secs(1))
        .await
        .unwrap());
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(starts.load(Ordering::SeqCst), 3);
    let snap = snapshot(&sup).await.unwrap();
    assert_eq!((snap.children, snap.given_up), (0, 0), "{snap:?}");
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn a_task_child_over_its_intensity_is_given_up_alone_and_a_stopping_supervisor_stops_the_rest(
) {
    let (sup, join) = DynamicSupervisor::spawn(
        "dyn-task-giveup".into(),
        Intensity::new(2, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let (bad, bad_starts, _) = flaky_task("dyn-task-bad", usize::MAX);
    let (good, _, good_stopped) = flaky_task("dyn-task-good", 0);
    add_task(&sup, good).await.unwrap();
    add_task(&sup, bad).await.unwrap();
    let snap = wait_for(&sup, "given up", |s| s.given_up == 1).await;
    assert_eq!(bad_starts.load(Ordering::SeqCst), 3);
    assert_eq!(snap.children, 1, "the good sibling is still supervised");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(bad_starts.load(Ordering::SeqCst), 3);
    // A normal stop of a permanent task child restarts it; the supervisor's own stop
    // gives every task its signal and waits for it.
    sup.stop(None);
    join.await.unwrap();
    assert_eq!(good_stopped.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_late_exit_of_a_removed_task_child_leaves_the_child_added_again_alone() {
    let (sup, _join) = DynamicSupervisor::spawn("dyn-task-late".into(), Intensity::default())
        .await
        .unwrap();
    // The first child ends only once released, after its stop signal.
    let release = Arc::new(tokio::sync::Notify::new());
    let first = {
        let release = release.clone();
        TaskSpec::new(
            "dyn-task-late-child",
            move |stop: super::super::task::StopSignal| {
                let release = release.clone();
                async move {
                    stop.stopped().await;
                    release.notified().await;
                    Ok::<(), std::io::Error>(())
                }
            },
        )
    };
    add_task(&sup, first).await.unwrap();
    let removing = {
        let sup = sup.clone();
        tokio::spawn(async move {
            remove_child(&sup, "dyn-task-late-child", Duration::from_secs(60)).await
        })
    };
    wait_for(&sup, "removed from the table", |s| s.children == 0).await;
    // Added again while the old incarnation still finishes its stop.
    let (again, again_starts, _) = flaky_task("dyn-task-late-child", 0);
    add_task(&sup, again).await.unwrap();
    release.notify_one();
    assert!(removing.await.unwrap().unwrap());
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The old incarnation's exit touched nothing: the new one runs, started once.
    let snap = snapshot(&sup).await.unwrap();
    assert_eq!((snap.children, snap.restarts), (1, 0), "{snap:?}");
    assert_eq!(again_starts.load(Ordering::SeqCst), 1);
    sup.stop(None);
}
