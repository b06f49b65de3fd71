//! Group commit: one fsync makes durable every record appended before it, so attempts that
//! finish at the same time share a single fsync instead of queueing one each behind the
//! journal's lock.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};

use tokio::sync::oneshot;

/// A waiter of [`SyncToken::synced`]: the position it needs durable, and where to say so.
type Waiter = (u64, oneshot::Sender<std::io::Result<()>>);

/// The fsync side of a journal log.
#[derive(Debug)]
pub(crate) struct GroupSync {
    /// A handle on the log file (an fsync through any handle syncs the file).
    file: File,
    /// Bytes appended so far (set by the appender after each write).
    written: AtomicU64,
    /// Bytes known durable; the lock is held during an fsync, so waiters queue behind it and
    /// then find their records already synced.
    synced: Mutex<u64>,
    /// The syncer thread's queue, started by the first async waiter; the thread ends when this
    /// (and so its queue) is dropped.
    syncer: Mutex<Option<mpsc::Sender<Waiter>>>,
    /// Bytes known durable, readable without waiting behind an fsync in progress.
    durable: AtomicU64,
    /// A directory whose fsync failed after the log was renamed into it: it must be synced
    /// before any record counts as durable.
    dir_pending: Mutex<Option<std::path::PathBuf>>,
}

/// A promise that the records appended up to `pos` become durable: [`SyncToken::wait`].
#[derive(Debug)]
#[must_use = "a sync token must be waited on for the records to be durable"]
pub struct SyncToken {
    sync: Arc<GroupSync>,
    pos: u64,
}

impl GroupSync {
    /// For a log of `len` bytes, all durable.
    pub(crate) fn new(file: File, len: u64) -> Arc<GroupSync> {
        Arc::new(GroupSync {
            file,
            written: AtomicU64::new(len),
            synced: Mutex::new(len),
            syncer: Mutex::new(None),
            durable: AtomicU64::new(len),
            dir_pending: Mutex::new(None),
        })
    }

    /// Records that the log now holds `len` bytes and returns the token for them.
    pub(crate) fn appended(self: &Arc<Self>, len: u64) -> SyncToken {
        self.written.store(len, Ordering::Release);
        SyncToken {
            sync: self.clone(),
            pos: len,
        }
    }

    /// Requires `dir` to be fsync'd before any later record counts as durable.
    pub(crate) fn require_dir_sync(&self, dir: std::path::PathBuf) {
        *self.dir_pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
    }

    fn sync_to(&self, pos: u64) -> std::io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        if *synced >= pos {
            return Ok(());
        }
        let target = self.written.load(Ordering::Acquire);
        self.file.sync_data()?;
        let mut dir = self.dir_pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = dir.as_ref() {
            File::open(path).and_then(|d| d.sync_all())?;
            *dir = None;
        }
        *synced = (*synced).max(target);
        self.durable.store(*synced, Ordering::Release);
        Ok(())
    }
}

impl GroupSync {
    /// Hands `waiter` to the syncer thread (started on first use).
    fn submit(self: &Arc<Self>, waiter: Waiter) {
        let mut syncer = self.syncer.lock().unwrap_or_else(|e| e.into_inner());
        let waiter = match syncer.as_ref() {
            Some(tx) => match tx.send(waiter) {
                Ok(()) => return,
                // The thread is gone (it failed to start or panicked): start another.
                Err(mpsc::SendError(waiter)) => waiter,
            },
            None => waiter,
        };
        let (tx, rx) = mpsc::channel();
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || run_syncer(&weak, &rx));
        match spawned {
            Ok(_) => {
                let _ = tx.send(waiter);
                *syncer = Some(tx);
            }
            Err(e) => {
                let _ = waiter.1.send(Err(e));
            }
        }
    }
}

/// The syncer thread: takes every waiter queued, makes all of them durable with one fsync,
/// answers them, and waits for more. Ends when the journal's log handle is gone.
fn run_syncer(sync: &Weak<GroupSync>, queue: &mpsc::Receiver<Waiter>) {
    while let Ok(first) = queue.recv() {
        let mut waiters = vec![first];
        waiters.extend(queue.try_iter());
        let Some(group) = sync.upgrade() else {
            return;
        };
        let upto = waiters.iter().map(|(pos, _)| *pos).max().unwrap_or(0);
        let synced = group.sync_to(upto);
        drop(group);
        for (_, done) in waiters {
            let _ = done.send(match &synced {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            });
        }
    }
}

impl SyncToken {
    /// Resolves once the records this token covers are on disk, without blocking the caller:
    /// the fsync is done by the journal's syncer thread, one fsync for every waiter queued
    /// when it starts (group commit).
    ///
    /// # Errors
    /// The fsync's error: the records may not be durable.
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the fsync; the records become durable anyway.
    pub async fn synced(self) -> std::io::Result<()> {
        // Lock-free: an fsync in progress holds `synced` and must not block an async thread.
        if self.sync.durable.load(Ordering::Acquire) >= self.pos {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.sync.submit((self.pos, tx));
        rx.await
            .unwrap_or_else(|_| Err(std::io::Error::other("the journal's syncer thread stopped")))
    }

    /// Blocks until the records this token covers are on disk (an fsync, or nothing when a
    /// concurrent fsync already covered them).
    ///
    /// # Errors
    /// The fsync's error: the records may not be durable.
    pub fn wait(self) -> std::io::Result<()> {
        self.sync.sync_to(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn concurrent_async_waiters_are_made_durable_by_the_syncer_thread() {
        let path = std::env::temp_dir().join(format!("group-sync-async-{}", std::process::id()));
        let mut file = File::create(&path).unwrap();
        let sync = GroupSync::new(file.try_clone().unwrap(), 0);
        let mut tokens = Vec::new();
        for i in 1..=20u64 {
            file.write_all(b"x").unwrap();
            tokens.push(sync.appended(i));
        }
        let waits = tokens.into_iter().map(SyncToken::synced);
        for result in futures::future::join_all(waits).await {
            result.unwrap();
        }
        assert_eq!(*sync.synced.lock().unwrap(), 20);
        // Dropping the journal's handle ends the thread (its queue closes).
        let weak = Arc::downgrade(&sync);
        drop(sync);
        assert!(
            weak.upgrade().is_none(),
            "the syncer thread holds no strong reference"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn one_fsync_covers_every_record_appended_before_it() {
        let path = std::env::temp_dir().join(format!("group-sync-{}", std::process::id()));
        let mut file = File::create(&path).unwrap();
        let sync = GroupSync::new(file.try_clone().unwrap(), 0);
        file.write_all(b"a").unwrap();
        let first = sync.appended(1);
        file.write_all(b"b").unwrap();
        let second = sync.appended(2);
        // The first wait syncs everything written so far, the second finds it done.
        first.wait().unwrap();
        assert_eq!(*sync.synced.lock().unwrap(), 2);
        second.wait().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
