//! A remote in a local directory (a shared disk, NFS, tests). Objects appear atomically and
//! only if absent: written to `tmp/`, fsynced, then hard-linked to their key (`link` fails if
//! the key exists, so a second writer never replaces an object) and the temp name removed.
//! Small files (refs) are compared and swapped under an exclusive lock on `refs.lock`, then
//! replaced by temp file + fsync + rename; their tag is their content.
//!
//! Every key is a regular file of its own: a read of anything else (a directory, a symbolic
//! link, a named pipe, a socket, a device) is an error naming it, found by its type before it
//! is read, so that a pipe cannot block and `/dev/zero` cannot stream forever. A listing shows
//! such entries (and empty directories other than the layout's own) as keys, so that a ref that
//! is one is an error when it is read, never a ref that silently is not there. Every read runs
//! on a thread of its own and is abandoned when it makes no progress for the stall timeout
//! (`super::TIMEOUT_ENV`, as for S3): a hung network file system or a file lease
//! (`F_SETLEASE`) costs that long, not forever.

use super::{Error, Expect, Listed, Remote, Result, Small, UploadMode, Uploaded, MAX_KEY_LEN, MAX_REF_LEN};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Upload temp files in `tmp/` untouched this long are leftovers of a killed pusher (an upload
/// writes its temp file continuously and links or renames it within seconds of the last
/// write), removed when the remote is next opened. Nothing else would ever delete them.
const STALE_UPLOAD: Duration = Duration::from_secs(24 * 3600);

/// The directories every directory remote has: listed empty, they are no keys.
const LAYOUT_DIRS: [&str; 5] = ["objects", "refs", "refs/heads", "refs/tags", "tmp"];

/// Whether `rel` is a directory of the layout: one of [`LAYOUT_DIRS`] or a fan-out directory
/// `objects/ab` (which stays, empty, once gc deleted its objects).
fn is_layout_dir(rel: &str) -> bool {
    LAYOUT_DIRS.contains(&rel)
        || rel.strip_prefix("objects/").is_some_and(|fan| fan.len() == 2 && fan.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Bytes a download reads at a time (and hands from its reading thread to the writer).
const DOWNLOAD_CHUNK: usize = 1 << 20;

/// A remote in a directory.
#[derive(Debug)]
pub struct DirRemote {
    dir: Arc<Dir>,
    requests: AtomicU64,
}

/// What the threads reading a [`DirRemote`] share with it.
#[derive(Debug)]
struct Dir {
    url: String,
    root: PathBuf,
    /// How long a read may make no progress ([`super::TIMEOUT_ENV`]).
    stall: Duration,
}

impl Dir {
    fn io<'a>(&'a self, action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
        move |source| Error::Io { remote: self.url.clone(), action, path: path.to_path_buf(), source }
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        // Keys come from this crate (object and ref keys), but a listing could return anything:
        // never let one leave the root.
        if key.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(Error::BadUrl { url: self.url.clone(), reason: format!("invalid key {key:?}") });
        }
        Ok(self.root.join(key))
    }

    /// Opens the file of `key` for reading if it is a regular file ([`crate::mmap::open_regular_no_follow`]):
    /// `None` when there is nothing of that name, an error naming the path for anything else.
    /// A file another process holds a lease on (a Samba server sharing the directory) cannot be
    /// opened until the lease is given up: that is waited for, at most the stall timeout.
    fn open_key(&self, key: &str) -> Result<Option<(File, PathBuf)>> {
        let path = self.path(key)?;
        let start = std::time::Instant::now();
        loop {
            return match crate::mmap::open_regular_no_follow(&path) {
                Ok(f) => Ok(Some((f, path))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() < self.stall {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    Err(self.stalled("reading", &path))
                }
                Err(e) => Err(self.io("reading", &path)(e)),
            };
        }
    }

    /// [`Dir::open_key`], with no file an [`Error::NotFound`].
    fn open_existing(&self, key: &str) -> Result<(File, PathBuf)> {
        self.open_key(key)?.ok_or_else(|| Error::NotFound { remote: self.url.clone(), key: key.into() })
    }

    /// Whether `key` is a file, from its own metadata (a link is not followed): `None` when
    /// there is nothing of that name, an error when it is something else than a regular file.
    fn file_metadata(&self, key: &str) -> Result<Option<std::fs::Metadata>> {
        let path = self.path(key)?;
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => Ok(Some(m)),
            // What it is, in the words of the read that would fail.
            Ok(_) => Err(self.io("reading", &path)(
                crate::mmap::open_regular_no_follow(&path)
                    .err()
                    .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")),
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("checking", &path)(e)),
        }
    }

    /// The error of a read that made no progress for the stall timeout.
    fn stalled(&self, action: &'static str, path: &Path) -> Error {
        self.io(action, path)(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no progress for {:.1} s ({})", self.stall.as_secs_f64(), super::TIMEOUT_ENV),
        ))
    }

    /// The entries under `prefix` (module doc: files, other non-directories, and empty
    /// directories that are not the layout's); with `ages`, each one's mtime and size (an entry
    /// deleted between the directory read and its `stat`, by a push deleting its journal or a
    /// gc, is left out). `progress` counts the entries seen.
    fn walk(&self, prefix: &str, ages: bool, progress: &AtomicU64) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut seen = 0usize;
        let top = prefix.trim_end_matches('/').to_string();
        let mut stack = vec![top.clone()];
        let listed = |key: String, path: &Path, out: &mut Vec<Listed>| -> Result<()> {
            if !ages {
                out.push(Listed { key, modified: std::time::UNIX_EPOCH, size: 0 });
                return Ok(());
            }
            let meta = match std::fs::symlink_metadata(path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(self.io("listing", path)(e)),
            };
            let modified = meta.modified().map_err(self.io("listing", path))?;
            out.push(Listed { key, modified, size: meta.len() });
            Ok(())
        };
        while let Some(rel) = stack.pop() {
            let dir = self.path(&rel)?;
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.io("listing", &dir)(e)),
            };
            let mut empty = true;
            for entry in entries {
                let entry = entry.map_err(self.io("listing", &dir))?;
                empty = false;
                progress.fetch_add(1, Ordering::Relaxed);
                let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
                let key = format!("{rel}/{name}");
                let ty = entry.file_type().map_err(self.io("listing", &dir))?;
                super::count_listed(&mut seen, &self.url, prefix)?;
                if key.len() > MAX_KEY_LEN {
                    continue;
                }
                // A directory of the layout may be a link to one (put on another disk).
                if ty.is_dir() || (ty.is_symlink() && is_layout_dir(&key) && entry.path().is_dir()) {
                    stack.push(key);
                } else if !name.starts_with('.') {
                    listed(key, &entry.path(), &mut out)?;
                }
            }
            if empty && rel != top && !is_layout_dir(&rel) {
                listed(rel, &dir, &mut out)?;
            }
        }
        Ok(out)
    }
}

