//! The git filter driver: git keeps a small pointer ([`mod@pointer`]) where the working tree has a
//! checkpoint, and the checkpoint lives in a ckpt store, tensor by tensor with deltas.
//!
//! This is the only module that speaks git: the filter protocol ([`pktline`], [`process`]),
//! the clean/smudge driver ([`driver`]) and the set-up through git2 (config entries,
//! `.gitattributes`, where the store is). It sits above [`crate::repo`], which it calls to store
//! and write files; it never touches the store's objects itself. In filter mode stdout belongs
//! to git: nothing here prints.

pub mod attributes;
pub mod ckpt_remote;
pub mod driver;
pub mod history;
pub mod hook;
pub mod pktline;
pub mod pointer;
pub mod process;
mod users;
pub mod weight_diff;

use crate::repo::{self, Repo};
use std::path::{Path, PathBuf};

pub use driver::GitFilter;
pub use pointer::Pointer;
use users::register;
pub use users::{forget_user, live_set, store_users, LiveSet, MissingUser, MISSING_USER_GRACE, USERS_DIR};

/// Git config entries `ckpt git install` writes: the filter (`filter.ckpt.*`) and the diff
/// driver: an external diff command (`diff.ckpt.command`, which `git diff` runs with both sides
/// and which shows per-tensor statistics; `git log -p` and `git show` run it with
/// `--ext-diff`) and a textconv (`diff.ckpt.textconv`, one line per tensor, what `git log -p`
/// shows without `--ext-diff`).
pub(crate) const FILTER_CONFIG: [(&str, &str); 5] = [
    ("filter.ckpt.process", "ckpt git filter-process"),
    ("filter.ckpt.clean", "ckpt git clean %f"),
    ("filter.ckpt.smudge", "ckpt git smudge %f"),
    ("diff.ckpt.textconv", "ckpt git textconv"),
    ("diff.ckpt.command", "ckpt git diff-driver"),
];

