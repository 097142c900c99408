//! The index: a sled database under `.ckpt/index/` caching what is slow to recompute from the
//! object store: per object its kind, lengths, delta reference and chain depth; per version the
//! metadata `log` shows; per working file its size, mtime, ctime, inode and hash (for
//! `status`, `checkout` and `switch`); and per pair of tensor contents the sums `ckpt report`
//! draws ([`ChangeRecord`]).
//!
//! This is the only module that names sled. Nothing in it is authoritative: the object store and
//! the ref files are the truth, and callers treat every answer as a hint that may be missing
//! (they fall back to the store) — so the index can be deleted at any time and rebuilt by
//! scanning the store (`Index::begin_rebuild` / `Index::finish_rebuild`). A rebuild that is
//! interrupted leaves the index marked incomplete, and the next open rebuilds again.
//!
//! sled allows one process at a time. [`Index::open`] takes `index.lock` next to the database
//! without waiting: when another process holds it, the caller gets [`Error::Locked`] and works
//! without the index. The index does not know about the store (layer rule); records carry plain
//! numbers the caller maps.
//!
//! A writer that has not opened the index (a commit does not: sled's start-up is a fifth of a
//! small commit) appends what it changed to a [`Journal`] instead; the next process to open the
//! index replays it first.

mod journal;

pub use journal::{Entry as JournalEntry, Journal};

use crate::object_id::ObjectId;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Version of the index layout; a database with another value is rebuilt.
const INDEX_FORMAT: u32 = 1;
const META_FORMAT: &[u8] = b"format";
const META_COMPLETE: &[u8] = b"complete";

/// Errors of the index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another process has the index open.
    #[error("the index {} is in use by another process", path.display())]
    Locked {
        /// The index directory.
        path: PathBuf,
    },
    /// sled failed to open the database (damaged or unreadable).
    #[error("opening the index {}: {source}", path.display())]
    Open {
        /// The index directory.
        path: PathBuf,
        /// sled's error.
        source: sled::Error,
    },
    /// A database operation failed.
    #[error("index {action}: {source}")]
    Db {
        /// What was being done.
        action: &'static str,
        /// sled's error.
        source: sled::Error,
    },
    /// A file system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Shorthand for index results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the index knows about one object (numbers as in the object header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectRecord {
    /// Object kind tag.
    pub kind: u8,
    /// dtype code (0: none).
    pub dtype: u8,
    /// Delta chain depth (0: standalone).
    pub depth: u32,
    /// Logical length.
    pub raw_len: u64,
    /// Object file size.
    pub stored_len: u64,
    /// The delta reference, if any.
    pub reference: Option<ObjectId>,
}

const OBJECT_RECORD_LEN: usize = 1 + 1 + 4 + 8 + 8 + 32;

