//! The repository: the library's public face. [`Repo`] coordinates the object store
//! ([`crate::store`]), the index ([`crate::index`], a rebuildable cache) and the ref files to
//! commit checkpoints as versions, check them out bit-exactly, and keep history healthy
//! (`gc`, `verify`).
//!
//! Layout of `.ckpt/` (docs/format.md, "Repository"): `objects/` and `tmp/` (the store),
//! `index/` (sled), `refs/heads/`, `refs/tags/`, `HEAD`, `config`, `lock` (the writer lock),
//! `pending-removals` (files `rm`-ed since the last commit).
//!
//! Writers (commit, tag, branch, switch, rm, gc, index rebuild) hold the writer lock; readers
//! never wait for it. Every write puts content first and the name that makes it visible last:
//! blobs, then manifests, then the version, then the ref. An interrupted writer leaves at most
//! unreferenced objects, which `gc` deletes. This module never speaks git or clap.

mod bundle;
mod chains;
pub(crate) use chains::since_base_after;
pub(crate) use commit::NewVersion;
mod checkout;
mod commit;
mod commit_memory;
mod commit_objects;
mod commit_stored;
mod compact;
mod config;
mod cut;
mod derive_copies;
mod error;
#[cfg(test)]
pub mod fixtures;
mod gc;
pub mod graph;
mod index_cache;
mod inspect;
mod lock;
mod model;
mod pairing;
mod partial;
mod path;
mod pieces;
mod prune;
mod reachable;
mod refs;
mod revision;
mod saves;
mod status;
mod store_file;
mod verify;

pub use checkout::{CheckoutOptions, CheckoutSummary, TensorFilter};
pub use commit::CommitOptions;
pub use commit_memory::{
    safetensors_image, safetensors_image_in, CommitSource, MemoryFile, OpenedFile, SafetensorsImage, TensorReader,
    TensorSpec,
};
pub use compact::{CompactOptions, CompactReport, COMPACTION_LOG};
pub use config::{Compaction, Config, DeltaPolicy, MAX_BASE_EVERY};
pub use derive_copies::StoredCopy;
pub use error::{Error, Result};
pub use gc::{parse_grace, GcOptions, GcReport, KeepReport, MissingRepository};
pub use inspect::{
    to_f64, DerivedFrom, DiffReport, FileShow, GroupChange, MethodCounts, Reshaped, SegmentShow, ShowReport,
    ShowTotals, Storage, TensorDiff, TensorName,
};
pub use lock::{lock_timeout_from_env, parse_lock_timeout, LOCK_TIMEOUT_VAR};
pub use model::{
    file_hash, limits, Bundle, FileEntry, FileFormat, Manifest, Segment, TensorRef, Version, BUNDLED_MANIFEST_FORMAT,
    MODEL_FORMAT,
};
pub use partial::PartialClone;
pub use path::RepoPath;
pub use pieces::{Pieces, PIECE_MIN};
pub use prune::{BranchPruned, KeptVersion, PruneOptions, PruneReport, PrunedHistory, PrunedVersion};
pub use reachable::{Needed, Root};
pub use refs::{check_name, DeletedRef, Head, RefKind};
pub use saves::{SaveRecord, SAVES_DIR, SAVE_LAPSE};
pub use status::{hash_file, FileState, FileStatus, InTheWay, Status};
pub use store_file::{manifest_of_file, StoredFile};
pub use verify::{BadObject, BadVersion, VerifyReport};

use crate::index::{self, Index, Journal, JournalEntry, ObjectRecord, StatRecord, VersionRecord};
use crate::object_id::ObjectId;
use crate::store::{self, ObjectKind, Store};
pub(crate) use error::dirty_message;
use error::io;
pub(crate) use lock::WriterLock;
pub(crate) use pairing::Counterpart;
pub(crate) use refs::Refs;
pub(crate) use revision::split_ancestry;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A version's id: the blake3 of its serialized form.
pub type VersionId = ObjectId;

/// Name of the repository directory inside the working tree.
pub const DIR_NAME: &str = ".ckpt";
/// Branch a new repository starts on.
pub(crate) const DEFAULT_BRANCH: &str = "main";
/// Files `rm`-ed since the last commit, as a JSON list of paths.
const REMOVALS_FILE: &str = "pending-removals";

