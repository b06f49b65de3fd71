//! The built `runtime` binary as a child process a test can `kill -9`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::HarnessError;

/// A running `runtime` process. Killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct RuntimeProcess {
    child: Child,
    log: tempfile::NamedTempFile,
}

/// Where the `runtime` binary is: `RUNTIME_BIN`, else `runtime` next to the running test's
/// `deps/` folder (`target/<profile>/runtime`, which `cargo test --workspace` builds).
///
/// # Errors
/// [`HarnessError::RuntimeNotFound`] when neither exists.
pub fn runtime_bin() -> Result<PathBuf, HarnessError> {
    if let Some(bin) = std::env::var_os("RUNTIME_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(HarnessError::Io)?;
    // target/<profile>/deps/<test-binary> -> target/<profile>/runtime
    let candidate = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("runtime"));
    match candidate {
        Some(path) if path.is_file() => Ok(path),
        _ => Err(HarnessError::RuntimeNotFound {
            looked: format!("RUNTIME_BIN, {:?}", candidate),
        }),
    }
}

impl RuntimeProcess {
    /// Spawns `runtime <args>` with the extra environment `envs`; stdout and stderr go to a
    /// temporary log file (see [`log`](Self::log)).
    ///
    /// # Errors
    /// [`HarnessError::RuntimeNotFound`] or [`HarnessError::Spawn`].
    pub fn spawn<I, S>(args: I, envs: &[(&str, &str)]) -> Result<RuntimeProcess, HarnessError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let bin = runtime_bin()?;
        let log = tempfile::NamedTempFile::new().map_err(HarnessError::Io)?;
        let out = log.reopen().map_err(HarnessError::Io)?;
        let err = log.reopen().map_err(HarnessError::Io)?;
        let mut cmd = Command::new(&bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| HarnessError::Spawn {
            bin: bin.display().to_string(),
            source: e,
        })?;
        Ok(RuntimeProcess { child, log })
    }

    /// `runtime start --role router --durable --nats-url <url>`, with `--delivery-config
    /// <path>` when given, logging warnings only.
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    pub fn router(
        url: &str,
        delivery_config: Option<&str>,
    ) -> Result<RuntimeProcess, HarnessError> {
        let mut args = vec!["start", "--role", "router", "--durable", "--nats-url", url];
        if let Some(path) = delivery_config {
            args.extend(["--delivery-config", path]);
        }
        RuntimeProcess::spawn(args, &[("RUST_LOG", "warn")])
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `kill -9`: no shutdown code runs. Waits until the process is gone.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Sends SIGTERM (graceful shutdown) and waits up to `deadline` for the exit code.
    ///
    /// # Errors
    /// [`HarnessError::Timeout`] when it has not exited by then.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<Option<i32>, HarnessError> {
        self.signal(libc::SIGTERM);
        self.wait_exit(deadline).await
    }

    /// Sends a signal to the process (e.g. `libc::SIGINT`).
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
    }

    /// Waits up to `deadline` for the process to exit and returns its exit code.
    ///
    /// # Errors
    /// [`HarnessError::Timeout`] when it has not exited by then.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<Option<i32>, HarnessError> {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(status)) => Ok(status.code()),
            Ok(Err(e)) => Err(HarnessError::Io(e)),
            Err(_) => Err(HarnessError::Timeout {
                what: "runtime process exit".into(),
            }),
        }
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Everything the process printed so far (stdout and stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}