/// Errors of the git layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libgit2 failed.
    #[error("{action}: {source}")]
    Git {
        /// What was being done.
        action: String,
        /// libgit2's error.
        source: git2::Error,
    },
    /// The ckpt store failed.
    #[error(transparent)]
    Repo(#[from] repo::Error),
    /// A transfer to or from the ckpt remote failed.
    #[error(transparent)]
    Sync(#[from] crate::sync::Error),
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
    /// A repository without a working tree where one is needed.
    #[error("{} is a bare git repository: it has no working tree", path.display())]
    Bare {
        /// The git directory.
        path: PathBuf,
    },
    /// A file `ckpt git checkout` could not write.
    #[error("{path}: {source}")]
    Checkout {
        /// The file, relative to the working tree.
        path: String,
        /// What went wrong.
        source: Box<Error>,
    },
    /// A `pre-push` hook ckpt cannot put its block into: not a shell script.
    #[error(
        "{} is not a shell script ({interpreter}): ckpt cannot chain its upload into it; make it run, \
         before anything reads stdin, `ckpt git pre-push \"$@\"` on a copy of its stdin (the \
         pushed refs) and fail if that fails, or make it a shell script and run `ckpt git install` again",
        path.display()
    )]
    HookNotShell {
        /// The hook.
        path: PathBuf,
        /// Its interpreter, from the `#!` line.
        interpreter: String,
    },
    /// `git config` failed.
    #[error("git config {args}: {message}")]
    Config {
        /// Its arguments.
        args: String,
        /// git's message, or why it did not run.
        message: String,
    },
    /// `CKPT_LOCK_TIMEOUT` is not a number of seconds.
    #[error("CKPT_LOCK_TIMEOUT={value:?}: expected a number of seconds, 0 or more, such as 60 or 0.5")]
    LockTimeout {
        /// The value.
        value: String,
    },
    /// git's `pre-push` input is not what the hook protocol says.
    #[error("pre-push input line {line}: {reason}")]
    PrePushInput {
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A pushed pointer whose file neither the local store nor the ckpt remote holds.
    #[error(
        "{path} (manifest {manifest}) is neither in the local ckpt store nor on the ckpt remote {remote};          {count} file(s) like this: smudge them here first (`ckpt git checkout`), or push from the clone          that stored them"
    )]
    NotPushable {
        /// A path the pointer is at.
        path: String,
        /// Its manifest.
        manifest: crate::ObjectId,
        /// The ckpt remote.
        remote: String,
        /// How many files are in this state.
        count: usize,
    },
    /// A `.gitattributes` pattern ckpt cannot write.
    #[error("pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// `ckpt git forget PATH` names no registered user of the store.
    #[error("{} is not registered as a user of this ckpt store (`ckpt git gc` lists those it keeps)", path.display())]
    NotAUser {
        /// The path given.
        path: PathBuf,
    },
    /// `ckpt git forget PATH` names a repository that exists and uses the store.
    #[error(
        "{} exists and uses this ckpt store: it stays registered (its next use would register it again)",
        path.display()
    )]
    StillAUser {
        /// The registered git common directory.
        path: PathBuf,
    },
    /// A git repository registered as a user of the store exists but cannot be read: gc
    /// cannot know what it still needs.
    #[error(
        "the git repository {} uses this ckpt store (registered in {}) but cannot be read: {reason}; \
         nothing was deleted. Make it readable, or, if it no longer uses this store, delete {}",
        path.display(),
        file.display(),
        file.display()
    )]
    UserUnreadable {
        /// Its git common directory.
        path: PathBuf,
        /// Its registration file in the store.
        file: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A file in the store's list of users that is not a registration.
    #[error("{}: {reason}; nothing was deleted (move it out of the store's {USERS_DIR} directory)", file.display())]
    Users {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A linked worktree git lists but that cannot be read.
    #[error(
        "the worktree {name:?} of {} cannot be read: {reason}; nothing was deleted (if it was \
         deleted, run `git worktree prune`)",
        repo.display()
    )]
    Worktree {
        /// The worktree's name.
        name: String,
        /// The repository's git common directory.
        repo: PathBuf,
        /// What failed.
        reason: String,
    },
    /// Reading from or writing to git's pipes (clean and smudge) failed.
    #[error("{action}: {source}")]
    Stream {
        /// What was being done (`reading from git`, `writing to git`, ...).
        action: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file whose metadata cannot be read (a side of a diff).
    #[error("{}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A path git gave that cannot be a path in the ckpt store.
    #[error("cannot store under this path: {reason}")]
    StorePath {
        /// The path, as git gave it.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Storing a cleaned file in the ckpt store failed.
    #[error("storing in the ckpt store at {}: {source}", store.display())]
    Store {
        /// The store's root.
        store: PathBuf,
        /// The store's error.
        source: Box<repo::Error>,
    },
    /// Content that starts like a ckpt pointer but is not a valid one.
    #[error("invalid ckpt pointer: {0}")]
    InvalidPointer(#[source] pointer::Error),
    /// A pointer (given to clean) whose file no source ckpt reads from can restore.
    #[error(
        "this is a ckpt pointer, but the file it names (manifest {manifest}, {size} bytes) is nowhere ckpt can \
         restore it from (looked in the ckpt store at {}{}): committed, it would fail at checkout. \
         Put the real file here instead; or, if the pointer is right, set `git config ckpt.remote` \
         (or `ckpt.store`) to where its file is",
        store.display(),
        notes.iter().map(|n| format!("; {n}")).collect::<String>()
    )]
    NotRestorable {
        /// The pointer's manifest.
        manifest: crate::ObjectId,
        /// The pointer's file size.
        size: u64,
        /// The own store's root.
        store: PathBuf,
        /// What each other source said.
        notes: Vec<String>,
    },
    /// A pointer's file that no source (own store, fallback stores, ckpt remote) has a good
    /// copy of.
    #[error(
        "cannot restore the file {hash} (manifest {manifest}, {size} bytes): no source has a good copy; tried {}; \
         if this repository was cloned or the store moved, point `git config ckpt.store` at a store \
         that has it or `git config ckpt.remote` at the ckpt remote it was pushed to, or run \
         `ckpt -C {} verify` to find damaged objects",
        tried.join("; "),
        store.display()
    )]
    NoGoodCopy {
        /// The file's hash.
        hash: crate::ObjectId,
        /// Its manifest.
        manifest: crate::ObjectId,
        /// Its size.
        size: u64,
        /// The own store's root.
        store: PathBuf,
        /// Each source tried, with what was wrong there (boxed: keeps [`Error`] small).
        tried: Box<[String]>,
    },
    /// A manifest that neither the own store nor a fallback store holds.
    #[error("manifest {manifest} is in no ckpt store (looked in {})", store.display())]
    ManifestMissing {
        /// The manifest.
        manifest: crate::ObjectId,
        /// The own store's root.
        store: PathBuf,
    },
    /// The ckpt remote cannot be opened.
    #[error("opening the ckpt remote {url}: {source}")]
    RemoteOpen {
        /// Its URL.
        url: String,
        /// Why.
        source: Box<Error>,
    },
    /// Fetching a pointer's file from the ckpt remote failed.
    #[error("fetching file {hash} (manifest {manifest}) from the ckpt remote {url}: {source}")]
    RemoteFetch {
        /// The file's hash.
        hash: crate::ObjectId,
        /// Its manifest.
        manifest: crate::ObjectId,
        /// The ckpt remote's URL.
        url: String,
        /// The transfer's error.
        source: Box<crate::sync::Error>,
    },
    /// The scratch store (for files fetched only to be read) cannot be created.
    #[error("creating a scratch store: {0}")]
    Scratch(#[source] Box<repo::Error>),
    /// An error met once (opening the ckpt remote, creating the scratch store) and given to
    /// every operation that needs the same thing.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

/// Results of the git layer.
pub type Result<T> = std::result::Result<T, Error>;

fn git(action: impl Into<String>) -> impl FnOnce(git2::Error) -> Error {
    let action = action.into();
    move |source| Error::Git { action, source }
}

/// The git repository containing `start`; where `GIT_DIR` is set (by the user, or by git for
/// what it runs under `git --git-dir=… --work-tree=…`: the filter, the hooks), the one it and
/// `GIT_WORK_TREE` name, as git itself would take it.
pub fn discover(start: &Path) -> Result<git2::Repository> {
    if std::env::var_os("GIT_DIR").is_some() {
        return git2::Repository::open_from_env()
            .map_err(git(format!("opening the git repository GIT_DIR names (from {})", start.display())));
    }
    git2::Repository::discover(start).map_err(git(format!("finding the git repository of {}", start.display())))
}

/// Where `git`'s ckpt store lives: `git config ckpt.store` (absolute, or relative to the main
/// working tree, so that every linked worktree finds the same store) if set, else `ckpt` under
/// git's common directory (shared by linked worktrees).
pub(crate) fn store_root(git: &git2::Repository) -> Result<PathBuf> {
    let config = git.config().map_err(self::git("reading git config"))?;
    if let Ok(p) = config.get_path("ckpt.store") {
        // The main working tree, from the common directory alone: not the linked worktree's
        // directory, nor `GIT_WORK_TREE` (`git --work-tree=DIR` writes elsewhere, the store
        // stays the repository's). `.git` is in it; otherwise the repository opened without
        // the environment says (`core.worktree`, a separate git dir), else a bare repository
        // resolves against itself.
        let common = git.commondir();
        let base = match (common.file_name(), common.parent()) {
            (Some(name), Some(main)) if name == ".git" => main.to_path_buf(),
            _ => git2::Repository::open(common)
                .ok()
                .and_then(|r| r.workdir().map(Path::to_path_buf))
                .unwrap_or_else(|| common.to_path_buf()),
        };
        return Ok(base.join(p));
    }
    Ok(git.commondir().join("ckpt"))
}

/// Opens `git`'s ckpt store, creating it on first use, and registers `git` as one of its
/// users (see [`USERS_DIR`]). Creation is race-free: any number of processes may make the
/// first use of a new store at once (each builds a complete store under a temporary name and
/// renames it into place; the first rename wins and the others open that store).
pub fn open_store(git: &git2::Repository) -> Result<Repo> {
    let root = store_root(git)?;
    let store = if root.join(repo::DIR_NAME).join("HEAD").is_file() {
        Repo::open(&root)?
    } else {
        match Repo::init(&root) {
            Ok(r) => r,
            // Another process created it first.
            Err(repo::Error::AlreadyExists { .. }) => Repo::open(&root)?,
            Err(e) => return Err(e.into()),
        }
    };
    register(&store, git)?;
    Ok(store)
}

/// Which git config [`install`] writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The user's (`git config --global`: `~/.gitconfig`, or `$GIT_CONFIG_GLOBAL`), as Git
    /// LFS installs: every repository of the user, clones included, runs the filter.
    Global,
    /// One repository's own (`.git/config`).
    Local,
}