/// How long a writer waits for another writer by default.
pub(crate) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Receives progress of long operations (commit, checkout, gc, verify). Called from the thread
/// running the operation. The default methods do nothing.
pub trait Progress: Send + Sync {
    /// A phase starts; `total` is in bytes.
    fn start(&self, label: &str, total: u64) {
        let _ = (label, total);
    }
    /// Bytes done so far in the current phase.
    fn set(&self, done: u64) {
        let _ = done;
    }
    /// The phase is over.
    fn finish(&self) {}
    /// A line to show the user now, whether or not progress is shown: what the operation
    /// waits for, since when and until when (a remote gc's record a push waits on).
    fn note(&self, line: &str) {
        let _ = line;
    }
}

struct NoProgress;
impl Progress for NoProgress {}

/// What `log` shows of one version.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VersionInfo {
    /// The version's id.
    pub id: VersionId,
    /// Parent ids.
    pub parents: Vec<VersionId>,
    /// Commit time, seconds since the Unix epoch (UTC).
    pub time: i64,
    /// Commit message.
    pub message: String,
    /// Paths of its files.
    pub files: Vec<String>,
    /// Sum of the files' lengths.
    pub raw_bytes: u64,
    /// Bytes of objects this version added to the store.
    pub stored_bytes: u64,
}

impl VersionInfo {
    fn from_version(id: VersionId, v: &Version) -> VersionInfo {
        VersionInfo::from_record(id, index_cache::version_record(v))
    }

    /// Version `id`'s info from its index record.
    fn from_record(id: VersionId, r: crate::index::VersionRecord) -> VersionInfo {
        let crate::index::VersionRecord { parents, time, message, files, raw_bytes, stored_bytes } = r;
        VersionInfo { id, parents, time, message, files, raw_bytes, stored_bytes }
    }
}

/// A branch as listed by [`Repo::branches`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BranchInfo {
    /// Branch name.
    pub name: String,
    /// Tip version.
    pub id: VersionId,
    /// Whether `HEAD` is on it.
    pub current: bool,
}

/// An open repository.
pub struct Repo {
    root: PathBuf,
    dir: PathBuf,
    store: Store,
    /// The index, opened on first use ([`Repo::index`]): a command that needs no cache (a
    /// checkout to `--output`) never pays sled's start-up (a snapshot write, two fsyncs, its
    /// cache: 35–40 MiB of RSS) nor contends for its lock.
    index: OnceLock<Option<Index>>,
    /// Index changes made while the index was not open, appended to `.ckpt/index-journal` by
    /// [`Repo::flush_index`] for the next process that opens it ([`index::Journal`]): a commit
    /// or checkout does not pay sled's start-up for a cache it does not read.
    unjournaled: Mutex<Vec<JournalEntry>>,
    refs: Refs,
    config: Config,
    progress: Arc<dyn Progress>,
    lock_timeout: Duration,
    /// Each version read by [`Repo::ancestor_since_base`] as (`since_base`, first parent):
    /// versions are immutable, and a commit walks up to `base_every` of them to find its pinned
    /// base, so a process committing many versions (the library, the git filter) would otherwise
    /// read O(base_every) versions per commit.
    since_base_walk: Mutex<HashMap<VersionId, (u32, Option<VersionId>)>>,
}

impl std::fmt::Debug for Repo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repo").field("root", &self.root).field("index", &self.index.get().map(Option::is_some)).finish()
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        // Index changes of a failed operation, which returned before its `flush_index` (sled
        // flushes itself when dropped).
        self.append_journal();
    }
}

impl Repo {
    /// Creates a repository in `dir` (created if missing): `dir/.ckpt` with an empty store,
    /// index, default config and `HEAD` on branch `main`. The directory is built under a
    /// temporary name and renamed, so an interrupted init leaves no half repository.
    pub fn init(dir: &Path) -> Result<Repo> {
        path::create_dirs(dir)?;
        let root = std::fs::canonicalize(dir).map_err(io("resolving", dir))?;
        let final_dir = root.join(DIR_NAME);
        if final_dir.exists() {
            return Err(Error::AlreadyExists { path: final_dir });
        }
        let staging = tempfile::Builder::new()
            .prefix(".ckpt-init-")
            .tempdir_in(&root)
            .map_err(io("creating a directory in", &root))?;
        let d = staging.path();
        Store::init(d)?;
        Refs::new(d).init(DEFAULT_BRANCH)?;
        let lock_path = d.join("lock");
        std::fs::write(&lock_path, b"").map_err(io("writing", &lock_path))?;
        let config_path = d.join("config");
        std::fs::write(&config_path, Config::default().to_json()).map_err(io("writing", &config_path))?;
        {
            let ix = Index::open(&d.join("index"))?;
            ix.finish_rebuild()?;
        }
        let staging = staging.keep();
        if let Err(e) = std::fs::rename(&staging, &final_dir) {
            let _ = std::fs::remove_dir_all(&staging);
            // Another init renamed its complete directory there first (rename onto a non-empty
            // directory fails): that repository stands, as if it had existed before.
            if final_dir.join("HEAD").is_file() {
                return Err(Error::AlreadyExists { path: final_dir });
            }
            return Err(io("renaming to", &final_dir)(e));
        }
        std::fs::File::open(&root).and_then(|f| f.sync_all()).map_err(io("syncing", &root))?;
        Repo::open(&root)
    }

