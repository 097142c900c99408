//! The local state of a resumable multipart upload (docs/format.md, "Transfer state"): which
//! upload on the remote is sending which object, and the parts that arrived, so that a push
//! killed part way resumes that upload from those parts instead of sending the object again.
//! One JSON file per upload, `up-<32 hex>.json` in the repository's `.ckpt/transfers/`,
//! replaced atomically (temp file, fsync, rename) after each part; an exclusive lock on
//! `up-<32 hex>.lock` beside it keeps two processes from driving the same upload.
//!
//! The file is local and untrusted all the same (a crash, a hand edit, a copy from another
//! machine): it is read with a size cap and checked against what is being uploaded before any of
//! it is used, and each part it names is checked against the bytes being uploaded now (by
//! blake3), so a part of another version of the file is never kept. This module knows files and
//! bytes; what to do with the remote (resume, abort, start over) is `s3.rs`'s.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Format number written as `"format"`; another number is not resumed.
pub(crate) const FORMAT: u32 = 1;

/// Largest state file read: 10,000 parts of ~200 bytes each, and room.
pub(crate) const MAX_STATE_LEN: u64 = 4 << 20;

/// Most parts an upload may have (S3's limit).
pub(crate) const MAX_PARTS: u64 = 10_000;

/// Longest upload id or part ETag accepted from a state file (S3's are under 200 characters).
const MAX_ID_LEN: usize = 1024;

/// A state file untouched this long belongs to an upload nobody resumed: `sweep` aborts it
/// (S3's usual lifecycle rule for incomplete uploads is 7 days too).
pub(crate) const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// One part that arrived.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PartDone {
    /// 0-based index: the part holds bytes `index * part_size ..` of the object.
    pub index: u64,
    /// Its length in bytes.
    pub size: u64,
    /// What the remote answered for it (S3: the part's ETag), needed to complete the upload.
    pub etag: String,
    /// blake3 of the part's bytes as sent, in hex: a part is kept only if the object's bytes
    /// there still hash to it.
    pub blake3: String,
}

/// The state of one multipart upload.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UploadState {
    /// [`FORMAT`].
    pub format: u32,
    /// The remote's URL, without credentials.
    pub remote: String,
    /// The key uploaded (`objects/ab/<62 hex>`: it names the local object's id).
    pub key: String,
    /// The object's length in bytes.
    pub len: u64,
    /// The part size: every part but the last has this length.
    pub part_size: u64,
    /// The remote's id of the multipart upload.
    pub upload_id: String,
    /// Parts that arrived, in the order they did.
    pub parts: Vec<PartDone>,
}

/// What a state file says about the upload of an object now.
#[derive(Debug)]
pub(crate) enum Prior {
    /// No state file: nothing to resume.
    None,
    /// A state that describes this upload: resume it (its parts still to be checked against
    /// the bytes).
    Resume(UploadState),
    /// A state of this key that cannot be resumed (another length or part size, a local
    /// object that changed): its upload is to be aborted, then this one starts over.
    Abort { upload_id: String },
    /// A file that does not parse or names something else: nothing on the remote can be
    /// trusted to be its upload; it is removed and the upload starts over.
    Unreadable,
}

impl UploadState {
    /// The number of parts of an object of `len` bytes in parts of `part_size`.
    pub(crate) fn part_count(len: u64, part_size: u64) -> u64 {
        len.div_ceil(part_size.max(1))
    }

    /// The byte range of part `index`.
    pub(crate) fn part_range(&self, index: u64) -> std::ops::Range<u64> {
        let start = index.saturating_mul(self.part_size).min(self.len);
        start..start.saturating_add(self.part_size).min(self.len)
    }