/// Runs `git config <scope> args` in `dir` (git itself, so its rules for where the global
/// config is hold); returns its exit code (`git config --unset` of an absent key is 5).
fn git_config(dir: &Path, scope: Scope, args: &[&str]) -> Result<i32> {
    let scope_arg = match scope {
        Scope::Global => "--global",
        Scope::Local => "--local",
    };
    let described = format!("{scope_arg} {}", args.join(" "));
    let out = std::process::Command::new("git")
        .arg("config")
        .arg(scope_arg)
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::Config { args: described.clone(), message: format!("running git: {e}") })?;
    match out.status.code() {
        Some(0) => Ok(0),
        Some(5) if args.first() == Some(&"--unset-all") => Ok(5),
        code => Err(Error::Config {
            args: described,
            message: format!(
                "{} ({})",
                String::from_utf8_lossy(&out.stderr).trim(),
                code.map_or_else(|| "killed by a signal".to_string(), |c| format!("exit status {c}"))
            ),
        }),
    }
}

/// Writes the filter driver (process, one-shot clean/smudge, `required`) and the diff driver
/// into the git config of `scope` (for [`Scope::Local`], of the repository containing
/// `start`). Idempotent.
pub fn install(start: &Path, scope: Scope) -> Result<()> {
    if scope == Scope::Local {
        discover(start)?;
    }
    for (key, value) in FILTER_CONFIG {
        git_config(start, scope, &[key, value])?;
    }
    git_config(start, scope, &["filter.ckpt.required", "true"])?;
    Ok(())
}

