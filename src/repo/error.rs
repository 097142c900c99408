//! The repository's error type.

use super::{RefKind, VersionId, DIR_NAME};
use crate::object_id::ObjectId;
use crate::{index, store};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// A checkout or `switch` that failed part-way through changing its target directory (the
    /// working tree, or `--output`): what it had done was undone, except the entries of `left`.
    #[error("{source}; {}", undone_message(dir, left))]
    CheckoutUndone {
        /// The target directory.
        dir: PathBuf,
        /// What failed.
        source: Box<Error>,
        /// What could not be put back: each path, where it was left and why.
        left: Vec<String>,
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
    /// ([`limits`](super::limits)): it is refused rather than written unreadable.
    #[error("cannot commit {what}: {reason} (docs/format.md, \"Caps on untrusted sizes\")")]
    OverLimit {
        /// The file, or "the version".
        what: String,
        /// Which cap and by how much.
        reason: String,
    },
    /// A version `ckpt prune` dropped (`.ckpt/pruned`): it is no longer in this store.
    #[error(
        "version {version} was dropped by `ckpt prune` (history before the versions it kept is gone from \
         this store); a remote it was pushed to may still hold it"
    )]
    VersionPruned {
        /// The version.
        version: VersionId,
    },
    /// An operation a git filter's store refuses: its objects are kept for the git
    /// repositories that use it (their pointers), not by its own branch.
    #[error(
        "{operation}: this is a git filter's store, whose objects the git repositories using it \
         need whatever its own history says; `ckpt git gc` frees what none of them reaches"
    )]
    GitFilterStore {
        /// The operation.
        operation: &'static str,
    },
    /// `prune --keep-last 0`: it would drop every version of a branch.
    #[error("prune --keep-last 0 would drop every version of the branch; keep at least 1 (delete the branch to drop it all)")]
    KeepLastZero,
    /// An operation on the current branch while `HEAD` is detached.
    #[error("{operation}: HEAD is detached (not on a branch); name the branch")]
    NoCurrentBranch {
        /// The operation.
        operation: &'static str,
    },
}

/// The message of [`Error::DirtyWorkingTree`].
pub(crate) fn dirty_message(modified: &[String], untracked: &[String]) -> String {
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

/// The end of the message of [`Error::CheckoutUndone`].
fn undone_message(dir: &Path, left: &[String]) -> String {
    if left.is_empty() {
        format!("nothing was changed: what the checkout had done in {} was undone", dir.display())
    } else {
        format!("undoing what the checkout had done in {} failed for: {}", dir.display(), left.join("; "))
    }
}

/// Shorthand for repository results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(super) fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    move |source| Error::Io { action, path: path.to_path_buf(), source }
}