    /// Whether this state, read from a file, describes the upload of `len` bytes under `key`
    /// on `remote` in parts of `part_size`: `Err` says why not. Every part must lie within the
    /// object with its expected size, once; ids and ETags be short printable ASCII.
    fn check(&self, remote: &str, key: &str, len: u64, part_size: u64) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!("format {} (this ckpt writes {FORMAT})", self.format));
        }
        if self.len != len || self.part_size != part_size {
            return Err(format!(
                "it uploads {} bytes in parts of {}, the object now has {len} in parts of {part_size}",
                self.len, self.part_size
            ));
        }
        let count = Self::part_count(len, part_size);
        if count > MAX_PARTS {
            return Err(format!("{count} parts, more than {MAX_PARTS}"));
        }
        let mut seen = std::collections::HashSet::new();
        for part in &self.parts {
            if part.index >= count || !seen.insert(part.index) {
                return Err(format!("part {} is out of range or named twice", part.index));
            }
            let range = self.part_range(part.index);
            if part.size != range.end - range.start {
                return Err(format!(
                    "part {} has {} bytes, expected {}",
                    part.index,
                    part.size,
                    range.end - range.start
                ));
            }
            if !printable_id(&part.etag)
                || part.blake3.len() != 64
                || !part.blake3.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(format!("part {} has an invalid ETag or hash", part.index));
            }
        }
        // Checked last: the caller aborts an upload of this key only once the rest holds.
        if self.remote != remote || self.key != key {
            return Err("it names another remote or key".into());
        }
        Ok(())
    }
}

/// Whether `id` (an upload id or an ETag) is 1 to [`MAX_ID_LEN`] printable ASCII characters:
/// it goes into a request's query string or body.
fn printable_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The state file of the upload of `key` to `remote` in `dir`: `up-<32 hex>.json`, named by
/// the first 16 bytes of blake3 of `remote`, a newline and `key`.
pub(crate) fn state_path(dir: &Path, remote: &str, key: &str) -> PathBuf {
    let mut hasher = blake3::Hasher::new();
    hasher.update(remote.as_bytes());
    hasher.update(b"\n");
    hasher.update(key.as_bytes());
    let hex = hasher.finalize().to_hex();
    dir.join(format!("up-{}.json", &hex[..32]))
}

/// Reads the state at `path` for the upload of `len` bytes under `key` to `remote` in parts of
/// `part_size` (see [`Prior`]); an I/O error other than a missing file is `Unreadable` too.
pub(crate) fn read_prior(path: &Path, remote: &str, key: &str, len: u64, part_size: u64) -> Prior {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(f) => {
            if f.take(MAX_STATE_LEN + 1).read_to_end(&mut bytes).is_err() {
                return Prior::Unreadable;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Prior::None,
        Err(_) => return Prior::Unreadable,
    }
    if bytes.len() as u64 > MAX_STATE_LEN {
        return Prior::Unreadable;
    }
    let Ok(state) = serde_json::from_slice::<UploadState>(&bytes) else { return Prior::Unreadable };
    if state.key != key || state.remote != remote || !printable_id(&state.upload_id) {
        return Prior::Unreadable;
    }
    match state.check(remote, key, len, part_size) {
        Ok(()) => Prior::Resume(state),
        Err(_) => Prior::Abort { upload_id: state.upload_id },
    }
}

/// Writes `state` to `path` atomically: a temp file beside it, fsynced, renamed over it. A
/// reader (the next push) sees the old state or the new one, never a mix.
pub(crate) fn write_state(path: &Path, state: &UploadState) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".up-").tempfile_in(dir)?;
    let mut text = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    text.push(b'\n');
    tmp.write_all(&text)?;
    tmp.as_file().sync_data()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// An exclusive lock on `path` (created if missing), or `None` while another process or
/// thread holds it. The lock is taken on the file the path names at the moment it is held: one
/// removed or replaced meanwhile (its holder finished) is opened again.
pub(crate) fn try_lock_path(path: &Path) -> std::io::Result<Option<File>> {
    loop {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        if same_file(&file, path) {
            return Ok(Some(file));
        }
    }
}

/// Whether `path` still names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The lock file of the state at `state`: `up-<32 hex>.lock`.
pub(crate) fn lock_path(state: &Path) -> PathBuf {
    state.with_extension("lock")
}

/// Removes the state at `state` and then its lock file (held by the caller as `lock`).
pub(crate) fn remove(state: &Path, lock: File) {
    let _ = std::fs::remove_file(state);
    let _ = std::fs::remove_file(lock_path(state));
    drop(lock);
}

