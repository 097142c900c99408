//! `watch`: commits each checkpoint that appears in a directory, one version per checkpoint.
//!
//! A checkpoint is an entry directly under the watched directory whose name matches the pattern:
//! a file, or a folder (`checkpoint-500/`) committed with every file under it. It is committed
//! once it is complete (docs/architecture.md, "When the watcher commits a file"): no file in it
//! changed (size, modification time, change time, inode; the file list of a folder) for the
//! settle time, and, where file-system events tell, no file in it is still open for writing.
//! The files are hashed and stat-ed again after hashing and after the commit: a checkpoint that
//! changed meanwhile is settled again and committed again. A folder holding
//! `trainer_state.json` is no exception (the file itself may be half written, and some
//! `Trainer` versions write other files after it).
//!
//! What decides whether to commit is whether `HEAD` (the branch tip) holds the checkpoint's
//! content at its path, never whether that content was committed once: a file rewritten back
//! to earlier content (A, B, A) is committed again, and a restarted watcher commits what
//! changed while it was down and nothing twice. What was committed is appended to
//! `.ckpt/watched` (file hash and path per line) as a record for people; it is not consulted.
//!
//! Entries and files that are skipped (symbolic links, special files, folders that cannot be
//! read) are reported once each ([`WatchEvent::Skipped`]). The directory is rescanned on every
//! file-system event (`notify`, the only user of that crate) and every poll interval, so a
//! watcher that cannot be set up (or misses events, as on network file systems) still works by
//! polling.
//!
//! The watcher sits above the repository: it commits, reads versions and hashes files through
//! [`Repo`]'s public methods only, as any program using the library could.

use crate::object_id::ObjectId;
use crate::repo::{hash_file, CommitOptions, Error, Repo, Result, TensorFilter, VersionId, DIR_NAME};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// File under `.ckpt/` recording what `watch` committed: one line per file, `<file hash hex>
/// <path>`, appended after each commit. A record for people: what to commit is decided by what
/// `HEAD` holds, never by this file.
pub const WATCH_LOG: &str = "watched";

/// A file known to be open for writing (written to, and no close after the write seen) holds
/// its checkpoint back until it is closed, or until it has been unchanged for this many settle
/// times (a writer that keeps an idle file open, or a lost event, cannot hold it back forever).
const OPEN_FILE_SETTLES: u32 = 6;

/// Settings of [`watch`].
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Names (of entries directly under the directory) to commit: a glob (`*`, `?`) or a
    /// substring, as `checkout --tensor`. `None`: every name except hidden ones (`.x`) and
    /// unfinished downloads or temporary files (`*.tmp`, `*.part`, `*.partial`, `*~`).
    pub pattern: Option<String>,
    /// How long a checkpoint must stay unchanged before it is committed.
    pub settle: Duration,
    /// Rescan at least this often, events or not.
    pub poll: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions { pattern: None, settle: Duration::from_secs(10), poll: Duration::from_secs(1) }
    }
}

/// What the watcher did, for display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// A checkpoint was committed as a new version.
    Committed {
        /// The checkpoint's path relative to the repository root.
        path: String,
        /// The version.
        version: VersionId,
        /// Files in it.
        files: usize,
    },
    /// `HEAD` already holds the checkpoint's content at its path (committed by this watcher,
    /// an earlier run, or anyone else).
    AlreadyCommitted {
        /// The checkpoint's path relative to the repository root.
        path: String,
    },
    /// A file changed while it was being committed; the commit will be retried.
    Retrying {
        /// The checkpoint's path relative to the repository root.
        path: String,
    },
    /// A checkpoint could not be committed (an invalid `.safetensors` file, the writer lock held
    /// too long); it is tried again after the settle time. The watcher goes on with the others.
    Failed {
        /// The checkpoint's path relative to the repository root.
        path: String,
        /// The commit's error.
        reason: String,
    },
    /// An entry or a file in a checkpoint folder is not committed: a symbolic link, a special
    /// file, or a folder that cannot be read. Reported once while it stays so.
    Skipped {
        /// Its path relative to the repository root.
        path: String,
        /// Why.
        reason: String,
    },
    /// File-system events are unavailable; the directory is polled.
    Polling {
        /// Why.
        reason: String,
    },
}

