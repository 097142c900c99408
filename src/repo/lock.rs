//! The writer lock: `.ckpt/lock`, held (with an OS file lock, released when the process exits,
//! even on kill -9) by every operation that changes the store or refs. A second writer polls
//! until the lock is free or its timeout passes, then fails with [`Error::Locked`].
//!
//! A writer that has to wait says so by creating `.ckpt/lock.waiting` until it has the lock,
//! so that a background compaction holding the lock can step aside between two rewrites
//! ([`WriterLock::is_wanted`]) instead of making a commit wait for all of its work.

use super::{Error, Result};
use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

/// Proof of holding the writer lock; dropping it releases the lock.
pub struct WriterLock {
    _file: File,
}

impl WriterLock {
    /// Takes the lock at `path`, waiting up to `timeout`.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<WriterLock> {
        let file = File::options().create(true).truncate(false).write(true).open(path).map_err(|source| Error::Io {
            action: "opening the lock file",
            path: path.to_path_buf(),
            source,
        })?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        let mut waiting: Option<WaitingMarker> = None;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(WriterLock { _file: file }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(source)) => {
                    return Err(Error::Io { action: "locking", path: path.to_path_buf(), source })
                }
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Locked { path: path.to_path_buf(), waited });
            }
            // Made again at every poll: another waiter that got the lock first removed it.
            waiting.get_or_insert_with(|| WaitingMarker(waiting_path(path))).refresh();
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Whether another writer is waiting for the lock at `path`.
    pub fn is_wanted(path: &Path) -> bool {
        waiting_path(path).exists()
    }
}

/// `.ckpt/lock.waiting` for the lock at `path`.
fn waiting_path(path: &Path) -> std::path::PathBuf {
    path.with_extension("waiting")
}

/// The marker of a waiting writer, removed when it gets the lock or gives up. Best effort: a
/// marker left by a killed writer only makes background compactions step aside until the next
/// writer that waits removes it.
struct WaitingMarker(std::path::PathBuf);

impl WaitingMarker {
    /// Creates the marker file if it is not there.
    fn refresh(&self) {
        if !self.0.exists() {
            let _ = File::create(&self.0);
        }
    }
}

impl Drop for WaitingMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_writer_times_out_then_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = WriterLock::acquire(&path, Duration::ZERO).unwrap();
        let err = WriterLock::acquire(&path, Duration::from_millis(50)).err().unwrap();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(!WriterLock::is_wanted(&path), "a writer that gave up no longer waits");
        drop(first);
        WriterLock::acquire(&path, Duration::ZERO).unwrap();
    }

    #[test]
    fn a_waiting_writer_is_seen_until_it_has_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = WriterLock::acquire(&path, Duration::ZERO).unwrap();
        assert!(!WriterLock::is_wanted(&path));
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || WriterLock::acquire(&path, Duration::from_secs(30)).map(|_| ()))
        };
        let start = Instant::now();
        while !WriterLock::is_wanted(&path) {
            assert!(start.elapsed() < Duration::from_secs(20), "the waiter never showed");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Another waiter that got the lock first takes the marker away; a writer still waiting
        // puts it back at its next poll.
        std::fs::remove_file(waiting_path(&path)).unwrap();
        let start = Instant::now();
        while !WriterLock::is_wanted(&path) {
            assert!(start.elapsed() < Duration::from_secs(20), "the marker never came back");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(first);
        waiter.join().unwrap().unwrap();
        assert!(!WriterLock::is_wanted(&path), "the marker goes once the waiter has the lock");
    }
}
