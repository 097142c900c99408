//! A remote in a local directory (a shared disk, NFS, tests). Objects appear atomically and
//! only if absent: written to `tmp/`, fsynced, then hard-linked to their key (`link` fails if
//! the key exists, so a second writer never replaces an object) and the temp name removed.
//! Small files (refs) are compared and swapped under an exclusive lock on `refs.lock`, then
//! replaced by temp file + fsync + rename; their tag is their content.

use super::{Error, Expect, Listed, Remote, Result, Small, UploadMode, Uploaded, MAX_KEY_LEN, MAX_REF_LEN};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upload temp files in `tmp/` untouched this long are leftovers of a killed pusher (an upload
/// writes its temp file continuously and links or renames it within seconds of the last
/// write), removed when the remote is next opened. Nothing else would ever delete them.
const STALE_UPLOAD: Duration = Duration::from_secs(24 * 3600);

/// A remote in a directory.
#[derive(Debug)]
pub struct DirRemote {
    url: String,
    root: PathBuf,
    requests: AtomicU64,
}

impl DirRemote {
    /// Copies the first `len` bytes of `file` (read from `path`) into a synced temporary file
    /// of this remote, and creates the directory of `target`: what a create-if-absent upload
    /// and a replacement share before they link or rename it into place.
    /// Opens the file of `key` for reading: [`Error::NotFound`] when there is none.
    fn open_key(&self, key: &str) -> Result<(File, PathBuf)> {
        let path = self.path(key)?;
        match File::open(&path) {
            Ok(f) => Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(Error::NotFound { remote: self.url.clone(), key: key.into() })
            }
            Err(e) => Err(self.io("opening", &path)(e)),
        }
    }

    fn stage(&self, file: &File, path: &Path, len: u64, target: &Path) -> Result<(tempfile::NamedTempFile, PathBuf)> {
        let mut tmp = self.temp()?;
        let mut src = file.try_clone().map_err(self.io("opening", path))?;
        std::io::Seek::rewind(&mut src).map_err(self.io("reading", path))?;
        let copied = std::io::copy(&mut src.take(len), tmp.as_file_mut()).map_err(self.io("copying", path))?;
        if copied != len {
            return Err(Error::Io {
                remote: self.url.clone(),
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
        if !remote.root.is_dir() {
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
        Ok(DirRemote { url: super::redact_url(url), root: PathBuf::from(path), requests: AtomicU64::new(0) })
    }

    fn make_dirs(&self) -> Result<()> {
        let remote = self;
        for d in ["objects", "refs/heads", "refs/tags", "tmp"] {
            let dir = remote.root.join(d);
            std::fs::create_dir_all(&dir).map_err(remote.io("creating", &dir))?;
        }
        self.remove_stale_uploads();
        Ok(())
    }

    /// Deletes the upload temp files of killed pushers ([`STALE_UPLOAD`]). Best effort: a file
    /// that cannot be read or deleted stays.
    fn remove_stale_uploads(&self) {
        let Ok(entries) = std::fs::read_dir(self.root.join("tmp")) else { return };
        for entry in entries.flatten() {
            let is_upload = entry.file_name().to_string_lossy().starts_with("up-");
            let age = entry.metadata().ok().filter(|m| m.is_file()).and_then(|m| m.modified().ok());
            if is_upload && age.and_then(|t| t.elapsed().ok()).is_some_and(|a| a >= STALE_UPLOAD) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

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

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn temp(&self) -> Result<tempfile::NamedTempFile> {
        let dir = self.root.join("tmp");
        tempfile::Builder::new().prefix("up-").tempfile_in(&dir).map_err(self.io("creating a file in", &dir))
    }

    /// The files under `prefix`; with `ages`, each one's mtime and size (a file deleted between
    /// the directory read and its `stat`, by a push deleting its journal or a gc, is left out).
    fn walk(&self, prefix: &str, ages: bool) -> Result<Vec<Listed>> {
        self.count();
        let mut out = Vec::new();
        let mut seen = 0usize;
        let mut stack = vec![prefix.trim_end_matches('/').to_string()];
        while let Some(rel) = stack.pop() {
            let dir = self.path(&rel)?;
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.io("listing", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(self.io("listing", &dir))?;
                let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
                let key = format!("{rel}/{name}");
                let ty = entry.file_type().map_err(self.io("listing", &dir))?;
                super::count_listed(&mut seen, &self.url, prefix)?;
                if key.len() > MAX_KEY_LEN {
                    continue;
                }
                if ty.is_dir() {
                    stack.push(key);
                } else if ty.is_file() && !name.starts_with('.') {
                    if !ages {
                        out.push(Listed { key, modified: std::time::UNIX_EPOCH, size: 0 });
                        continue;
                    }
                    let meta = match entry.metadata() {
                        Ok(m) => m,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(self.io("listing", &dir)(e)),
                    };
                    let modified = meta.modified().map_err(self.io("listing", &dir))?;
                    out.push(Listed { key, modified, size: meta.len() });
                }
            }
        }
        Ok(out)
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        File::open(dir).and_then(|d| d.sync_all()).map_err(self.io("syncing", dir))
    }
}

impl Remote for DirRemote {
    fn url(&self) -> &str {
        &self.url
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.walk(prefix, false)?.into_iter().map(|l| l.key).collect())
    }

    fn list_modified(&self, prefix: &str) -> Result<Vec<Listed>> {
        self.walk(prefix, true)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        self.count();
        let path = self.path(key)?;
        match std::fs::metadata(&path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io("checking", &path)(e)),
        }
    }

    fn modified(&self, key: &str) -> Result<Option<std::time::SystemTime>> {
        self.count();
        let path = self.path(key)?;
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(Some(m.modified().map_err(self.io("checking", &path))?)),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("checking", &path)(e)),
        }
    }

    fn get_small(&self, key: &str) -> Result<Option<Small>> {
        self.count();
        let path = self.path(key)?;
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io("opening", &path)(e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_REF_LEN + 1).read_to_end(&mut bytes).map_err(self.io("reading", &path))?;
        if bytes.len() as u64 > MAX_REF_LEN {
            return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit: MAX_REF_LEN });
        }
        let tag = hex_tag(&bytes);
        Ok(Some(Small { bytes, tag }))
    }

    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> Result<()> {
        let lock_path = self.root.join("refs.lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(self.io("opening", &lock_path))?;
        // Blocks while another pusher compares and swaps; held for a read and a rename.
        lock.lock().map_err(self.io("locking", &lock_path))?;
        let current = self.get_small(key)?;
        let ok = match (expect, &current) {
            (Expect::Absent, None) => true,
            (Expect::Tag(tag), Some(small)) => &small.tag == tag,
            _ => false,
        };
        if !ok {
            return Err(Error::Conflict { remote: self.url.clone(), key: key.into() });
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
        if target.is_file() {
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
        let (file, path) = self.open_key(key)?;
        let size = file.metadata().map_err(self.io("reading", &path))?.len();
        let mut bytes = Vec::new();
        file.take(len).read_to_end(&mut bytes).map_err(self.io("reading", &path))?;
        Ok((bytes, size))
    }

    fn download(&self, key: &str, out: &mut dyn Write, limit: u64) -> Result<u64> {
        self.count();
        let (file, path) = self.open_key(key)?;
        let n = std::io::copy(&mut file.take(limit.saturating_add(1)), out).map_err(self.io("reading", &path))?;
        if n > limit {
            return Err(Error::TooLarge { remote: self.url.clone(), key: key.into(), limit });
        }
        Ok(n)
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
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
