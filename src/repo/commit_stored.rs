//! A version made of files stored separately, by writers that share only the store: the ranks
//! of a distributed checkpoint (`ckpt.dcp.Writer`). Each writer stores its own files with
//! [`Repo::store_objects`], without the writer lock and without a version (objects are named by
//! their content and written create-if-absent, so writers never conflict); one of them then
//! lists them all in one version with [`Repo::commit_stored`], which moves the branch only if
//! it is still where it was when the save began.
//!
//! A save that fails before `commit_stored` leaves its objects unreferenced: `gc` deletes them
//! once they are older than its grace period (`gc_grace_seconds`, one hour by default, counted
//! from each object's last write or reuse: [`crate::store::Store::contains_fresh`]). A save that
//! outlasts it, or a `gc --prune=now` during one, may lose objects; `commit_stored` then refuses
//! the version (it checks that every file's objects are in the store, under the writer lock)
//! instead of writing one that could not be read.

use super::chains::since_base_after;
use super::commit::NewVersion;
use super::commit_objects::ObjectPlan;
use super::cut::{Input, Rules};
use super::model::{FileEntry, Version};
use super::pieces::Pieces;
use super::{CommitOptions, DeltaPolicy, Error, RefKind, Repo, RepoPath, Result, VersionId};
use crate::object_id::ObjectId;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

impl Repo {
    /// Stores the file at `disk` as the content of `path`: its blobs and manifest, no version,
    /// no ref, without the writer lock. With `previous` (the version the new one will follow),
    /// and a delta policy other than `reverse`, its tensors are delta-coded against the same
    /// tensors of the file at `path` there (for a `.distcp` file, the same items in any
    /// `.distcp` file there, the same path's first). A `.distcp` file is cut into its items by
    /// `written`, the items its writer reports having written into it (a rank's file is stored
    /// before `.metadata` exists), so they are named by fqn and chunk offsets as a commit of
    /// the checkpoint directory names them; without `written`, or if the report does not fit
    /// the file, by walking its archives (`archive.<n>`:
    /// [`crate::torch_zip::dcp::cut_by_written_items`]). `pieces`: tensors of this file that
    /// its writer handed over and [`Repo::store_piece`] stored while it wrote (their bytes are
    /// holes in the file at `disk`; see [`Pieces`]). Returns the file's entry for
    /// [`Repo::commit_stored`].
    pub fn store_objects(
        &self,
        disk: &Path,
        path: &RepoPath,
        previous: Option<&VersionId>,
        written: Option<&[crate::torch_zip::dcp::Item]>,
        pieces: Option<&Pieces>,
    ) -> Result<FileEntry> {
        let mut input = Input::open(disk, path.clone(), Rules::AnyContent, written)?;
        let mut taken = pieces.map(|p| p.take_file(path.as_str())).unwrap_or_default();
        // Only `reverse` compacts a version after its save, which codes uncoded blobs; under
        // another policy the tensors are coded (against the previous version's) here.
        let compacted_later = self.config.delta_policy == DeltaPolicy::Reverse;
        if !taken.is_empty() {
            let segments = input.tensor_ranges();
            match super::pieces::known_segments(&taken, &segments).filter(|_| compacted_later) {
                Some(known) => input.known = known,
                None => {
                    // The file is whole again before it is cut again, as if nothing was taken.
                    self.restore_pieces(disk, path, std::mem::take(&mut taken))?;
                    input = Input::open(disk, path.clone(), Rules::AnyContent, written)?;
                }
            }
        }
        // Under `reverse`, the new file is stored whole and the previous version's blobs are
        // rewritten later (the version is left pending for `compact`, see `commit_stored`).
        let deltas = (!compacted_later).then(|| self.base_every(None));
        // The reference blobs as a commit finds them (the same path; for a `.distcp` file, each
        // item in any file of the previous version: `ReferenceFiles::blobs_for_input`).
        let reference = match (deltas, previous) {
            (Some(_), Some(v)) => Some(self.version(v)?),
            _ => None,
        };
        let plan = ObjectPlan {
            reference: reference.as_ref(),
            deltas,
            derive: None,
            beside: None,
            pieces: taken,
            locked: false,
        };
        let stored = self.store_inputs(std::slice::from_ref(&input), plan)?;
        self.flush_index();
        Ok(stored.entries.into_iter().next().expect("one entry per input"))
    }

