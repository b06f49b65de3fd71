//! Group commit: one fsync makes durable every record appended before it, so attempts that
//! finish at the same time share a single fsync instead of queueing one each behind the
//! journal's lock.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

    fn sync_to(&self, pos: u64) -> std::io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        if *synced >= pos {
            return Ok(());
        }
        let target = self.written.load(Ordering::Acquire);
        self.file.sync_data()?;
        *synced = (*synced).max(target);
        Ok(())
    }
}

impl SyncToken {
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
