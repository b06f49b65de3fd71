//! The router and worker processes of a chaos run: real `runtime start` processes that a
//! fault kills with SIGKILL and starts again.
//!
//! The workers run an `--exec` handler that writes a line per run to `<dir>/runs` (task id,
//! worker id, attempt id, `TASK_RERUN`, the wall clock in ns), takes 200 ms, and completes.

use std::path::PathBuf;
use std::time::Duration;

use harness::{HarnessError, RuntimeProcess};

/// The workers' queue.
pub const QUEUE: &str = "chaos";
/// The worker ids.
pub const WORKERS: [&str; 2] = ["cw1", "cw2"];
/// Routers started.
pub const ROUTERS: usize = 2;
/// Attempts each worker runs at once.
const CONCURRENCY: &str = "4";

/// A run's routers and workers, their config dir and the handler's run log.
pub struct Processes {
    dir: Option<tempfile::TempDir>,
    urls: String,
    /// The routers, by index.
    pub routers: Vec<RuntimeProcess>,
    /// The workers, by index into [`WORKERS`].
    pub workers: Vec<RuntimeProcess>,
}

impl Processes {
    /// Writes the delivery config (`delivery_json`) and the handler, and starts the routers
    /// (not the workers: [`start_workers`](Self::start_workers)).
    ///
    /// # Errors
    /// When a file cannot be written or the `runtime` binary cannot be spawned.
    pub fn start_routers(urls: &str, delivery_json: &str) -> Result<Processes, HarnessError> {
        let dir = tempfile::tempdir().map_err(HarnessError::Io)?;
        std::fs::write(dir.path().join("delivery.json"), delivery_json)
            .map_err(HarnessError::Io)?;
        let script = format!(
            "cat > /dev/null\n\
             printf '%s %s %s %s %s\\n' \"$TASK_ID\" \"$WORKER_ID\" \"$ATTEMPT_ID\" \"$TASK_RERUN\" \
             \"$(date +%s%N)\" >> '{runs}'\n\
             sleep 0.2\n\
             printf '{{\"response\": \"%s\"}}\\n' \"$WORKER_ID\"\n",
            runs = dir.path().join("runs").display()
        );
        std::fs::write(dir.path().join("task.sh"), script).map_err(HarnessError::Io)?;
        let mut processes = Processes {
            dir: Some(dir),
            urls: urls.to_string(),
            routers: Vec::new(),
            workers: Vec::new(),
        };
        for _ in 0..ROUTERS {
            let router = processes.spawn_router()?;
            processes.routers.push(router);
        }
        Ok(processes)
    }

    /// Starts the workers.
    ///
    /// # Errors
    /// When the `runtime` binary cannot be spawned.
    pub fn start_workers(&mut self) -> Result<(), HarnessError> {
        for i in 0..WORKERS.len() {
            let worker = self.spawn_worker(i)?;
            self.workers.push(worker);
        }
        Ok(())
    }

    /// `kill -9` of router `i`, and a new one in its place after `down`.
    ///
    /// # Errors
    /// When the new one cannot be spawned.
    pub async fn kill_router(&mut self, i: usize, down: Duration) -> Result<(), HarnessError> {
        self.routers[i].kill9().await;
        tokio::time::sleep(down).await;
        self.routers[i] = self.spawn_router()?;
        Ok(())
    }

    /// `kill -9` of worker `i` (its handlers die with it), and the same worker (id and
    /// journal) started again after `down`.
    ///
    /// # Errors
    /// When the new one cannot be spawned.
    ///
    /// Returns when it was gone: a run it began before then may run again.
    pub async fn kill_worker(
        &mut self,
        i: usize,
        down: Duration,
    ) -> Result<std::time::SystemTime, HarnessError> {
        self.workers[i].kill9().await;
        let gone = std::time::SystemTime::now();
        tokio::time::sleep(down).await;
        self.workers[i] = self.spawn_worker(i)?;
        Ok(gone)
    }

    /// The processes that exited without being killed by a fault, by name.
    pub fn exited(&mut self) -> Vec<String> {
        let routers = self
            .routers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| p.has_exited().then(|| format!("router {i}")));
        let workers = self
            .workers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| p.has_exited().then(|| format!("worker {}", WORKERS[i])));
        routers.chain(workers).collect()
    }

    /// The handler's run log: one line per run.
    pub fn runs(&self) -> String {
        std::fs::read_to_string(self.dir().join("runs")).unwrap_or_default()
    }

    /// Keeps the run's directory after the program ends, for a look at what failed; its path.
    pub fn keep(&mut self) -> PathBuf {
        match self.dir.take() {
            Some(dir) => dir.keep(),
            None => PathBuf::new(),
        }
    }

    fn dir(&self) -> &std::path::Path {
        self.dir
            .as_ref()
            .expect("the run's directory is kept only at the end")
            .path()
    }

    /// Every process's log, each under its name.
    pub fn logs(&self) -> String {
        let routers = self
            .routers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("--- router {i}:\n{}", p.log()));
        let workers = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, p)| format!("--- worker {}:\n{}", WORKERS[i], p.log()));
        routers.chain(workers).collect()
    }

    fn config(&self) -> String {
        self.path("delivery.json")
    }

    fn path(&self, name: &str) -> String {
        self.dir().join(name).display().to_string()
    }

    fn spawn_router(&self) -> Result<RuntimeProcess, HarnessError> {
        RuntimeProcess::router(&self.urls, Some(&self.config()))
    }

    fn spawn_worker(&self, i: usize) -> Result<RuntimeProcess, HarnessError> {
        let id = WORKERS[i];
        let journal: PathBuf = self.dir().join(format!("journal-{id}"));
        let exec = format!("sh {}", self.path("task.sh"));
        let config = self.config();
        RuntimeProcess::spawn(
            [
                "start",
                "--role",
                "worker",
                "--worker-id",
                id,
                "--queue",
                QUEUE,
                "--concurrency",
                CONCURRENCY,
                "--exec",
                &exec,
                "--journal-dir",
                &journal.display().to_string(),
                "--durable",
                "--nats-url",
                &self.urls,
                "--delivery-config",
                &config,
            ],
            &[("RUST_LOG", "warn")],
        )
    }
}
