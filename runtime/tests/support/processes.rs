//! Helpers of the tests that run the `runtime` binary as real processes: a scene (a temp dir
//! with a delivery config, a marker dir and an `--exec` script), routers and workers as
//! [`RuntimeProcess`]es, and one-shot client commands.

use std::path::PathBuf;

use harness::RuntimeProcess;

/// A temp dir with the delivery config (1 s ack wait), a marker dir and an exec script that
/// touches `<markers>/<WORKER_ID>`, sleeps `sleep_secs` and answers with its worker id.
pub struct Scene {
    pub dir: tempfile::TempDir,
}

impl Scene {
    pub fn new(sleep_secs: u32) -> Scene {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("delivery.json"), r#"{"ack_wait_secs": 1}"#).unwrap();
        std::fs::create_dir(dir.path().join("markers")).unwrap();
        let script = format!(
            "cat > /dev/null\n\
             touch '{markers}'/\"$WORKER_ID\"\n\
             sleep {sleep_secs}\n\
             printf '{{\"response\": \"%s\"}}\\n' \"$WORKER_ID\"\n",
            markers = dir.path().join("markers").display()
        );
        std::fs::write(dir.path().join("task.sh"), script).unwrap();
        Scene { dir }
    }

    /// Replaces the exec script: a first run (`TASK_RERUN=0`) writes its attempt id to
    /// `<markers>/<WORKER_ID>` and sleeps 20 s; a re-run answers `<attempt id>:<rerun>` at
    /// once.
    pub fn rerun_script(self) -> Scene {
        let script = format!(
            "cat > /dev/null\n\
             printf '%s' \"$ATTEMPT_ID\" > '{markers}'/\"$WORKER_ID\"\n\
             if [ \"$TASK_RERUN\" = 0 ]; then sleep 20; fi\n\
             printf '{{\"response\": \"%s:%s\"}}\\n' \"$ATTEMPT_ID\" \"$TASK_RERUN\"\n",
            markers = self.dir.path().join("markers").display()
        );
        std::fs::write(self.dir.path().join("task.sh"), script).unwrap();
        self
    }

    /// Replaces the delivery config with `json`.
    pub fn with_delivery(self, json: &str) -> Scene {
        std::fs::write(self.dir.path().join("delivery.json"), json).unwrap();
        self
    }

    /// Replaces the exec script with `body` (run by `sh`; `{markers}` is replaced by the
    /// marker dir).
    pub fn with_script(self, body: &str) -> Scene {
        let markers = self.markers().display().to_string();
        std::fs::write(
            self.dir.path().join("task.sh"),
            body.replace("{markers}", &markers),
        )
        .unwrap();
        self
    }

    /// The marker dir.
    pub fn markers(&self) -> PathBuf {
        self.dir.path().join("markers")
    }

    pub fn config(&self) -> String {
        self.dir.path().join("delivery.json").display().to_string()
    }

    pub fn exec(&self) -> String {
        format!("sh {}", self.dir.path().join("task.sh").display())
    }

    pub fn journal(&self, worker: &str) -> PathBuf {
        self.dir.path().join(format!("journal-{worker}"))
    }

    /// Worker ids whose script started, in no particular order.
    pub fn started(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.path().join("markers"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    pub fn router(&self, url: &str) -> RuntimeProcess {
        RuntimeProcess::router(url, Some(&self.config())).unwrap()
    }

    pub fn worker(&self, url: &str, id: &str, queue: &str) -> RuntimeProcess {
        self.worker_with(url, id, queue, &[], &[])
    }

    /// [`worker`](Self::worker) with extra arguments and environment.
    pub fn worker_with(
        &self,
        url: &str,
        id: &str,
        queue: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> RuntimeProcess {
        let journal = self.journal(id).display().to_string();
        let mut envs = envs.to_vec();
        envs.push(("RUST_LOG", "warn"));
        let mut args = vec![
            "start",
            "--role",
            "worker",
            "--worker-id",
            id,
            "--queue",
            queue,
            "--concurrency",
            "1",
        ];
        let exec = self.exec();
        let config = self.config();
        args.extend([
            "--exec",
            &exec,
            "--journal-dir",
            &journal,
            "--durable",
            "--nats-url",
            url,
            "--delivery-config",
            &config,
        ]);
        args.extend(extra);
        RuntimeProcess::spawn(args, &envs).unwrap()
    }
}

/// `runtime <args>` without the environment of the test run that would change what it does.
pub fn one_shot(args: &[&str]) -> tokio::process::Command {
    super::oneshot::command(super::oneshot::RUNTIME, args)
}

pub fn logs(processes: &[(&str, &RuntimeProcess)]) -> String {
    processes
        .iter()
        .map(|(name, p)| format!("--- {name}:\n{}", p.log()))
        .collect()
}
