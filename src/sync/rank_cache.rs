//! The cache of objects a rank of a distributed save keeps between saves to a remote
//! (`ckpt.dcp.Writer("s3://…")`, [`super::store_file_to_remote`]), so that a save on top of the
//! previous one finds that save's objects on the rank's disk instead of downloading them again.
//!
//! A kept cache lives under a root ([`default_cache_root`]: `$CKPT_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/ckpt`, else `~/.cache/ckpt`) in `dcp/<hash of the remote>/rank-<r>/`:
//! `remote` (the text naming the remote, readable), `lock`, `kept` (the files the cache keeps,
//! by path) and `store/` (a repository used only as an object store, as every rank cache is).
//! What this module guarantees:
//!
//! - One user at a time: a rank holds an exclusive OS lock (`flock`) on `lock` while it uses the
//!   cache. If another process (another job, or a second save in the same process) holds it, the
//!   rank uses a temporary cache instead, which is correct and only slower, and never waits. The
//!   kernel releases the lock of a killed process, so a dead holder blocks nobody.
//! - Bounded: after a successful save, [`RankCache::prune`] keeps only the newest file of each
//!   path this cache stored or read (the objects of this rank's newest files, each with its
//!   delta chains: what the next save pairs against) and deletes every other object.
//! - Never trusted blindly: a cache whose `remote` names another remote, whose store does not
//!   open, or whose kept files do not read back is discarded and rebuilt empty when opened;
//!   objects are checked against their ids as they are read (the store's checksums and hashes),
//!   and a save that finds damage anyway is retried once on a rebuilt cache
//!   ([`RankCache::rebuild`], the caller's choice).
//!
//! It must not decide what a save uploads or pairs: that is `stored.rs`.

use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::repo::{GcOptions, KeepReport, Repo};
use std::collections::BTreeMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// The environment variable naming the root of ckpt's caches (it wins over the XDG default).
pub const CACHE_DIR_VAR: &str = "CKPT_CACHE_DIR";

/// The root of ckpt's caches: `$CKPT_CACHE_DIR` if set, else `$XDG_CACHE_HOME/ckpt` (an
/// absolute path, as the XDG spec requires), else `$HOME/.cache/ckpt`; `None` without any.
pub fn default_cache_root() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var(CACHE_DIR_VAR) {
        return Some(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Some(dir.join("ckpt"));
    }
    var("HOME").map(|home| home.join(".cache").join("ckpt"))
}

/// The directory of the kept cache of `rank` for the remote named by `identity` under `root`.
pub fn rank_cache_dir(root: &Path, identity: &str, rank: u32) -> PathBuf {
    let hash = ObjectId::hash(identity.as_bytes()).to_hex();
    root.join("dcp").join(&hash[..32]).join(format!("rank-{rank}"))
}

/// A rank's cache: a repository used as an object store, with where it lives.
#[derive(Debug)]
pub struct RankCache {
    repo: RwLock<Arc<Repo>>,
    place: Place,
    /// The files this user of the cache stored or read, by path: what [`RankCache::prune`]
    /// keeps besides the newest kept files of other paths.
    files: Mutex<BTreeMap<String, ObjectId>>,
}

#[derive(Debug)]
enum Place {
    /// A directory the caller chose, used as it is (never pruned or rebuilt).
    Given,
    /// A temporary directory, deleted when the cache is dropped.
    Temporary {
        _dir: tempfile::TempDir,
        /// Why a kept cache was not used, if one was asked for.
        fallback: Option<String>,
    },
    /// A kept cache (`dir`: `rank-<r>/`), locked by this process.
    Kept { dir: PathBuf, _lock: Locked },
}

/// A file this process holds an exclusive OS lock on, released explicitly when dropped (a
/// forked child shares the open file, and would otherwise hold the lock until it exits).
#[derive(Debug)]
struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// What a kept cache's `kept` file holds: path -> manifest id (hex), one line each.
const KEPT: &str = "kept";
const REMOTE: &str = "remote";
const LOCK: &str = "lock";
const STORE: &str = "store";

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

impl RankCache {
    /// The cache in `dir`, used as it is (a repository opened, or created if missing).
    pub fn at(dir: &Path) -> Result<RankCache> {
        let repo = if dir.join(".ckpt").is_dir() { Repo::open(dir)? } else { Repo::init(dir)? };
        Ok(RankCache::new(repo, Place::Given))
    }

    /// A temporary cache, deleted when dropped.
    pub fn temporary() -> Result<RankCache> {
        RankCache::temporary_because(None)
    }

