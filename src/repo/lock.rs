//! The writer lock: `.ckpt/lock`, held (with an OS file lock, released when the process exits,
//! even on kill -9) by every operation that changes the store or refs. A second writer polls
//! until the lock is free or its timeout passes, then fails with [`Error::Locked`]. A reader that
//! needs the store and refs to hold still (`verify` confirming a problem it saw) takes the
//! shared side ([`ReaderLock`]): readers run together, writers wait for them.
//!
//! A process that has to wait says so with `.ckpt/lock.waiting` until it has the lock, so that a
//! background compaction holding the lock can step aside between two rewrites
//! ([`WriterLock::is_wanted`]) instead of making a commit wait for all of its work. Each waiter
//! holds a shared OS lock on the marker file while it waits; a marker nobody holds a lock on was
//! left by a waiter that is gone (killed, or interrupted), and [`WriterLock::is_wanted`] deletes
//! it instead of stepping aside for it forever. (An OS lock rather than a pid in the file: it is
//! released by the kernel however the waiter ends, and works across pid namespaces, such as a
//! training container and the host sharing a repository.)
//!
//! Every lock is released explicitly (`flock(LOCK_UN)`) when its holder is dropped, not only by
//! closing the descriptor. An OS file lock belongs to the open file, which a `fork` shares with
//! the child: a Python training process that forks `DataLoader` workers while a background
//! commit holds the lock would otherwise leave it held by each worker's copy of the descriptor
//! until the worker exits, and its own next commit would time out waiting for nobody. (The
//! descriptors are opened close-on-exec, as all of Rust's are, so an `exec`ed child never has
//! them; a forked one that does not exec still does, hence the explicit release.)

use super::{Error, Result};
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The environment variable that sets how long a writer waits for the writer lock.
pub const LOCK_TIMEOUT_VAR: &str = "CKPT_LOCK_TIMEOUT";

