//! One file in, one file out, outside the working tree: the repository side of the git filter.
//! [`Repo::store_file`] stores a file read from any path under a logical path (as a commit on
//! the current branch, so deltas, compaction, `verify` and `show` apply as to any commit), and
//! [`Repo::write_stored_file`] writes a stored file back by its manifest, verified.

use super::commit::Onto;
use super::cut::{Input, Rules};
use super::model::{FileEntry, Manifest};
use super::{CommitOptions, Error, Repo, RepoPath, Result, VersionId};
use crate::object_id::ObjectId;
use std::path::Path;

/// A file stored by [`Repo::store_file`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// The file's manifest object.
    pub manifest: ObjectId,
    /// The file hash (docs/format.md, "file hash").
    pub hash: ObjectId,
    /// The file's length.
    pub len: u64,
    /// The version written, or `None` when the store already held this content (nothing was
    /// coded or written).
    pub version: Option<VersionId>,
}

impl Repo {
    /// Stores the file at `disk` as the content of `path` (which need not exist in the working
    /// tree). Content the store already holds whole (its manifest exists) costs one hash pass
    /// and writes nothing. Otherwise it is committed as a new version that lists this file
    /// alone (docs/format.md, "The git filter's store versions": what a clean writes does not
    /// grow with the number of paths stored before). Its first parent is the version of the
    /// last content stored for `path` (found through `.ckpt/git-paths/`), or for a new path
    /// the last file stored under the same file name, else `HEAD`'s version: its tensors are
    /// delta-coded against the same tensors there (by path, else as [`Repo::commit`] matches
    /// a new path), and, under the `reverse` policy, that content is rewritten as deltas
    /// against it (inline, or later with `options.defer_deltas`). `HEAD`'s version is its
    /// last parent, and the branch moves to it, so every stored file stays reachable.
    ///
    /// Any content is accepted: a file that parses as safetensors is stored tensor by tensor,
    /// anything else (an invalid `*.safetensors` included) as bytes.
    pub fn store_file(
        &self,
        disk: &Path,
        path: &RepoPath,
        message: &str,
        options: &CommitOptions,
    ) -> Result<StoredFile> {
        self.store_into(disk, path, (message, options), None)
    }

    /// [`Self::store_file`], with the manifests of files stored beside this one (the git
    /// filter's: files cleaned earlier in the same `git add`, the files of git's `HEAD`): its
    /// BF16 and F16 tensors are derived from their F32 namesakes there, as `ckpt commit`
    /// derives them from another file of the same version (docs/format.md, "Derived blobs").
    /// Its F32 tensors are not widened from narrow ones: a narrow copy stored before its
    /// master is derived from it afterwards ([`Self::derive_copies_from`]).
    pub fn store_file_beside(
        &self,
        disk: &Path,
        path: &RepoPath,
        (message, options): (&str, &CommitOptions),
        beside: &[ObjectId],
    ) -> Result<StoredFile> {
        self.store_into(disk, path, (message, options), Some(beside))
    }

    fn store_into(
        &self,
        disk: &Path,
        path: &RepoPath,
        (message, options): (&str, &CommitOptions),
        beside: Option<&[ObjectId]>,
    ) -> Result<StoredFile> {
        let input = Input::open(disk, path.clone(), Rules::AnyContent, None)?;
        let manifest = input.manifest();
        let bytes = manifest.to_bytes();
        let id = ObjectId::hash(&bytes);
        if self.store.contains(&id) {
            return Ok(StoredFile { manifest: id, hash: manifest.hash, len: manifest.len, version: None });
        }
        let _lock = self.lock()?;
        let on = self.stored_before(path)?;
        let version_id = self.commit_inputs(vec![input], Onto::Stored { on, beside }, message, options)?;
        self.write_path_records(path.as_str(), &version_id);
        let version = self.version(&version_id)?;
        let entry =
            version.file(path.as_str()).ok_or(Error::NotInVersion { path: path.to_string(), version: version_id })?;
        // The commit planned the same segments from the same bytes; a difference means the
        // file changed while it was read.
        if entry.manifest != id {
            return Err(Error::InvalidPath {
                path: disk.to_path_buf(),
                reason: "changed while it was being stored".into(),
            });
        }
        Ok(StoredFile { manifest: id, hash: manifest.hash, len: manifest.len, version: Some(version_id) })
    }