impl DirRemote {
    /// Runs `work` on a thread of its own and waits for its answer while `work` makes progress
    /// (bumps the counter it is given) at least once every stall timeout; else the error names
    /// `path` and the timeout, and the thread is left to finish on its own (a system call on a
    /// hung file system cannot be interrupted).
    fn bounded<T: Send + 'static>(
        &self,
        action: &'static str,
        path: &Path,
        work: impl FnOnce(&Dir, &AtomicU64) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        let progress = Arc::new(AtomicU64::new(0));
        let (dir, seen) = (self.dir.clone(), progress.clone());
        std::thread::spawn(move || {
            let _ = tx.send(work(&dir, &seen));
        });
        let mut last = 0;
        loop {
            match rx.recv_timeout(self.dir.stall) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let now = progress.load(Ordering::Relaxed);
                    if now == last {
                        return Err(self.dir.stalled(action, path));
                    }
                    last = now;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.dir.io(action, path)(std::io::Error::other("the reading thread panicked")))
                }
            }
        }
    }

    /// Copies the first `len` bytes of `file` (read from `path`) into a synced temporary file
    /// of this remote, and creates the directory of `target`: what a create-if-absent upload
    /// and a replacement share before they link or rename it into place.
    fn stage(&self, file: &File, path: &Path, len: u64, target: &Path) -> Result<(tempfile::NamedTempFile, PathBuf)> {
        let mut tmp = self.temp()?;
        let mut src = file.try_clone().map_err(self.io("opening", path))?;
        std::io::Seek::rewind(&mut src).map_err(self.io("reading", path))?;
        let copied = std::io::copy(&mut src.take(len), tmp.as_file_mut()).map_err(self.io("copying", path))?;
        if copied != len {
            return Err(Error::Io {
                remote: self.dir.url.clone(),
                action: "copying",
                path: path.to_path_buf(),
                source: std::io::Error::other(format!("{copied} bytes, expected {len}")),
            });
        }
        tmp.as_file().sync_all().map_err(self.io("syncing", tmp.path()))?;
        let dir = target.parent().expect("keys have a directory").to_path_buf();
        std::fs::create_dir_all(&dir).map_err(self.io("creating", &dir))?;
        Ok((tmp, dir))
    }

    /// Opens the directory named by `url`: a path or `file://` URL. It must exist (a typo in
    /// a clone's URL is an error, not an empty repository); [`DirRemote::create`] makes one.
    pub fn open(url: &str) -> Result<DirRemote> {
        let remote = DirRemote::at(url)?;
        if !remote.dir.root.is_dir() {
            return Err(Error::BadUrl { url: super::redact_url(url), reason: "no such directory".into() });
        }
        remote.make_dirs()?;
        Ok(remote)
    }

    /// Opens the directory named by `url`, creating it if missing.
    pub fn create(url: &str) -> Result<DirRemote> {
        let remote = DirRemote::at(url)?;
        remote.make_dirs()?;
        Ok(remote)
    }

    fn at(url: &str) -> Result<DirRemote> {
        let path = url.strip_prefix("file://").unwrap_or(url);
        if path.is_empty() {
            return Err(Error::BadUrl { url: super::redact_url(url), reason: "no directory".into() });
        }
        let dir = Dir { url: super::redact_url(url), root: PathBuf::from(path), stall: super::stall_timeout(url)? };
        Ok(DirRemote { dir: Arc::new(dir), requests: AtomicU64::new(0) })
    }

    fn make_dirs(&self) -> Result<()> {
        for d in ["objects", "refs/heads", "refs/tags", "tmp"] {
            let dir = self.dir.root.join(d);
            std::fs::create_dir_all(&dir).map_err(self.io("creating", &dir))?;
        }
        self.remove_stale_uploads();
        Ok(())
    }

    /// Deletes the upload temp files of killed pushers ([`STALE_UPLOAD`]). Best effort: a file
    /// that cannot be read or deleted stays.
    fn remove_stale_uploads(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.root.join("tmp")) else { return };
        for entry in entries.flatten() {
            let is_upload = entry.file_name().to_string_lossy().starts_with("up-");
            let age = entry.metadata().ok().filter(|m| m.is_file()).and_then(|m| m.modified().ok());
            if is_upload && age.and_then(|t| t.elapsed().ok()).is_some_and(|a| a >= STALE_UPLOAD) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn io<'a>(&'a self, action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
        self.dir.io(action, path)
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        self.dir.path(key)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn temp(&self) -> Result<tempfile::NamedTempFile> {
        let dir = self.dir.root.join("tmp");
        tempfile::Builder::new().prefix("up-").tempfile_in(&dir).map_err(self.io("creating a file in", &dir))
    }

    /// [`Dir::walk`] on a thread, bounded by the stall timeout.
    fn walk(&self, prefix: &str, ages: bool) -> Result<Vec<Listed>> {
        self.count();
        let path = self.dir.root.join(prefix);
        let prefix = prefix.to_string();
        self.bounded("listing", &path, move |dir, progress| dir.walk(&prefix, ages, progress))
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        File::open(dir).and_then(|d| d.sync_all()).map_err(self.io("syncing", dir))
    }

    /// Takes the exclusive lock of `refs.lock` (held by another pusher for a read and a
    /// rename), waiting at most the stall timeout for it: a pusher stopped while it holds the
    /// lock is an error naming the lock, not a wait without end.
    fn lock_refs(&self) -> Result<File> {
        let lock_path = self.dir.root.join("refs.lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(self.io("opening", &lock_path))?;
        let deadline = std::time::Instant::now() + self.dir.stall;
        loop {
            match lock.try_lock() {
                Ok(()) => return Ok(lock),
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(self.io("locking", &lock_path)(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "held by another process for {:.1} s ({}); is a push stopped there?",
                            self.dir.stall.as_secs_f64(),
                            super::TIMEOUT_ENV
                        ),
                    )))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(self.io("locking", &lock_path)(e)),
            }
        }
    }
}

