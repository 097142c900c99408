//! `watch`: commits each checkpoint that appears in a directory, one version per checkpoint.
//!
//! A checkpoint is an entry directly under the watched directory whose name matches the pattern:
//! a file, or a folder (`checkpoint-500/`) committed with every file under it. It is committed
//! once it is finished: nothing in it changed (size, modification time, file count) for the
//! settle time, or, for a folder, once its `trainer_state.json` exists (Hugging Face `Trainer`
//! writes it last). A commit that sees a file change while it reads it fails
//! (`Error::FileChanged`) and is retried once the checkpoint settles again; a file that changed
//! after its commit (an overwritten `last.ckpt`) is committed again. What was committed is
//! appended to `.ckpt/watched` (file hash and path per line) and also checked against `HEAD`, so
//! a restarted watcher does not commit a checkpoint twice. The directory is rescanned on every
//! file-system event (`notify`, the only user of that crate) and every poll interval, so a
//! watcher that cannot be set up (or misses events, as on network file systems) still works by
//! polling.

use super::{Error, Repo, Result};
use crate::object_id::ObjectId;
use crate::repo::{CommitOptions, TensorFilter, VersionId};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// File under `.ckpt/` recording what `watch` committed: one line per file, `<file hash hex>
/// <path>`, appended after each commit.
pub const WATCH_LOG: &str = "watched";

/// A folder holding this file is a finished Hugging Face `Trainer` checkpoint.
const TRAINER_STATE: &str = "trainer_state.json";

/// Settings of [`Repo::watch`].
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
    /// A checkpoint had been committed before (by this watcher or an earlier run).
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
    /// File-system events are unavailable; the directory is polled.
    Polling {
        /// Why.
        reason: String,
    },
}

/// What a checkpoint looked like at one scan: per file, its size and modification time.
type Signature = Vec<(PathBuf, u64, SystemTime)>;

/// A checkpoint being watched.
struct Candidate {
    signature: Signature,
    /// When the signature last changed.
    since: Instant,
    /// The signature it was last committed (or found committed) with.
    committed: Option<Signature>,
}

/// The watcher's state between scans ([`Repo::watch`] runs it; tests step it by hand).
pub struct Watcher<'r> {
    repo: &'r Repo,
    dir: PathBuf,
    options: WatchOptions,
    filter: Option<TensorFilter>,
    candidates: HashMap<PathBuf, Candidate>,
    /// (path, file hash) pairs committed by any watcher of this repository.
    log: HashSet<(String, ObjectId)>,
}

impl Repo {
    /// Watches `dir` (inside the working tree) and commits each checkpoint that appears in it,
    /// until `stop` returns true (checked after every scan). `on_event` hears what happened.
    pub fn watch(
        &self,
        dir: &Path,
        options: &WatchOptions,
        stop: &dyn Fn() -> bool,
        on_event: &mut dyn FnMut(&WatchEvent),
    ) -> Result<()> {
        let mut watcher = Watcher::new(self, dir, options.clone())?;
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
            for e in watcher.step(Instant::now())? {
                on_event(&e);
            }
            if stop() {
                return Ok(());
            }
            // Wake on the first event or after the poll interval, whichever comes first; a
            // burst of events (a trainer writing a file) costs one rescan per interval at most.
            let wait = options.poll.min(options.settle / 2).max(Duration::from_millis(10));
            if rx.recv_timeout(wait).is_ok() {
                std::thread::sleep(Duration::from_millis(50));
                while rx.try_recv().is_ok() {}
            }
        }
    }
}

/// A recursive file-system watcher on `dir` that sends a unit per event to `tx`.
fn events(dir: &Path, tx: mpsc::Sender<()>) -> std::result::Result<notify::RecommendedWatcher, String> {
    use notify::Watcher as _;
    let mut w = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
        let _ = tx.send(());
    })
    .map_err(|e| e.to_string())?;
    w.watch(dir, notify::RecursiveMode::Recursive).map_err(|e| e.to_string())?;
    Ok(w)
}