    /// Writes the file whose manifest is `manifest` (of `len` bytes and file hash `hash`, as a
    /// pointer records them) to `dest`, through a temporary file in the same directory renamed
    /// only once every segment and the file hash verified: on any error `dest` is untouched.
    pub fn write_stored_file(&self, manifest: &ObjectId, len: u64, hash: &ObjectId, dest: &Path) -> Result<u64> {
        let invalid = |reason: &str| Error::InvalidPath { path: dest.to_path_buf(), reason: reason.into() };
        let name = dest.file_name().and_then(|n| n.to_str()).ok_or_else(|| invalid("no UTF-8 file name"))?;
        let dir = dest.parent().ok_or_else(|| invalid("no parent directory"))?;
        let rp = RepoPath::parse(name).map_err(invalid)?;
        let entry = FileEntry { path: name.to_string(), manifest: *manifest, len, hash: *hash };
        let written = self.checkout_file(&entry, &rp, dir, None, 0)?;
        Ok(written.unwrap_or(0))
    }
}

/// Where the git filter's store records, per path and per file name, the version that last
/// stored it (docs/format.md, "The git filter's store versions").
pub(super) const PATH_RECORDS: &str = "git-paths";

impl Repo {
    fn path_record_file(&self, key: &str) -> std::path::PathBuf {
        self.dir.join(PATH_RECORDS).join(ObjectId::hash(key.as_bytes()).to_hex())
    }

    /// The version a record names, if the record exists and the version is in the store.
    fn read_path_record(&self, key: &str) -> Option<VersionId> {
        let text = std::fs::read_to_string(self.path_record_file(key)).ok()?;
        let (id, rest) = text.split_once('\n')?;
        let id: VersionId = id.parse().ok()?;
        (rest.trim_end_matches('\n') == key && self.store.contains(&id)).then_some(id)
    }

    /// The version a new content of `path` is stored on (see [`Repo::store_file`]).
    fn stored_before(&self, path: &RepoPath) -> Result<Option<VersionId>> {
        let lists = |id: &VersionId, path: &str| self.version(id).is_ok_and(|v| v.file(path).is_some());
        if let Some(id) = self.read_path_record(&format!("path:{path}")).filter(|id| lists(id, path.as_str())) {
            return Ok(Some(id));
        }
        let name = path.as_str().rsplit('/').next().unwrap_or(path.as_str());
        if let Some(id) = self.read_path_record(&format!("name:{name}")) {
            return Ok(Some(id));
        }
        self.refs.head_version()
    }

    /// Records `version` as the last to store `path` and a file of its name. Best effort: a
    /// record lost costs only a delta (the next content is then coded against `HEAD`'s file).
    fn write_path_records(&self, path: &str, version: &VersionId) {
        let name = path.rsplit('/').next().unwrap_or(path);
        for key in [format!("path:{path}"), format!("name:{name}")] {
            let file = self.path_record_file(&key);
            let Some(dir) = file.parent() else { continue };
            let _ = std::fs::create_dir_all(dir);
            let written = tempfile::Builder::new().prefix(".rec-").tempfile_in(dir).and_then(|mut tmp| {
                use std::io::Write;
                tmp.write_all(format!("{version}\n{key}\n").as_bytes())?;
                tmp.persist(&file).map_err(|e| e.error)?;
                Ok(())
            });
            let _ = written;
        }
    }

    /// After a gc replaced the branch by `root`: every record now names `root` for the paths
    /// and file names it lists; the others are removed.
    pub(super) fn reset_path_records(&self, root: &VersionId, version: &super::Version) -> Result<()> {
        let dir = self.dir.join(PATH_RECORDS);
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { action: "reading", path: dir, source }),
        }
        for f in &version.files {
            self.write_path_records(&f.path, root);
        }
        Ok(())
    }

    /// The path records: (path, version) for each `path:` record whose version is in the store.
    pub(super) fn path_records(&self) -> Result<Vec<(String, VersionId)>> {
        let dir = self.dir.join(PATH_RECORDS);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Io { action: "reading", path: dir, source }),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
            let Some((id, key)) = text.split_once('\n') else { continue };
            let Some(path) = key.trim_end_matches('\n').strip_prefix("path:") else { continue };
            if let Some(id) = self.read_path_record(&format!("path:{path}")).filter(|r| r.to_hex() == id) {
                out.push((path.to_string(), id));
            }
        }
        out.sort();
        Ok(out)
    }
}