/// What one file looked like at one scan. Any change to its content changes its size or its
/// modification time or, when those are restored or too coarse, its change time; a file
/// replaced by a rename has another inode.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FileStat {
    path: PathBuf,
    len: u64,
    mtime: SystemTime,
    ctime: (i64, i64),
    ino: u64,
}

impl FileStat {
    fn of(path: PathBuf, meta: &std::fs::Metadata) -> Option<FileStat> {
        Some(FileStat {
            len: meta.len(),
            mtime: meta.modified().ok()?,
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            path,
        })
    }
}

/// The later of a scan's time `now` and the present: when a settle clock restarts after a
/// commit (which can take longer than the settle time), or at `now` in tests that step the
/// watcher through times of their own.
fn after(now: Instant) -> Instant {
    now.max(Instant::now())
}

/// What a checkpoint looked like at one scan: its files (sorted) and what they looked like.
type Signature = Vec<FileStat>;

/// What a scan found at one entry of the watched directory.
enum Scan {
    /// A checkpoint: its files, and the paths under it that are skipped, with why.
    Files(Signature, Vec<(PathBuf, String)>),
    /// Not a checkpoint (a symbolic link, a special file, a folder that cannot be read): why.
    Skip(String),
    /// Gone between listing and stat: seen again on the next scan, if it comes back.
    Gone,
}

/// A checkpoint being watched.
struct Candidate {
    signature: Signature,
    /// When the signature last changed.
    since: Instant,
    /// The signature it was last committed (or found in `HEAD`) with: not hashed again while
    /// it looks the same.
    committed: Option<Signature>,
}

/// The watcher's state between scans ([`watch`] runs it; tests step it by hand).
pub struct Watcher<'r> {
    repo: &'r Repo,
    dir: PathBuf,
    options: WatchOptions,
    filter: Option<TensorFilter>,
    candidates: HashMap<PathBuf, Candidate>,
    /// Files written to with no close after the write seen (file-system events).
    open: HashSet<PathBuf>,
    /// Paths reported as skipped at the last scan (each is reported once while it stays so).
    skipped: HashSet<PathBuf>,
}

/// Watches `dir` (inside `repo`'s working tree) and commits each checkpoint that appears in it,
/// until `stop` returns true (checked after every scan). `on_event` hears what happened.
pub fn watch(
    repo: &Repo,
    dir: &Path,
    options: &WatchOptions,
    stop: &dyn Fn() -> bool,
    on_event: &mut dyn FnMut(&WatchEvent),
) -> Result<()> {
    let mut watcher = Watcher::new(repo, dir, options.clone())?;
    let (tx, rx) = mpsc::channel();
    // Kept alive for the whole loop: dropping it ends the events.
    let _events = match events(&watcher.dir, tx) {
        Ok(w) => Some(w),
        Err(reason) => {
            on_event(&WatchEvent::Polling { reason });
            None
        }
    };
    loop {
        while let Ok(change) = rx.try_recv() {
            watcher.note(change);
        }
        for e in watcher.step(Instant::now())? {
            on_event(&e);
        }
        if stop() {
            return Ok(());
        }
        // Wake on the first event or after the poll interval, whichever comes first; a
        // burst of events (a trainer writing a file) costs one rescan per interval at most.
        let wait = options.poll.min(options.settle / 2).max(Duration::from_millis(10));
        if let Ok(change) = rx.recv_timeout(wait) {
            watcher.note(change);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What a file-system event says about completeness.
enum Change {
    /// Written to (or created): open for writing until a close is seen.
    Written(PathBuf),
    /// Closed after writing, or removed.
    Closed(PathBuf),
    /// Anything else (a rename, attributes, a read): only a reason to rescan.
    Other,
    /// Events were lost: what is open is not known any more.
    Lost,
}

/// A recursive file-system watcher on `dir` that sends what each event says to `tx`.
fn events(dir: &Path, tx: mpsc::Sender<Change>) -> std::result::Result<notify::RecommendedWatcher, String> {
    use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind};
    use notify::Watcher as _;
    let mut w = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            let _ = tx.send(Change::Lost);
            return;
        };
        if event.need_rescan() {
            let _ = tx.send(Change::Lost);
            return;
        }
        let change: fn(PathBuf) -> Change = match event.kind {
            EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any)
            | EventKind::Create(CreateKind::File | CreateKind::Any) => Change::Written,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) | EventKind::Remove(_) => Change::Closed,
            _ => {
                let _ = tx.send(Change::Other);
                return;
            }
        };
        for p in event.paths {
            let _ = tx.send(change(p));
        }
    })
    .map_err(|e| e.to_string())?;
    w.watch(dir, notify::RecursiveMode::Recursive).map_err(|e| e.to_string())?;
    Ok(w)
}