impl<'r> Watcher<'r> {
    /// A watcher of `dir`, which must be a directory inside `repo`'s working tree.
    pub fn new(repo: &'r Repo, dir: &Path, options: WatchOptions) -> Result<Watcher<'r>> {
        let rel = repo.repo_path(dir)?;
        let dir = rel.under(&repo.root);
        if !dir.is_dir() {
            return Err(Error::InvalidPath { path: dir, reason: "is not a directory".into() });
        }
        let filter = options.pattern.as_deref().map(TensorFilter::new);
        let log = read_log(&repo.dir.join(WATCH_LOG))?;
        Ok(Watcher { repo, dir, options, filter, candidates: HashMap::new(), log })
    }

    /// Whether the entry called `name` is a checkpoint to watch.
    fn wanted(&self, name: &str) -> bool {
        match &self.filter {
            // The repository's own directory is never a checkpoint (when DIR is the root).
            Some(_) if name == super::DIR_NAME => false,
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
        for path in names {
            // Gone or unreadable between listing and stat: seen again on the next scan.
            let Some(signature) = signature_of(&path) else { continue };
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
            let finished = path.join(TRAINER_STATE).is_file();
            if !finished && now.duration_since(c.since) < self.options.settle {
                continue;
            }
            let signature = c.signature.clone();
            match self.commit(&path, &signature) {
                Ok(e) => out.push(e),
                // Hashing failed (a file deleted or replaced under us) or the commit did: try
                // again after the settle time; the other checkpoints go on.
                Err(e) => {
                    if let Some(c) = self.candidates.get_mut(&path) {
                        c.since = Instant::now();
                    }
                    let path =
                        self.repo.repo_path(&path).map_or_else(|_| path.display().to_string(), |p| p.to_string());
                    out.push(WatchEvent::Failed { path, reason: e.to_string() });
                }
            }
        }
        // Deleted checkpoints are forgotten (their versions stay); one that reappears is new.
        self.candidates.retain(|p, _| present.contains(p));
        Ok(out)
    }

    /// Commits the checkpoint at `path` whose files are `signature`, unless it was committed
    /// before; records it. An error leaves the checkpoint to be tried again.
    fn commit(&mut self, path: &Path, signature: &Signature) -> Result<WatchEvent> {
        let rel = self.repo.repo_path(path)?.to_string();
        let files: Vec<&Path> = signature.iter().map(|(p, _, _)| p.as_path()).collect();
        let mut hashes = Vec::with_capacity(files.len());
        for f in &files {
            hashes.push((self.repo.repo_path(f)?.to_string(), super::status::hash_file(f)?));
        }
        let head = self.repo.refs.head_version()?.map(|id| self.repo.version(&id)).transpose()?;
        let in_head = |(p, h): &(String, ObjectId)| head.as_ref().and_then(|v| v.file(p)).is_some_and(|f| f.hash == *h);
        let candidate = self.candidates.get_mut(path).expect("scanned");
        if hashes.iter().all(|h| self.log.contains(h) || in_head(h)) {
            candidate.committed = Some(signature.clone());
            return Ok(WatchEvent::AlreadyCommitted { path: rel });
        }
        let message = format!("watch: {rel}");
        let version = match self.repo.commit(&files, &message, &CommitOptions::default()) {
            Ok(v) => v,
            Err(Error::FileChanged { .. }) => {
                // Settle again from now before the retry.
                candidate.since = Instant::now();
                return Ok(WatchEvent::Retrying { path: rel });
            }
            Err(e) => return Err(e),
        };
        // What the commit stored, which is what was on disk while it read the files.
        let stored = self.repo.version(&version)?;
        let committed: Vec<(String, ObjectId)> =
            hashes.iter().filter_map(|(p, _)| stored.file(p).map(|f| (p.clone(), f.hash))).collect();
        append_log(&self.repo.dir.join(WATCH_LOG), &committed)?;
        self.log.extend(committed);
        // A file that changed after it was hashed here (so after or during the commit) shows up
        // as a new signature on the next scan and is committed again once it settles.
        candidate.committed = Some(signature.clone());
        Ok(WatchEvent::Committed { path: rel, version, files: files.len() })
    }
}

/// The files of a checkpoint (the file itself, or every file under a folder, sorted) with their
/// sizes and modification times; `None` if it cannot be read now.
fn signature_of(path: &Path) -> Option<Signature> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.is_file() {
        return Some(vec![(path.to_path_buf(), meta.len(), meta.modified().ok()?)]);
    }
    if !meta.is_dir() {
        return None;
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).ok()? {
            let e = e.ok()?;
            let m = e.metadata().ok()?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                out.push((e.path(), m.len(), m.modified().ok()?));
            }
        }
    }
    out.sort();
    Some(out)
}

/// Reads [`WATCH_LOG`]; a missing file is an empty log, a damaged line is skipped (the check
/// against `HEAD` still catches what it recorded).
fn read_log(path: &Path) -> Result<HashSet<(String, ObjectId)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(source) => return Err(Error::Io { action: "reading", path: path.to_path_buf(), source }),
    };
    Ok(text
        .lines()
        .filter_map(|l| {
            let (hash, p) = l.split_once(' ')?;
            Some((p.to_string(), hash.parse::<ObjectId>().ok()?))
        })
        .collect())
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