impl Remote for DirRemote {
    fn url(&self) -> &str {
        &self.dir.url
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.walk(prefix, false)?.into_iter().map(|l| l.key).collect())
    }

    fn list_modified(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.walk(prefix, true)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        self.count();
        let key = key.to_string();
        self.bounded("checking", &self.path(&key)?, move |dir, _| Ok(dir.file_metadata(&key)?.is_some()))
    }

    fn modified(&self, key: &str) -> Result<Option<std::time::SystemTime>> {
        self.count();
        let key = key.to_string();
        self.bounded("checking", &self.path(&key)?, move |dir, _| {
            let Some(meta) = dir.file_metadata(&key)? else { return Ok(None) };
            let path = dir.path(&key)?;
            Ok(Some(meta.modified().map_err(dir.io("checking", &path))?))
        })
    }

    fn get_small(&self, key: &str) -> Result<Option<Small>> {
        self.count();
        let key = key.to_string();
        self.bounded("reading", &self.path(&key)?, move |dir, _| {
            let Some((file, path)) = dir.open_key(&key)? else { return Ok(None) };
            let mut bytes = Vec::new();
            file.take(MAX_REF_LEN + 1).read_to_end(&mut bytes).map_err(dir.io("reading", &path))?;
            if bytes.len() as u64 > MAX_REF_LEN {
                return Err(Error::TooLarge { remote: dir.url.clone(), key, limit: MAX_REF_LEN });
            }
            let tag = hex_tag(&bytes);
            Ok(Some(Small { bytes, tag }))
        })
    }

    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> Result<()> {
        // Held for a read and a rename.
        let _lock = self.lock_refs()?;
        let current = self.get_small(key)?;
        let ok = match (expect, &current) {
            (Expect::Absent, None) => true,
            (Expect::Tag(tag), Some(small)) => &small.tag == tag,
            _ => false,
        };
        if !ok {
            return Err(Error::Conflict { remote: self.dir.url.clone(), key: key.into() });
        }
        let path = self.path(key)?;
        let dir = path.parent().expect("keys have a directory").to_path_buf();
        std::fs::create_dir_all(&dir).map_err(self.io("creating", &dir))?;
        let mut tmp = self.temp()?;
        tmp.write_all(bytes).map_err(self.io("writing", &path))?;
        tmp.as_file().sync_all().map_err(self.io("syncing", &path))?;
        tmp.persist(&path).map_err(|e| self.io("renaming to", &path)(e.error))?;
        self.sync_dir(&dir)
    }

    fn upload(&self, key: &str, file: &File, path: &Path, len: u64, _mode: UploadMode) -> Result<Uploaded> {
        self.count();
        let target = self.path(key)?;
        // Found there; something else than a file (which readers refuse) is an error naming it.
        if self.dir.file_metadata(key)?.is_some() {
            return Ok(Uploaded::Existed);
        }
        let (tmp, dir) = self.stage(file, path, len, &target)?;
        // `link` never replaces: create-if-absent, whatever the mode (a directory has no use
        // for replacement: its copies are not split into parts).
        let outcome = match std::fs::hard_link(tmp.path(), &target) {
            Ok(()) => Uploaded::Created,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Uploaded::Existed,
            Err(e) => return Err(self.io("linking", &target)(e)),
        };
        drop(tmp);
        self.sync_dir(&dir)?;
        Ok(outcome)
    }

    fn replace(&self, key: &str, file: &File, path: &Path, len: u64) -> Result<()> {
        self.count();
        let target = self.path(key)?;
        let (tmp, dir) = self.stage(file, path, len, &target)?;
        // `rename` replaces atomically: a reader opens the old file or the new one.
        tmp.persist(&target).map_err(|e| self.io("renaming to", &target)(e.error))?;
        self.sync_dir(&dir)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.count();
        let path = self.path(key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io("deleting", &path)(e)),
        }
    }

    fn read_head(&self, key: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        self.count();
        let key = key.to_string();
        self.bounded("reading", &self.path(&key)?, move |dir, _| {
            let (file, path) = dir.open_existing(&key)?;
            let size = file.metadata().map_err(dir.io("reading", &path))?.len();
            let mut bytes = Vec::new();
            file.take(len).read_to_end(&mut bytes).map_err(dir.io("reading", &path))?;
            Ok((bytes, size))
        })
    }

    fn read_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        self.count();
        let (owned, url) = (key.to_string(), self.dir.url.clone());
        self.bounded("reading", &self.path(key)?, move |dir, _| {
            let (mut file, path) = dir.open_existing(&owned)?;
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(range.start)).map_err(dir.io("reading", &path))?;
            let want = range.end.saturating_sub(range.start);
            let mut bytes = Vec::new();
            file.take(want).read_to_end(&mut bytes).map_err(dir.io("reading", &path))?;
            super::checked_range(&url, &owned, &range, bytes, false)
        })
    }

    fn download(&self, key: &str, out: &mut dyn Write, limit: u64) -> Result<u64> {
        self.download_from(key, 0, out, limit)
    }

    /// A directory remote resumes a download by seeking past what the caller has.
    fn download_from(&self, key: &str, offset: u64, out: &mut dyn Write, limit: u64) -> Result<u64> {
        self.count();
        let path = self.path(key)?;
        // A thread reads (at most one byte past `limit`) and hands over chunks, which come back
        // to it for reuse once written; each must arrive within the stall timeout.
        let (chunks, arriving) = mpsc::sync_channel::<Result<Option<Vec<u8>>>>(2);
        let (give_back, returned) = mpsc::channel::<Vec<u8>>();
        let (dir, owned_key) = (self.dir.clone(), key.to_string());
        std::thread::spawn(move || {
            let read = || -> Result<()> {
                let (mut file, path) = dir.open_existing(&owned_key)?;
                if offset > 0 {
                    let size = file.metadata().map_err(dir.io("reading", &path))?.len();
                    if size < offset {
                        let (remote, key) = (dir.url.clone(), owned_key.clone());
                        return Err(Error::Shorter { remote, key, offset, size });
                    }
                    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset))
                        .map_err(dir.io("reading", &path))?;
                }
                // At most one byte past `limit`, offset included.
                let mut file = file.take(limit.saturating_sub(offset).saturating_add(1));
                loop {
                    let mut buf = returned.try_recv().unwrap_or_default();
                    buf.resize(DOWNLOAD_CHUNK, 0);
                    let n = read_full(&mut file, &mut buf).map_err(dir.io("reading", &path))?;
                    if n == 0 {
                        return Ok(());
                    }
                    buf.truncate(n);
                    if chunks.send(Ok(Some(buf))).is_err() {
                        return Ok(()); // the download stopped taking them
                    }
                }
            };
            let end = read().map(|()| None);
            let _ = chunks.send(end);
        });
        let mut n = 0u64;
        loop {
            let chunk = match arriving.recv_timeout(self.dir.stall) {
                Ok(Ok(Some(chunk))) => chunk,
                Ok(Ok(None)) => return Ok(n),
                Ok(Err(e)) => return Err(e),
                Err(mpsc::RecvTimeoutError::Timeout) => return Err(self.dir.stalled("reading", &path)),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.io("reading", &path)(std::io::Error::other("the reading thread panicked")))
                }
            };
            n += chunk.len() as u64;
            if offset.saturating_add(n) > limit {
                return Err(Error::TooLarge { remote: self.dir.url.clone(), key: key.into(), limit });
            }
            out.write_all(&chunk).map_err(|e| Error::Io {
                remote: self.dir.url.clone(),
                action: "writing what was downloaded of",
                path: key.into(),
                source: e,
            })?;
            let _ = give_back.send(chunk);
        }
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// Reads into `buf` until it is full or the end of `r`; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A directory remote's tag for a small file: its content in hex (refs are tiny).
fn hex_tag(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_removes_only_stale_upload_files() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().to_str().unwrap();
        DirRemote::create(url).unwrap();
        let tmp = dir.path().join("tmp");
        for name in ["up-old", "up-young", "other-old"] {
            std::fs::write(tmp.join(name), b"partial upload").unwrap();
        }
        let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 24 * 3600);
        for name in ["up-old", "other-old"] {
            File::open(tmp.join(name)).unwrap().set_modified(two_days_ago).unwrap();
        }
        DirRemote::open(url).unwrap();
        assert!(!tmp.join("up-old").exists(), "a killed pusher's upload stays forever");
        assert!(tmp.join("up-young").exists(), "an upload in progress was deleted");
        assert!(tmp.join("other-old").exists(), "a file that is not an upload was deleted");
    }
}
