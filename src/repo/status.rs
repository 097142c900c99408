//! `status`: the working files against the current version. A file whose size, mtime, ctime
//! and inode match the cached record (and whose last change is safely older than the record, so
//! a same-tick rewrite cannot hide) is not read; any other file is hashed. `checkout` and
//! `switch` use the same comparison ([`Repo::observe`]) to find the changes they would destroy.

use super::cut::{Input, Rules};
use super::{Head, Repo, RepoPath, Result, VersionId};
use crate::index::StatRecord;
use crate::object_id::ObjectId;

/// How far a file's mtime and ctime must lie before the cache record for the record to be
/// trusted: covers the coarsest common file system timestamps (FAT's 2 s; ext4, XFS, btrfs and
/// tmpfs keep nanoseconds but update them at the kernel's tick).
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
    /// Files the current version does not track at paths other branches track: a `switch` to
    /// those branches refuses to overwrite them (unless they hold the branch's content).
    /// Found by a stat per path of the branches' tips, without reading any file.
    pub in_the_way: Vec<InTheWay>,
    /// Untracked files directly in a directory (not the root) that holds a tracked file: what
    /// `ckpt commit DIR` would add (a DCP save on more ranks, a new file in a checkpoint
    /// folder). One directory listing per such directory, not recursive, sorted; the files of
    /// `in_the_way` are not repeated.
    pub untracked: Vec<String>,
}

