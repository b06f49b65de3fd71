//! [`ExecHandler`]: runs a shell command per attempt.
//!
//! The command (`sh -c <command>`) gets the task JSON on stdin and the environment
//! `TASK_ID`, `ATTEMPT_ID`, `WORKER_ID`, `TASK_RERUN` (`0`/`1`) and, on a resume,
//! `TASK_ANSWERS` (a JSON array of the answers so far). Its stdout is one JSON object:
//! `{"response": <any>}` completes the attempt, `{"question": "...", "tool_call_id": "..."}`
//! parks it. A non-zero exit fails the attempt with the last [`STDERR_TAIL`] bytes of stderr;
//! unparsable stdout fails it naming the problem.
//!
//! **Environment.** Otherwise the command inherits the worker's environment, minus the
//! variables in [`SECRET_ENV`] (the worker's NATS credentials and the API-key headers of its
//! trace exporter), and minus `NATS_URL` when it embeds credentials (`user:pass@`).
//!
//! **Processes.** The command runs in its own process group, and nothing it starts outlives
//! the attempt:
//! - on cancellation the group gets SIGTERM; once the shell has exited and the group closed
//!   its stdout and stderr, or after `grace` at the latest, the group gets SIGKILL, and the
//!   attempt ends cancelled;
//! - when the command exits, whatever it left running in its group is killed (SIGKILL) before
//!   its output is read;
//! - when the attempt's future is dropped without a cancel (e.g. a runtime shutting down drops
//!   its tasks), a guard owned by the future kills the whole group (SIGKILL);
//! - when the worker dies, whatever the way out (SIGKILL, the OOM killer, a panic that aborts),
//!   the group's *lifeline* kills it at once: a small `sh` ([`LIFELINE`]) that leads the
//!   group, started before the command, and blocks reading a pipe whose only writer is the
//!   worker. The kernel closes the pipe when the worker dies, however it dies; the lifeline
//!   reads its end and sends SIGKILL to its whole group. The command and everything it starts
//!   are in that group, so an input redelivered to another worker is never run twice at once.
//!
//! A process that leaves the group on purpose (`setsid`, `setpgid`) is not followed.

use std::ffi::{OsStr, OsString};
use std::process::Stdio;
use std::time::Duration;

use protocol::task::{Answer, TaskSpec};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::task::JoinHandle;

use super::handler::{AttemptContext, Outcome, TaskHandler};

/// How much of the end of stderr a failure carries.
pub const STDERR_TAIL: usize = 2048;

/// Environment variables of the worker that a command never sees: the NATS connection
/// secrets (the ones the `runtime` binary reads and those of the `nats` CLI) and the OTLP
/// exporter headers, which carry API keys. `NATS_URL` is removed too when it embeds
/// credentials.
pub const SECRET_ENV: &[&str] = &[
    "NATS_TOKEN",
    "NATS_USER",
    "NATS_USERNAME",
    "NATS_PASSWORD",
    "NATS_NKEY",
    "NATS_NKEY_SEED",
    "NATS_CREDS",
    "NATS_JWT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
];

/// The lifeline of a command's process group (run by `sh -c`, its stdin a pipe only the worker
/// writes to): it ignores the signals a cancel or a terminal sends the group (the command gets
/// them; the lifeline goes with the group's SIGKILL), says it is ready with one line, and once
/// its stdin ends (the worker is gone) sends SIGKILL to its whole group, itself included.
pub const LIFELINE: &str = "trap '' TERM INT HUP; echo ready; read _; kill -KILL 0";

/// Runs `sh -c <command>` per attempt. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct ExecHandler {
    /// The shell command.
    pub command: String,
    /// How long after SIGTERM a cancelled process group is killed.
    pub grace: Duration,
    /// Another user to run the command as ([`RunAs::lookup`]); the worker's own otherwise.
    pub run_as: Option<RunAs>,
}

/// A user an [`ExecHandler`] runs its commands as: its uid, its primary group, no
/// supplementary groups, `HOME`, `USER` and `LOGNAME` its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user's name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home directory.
    pub home: std::path::PathBuf,
}

/// Why a [`RunAs`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    /// No such user.
    #[error("no user named {0}")]
    NoSuchUser(String),
    /// This process cannot switch to another user.
    #[error("running commands as {user} needs a worker that can switch users (run it as root)")]
    CannotSwitch {
        /// The user.
        user: String,
    },
}