impl Repo {
    /// Copies the objects of the file whose manifest is `manifest` from `other` (the manifest,
    /// and every object of each segment's delta chain) into this repository's store; returns
    /// how many were copied. Used when a clone smudges from its origin's store, so the clone
    /// keeps working without it. Each object is checked against its id before it lands, as a
    /// download is (bases first, the manifest last): a damaged copy in `other` is an error
    /// naming it, and nothing of it is stored.
    pub(crate) fn copy_file_objects_from(&self, other: &Repo, manifest: &ObjectId) -> Result<usize> {
        let needed = other.file_objects(&[*manifest])?;
        let mut copied = 0;
        for n in &needed {
            if self.store.contains(&n.id) {
                continue;
            }
            let from = other.store.object_path(&n.id);
            let tmp = self.store.temp_file()?;
            let copy = std::fs::File::open(&from).and_then(|mut f| std::io::copy(&mut f, &mut tmp.as_file()));
            copy.map_err(|source| Error::Io { action: "copying an object from", path: from.clone(), source })?;
            let written = self.store.import(&n.id, Some(n.kind), tmp)?;
            self.index_object(&written);
            copied += 1;
        }
        self.flush_index();
        Ok(copied)
    }
}

/// The manifest the store would hold for the file at `disk`, computed without storing anything
/// (one hash pass): its segments, tensors and blob ids.
pub fn manifest_of_file(disk: &Path) -> Result<Manifest> {
    let path = RepoPath::parse("file").expect("a valid path");
    Ok(Input::open(disk, path, Rules::AnyContent, None)?.manifest())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors;
    use crate::test_data;

    /// A safetensors file of two BF16 tensors (64 KiB and 16 KiB) of float-like values.
    fn checkpoint(seed: u64) -> Vec<u8> {
        let tensors = vec![
            ("w".to_string(), crate::Dtype::Bf16, vec![128, 256]),
            ("b".to_string(), crate::Dtype::Bf16, vec![8192]),
        ];
        let mut bytes = safetensors::write_header(&tensors, None).unwrap();
        // BF16 values near 1: a narrow exponent, random mantissas.
        for r in test_data::xorshift(seed).take(128 * 256 + 8192) {
            bytes.extend_from_slice(&[(r >> 8) as u8, 0x3f ^ ((r & 1) as u8)]);
        }
        bytes
    }

    /// `bytes` with every 64th element's low byte changed (a training step).
    fn perturbed(bytes: &[u8], seed: u64) -> Vec<u8> {
        let mut out = bytes.to_vec();
        let start = out.len() - (128 * 256 + 8192) * 2;
        for (i, r) in (start..out.len()).step_by(128).zip(test_data::xorshift(seed)) {
            out[i] ^= (r as u8) | 1;
        }
        out
    }

    #[test]
    fn store_file_writes_the_manifest_commit_writes_and_dedups_without_a_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = Repo::init(&dir.path().join("store")).unwrap();
        let plain = Repo::init(&dir.path().join("plain")).unwrap();
        let bytes = checkpoint(1);
        std::fs::write(dir.path().join("plain/m.safetensors"), &bytes).unwrap();
        let v = plain.commit(&["m.safetensors"], "m", &CommitOptions::default()).unwrap();
        let expected = plain.version(&v).unwrap().files[0].clone();

        let spool = dir.path().join("spooled");
        std::fs::write(&spool, &bytes).unwrap();
        let path = RepoPath::parse("models/m.safetensors").unwrap();
        let first = store.store_file(&spool, &path, "clean", &CommitOptions::default()).unwrap();
        assert_eq!((first.manifest, first.hash, first.len), (expected.manifest, expected.hash, expected.len));
        assert!(first.version.is_some());
        let objects = store.store().list().unwrap().len();

        // The same content again: no version, no object.
        let again = store.store_file(&spool, &path, "clean", &CommitOptions::default()).unwrap();
        assert_eq!(again.version, None);
        assert_eq!(again.manifest, first.manifest);
        assert_eq!(store.store().list().unwrap().len(), objects);
        assert_eq!(store.log("HEAD").unwrap().len(), 1);

        // Written back bit-exactly; a wrong hash fails and leaves no file.
        let out = dir.path().join("out.safetensors");
        store.write_stored_file(&first.manifest, first.len, &first.hash, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), bytes);
        let bad = dir.path().join("bad.safetensors");
        assert!(store.write_stored_file(&first.manifest, first.len, &ObjectId::hash(b"x"), &bad).is_err());
        assert!(!bad.exists());
    }

    #[test]
    fn each_file_is_a_version_of_its_own_on_the_last_content_of_its_path_or_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = Repo::init(&dir.path().join("store")).unwrap();
        let spool = dir.path().join("spooled");
        let store_as = |path: &str, bytes: &[u8]| {
            std::fs::write(&spool, bytes).unwrap();
            let p = RepoPath::parse(path).unwrap();
            store.store_file(&spool, &p, "clean", &CommitOptions::default()).unwrap().version.expect(path)
        };
        let a = checkpoint(1);
        let v1 = store_as("a/m.safetensors", &a);
        let v2 = store_as("b.bin", b"other content");
        let v3 = store_as("a/m.safetensors", &perturbed(&a, 2));
        // A new path of the same file name follows the last file of that name.
        let v4 = store_as("c/m.safetensors", &perturbed(&perturbed(&a, 2), 7));
        let version = |id| store.version(&id).unwrap();
        for (v, parents, path) in [
            (v1, vec![], "a/m.safetensors"),
            (v2, vec![v1], "b.bin"),
            (v3, vec![v1, v2], "a/m.safetensors"),
            (v4, vec![v3], "c/m.safetensors"),
        ] {
            let got = version(v);
            assert_eq!(got.parents, parents, "{path}");
            assert_eq!(got.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), [path]);
        }
        assert_eq!(store.head_version().unwrap(), Some(v4));
        // Both older contents of the name became deltas against the newer ones.
        for older in [v1, v3] {
            let m = store.manifest(&version(older).files[0].manifest).unwrap();
            assert!(m.blobs().any(|b| store.store().header(&b).unwrap().reference.is_some()));
        }
        // A record naming a version that is gone is ignored (the tip is used).
        let records = store.ckpt_dir().join(PATH_RECORDS);
        for e in std::fs::read_dir(&records).unwrap() {
            std::fs::write(e.unwrap().path(), format!("{}\npath:a/m.safetensors\n", ObjectId::hash(b"gone"))).unwrap();
        }
        let v5 = store_as("a/m.safetensors", &perturbed(&perturbed(&a, 2), 11));
        assert_eq!(version(v5).parents, vec![v4]);
        let report = store.verify().unwrap();
        assert!(report.is_ok(), "verify: {report:?}");
    }

    #[test]
    fn the_next_content_of_a_path_is_a_delta_target() {
        let dir = tempfile::tempdir().unwrap();
        let store = Repo::init(dir.path()).unwrap();
        let path = RepoPath::parse("m.safetensors").unwrap();
        let spool = dir.path().join("spooled");
        let a = checkpoint(1);
        std::fs::write(&spool, &a).unwrap();
        let first = store.store_file(&spool, &path, "a", &CommitOptions::default()).unwrap();
        let b = perturbed(&a, 2);
        std::fs::write(&spool, &b).unwrap();
        let second = store.store_file(&spool, &path, "b", &CommitOptions::default()).unwrap();
        // Reverse deltas, inline by default: the first content's tensors now reference the second's.
        let m = store.manifest(&first.manifest).unwrap();
        let deltas = m.blobs().filter(|b| store.store().header(b).is_ok_and(|h| h.reference.is_some())).count();
        assert!(deltas > 0, "no tensor of the older content became a delta");
        for (s, bytes) in [(&first, &a), (&second, &b)] {
            let out = dir.path().join("out");
            store.write_stored_file(&s.manifest, s.len, &s.hash, &out).unwrap();
            assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        }
    }
}
