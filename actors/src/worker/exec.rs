//! [`ExecHandler`]: runs a shell command per attempt.
//!
//! The command (`sh -c <command>`) gets the task JSON on stdin and the environment
//! `TASK_ID`, `ATTEMPT_ID`, `WORKER_ID`, `TASK_RERUN` (`0`/`1`) and, on a resume,
//! `TASK_ANSWERS` (a JSON array of the answers so far). Its stdout is one JSON object:
//! `{"response": <any>}` completes the attempt, `{"question": "...", "tool_call_id": "..."}`
//! parks it. A non-zero exit fails the attempt with the last [`STDERR_TAIL`] bytes of stderr;
//! unparsable stdout fails it naming the problem. On cancellation the process gets SIGTERM,
//! then SIGKILL after `grace`, and the attempt ends cancelled.

use std::process::Stdio;
use std::time::Duration;

use protocol::task::{Answer, TaskSpec};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::handler::{AttemptContext, Outcome, TaskHandler};

/// How much of the end of stderr a failure carries.
pub const STDERR_TAIL: usize = 2048;

/// Runs `sh -c <command>` per attempt. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct ExecHandler {
    /// The shell command.
    pub command: String,
    /// How long after SIGTERM a cancelled process is killed.
    pub grace: Duration,
}

#[async_trait::async_trait]
impl TaskHandler for ExecHandler {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        self.exec(&task, None, ctx).await
    }

    async fn resume(&self, task: TaskSpec, answers: Vec<Answer>, ctx: AttemptContext) -> Outcome {
        self.exec(&task, Some(&answers), ctx).await
    }
}