/// State files in `dir` of uploads to `remote` untouched for [`ABANDONED_AFTER`] and not
/// locked, each with its lock held: the caller aborts their uploads and [`remove`]s them.
/// Files that do not parse are removed here (nothing to abort).
pub(crate) fn abandoned(dir: &Path, remote: &str) -> Vec<(PathBuf, UploadState, File)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_state =
            path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("up-") && n.ends_with(".json"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a > ABANDONED_AFTER);
        if !is_state || !old {
            continue;
        }
        let Ok(Some(lock)) = try_lock_path(&lock_path(&path)) else { continue };
        let bytes = File::open(&path).and_then(|f| {
            let mut b = Vec::new();
            f.take(MAX_STATE_LEN + 1).read_to_end(&mut b).map(|_| b)
        });
        match bytes.ok().and_then(|b| serde_json::from_slice::<UploadState>(&b).ok()) {
            Some(state) if state.remote == remote && printable_id(&state.upload_id) => found.push((path, state, lock)),
            Some(_) => {} // another remote's: its own pushes sweep it
            None => remove(&path, lock),
        }
    }
    found
}

/// blake3 of `bytes` in hex.
pub(crate) fn hash_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> UploadState {
        UploadState {
            format: FORMAT,
            remote: "s3://b/p".into(),
            key: "objects/ab/cd".into(),
            len: 25,
            part_size: 10,
            upload_id: "upload-1".into(),
            parts: vec![
                PartDone { index: 2, size: 5, etag: "\"e2\"".into(), blake3: "0".repeat(64) },
                PartDone { index: 0, size: 10, etag: "\"e0\"".into(), blake3: "a".repeat(64) },
            ],
        }
    }

    #[test]
    fn a_written_state_reads_back_as_resumable() {
        let dir = tempfile::tempdir().unwrap();
        let path = state_path(dir.path(), "s3://b/p", "objects/ab/cd");
        write_state(&path, &state()).unwrap();
        match read_prior(&path, "s3://b/p", "objects/ab/cd", 25, 10) {
            Prior::Resume(s) => assert_eq!(s, state()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_prior(&dir.path().join("none"), "s3://b/p", "k", 1, 1), Prior::None));
    }

    #[test]
    fn another_length_is_aborted_and_garbage_is_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up-x.json");
        write_state(&path, &state()).unwrap();
        match read_prior(&path, "s3://b/p", "objects/ab/cd", 26, 10) {
            Prior::Abort { upload_id, .. } => assert_eq!(upload_id, "upload-1"),
            other => panic!("{other:?}"),
        }
        // Another key: its upload is not this key's to abort.
        assert!(matches!(read_prior(&path, "s3://b/p", "objects/ab/ef", 25, 10), Prior::Unreadable));
        let hostile = [
            b"\x00\xff garbage".to_vec(),
            b"{}".to_vec(),
            serde_json::to_vec(&UploadState { upload_id: "a\nb".into(), ..state() }).unwrap(),
            vec![b' '; (MAX_STATE_LEN + 1) as usize],
        ];
        for bytes in hostile {
            std::fs::write(&path, &bytes).unwrap();
            assert!(matches!(read_prior(&path, "s3://b/p", "objects/ab/cd", 25, 10), Prior::Unreadable));
        }
        let bad_parts = [
            PartDone { index: 3, size: 5, etag: "e".into(), blake3: "0".repeat(64) },
            PartDone { index: 1, size: 9, etag: "e".into(), blake3: "0".repeat(64) },
            PartDone { index: 1, size: 10, etag: String::new(), blake3: "0".repeat(64) },
            PartDone { index: 1, size: 10, etag: "e".into(), blake3: "xyz".into() },
            PartDone { index: 0, size: 10, etag: "e".into(), blake3: "0".repeat(64) },
        ];
        for part in bad_parts {
            let mut s = state();
            s.parts.push(part.clone());
            write_state(&path, &s).unwrap();
            let prior = read_prior(&path, "s3://b/p", "objects/ab/cd", 25, 10);
            assert!(matches!(prior, Prior::Abort { .. }), "{part:?}: {prior:?}");
        }
    }

    #[test]
    fn a_held_lock_is_refused_and_a_replaced_file_relocked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up-x.lock");
        let held = try_lock_path(&path).unwrap().expect("free");
        assert!(try_lock_path(&path).unwrap().is_none());
        std::fs::remove_file(&path).unwrap();
        // The holder removed it: a new file is a new lock.
        assert!(try_lock_path(&path).unwrap().is_some());
        drop(held);
    }

    #[test]
    fn part_ranges_cover_the_object() {
        let s = state();
        assert_eq!(UploadState::part_count(25, 10), 3);
        assert_eq!([s.part_range(0), s.part_range(1), s.part_range(2)], [0..10, 10..20, 20..25]);
        assert_eq!(UploadState::part_count(0, 10), 0);
    }
}
