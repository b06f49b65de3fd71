//! What a chaos run checks once its load has drained, and the report it prints: facts (counts
//! worth knowing) and checks (each passed or failed).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::RawMessageErrorKind;
use protocol::task::{TaskChannelBody, TaskResult};
use protocol::TaskId;

/// The report of a run.
#[derive(Default)]
pub struct Report {
    /// Counts worth knowing, passed or not.
    pub facts: Vec<String>,
    /// Each check and whether it held.
    pub checks: Vec<(String, bool)>,
}

impl Report {
    /// Writes down a fact.
    pub fn fact(&mut self, fact: impl Into<String>) {
        self.facts.push(fact.into());
    }

    /// Writes down a check.
    pub fn check(&mut self, passed: bool, what: impl Into<String>) {
        self.checks.push((what.into(), passed));
    }

    /// How many checks failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|(_, ok)| !ok).count()
    }

    /// The facts, the checks, and the last line `N passed, M failed`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for fact in &self.facts {
            out.push_str(&format!("  {fact}\n"));
        }
        for (what, ok) in &self.checks {
            out.push_str(&format!("{} {what}\n", if *ok { "ok  " } else { "FAIL" }));
        }
        let failed = self.failed();
        out.push_str(&format!(
            "{} passed, {failed} failed\n",
            self.checks.len() - failed
        ));
        out
    }
}

/// One run of the worker's handler, from its line in the run log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    task: String,
    worker: String,
    rerun_flag: bool,
    /// When it began, wall clock ns.
    at: u128,
}

