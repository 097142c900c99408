//! The writer lock: `.ckpt/lock`, held (with an OS file lock, released when the process exits,
//! even on kill -9) by every operation that changes the store or refs. A second writer polls
//! until the lock is free or its timeout passes, then fails with [`Error::Locked`].

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
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
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
        drop(first);
        WriterLock::acquire(&path, Duration::ZERO).unwrap();
    }
}