impl ExecHandler {
    async fn exec(
        &self,
        task: &TaskSpec,
        answers: Option<&[Answer]>,
        ctx: AttemptContext,
    ) -> Outcome {
        let input = match serde_json::to_vec(task) {
            Ok(input) => input,
            Err(e) => return Outcome::Failed(format!("cannot encode the task: {e}")),
        };
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .env("TASK_ID", ctx.task_id.as_str())
            .env("ATTEMPT_ID", ctx.attempt_id.as_str())
            .env("WORKER_ID", ctx.worker_id.as_str())
            .env("TASK_RERUN", if ctx.rerun { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(answers) = answers {
            let encoded = serde_json::to_string(answers).unwrap_or_else(|_| "[]".into());
            command.env("TASK_ANSWERS", encoded);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return Outcome::Failed(format!("cannot start `{}`: {e}", self.command)),
        };
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                // A command that does not read its stdin closes the pipe: ignore the error.
                let _ = stdin.write_all(&input).await;
            });
        }
        let mut stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let out = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf).await;
            buf
        });
        let err = tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf).await;
            buf
        });
        let status = tokio::select! {
            status = child.wait() => status,
            () = ctx.cancelled() => {
                terminate(&mut child, self.grace).await;
                return Outcome::Cancelled;
            }
        };
        let stdout = out.await.unwrap_or_default();
        let stderr = err.await.unwrap_or_default();
        match status {
            Ok(status) if status.success() => parse_stdout(&stdout),
            Ok(status) => Outcome::Failed(format!(
                "command exited with {status}; stderr: {}",
                tail(&stderr)
            )),
            Err(e) => Outcome::Failed(format!("cannot wait for the command: {e}")),
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`.
async fn terminate(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// The last [`STDERR_TAIL`] bytes of `stderr`, lossily decoded and trimmed.
fn tail(stderr: &[u8]) -> String {
    let start = stderr.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&stderr[start..]).trim().to_owned()
}

/// Reads a command's stdout as an [`Outcome`].
pub fn parse_stdout(stdout: &[u8]) -> Outcome {
    let value: Value = match serde_json::from_slice(stdout) {
        Ok(value) => value,
        Err(e) => {
            return Outcome::Failed(format!(
                "unparsable stdout (expected one JSON object): {e}: {:?}",
                String::from_utf8_lossy(&stdout[..stdout.len().min(200)])
            ))
        }
    };
    let Value::Object(mut map) = value else {
        return Outcome::Failed("unparsable stdout: not a JSON object".into());
    };
    if let Some(response) = map.remove("response") {
        return Outcome::Completed(response);
    }
    match (map.get("question"), map.get("tool_call_id")) {
        (Some(Value::String(question)), Some(Value::String(tool_call_id))) => Outcome::Waiting {
            question: question.clone(),
            tool_call_id: tool_call_id.clone(),
        },
        _ => Outcome::Failed(
            "unparsable stdout: expected {\"response\": ..} or {\"question\": .., \"tool_call_id\": ..}"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::task::AttemptId;
    use protocol::{TaskId, WorkerId};

    fn task() -> TaskSpec {
        protocol::task::decode_task(&serde_json::json!({
            "version": 1, "task_id": "t1", "text": "hello"
        }))
        .unwrap()
    }

    fn ctx() -> (AttemptContext, tokio::sync::watch::Sender<bool>) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let ctx = AttemptContext {
            task_id: TaskId::new("t1").unwrap(),
            attempt_id: AttemptId::new("a1").unwrap(),
            worker_id: WorkerId::new("w1").unwrap(),
            rerun: true,
            cancelled: rx,
        };
        (ctx, tx)
    }

    fn exec(command: &str) -> ExecHandler {
        ExecHandler {
            command: command.into(),
            grace: Duration::from_millis(500),
        }
    }

    #[tokio::test]
    async fn exec_completed_reads_stdin_and_env() {
        let h = exec(
            r#"text=$(cat); printf '{"response": {"in": %s, "id": "%s-%s-%s-%s"}}' "$text" "$TASK_ID" "$ATTEMPT_ID" "$WORKER_ID" "$TASK_RERUN""#,
        );
        let outcome = h.run(task(), ctx().0).await;
        let Outcome::Completed(v) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(v["in"]["text"], "hello");
        assert_eq!(v["id"], "t1-a1-w1-1");
    }

    #[tokio::test]
    async fn exec_failed_carries_stderr_tail() {
        let h = exec("head -c 5000 /dev/zero | tr '\\0' x >&2; echo ' the-end' >&2; exit 3");
        let Outcome::Failed(reason) = h.run(task(), ctx().0).await else {
            panic!("not failed")
        };
        assert!(reason.contains("the-end"), "{reason}");
        assert!(
            reason.len() < STDERR_TAIL + 200,
            "only the tail: {}",
            reason.len()
        );
    }

    #[tokio::test]
    async fn exec_waiting_json_is_parsed_and_resume_gets_answers() {
        let h = exec(
            r#"if [ -n "$TASK_ANSWERS" ]; then printf '{"response": %s}' "$TASK_ANSWERS"; else echo '{"question": "ok?", "tool_call_id": "c1"}'; fi"#,
        );
        assert_eq!(
            h.run(task(), ctx().0).await,
            Outcome::Waiting {
                question: "ok?".into(),
                tool_call_id: "c1".into()
            }
        );
        let answer: Answer = serde_json::from_value(serde_json::json!({
            "message_id": "m1", "task_id": "t1", "attempt_id": "a1", "worker_id": "w1",
            "tool_call_id": "c1", "responses": ["yes"]
        }))
        .unwrap();
        let Outcome::Completed(v) = h.resume(task(), vec![answer], ctx().0).await else {
            panic!("not completed")
        };
        assert_eq!(v[0]["responses"][0], "yes");
    }

    #[tokio::test]
    async fn exec_unparsable_stdout_fails_naming_it() {
        let Outcome::Failed(reason) = exec("echo not-json").run(task(), ctx().0).await else {
            panic!("not failed")
        };
        assert!(reason.contains("unparsable stdout"), "{reason}");
    }

    #[tokio::test]
    async fn exec_cancel_terminates_the_process() {
        let h = exec("sleep 30");
        let (ctx, tx) = ctx();
        let run = tokio::spawn(async move { h.run(task(), ctx).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.send(true).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(outcome, Outcome::Cancelled);
    }
}