    /// Opens the repository whose working tree root is `root` (the directory holding `.ckpt`).
    /// The index is opened too: rebuilt if missing, incomplete or unreadable, and skipped (the
    /// repository works without it, more slowly) if another process has it open.
    pub fn open(root: &Path) -> Result<Repo> {
        let root = std::fs::canonicalize(root).map_err(io("resolving", root))?;
        let dir = root.join(DIR_NAME);
        // Any `HEAD` at all makes this a repository: one that cannot be read (a FIFO, a
        // directory) is then reported as what it is by whatever reads it, not as "no repository".
        if std::fs::symlink_metadata(dir.join("HEAD")).is_err() {
            return Err(Error::NotARepository { start: root });
        }
        let config = Config::load(&dir.join("config"))?;
        let store = Store::open(&dir)?;
        Ok(Repo {
            refs: Refs::new(&dir),
            root,
            dir,
            store,
            index: OnceLock::new(),
            unjournaled: Mutex::new(Vec::new()),
            config,
            progress: Arc::new(NoProgress),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            since_base_walk: Mutex::new(HashMap::new()),
        })
    }

    /// Finds the repository containing `start` (walking up the parents) and opens it.
    pub fn discover(start: &Path) -> Result<Repo> {
        let start = std::fs::canonicalize(start).map_err(io("resolving", start))?;
        for dir in start.ancestors() {
            if std::fs::symlink_metadata(dir.join(DIR_NAME).join("HEAD")).is_ok() {
                return Repo::open(dir);
            }
        }
        Err(Error::NotARepository { start })
    }

    /// Working tree root.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The `.ckpt` directory.
    pub fn ckpt_dir(&self) -> &Path {
        &self.dir
    }
    /// The settings in `.ckpt/config`.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// The object store.
    pub fn store(&self) -> &Store {
        &self.store
    }
    /// Whether the index can be used: opens it if not open yet (false when another process
    /// holds it).
    pub fn has_index(&self) -> bool {
        self.index().is_some()
    }

    /// Sends progress of long operations to `progress`.
    pub fn set_progress(&mut self, progress: Arc<dyn Progress>) {
        self.progress = progress;
    }
    /// How long writers wait for another writer's lock.
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    // ---- the crate surface for `crate::sync` ------------------------------------------------
    // What the layer above needs of the core and cannot do through the public API: the writer
    // lock, ref files, importing objects it received and verified against their ids, recording
    // a version, checking a version out, and progress.

    /// Takes the writer lock, waiting up to the lock timeout.
    pub(crate) fn lock(&self) -> Result<WriterLock> {
        WriterLock::acquire(&self.dir.join("lock"), self.lock_timeout)
    }

    /// The writer lock if it is free now.
    pub(crate) fn try_lock(&self) -> Option<WriterLock> {
        WriterLock::acquire(&self.dir.join("lock"), Duration::ZERO).ok()
    }

    /// The ref files (branches, tags, remote-tracking refs, `HEAD`).
    pub(crate) fn refs(&self) -> &Refs {
        &self.refs
    }

    /// The index (opened on first use), for the caches of the layers above: `crate::report`
    /// keeps its per-tensor figures there. `None` when another process holds it.
    pub(crate) fn shared_index(&self) -> Option<&Index> {
        self.index()
    }

    /// Where progress of long operations goes.
    pub(crate) fn progress(&self) -> &dyn Progress {
        self.progress.as_ref()
    }

    /// Stores a received object (`tmp`, in the store's file system), verified against `id`
    /// by the store, and records it in the index. The caller holds the writer lock and stores
    /// what an object needs before it.
    pub(crate) fn import_object(&self, id: &ObjectId, kind: ObjectKind, tmp: tempfile::NamedTempFile) -> Result<()> {
        let written = self.store.import(id, Some(kind), tmp)?;
        self.index_object(&written);
        Ok(())
    }