impl ObjectRecord {
    fn encode(&self) -> [u8; OBJECT_RECORD_LEN] {
        let mut b = [0u8; OBJECT_RECORD_LEN];
        b[0] = self.kind;
        b[1] = self.dtype;
        b[2..6].copy_from_slice(&self.depth.to_le_bytes());
        b[6..14].copy_from_slice(&self.raw_len.to_le_bytes());
        b[14..22].copy_from_slice(&self.stored_len.to_le_bytes());
        if let Some(r) = self.reference {
            b[22..].copy_from_slice(r.as_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Option<ObjectRecord> {
        if b.len() != OBJECT_RECORD_LEN {
            return None;
        }
        let reference: [u8; 32] = b[22..].try_into().ok()?;
        Some(ObjectRecord {
            kind: b[0],
            dtype: b[1],
            depth: u32::from_le_bytes(b[2..6].try_into().ok()?),
            raw_len: u64::from_le_bytes(b[6..14].try_into().ok()?),
            stored_len: u64::from_le_bytes(b[14..22].try_into().ok()?),
            reference: (reference != [0; 32]).then_some(ObjectId(reference)),
        })
    }
}

/// What `log` shows of a version.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VersionRecord {
    /// Parent version ids, first parent first.
    pub parents: Vec<ObjectId>,
    /// Commit time, seconds since the Unix epoch (UTC).
    pub time: i64,
    /// Commit message.
    pub message: String,
    /// Paths of the version's files.
    pub files: Vec<String>,
    /// Sum of the files' lengths.
    pub raw_bytes: u64,
    /// Bytes of objects this version added to the store.
    pub stored_bytes: u64,
}

/// Cached identity of a working file (for `status`, and for `checkout` and `switch` deciding
/// whether a file holds changes they would destroy).
///
/// Size and mtime alone miss a same-size rewrite whose mtime was put back (`touch -d`, a
/// restore from a backup): the ctime and inode catch it, as in git's index, because the kernel
/// sets the ctime on every change and no call sets it back, and a file replaced by rename gets
/// another inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatRecord {
    /// File length.
    pub len: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i128,
    /// Status-change time (ctime), nanoseconds since the Unix epoch.
    pub ctime_ns: i128,
    /// Inode number.
    pub ino: u64,
    /// When the record was made, nanoseconds since the Unix epoch. A file modified within the
    /// file system's timestamp granularity of this moment cannot be trusted by mtime.
    pub recorded_ns: i128,
    /// blake3 of the file.
    pub hash: ObjectId,
}

/// Encoded length of a [`StatRecord`]. A record of another length (the 72-byte records before
/// ctime and inode were added) decodes as absent: the file is hashed again, never trusted.
const STAT_RECORD_LEN: usize = 8 + 16 + 16 + 8 + 16 + 32;

impl StatRecord {
    fn encode(&self) -> [u8; STAT_RECORD_LEN] {
        let mut b = [0u8; STAT_RECORD_LEN];
        b[..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..24].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[24..40].copy_from_slice(&self.ctime_ns.to_le_bytes());
        b[40..48].copy_from_slice(&self.ino.to_le_bytes());
        b[48..64].copy_from_slice(&self.recorded_ns.to_le_bytes());
        b[64..].copy_from_slice(self.hash.as_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<StatRecord> {
        if b.len() != STAT_RECORD_LEN {
            return None;
        }
        Some(StatRecord {
            len: u64::from_le_bytes(b[..8].try_into().ok()?),
            mtime_ns: i128::from_le_bytes(b[8..24].try_into().ok()?),
            ctime_ns: i128::from_le_bytes(b[24..40].try_into().ok()?),
            ino: u64::from_le_bytes(b[40..48].try_into().ok()?),
            recorded_ns: i128::from_le_bytes(b[48..64].try_into().ok()?),
            hash: ObjectId(b[64..].try_into().ok()?),
        })
    }
}

/// How one tensor changed between two contents (`ckpt report`): sums over its elements, keyed
/// by what was compared (the caller's key, derived from both contents' blob ids and ranges), so
/// any report that compares the same bytes again reads them here instead of decoding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChangeRecord {
    /// Elements compared.
    pub elements: u64,
    /// Elements whose bits differ.
    pub changed: u64,
    /// Elements where either value is NaN or infinite (left out of both sums).
    pub non_finite: u64,
    /// Σ (new − old)² over the finite elements (float dtypes; 0 otherwise).
    pub sum_sq_diff: f64,
    /// Σ old² over the finite elements (float dtypes; 0 otherwise).
    pub sum_sq_prev: f64,
}

const CHANGE_RECORD_LEN: usize = 8 * 5;

impl ChangeRecord {
    fn encode(&self) -> [u8; CHANGE_RECORD_LEN] {
        let mut b = [0u8; CHANGE_RECORD_LEN];
        b[..8].copy_from_slice(&self.elements.to_le_bytes());
        b[8..16].copy_from_slice(&self.changed.to_le_bytes());
        b[16..24].copy_from_slice(&self.non_finite.to_le_bytes());
        b[24..32].copy_from_slice(&self.sum_sq_diff.to_le_bytes());
        b[32..].copy_from_slice(&self.sum_sq_prev.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<ChangeRecord> {
        let word = |i: usize| b.get(i * 8..i * 8 + 8).and_then(|w| <[u8; 8]>::try_from(w).ok());
        if b.len() != CHANGE_RECORD_LEN {
            return None;
        }
        Some(ChangeRecord {
            elements: u64::from_le_bytes(word(0)?),
            changed: u64::from_le_bytes(word(1)?),
            non_finite: u64::from_le_bytes(word(2)?),
            sum_sq_diff: f64::from_le_bytes(word(3)?),
            sum_sq_prev: f64::from_le_bytes(word(4)?),
        })
    }
}

/// An open index.
pub struct Index {
    db: sled::Db,
    meta: sled::Tree,
    objects: sled::Tree,
    versions: sled::Tree,
    stat: sled::Tree,
    changes: sled::Tree,
    // Held for as long as the index is open; dropping it (after the database: the last field)
    // releases the lock.
    _lock: HeldLock,
}

/// The index's OS lock, released explicitly when dropped: closing this descriptor alone would
/// leave it held by a forked child's copy of it (a Python `DataLoader` worker) until the child
/// exits, and the index would stay closed to every other process meanwhile.
struct HeldLock(File);

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// How long [`Index::open`] waits for sled's own file lock, held by the threads of an index that
/// was just closed.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether sled failed to open because its `db` file is locked. sled reports this only as an
/// `io::Error` of kind `Other` with a formatted message, so the message is what tells it apart.
fn sled_file_lock_busy(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::Other
        && io.to_string().starts_with("could not acquire lock on"))
}

fn db_err(action: &'static str) -> impl FnOnce(sled::Error) -> Error {
    move |source| Error::Db { action, source }
}

/// Opens (creating if needed) the lock file beside the index database at `dir`.
fn open_lock_file(dir: &Path) -> Result<(std::path::PathBuf, File)> {
    let lock_path = dir.with_extension("lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| Error::Io { action: "opening", path: lock_path.clone(), source })?;
    Ok((lock_path, lock))
}

impl Index {
    /// Opens (creating if needed) the index at `dir`. Fails with [`Error::Locked`] at once when
    /// another process has it open, and with [`Error::Open`] when sled cannot open it (the
    /// caller then [`Index::destroy`]s and recreates it).
    pub fn open(dir: &Path) -> Result<Index> {
        let (lock_path, lock) = open_lock_file(dir)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked { path: dir.to_path_buf() }),
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(Error::Io { action: "locking", path: lock_path, source })
            }
        }
        let config = sled::Config::new().path(dir).cache_capacity(32 << 20).flush_every_ms(Some(500));
        // sled locks its own `db` file too, and releases it only when the last of its background
        // threads lets go of the file: an index closed a moment ago in this process (a `Repo`
        // dropped and opened again, as a training loop does every epoch) may still hold it. We
        // hold `index.lock`, so whoever has it is winding down: wait for it a bounded while, then
        // work without the index ([`Error::Locked`]) — never call the database damaged for it,
        // which would delete and rebuild it.
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(5);
        let db = loop {
            // A damaged database must never take the process down: the index is only a cache.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open())) {
                Ok(Ok(db)) => break db,
                Ok(Err(source)) if sled_file_lock_busy(&source) => {
                    if started.elapsed() >= SLED_LOCK_WAIT {
                        return Err(Error::Locked { path: dir.to_path_buf() });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
                Ok(Err(source)) => return Err(Error::Open { path: dir.to_path_buf(), source }),
                Err(_) => {
                    let source = sled::Error::Unsupported("sled panicked while opening the database".into());
                    return Err(Error::Open { path: dir.to_path_buf(), source });
                }
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(|source| Error::Open { path: dir.to_path_buf(), source });
        Ok(Index {
            meta: tree("meta")?,
            objects: tree("objects")?,
            versions: tree("versions")?,
            stat: tree("stat")?,
            changes: tree("changes")?,
            db,
            _lock: HeldLock(lock),
        })
    }

    /// Deletes the index database at `dir` (for a rebuild from scratch). The caller must not
    /// have it open; another process having it open makes this fail with [`Error::Locked`].
    pub fn destroy(dir: &Path) -> Result<()> {
        let (_, lock) = open_lock_file(dir)?;
        if lock.try_lock().is_err() {
            return Err(Error::Locked { path: dir.to_path_buf() });
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io { action: "deleting", path: dir.to_path_buf(), source }),
        }
    }

    /// Whether the index was completely built by this layout version (otherwise the caller
    /// rebuilds it).
    pub(crate) fn is_complete(&self) -> bool {
        let format = self.meta.get(META_FORMAT).ok().flatten();
        let complete = self.meta.get(META_COMPLETE).ok().flatten();
        format.as_deref() == Some(&INDEX_FORMAT.to_le_bytes()[..]) && complete.is_some()
    }

    /// Empties every tree and marks the index incomplete (durably) before a rebuild.
    pub(crate) fn begin_rebuild(&self) -> Result<()> {
        self.meta.remove(META_COMPLETE).map_err(db_err("clearing"))?;
        self.flush()?;
        for tree in [&self.objects, &self.versions, &self.stat, &self.changes, &self.meta] {
            tree.clear().map_err(db_err("clearing"))?;
        }
        Ok(())
    }

    /// Marks a rebuild finished and flushes it to disk.
    pub(crate) fn finish_rebuild(&self) -> Result<()> {
        self.meta.insert(META_FORMAT, &INDEX_FORMAT.to_le_bytes()[..]).map_err(db_err("writing"))?;
        self.meta.insert(META_COMPLETE, &[1u8][..]).map_err(db_err("writing"))?;
        self.flush()
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<()> {
        self.db.flush().map_err(db_err("flushing"))?;
        Ok(())
    }

    /// Records an object.
    pub(crate) fn put_object(&self, id: &ObjectId, record: &ObjectRecord) -> Result<()> {
        self.objects.insert(id.as_bytes(), &record.encode()[..]).map_err(db_err("writing"))?;
        Ok(())
    }

    /// The record of an object, if cached (an undecodable record counts as absent).
    pub fn object(&self, id: &ObjectId) -> Result<Option<ObjectRecord>> {
        Ok(self.objects.get(id.as_bytes()).map_err(db_err("reading"))?.and_then(|v| ObjectRecord::decode(&v)))
    }

    /// Forgets an object.
    pub(crate) fn remove_object(&self, id: &ObjectId) -> Result<()> {
        self.objects.remove(id.as_bytes()).map_err(db_err("writing"))?;
        Ok(())
    }

    /// Every cached object record, in id order.
    pub fn objects(&self) -> Result<Vec<(ObjectId, ObjectRecord)>> {
        let mut out = Vec::new();
        for item in self.objects.iter() {
            let (k, v) = item.map_err(db_err("reading"))?;
            if let (Ok(k), Some(r)) = (<[u8; 32]>::try_from(&k[..]), ObjectRecord::decode(&v)) {
                out.push((ObjectId(k), r));
            }
        }
        Ok(out)
    }

    /// Records a version's metadata.
    pub(crate) fn put_version(&self, id: &ObjectId, record: &VersionRecord) -> Result<()> {
        let bytes = serde_json::to_vec(record).expect("plain data serializes");
        self.versions.insert(id.as_bytes(), bytes).map_err(db_err("writing"))?;
        Ok(())
    }

    /// A version's metadata, if cached.
    pub fn version(&self, id: &ObjectId) -> Result<Option<VersionRecord>> {
        let v = self.versions.get(id.as_bytes()).map_err(db_err("reading"))?;
        Ok(v.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// Forgets a version.
    pub(crate) fn remove_version(&self, id: &ObjectId) -> Result<()> {
        self.versions.remove(id.as_bytes()).map_err(db_err("writing"))?;
        Ok(())
    }

    /// Records the identity of a working file.
    pub(crate) fn put_stat(&self, path: &str, record: &StatRecord) -> Result<()> {
        self.stat.insert(path.as_bytes(), &record.encode()[..]).map_err(db_err("writing"))?;
        Ok(())
    }

    /// The cached identity of a working file.
    pub fn stat(&self, path: &str) -> Result<Option<StatRecord>> {
        Ok(self.stat.get(path.as_bytes()).map_err(db_err("reading"))?.and_then(|v| StatRecord::decode(&v)))
    }

    /// Every working-file identity recorded (path, record), undecodable records left out.
    pub fn stats(&self) -> Result<Vec<(String, StatRecord)>> {
        let mut out = Vec::new();
        for item in self.stat.iter() {
            let (k, v) = item.map_err(db_err("reading"))?;
            if let (Ok(path), Some(r)) = (std::str::from_utf8(&k), StatRecord::decode(&v)) {
                out.push((path.to_string(), r));
            }
        }
        Ok(out)
    }

    /// Forgets the identity of a working file.
    pub(crate) fn remove_stat(&self, path: &str) -> Result<()> {
        self.stat.remove(path.as_bytes()).map_err(db_err("writing"))?;
        Ok(())
    }

    /// Records how a tensor changed between two contents, under the caller's `key`.
    pub fn put_change(&self, key: &ObjectId, record: &ChangeRecord) -> Result<()> {
        self.changes.insert(key.as_bytes(), &record.encode()[..]).map_err(db_err("writing"))?;
        Ok(())
    }

    /// The change recorded under `key`, if any (an undecodable record counts as absent).
    pub fn change(&self, key: &ObjectId) -> Result<Option<ChangeRecord>> {
        Ok(self.changes.get(key.as_bytes()).map_err(db_err("reading"))?.and_then(|v| ChangeRecord::decode(&v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sled's file lock still held (by the threads of an index closed a moment ago) is waited
    /// for, and when it is not released the index is reported in use, not damaged.
    #[test]
    fn a_lingering_sled_file_lock_is_waited_for_and_never_taken_for_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index");
        let ix = Index::open(&path).unwrap();
        ix.finish_rebuild().unwrap();
        drop(ix);
        // Taken as soon as sled's own threads let go of it (a few ms at most, under load).
        let hold = || {
            let f = File::options().read(true).write(true).open(path.join("db")).unwrap();
            let began = std::time::Instant::now();
            while f.try_lock().is_err() {
                assert!(began.elapsed() < SLED_LOCK_WAIT, "sled kept its lock");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            f
        };
        // Released after 150 ms: the open waits and finds the database intact.
        let held = hold();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(150));
            drop(held);
        });
        let ix = Index::open(&path).unwrap();
        assert!(ix.is_complete());
        releaser.join().unwrap();
        drop(ix);
        // Never released: Locked after the bounded wait, and the database is left alone.
        let held = hold();
        assert!(matches!(Index::open(&path), Err(Error::Locked { .. })));
        drop(held);
        assert!(Index::open(&path).unwrap().is_complete());
    }

    #[test]
    fn records_round_trip_and_rebuild_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index");
        let ix = Index::open(&path).unwrap();
        assert!(!ix.is_complete());
        ix.finish_rebuild().unwrap();
        assert!(ix.is_complete());
        let id = ObjectId::hash(b"a");
        let rec = ObjectRecord {
            kind: 1,
            dtype: 9,
            depth: 2,
            raw_len: 10,
            stored_len: 5,
            reference: Some(ObjectId([3; 32])),
        };
        ix.put_object(&id, &rec).unwrap();
        assert_eq!(ix.object(&id).unwrap(), Some(rec));
        let v = VersionRecord {
            parents: vec![id],
            time: 17,
            message: "m".into(),
            files: vec!["a".into()],
            raw_bytes: 1,
            stored_bytes: 2,
        };
        ix.put_version(&id, &v).unwrap();
        assert_eq!(ix.version(&id).unwrap(), Some(v));
        let s = StatRecord { len: 1, mtime_ns: -5, ctime_ns: 6, ino: 1 << 40, recorded_ns: 7, hash: id };
        ix.put_stat("a/b", &s).unwrap();
        assert_eq!(ix.stat("a/b").unwrap(), Some(s));
        let c = ChangeRecord { elements: 9, changed: 4, non_finite: 1, sum_sq_diff: 0.25, sum_sq_prev: 2.5 };
        ix.put_change(&id, &c).unwrap();
        assert_eq!(ix.change(&id).unwrap(), Some(c));
        // A record of the earlier 72-byte layout (no ctime, no inode) is not trusted.
        ix.stat.insert(b"old", &[0u8; 72][..]).unwrap();
        assert_eq!(ix.stat("old").unwrap(), None);

        // A second opener is refused while the first holds the index.
        assert!(matches!(Index::open(&path), Err(Error::Locked { .. })));
        ix.begin_rebuild().unwrap();
        assert!(!ix.is_complete());
        assert_eq!(ix.object(&id).unwrap(), None);
        assert_eq!(ix.change(&id).unwrap(), None);
        drop(ix);
        Index::destroy(&path).unwrap();
        let ix = Index::open(&path).unwrap();
        assert!(!ix.is_complete());
    }
}
