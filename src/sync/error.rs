//! The error type of sync: what the repository core, the store or the remote reported, and
//! what sync itself refuses (a push that would move a remote ref backwards, a diverged pull).
//! Remote errors name the remote and the key; store errors name the object.

use crate::repo::VersionId;
use crate::{remote, repo, store};
use std::path::PathBuf;

/// Errors of push, fetch, pull, clone and the file transfers of the git filter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The repository failed.
    #[error(transparent)]
    Repo(#[from] repo::Error),
    /// The object store failed or found damage (in an object received from a remote, too).
    #[error(transparent)]
    Store(#[from] store::Error),
    /// A file system operation failed (a fetch's staging directory).
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A remote failed (its error names the remote, the key and the cause).
    #[error(transparent)]
    Remote(#[from] remote::Error),
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
    /// A write to a remote refused before it sent anything that needs them: objects it would
    /// upload or code a delta against are damaged or missing in the local store (a push never
    /// spreads bit rot to a remote).
    #[error(
        "{remote}: refused: {} in this store {} damaged ({}); nothing that needs {} was uploaded. `ckpt verify` \
         names the versions affected",
        count(objects.len(), "object"),
        if objects.len() == 1 { "is" } else { "are" },
        shown(objects),
        if objects.len() == 1 { "it" } else { "them" }
    )]
    DamagedHere {
        /// The remote's URL.
        remote: String,
        /// The damaged objects, each with its problem.
        objects: Vec<repo::BadObject>,
    },
    /// `ckpt gc --remote` refused to run, or stopped before deleting anything.
    #[error("{remote}: gc refused: {reason}")]
    RemoteGc {
        /// The remote's URL.
        remote: String,
        /// Why.
        reason: String,
    },
    /// `ckpt gc --remote` was interrupted ([`crate::sync::RemoteGcOptions::interrupt`]): it sent
    /// no delete after the interrupt, waited for those in flight, and removed its record.
    #[error("{remote}: gc interrupted after {deleted} deletes; nothing else was deleted and its record is removed")]
    RemoteGcInterrupted {
        /// The remote's URL.
        remote: String,
        /// Objects deleted before the interrupt.
        deleted: u64,
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
    /// A remote ref that is not one: its content is not a version id, or it is a directory
    /// of keys.
    #[error("{remote}: {key}: {reason}")]
    BadRemoteRef {
        /// The remote's URL.
        remote: String,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A read through a [`crate::sync::RemoteReader`] that cannot be answered: no such tensor,
    /// rows past its end, a tensor whose bytes are not its shape's.
    #[error("{what}: {reason}")]
    Unreadable {
        /// What was read (a file, a tensor).
        what: String,
        /// Why it cannot be.
        reason: String,
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
    /// `pull` would overwrite or remove files whose changes would be lost: nothing was written.
    #[error(
        "pull: not moving branch {branch:?} to {theirs}: {}",
        crate::repo::dirty_message(paths, untracked).replace("or pass --force to discard them", "then pull again")
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

/// "1 object", "3 objects".
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The first few damaged objects, each with its problem.
fn shown(objects: &[repo::BadObject]) -> String {
    // A store error names its object already.
    let one = |o: &repo::BadObject| match o.problem.contains(&o.id.to_hex()) {
        true => o.problem.clone(),
        false => format!("{}: {}", o.id, o.problem),
    };
    let mut text: Vec<String> = objects.iter().take(3).map(one).collect();
    if objects.len() > 3 {
        text.push(format!("and {} more", objects.len() - 3));
    }
    text.join("; ")
}

/// Shorthand for sync results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