impl RunAs {
    /// The user `name` from the system's user database, when this process may switch to it.
    ///
    /// # Errors
    /// [`RunAsError::NoSuchUser`], or [`RunAsError::CannotSwitch`] when this process is not
    /// root (and is not that user already).
    pub fn lookup(name: &str) -> Result<RunAs, RunAsError> {
        let user = user_entry(name).ok_or_else(|| RunAsError::NoSuchUser(name.to_owned()))?;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 && euid != user.uid {
            return Err(RunAsError::CannotSwitch {
                user: name.to_owned(),
            });
        }
        Ok(user)
    }
}

/// `name`'s entry of the user database (`getpwnam_r`).
fn user_entry(name: &str) -> Option<RunAs> {
    let c_name = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0_u8; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter (plain pointers and integers).
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the name is NUL-terminated, `buf` is
    // writable for its length, `pwd` and `found` are ours.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: on success `pw_dir` points into `buf`, NUL-terminated (or is null).
    let home = if pwd.pw_dir.is_null() {
        std::path::PathBuf::from("/")
    } else {
        use std::os::unix::ffi::OsStrExt;
        let dir = unsafe { std::ffi::CStr::from_ptr(pwd.pw_dir) };
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()))
    };
    Some(RunAs {
        name: name.to_owned(),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        home,
    })
}

#[async_trait::async_trait]
impl TaskHandler for ExecHandler {
    async fn run(&self, task: TaskSpec, ctx: AttemptContext) -> Outcome {
        self.exec(&task, None, ctx, ParentEnv::Inherit).await
    }

    async fn resume(&self, task: TaskSpec, answers: Vec<Answer>, ctx: AttemptContext) -> Outcome {
        self.exec(&task, Some(&answers), ctx, ParentEnv::Inherit)
            .await
    }
}

/// Where the command's environment comes from.
enum ParentEnv {
    /// The worker's own environment.
    Inherit,
    /// This one instead (tests: a worker environment with secrets, without touching the
    /// process's).
    #[cfg(test)]
    Given(Vec<(OsString, OsString)>),
}

impl ParentEnv {
    fn vars(self) -> Vec<(OsString, OsString)> {
        match self {
            ParentEnv::Inherit => std::env::vars_os().collect(),
            #[cfg(test)]
            ParentEnv::Given(vars) => vars,
        }
    }
}

/// Whether the command may see the worker's variable `name` with `value`.
fn passes_to_command(name: &OsStr, value: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return true;
    };
    if SECRET_ENV.contains(&name) {
        return false;
    }
    // `nats://user:pass@host`: the address without its credentials is not worth the risk.
    !(name == "NATS_URL" && value.as_encoded_bytes().contains(&b'@'))
}

/// The process group of a running command (its id is its lifeline's pid). Dropped while armed,
/// it kills the whole group with SIGKILL: the exec future owns it, so dropping the future
/// mid-run ends every process the command started.
struct ProcessGroup {
    pgid: libc::pid_t,
    armed: bool,
}

