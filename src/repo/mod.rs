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
mod checkout;
mod commit;
mod commit_memory;
mod compact;
mod config;
mod file_objects;
mod gc;
mod inspect;
mod lock;
mod model;
mod partial;
mod path;
mod reachable;
mod refs;
mod remote;
mod remote_delta;
mod status;
mod store_file;
mod verify;
mod watch;

pub use checkout::{CheckoutOptions, CheckoutSummary, TensorFilter};
pub use commit::CommitOptions;
pub use commit_memory::{
    safetensors_image, safetensors_image_in, CommitSource, MemoryFile, OpenedFile, SafetensorsImage, TensorReader,
    TensorSpec,
};
pub use compact::{CompactOptions, CompactReport, COMPACTION_LOG};
pub use config::{Compaction, Config, DeltaPolicy, MAX_BASE_EVERY};
pub use file_objects::{FileTransfer, KeepReport};
pub use gc::GcReport;
pub use inspect::{
    to_f64, DiffReport, FileShow, GroupChange, MethodCounts, Reshaped, SegmentShow, ShowReport, ShowTotals, Storage,
    TensorDiff, TensorName,
};
pub use model::{
    file_hash, limits, Bundle, FileEntry, FileFormat, Manifest, Segment, TensorRef, Version, BUNDLED_MANIFEST_FORMAT,
    MODEL_FORMAT,
};
pub use partial::PartialClone;
pub use path::RepoPath;
pub use reachable::{Needed, Root};
pub use refs::{check_name, DeletedRef, Head, RefKind};
pub use remote::{absolute_dir_url, FetchReport, PullOutcome, PushOptions, PushReport, RefUpdate, RemoteConfig};
pub use status::{FileState, FileStatus, InTheWay, Status};
pub use store_file::{manifest_of_file, StoredFile};
pub use verify::{BadObject, BadVersion, VerifyReport};
pub use watch::{WatchEvent, WatchOptions, Watcher, WATCH_LOG};

use crate::index::{self, Index, Journal, JournalEntry, ObjectRecord, StatRecord, VersionRecord};
use crate::object_id::ObjectId;
use crate::store::{self, ObjectKind, Store};
use lock::WriterLock;
use refs::Refs;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A version's id: the blake3 of its serialized form.
pub type VersionId = ObjectId;

/// Name of the repository directory inside the working tree.
pub const DIR_NAME: &str = ".ckpt";
/// Branch a new repository starts on.
pub const DEFAULT_BRANCH: &str = "main";
/// Files `rm`-ed since the last commit, as a JSON list of paths.
const REMOVALS_FILE: &str = "pending-removals";