    /// Writes `pieces` back into the file at `disk` (where its writer left holes); their temp
    /// files go (the file is then stored as if nothing had been taken, each blob coded).
    fn restore_pieces(&self, disk: &Path, path: &RepoPath, pieces: Vec<super::pieces::Piece>) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(disk).map_err(|source| Error::Io {
            action: "opening",
            path: disk.to_path_buf(),
            source,
        })?;
        let in_file =
            |e: crate::store::Error| Error::File { path: path.to_string(), source: Box::new(Error::Store(e)) };
        for piece in pieces {
            let bytes = match &piece.blob {
                Some(blob) => blob.content().map_err(in_file)?,
                None => {
                    let blob = self.store.open_blob(&piece.id).map_err(in_file)?;
                    let mut bytes = Vec::with_capacity(blob.len() as usize);
                    blob.copy_to(&mut bytes).map_err(in_file)?;
                    bytes
                }
            };
            file.write_all_at(&bytes, piece.range.start).map_err(|source| Error::Io {
                action: "writing",
                path: disk.to_path_buf(),
                source,
            })?;
        }
        Ok(())
    }

    /// The version branch `name` points at (`None`: no such branch, or no version yet).
    pub fn branch_tip(&self, name: &str) -> Result<Option<VersionId>> {
        super::check_name(name)?;
        self.refs.get(RefKind::Branch, name)
    }

    /// Writes one version listing `files` (stored by [`Repo::store_objects`]) on top of
    /// `expected`, the tip `branch` had when they were stored (`None`: no version yet), and
    /// moves `branch` to it, unless the branch has moved since: then nothing is written and
    /// the error says where it is now. Files are listed once each (a path given twice is an
    /// error); the version holds only them. Every file's objects must be in the store. The
    /// version's `stored_bytes` (`log`, `show`) is what the save stored: the size of its files'
    /// objects that `expected` does not list, each counted once, as a commit counts what it
    /// writes.
    pub fn commit_stored(
        &self,
        branch: &str,
        expected: Option<VersionId>,
        files: Vec<FileEntry>,
        message: &str,
        options: &CommitOptions,
    ) -> Result<VersionId> {
        super::check_name(branch)?;
        let files = files_by_path(files)?;
        let _lock = self.lock()?;
        let tip = self.refs.get(RefKind::Branch, branch)?;
        if tip != expected {
            let show = |v: Option<VersionId>| v.map_or("no version".to_string(), |v| v.to_hex());
            return Err(Error::RefRefused {
                kind: RefKind::Branch,
                name: branch.to_string(),
                reason: format!(
                    "moved to {} since this save began on {}: another save committed first; nothing was written",
                    show(tip),
                    show(expected)
                ),
            });
        }
        let parent = expected.map(|id| self.version(&id)).transpose()?;
        let stored_bytes = self.stored_by_save(parent.as_ref(), &files)?;
        let since_base = since_base_after(parent.as_ref(), self.base_every(None));
        let new = NewVersion {
            parents: expected.into_iter().collect(),
            since_base,
            files,
            stored_bytes,
            message,
            time: options.time,
        };
        let id = self.write_version(new)?;
        self.refs.set(RefKind::Branch, branch, &id)?;
        if self.config.delta_policy == DeltaPolicy::Reverse {
            // In the next `compact` (or the next commit, which runs pending compactions first)
            // the blobs its writers stored uncoded are coded (`Repo::store_piece`), and the
            // parent's blobs become deltas against this version's.
            self.leave_pending(&id)?;
        }
        self.flush_index();
        Ok(id)
    }

    /// What a save stored for `files` on top of `parent`: the size of each object of the files
    /// that the parent does not list, once, as a commit counts what it writes. (An object the
    /// save found already in the store, such as a tensor back at an older value, counts too.)
    /// A gc during the save may have deleted what it stored (unreferenced until now): an object
    /// missing is an error naming its file.
    fn stored_by_save(&self, parent: Option<&Version>, files: &[FileEntry]) -> Result<u64> {
        // The objects the parent lists (manifests and blobs): what this save did not store.
        let mut listed_before: HashSet<ObjectId> = HashSet::new();
        for f in parent.iter().flat_map(|p| &p.files) {
            if listed_before.insert(f.manifest) {
                // An unreadable manifest of the parent only makes the figure larger.
                if let Ok(m) = self.manifest(&f.manifest) {
                    listed_before.extend(m.blobs());
                }
            }
        }
        let missing = |path: &str, id: ObjectId| Error::File {
            path: path.to_string(),
            source: Box::new(Error::Store(crate::store::Error::Missing { id })),
        };
        let mut counted: HashSet<ObjectId> = HashSet::new();
        let mut stored_bytes = 0u64;
        for f in files {
            let m = self.manifest(&f.manifest).map_err(|_| missing(&f.path, f.manifest))?;
            for id in std::iter::once(f.manifest).chain(m.blobs()) {
                if listed_before.contains(&id) || !counted.insert(id) {
                    continue;
                }
                let len = self.store.stored_len(&id).map_err(|_| missing(&f.path, id))?;
                stored_bytes = stored_bytes.saturating_add(len);
            }
        }
        Ok(stored_bytes)
    }
}