    /// [`Repo::import_object`] for a version, already parsed from `tmp` as `version`.
    pub(crate) fn import_version(&self, id: &VersionId, version: &Version, tmp: tempfile::NamedTempFile) -> Result<()> {
        self.import_object(id, ObjectKind::Version, tmp)?;
        self.index_version(id, version);
        Ok(())
    }

    /// Writes `version` (whose manifests and blobs are stored) and returns its id; no ref moves.
    pub(crate) fn record_version(&self, version: &Version) -> Result<VersionId> {
        let written = self.store.write_data(ObjectKind::Version, &version.to_bytes(), &self.config.codec_options())?;
        self.index_object(&written);
        self.index_version(&written.id, version);
        Ok(written.id)
    }

    /// Checks version `id` out into the working tree, refusing (before writing anything) to
    /// overwrite modified or untracked files ([`Error::DirtyWorkingTree`]); `switching`, as
    /// `switch` does, also removes the current version's files that `id` lacks. No ref moves.
    pub(crate) fn check_out(&self, id: &VersionId, switching: bool) -> Result<()> {
        let target = checkout::Target { files: None, output_dir: None, filter: None, force: false, switching };
        self.checkout_version(id, &target).map(drop)
    }

    /// Whether another writer is waiting for the writer lock.
    fn writer_waiting(&self) -> bool {
        WriterLock::is_wanted(&self.dir.join("lock"))
    }

    /// The path of `input` (absolute, or relative to the root) as a repository path.
    pub(crate) fn repo_path(&self, input: &Path) -> Result<RepoPath> {
        RepoPath::from_input(&self.root, input)
    }

    /// Reads and checks a version object.
    pub fn version(&self, id: &VersionId) -> Result<Version> {
        let bytes = self.store.read_data(id, ObjectKind::Version)?;
        Version::parse(*id, &bytes)
    }