/// How long a writer waits for another writer by default.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of repository operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The object store failed or found damage.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The index failed (only where the index is required, such as `index rebuild`).
    #[error(transparent)]
    Index(#[from] index::Error),
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
    /// No `.ckpt` directory here or in any parent.
    #[error("not a ckpt repository (no {DIR_NAME} in {} or any parent)", start.display())]
    NotARepository {
        /// Where the search started.
        start: PathBuf,
    },
    /// `init` where a repository exists.
    #[error("a ckpt repository already exists at {}", path.display())]
    AlreadyExists {
        /// The existing `.ckpt` directory.
        path: PathBuf,
    },
    /// The config file is invalid.
    #[error("config {}: {reason}", path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file path that cannot be committed or checked out.
    #[error("{}: {reason}", path.display())]
    InvalidPath {
        /// The path as given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file to commit is not a valid safetensors file.
    #[error("{path}: invalid safetensors file: {source}")]
    Safetensors {
        /// The file.
        path: String,
        /// What the parser found.
        source: crate::safetensors::Error,
    },
    /// An error while handling one file.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The error.
        source: Box<Error>,
    },
    /// A revision that does not name a version.
    #[error("unknown revision {rev:?}: {reason}")]
    UnknownRevision {
        /// The revision as given.
        rev: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// Another process holds the writer lock.
    #[error(
        "another ckpt process is writing to this repository (it holds {}); gave up after {:.1} s",
        path.display(),
        waited.as_secs_f64()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// How long this process waited.
        waited: Duration,
    },
    /// A commit that names no file and removes none.
    #[error("nothing to commit: name the files to commit")]
    NothingToCommit,
    /// An invalid branch or tag name.
    #[error("invalid name {name:?}: {reason}")]
    InvalidRefName {
        /// The name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A branch or tag that already exists.
    #[error("{} {name:?} already exists", kind.name())]
    RefExists {
        /// Branch or tag.
        kind: RefKind,
        /// The name.
        name: String,
    },
    /// A branch or tag operation that is refused (or names a ref that does not exist).
    #[error("{} {name:?}: {reason}", kind.name())]
    RefRefused {
        /// Branch or tag.
        kind: RefKind,
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A branch that does not exist.
    #[error("no branch named {name:?}")]
    NoSuchBranch {
        /// The name.
        name: String,
    },
    /// A ref file that cannot be read as a ref.
    #[error("ref {}: {reason}", path.display())]
    CorruptRef {
        /// The ref file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A remote failed (its error names the remote, the key and the cause).
    #[error(transparent)]
    Remote(#[from] crate::remote::Error),
    /// No remote of this name in `.ckpt/remotes`.
    #[error("no remote named {name:?} (ckpt remote add NAME URL)")]
    NoSuchRemote {
        /// The name.
        name: String,
    },
    /// A remote name that is already configured.
    #[error("remote {name:?} already exists")]
    RemoteExists {
        /// The name.
        name: String,
    },
    /// A push that would overwrite what the remote holds.
    #[error("{remote}: rejected {what}: {reason}")]
    Rejected {
        /// The remote's URL.
        remote: String,
        /// The ref (`branch main`, `tag v1`).
        what: String,
        /// Why, with what to do.
        reason: String,
    },
    /// A version outside a partial clone's history that could not be fetched from its remote.
    #[error(
        "{rev} is outside the history this partial clone holds, and fetching it from remote {remote} failed: {reason}"
    )]
    PartialCloneRemote {
        /// The remote (name, and URL where it was opened).
        remote: String,
        /// The revision asked for.
        rev: String,
        /// Why the fetch failed.
        reason: String,
    },
    /// A remote ref whose content is not a version id.
    #[error("{remote}: {key}: not a ref (expected 64 hex digits and a newline)")]
    BadRemoteRef {
        /// The remote's URL.
        remote: String,
        /// The key.
        key: String,
    },
    /// A pull whose branch and remote branch have both moved.
    #[error("branch {branch:?} and {remote}/{branch} have diverged (local {local}, remote {theirs}); ckpt pull --rebase puts your versions (same files) on top of the remote's; or push yours to another branch")]
    Diverged {
        /// The branch.
        branch: String,
        /// The remote's name.
        remote: String,
        /// The local tip.
        local: VersionId,
        /// The remote tip.
        theirs: VersionId,
    },
    /// A manifest or version object that decodes but is not valid.
    #[error("object {id} is corrupt: {reason}")]
    CorruptMetadata {
        /// The object.
        id: ObjectId,
        /// What is wrong.
        reason: String,
    },
    /// A file asked for that the version does not have.
    #[error("{path}: not in version {version}")]
    NotInVersion {
        /// The path.
        path: String,
        /// The version.
        version: VersionId,
    },
    /// `rm` of a file the current version does not track.
    #[error("{path}: not tracked by the current version")]
    NotTracked {
        /// The path.
        path: String,
    },
    /// A checked-out file whose hash differs from the one committed.
    #[error("{path}: content hashes to {actual}, the version records {expected}")]
    HashMismatch {
        /// The file.
        path: String,
        /// Hash in the manifest.
        expected: ObjectId,
        /// Hash of what was decoded.
        actual: ObjectId,
    },
    /// A file changed while it was being committed.
    #[error("{path}: the file changed while it was being committed")]
    FileChanged {
        /// The file.
        path: String,
    },
    /// A file that changed while it was being read for something other than a commit
    /// (hashed by `status`): what was read is a mix of two versions.
    #[error("{}: the file changed while it was being read; try again", path.display())]
    ChangedWhileRead {
        /// The file.
        path: PathBuf,
    },
    /// Rewriting a version's parent's blobs as reverse deltas failed (`compact`, or inline in
    /// a commit); the version stays pending and the next compaction retries it. Also recorded
    /// in `.ckpt/compact.log`.
    #[error("compacting version {}: {source} (it stays pending: the next compaction retries it)", version.short(12))]
    CompactionFailed {
        /// The version whose parent's blobs were being rewritten.
        version: VersionId,
        /// What failed.
        source: Box<Error>,
    },
    /// A checkout into the working tree or a `switch` that would destroy bytes the repository
    /// does not hold: nothing was written.
    #[error("{}", dirty_message(paths, untracked))]
    DirtyWorkingTree {
        /// Tracked files modified since they were committed or checked out (to be overwritten
        /// or, by `switch`, removed).
        paths: Vec<String>,
        /// Files the current version does not track, in the way of files to be written.
        untracked: Vec<String>,
    },
    /// `checkout --tensor` into the working tree without `force`: it would replace each whole
    /// file with one holding only the matching tensors.
    #[error(
        "checkout --tensor {pattern:?} would replace {} in the working tree with files holding only \
         the matching tensors; write them elsewhere with --output DIR, or pass --force",
        files.join(", ")
    )]
    PartialCheckoutInTree {
        /// The tensor pattern.
        pattern: String,
        /// The working files it would replace.
        files: Vec<String>,
    },
    /// An output directory inside the repository's own `.ckpt` directory.
    #[error("{}: is inside the repository's own directory {}; not writing there", path.display(), ckpt_dir.display())]
    OutputInRepository {
        /// The output path as given.
        path: PathBuf,
        /// The `.ckpt` directory.
        ckpt_dir: PathBuf,
    },
    /// A directory to create where a path component is a file.
    #[error("creating {}: {} is not a directory", creating.display(), path.display())]
    NotADirectory {
        /// The component that is not a directory.
        path: PathBuf,
        /// The directory being created.
        creating: PathBuf,
    },
    /// An operation that needs a version on an unborn branch.
    #[error("branch {branch:?} has no version yet")]
    Unborn {
        /// The branch HEAD names.
        branch: String,
    },
    /// A commit whose manifest or version would exceed a cap readers apply
    /// ([`limits`]): it is refused rather than written unreadable.
    #[error("cannot commit {what}: {reason} (docs/format.md, \"Caps on untrusted sizes\")")]
    OverLimit {
        /// The file, or "the version".
        what: String,
        /// Which cap and by how much.
        reason: String,
    },
    /// `pull` would overwrite or remove files whose changes would be lost: nothing was written.
    #[error(
        "pull: not moving branch {branch:?} to {theirs}: {}",
        dirty_message(paths, untracked).replace("or pass --force to discard them", "then pull again")
    )]
    PullBlocked {
        /// The current branch.
        branch: String,
        /// The remote's version it would move to.
        theirs: String,
        /// Tracked files modified since they were committed or checked out.
        paths: Vec<String>,
        /// Untracked files in the way.
        untracked: Vec<String>,
    },
}