/// Removes what [`install`] wrote; entries already absent are fine.
pub fn uninstall(start: &Path, scope: Scope) -> Result<()> {
    if scope == Scope::Local {
        discover(start)?;
    }
    for key in FILTER_CONFIG.iter().map(|(k, _)| *k).chain(["filter.ckpt.required"]) {
        git_config(start, scope, &["--unset-all", key])?;
    }
    Ok(())
}

/// The writer-lock timeout from `CKPT_LOCK_TIMEOUT` ([`repo::lock_timeout_from_env`], the
/// one parser the command line uses too: a huge value waits forever).
pub fn lock_timeout_from_env() -> Result<Option<std::time::Duration>> {
    repo::lock_timeout_from_env().map_err(|value| Error::LockTimeout { value })
}

/// `repo` with the writer-lock timeout `CKPT_LOCK_TIMEOUT` sets, if set.
pub fn with_env_lock_timeout(mut repo: Repo) -> Result<Repo> {
    if let Some(t) = lock_timeout_from_env()? {
        repo.set_lock_timeout(t);
    }
    Ok(repo)
}

/// Whether smudge leaves pointers in the working tree: `CKPT_SKIP_SMUDGE=1`, or `git config
/// ckpt.skipSmudge true`.
pub fn skip_smudge(git: &git2::Repository) -> bool {
    if let Some(v) = std::env::var_os("CKPT_SKIP_SMUDGE") {
        return v == "1" || v.eq_ignore_ascii_case("true");
    }
    git.config().ok().and_then(|c| c.get_bool("ckpt.skipSmudge").ok()).unwrap_or(false)
}