/// An untracked working file at a path other branches track.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InTheWay {
    /// Path relative to the root.
    pub path: String,
    /// The branches whose tip tracks it, sorted.
    pub branches: Vec<String>,
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
            let in_the_way = self.untracked_in_the_way(None)?;
            let untracked = Vec::new();
            return Ok(Status {
                branch,
                head,
                files: Vec::new(),
                pending_deltas,
                compaction_log,
                in_the_way,
                untracked,
            });
        };
        let version = self.version(&head_id)?;
        let in_the_way = self.untracked_in_the_way(Some((head_id, &version)))?;
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
        let untracked = self.untracked_beside(&version, &in_the_way);
        Ok(Status { branch, head, files, pending_deltas, compaction_log, in_the_way, untracked })
    }

    /// [`Status::untracked`]: regular files in the directories (not the root) of `version`'s
    /// files that it does not track. A directory that cannot be listed is skipped.
    fn untracked_beside(&self, version: &super::Version, in_the_way: &[InTheWay]) -> Vec<String> {
        let tracked: std::collections::HashSet<&str> = version.files.iter().map(|f| f.path.as_str()).collect();
        let reported: std::collections::HashSet<&str> = in_the_way.iter().map(|w| w.path.as_str()).collect();
        let dirs: std::collections::BTreeSet<&str> =
            version.files.iter().filter_map(|f| f.path.rsplit_once('/').map(|(d, _)| d)).collect();
        let mut out = Vec::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(self.root.join(dir)) else { continue };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
                let path = format!("{dir}/{name}");
                // Not followed: a link is listed as the file it is at that path.
                let is_file = entry.file_type().is_ok_and(|t| t.is_file() || t.is_symlink());
                if is_file && !tracked.contains(path.as_str()) && !reported.contains(path.as_str()) {
                    out.push(path);
                }
            }
        }
        out.sort();
        out
    }

    /// Working files at paths the branches' tips track and the current version (`head`) does
    /// not. Cheap: one small version object per branch tip and one `lstat` per path; a tip
    /// that cannot be read is skipped (`verify` reports it).
    fn untracked_in_the_way(&self, head: Option<(VersionId, &super::Version)>) -> Result<Vec<InTheWay>> {
        let mut found: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (name, tip) in self.refs.list(super::RefKind::Branch)? {
            if head.is_some_and(|(id, _)| id == tip) {
                continue;
            }
            let Ok(v) = self.version(&tip) else { continue };
            for f in &v.files {
                if head.is_some_and(|(_, h)| h.file(&f.path).is_some()) {
                    continue;
                }
                let Ok(rp) = RepoPath::parse(&f.path) else { continue };
                if std::fs::symlink_metadata(rp.under(&self.root)).is_ok() {
                    found.entry(f.path.clone()).or_default().push(name.clone());
                }
            }
        }
        Ok(found.into_iter().map(|(path, branches)| InTheWay { path, branches }).collect())
    }

    fn file_state(&self, rp: &RepoPath, len: u64, hash: &ObjectId) -> Result<FileState> {
        Ok(match self.observe(rp, &[(len, *hash)])? {
            Observed::Missing => FileState::Missing,
            Observed::Matches(0) => FileState::Unchanged,
            Observed::Matches(_) | Observed::Differs | Observed::NotAFile => FileState::Modified,
        })
    }

    /// Compares the working file at `rp` with the contents `candidates` (length, file hash)
    /// and with the content last committed from or checked out to that path (the cached
    /// record's, reported as `Matches(candidates.len())`), hashing the file only when its cached
    /// identity cannot be trusted (see [`stat_is_fresh`]).
    ///
    /// Every record's hash is content the repository holds: commit and checkout record what
    /// they stored or wrote, and a hashed file is recorded only when it matched one of those.
    /// A modified file is therefore hashed again each time, as git does with a file whose stat
    /// data differs from its index; in exchange `checkout` and `switch` may overwrite a file
    /// that a record vouches for.
    pub(super) fn observe(&self, rp: &RepoPath, candidates: &[(u64, ObjectId)]) -> Result<Observed> {
        let path = rp.under(&self.root);
        // Beyond a symbolic link to a directory the file is not in the working tree (git's
        // rule): a switch must not delete it there, whatever it holds.
        if rp.symlinked_dir(&self.root).is_some() {
            return Ok(Observed::Missing);
        }
        // Followed, as `commit` follows it: a symbolic link to a file is committed as the
        // file's bytes, so it is unchanged while those bytes are (and replacing the link by a
        // file of the same bytes loses nothing; a checkout never writes through it).
        let meta = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Ok(Observed::NotAFile),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Observed::Missing),
            // A path component that is a file: nothing can be at this path.
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(Observed::Missing),
            Err(source) => return Err(super::Error::Io { action: "reading", path, source }),
        };
        let cached = self.index().and_then(|ix| ix.stat(rp.as_str()).ok().flatten());
        let mut known = candidates.to_vec();
        known.extend(cached.map(|c| (c.len, c.hash)));
        if !known.iter().any(|(len, _)| *len == meta.len()) {
            return Ok(Observed::Differs);
        }
        let actual = match cached {
            Some(c) if stat_is_fresh(&c, &meta) => c.hash,
            _ => hash_file(&path)?,
        };
        let Some(i) = known.iter().position(|(_, h)| *h == actual) else { return Ok(Observed::Differs) };
        if !cached.is_some_and(|c| stat_is_fresh(&c, &meta)) {
            if let Some(ix) = self.index() {
                let _ = ix.put_stat(rp.as_str(), &stat_record(&meta, actual, now_ns()));
            }
        }
        Ok(Observed::Matches(i))
    }
}

impl Repo {
    /// What stands at `rp` without reading it: `Missing`, `NotAFile`, or a file as `Differs`
    /// (for `--force`, where only directories matter).
    pub(super) fn observe_kind(&self, rp: &RepoPath) -> Observed {
        if rp.symlinked_dir(&self.root).is_some() {
            return Observed::Missing;
        }
        match std::fs::symlink_metadata(rp.under(&self.root)) {
            Ok(m) if m.is_file() => Observed::Differs,
            Ok(_) => Observed::NotAFile,
            Err(_) => Observed::Missing,
        }
    }
}