/// `files` sorted by path, each path valid and listed once, none both a file and a directory
/// of another; at least one.
fn files_by_path(files: Vec<FileEntry>) -> Result<Vec<FileEntry>> {
    if files.is_empty() {
        return Err(Error::NothingToCommit);
    }
    let mut by_path = BTreeMap::new();
    for f in files {
        RepoPath::parse(&f.path).map_err(|reason| Error::InvalidPath {
            path: std::path::PathBuf::from(&f.path),
            reason: reason.to_string(),
        })?;
        let path = f.path.clone();
        if by_path.insert(path.clone(), f).is_some() {
            return Err(Error::InvalidPath { path: path.into(), reason: "listed twice in one version".into() });
        }
    }
    if let Some((file, under)) = super::path::prefix_conflict(by_path.keys().map(String::as_str)) {
        return Err(Error::InvalidPath {
            path: under.into(),
            reason: format!("cannot be in the same version as the file {file:?}"),
        });
    }
    Ok(by_path.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(repo: &Repo, dir: &Path, path: &str, bytes: &[u8], previous: Option<&VersionId>) -> FileEntry {
        let disk = dir.join("spool");
        std::fs::write(&disk, bytes).unwrap();
        repo.store_objects(&disk, &RepoPath::parse(path).unwrap(), previous, None, None).unwrap()
    }

    #[test]
    fn stored_files_become_one_version_only_on_the_tip_they_followed() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(&dir.path().join("repo")).unwrap();
        let a = store(&repo, dir.path(), "__0_0.distcp", b"rank zero bytes", None);
        let b = store(&repo, dir.path(), "__1_0.distcp", b"rank one bytes", None);
        // Objects only: no version, no ref.
        assert_eq!(repo.branch_tip("main").unwrap(), None);
        assert!(repo.store().contains(&a.manifest));

        let v1 =
            repo.commit_stored("main", None, vec![b.clone(), a.clone()], "save 1", &CommitOptions::default()).unwrap();
        assert_eq!(repo.branch_tip("main").unwrap(), Some(v1));
        let version = repo.version(&v1).unwrap();
        assert_eq!(version.files, vec![a.clone(), b.clone()]);
        assert_eq!(version.parents, Vec::<VersionId>::new());
        assert_eq!(repo.read_file_bytes("HEAD", "__1_0.distcp", 1 << 20).unwrap(), b"rank one bytes");

        // A save that began on no version, after another committed: refused, nothing moves.
        let c = store(&repo, dir.path(), "__0_0.distcp", b"a later save", Some(&v1));
        let refused = repo.commit_stored("main", None, vec![c.clone()], "late", &CommitOptions::default());
        assert!(matches!(refused, Err(Error::RefRefused { .. })), "{refused:?}");
        assert_eq!(repo.branch_tip("main").unwrap(), Some(v1));
        let v2 = repo.commit_stored("main", Some(v1), vec![c], "save 2", &CommitOptions::default()).unwrap();
        assert_eq!(repo.version(&v2).unwrap().parents, vec![v1]);

        // A path twice, or objects a gc took: refused before anything is written.
        let twice = repo.commit_stored("main", Some(v2), vec![a.clone(), a.clone()], "x", &CommitOptions::default());
        assert!(matches!(twice, Err(Error::InvalidPath { .. })), "{twice:?}");
        let gone = store(&repo, dir.path(), "__2_0.distcp", b"collected", None);
        repo.gc_with(&crate::repo::GcOptions::now()).unwrap();
        assert!(!repo.store().contains(&gone.manifest));
        let missing = repo.commit_stored("main", Some(v2), vec![gone], "x", &CommitOptions::default());
        assert!(matches!(missing, Err(Error::File { .. })), "{missing:?}");
        assert_eq!(repo.branch_tip("main").unwrap(), Some(v2));
        assert!(repo.verify().unwrap().is_ok());
    }
}