/// Writes the real file in place of every working-tree file of `git`'s index that is a valid
/// ckpt pointer (all, or those at or under `paths`, relative to the working tree), then has
/// git refresh its index so `git status` stays clean. Returns the paths written.
pub fn checkout_pointers(git: &git2::Repository, filter: &GitFilter, paths: &[String]) -> Result<Vec<String>> {
    let workdir = workdir(git)?.to_path_buf();
    let index = git.index().map_err(self::git("reading git's index"))?;
    let mut written = Vec::new();
    for entry in index.iter() {
        let Ok(path) = String::from_utf8(entry.path.clone()) else { continue };
        let wanted = paths.is_empty()
            || paths.iter().any(|p| {
                let p = p.trim_end_matches('/');
                path == p || path.starts_with(&format!("{p}/"))
            });
        if !wanted {
            continue;
        }
        let file = workdir.join(&path);
        let Ok(meta) = std::fs::symlink_metadata(&file) else { continue };
        if !meta.is_file() || meta.len() > pointer::MAX_LEN as u64 {
            continue;
        }
        let bytes =
            std::fs::read(&file).map_err(|source| Error::Io { action: "reading", path: file.clone(), source })?;
        let Ok(p) = Pointer::parse(&bytes) else { continue };
        // Only a pointer git has staged as is: re-staging the real file below must not stage
        // anything the user changed.
        if git2::Oid::hash_object(git2::ObjectType::Blob, &bytes).ok() != Some(entry.id) {
            continue;
        }
        filter.write_from_stores(&p, &file).map_err(|e| Error::Checkout { path: path.clone(), source: Box::new(e) })?;
        written.push(path);
    }
    if !written.is_empty() {
        refresh_index(&workdir, &written)?;
    }
    Ok(written)
}

/// A tracked weight file in a git tree, as `ckpt git ls-files` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedFile {
    /// Path in the tree.
    pub path: String,
    /// What the pointer says.
    pub pointer: Pointer,
    /// Bytes its objects take in the store now (manifest and blobs; a delta blob counts its
    /// own object only), or `None` if the manifest is not in the store.
    pub stored: Option<u64>,
}

/// The ckpt pointers in the tree of `rev` (a git revision), in path order, with what their
/// objects take in `store`.
pub fn ls_files(git: &git2::Repository, store: &Repo, rev: &str) -> Result<Vec<TrackedFile>> {
    let tree = git
        .revparse_single(rev)
        .and_then(|o| o.peel_to_tree())
        .map_err(self::git(format!("resolving {rev:?} to a tree")))?;
    let mut out = Vec::new();
    let mut failure = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() != Some(git2::ObjectType::Blob) {
            return git2::TreeWalkResult::Ok;
        }
        let blob = match git.find_blob(entry.id()) {
            Ok(b) => b,
            Err(e) => {
                failure = Some(e);
                return git2::TreeWalkResult::Abort;
            }
        };
        if blob.size() > pointer::MAX_LEN {
            return git2::TreeWalkResult::Ok;
        }
        if let Ok(p) = Pointer::parse(blob.content()) {
            let path = format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes()));
            let stored = store.manifest(&p.manifest).ok().map(|m| {
                let blobs: std::collections::HashSet<_> = m.blobs().collect();
                blobs.iter().chain([&p.manifest]).filter_map(|id| store.store().stored_len(id).ok()).sum()
            });
            out.push(TrackedFile { path, pointer: p, stored });
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(self::git(format!("reading the tree of {rev:?}")))?;
    if let Some(e) = failure {
        return Err(Error::Git { action: format!("reading a blob of {rev:?}"), source: e });
    }
    Ok(out)
}