/// What [`Repo::observe`] found at a working path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Observed {
    /// Nothing there, or the path is beyond a symbolic link to a directory (not in the tree).
    Missing,
    /// A directory, symbolic link or other non-regular file.
    NotAFile,
    /// A file with the content of `candidates[i]`, or (`i == candidates.len()`) the content
    /// last committed from or checked out to this path.
    Matches(usize),
    /// A file with none of the candidates' contents.
    Differs,
}

/// The identity of a working file with `meta` and content hash `hash`, recorded at `recorded_ns`.
pub(super) fn stat_record(meta: &std::fs::Metadata, hash: ObjectId, recorded_ns: i128) -> StatRecord {
    use std::os::unix::fs::MetadataExt;
    StatRecord {
        len: meta.len(),
        mtime_ns: mtime_ns(meta),
        ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        ino: meta.ino(),
        recorded_ns,
        hash,
    }
}

/// Whether the cached record `c` still describes the file with `meta`, so that its hash can be
/// trusted without reading the file: same size, mtime, ctime and inode, and the file's last
/// change (mtime or ctime) strictly older than the record by more than the file system's
/// timestamp granularity. Without that last rule a file rewritten within the same timestamp
/// tick right after the record was made (a training loop saving twice in a second on a file
/// system of coarse timestamps) would keep the stale hash: git's "racy" files.
pub(super) fn stat_is_fresh(c: &StatRecord, meta: &std::fs::Metadata) -> bool {
    let now = stat_record(meta, c.hash, c.recorded_ns);
    now == *c && c.recorded_ns - c.mtime_ns.max(c.ctime_ns) > RACY_NS
}

/// The content hash a commit of the file at `path` would record ([`FileEntry::hash`](super::FileEntry::hash),
/// `model::file_hash`), memory-mapped. A file that does not parse as safetensors (or as a `torch.save` archive)
/// hashes as opaque bytes, as commit stores it (a `.safetensors` file that does not parse cannot be committed, so it never
/// matches). Compare it with a version's [`FileEntry`](super::FileEntry) to tell whether that version holds
/// the file's content without committing it. Errors: the file cannot be read, or it changed
/// while it was read ([`Error::ChangedWhileRead`](super::Error::ChangedWhileRead)).
pub fn hash_file(path: &std::path::Path) -> Result<ObjectId> {
    // Not `File::open`: a named pipe at a tracked path would block; and a guarded map, so that a
    // file truncated while it is hashed is reported, not a SIGBUS.
    let input = Input::open(path, RepoPath::parse("file").expect("a valid path"), Rules::Hash, None)?;
    let hash = input.hash().1;
    if input.check_unchanged().is_err() {
        return Err(super::Error::ChangedWhileRead { path: path.to_path_buf() });
    }
    Ok(hash)
}

/// Nanoseconds since the Unix epoch, now.
pub(super) fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

/// A file's modification time in nanoseconds since the Unix epoch.
pub(super) fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    match m.modified() {
        Ok(t) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        },
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_trusted_only_when_every_field_matches_and_it_is_not_racy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"content").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let hash = ObjectId::hash(b"content");
        // Made just after the file changed: within the racy window, not trusted.
        assert!(!stat_is_fresh(&stat_record(&meta, hash, now_ns()), &meta));
        // Made well after it: trusted while nothing differs.
        let later = now_ns() + 2 * RACY_NS;
        let good = stat_record(&meta, hash, later);
        assert!(stat_is_fresh(&good, &meta));
        for stale in [
            StatRecord { len: good.len + 1, ..good },
            StatRecord { mtime_ns: good.mtime_ns - 1, ..good },
            StatRecord { ctime_ns: good.ctime_ns - 1, ..good },
            StatRecord { ino: good.ino ^ 1, ..good },
        ] {
            assert!(!stat_is_fresh(&stale, &meta), "{stale:?}");
        }
        // A change the record missed (same size, mtime put back) moves the ctime.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        std::io::Write::write_all(&mut &f, b"CONTENT").unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!((after.len(), mtime_ns(&after)), (meta.len(), mtime_ns(&meta)));
        assert!(!stat_is_fresh(&good, &after));
    }
}