/// The message of [`Error::DirtyWorkingTree`].
fn dirty_message(modified: &[String], untracked: &[String]) -> String {
    let mut parts = Vec::new();
    if !modified.is_empty() {
        parts.push(format!("modified since the last commit or checkout: {}", modified.join(", ")));
    }
    if !untracked.is_empty() {
        parts.push(format!("untracked files in the way: {}", untracked.join(", ")));
    }
    format!(
        "refusing to overwrite or remove files whose changes would be lost ({}); commit or move them, \
         or pass --force to discard them",
        parts.join("; ")
    )
}

/// Shorthand for repository results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}

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
        VersionInfo {
            id,
            parents: v.parents.clone(),
            time: v.time,
            message: v.message.clone(),
            files: v.files.iter().map(|f| f.path.clone()).collect(),
            raw_bytes: v.raw_bytes,
            stored_bytes: v.stored_bytes,
        }
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
        if !dir.join("HEAD").is_file() {
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
            if dir.join(DIR_NAME).join("HEAD").is_file() {
                return Repo::open(dir);
            }
        }
        Err(Error::NotARepository { start })
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index")
    }

    /// Opens the index, rebuilding it when needed; `None` when it is in use elsewhere or cannot
    /// be rebuilt (the repository then works from the store alone).
    fn open_index(&self) -> Option<Index> {
        let path = self.index_path();
        let ix = match Index::open(&path) {
            Ok(ix) => ix,
            Err(index::Error::Locked { .. }) => return None,
            Err(_) => {
                // A damaged database: delete and recreate it. Tried a few times: the threads of
                // sled's failed open may still be winding down and writing into the directory
                // while it is deleted (seen once in CI, under load, as a missing index).
                let mut reopened = None;
                for attempt in 0..3u64 {
                    std::thread::sleep(std::time::Duration::from_millis(50 * attempt));
                    if let Ok(ix) = Index::destroy(&path).and_then(|()| Index::open(&path)) {
                        reopened = Some(ix);
                        break;
                    }
                }
                reopened?
            }
        };
        if !ix.is_complete() && self.rebuild_into(&ix).is_err() {
            return None;
        }
        self.replay_journal(&ix);
        Some(ix)
    }

    fn journal(&self) -> Journal {
        Journal::new(&self.dir.join("index-journal"))
    }

    /// Applies the index journal to `ix`: what writers changed while the index was closed.
    /// Objects and versions are read from the store again (a missing object loses its record).
    fn replay_journal(&self, ix: &Index) {
        let journal = self.journal();
        let Ok(entries) = journal.take() else { return };
        for entry in entries {
            // The index is a cache: a failed update only costs speed later.
            let _ = match entry {
                JournalEntry::Object(id) => match (self.store.header(&id), self.store.stored_len(&id)) {
                    (Ok(h), Ok(stored_len)) => {
                        ix.put_object(&id, &object_record_of(&h, stored_len)).map_err(Error::from)
                    }
                    (Err(store::Error::Missing { .. }), _) | (_, Err(store::Error::Missing { .. })) => {
                        ix.remove_object(&id).map_err(Error::from)
                    }
                    _ => Ok(()),
                },
                JournalEntry::Version(id) => match self.version(&id) {
                    Ok(v) => ix.put_version(&id, &version_record(&v)).map_err(Error::from),
                    Err(_) => ix.remove_version(&id).map_err(Error::from),
                },
                JournalEntry::Stat { path, len, mtime_ns, ctime_ns, ino, recorded_ns, hash } => {
                    let record = StatRecord { len, mtime_ns, ctime_ns, ino, recorded_ns, hash };
                    ix.put_stat(&path, &record).map_err(Error::from)
                }
            };
        }
        if ix.flush().is_ok() {
            let _ = journal.finish();
        }
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

    /// The index, opened (and rebuilt if needed) on first call; `None` when another process
    /// holds it or it cannot be rebuilt.
    fn index(&self) -> Option<&Index> {
        self.index.get_or_init(|| self.open_index()).as_ref()
    }
    /// Sends progress of long operations to `progress`.
    pub fn set_progress(&mut self, progress: Arc<dyn Progress>) {
        self.progress = progress;
    }
    /// How long writers wait for another writer's lock.
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    fn lock(&self) -> Result<WriterLock> {
        WriterLock::acquire(&self.dir.join("lock"), self.lock_timeout)
    }

    /// Whether another writer is waiting for the writer lock.
    fn writer_waiting(&self) -> bool {
        WriterLock::is_wanted(&self.dir.join("lock"))
    }

    /// The path of `input` (absolute, or relative to the root) as a repository path.
    pub fn repo_path(&self, input: &Path) -> Result<RepoPath> {
        RepoPath::from_input(&self.root, input)
    }

    // ---- index as a cache -------------------------------------------------------------

    /// The index if this process has opened it; otherwise `entry` is kept for the journal and
    /// `None` returned.
    fn open_index_or_journal(&self, entry: impl FnOnce() -> JournalEntry) -> Option<&Index> {
        match self.index.get() {
            Some(Some(ix)) => Some(ix),
            _ => {
                self.unjournaled.lock().unwrap_or_else(|e| e.into_inner()).push(entry());
                None
            }
        }
    }

    fn index_object(&self, w: &store::Written) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::Object(w.id)) {
            // The index is a cache: a failed insert only costs speed later.
            let _ = ix.put_object(&w.id, &object_record_of(&w.header, w.stored_len));
        }
    }

    fn index_version(&self, id: &VersionId, v: &Version) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::Version(*id)) {
            let _ = ix.put_version(id, &version_record(v));
        }
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
            return Ok(VersionInfo {
                id: *id,
                parents: r.parents,
                time: r.time,
                message: r.message,
                files: r.files,
                raw_bytes: r.raw_bytes,
                stored_bytes: r.stored_bytes,
            });
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

    /// Resolves a revision: `HEAD`, a branch, a tag, a full or unique short (at least 4 hex
    /// digits) version id, each optionally followed by `~N` (N first parents back; `~` alone
    /// is `~1`; repeatable).
    pub fn resolve(&self, rev: &str) -> Result<VersionId> {
        let unknown = |reason: String| Error::UnknownRevision { rev: rev.to_string(), reason };
        let (base, steps) = split_ancestry(rev).ok_or_else(|| unknown("bad ~N suffix".into()))?;
        let mut id = self.resolve_base(base).map_err(|e| match e {
            Error::UnknownRevision { reason, .. } => unknown(reason),
            other => other,
        })?;
        for n in 0..steps {
            let info = self.version_info(&id)?;
            let parent = *info.parents.first().ok_or_else(|| {
                unknown(format!("{base} has only {n} version{} before it", if n == 1 { "" } else { "s" }))
            })?;
            if !self.store.contains(&parent) && self.cut_versions()?.contains(&id) {
                return Err(unknown(format!(
                    "past the history this partial clone holds ({} is where it is cut; `ckpt checkout` fetches it)",
                    id.short(12)
                )));
            }
            id = parent;
        }
        Ok(id)
    }

    fn resolve_base(&self, base: &str) -> Result<VersionId> {
        let unknown = |reason: String| Error::UnknownRevision { rev: base.to_string(), reason };
        if base == "HEAD" {
            return match self.refs.head()? {
                Head::Detached(id) => Ok(id),
                Head::Branch(b) => self
                    .refs
                    .get(RefKind::Branch, &b)?
                    .ok_or_else(|| unknown(format!("branch {b:?} has no version yet"))),
            };
        }
        // `refs/heads/NAME` and `refs/tags/NAME` name one kind (a branch and a tag of one name,
        // which ckpt no longer creates, are otherwise ambiguous).
        for kind in [RefKind::Branch, RefKind::Tag] {
            if let Some(name) = base.strip_prefix(&format!("refs/{}/", kind.dir())) {
                return self.refs.get(kind, name)?.ok_or_else(|| unknown(format!("no {} named {name:?}", kind.name())));
            }
        }
        if let Some(id) = self.refs.get(RefKind::Branch, base)? {
            if self.refs.get(RefKind::Tag, base)?.is_some_and(|t| t != id) {
                return Err(unknown(format!(
                    "ambiguous: both a branch and a tag are named {base:?}; say refs/heads/{base} or refs/tags/{base}"
                )));
            }
            return Ok(id);
        }
        if let Some((remote, branch)) = base.split_once('/') {
            return self.refs.get_remote(remote, branch)?.ok_or_else(|| {
                unknown(format!("no remote-tracking branch {branch:?} of remote {remote:?} (fetch first)"))
            });
        }
        if let Some(id) = self.refs.get(RefKind::Tag, base)? {
            return Ok(id);
        }
        let is_hex = base.len() >= 4 && base.len() <= 64 && base.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_hex {
            return Err(unknown("not HEAD, a branch, a tag or a version id".into()));
        }
        let prefix = base.to_ascii_lowercase();
        let candidates = self.versions_with_prefix(&prefix)?;
        match candidates.as_slice() {
            [id] => Ok(*id),
            [] => Err(unknown("no version has this id".into())),
            many => Err(unknown(format!(
                "ambiguous: {} versions start with it ({})",
                many.len(),
                many.iter().take(4).map(|i| i.short(12)).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Version ids in the store starting with `prefix` (lowercase hex, at least 2 digits).
    fn versions_with_prefix(&self, prefix: &str) -> Result<Vec<VersionId>> {
        let fan = self.store.object_path(&ObjectId([0; 32]));
        let fan_root = fan.parent().and_then(Path::parent).expect("objects/ab/x");
        let dir = fan_root.join(&prefix[..2]);
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => return Err(Error::Io { action: "listing", path: dir, source }),
        };
        for entry in entries {
            let entry = entry.map_err(io("listing", &dir))?;
            let name = format!("{}{}", &prefix[..2], entry.file_name().to_string_lossy());
            if !name.starts_with(prefix) {
                continue;
            }
            let Ok(id) = name.parse::<ObjectId>() else { continue };
            if matches!(self.store.header(&id), Ok(h) if h.kind == ObjectKind::Version) {
                out.push(id);
            }
        }
        out.sort();
        Ok(out)
    }

    /// History from `rev` back along first parents, newest first. On a new repository,
    /// `log("HEAD")` is empty.
    pub fn log(&self, rev: &str) -> Result<Vec<VersionInfo>> {
        if rev == "HEAD" && self.refs.head_version()?.is_none() {
            return Ok(Vec::new());
        }
        let mut id = Some(self.resolve(rev)?);
        let mut out = Vec::new();
        let cut = self.cut_versions()?;
        while let Some(current) = id {
            let info = self.version_info(&current)?;
            // A partial clone's history ends at a cut version (partial.rs).
            id = info.parents.first().copied().filter(|p| !cut.contains(&current) || self.store.contains(p));
            out.push(info);
            if out.len() > 10_000_000 {
                return Err(Error::CorruptMetadata { id: current, reason: "history does not end".into() });
            }
        }
        Ok(out)
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
    pub fn pending_removals(&self) -> Result<Vec<String>> {
        self.read_list(REMOVALS_FILE, "pending removals")
    }

    fn write_removals(&self, paths: &[String]) -> Result<()> {
        self.write_list(REMOVALS_FILE, paths)
    }

    /// A JSON list kept in `.ckpt/<name>` (empty when the file is missing).
    fn read_list<T: serde::de::DeserializeOwned>(&self, name: &str, what: &str) -> Result<Vec<T>> {
        let path = self.dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::Config { path: path.clone(), reason: format!("{what}: {e}") }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
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

    /// Stops tracking `paths` (absolute or relative to the root) from the next version on. The
    /// working files are not touched. Each must be tracked by the current version.
    pub fn rm(&self, paths: &[PathBuf]) -> Result<Vec<RepoPath>> {
        let _lock = self.lock()?;
        let head = self.refs.head_version()?.map(|id| self.version(&id)).transpose()?;
        let mut pending = self.pending_removals()?;
        let mut removed = Vec::new();
        for p in paths {
            let rp = self.repo_path(p)?;
            if head.as_ref().and_then(|v| v.file(rp.as_str())).is_none() {
                return Err(Error::NotTracked { path: rp.to_string() });
            }
            if !pending.iter().any(|x| x == rp.as_str()) {
                pending.push(rp.to_string());
            }
            removed.push(rp);
        }
        pending.sort();
        self.write_removals(&pending)?;
        Ok(removed)
    }

    // ---- index maintenance -------------------------------------------------------------

    /// Rebuilds the index from the object store. Fails with [`index::Error::Locked`] when
    /// another process has the index open.
    pub fn rebuild_index(&mut self) -> Result<usize> {
        let _lock = self.lock()?;
        let ix = match self.index.take().flatten() {
            Some(ix) => ix,
            None => match Index::open(&self.index_path()) {
                Ok(ix) => ix,
                Err(index::Error::Locked { path }) => return Err(index::Error::Locked { path }.into()),
                Err(_) => {
                    Index::destroy(&self.index_path())?;
                    Index::open(&self.index_path())?
                }
            },
        };
        let result = self.rebuild_into(&ix);
        if result.is_ok() {
            self.replay_journal(&ix);
        }
        self.index = OnceLock::from(Some(ix));
        result
    }

    /// Fills `ix` from the store; returns the number of objects indexed. Damaged objects are
    /// skipped (verify reports them).
    fn rebuild_into(&self, ix: &Index) -> Result<usize> {
        ix.begin_rebuild()?;
        let ids = self.store.list()?;
        let mut n = 0;
        for id in &ids {
            let (Ok(header), Ok(stored_len)) = (self.store.header(id), self.store.stored_len(id)) else { continue };
            ix.put_object(id, &object_record_of(&header, stored_len))?;
            if header.kind == ObjectKind::Version {
                if let Ok(v) = self.version(id) {
                    ix.put_version(id, &version_record(&v))?;
                }
            }
            n += 1;
        }
        ix.finish_rebuild()?;
        Ok(n)
    }

    /// The index's record of an object, or the store's header if the index lacks it.
    pub fn object_record(&self, id: &ObjectId) -> Result<ObjectRecord> {
        if let Some(Ok(Some(r))) = self.index().map(|ix| ix.object(id)) {
            return Ok(r);
        }
        Ok(object_record_of(&self.store.header(id)?, self.store.stored_len(id)?))
    }

    /// Records a working file's identity for `status`.
    fn index_stat(&self, path: &str, record: &StatRecord) {
        if let Some(ix) = self.open_index_or_journal(|| JournalEntry::stat(path, record)) {
            let _ = ix.put_stat(path, record);
        }
    }

    /// Flushes the index if it was opened, and appends what was kept for the journal.
    fn flush_index(&self) {
        if let Some(Some(ix)) = self.index.get() {
            let _ = ix.flush();
        }
        self.append_journal();
    }

    /// Appends the index changes kept for the journal (a cache: failures are ignored).
    fn append_journal(&self) {
        let entries = std::mem::take(&mut *self.unjournaled.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = self.journal().append(&entries);
    }
}

/// The index record of an object with header `h` and file size `stored_len`.
fn object_record_of(h: &store::ObjectHeader, stored_len: u64) -> ObjectRecord {
    ObjectRecord {
        kind: h.kind as u8,
        dtype: h.dtype.map_or(0, crate::Dtype::code),
        depth: h.depth,
        raw_len: h.raw_len,
        stored_len,
        reference: h.reference,
    }
}

fn version_record(v: &Version) -> VersionRecord {
    VersionRecord {
        parents: v.parents.clone(),
        time: v.time,
        message: v.message.clone(),
        files: v.files.iter().map(|f| f.path.clone()).collect(),
        raw_bytes: v.raw_bytes,
        stored_bytes: v.stored_bytes,
    }
}

/// Splits `rev` into its base and the number of `~` steps.
fn split_ancestry(rev: &str) -> Option<(&str, u64)> {
    let (base, mut rest) = match rev.find('~') {
        Some(i) => (&rev[..i], &rev[i..]),
        None => return Some((rev, 0)),
    };
    let mut steps = 0u64;
    while let Some(after) = rest.strip_prefix('~') {
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let n = if digits == 0 { 1 } else { after[..digits].parse::<u64>().ok()? };
        steps = steps.checked_add(n)?;
        rest = &after[digits..];
    }
    (rest.is_empty() && !base.is_empty()).then_some((base, steps))
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
    fn ancestry_suffixes() {
        assert_eq!(split_ancestry("HEAD"), Some(("HEAD", 0)));
        assert_eq!(split_ancestry("HEAD~"), Some(("HEAD", 1)));
        assert_eq!(split_ancestry("main~3"), Some(("main", 3)));
        assert_eq!(split_ancestry("abcd~2~"), Some(("abcd", 3)));
        assert_eq!(split_ancestry("~2"), None);
        assert_eq!(split_ancestry("HEAD~x"), None);
    }

    #[test]
    fn times_format_as_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_time(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