    /// Reads and checks a manifest object.
    pub fn manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let bytes = self.store.read_data(id, ObjectKind::Manifest)?;
        Manifest::parse(*id, &bytes)
    }

    /// `log` metadata of one version, from the index if cached.
    pub fn version_info(&self, id: &VersionId) -> Result<VersionInfo> {
        if let Some(Ok(Some(r))) = self.index().map(|ix| ix.version(id)) {
            return Ok(VersionInfo::from_record(*id, r));
        }
        let v = self.version(id)?;
        self.index_version(id, &v);
        Ok(VersionInfo::from_version(*id, &v))
    }

    // ---- refs and revisions -----------------------------------------------------------

    /// What `HEAD` points at.
    pub fn head(&self) -> Result<Head> {
        self.refs.head()
    }

    /// The version `HEAD` points at (`None` before the first commit).
    pub fn head_version(&self) -> Result<Option<VersionId>> {
        self.refs.head_version()
    }

    /// History from `rev` back along first parents, newest first. On a new repository,
    /// `log("HEAD")` is empty.
    pub fn log(&self, rev: &str) -> Result<Vec<VersionInfo>> {
        if rev == "HEAD" && self.refs.head_version()?.is_none() {
            return Ok(Vec::new());
        }
        // A prune (a `Writer(keep_last=N)` save's, in the background) may cut history and
        // delete the versions past the cut while this walk reads them: the walk starts again
        // when it fails and the cut has moved since it began.
        let mut attempts = 0;
        loop {
            // History ends at a partial clone's cut version and where it was pruned (partial.rs).
            let cut = self.cut_versions()?;
            let walked = self.resolve(rev).and_then(|tip| self.first_parents(tip, &cut).collect());
            match walked {
                Err(_) if attempts < 5 && self.cut_versions().is_ok_and(|now| now != cut) => attempts += 1,
                result => return result,
            }
        }
    }

    /// Creates tag `name` at `rev` (default `HEAD`).
    pub fn tag(&self, name: &str, rev: Option<&str>) -> Result<VersionId> {
        self.create_ref(RefKind::Tag, name, rev)
    }

    /// Every tag, sorted by name.
    pub fn tags(&self) -> Result<Vec<(String, VersionId)>> {
        self.refs.list(RefKind::Tag)
    }

    /// Creates branch `name` at `rev` (default `HEAD`), without switching to it.
    pub fn create_branch(&self, name: &str, rev: Option<&str>) -> Result<VersionId> {
        self.create_ref(RefKind::Branch, name, rev)
    }

    /// Creates a new ref of `kind` at `rev` (default `HEAD`); an existing one is an error.
    fn create_ref(&self, kind: RefKind, name: &str, rev: Option<&str>) -> Result<VersionId> {
        check_name(name)?;
        let _lock = self.lock()?;
        if self.refs.get(kind, name)?.is_some() {
            return Err(Error::RefExists { kind, name: name.to_string() });
        }
        self.check_no_namesake(kind, name)?;
        let id = self.resolve(rev.unwrap_or("HEAD"))?;
        self.refs.set(kind, name, &id)?;
        Ok(id)
    }

    /// Every branch, sorted by name.
    pub fn branches(&self) -> Result<Vec<BranchInfo>> {
        let head = self.refs.head()?;
        Ok(self
            .refs
            .list(RefKind::Branch)?
            .into_iter()
            .map(|(name, id)| BranchInfo { current: head == Head::Branch(name.clone()), name, id })
            .collect())
    }

    /// Moves `HEAD` to branch `name` and checks out its files into the working tree, removing
    /// the current version's files that the branch lacks. Refuses, before anything is written,
    /// when that would destroy bytes the repository does not hold (a tracked file modified since
    /// it was committed or checked out, an untracked file in the way of one of the branch's
    /// files), naming them ([`Error::DirtyWorkingTree`]), unless `force`.
    pub fn switch(&self, name: &str, force: bool) -> Result<()> {
        check_name(name)?;
        let _lock = self.lock()?;
        let tip =
            self.refs.get(RefKind::Branch, name)?.ok_or_else(|| Error::NoSuchBranch { name: name.to_string() })?;
        let target = checkout::Target { files: None, output_dir: None, filter: None, force, switching: true };
        self.checkout_version(&tip, &target)?;
        self.refs.set_head(&Head::Branch(name.to_string()))
    }

    // ---- rm -----------------------------------------------------------------------------

    /// Files `rm`-ed since the last commit.
    pub(crate) fn pending_removals(&self) -> Result<Vec<String>> {
        self.read_list(REMOVALS_FILE, "pending removals")
    }

    fn write_removals(&self, paths: &[String]) -> Result<()> {
        self.write_list(REMOVALS_FILE, paths)
    }

    /// A JSON list kept in `.ckpt/<name>` (empty when the file is missing).
    fn read_list<T: serde::de::DeserializeOwned>(&self, name: &str, what: &str) -> Result<Vec<T>> {
        Ok(self.read_record(name, what)?.unwrap_or_default())
    }

    /// The JSON record `.ckpt/<name>` (`what` it is, for the error), `None` when it is missing.
    fn read_record<T: serde::de::DeserializeOwned>(&self, name: &str, what: &str) -> Result<Option<T>> {
        let path = self.dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::Config { path: path.clone(), reason: format!("{what}: {e}") }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { action: "reading", path, source }),
        }
    }

    /// Replaces `.ckpt/<name>` with `items` as JSON (written in `tmp/`, then renamed), or
    /// deletes it when `items` is empty.
    fn write_list<T: serde::Serialize>(&self, name: &str, items: &[T]) -> Result<()> {
        let path = self.dir.join(name);
        if items.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::Io { action: "deleting", path, source: e })
                }
                _ => Ok(()),
            };
        }
        let tmp = self.dir.join("tmp").join(name);
        let json = serde_json::to_vec(items).expect("plain data serializes");
        std::fs::write(&tmp, json).map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming to", &path))
    }

    /// Stops tracking `paths` (absolute or relative to the root; a directory: every file tracked
    /// under it) from the next version on. The working files are not touched. Each must be
    /// tracked by the current version.
    pub fn rm(&self, paths: &[PathBuf]) -> Result<Vec<RepoPath>> {
        let _lock = self.lock()?;
        let head = self.refs.head_version()?.map(|id| self.version(&id)).transpose()?;
        let mut pending = self.pending_removals()?;
        let mut removed = Vec::new();
        for p in paths {
            let rp = self.repo_path(p)?;
            // A directory: every file tracked under it.
            let tracked: Vec<&str> =
                head.iter().flat_map(|v| v.files_at(rp.as_str())).map(|f| f.path.as_str()).collect();
            if tracked.is_empty() {
                return Err(Error::NotTracked { path: rp.to_string() });
            }
            for path in tracked {
                if !pending.iter().any(|x| x == path) {
                    pending.push(path.to_string());
                }
                let parsed = RepoPath::parse(path)
                    .map_err(|reason| Error::InvalidPath { path: PathBuf::from(path), reason: reason.to_string() })?;
                removed.push(parsed);
            }
        }
        pending.sort();
        self.write_removals(&pending)?;
        Ok(removed)
    }
}

/// Seconds since the Unix epoch, now.
fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn format_time(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_as_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_time(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
