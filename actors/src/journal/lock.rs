//! The exclusive per-worker lock file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::JournalError;

/// Takes the exclusive, non-blocking lock on `lock_path` and writes this process's pid into
/// it. The lock lasts as long as the returned file is open.
pub(crate) fn acquire(dir: &Path, lock_path: &Path) -> Result<File, JournalError> {
    // Do not truncate before the lock is ours: the holder's pid is in the file.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock_path)
        .map_err(|e| JournalError::io(lock_path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(JournalError::Locked {
                path: dir.to_path_buf(),
                holder: read_pid(&mut file),
            });
        }
        Err(TryLockError::Error(e)) => return Err(JournalError::io(lock_path, e)),
    }
    let write_pid = |file: &mut File| -> std::io::Result<()> {
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())?;
        file.sync_data()
    };
    write_pid(&mut file).map_err(|e| JournalError::io(lock_path, e))?;
    Ok(file)
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