impl<'r> Watcher<'r> {
    /// A watcher of `dir`, which must be a directory inside `repo`'s working tree.
    pub fn new(repo: &'r Repo, dir: &Path, options: WatchOptions) -> Result<Watcher<'r>> {
        let rel = repo.repo_path(dir)?;
        let dir = rel.under(repo.root());
        if !dir.is_dir() {
            return Err(Error::InvalidPath { path: dir, reason: "is not a directory".into() });
        }
        let filter = options.pattern.as_deref().map(TensorFilter::new);
        Ok(Watcher {
            repo,
            dir,
            options,
            filter,
            candidates: HashMap::new(),
            open: HashSet::new(),
            skipped: HashSet::new(),
        })
    }

    /// Records that the file at `path` was written to (a file-system event): the checkpoint
    /// holding it is not complete until [`Self::file_closed`] says it was closed (or it stays
    /// unchanged for several settle times).
    pub fn file_written(&mut self, path: &Path) {
        self.open.insert(path.to_path_buf());
    }

    /// Records that the file at `path` was closed after writing, or removed.
    pub fn file_closed(&mut self, path: &Path) {
        self.open.remove(path);
    }

    /// Forgets which files are open (events were lost): completeness is judged by the settle
    /// time alone until new events come.
    pub fn forget_open_files(&mut self) {
        self.open.clear();
    }

    fn note(&mut self, change: Change) {
        match change {
            Change::Written(p) => self.file_written(&p),
            Change::Closed(p) => self.file_closed(&p),
            Change::Other => {}
            Change::Lost => self.forget_open_files(),
        }
    }

    /// `path` relative to the repository root, for messages.
    fn display(&self, path: &Path) -> String {
        self.repo.repo_path(path).map_or_else(|_| path.display().to_string(), |p| p.to_string())
    }

    /// Whether the entry called `name` is a checkpoint to watch.
    fn wanted(&self, name: &str) -> bool {
        match &self.filter {
            // The repository's own directory is never a checkpoint (when DIR is the root).
            Some(_) if name == DIR_NAME => false,
            Some(f) => f.matches(name),
            None => {
                !(name.starts_with('.')
                    || name.ends_with('~')
                    || [".tmp", ".part", ".partial"].iter().any(|s| name.ends_with(s)))
            }
        }
    }

    /// Scans the directory once and commits every checkpoint that is ready. `now` is the time
    /// of the scan (checkpoints must have been unchanged since `now - settle`).
    pub fn step(&mut self, now: Instant) -> Result<Vec<WatchEvent>> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|source| Error::Io {
            action: "reading directory",
            path: self.dir.clone(),
            source,
        })?;
        let mut present = HashSet::new();
        let mut names: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| self.wanted(n)))
            .map(|e| e.path())
            .collect();
        names.sort();
        let mut skipped = Vec::new();
        for path in names {
            let signature = match scan(&path) {
                Scan::Files(signature, inner) => {
                    skipped.extend(inner);
                    signature
                }
                Scan::Skip(reason) => {
                    skipped.push((path, reason));
                    continue;
                }
                Scan::Gone => continue,
            };
            present.insert(path.clone());
            let c = self.candidates.entry(path.clone()).or_insert_with(|| Candidate {
                signature: signature.clone(),
                since: now,
                committed: None,
            });
            if c.signature != signature {
                c.signature = signature;
                c.since = now;
            }
            if c.committed.as_ref() == Some(&c.signature) || c.signature.is_empty() {
                continue;
            }
            let unchanged = now.saturating_duration_since(c.since);
            let open = c.signature.iter().any(|f| self.open.contains(&f.path));
            let settle = if open { self.options.settle * OPEN_FILE_SETTLES } else { self.options.settle };
            if unchanged < settle {
                continue;
            }
            let signature = c.signature.clone();
            match self.commit(&path, &signature, now) {
                Ok(e) => out.push(e),
                // Hashing failed (a file deleted or replaced under us) or the commit did: try
                // again after the settle time; the other checkpoints go on.
                Err(e) => {
                    if let Some(c) = self.candidates.get_mut(&path) {
                        c.since = after(now);
                    }
                    out.push(WatchEvent::Failed { path: self.display(&path), reason: e.to_string() });
                }
            }
        }
        // Each skipped path once, while it stays skipped.
        let now_skipped: HashSet<PathBuf> = skipped.iter().map(|(p, _)| p.clone()).collect();
        for (path, reason) in skipped {
            if !self.skipped.contains(&path) {
                out.push(WatchEvent::Skipped { path: self.display(&path), reason });
            }
        }
        self.skipped = now_skipped;
        // Deleted checkpoints are forgotten (their versions stay); one that reappears is new.
        self.candidates.retain(|p, _| present.contains(p));
        Ok(out)
    }

    /// Commits the checkpoint at `path` whose files are `signature`, unless `HEAD` holds it
    /// already (every file's content at its path); records it. A checkpoint that changed while
    /// it was hashed or committed is settled again. An error leaves the checkpoint to be tried
    /// again.
    fn commit(&mut self, path: &Path, signature: &Signature, now: Instant) -> Result<WatchEvent> {
        let rel = self.repo.repo_path(path)?.to_string();
        let files: Vec<&Path> = signature.iter().map(|f| f.path.as_path()).collect();
        let mut hashes = Vec::with_capacity(files.len());
        for f in &files {
            hashes.push((self.repo.repo_path(f)?.to_string(), hash_file(f)?));
        }
        // Hashed while it was being written (a pause longer than the settle time): what was
        // hashed may be a prefix. Settle again.
        if !self.unchanged(path, signature, now) {
            return Ok(WatchEvent::Retrying { path: rel });
        }
        let head = self.repo.head_version()?.map(|id| self.repo.version(&id)).transpose()?;
        let in_head = |(p, h): &(String, ObjectId)| head.as_ref().and_then(|v| v.file(p)).is_some_and(|f| f.hash == *h);
        if hashes.iter().all(in_head) {
            self.candidates.get_mut(path).expect("scanned").committed = Some(signature.clone());
            return Ok(WatchEvent::AlreadyCommitted { path: rel });
        }
        let message = format!("watch: {rel}");
        let version = match self.repo.commit(&files, &message, &CommitOptions::default()) {
            Ok(v) => v,
            Err(Error::FileChanged { .. }) => {
                // Settle again from now before the retry.
                self.candidates.get_mut(path).expect("scanned").since = after(now);
                return Ok(WatchEvent::Retrying { path: rel });
            }
            Err(e) => return Err(e),
        };
        // What the commit stored, which is what was on disk while it read the files.
        let stored = self.repo.version(&version)?;
        let committed: Vec<(String, ObjectId)> =
            hashes.iter().filter_map(|(p, _)| stored.file(p).map(|f| (p.clone(), f.hash))).collect();
        append_log(&self.repo.ckpt_dir().join(WATCH_LOG), &committed)?;
        // Changed during or after the commit: the version holds what the commit read, and the
        // new content is committed again once it settles (`unchanged` reset the clock).
        if self.unchanged(path, signature, now) {
            self.candidates.get_mut(path).expect("scanned").committed = Some(signature.clone());
        }
        Ok(WatchEvent::Committed { path: rel, version, files: files.len() })
    }

    /// Whether the checkpoint at `path` still looks as `signature` says; if not, its settle
    /// clock starts again at `now` (the scan's time) with what it looks like now.
    fn unchanged(&mut self, path: &Path, signature: &Signature, now: Instant) -> bool {
        let current = match scan(path) {
            Scan::Files(current, _) => current,
            Scan::Skip(_) | Scan::Gone => Vec::new(),
        };
        if current == *signature {
            return true;
        }
        let c = self.candidates.get_mut(path).expect("scanned");
        c.signature = current;
        c.since = after(now);
        false
    }
}

