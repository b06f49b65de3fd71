//! A worker embedded in a custom host: a Rust [`TaskHandler`] instead of `--exec`.
//!
//! ```sh
//! scripts/run.sh &    # nats-server + a durable router
//! cargo run -p examples --example embedded_worker
//! target/debug/runtime delegate --as alice --queue shout "hello" --wait
//! ```
//!
//! It joins the queue `shout` as worker `shouter` and upper-cases each task's text. A task
//! whose text ends in `?` asks a question first and completes with the answer on resume.
//! `EMBEDDED_WORKER_ONESHOT=1` delegates one task to itself, prints the result and exits.

use std::sync::Arc;
use std::time::Duration;

use runtime::{
    ActorSystem, AgentId, Answer, AttemptContext, NatsSettings, Outcome, QueueName, TaskHandler,
    TaskSpec, WorkerId, WorkerSettings,
};

struct Shout;

#[async_trait::async_trait]
impl TaskHandler for Shout {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        if ctx.is_cancelled() {
            return Outcome::Cancelled;
        }
        if task.text.ends_with('?') {
            return Outcome::Waiting {
                question: format!("how loud should I answer {:?}?", task.text),
                tool_call_id: "loudness".into(),
            };
        }
        Outcome::Completed(serde_json::json!(task.text.to_uppercase()))
    }

    async fn resume(&self, task: TaskSpec, answers: Vec<Answer>, _ctx: AttemptContext) -> Outcome {
        Outcome::Completed(serde_json::json!({
            "text": task.text.to_uppercase(),
            "answers": answers.iter().map(|a| a.responses.clone()).collect::<Vec<_>>(),
        }))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::args::from_env_or_exit(
        "embedded_worker",
        &[],
        "joins queue `shout` as worker `shouter` against NATS_URL (default nats://127.0.0.1:4222); \
         EMBEDDED_WORKER_ONESHOT=1 delegates one task to itself and exits",
    );
    let _telemetry = runtime::telemetry::init(false, "info")?;
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let system = ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .build()
        .await?;
    let queue = QueueName::new("shout")?;
    system
        .start_worker(WorkerSettings {
            concurrency: 4,
            ..WorkerSettings::new(
                WorkerId::new("shouter")?,
                queue.clone(),
                std::env::temp_dir().join("embedded-worker-journal"),
                Arc::new(Shout),
            )
        })
        .await?;
    tracing::info!("worker `shouter` joined queue `shout`; Ctrl-C stops it");

    if std::env::var_os("EMBEDDED_WORKER_ONESHOT").is_some() {
        let spec = runtime::new_task("hello from an embedded worker", vec![]);
        let alice = AgentId::new("alice")?;
        let tracking = system.track(&alice, &spec.task_id).await?;
        system.delegate(&alice, &queue, None, &spec).await?;
        let result = tokio::time::timeout(Duration::from_secs(30), tracking.result).await??;
        println!("{}", serde_json::to_string(&result)?);
    } else {
        runtime::shutdown::wait_for_signal().await?;
    }
    system.shutdown(Duration::from_secs(10)).await?;
    Ok(())
}
