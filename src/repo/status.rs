//! `status`: the working files against the current version. A file whose size and mtime match
//! the cached record (and whose mtime is safely older than the record, so a same-tick rewrite
//! cannot hide) is not read; any other file is hashed.

use super::commit::{mtime_ns, now_ns};
use super::{Head, Repo, RepoPath, Result, VersionId};
use crate::index::StatRecord;
use crate::object_id::ObjectId;

/// How far a file's mtime must lie before the cache record for the record to be trusted
/// (covers coarse file system timestamps).
const RACY_NS: i128 = 2_000_000_000;

/// State of one tracked file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileState {
    /// Same content as in the current version.
    Unchanged,
    /// Different content.
    Modified,
    /// Not in the working tree.
    Missing,
    /// `rm`-ed: the next version will not have it.
    Removed,
}

/// One tracked file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FileStatus {
    /// Path relative to the root.
    pub path: String,
    /// Its state.
    pub state: FileState,
}

/// The working tree against `HEAD`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// The branch `HEAD` is on (`None` when detached).
    pub branch: Option<String>,
    /// The current version (`None` before the first commit).
    pub head: Option<VersionId>,
    /// Every file of the current version, by path.
    pub files: Vec<FileStatus>,
    /// Versions whose parent's blobs are still to be rewritten as deltas (`ckpt compact`).
    pub pending_deltas: usize,
    /// The end of `.ckpt/compact.log`, if not empty: compactions that failed (the versions
    /// stay pending) and what background compactions printed on stderr (errors only).
    pub compaction_log: Option<String>,
}

impl Repo {
    /// Compares the working files with the current version.
    pub fn status(&self) -> Result<Status> {
        let branch = match self.refs.head()? {
            Head::Branch(b) => Some(b),
            Head::Detached(_) => None,
        };
        let head = self.refs.head_version()?;
        let pending_deltas = self.pending_deltas()?.len();
        let compaction_log = self.compaction_log();
        let Some(head_id) = head else {
            return Ok(Status { branch, head, files: Vec::new(), pending_deltas, compaction_log });
        };
        let version = self.version(&head_id)?;
        let removals = self.pending_removals()?;
        let mut files = Vec::with_capacity(version.files.len());
        for entry in &version.files {
            let state = if removals.contains(&entry.path) {
                FileState::Removed
            } else {
                let rp = RepoPath::parse(&entry.path).map_err(|reason| super::Error::CorruptMetadata {
                    id: head_id,
                    reason: format!("path {:?}: {reason}", entry.path),
                })?;
                self.file_state(&rp, entry.len, &entry.hash)?
            };
            files.push(FileStatus { path: entry.path.clone(), state });
        }
        self.flush_index();
        Ok(Status { branch, head, files, pending_deltas, compaction_log })
    }

    fn file_state(&self, rp: &RepoPath, len: u64, hash: &ObjectId) -> Result<FileState> {
        let path = rp.under(&self.root);
        let meta = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Ok(FileState::Modified),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FileState::Missing),
            Err(source) => return Err(super::Error::Io { action: "reading", path, source }),
        };
        if meta.len() != len {
            return Ok(FileState::Modified);
        }
        let mtime = mtime_ns(&meta);
        let cached = self.index().and_then(|ix| ix.stat(rp.as_str()).ok().flatten());
        let actual = match cached {
            Some(c) if c.len == meta.len() && c.mtime_ns == mtime && c.recorded_ns - mtime > RACY_NS => c.hash,
            _ => {
                let h = hash_file(&path)?;
                if let Some(ix) = self.index() {
                    let record = StatRecord { len: meta.len(), mtime_ns: mtime, recorded_ns: now_ns(), hash: h };
                    let _ = ix.put_stat(rp.as_str(), &record);
                }
                h
            }
        };
        Ok(if actual == *hash { FileState::Unchanged } else { FileState::Modified })
    }
}

/// The content hash a commit of the file at `path` would record (`model::file_hash`),
/// memory-mapped. A file that does not parse as safetensors hashes as opaque bytes, as commit
/// stores it (a `.safetensors` file that does not parse cannot be committed, so it never
/// matches).
pub(super) fn hash_file(path: &std::path::Path) -> Result<ObjectId> {
    let err = |source| super::Error::Io { action: "reading", path: path.to_path_buf(), source };
    // Not `File::open`: a named pipe at a tracked path would block; and a guarded map, so that a
    // file truncated while it is hashed is reported, not a SIGBUS.
    let file = crate::mmap::open_regular(path).map_err(err)?;
    let stamp = crate::mmap::FileStamp::of(&file.metadata().map_err(err)?);
    let map = crate::mmap::map_input(&file).map_err(err)?;
    let header = crate::safetensors::parse(&map).ok();
    let hash = super::commit::hash_content(&map, header.as_ref()).1;
    if stamp.changed(&file, &map) {
        return Err(super::Error::ChangedWhileRead { path: path.to_path_buf() });
    }
    Ok(hash)
}
