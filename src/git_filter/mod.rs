//! The git filter driver: git keeps a small pointer ([`pointer`]) where the working tree has a
//! checkpoint, and the checkpoint lives in a ckpt store, tensor by tensor with deltas.
//!
//! This is the only module that speaks git: the filter protocol ([`pktline`], [`process`]),
//! the clean/smudge driver ([`driver`]) and the set-up through git2 (config entries,
//! `.gitattributes`, where the store is). It sits above [`crate::repo`], which it calls to store
//! and write files; it never touches the store's objects itself. In filter mode stdout belongs
//! to git: nothing here prints.

pub mod attributes;
pub mod driver;
pub mod pktline;
pub mod pointer;
pub mod process;

use crate::repo::{self, Repo};
use std::path::{Path, PathBuf};

pub use driver::GitFilter;
pub use pointer::Pointer;

/// The filter and diff driver name in git config and `.gitattributes`.
pub const DRIVER: &str = "ckpt";

/// Git config entries `ckpt git install` writes (`filter.ckpt.*`).
pub const FILTER_CONFIG: [(&str, &str); 3] = [
    ("filter.ckpt.process", "ckpt git filter-process"),
    ("filter.ckpt.clean", "ckpt git clean %f"),
    ("filter.ckpt.smudge", "ckpt git smudge %f"),
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
    /// A `.gitattributes` pattern ckpt cannot write.
    #[error("pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Results of the git layer.
pub type Result<T> = std::result::Result<T, Error>;

fn git(action: impl Into<String>) -> impl FnOnce(git2::Error) -> Error {
    let action = action.into();
    move |source| Error::Git { action, source }
}

/// The git repository containing `start`.
pub fn discover(start: &Path) -> Result<git2::Repository> {
    git2::Repository::discover(start).map_err(git(format!("finding the git repository of {}", start.display())))
}

/// Where `git`'s ckpt store lives: `git config ckpt.store` (relative to the working tree, or
/// absolute) if set, else `ckpt` under git's common directory (shared by linked worktrees).
pub fn store_root(git: &git2::Repository) -> Result<PathBuf> {
    let config = git.config().map_err(self::git("reading git config"))?;
    if let Ok(p) = config.get_path("ckpt.store") {
        let base = git.workdir().unwrap_or_else(|| git.path());
        return Ok(base.join(p));
    }
    Ok(git.commondir().join("ckpt"))
}

/// Opens `git`'s ckpt store, creating it on first use.
pub fn open_store(git: &git2::Repository) -> Result<Repo> {
    let root = store_root(git)?;
    if root.join(repo::DIR_NAME).join("HEAD").is_file() {
        return Ok(Repo::open(&root)?);
    }
    match Repo::init(&root) {
        Ok(r) => Ok(r),
        // Another filter process created it first.
        Err(repo::Error::AlreadyExists { .. }) => Ok(Repo::open(&root)?),
        Err(e) => Err(e.into()),
    }
}

/// The git config ckpt writes to: the repository's own (`.git/config`), or the user's global
/// one (`~/.gitconfig`, created if missing).
fn config_for(start: &Path, global: bool) -> Result<git2::Config> {
    if global {
        let path = match git2::Config::find_global() {
            Ok(p) => p,
            Err(_) => {
                let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
                home.join(".gitconfig")
            }
        };
        return git2::Config::open(&path).map_err(git(format!("opening {}", path.display())));
    }
    let repo = discover(start)?;
    let path = repo.path().join("config");
    git2::Config::open(&path).map_err(git(format!("opening {}", path.display())))
}

/// Writes the filter driver (process, one-shot clean/smudge, `required`) into git config.
/// Idempotent.
pub fn install(start: &Path, global: bool) -> Result<()> {
    let mut config = config_for(start, global)?;
    for (key, value) in FILTER_CONFIG {
        config.set_str(key, value).map_err(git(format!("setting {key}")))?;
    }
    config.set_bool("filter.ckpt.required", true).map_err(git("setting filter.ckpt.required"))?;
    Ok(())
}

/// Removes what [`install`] wrote; entries already absent are fine.
pub fn uninstall(start: &Path, global: bool) -> Result<()> {
    let mut config = config_for(start, global)?;
    for key in FILTER_CONFIG.iter().map(|(k, _)| *k).chain(["filter.ckpt.required"]) {
        match config.remove(key) {
            Ok(()) => {}
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            Err(source) => return Err(Error::Git { action: format!("removing {key}"), source }),
        }
    }
    Ok(())
}

/// The working tree of `git`.
pub fn workdir(git: &git2::Repository) -> Result<&Path> {
    git.workdir().ok_or_else(|| Error::Bare { path: git.path().to_path_buf() })
}