fn parse_runs(runs: &str) -> Vec<Run> {
    runs.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                [task, worker, _attempt, rerun, at] => Some(Run {
                    task: task.to_string(),
                    worker: worker.to_string(),
                    rerun_flag: *rerun == "1",
                    at: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// A run's worker and when it began (wall clock ns).
pub type RunAt = (String, u128);

/// What the run log says of the tasks' executions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Executions {
    /// Tasks whose handler ran, by id, with how many runs.
    pub runs: BTreeMap<String, usize>,
    /// Runs after a task's first.
    pub reexecutions: usize,
    /// Of those, runs that follow a kill of the worker that ran the one before, after it
    /// began.
    pub matched: usize,
    /// Runs after the first not flagged `TASK_RERUN=1`, as `task (worker)`.
    pub unflagged: Vec<String>,
    /// The re-executions no worker kill explains: the run before and the run again, each as
    /// (worker, wall clock ns), by task.
    pub unexplained: Vec<(String, RunAt, RunAt)>,
    /// Lines that are no run (a torn write).
    pub unreadable: usize,
}

/// Reads the run log against the worker kills (`(worker id, wall clock ns)`): each run after a
/// task's first is a re-execution, matched when the worker of the run before it was killed
/// between the two.
pub fn executions(runs: &str, kills: &[(String, u128)]) -> Executions {
    let parsed = parse_runs(runs);
    let mut by_task: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &parsed {
        by_task.entry(run.task.as_str()).or_default().push(run);
    }
    let mut out = Executions {
        unreadable: runs.lines().count() - parsed.len(),
        ..Executions::default()
    };
    for (task, mut runs) in by_task {
        runs.sort_by_key(|r| r.at);
        out.runs.insert(task.to_string(), runs.len());
        for pair in runs.windows(2) {
            let (before, run) = (pair[0], pair[1]);
            out.reexecutions += 1;
            let killed = kills
                .iter()
                .any(|(w, at)| *w == before.worker && (before.at..=run.at).contains(at));
            out.matched += usize::from(killed);
            if !killed {
                out.unexplained.push((
                    task.to_string(),
                    (before.worker.clone(), before.at),
                    (run.worker.clone(), run.at),
                ));
            }
            if !run.rerun_flag {
                out.unflagged.push(format!("{task} ({})", run.worker));
            }
        }
    }
    out
}

/// How many final results `task`'s channel holds in the tasks stream, read until `expected`
/// is there or `deadline` passes (a direct get may be answered by a replica still catching
/// up).
///
/// # Errors
/// A read that fails for another reason than the end of the channel.
pub async fn finals_stored(
    js: &jetstream::Context,
    task: &TaskId,
    deadline: Duration,
) -> Result<Vec<TaskResult>, String> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let finals = read_finals(js, task).await?;
        if !finals.is_empty() || tokio::time::Instant::now() >= until {
            return Ok(finals);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn read_finals(js: &jetstream::Context, task: &TaskId) -> Result<Vec<TaskResult>, String> {
    let subject = format!("channel.task.*.{task}");
    let finals = read_all(js, protocol::subjects::TASKS_STREAM, &subject)
        .await?
        .into_iter()
        .filter_map(|(_, _, payload)| match channel_body(&payload) {
            Some(TaskChannelBody::Result(r)) if r.state.is_final() => Some(r),
            _ => None,
        })
        .collect();
    Ok(finals)
}

fn channel_body(payload: &[u8]) -> Option<TaskChannelBody> {
    let env = protocol::decode(payload, protocol::Codec::Json).ok()?;
    serde_json::from_value(env.body).ok()
}

/// Every message of `stream` on `subject` (wildcards allowed), in order, as (sequence,
/// subject, payload).
async fn read_all(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Vec<(u64, String, Vec<u8>)>, String> {
    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut seq = 1;
    loop {
        let read = stream
            .raw_message_builder()
            .sequence(seq)
            .next_by_subject(subject.to_string())
            .send()
            .await;
        match read {
            Ok(msg) => {
                seq = msg.sequence + 1;
                out.push((msg.sequence, msg.subject.to_string(), msg.payload.to_vec()));
            }
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(out),
            Err(e) => return Err(format!("reading {subject}: {e}")),
        }
    }
}

/// Where the tasks in `missing` (acknowledged, no final result) are, once the load drained:
/// each one's channel events, its input if the work stream still holds it, its dead letter,
/// and the work consumer's state; one line each, for the report.
pub async fn whereabouts(js: &jetstream::Context, queue: &str, missing: &[String]) -> Vec<String> {
    let held = |stream: &'static str, subject: String| async move {
        read_all(js, stream, &subject).await.unwrap_or_default()
    };
    let task_of = |payload: &[u8]| {
        let env = protocol::decode(payload, protocol::Codec::Json).ok()?;
        protocol::task::decode_task(&env.body)
            .ok()
            .map(|t| t.task_id.to_string())
    };
    let inputs = held(protocol::subjects::WORK_STREAM, ">".into()).await;
    let dead = held(protocol::subjects::DLQ_STREAM, "dlq.work.>".into()).await;
    let mut lines = Vec::new();
    for task in missing {
        let Ok(id) = TaskId::new(task.as_str()) else {
            continue;
        };
        let events: Vec<String> = read_all(
            js,
            protocol::subjects::TASKS_STREAM,
            &format!("channel.task.*.{id}"),
        )
        .await
        .unwrap_or_default()
        .iter()
        .map(|(seq, _, payload)| match channel_body(payload) {
            Some(TaskChannelBody::Status(s)) => {
                format!("#{seq} {:?} by {} ({})", s.kind, s.attempt_id, s.worker_id)
            }
            Some(TaskChannelBody::Result(r)) => {
                format!("#{seq} {:?} by {} ({})", r.state, r.attempt_id, r.worker_id)
            }
            Some(TaskChannelBody::AnswerRefused(a)) => {
                format!("#{seq} answer refused ({})", a.worker_id)
            }
            None => format!("#{seq} unreadable"),
        })
        .collect();
        let input: Vec<String> = inputs
            .iter()
            .filter(|(_, _, p)| task_of(p).as_deref() == Some(task.as_str()))
            .map(|(seq, subject, _)| format!("{subject} #{seq}"))
            .collect();
        let dlq = dead
            .iter()
            .filter(|(_, _, p)| task_of(p).as_deref() == Some(task.as_str()))
            .count();
        lines.push(format!(
            "where {task} is: channel [{}]; input in {} [{}]; dead letters {dlq}",
            events.join(", "),
            protocol::subjects::WORK_STREAM,
            input.join(", ")
        ));
    }
    let consumer = protocol::QueueName::new(queue)
        .map(|q| protocol::subjects::queue_consumer(&q))
        .unwrap_or_default();
    let state = match harness::consumer_info(js, protocol::subjects::WORK_STREAM, &consumer).await {
        Some(i) => format!(
            "delivered stream seq {}, ack floor stream seq {}, pending {}, ack pending {}, \
             redelivered {}, waiting pulls {}",
            i.delivered.stream_sequence,
            i.ack_floor.stream_sequence,
            i.num_pending,
            i.num_ack_pending,
            i.num_redelivered,
            i.num_waiting
        ),
        None => "unreadable".into(),
    };
    lines.push(format!(
        "{} holds {} inputs after the drain, the dead letters of tasks {}; consumer {consumer}: {state}",
        protocol::subjects::WORK_STREAM,
        inputs.len(),
        dead.len()
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(task: &str, worker: &str, rerun: u8, at: u128) -> String {
        format!("{task} {worker} att {rerun} {at}\n")
    }

    #[test]
    fn a_run_after_its_workers_kill_is_a_matched_reexecution() {
        let runs = [
            line("t1", "cw1", 0, 100),
            line("t2", "cw2", 0, 150),
            line("t1", "cw1", 1, 300),
            line("t2", "cw1", 1, 400),
        ]
        .concat();
        // cw1 killed between t1's runs; cw2 killed before t2's first run began.
        let kills = [("cw1".to_string(), 200), ("cw2".to_string(), 120)];
        let ex = executions(&runs, &kills);
        assert_eq!(ex.runs.len(), 2);
        assert_eq!(ex.reexecutions, 2);
        assert_eq!(
            ex.matched, 1,
            "t2's second run follows no kill of cw2 after it began"
        );
        assert!(ex.unflagged.is_empty());
        assert_eq!(ex.unreadable, 0);
    }

    #[test]
    fn an_unflagged_rerun_and_a_torn_line_are_counted() {
        let runs = [
            line("t1", "cw1", 0, 100),
            line("t1", "cw2", 0, 300),
            "t3 cw1\n".to_string(),
        ]
        .concat();
        let ex = executions(&runs, &[("cw1".to_string(), 200)]);
        assert_eq!((ex.reexecutions, ex.matched), (1, 1));
        assert_eq!(ex.unflagged, vec!["t1 (cw2)".to_string()]);
        assert_eq!(ex.unreadable, 1);
    }

    #[test]
    fn the_last_line_counts_passed_and_failed_checks() {
        let mut report = Report::default();
        report.fact("DMs: 10");
        report.check(true, "lost: 0");
        report.check(false, "duplicates: 1");
        let text = report.render();
        assert!(text.ends_with("1 passed, 1 failed\n"), "{text}");
        assert!(text.contains("FAIL duplicates: 1"), "{text}");
    }
}
