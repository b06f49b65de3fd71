//! The faults of a chaos run and their schedule: a seeded generator, so `--seed` repeats the
//! same faults in the same order with the same gaps (what the system does in between still
//! varies with timing).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How long a killed process or node stays down before it is started again.
pub const DOWN: Duration = Duration::from_secs(1);
/// The shortest and longest gap between two faults, ms.
const GAP_MS: (u64, u64) = (3_000, 6_000);
/// The shortest and longest pause of a node, ms: from well under an election timeout (raft's
/// is 4 to 9 s) to past it.
const PAUSE_MS: (u64, u64) = (2_000, 10_000);

/// A kind of fault (`--faults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// kill -9 of a router.
    KillRouter,
    /// kill -9 of a worker with its handlers.
    KillWorker,
    /// kill -9 of a nats node.
    KillNode,
    /// SIGSTOP of a nats node.
    PauseNode,
    /// A stream leader stepped down (a cluster only).
    StepDown,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 5] = [
        Kind::KillRouter,
        Kind::KillWorker,
        Kind::KillNode,
        Kind::PauseNode,
        Kind::StepDown,
    ];
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of router `i`, started again after [`DOWN`].
    KillRouter(usize),
    /// `kill -9` of worker `i` with its handlers, started again (same id and journal) after
    /// [`DOWN`].
    KillWorker(usize),
    /// `kill -9` of NATS node `i`, started again on its store after [`DOWN`].
    KillNode(usize),
    /// SIGSTOP of NATS node `i`, SIGCONT after the pause.
    PauseNode(usize, Duration),
    /// The leader of this stream asked to step down (a cluster only).
    StepDown(String),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillRouter(i) => write!(f, "kill -9 router {i}"),
            Fault::KillWorker(i) => write!(f, "kill -9 worker {}", crate::processes::WORKERS[*i]),
            Fault::KillNode(i) => write!(f, "kill -9 nats node {i}"),
            Fault::PauseNode(i, d) => write!(f, "pause nats node {i} for {:.1} s", d.as_secs_f64()),
            Fault::StepDown(stream) => write!(f, "step down the leader of {stream}"),
        }
    }
}

/// The seeded schedule of faults.
pub struct Schedule {
    rng: StdRng,
    /// The kinds drawn from.
    kinds: Vec<Kind>,
    /// NATS nodes: 1, or 3 for a cluster (step-downs only then).
    nodes: usize,
    routers: usize,
    workers: usize,
    /// The streams whose leaders may be stepped down.
    streams: Vec<String>,
}

impl Schedule {
    /// A schedule of `kinds` for `nodes` NATS nodes, `routers` routers and `workers` workers
    /// (a step-down only on a cluster with streams named).
    pub fn new(
        seed: u64,
        kinds: &[Kind],
        nodes: usize,
        routers: usize,
        workers: usize,
        streams: Vec<String>,
    ) -> Schedule {
        let mut kinds: Vec<Kind> = kinds.to_vec();
        kinds.dedup();
        kinds.retain(|k| *k != Kind::StepDown || (nodes > 1 && !streams.is_empty()));
        assert!(!kinds.is_empty(), "a schedule has a kind of fault to draw");
        Schedule {
            rng: StdRng::seed_from_u64(seed),
            kinds,
            nodes,
            routers,
            workers,
            streams,
        }
    }

    /// How long to wait before the next fault: 3 to 6 s.
    pub fn gap(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(GAP_MS.0..=GAP_MS.1))
    }

    /// The next fault: a kind drawn evenly from those this deployment has, then its target.
    pub fn fault(&mut self) -> Fault {
        let kind = self.kinds[self.rng.random_range(0..self.kinds.len())];
        match kind {
            Kind::KillRouter => Fault::KillRouter(self.rng.random_range(0..self.routers)),
            Kind::KillWorker => Fault::KillWorker(self.rng.random_range(0..self.workers)),
            Kind::KillNode => Fault::KillNode(self.rng.random_range(0..self.nodes)),
            Kind::PauseNode => Fault::PauseNode(
                self.rng.random_range(0..self.nodes),
                Duration::from_millis(self.rng.random_range(PAUSE_MS.0..=PAUSE_MS.1)),
            ),
            Kind::StepDown => {
                Fault::StepDown(self.streams[self.rng.random_range(0..self.streams.len())].clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams() -> Vec<String> {
        vec!["HUB_INGRESS".into(), "HUB_WORK".into()]
    }

    fn draw(schedule: &mut Schedule, n: usize) -> Vec<(Duration, Fault)> {
        (0..n).map(|_| (schedule.gap(), schedule.fault())).collect()
    }

    #[test]
    fn a_seed_repeats_its_faults_and_gaps() {
        let a = draw(&mut Schedule::new(7, &Kind::ALL, 3, 2, 2, streams()), 50);
        let b = draw(&mut Schedule::new(7, &Kind::ALL, 3, 2, 2, streams()), 50);
        let c = draw(&mut Schedule::new(8, &Kind::ALL, 3, 2, 2, streams()), 50);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_cluster_gets_every_kind_and_a_single_node_no_step_down() {
        let cluster = draw(&mut Schedule::new(1, &Kind::ALL, 3, 2, 2, streams()), 200);
        let kinds = |faults: &[(Duration, Fault)]| {
            let mut kinds: Vec<_> = faults
                .iter()
                .map(|(_, f)| std::mem::discriminant(f))
                .collect();
            kinds.sort_by_key(|d| format!("{d:?}"));
            kinds.dedup();
            kinds.len()
        };
        assert_eq!(kinds(&cluster), 5);
        let single = draw(&mut Schedule::new(1, &Kind::ALL, 1, 2, 2, streams()), 200);
        assert_eq!(kinds(&single), 4);
        for (gap, fault) in single.iter().chain(&cluster) {
            assert!(
                (Duration::from_secs(3)..=Duration::from_secs(6)).contains(gap),
                "{gap:?}"
            );
            match fault {
                Fault::KillRouter(i) | Fault::KillWorker(i) => assert!(*i < 2),
                Fault::KillNode(i) => assert!(*i < 3),
                Fault::PauseNode(i, d) => {
                    assert!(*i < 3);
                    assert!((Duration::from_secs(2)..=Duration::from_secs(10)).contains(d));
                }
                Fault::StepDown(s) => assert!(streams().contains(s)),
            }
        }
        assert!(single.iter().all(|(_, f)| match f {
            Fault::KillNode(i) | Fault::PauseNode(i, _) => *i == 0,
            Fault::StepDown(_) => false,
            _ => true,
        }));
    }

    #[test]
    fn only_the_kinds_asked_for_are_drawn() {
        let kinds = [Kind::KillRouter, Kind::PauseNode];
        let faults = draw(&mut Schedule::new(3, &kinds, 1, 2, 2, streams()), 100);
        assert!(faults
            .iter()
            .all(|(_, f)| matches!(f, Fault::KillRouter(_) | Fault::PauseNode(..))));
        assert!(faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::KillRouter(_))));
        assert!(faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::PauseNode(..))));
    }
}