/// The repositories of `git`'s working trees: the main one (or the bare repository) and every
/// linked worktree (`git worktree add`), each opened on its own `HEAD`, index and per-worktree
/// refs and reflogs. A linked worktree whose directory is gone is read from its
/// administrative directory (`.git/worktrees/<name>`) as git itself does until `git worktree
/// prune`; one that cannot be read at all is an error.
pub fn worktrees(git: &git2::Repository) -> Result<Vec<git2::Repository>> {
    let common = git.commondir().to_path_buf();
    let main = git2::Repository::open(&common).map_err(self::git(format!("opening {}", common.display())))?;
    let names = main.worktrees().map_err(self::git("listing the worktrees"))?;
    let mut out = Vec::new();
    for name in names.iter() {
        let Ok(Some(name)) = name else {
            return Err(Error::Worktree { name: "?".into(), repo: common, reason: "a name that is not UTF-8".into() });
        };
        let admin = common.join("worktrees").join(name);
        let opened = main
            .find_worktree(name)
            .and_then(|wt| git2::Repository::open_from_worktree(&wt))
            .or_else(|_| git2::Repository::open(&admin));
        match opened {
            Ok(r) => out.push(r),
            Err(e) => {
                return Err(Error::Worktree { name: name.to_string(), repo: common, reason: e.message().to_string() })
            }
        }
    }
    out.insert(0, main);
    Ok(out)
}

/// The ckpt pointers git can reach: in the trees of every commit reachable from any ref
/// (branches, tags, remotes, the stash), from any reflog entry, from the `HEAD` of every
/// working tree (a detached one included), from each worktree's own refs and reflogs and its
/// autostash (`rebase-merge/autostash`, `rebase-apply/autostash`, `MERGE_AUTOSTASH`: a rebase
/// or merge stopped on a conflict keeps the uncommitted changes there); in a tree or blob a
/// ref names (`git tag t HEAD^{tree}`); and in the index of every working tree. Each pointer
/// once, with one path where it was seen. What `ckpt git gc` keeps and `ckpt git fsck` checks.
pub fn reachable_pointers(git: &git2::Repository) -> Result<Vec<(String, Pointer)>> {
    let repos = worktrees(git)?;
    let mut walk = git.revwalk().map_err(self::git("walking history"))?;
    let push_log = |r: &git2::Repository, name: &str, walk: &mut git2::Revwalk| {
        if let Ok(log) = r.reflog(name) {
            for e in log.iter() {
                // Reflog entries may name commits since deleted; those are skipped.
                if git.find_commit(e.id_new()).is_ok() {
                    let _ = walk.push(e.id_new());
                }
            }
        }
    };
    // Trees and blobs a ref names without a commit (`git tag t HEAD^{tree}`, a tag of a blob).
    let mut loose_trees = Vec::new();
    let mut loose_blobs = Vec::new();
    for r in &repos {
        let refs = r.references().map_err(self::git("listing refs"))?;
        for reference in refs.flatten() {
            if let Ok(name) = reference.name() {
                if let Ok(commit) = reference.peel_to_commit() {
                    let _ = walk.push(commit.id());
                } else if let Ok(object) = reference.peel(git2::ObjectType::Any) {
                    match object.kind() {
                        Some(git2::ObjectType::Tree) => loose_trees.push((name.to_string(), object.id())),
                        Some(git2::ObjectType::Blob) => loose_blobs.push((name.to_string(), object.id())),
                        _ => {}
                    }
                }
                push_log(r, name, &mut walk);
            }
        }
        if let Ok(commit) = r.head().and_then(|h| h.peel_to_commit()) {
            let _ = walk.push(commit.id());
        }
        push_log(r, "HEAD", &mut walk);
        // A rebase or merge stopped on a conflict keeps the uncommitted changes it set aside in
        // an autostash commit that no ref names until it is applied or dropped.
        for file in ["rebase-merge/autostash", "rebase-apply/autostash", "MERGE_AUTOSTASH"] {
            let Ok(text) = std::fs::read_to_string(r.path().join(file)) else { continue };
            if let Ok(oid) = git2::Oid::from_str(text.trim()) {
                if git.find_commit(oid).is_ok() {
                    let _ = walk.push(oid);
                }
            }
        }
    }
    let mut seen_blobs = std::collections::HashSet::new();
    let mut seen_trees = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut consider = |path: String, id: git2::Oid, out: &mut Vec<(String, Pointer)>| {
        if !seen_blobs.insert(id) {
            return;
        }
        if let Ok(blob) = git.find_blob(id) {
            if blob.size() <= pointer::MAX_LEN {
                if let Ok(p) = Pointer::parse(blob.content()) {
                    out.push((path, p));
                }
            }
        }
    };
    for oid in walk {
        let oid = oid.map_err(self::git("walking history"))?;
        let tree = git.find_commit(oid).and_then(|c| c.tree()).map_err(self::git(format!("reading commit {oid}")))?;
        if !seen_trees.insert(tree.id()) {
            continue;
        }
        for (path, id) in tree_blobs(&tree, "", &format!("reading the tree of {oid}"))? {
            consider(path, id, &mut out);
        }
    }
    for r in &repos {
        let index = r.index().map_err(self::git(format!("reading git's index in {}", r.path().display())))?;
        for e in index.iter() {
            consider(String::from_utf8_lossy(&e.path).into_owned(), e.id, &mut out);
        }
    }
    for (name, id) in loose_blobs {
        consider(name, id, &mut out);
    }
    for (name, id) in loose_trees {
        let Ok(tree) = git.find_tree(id) else { continue };
        if !seen_trees.insert(tree.id()) {
            continue;
        }
        for (path, blob) in tree_blobs(&tree, &format!("{name}:"), &format!("reading the tree {name} names"))? {
            consider(path, blob, &mut out);
        }
    }
    Ok(out)
}