    /// A temporary cache, `fallback` saying why a kept one is not used.
    pub fn temporary_because(fallback: Option<String>) -> Result<RankCache> {
        let dir = tempfile::Builder::new()
            .prefix("ckpt-dcp-cache-")
            .tempdir()
            .map_err(io("creating a temporary cache in", &std::env::temp_dir()))?;
        let repo = Repo::init(dir.path())?;
        Ok(RankCache::new(repo, Place::Temporary { _dir: dir, fallback }))
    }

    fn new(repo: Repo, place: Place) -> RankCache {
        RankCache { repo: RwLock::new(Arc::new(repo)), place, files: Mutex::new(BTreeMap::new()) }
    }

    /// The kept cache of `rank` for the remote `identity` names (its URL, and whatever else
    /// tells two remotes of one URL apart) under `root`, locked for this process; a temporary
    /// one if another process holds it or it cannot be locked ([`RankCache::fallback`] says
    /// why). A cache of another remote, or one that does not open or whose kept files do not
    /// read back, is emptied first.
    pub fn kept(root: &Path, identity: &str, rank: u32) -> Result<RankCache> {
        let dir = rank_cache_dir(root, identity, rank);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return RankCache::temporary_because(Some(format!("{}: {e}", dir.display())));
        }
        let lock_path = dir.join(LOCK);
        let file = match File::options().create(true).truncate(false).write(true).open(&lock_path) {
            Ok(f) => f,
            Err(e) => return RankCache::temporary_because(Some(format!("{}: {e}", lock_path.display()))),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let why = format!("{} is in use by another save or load", dir.display());
                return RankCache::temporary_because(Some(why));
            }
            // A file system without locks: sharing it unlocked could corrupt it.
            Err(TryLockError::Error(e)) => {
                return RankCache::temporary_because(Some(format!("{}: {e}", lock_path.display())))
            }
        }
        let lock = Locked(file);
        match open_kept_store(&dir, identity) {
            Ok(repo) => Ok(RankCache::new(repo, Place::Kept { dir, _lock: lock })),
            // (A full disk, a read-only directory.)
            Err(e) => RankCache::temporary_because(Some(format!("{}: {e}", dir.display()))),
        }
    }

    /// The cache's repository (a new one after [`RankCache::rebuild`]).
    pub fn repo(&self) -> Arc<Repo> {
        self.repo.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether this is a kept cache (locked, pruned, rebuilt when damaged).
    pub fn is_kept(&self) -> bool {
        matches!(self.place, Place::Kept { .. })
    }

    /// Why a kept cache was asked for but a temporary one is used.
    pub fn fallback(&self) -> Option<&str> {
        match &self.place {
            Place::Temporary { fallback, .. } => fallback.as_deref(),
            _ => None,
        }
    }

    /// Where the cache's repository is.
    pub fn dir(&self) -> PathBuf {
        self.repo().root().to_path_buf()
    }

    /// Notes that this user of the cache stored or read the file `path` (manifest
    /// `manifest`): [`RankCache::prune`] keeps it.
    pub fn note_file(&self, path: &str, manifest: ObjectId) {
        self.files.lock().unwrap_or_else(|e| e.into_inner()).insert(path.to_string(), manifest);
    }

    /// Empties a kept cache (its objects found damaged) and starts a new one in its place;
    /// false (nothing done) for any other cache. Files noted so far are forgotten.
    pub fn rebuild(&self) -> Result<bool> {
        let Place::Kept { dir, .. } = &self.place else { return Ok(false) };
        let mut repo = self.repo.write().unwrap_or_else(|e| e.into_inner());
        empty(dir)?;
        *repo = Arc::new(Repo::init(&dir.join(STORE))?);
        self.files.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(true)
    }

    /// Runs `work` on the cache's repository; if it fails in the store (an object of the cache
    /// that does not verify, or is missing while a manifest names it) and this is a kept
    /// cache, runs it once more on the cache rebuilt empty: a damaged cache costs downloads,
    /// never a failed save. (A store error that comes from the remote's objects fails again.)
    pub fn with_rebuild<T>(&self, work: impl Fn(&Repo) -> Result<T>) -> Result<T> {
        let done = work(&self.repo());
        match done {
            Err(e) if is_store_damage(&e) && self.rebuild()? => work(&self.repo()),
            done => done,
        }
    }

    /// After a successful save or load: deletes every object of a kept cache but those of the
    /// files it keeps, which are the newest file of each path: those noted since the cache was
    /// opened, then, for other paths, those kept before. `None` for a cache that is not kept.
    pub fn prune(&self) -> Result<Option<KeepReport>> {
        let Place::Kept { dir, .. } = &self.place else { return Ok(None) };
        let repo = self.repo();
        let mut kept = read_kept(dir);
        kept.extend(self.files.lock().unwrap_or_else(|e| e.into_inner()).clone());
        kept.retain(|_, m| repo.store().contains(m));
        let live: Vec<ObjectId> = kept.values().copied().collect();
        // The list first: a kill between the two leaves a list naming files still here.
        write_kept(dir, &kept)?;
        let report = repo.gc_keeping(&live, &GcOptions::now(), false)?;
        // Interrupted writes of earlier users (this one holds the lock: none is in flight).
        let _ = repo.store().clean_tmp(std::time::Duration::ZERO);
        Ok(Some(report))
    }
}