/// What the entry at `path` of the watched directory holds: a file, or every file under a
/// folder (sorted) with what they look like; symbolic links (not followed: a link is not the
/// file it points to, and a link out of the folder would commit what is outside), special files
/// and folders that cannot be read are skipped with a reason.
fn scan(path: &Path) -> Scan {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Scan::Gone,
        Err(e) => return Scan::Skip(format!("cannot be read: {e}")),
    };
    if let Some(reason) = not_committed(&meta) {
        return Scan::Skip(reason);
    }
    if meta.is_file() {
        return match FileStat::of(path.to_path_buf(), &meta) {
            Some(f) => Scan::Files(vec![f], Vec::new()),
            None => Scan::Skip("its modification time cannot be read".into()),
        };
    }
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir == path => return Scan::Gone,
            Err(e) if dir == path => return Scan::Skip(format!("folder cannot be read: {e}")),
            Err(e) => {
                skipped.push((dir, format!("folder cannot be read: {e}")));
                continue;
            }
        };
        for e in entries {
            let Ok(e) = e else { continue };
            let p = e.path();
            // Not followed (DirEntry::metadata does not traverse a link).
            let m = match e.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    skipped.push((p, format!("cannot be read: {err}")));
                    continue;
                }
            };
            if let Some(reason) = not_committed(&m) {
                skipped.push((p, reason));
            } else if m.is_dir() {
                stack.push(p);
            } else if let Some(f) = FileStat::of(p.clone(), &m) {
                out.push(f);
            } else {
                skipped.push((p, "its modification time cannot be read".into()));
            }
        }
    }
    out.sort();
    Scan::Files(out, skipped)
}

/// Why an entry with metadata `meta` (not followed) is not committed, if it is not.
fn not_committed(meta: &std::fs::Metadata) -> Option<String> {
    let t = meta.file_type();
    if t.is_symlink() {
        Some("a symbolic link (not followed; the file it points to is committed where it is watched)".into())
    } else if !t.is_file() && !t.is_dir() {
        Some("not a regular file or folder".into())
    } else {
        None
    }
}

/// Appends `entries` to [`WATCH_LOG`] and syncs it.
fn append_log(path: &Path, entries: &[(String, ObjectId)]) -> Result<()> {
    let err = |source| Error::Io { action: "writing", path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
    let mut text = String::new();
    // A path with a newline cannot be a line: it is left out (the check against HEAD still
    // finds it after a restart, unless a later commit changed it).
    for (p, h) in entries.iter().filter(|(p, _)| !p.contains('\n')) {
        text.push_str(&format!("{} {p}\n", h.to_hex()));
    }
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_data().map_err(err)
}