/// Every blob under `tree`, with its path after `prefix`.
fn tree_blobs(tree: &git2::Tree, prefix: &str, action: &str) -> Result<Vec<(String, git2::Oid)>> {
    let mut blobs = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            blobs.push((format!("{prefix}{dir}{}", String::from_utf8_lossy(entry.name_bytes())), entry.id()));
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(self::git(action))?;
    Ok(blobs)
}

/// Has git re-stage `paths` from the working tree (`git update-index -z --stdin`): it cleans
/// each through the filter (a hash: the content is stored) into the pointer it already has and
/// records the new stat data. A plain `--refresh` is not enough: git takes a size different from
/// the recorded one (the pointer's) as modified without looking at the content.
fn refresh_index(workdir: &Path, paths: &[String]) -> Result<()> {
    use std::io::Write;
    let io = |action| move |source| Error::Io { action, path: workdir.to_path_buf(), source };
    let mut child = std::process::Command::new("git")
        .args(["update-index", "-z", "--stdin"])
        .current_dir(workdir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(io("running git update-index in"))?;
    let mut stdin = child.stdin.take().expect("piped");
    for p in paths {
        stdin
            .write_all(p.as_bytes())
            .and_then(|()| stdin.write_all(b"\0"))
            .map_err(io("writing paths to git update-index in"))?;
    }
    drop(stdin);
    let status = child.wait().map_err(io("running git update-index in"))?;
    if !status.success() {
        return Err(Error::Io {
            action: "refreshing git's index (git update-index failed) in",
            path: workdir.to_path_buf(),
            source: std::io::Error::other(format!("exit status {status}")),
        });
    }
    Ok(())
}

/// The working tree of `git`.
pub fn workdir(git: &git2::Repository) -> Result<&Path> {
    git.workdir().ok_or_else(|| Error::Bare { path: git.path().to_path_buf() })
}