/// Whether `e` is the store's: an object that does not verify or is missing, where the cache
/// is the likely cause (not the remote, not a refusal, not the caller's arguments).
fn is_store_damage(e: &Error) -> bool {
    fn repo_store(e: &crate::repo::Error) -> bool {
        match e {
            crate::repo::Error::Store(_) => true,
            crate::repo::Error::File { source, .. } => repo_store(source),
            _ => false,
        }
    }
    match e {
        // An object the upload found damaged here before sending it (`checked.rs`).
        Error::Store(_) | Error::DamagedHere { .. } => true,
        Error::Repo(e) => repo_store(e),
        _ => false,
    }
}

/// Opens the store of the kept cache `dir` (locked by the caller) for the remote `identity`,
/// emptying the cache first if it belongs to another remote or does not read back.
fn open_kept_store(dir: &Path, identity: &str) -> Result<Repo> {
    let store = dir.join(STORE);
    let remote_file = dir.join(REMOTE);
    let named = std::fs::read_to_string(&remote_file).ok();
    if named.as_deref().map(str::trim_end) == Some(identity) && store.join(".ckpt").is_dir() {
        if let Ok(repo) = Repo::open(&store) {
            if kept_files_read_back(&repo, &read_kept(dir)) {
                return Ok(repo);
            }
        }
    }
    empty(dir)?;
    std::fs::write(&remote_file, format!("{identity}\n")).map_err(io("writing", &remote_file))?;
    Ok(Repo::init(&store)?)
}

/// Whether each kept file's manifest reads back (checked against its id) and each of its
/// blobs has a readable header: a cheap check of a cache being opened (every byte is checked
/// as it is read).
fn kept_files_read_back(repo: &Repo, kept: &BTreeMap<String, ObjectId>) -> bool {
    kept.values().all(|m| match repo.manifest(m) {
        Ok(manifest) => manifest.blobs().all(|b| repo.store().header(&b).is_ok()),
        Err(_) => false,
    })
}

/// Deletes a kept cache's store and list of kept files (not its lock, which the caller holds).
fn empty(dir: &Path) -> Result<()> {
    let store = dir.join(STORE);
    match std::fs::remove_dir_all(&store) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("deleting the damaged cache", &store)(e)),
    }
    let kept = dir.join(KEPT);
    match std::fs::remove_file(&kept) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("deleting", &kept)(e)),
    }
}

/// The kept files of cache `dir` (`<manifest hex> <path>` lines); lines that do not parse are
/// skipped (their objects then go at the next prune).
fn read_kept(dir: &Path) -> BTreeMap<String, ObjectId> {
    let text = std::fs::read_to_string(dir.join(KEPT)).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (id, path) = line.split_once(' ')?;
            Some((path.to_string(), id.parse().ok()?))
        })
        .collect()
}

fn write_kept(dir: &Path, kept: &BTreeMap<String, ObjectId>) -> Result<()> {
    let text: String = kept.iter().map(|(path, id)| format!("{} {path}\n", id.to_hex())).collect();
    let path = dir.join(KEPT);
    let tmp = dir.join(format!("{KEPT}.tmp"));
    std::fs::write(&tmp, text).map_err(io("writing", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io("writing", &path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_list_round_trips_and_skips_lines_that_do_not_parse() {
        let dir = tempfile::tempdir().unwrap();
        let kept: BTreeMap<String, ObjectId> = [("__0_0.distcp", b"a"), (".metadata", b"b")]
            .iter()
            .map(|(p, b)| (p.to_string(), ObjectId::hash(*b)))
            .collect();
        write_kept(dir.path(), &kept).unwrap();
        assert_eq!(read_kept(dir.path()), kept);
        std::fs::write(dir.path().join(KEPT), "not an id x\n\nzz\n").unwrap();
        assert!(read_kept(dir.path()).is_empty());
    }

    #[test]
    fn each_remote_and_rank_has_a_directory_of_its_own() {
        let root = Path::new("/r");
        let a = rank_cache_dir(root, "s3://b/run1", 0);
        assert_ne!(a, rank_cache_dir(root, "s3://b/run2", 0));
        assert_ne!(a, rank_cache_dir(root, "s3://b/run1", 1));
        assert!(a.starts_with("/r/dcp") && a.ends_with("rank-0"), "{}", a.display());
    }
}
