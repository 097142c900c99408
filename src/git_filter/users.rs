//! Who a store keeps objects for: the git repositories registered as its users (one file each
//! under [`USERS_DIR`]), and what they reach, which `ckpt git gc` keeps ([`live_set`]).

use super::{reachable_pointers, store_root, Error, Result};
use crate::repo::{self, Repo};
use std::path::{Path, PathBuf};

/// The directory of a ckpt store (under `.ckpt/`) where each git repository using it has a
/// file: named by the BLAKE3 hash of the repository's git common directory (its absolute,
/// canonical path), holding that path. `ckpt git gc` keeps what every registered repository
/// reaches (docs/format.md, "The git filter's store: who it keeps objects for").
pub const USERS_DIR: &str = "git-users";

/// The git common directory of `git`, absolute and canonical: what registers it in a store.
fn common_dir(git: &git2::Repository) -> Result<PathBuf> {
    let dir = git.commondir();
    std::fs::canonicalize(dir).map_err(|source| Error::Io { action: "resolving", path: dir.to_path_buf(), source })
}

fn user_file(store: &Repo, common: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    store.ckpt_dir().join(USERS_DIR).join(crate::ObjectId::hash(common.as_os_str().as_bytes()).to_hex())
}

/// Records `git` as a user of `store` (one `stat` when it is already). A store the user may
/// not write to (read-only, another's) is used without registering: such a user cannot store
/// files there either.
pub(super) fn register(store: &Repo, git: &git2::Repository) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let common = common_dir(git)?;
    let file = user_file(store, &common);
    if file.is_file() {
        return Ok(());
    }
    let dir = store.ckpt_dir().join(USERS_DIR);
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { action, path, source }
    };
    let result = std::fs::create_dir_all(&dir).and_then(|()| write_durably(&file, common.as_os_str().as_bytes()));
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(30) => Ok(()),
        Err(e) => Err(io("registering this repository in", &dir)(e)),
    }
}

/// Writes `bytes` as the file `path` of [`USERS_DIR`] atomically and durably: a temporary file
/// whose name starts with `.` (which [`store_users`] skips), fsynced, renamed into place, and
/// the directory fsynced.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("a file of USERS_DIR");
    let mut tmp = tempfile::Builder::new().prefix(".user-").tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The git repositories registered as users of `store`: (git common directory, registration
/// file), in path order.
pub fn store_users(store: &Repo) -> Result<Vec<(PathBuf, PathBuf)>> {
    use std::os::unix::ffi::OsStrExt;
    let dir = store.ckpt_dir().join(USERS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::Io { action: "reading", path: dir, source }),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|source| Error::Io { action: "reading", path: dir.clone(), source })?;
        let name = e.file_name();
        if name.as_bytes().starts_with(b".") {
            continue; // a registration being written
        }
        if name.as_bytes().ends_with(MISSING_SUFFIX.as_bytes()) {
            continue; // when a registered repository was first found missing
        }
        let file = e.path();
        let bytes =
            std::fs::read(&file).map_err(|source| Error::Io { action: "reading", path: file.clone(), source })?;
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
        // A file whose name is not the hash of its content was not written by ckpt.
        if !path.is_absolute() || user_file(store, &path) != file {
            return Err(Error::Users { file, reason: "not a registration ckpt wrote".into() });
        }
        out.push((path, file));
    }
    out.sort();
    Ok(out)
}

/// How long `ckpt git gc` keeps what a registered repository that went missing may need. A
/// missing path is no proof that a repository was deleted: a move, an unmounted disk or a
/// renamed home directory look the same, and its weights could not be recovered. Three months,
/// as `git worktree prune` waits for a missing worktree.
pub const MISSING_USER_GRACE: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

/// The suffix of the file beside a registration that records when its repository was first
/// found missing (decimal seconds since the Unix epoch).
const MISSING_SUFFIX: &str = ".missing";

/// A registered repository that `ckpt git gc` did not find.
#[derive(Debug, Clone)]
pub struct MissingUser {
    /// Its git common directory, as registered.
    pub path: PathBuf,
    /// When a gc first found it missing.
    pub since: std::time::SystemTime,
    /// When a gc will forget it ([`MISSING_USER_GRACE`] later) if it is still missing.
    pub forgotten_after: std::time::SystemTime,
}

/// What `ckpt git gc` keeps: the files every user of the store reaches.
#[derive(Debug, Default)]
pub struct LiveSet {
    /// The live files' manifests (with repetitions).
    pub manifests: Vec<crate::ObjectId>,
    /// The git common directories whose history, worktrees and indexes were read.
    pub repositories: Vec<PathBuf>,
    /// Registered repositories that no longer use this store, or have been missing for longer
    /// than [`MISSING_USER_GRACE`]: their registrations were removed (unless `dry_run`).
    pub pruned: Vec<PathBuf>,
    /// Registered repositories whose path does not exist (within the grace period): every file
    /// the store holds is kept for them, since what they reach cannot be read.
    pub missing: Vec<MissingUser>,
    /// The files (manifests) kept only because a registered repository is missing.
    pub kept_for_missing: usize,
}

