//! Moving single objects down: downloads into a temp file (the store's, or a fetch's staging
//! directory), bounded by the object's header; retries, and the thread pool the transfers run
//! on.

use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::Repo;
use crate::store::{ObjectHeader, HEADER_LEN};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Largest object a fetch accepts (a blob is at most a whole tensor, plus its container): the
/// cap before the object's header is in, which then caps it to what it states
/// ([`ObjectHeader::max_stored_len`]).
pub(super) const MAX_OBJECT_LEN: u64 = 1 << 40;

/// Attempts at an object upload or download (the backend's own retries come first; these
/// cover what it does not retry, such as a connection dropped in the middle of a PUT).
pub(super) const OBJECT_ATTEMPTS: u32 = 4;

/// Runs `f` until it succeeds, up to [`OBJECT_ATTEMPTS`] times, backing off (0.2, 0.4, 0.8 s)
/// after a transport or server error. Safe for objects only: an object key's content is fixed
/// by its id, so a repeated upload is create-if-absent (finding the first one's bytes there
/// is success) and a repeated download starts a fresh temp file.
pub(super) fn with_retries<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match f() {
            Err(Error::Remote(remote::Error::Backend { .. })) if attempt < OBJECT_ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(100 << attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Runs `work` on every item with `transfers` threads; the first error stops the others from
/// taking new items and is returned.
pub(super) fn parallel<T: Sync>(items: &[T], transfers: usize, work: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let next = AtomicUsize::new(0);
    let error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..transfers.clamp(1, items.len().max(1)) {
            scope.spawn(|| loop {
                if error.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                if let Err(e) = work(item) {
                    error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    break;
                }
            });
        }
    });
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Where a fetch downloads, without the writer lock: `.ckpt/incoming/fetch-XXXX/`, a
/// directory of its own that gc and `clean_tmp` do not know about (so they cannot delete what
/// is arriving), on the store's file system (so a verified object is stored by a rename).
/// A lock file inside tells a live fetch's directory from one left by a killed fetch, which
/// the next fetch deletes. Dropped: the directory and what is left in it are deleted.
pub(super) struct Staging {
    _lock: std::fs::File,
    dir: tempfile::TempDir,
}

impl Staging {
    pub(super) fn create(ckpt_dir: &Path) -> Result<Staging> {
        sweep_kept(ckpt_dir);
        let incoming = ckpt_dir.join(INCOMING_DIR);
        std::fs::create_dir_all(&incoming).map_err(|e| Error::Io {
            action: "creating",
            path: incoming.clone(),
            source: e,
        })?;
        // Directories of fetches that died: their lock file is not held.
        if let Ok(entries) = std::fs::read_dir(&incoming) {
            for entry in entries.flatten() {
                let path = entry.path();
                // A lock file that is not held; or none at all a minute after the directory
                // was made (a fetch creates it right after its directory).
                let abandoned = match std::fs::File::open(path.join("lock")) {
                    Ok(f) => f.try_lock().is_ok(),
                    Err(_) => entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > std::time::Duration::from_secs(60)),
                };
                if abandoned && path.is_dir() {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        let dir = tempfile::Builder::new().prefix("fetch-").tempdir_in(&incoming).map_err(|e| Error::Io {
            action: "creating a directory in",
            path: incoming.clone(),
            source: e,
        })?;
        let lock_path = dir.path().join("lock");
        let lock = std::fs::File::create(&lock_path).and_then(|f| f.lock().map(|()| f)).map_err(|e| Error::Io {
            action: "locking",
            path: lock_path,
            source: e,
        })?;
        Ok(Staging { _lock: lock, dir })
    }

    /// The directory downloads go to.
    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Staging directories of all fetches.
const INCOMING_DIR: &str = "incoming";

/// Downloads one object into a temp file of the store (not stored yet).
pub(super) fn receive(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
) -> Result<tempfile::TempPath> {
    with_retries(|| download_to(repo, remote, id, received, &|| Ok(repo.store().receive_file()?)))
}

/// Downloads one object into a new temp file made by `new_tmp` (resuming what a killed
/// download kept: [`download_kept`]), adds its size to `received` (and the progress, resumed
/// bytes included), and keeps only the file's name: a fetch may hold thousands of received
/// objects at once.
fn download_to(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
    new_tmp: &dyn Fn() -> Result<tempfile::NamedTempFile>,
) -> Result<tempfile::TempPath> {
    let (path, n) = download_kept(repo, remote, id, new_tmp)?;
    received.fetch_add(n, Ordering::Relaxed);
    repo.progress().set(received.load(Ordering::Relaxed));
    Ok(path)
}

/// Where downloads keep what arrived and uploads their state: `.ckpt/transfers/`
/// (docs/format.md, "Transfer state").
pub(super) const TRANSFERS_DIR: &str = "transfers";

/// A kept download prefix untouched this long is removed by the next fetch.
const KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Downloads object `id` through `.ckpt/transfers/down-<64 hex>`, which keeps what arrived if
/// this process is killed: a download that finds such a prefix (and its lock free) asks the
/// remote only for the bytes after it. The object then moves into a temp file made by
/// `new_tmp`. A resumed object is checked against its id at once where it can be (a
/// standalone blob, a delta whose reference is here, a manifest or version): one that does
/// not match is downloaded again whole, once. Never trusted otherwise either: the store
/// checks every object before keeping it. Returns the temp file and the object's length.
fn download_kept(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    new_tmp: &dyn Fn() -> Result<tempfile::NamedTempFile>,
) -> Result<(tempfile::TempPath, u64)> {
    let dir = repo.ckpt_dir().join(TRANSFERS_DIR);
    let kept_path = dir.join(format!("down-{}", id.to_hex()));
    let locked = std::fs::create_dir_all(&dir).and_then(|()| crate::remote::upload_state::try_lock_path(&kept_path));
    let Ok(Some(kept)) = locked else {
        // Another process downloads it now (or the directory is unusable): a download of
        // our own, not kept.
        let tmp = new_tmp()?;
        let n = download_object(remote, id, tmp.as_file(), tmp.path(), 0)?;
        return Ok((tmp.into_temp_path(), n));
    };
    let io = |action| {
        let path = kept_path.clone();
        move |source| Error::Io { action, path, source }
    };
    let have = kept.metadata().map_err(io("reading"))?.len();
    let len = match download_object(remote, id, &kept, &kept_path, have) {
        Ok(len) => len,
        // A prefix the remote's object does not continue (shorter, or what it holds is not
        // the start of this object): dropped, and the object downloaded whole.
        Err(Error::Store(_) | Error::Remote(remote::Error::Shorter { .. } | remote::Error::TooLarge { .. }))
            if have > 0 =>
        {
            kept.set_len(0).map_err(io("truncating"))?;
            download_object(remote, id, &kept, &kept_path, 0)?
        }
        Err(e @ (Error::Store(_) | Error::Remote(remote::Error::TooLarge { .. }))) => {
            // Nothing of it is worth keeping.
            let _ = std::fs::remove_file(&kept_path);
            return Err(e);
        }
        // Kept for the retry or the rerun.
        Err(e) => return Err(e),
    };
    let tmp = new_tmp()?;
    std::fs::rename(&kept_path, tmp.path()).map_err(io("moving"))?;
    drop(kept);
    let tmp = reopen(tmp.into_temp_path())?;
    if have == 0 || prefix_matches(repo, id, &tmp) {
        return Ok((tmp.into_temp_path(), len));
    }
    drop(tmp);
    let tmp = new_tmp()?;
    let n = download_object(remote, id, tmp.as_file(), tmp.path(), 0)?;
    Ok((tmp.into_temp_path(), n))
}

/// Whether the resumed object at `path` is object `id`, as far as it can be told now: decoded
/// and hashed if it needs nothing that is not here (a delta whose reference is still to come
/// is checked when stored, like every object).
fn prefix_matches(repo: &Repo, id: &ObjectId, tmp: &tempfile::NamedTempFile) -> bool {
    let checked = match repo.store().received_header(id, tmp) {
        Ok(h) if h.reference.is_some_and(|r| !repo.store().contains(&r)) => Ok(h),
        Ok(_) => repo.store().check_received(id, None, tmp),
        Err(e) => Err(e),
    };
    !matches!(checked, Err(e) if !matches!(e, crate::store::Error::Missing { .. }))
}

/// Removes the kept download prefixes in `ckpt_dir`'s transfers directory that nobody
/// touched for [`KEPT_FOR`] (and that no download holds).
pub(super) fn sweep_kept(ckpt_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(ckpt_dir.join(TRANSFERS_DIR)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if name.to_str().is_some_and(|n| n.starts_with("down-")) && old.is_some_and(|age| age > KEPT_FOR) {
            if let Ok(Some(_held)) = crate::remote::upload_state::try_lock_path(&entry.path()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Downloads object `id` into `file` (`path` names it), which holds its first `have` bytes
/// already (a kept prefix; 0: an empty file): at most what its header states
/// ([`ObjectHeader::max_stored_len`]; a manifest or version no longer than the store reads,
/// [`ObjectHeader::check_data_len`]), checked as the first bytes arrive, so that an object padded
/// behind its container, or a header claiming more than the store would read, stops the
/// transfer there instead of filling the disk. Returns the object's length.
pub(super) fn download_object(
    remote: &dyn Remote,
    id: &ObjectId,
    file: &std::fs::File,
    path: &Path,
    have: u64,
) -> Result<u64> {
    let io = |action| move |source| Error::Io { action, path: path.into(), source };
    use std::io::{Read, Seek};
    let mut head = Vec::with_capacity(HEADER_LEN);
    let mut reader = file;
    if have > 0 {
        reader.seek(std::io::SeekFrom::Start(0)).map_err(io("reading"))?;
        reader.take(HEADER_LEN.min(have as usize) as u64).read_to_end(&mut head).map_err(io("reading"))?;
    }
    // Also for 0: a file truncated after a bad prefix is written from its start.
    reader.seek(std::io::SeekFrom::Start(have)).map_err(io("reading"))?;
    let mut out = Capped {
        out: std::io::BufWriter::with_capacity(1 << 20, file),
        id: *id,
        remote: remote.url(),
        head: Vec::new(),
        limit: MAX_OBJECT_LEN,
        written: 0,
        refused: None,
    };
    // The kept prefix goes through the same checks as arriving bytes, without being written.
    if out.admit(&head).is_err() || have > out.limit {
        let reason = format!("the {have} bytes kept of it in {} are not the start of an object", path.display());
        return Err(out.refused.take().unwrap_or(crate::store::Error::Corrupt { id: *id, reason }).into());
    }
    out.written = have;
    let key = remote::object_key(id);
    let result = remote.download_from(&key, have, &mut out, MAX_OBJECT_LEN);
    if let Some(refused) = out.refused.take() {
        // The download stopped because the writer refused: that is the error, not how the
        // remote reported the stop.
        return Err(refused.into());
    }
    let n = result?;
    std::io::Write::flush(&mut out.out).map_err(io("writing"))?;
    Ok(have + n)
}

/// What an object download writes through: once the object's header is in, at most the length
/// it allows; anything more, or a header that does not decode, makes writing fail (which stops
/// the download) with the reason kept in `refused`.
struct Capped<'a, W> {
    out: W,
    id: ObjectId,
    /// The remote's URL (for the message).
    remote: &'a str,
    /// The header's bytes, until they are all in.
    head: Vec<u8>,
    /// The most bytes the object may take ([`MAX_OBJECT_LEN`] until the header is in).
    limit: u64,
    written: u64,
    refused: Option<crate::store::Error>,
}

impl<W: std::io::Write> Capped<'_, W> {
    fn refuse(&mut self, error: crate::store::Error) -> std::io::Error {
        let e = std::io::Error::other(error.to_string());
        self.refused = Some(error);
        e
    }
}

impl<W: std::io::Write> Capped<'_, W> {
    /// Checks that `buf` may come next (the header, once in, decodes; the length stays within
    /// what it allows) and counts it, without writing it.
    fn admit(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if self.refused.is_some() {
            return Err(std::io::Error::other("refused"));
        }
        if self.head.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.head.len()).min(buf.len());
            self.head.extend_from_slice(&buf[..take]);
            if self.head.len() == HEADER_LEN {
                let header = match ObjectHeader::decode(self.id, &self.head).and_then(|h| {
                    h.check_data_len(&self.id)?;
                    Ok(h)
                }) {
                    Ok(h) => h,
                    Err(e) => return Err(self.refuse(e)),
                };
                self.limit = header.max_stored_len();
            }
        }
        if self.written + buf.len() as u64 > self.limit {
            let reason = format!(
                "longer on remote {} than its header allows (more than {} bytes): damaged or padded there",
                self.remote, self.limit
            );
            return Err(self.refuse(crate::store::Error::Corrupt { id: self.id, reason }));
        }
        self.written += buf.len() as u64;
        Ok(())
    }
}

impl<W: std::io::Write> std::io::Write for Capped<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.admit(buf)?;
        self.out.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

pub(super) fn reopen(path: tempfile::TempPath) -> Result<tempfile::NamedTempFile> {
    let file =
        std::fs::File::open(&path).map_err(|e| Error::Io { action: "opening", path: path.to_path_buf(), source: e })?;
    Ok(tempfile::NamedTempFile::from_parts(file, path))
}

/// Downloads one object into a new file in `dir` (a fetch's staging directory).
pub(super) fn receive_into(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
    dir: &Path,
) -> Result<tempfile::TempPath> {
    let new_tmp = || {
        tempfile::Builder::new().prefix("obj-").tempfile_in(dir).map_err(|e| Error::Io {
            action: "creating a file in",
            path: dir.into(),
            source: e,
        })
    };
    with_retries(|| download_to(repo, remote, id, received, &new_tmp))
}

#[cfg(test)]
mod tests {
    use crate::store::{ObjectKind, Store};

    /// The cap of a download ([`ObjectHeader::max_stored_len`]) never refuses an object the
    /// store writes: its worst case (every group raw, the smallest chunks, the widest and the
    /// narrowest elements, empty and odd lengths) stays under it, and not far.
    #[test]
    fn no_object_the_store_writes_is_longer_than_its_header_allows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path()).unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = |len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        let cases = [
            (0, None),
            (1, None),
            (4095, None),
            (4097, None),
            (3 * 4096 + 8, Some(crate::Dtype::F64)),
            (40_000, Some(crate::Dtype::Bf16)),
        ];
        for (len, dtype) in cases {
            let unsynced = store.write_blob_uncoded(&noise(len), dtype, 4096).unwrap();
            let written = store.persist_unsynced(unsynced).unwrap();
            let cap = written.header.max_stored_len();
            assert!(written.stored_len <= cap, "{len} bytes of {dtype:?}: {} > {cap}", written.stored_len);
            assert!(cap - written.stored_len <= 256 + len as u64 / 16, "{len} bytes: cap {cap} is loose");
        }
        let options = crate::codec::Options { chunk_size: 4096, ..Default::default() };
        for len in [0, 1, 10_000] {
            let written = store.write_data(ObjectKind::Version, &noise(len), &options).unwrap();
            assert!(written.stored_len <= written.header.max_stored_len(), "a version of {len} bytes");
        }
    }
}
