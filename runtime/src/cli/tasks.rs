//! `runtime delegate`, `runtime task status|cancel` and `runtime answer`.

use std::collections::BTreeSet;
use std::time::Duration;

use actors::tracker::TrackerEvent;
use protocol::subjects::ControlKind;
use protocol::task::TaskResult;
use protocol::{AgentId, QueueName, TaskId, WorkerId};
use runtime::system::control::ActingAs;
use runtime::{ActorSystem, SystemError};

use super::messaging::agent;
use super::{invalid, AnswerArgs, DelegateArgs, TaskAction, TaskArgs};

/// `delegate --wait`/`--resume` ended because the task waits for an answer (exit
/// [`EXIT_WAITING`](super::EXIT_WAITING)); its waiting result was printed.
#[derive(Debug, thiserror::Error)]
#[error(
    "task {task_id} is waiting for an answer to {question:?}; answer it with `runtime answer {task_id} --text <ANSWER>` (then `runtime delegate --resume {task_id}`)"
)]
pub struct TaskWaiting {
    /// The task.
    pub task_id: TaskId,
    /// Its question.
    pub question: String,
}

/// Why `runtime delegate` did not print a final result.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// The task waits for an answer.
    #[error(transparent)]
    Waiting(#[from] TaskWaiting),
    /// Anything else.
    #[error(transparent)]
    System(#[from] SystemError),
}

/// `runtime delegate`: submits a task (and waits for its result with `--wait`), or finds a
/// task's result from its stored channel with `--resume`. Every JSON line goes through
/// `print`: the receipt, a waiting result, the final result.
///
/// A task that waits for an answer ends the wait with [`TaskWaiting`] (its waiting result
/// printed), unless `--follow-answers`: then each new question is printed and the wait goes on
/// to the final result. A timeout does not cancel the task; Ctrl-C while waiting sends a cancel
/// to the task's worker.
///
/// # Errors
/// [`DelegateError::Waiting`]; [`SystemError::InvalidSetting`] / [`SystemError::InvalidTask`]
/// for invalid input; [`SystemError::Timeout`] when no result arrived in time; connection and
/// publish errors.
pub async fn delegate(args: DelegateArgs, print: impl Fn(&str)) -> Result<(), DelegateError> {
    let from = agent("--as", args.as_id.as_deref().unwrap_or_default())?;
    let system = client_system(&args.nats, &args.hub, "runtime-delegate").await?;
    let (task_id, tracking) = match &args.resume {
        Some(id) => (
            TaskId::new(id.as_str()).map_err(|e| invalid("--resume", &e))?,
            None,
        ),
        None => {
            let queue = QueueName::new(args.queue.clone().unwrap_or_default())
                .map_err(|e| invalid("--queue", &e))?;
            let worker = args
                .worker
                .as_deref()
                .map(WorkerId::new)
                .transpose()
                .map_err(|e| invalid("--worker", &e))?;
            let mut spec = runtime::system::tasks::new_task(
                args.text.clone().unwrap_or_default(),
                args.context.clone(),
            );
            spec.idempotency_key = args.idempotency_key.clone();
            // A task's trace starts here: the submission carries this span's traceparent.
            let span = tracing::info_span!("delegate", from = %from, queue = %queue, task_id = %spec.task_id);
            // With --wait the tracker subscribes before the task is submitted.
            let submitted = async {
                if args.wait {
                    let (receipt, tracking) = system
                        .delegate_tracked(&from, &queue, worker.as_ref(), &spec)
                        .await?;
                    Ok::<_, SystemError>((receipt, Some(tracking)))
                } else {
                    let receipt = system
                        .delegate(&from, &queue, worker.as_ref(), &spec)
                        .await?;
                    Ok((receipt, None))
                }
            };
            let (receipt, tracking) = tracing::Instrument::instrument(submitted, span).await?;
            print(&serde_json::to_string(&receipt).unwrap_or_default());
            (receipt.task_id, tracking)
        }
    };
    if args.wait || args.resume.is_some() {
        let tracking = match tracking {
            Some(tracking) => tracking,
            None => system.track(&from, &task_id).await?,
        };
        let waited = wait_for_result(&system, &from, &task_id, tracking, &args, &print).await;
        let _ = system.shutdown(Duration::from_secs(5)).await;
        waited?;
        return Ok(());
    }
    system.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}

/// Waits for the final result of `task_id`, printing each waiting result that is the task's
/// current state (a stored read replays history: the channel is read again to tell).
async fn wait_for_result(
    system: &ActorSystem,
    from: &AgentId,
    task_id: &TaskId,
    tracking: runtime::system::tasks::Tracking,
    args: &DelegateArgs,
    print: &impl Fn(&str),
) -> Result<TaskResult, DelegateError> {
    let signals = super::signals()?.recv();
    let mut signals = std::pin::pin!(signals);
    let runtime::system::tasks::Tracking {
        result: mut final_result,
        mut events,
    } = tracking;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut questions_printed = BTreeSet::new();
    let mut read_warned = false;
    // A waiting result seen live may not be readable from the stream yet: read again soon, a
    // few times ([`RECHECKS`]) per event.
    let mut recheck = Recheck::default();
    loop {
        let check_at = recheck.at.unwrap_or(deadline);
        tokio::select! {
            got = &mut final_result => {
                let r = got.map_err(|_| SystemError::Task {
                    task_id: task_id.clone(),
                    what: "its tracker stopped without a result".into(),
                })?;
                print(&serde_json::to_string(&r).unwrap_or_default());
                return Ok(r);
            }
            () = tokio::time::sleep_until(check_at), if recheck.at.is_some() => {
                recheck.at = None;
                if let Some(waiting) = current_question(system, from, task_id, &mut recheck).await? {
                    if let Some(stop) = show_question(waiting, &mut questions_printed, args, print, task_id) {
                        return Err(stop.into());
                    }
                }
            }
            event = events.recv(), if !events.is_closed() => match event {
                Some(TrackerEvent::Progress(_)) => {
                    // Is it the task's current state? The channel says.
                    recheck.left = RECHECKS;
                    let Some(waiting) = current_question(system, from, task_id, &mut recheck).await? else {
                        continue;
                    };
                    if let Some(stop) = show_question(waiting, &mut questions_printed, args, print, task_id) {
                        return Err(stop.into());
                    }
                }

                Some(TrackerEvent::AnswerRefused(refusal)) => {
                    eprintln!(
                        "runtime: answer {} to task {} refused: {}: {}",
                        refusal.answer_id, refusal.task_id, refusal.error.kind.as_str(), refusal.error.detail
                    );
                }
                Some(TrackerEvent::StoredReadFailed(reason)) if !read_warned => {
                    read_warned = true;
                    eprintln!("runtime: warning: cannot read the stored task channel ({reason}); following it live only");
                }
                _ => {}
            },
            () = tokio::time::sleep_until(deadline) => {
                return Err(SystemError::Timeout {
                    what: format!("the result of task {task_id} (the task is not cancelled; `runtime delegate --resume {task_id}` finds it later)"),
                }.into());
            }
            () = &mut signals => {
                // Ctrl-C while waiting cancels the task (a timeout does not).
                let cancel = system
                    .control_task(ActingAs::Delegator(from), task_id, ControlKind::Cancel)
                    .await;
                return Err(SystemError::Task {
                    task_id: task_id.clone(),
                    what: match cancel {
                        Ok(reply) => format!("interrupted; cancel sent: {reply}"),
                        Err(e) => format!(
                            "interrupted; cancel not delivered: {}",
                            protocol::error_chain::ErrorChain(&e)
                        ),
                    },
                }.into());
            }
        }
    }
}

/// How many times the channel is read again after a progress event that it does not show yet.
const RECHECKS: u32 = 10;

/// When to read the channel again, and how many more times.
#[derive(Default)]
struct Recheck {
    at: Option<tokio::time::Instant>,
    left: u32,
}

/// The task's pending question when its channel shows one; when it shows neither a question nor
/// a final result yet (a result seen live may not be stored yet), `recheck` is set to read it
/// again shortly, while it has tries left (a question already answered stays unshown).
async fn current_question(
    system: &ActorSystem,
    from: &AgentId,
    task_id: &TaskId,
    recheck: &mut Recheck,
) -> Result<Option<TaskResult>, SystemError> {
    let view = system.task_view(from, task_id).await?;
    if let Some(waiting) = view.waiting() {
        return Ok(Some(waiting.clone()));
    }
    if view.final_result.is_none() && recheck.left > 0 {
        recheck.left -= 1;
        recheck.at = Some(tokio::time::Instant::now() + Duration::from_millis(200));
    }
    Ok(None)
}

/// Prints a waiting result the first time its question is seen; without `--follow-answers`
/// the wait ends there.
fn show_question(
    waiting: TaskResult,
    printed: &mut BTreeSet<Option<(String, String)>>,
    args: &DelegateArgs,
    print: &impl Fn(&str),
    task_id: &TaskId,
) -> Option<TaskWaiting> {
    let key = waiting
        .suspend
        .as_ref()
        .map(|s| (waiting.attempt_id.to_string(), s.tool_call_id.clone()));
    if printed.insert(key) {
        print(&serde_json::to_string(&waiting).unwrap_or_default());
    }
    (!args.follow_answers).then(|| TaskWaiting {
        task_id: task_id.clone(),
        question: waiting.suspend.map(|s| s.question).unwrap_or_default(),
    })
}

/// A task command's system: connected, durable, with the hub's stream names.
async fn client_system(
    nats: &super::NatsArgs,
    hub: &super::HubArgs,
    name: &str,
) -> Result<ActorSystem, SystemError> {
    let delivery = hub.delivery()?;
    let settings = nats.settings();
    let client = settings.connect(name).await?;
    super::client_builder(client, &settings, delivery, true)
        .build()
        .await
}

/// `runtime task status|cancel TASK_ID --as ID`: the reply of the task's worker (or of its
/// task channel, for a finished task), asked as the task's delegator; with `--delegator ID`,
/// asked as an admin about a task `ID` delegated.
///
/// # Errors
/// As [`ActorSystem::control_task`].
pub async fn task(args: TaskArgs) -> Result<serde_json::Value, SystemError> {
    let (id, kind) = match &args.action {
        TaskAction::Status { task_id } => (task_id, ControlKind::Query),
        TaskAction::Cancel { task_id } => (task_id, ControlKind::Cancel),
    };
    let task_id = TaskId::new(id.as_str()).map_err(|e| invalid("TASK_ID", &e))?;
    let (delegator, admin) = match &args.delegator {
        Some(delegator) => (agent("--delegator", delegator)?, true),
        None => (
            agent("--as", args.as_id.as_deref().unwrap_or_default())?,
            false,
        ),
    };
    let who = if admin {
        ActingAs::Admin {
            delegator: &delegator,
        }
    } else {
        ActingAs::Delegator(&delegator)
    };
    let system = client_system(&args.nats, &args.hub, "runtime-task").await?;
    let reply = system.control_task(who, &task_id, kind).await;
    let _ = system.shutdown(Duration::from_secs(5)).await;
    reply
}

/// `runtime answer TASK_ID --text ANSWER`: the answer sent, as JSON.
///
/// # Errors
/// As [`ActorSystem::answer_task`].
pub async fn answer(args: AnswerArgs) -> Result<protocol::task::Answer, SystemError> {
    let task_id = TaskId::new(args.task_id.as_str()).map_err(|e| invalid("TASK_ID", &e))?;
    let from = agent("--as", &args.as_id)?;
    let system = client_system(&args.nats, &args.hub, "runtime-answer").await?;
    let span = tracing::info_span!("answer", from = %from, task_id = %task_id);
    let answer = tracing::Instrument::instrument(
        system.answer_task(&from, &task_id, vec![serde_json::Value::String(args.text)]),
        span,
    )
    .await;
    let _ = system.shutdown(Duration::from_secs(5)).await;
    answer
}

/// `runtime task status|cancel`, printing the worker's reply.
///
/// # Errors
/// As [`task`].
pub async fn print_task(args: super::TaskArgs) -> anyhow::Result<()> {
    let reply = task(args).await?;
    println!("{reply}");
    Ok(())
}

/// `runtime answer`, printing the answer sent as JSON.
///
/// # Errors
/// As [`answer`].
pub async fn print_answer(args: super::AnswerArgs) -> anyhow::Result<()> {
    let answer = answer(args).await?;
    println!("{}", serde_json::to_string(&answer)?);
    Ok(())
}