/// The files the users of `store` reach: `git` (all its worktrees) and every other registered
/// repository that still uses `store` ([`reachable_pointers`] of each). A registration whose
/// repository's store is now another is removed (unless `dry_run`), as `git worktree prune`
/// does. A registered repository whose path does not exist is kept for [`MISSING_USER_GRACE`]
/// from when a gc first found it missing, and every file the store holds is live meanwhile
/// (see [`MissingUser`]; [`forget_user`] ends that at once). A registered repository that
/// exists but cannot be read is an error ([`Error::UserUnreadable`]): nothing may be deleted on
/// the word of a repository that was not read.
pub fn live_set(git: &git2::Repository, store: &Repo, dry_run: bool) -> Result<LiveSet> {
    let own = common_dir(git)?;
    let mut out = LiveSet::default();
    out.manifests.extend(reachable_pointers(git)?.into_iter().map(|(_, p)| p.manifest));
    out.repositories.push(own.clone());
    for (path, file) in store_users(store)? {
        if path == own {
            forget_missing_since(&file, dry_run)?;
            continue;
        }
        let unreadable = |reason: String| Error::UserUnreadable { path: path.clone(), file: file.clone(), reason };
        let exists = match std::fs::symlink_metadata(&path) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(unreadable(e.to_string())),
        };
        if !exists {
            let since = missing_since(&file, dry_run)?;
            let forgotten_after = since + MISSING_USER_GRACE;
            if std::time::SystemTime::now() < forgotten_after {
                out.missing.push(MissingUser { path, since, forgotten_after });
                continue;
            }
            if !dry_run {
                remove_registration(&file)?;
            }
            out.pruned.push(path);
            continue;
        }
        forget_missing_since(&file, dry_run)?;
        let uses_store = match git2::Repository::open(&path) {
            Ok(other) => {
                let root = store_root(&other).map_err(|e| unreadable(e.to_string()))?;
                match std::fs::canonicalize(&root) {
                    Ok(root) if root == store.root() => {
                        let pointers = reachable_pointers(&other).map_err(|e| unreadable(e.to_string()))?;
                        out.manifests.extend(pointers.into_iter().map(|(_, p)| p.manifest));
                        true
                    }
                    // Its store is now another one (or none yet).
                    _ => false,
                }
            }
            Err(e) => return Err(unreadable(e.message().to_string())),
        };
        if uses_store {
            out.repositories.push(path);
        } else {
            if !dry_run {
                remove_registration(&file)?;
            }
            out.pruned.push(path);
        }
    }
    if !out.missing.is_empty() {
        let stored = stored_files(store)?;
        let reached: std::collections::HashSet<_> = out.manifests.iter().copied().collect();
        out.kept_for_missing = stored.iter().filter(|m| !reached.contains(m)).count();
        out.manifests.extend(stored);
    }
    Ok(out)
}

/// Every file (manifest) the store holds.
fn stored_files(store: &Repo) -> Result<Vec<crate::ObjectId>> {
    let objects = store.store();
    let mut out = Vec::new();
    for id in objects.list().map_err(repo::Error::from)? {
        match objects.header(&id) {
            Ok(h) if h.kind == crate::store::ObjectKind::Manifest => out.push(id),
            Ok(_) => {}
            // Deleted since the listing (another gc), or damaged: a damaged object is kept by
            // gc's own marking rules, not by this list.
            Err(_) => {}
        }
    }
    Ok(out)
}

/// When the repository of the registration `file` was first found missing: the time recorded
/// beside it, or now (recorded, unless `dry_run`).
fn missing_since(file: &Path, dry_run: bool) -> Result<std::time::SystemTime> {
    let record = missing_record(file);
    match std::fs::read_to_string(&record) {
        Ok(text) => {
            let secs: u64 = text
                .trim()
                .parse()
                .map_err(|_| Error::Users { file: record.clone(), reason: "not a time ckpt wrote".into() })?;
            Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let now = std::time::SystemTime::now();
            if !dry_run {
                let secs = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                write_durably(&record, format!("{secs}\n").as_bytes()).map_err(|source| Error::Io {
                    action: "writing",
                    path: record.clone(),
                    source,
                })?;
            }
            Ok(now)
        }
        Err(source) => Err(Error::Io { action: "reading", path: record, source }),
    }
}

/// Removes the record that a registered repository is missing: it is there again.
fn forget_missing_since(file: &Path, dry_run: bool) -> Result<()> {
    if dry_run {
        return Ok(());
    }
    remove_if_present(&missing_record(file))
}

fn missing_record(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_os_string();
    name.push(MISSING_SUFFIX);
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { action: "removing", path: path.to_path_buf(), source }),
    }
}

/// Removes a registration and its missing record.
fn remove_registration(file: &Path) -> Result<()> {
    remove_if_present(file)?;
    remove_if_present(&missing_record(file))
}

/// Unregisters the git repository at `path` as a user of `store` (`ckpt git forget`): the next
/// `ckpt git gc` no longer keeps what it reached. `path` is its git common directory as gc
/// prints it, or the directory holding it as `.git`. Returns the path unregistered. Refused
/// for a repository that exists and uses `store` (its next use would register it again).
pub fn forget_user(store: &Repo, path: &Path) -> Result<PathBuf> {
    let users = store_users(store)?;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let canonical = std::fs::canonicalize(path).ok();
    let candidates: Vec<PathBuf> =
        [Some(absolute.clone()), canonical].into_iter().flatten().flat_map(|p| [p.join(".git"), p]).collect();
    let Some((registered, file)) = users.into_iter().find(|(p, _)| candidates.contains(p)) else {
        return Err(Error::NotAUser { path: absolute });
    };
    if let Ok(other) = git2::Repository::open(&registered) {
        if store_root(&other).ok().and_then(|r| std::fs::canonicalize(r).ok()).as_deref() == Some(store.root()) {
            return Err(Error::StillAUser { path: registered });
        }
    }
    remove_registration(&file)?;
    Ok(registered)
}