/// Starts the lifeline of a new process group ([`LIFELINE`]) and waits until it is ready:
/// the group's id (the lifeline's pid) and the lifeline, whose stdin pipe the worker holds
/// for as long as it holds the returned child.
async fn lifeline() -> std::io::Result<(libc::pid_t, tokio::process::Child)> {
    use tokio::io::AsyncBufReadExt;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(LIFELINE)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pgid = child
        .id()
        .and_then(|pid| libc::pid_t::try_from(pid).ok())
        .filter(|pid| *pid > 1)
        .ok_or_else(|| std::io::Error::other("the lifeline has no process id"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut ready = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut ready)
        .await?;
    if ready.trim_end() != "ready" {
        return Err(std::io::Error::other("the lifeline did not start"));
    }
    Ok((pgid, child))
}

impl ProcessGroup {
    fn signal(&self, signal: libc::c_int) {
        // SAFETY: killpg only sends a signal; it has no memory-safety preconditions. `pgid`
        // is a process group we created, and it stays reserved while any member (or the
        // unreaped shell) exists; afterwards the signal goes nowhere (ESRCH), barring a pid
        // reuse within moments, which Linux's cyclic pid allocation makes implausible.
        unsafe {
            libc::killpg(self.pgid, signal);
        }
    }

    /// SIGKILL to every process of the group; the guard is spent.
    fn kill(&mut self) {
        if self.armed {
            self.signal(libc::SIGKILL);
            self.armed = false;
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a pipe to its end (all its writers closed it).
fn read_all(mut pipe: impl AsyncReadExt + Unpin + Send + 'static) -> JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf).await;
        buf
    })
}

impl ExecHandler {
    async fn exec(
        &self,
        task: &TaskSpec,
        answers: Option<&[Answer]>,
        ctx: AttemptContext,
        parent_env: ParentEnv,
    ) -> Outcome {
        let input = match serde_json::to_vec(task) {
            Ok(input) => input,
            Err(e) => return Outcome::Failed(format!("cannot encode the task: {e}")),
        };
        let mut command = Command::new("sh");
        command
            .env_clear()
            .envs(
                parent_env
                    .vars()
                    .into_iter()
                    .filter(|(k, v)| passes_to_command(k, v)),
            )
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
        if let Some(user) = &self.run_as {
            // As root, the standard library drops the supplementary groups before `setuid`.
            command
                .uid(user.uid)
                .gid(user.gid)
                .env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
        }
        // Its own group, led by its lifeline: signals reach the command's children too, a
        // terminal's Ctrl-C reaches the worker only (which cancels), and the worker's death
        // ends them all.
        let (pgid, _lifeline) = match lifeline().await {
            Ok(lifeline) => lifeline,
            Err(e) => return Outcome::Failed(format!("cannot start the command's lifeline: {e}")),
        };
        // Armed from here on (a command that fails to start leaves its lifeline killed with
        // the group), and dropped before the lifeline, which leads the group: the group is
        // killed while its leader is not reaped yet, so its id cannot have been reused.
        let mut group = ProcessGroup { pgid, armed: true };
        command.process_group(pgid);
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
        let mut out = read_all(child.stdout.take().expect("piped stdout"));
        let mut err = read_all(child.stderr.take().expect("piped stderr"));
        let status = tokio::select! {
            status = child.wait() => status,
            () = ctx.cancelled() => {
                terminate(&mut child, &mut group, &mut out, &mut err, self.grace).await;
                return Outcome::Cancelled;
            }
        };
        // Whatever the command left running would hold its pipes open.
        group.kill();
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

/// SIGTERM to the group; SIGKILL once the shell exited and the group closed its output (every
/// process that inherited it is gone), or after `grace` at the latest.
async fn terminate(
    child: &mut tokio::process::Child,
    group: &mut ProcessGroup,
    out: &mut JoinHandle<Vec<u8>>,
    err: &mut JoinHandle<Vec<u8>>,
    grace: Duration,
) {
    group.signal(libc::SIGTERM);
    let ended = async {
        let _ = child.wait().await;
        let _ = out.await;
        let _ = err.await;
    };
    let _ = tokio::time::timeout(grace, ended).await;
    group.kill();
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
            run_as: None,
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

    /// How long anything awaited in these tests may take.
    const DEADLINE: Duration = Duration::from_secs(10);

    /// A `sleep` argument no other process has: `300.<pid><n>` (300 s and a fraction), so a
    /// scan of `/proc` finds exactly the processes of one test.
    fn unique_sleep() -> String {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("300.{}{n:04}", std::process::id())
    }

    /// How many live processes have `arg` as one of their arguments (zombies have no
    /// command line and do not count).
    fn processes_with_arg(arg: &str) -> usize {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return 0;
        };
        dir.filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .filter(|cmdline| cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
            .count()
    }

    /// Waits until `n` processes run with each of `args`.
    async fn wait_running(args: &[&str], n: usize) {
        harness::wait_until("the handler's processes to start", DEADLINE, || {
            args.iter().all(|a| processes_with_arg(a) == n)
        })
        .await
        .unwrap();
    }

    /// Waits until no process runs with any of `args`; fails naming the survivors.
    async fn wait_gone(args: &[&str], what: &str) {
        let gone = harness::wait_until(what, DEADLINE, || {
            args.iter().all(|a| processes_with_arg(a) == 0)
        })
        .await;
        let left: Vec<_> = args.iter().map(|a| (a, processes_with_arg(a))).collect();
        assert!(gone.is_ok(), "{what}: processes left behind: {left:?}");
    }

    #[tokio::test]
    async fn exec_cancel_terminates_the_process_and_its_children() {
        let (a, b) = (unique_sleep(), unique_sleep());
        // `sh` runs a background and a foreground child: neither is the shell itself.
        let h = exec(&format!("sleep {a} & sleep {b}; wait"));
        let (ctx, tx) = ctx();
        let run = tokio::spawn(async move { h.run(task(), ctx).await });
        wait_running(&[&a, &b], 1).await;
        tx.send(true).unwrap();
        let outcome = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
        assert_eq!(outcome, Outcome::Cancelled);
        wait_gone(&[&a, &b], "cancel ends the shell and its children").await;
    }

    #[tokio::test]
    async fn exec_cancel_kills_a_handler_that_ignores_sigterm_after_grace() {
        let (a, b) = (unique_sleep(), unique_sleep());
        // The shell and (inherited) its children ignore SIGTERM.
        let h = exec(&format!("trap '' TERM; sleep {a} & sleep {b}; wait"));
        let grace = h.grace;
        let (ctx, tx) = ctx();
        let run = tokio::spawn(async move { h.run(task(), ctx).await });
        wait_running(&[&a, &b], 1).await;
        let cancelled_at = std::time::Instant::now();
        tx.send(true).unwrap();
        let outcome = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
        assert_eq!(outcome, Outcome::Cancelled);
        assert!(
            cancelled_at.elapsed() >= grace,
            "SIGKILL only after the grace period: {:?}",
            cancelled_at.elapsed()
        );
        wait_gone(&[&a, &b], "SIGKILL after grace ends every process").await;
    }

    #[tokio::test]
    async fn dropping_the_exec_future_kills_the_process_group() {
        let (a, b) = (unique_sleep(), unique_sleep());
        let h = exec(&format!("sleep {a} & sleep {b}; wait"));
        // Never cancelled: the future is dropped (as a runtime shutdown drops its tasks).
        let (ctx, _tx) = ctx();
        let run = tokio::spawn(async move { h.run(task(), ctx).await });
        wait_running(&[&a, &b], 1).await;
        run.abort();
        assert!(run.await.unwrap_err().is_cancelled());
        wait_gone(
            &[&a, &b],
            "dropping the future ends the shell and its children",
        )
        .await;
    }

    #[tokio::test]
    async fn exec_completed_kills_what_the_command_left_running() {
        let a = unique_sleep();
        // The background child keeps stdout open: without killing it the read never ends.
        let h = exec(&format!("sleep {a} & echo '{{\"response\": 1}}'"));
        let outcome = tokio::time::timeout(DEADLINE, h.run(task(), ctx().0))
            .await
            .expect("the outcome does not wait for a leftover child");
        assert_eq!(outcome, Outcome::Completed(serde_json::json!(1)));
        wait_gone(&[&a], "no leftover child after the command exits").await;
    }

    #[tokio::test]
    async fn exec_environment_carries_no_connection_secret() {
        let secret = |name: &str| format!("{name}-value-5ec12e7");
        let mut parent: Vec<(std::ffi::OsString, std::ffi::OsString)> = [
            "NATS_TOKEN",
            "NATS_PASSWORD",
            "NATS_USERNAME",
            "NATS_USER",
            "NATS_NKEY_SEED",
            "NATS_NKEY",
            "NATS_CREDS",
            "NATS_JWT",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
        ]
        .iter()
        .map(|name| (name.into(), secret(name).into()))
        .collect();
        parent.push(("KEEP_ME".into(), "kept-3b9".into()));
        parent.push(("OTEL_SERVICE_NAME".into(), "svc-kept".into()));
        if let Some(path) = std::env::var_os("PATH") {
            parent.push(("PATH".into(), path));
        }
        let names: Vec<String> = parent
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        // The handler prints its whole environment to stderr and fails, so the outcome
        // carries it.
        let outcome = exec("env >&2; exit 3")
            .exec(&task(), None, ctx().0, ParentEnv::Given(parent))
            .await;
        let Outcome::Failed(reason) = outcome else {
            panic!("not failed: {outcome:?}")
        };
        for name in &names {
            assert!(!reason.contains(&secret(name)), "{name} leaked: {reason}");
        }
        assert!(reason.contains("KEEP_ME=kept-3b9"), "{reason}");
        assert!(reason.contains("OTEL_SERVICE_NAME=svc-kept"), "{reason}");
        assert!(reason.contains("TASK_ID=t1"), "{reason}");
    }

    #[tokio::test]
    async fn exec_environment_drops_a_nats_url_with_credentials() {
        let with = "nats://alice:pw-5ec12e7@127.0.0.1:4222";
        let without = "nats://127.0.0.1:4222";
        for (url, kept) in [(with, false), (without, true)] {
            let parent = vec![("NATS_URL".into(), url.into())];
            let outcome = exec("env >&2; exit 3")
                .exec(&task(), None, ctx().0, ParentEnv::Given(parent))
                .await;
            let Outcome::Failed(reason) = outcome else {
                panic!("not failed: {outcome:?}")
            };
            assert_eq!(reason.contains(url), kept, "{url}: {reason}");
        }
    }
}