/// Parses a lock timeout in seconds (`0`, `2.5`, `1e3`): `None` for anything else (negative,
/// NaN, not a number). A value too large for a [`Duration`] (`1e20`, `inf`) means "wait
/// forever" ([`Duration::MAX`]): nobody can tell such a wait from an endless one. The one parser
/// of `CKPT_LOCK_TIMEOUT`, for the command line, the git filter and the library alike.
pub fn parse_lock_timeout(text: &str) -> Option<Duration> {
    let secs: f64 = text.trim().parse().ok().filter(|s: &f64| !s.is_nan() && *s >= 0.0)?;
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// The writer-lock timeout `CKPT_LOCK_TIMEOUT` asks for: `Ok(None)` when it is unset (the
/// default is `super::DEFAULT_LOCK_TIMEOUT`), `Err(value)` when it is set to something
/// [`parse_lock_timeout`] refuses (the caller names the variable and the value in its error).
pub fn lock_timeout_from_env() -> std::result::Result<Option<Duration>, String> {
    let Some(raw) = std::env::var_os(LOCK_TIMEOUT_VAR) else { return Ok(None) };
    let value = raw.to_string_lossy().into_owned();
    match raw.to_str().and_then(parse_lock_timeout) {
        Some(timeout) => Ok(Some(timeout)),
        None => Err(value),
    }
}

/// Proof of holding the writer lock; dropping it releases the lock.
pub struct WriterLock {
    _file: Held,
}

/// Proof of holding the shared side of the writer lock: no writer runs until it is dropped.
pub struct ReaderLock {
    _file: Held,
}

/// A file this process holds an OS lock on; dropping it releases the lock explicitly, for every
/// descriptor of the open file, a forked child's included.
struct Held(File);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

impl WriterLock {
    /// Takes the lock at `path`, waiting up to `timeout`.
    pub(crate) fn acquire(path: &Path, timeout: Duration) -> Result<WriterLock> {
        acquire(path, timeout, false).map(|file| WriterLock { _file: Held(file) })
    }

    /// Whether another process is waiting for the lock at `path`. A marker left by a waiter that
    /// is gone is deleted (and does not count).
    pub(crate) fn is_wanted(path: &Path) -> bool {
        let marker = waiting_path(path);
        let Ok(file) = File::open(&marker) else { return false };
        match file.try_lock() {
            Err(TryLockError::WouldBlock) => true,
            Ok(()) => {
                let held = Held(file);
                // No waiter holds it. Deleted only if it is still the file we locked: a waiter
                // that made a new one meanwhile keeps it. (A waiter that opened this one just
                // now fails its lock and makes a new one at its next poll.)
                if same_file(&held.0, &marker) {
                    let _ = std::fs::remove_file(&marker);
                }
                false
            }
            // A file system without locks: the marker's presence is all there is to go by.
            Err(TryLockError::Error(_)) => true,
        }
    }
}

impl ReaderLock {
    /// Takes the shared side of the lock at `path`, waiting up to `timeout` for a writer to
    /// finish (and saying so in `.ckpt/lock.waiting`, so a background compaction steps aside).
    pub(crate) fn acquire(path: &Path, timeout: Duration) -> Result<ReaderLock> {
        acquire(path, timeout, true).map(|file| ReaderLock { _file: Held(file) })
    }
}

/// Locks `path` (exclusively, or `shared`), polling up to `timeout`.
fn acquire(path: &Path, timeout: Duration, shared: bool) -> Result<File> {
    let file = File::options().create(true).truncate(false).write(true).open(path).map_err(|source| Error::Io {
        action: "opening the lock file",
        path: path.to_path_buf(),
        source,
    })?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    let mut waiting: Option<WaitingMarker> = None;
    loop {
        match if shared { file.try_lock_shared() } else { file.try_lock() } {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => {
                return Err(Error::Io { action: "locking", path: path.to_path_buf(), source })
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::Locked { path: path.to_path_buf(), waited });
        }
        // Checked at every poll: another waiter that got the lock first removed the marker.
        waiting.get_or_insert_with(|| WaitingMarker { path: waiting_path(path), held: None }).refresh();
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// `.ckpt/lock.waiting` for the lock at `path`.
fn waiting_path(path: &Path) -> PathBuf {
    path.with_extension("waiting")
}

/// Whether `file` is the file at `path` now (same device and inode).
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A waiting process's claim on the marker: the marker file with a shared OS lock held on it,
/// removed when the process gets the lock or gives up. Best effort: failing to make it only
/// means a background compaction does not step aside.
struct WaitingMarker {
    path: PathBuf,
    /// The marker file, locked, once made.
    held: Option<Held>,
}

impl WaitingMarker {
    /// Makes (or joins) the marker unless the file at the path is already the one we hold.
    fn refresh(&mut self) {
        if self.held.as_ref().is_some_and(|f| same_file(&f.0, &self.path)) {
            return;
        }
        self.held = None;
        let Ok(file) = File::options().create(true).truncate(false).write(true).open(&self.path) else { return };
        // Fails only while `is_wanted` holds it exclusively to delete it: made anew next poll.
        if file.try_lock_shared().is_ok() {
            self.held = Some(Held(file));
        }
    }
}

impl Drop for WaitingMarker {
    fn drop(&mut self) {
        // Other waiters may share this file; they make a new one at their next poll.
        if self.held.as_ref().is_some_and(|f| same_file(&f.0, &self.path)) {
            let _ = std::fs::remove_file(&self.path);
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

    #[test]
    fn a_marker_left_by_a_waiter_that_is_gone_is_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let _holder = WriterLock::acquire(&path, Duration::ZERO).unwrap();
        // What a killed waiter leaves: the file, with nobody holding its lock.
        File::create(waiting_path(&path)).unwrap();
        assert!(!WriterLock::is_wanted(&path), "a stale marker is no waiter");
        assert!(!waiting_path(&path).exists(), "and it is cleaned up");
        // A reader waiting for the shared side is a waiter too.
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || ReaderLock::acquire(&path, Duration::from_secs(30)).map(|_| ()))
        };
        let start = Instant::now();
        while !WriterLock::is_wanted(&path) {
            assert!(start.elapsed() < Duration::from_secs(20), "the reader never showed");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(_holder);
        reader.join().unwrap().unwrap();
    }

    #[test]
    fn a_dropped_lock_is_free_although_a_copy_of_its_descriptor_lives_on() {
        // What a fork while the lock is held leaves: the child's descriptor of the same open
        // file. Dropping the holder must free the lock all the same.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = WriterLock::acquire(&path, Duration::ZERO).unwrap();
        let childs_copy = held._file.0.try_clone().unwrap();
        drop(held);
        let again = WriterLock::acquire(&path, Duration::ZERO).expect("the copy does not keep the lock");
        drop(again);
        let reader = ReaderLock::acquire(&path, Duration::ZERO).unwrap();
        let copy_of_reader = reader._file.0.try_clone().unwrap();
        drop(reader);
        WriterLock::acquire(&path, Duration::ZERO).expect("nor for a reader");
        drop((childs_copy, copy_of_reader));
    }

    #[test]
    fn readers_share_the_lock_and_keep_writers_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let a = ReaderLock::acquire(&path, Duration::ZERO).unwrap();
        let b = ReaderLock::acquire(&path, Duration::ZERO).unwrap();
        assert!(matches!(WriterLock::acquire(&path, Duration::from_millis(30)), Err(Error::Locked { .. })));
        drop((a, b));
        let w = WriterLock::acquire(&path, Duration::ZERO).unwrap();
        assert!(matches!(ReaderLock::acquire(&path, Duration::from_millis(30)), Err(Error::Locked { .. })));
        drop(w);
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn lock_timeouts_parse_one_way() {
        assert_eq!(parse_lock_timeout("0"), Some(Duration::ZERO));
        assert_eq!(parse_lock_timeout(" 2.5 "), Some(Duration::from_millis(2500)));
        assert_eq!(parse_lock_timeout("1e20"), Some(Duration::MAX));
        assert_eq!(parse_lock_timeout("inf"), Some(Duration::MAX));
        for bad in ["", "soon", "-1", "NaN", "-inf", "1s"] {
            assert_eq!(parse_lock_timeout(bad), None, "{bad:?}");
        }
    }
}
