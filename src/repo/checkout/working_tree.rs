//! The target directory of a checkout: what it may overwrite or must refuse to, and the
//! undoable renames that put the staged files in place.

use super::super::model::FileEntry;
use super::super::status::Observed;
use super::super::{Error, Repo, RepoPath, Result};
use std::path::{Path, PathBuf};

/// The directory file `path` (a repository path) goes into under `root`.
fn rp_parent(root: &Path, path: &str) -> PathBuf {
    let mut p = root.to_path_buf();
    p.extend(path.split('/'));
    p.pop();
    p
}

/// What a checkout into the working tree deletes before renaming its files into place.
#[derive(Debug, Default)]
pub(super) struct Cleared {
    /// Files to delete (with the directories this empties).
    pub files: Vec<RepoPath>,
    /// Directories standing where a file is to be written.
    pub dirs: Vec<RepoPath>,
    /// Whether `dirs` go with whatever they hold (`--force`), or only once emptied by `files`.
    pub force: bool,
}

/// Fails naming the files of `out_dir` a checkout would overwrite with other content.
pub(super) fn refuse_overwriting(out_dir: &Path, mut differing: Vec<String>) -> Result<()> {
    if differing.is_empty() {
        return Ok(());
    }
    differing.sort();
    Err(Error::InvalidPath {
        path: out_dir.to_path_buf(),
        reason: format!(
            "already holds {} with other content than the version's: {}; nothing was written \
             (pass --force to overwrite, or choose another --output directory)",
            if differing.len() == 1 { "a file" } else { "files" },
            differing.join(", ")
        ),
    })
}

/// Whether the files at `a` and `b` hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    use std::io::Read;
    let open = |p: &Path| {
        crate::mmap::open_regular(p).map_err(|source| Error::Io { action: "reading", path: p.to_path_buf(), source })
    };
    let (fa, fb) = (open(a)?, open(b)?);
    let len = |f: &std::fs::File, p: &Path| {
        f.metadata().map(|m| m.len()).map_err(|source| Error::Io { action: "reading", path: p.to_path_buf(), source })
    };
    if len(&fa, a)? != len(&fb, b)? {
        return Ok(false);
    }
    let (mut ra, mut rb) = (std::io::BufReader::new(fa), std::io::BufReader::new(fb));
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = ra.read(&mut ba).map_err(|source| Error::Io { action: "reading", path: a.to_path_buf(), source })?;
        if n == 0 {
            return Ok(true);
        }
        rb.read_exact(&mut bb[..n]).map_err(|source| Error::Io { action: "reading", path: b.to_path_buf(), source })?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Renames a staged file to `dest`; across file systems (a mount point inside the target), by
/// a copy into a temporary file next to `dest` renamed in turn.
fn move_into_place(tmp: tempfile::TempPath, dest: &Path) -> Result<()> {
    let rename_err = |source| Error::Io { action: "renaming to", path: dest.to_path_buf(), source };
    let tmp = match tmp.persist(dest) {
        Ok(()) => return Ok(()),
        Err(e) if e.error.raw_os_error() == Some(libc::EXDEV) => e.path,
        Err(e) => return Err(rename_err(e.error)),
    };
    let dir = dest.parent().expect("a file path under a directory");
    let copy = tempfile::Builder::new()
        .prefix(".ckpt-tmp-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|source| Error::Io { action: "creating a file in", path: dir.to_path_buf(), source })?;
    let mut from =
        std::fs::File::open(&tmp).map_err(|source| Error::Io { action: "reading", path: tmp.to_path_buf(), source })?;
    std::io::copy(&mut from, &mut copy.as_file()).map_err(|source| Error::Io {
        action: "writing",
        path: copy.path().to_path_buf(),
        source,
    })?;
    copy.persist(dest).map_err(|e| rename_err(e.error))?;
    Ok(())
}

/// What a checkout does to its target directory once every file is staged, each step undoable
/// (checkout and switch are all or nothing, README): a file or directory that goes or is
/// replaced is first renamed aside, into the staging directory (or beside itself, in another
/// file system), and every file and directory created is remembered. A failure part-way (an
/// immutable file, a directory without write permission, a full disk in another file system)
/// puts everything back with [`Changes::undo`]; once every step succeeded [`Changes::finish`]
/// deletes what was set aside.
struct Changes<'a> {
    /// The target directory (the working tree, or `--output`).
    root: &'a Path,
    /// Where entries are set aside (in the staging directory, deleted with it).
    aside: PathBuf,
    /// What was done, in order.
    done: Vec<Change>,
}

/// One step of [`Changes`].
enum Change {
    /// The file or directory at `from` was renamed to `to`.
    SetAside { from: PathBuf, to: PathBuf },
    /// A file was written at this path, where nothing was left.
    Placed(PathBuf),
    /// This directory was created.
    Created(PathBuf),
}

impl<'a> Changes<'a> {
    /// No change yet to `root`; entries set aside go to `aside`.
    fn new(root: &'a Path, aside: PathBuf) -> Self {
        Changes { root, aside, done: Vec::new() }
    }

    /// Renames what stands at `path` (a file, a symbolic link, or a directory with whatever it
    /// holds) aside; nothing there is no step.
    fn set_aside(&mut self, path: &Path) -> Result<()> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let n = self.done.len();
        std::fs::create_dir_all(&self.aside).map_err(super::super::error::io("creating", &self.aside))?;
        let mut to = self.aside.join(format!("{n}-{name}"));
        let mut result = std::fs::rename(path, &to);
        if result.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EXDEV)) {
            // A mount point inside the target: beside itself, under a name no other file has.
            let dir = path.parent().expect("a path under the target directory");
            let mut k = 0;
            to = loop {
                let beside = dir.join(format!(".ckpt-aside-{}-{n}-{k}-{name}", std::process::id()));
                if std::fs::symlink_metadata(&beside).is_err() {
                    break beside;
                }
                k += 1;
            };
            result = std::fs::rename(path, &to);
        }
        match result {
            Ok(()) => {
                self.done.push(Change::SetAside { from: path.to_path_buf(), to });
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io { action: "moving aside", path: path.to_path_buf(), source }),
        }
    }

    /// Creates directory `dir` and those above it that are missing, remembering each.
    fn create_dirs(&mut self, dir: &Path) -> Result<()> {
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| *d != self.root && std::fs::symlink_metadata(d).is_err())
            .map(Path::to_path_buf)
            .collect();
        let result = super::super::path::create_dirs(dir);
        // Also those made before a failure.
        for d in missing.into_iter().rev() {
            if std::fs::symlink_metadata(&d).is_ok() {
                self.done.push(Change::Created(d));
            }
        }
        result
    }

    /// Renames the staged file `tmp` to `dest`, setting aside what stands there first.
    fn place(&mut self, tmp: tempfile::TempPath, dest: &Path) -> Result<()> {
        match std::fs::symlink_metadata(dest) {
            Ok(m) if m.is_dir() => {
                return Err(Error::InvalidPath { path: dest.to_path_buf(), reason: "is a directory".into() })
            }
            Ok(_) => self.set_aside(dest)?,
            Err(_) => {}
        }
        move_into_place(tmp, dest)?;
        self.done.push(Change::Placed(dest.to_path_buf()));
        Ok(())
    }

    /// Every step succeeded: deletes what was set aside (best effort: what is left in the
    /// staging directory goes with it), then the directories that removals left empty, up to
    /// the target directory (as `git switch` does).
    fn finish(self) {
        for change in &self.done {
            let Change::SetAside { from, to } = change else { continue };
            let _ = match std::fs::symlink_metadata(to) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(to),
                _ => std::fs::remove_file(to),
            };
            let mut dir = from.parent();
            // Stops at the first directory that is not empty.
            while let Some(d) = dir.filter(|d| *d != self.root && d.starts_with(self.root)) {
                if std::fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
        }
    }

    /// A step failed with `error`: undoes every step done, newest first. Returns `error`, said
    /// to be undone, or naming what could not be put back and where it is (the staging
    /// directory is then kept, for the caller to leave in place).
    fn undo(self, error: Error) -> (Error, bool) {
        let mut left = Vec::new();
        // Written files that could not be removed: fine where what was there is renamed back
        // over them.
        let mut stray = Vec::new();
        for change in self.done.into_iter().rev() {
            match change {
                Change::Placed(p) => {
                    if let Err(e) = std::fs::remove_file(&p) {
                        stray.push((p, e));
                    }
                }
                // Fails harmlessly when something else was put inside meanwhile.
                Change::Created(d) => {
                    let _ = std::fs::remove_dir(&d);
                }
                Change::SetAside { from, to } => match std::fs::rename(&to, &from) {
                    Ok(()) => stray.retain(|(p, _)| *p != from),
                    Err(e) => left.push(format!("{} (left at {}: {e})", from.display(), to.display())),
                },
            }
        }
        left.extend(stray.into_iter().map(|(p, e)| format!("{} (written, not removed: {e})", p.display())));
        let kept = !left.is_empty();
        let error = Error::CheckoutUndone { dir: self.root.to_path_buf(), source: Box::new(error), left };
        (error, kept)
    }
}

/// The files (anything but directories) under `dir`, as repository paths relative to `root`,
/// without following symbolic links.
fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|source| Error::Io { action: "listing", path: dir.to_path_buf(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io { action: "listing", path: dir.to_path_buf(), source })?;
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            files_under(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// A file staged for a checkout: its entry, where it goes, the verified temp file, its length.
pub(super) type Staged<'e> = (&'e FileEntry, RepoPath, tempfile::TempPath, u64);

/// Puts the `staged` files in place under `out_dir`, `cleared` removed first, all or nothing:
/// a failure undoes every change ([`Changes::undo`]), keeping `staging` if it holds what could
/// not be put back. Returns what was placed, with its length.
pub(super) fn place_staged<'e>(
    out_dir: &Path,
    staging: tempfile::TempDir,
    cleared: &Cleared,
    staged: Vec<Staged<'e>>,
) -> Result<Vec<(&'e FileEntry, RepoPath, u64)>> {
    let mut changes = Changes::new(out_dir, staging.path().join("aside"));
    match apply(&mut changes, cleared, staged) {
        Ok(placed) => {
            changes.finish();
            Ok(placed)
        }
        Err(e) => {
            let (error, kept) = changes.undo(e);
            if kept {
                // It holds what could not be put back.
                let _ = staging.keep();
            }
            Err(error)
        }
    }
}

/// Changes the target directory of `changes` as planned: `cleared` removed, then each staged
/// file renamed into place. The first failure stops it, for the caller to undo. Returns what
/// was placed, with its length.
fn apply<'e>(
    changes: &mut Changes<'_>,
    cleared: &Cleared,
    staged: Vec<Staged<'e>>,
) -> Result<Vec<(&'e FileEntry, RepoPath, u64)>> {
    let root = changes.root;
    // Checked again as each goes: nothing is deleted or written through a link to a
    // directory, even one made since the checks.
    for rp in &cleared.files {
        rp.refuse_beyond_symlink(root, "deleted")?;
        changes.set_aside(&rp.under(root))?;
    }
    for rp in &cleared.dirs {
        rp.refuse_beyond_symlink(root, "deleted")?;
        let dir = rp.under(root);
        if !cleared.force {
            // Only the directories the removals emptied (checked before; again in case a
            // file was put there since).
            let mut inside = Vec::new();
            files_under(root, &dir, &mut inside)?;
            if let Some(file) = inside.first() {
                return Err(Error::InvalidPath {
                    path: dir,
                    reason: format!("is a directory where the version has a file, and holds {file}"),
                });
            }
        }
        changes.set_aside(&dir)?;
    }
    let mut placed = Vec::with_capacity(staged.len());
    for (entry, rp, tmp, len) in staged {
        rp.refuse_beyond_symlink(root, "written")?;
        let dest = rp.under(root);
        changes.create_dirs(dest.parent().expect("a file path under a directory"))?;
        changes.place(tmp, &dest)?;
        placed.push((entry, rp, len));
    }
    Ok(placed)
}

impl Repo {
    /// Of the files planned for `out_dir`, those a checkout would change: any non-regular
    /// file, and a file whose content differs: for whole files, by length and file hash before
    /// anything is written; with a tensor `filter` (whose bytes are known only once written),
    /// byte for byte with `staged` (the staged copies, in the same order).
    pub(super) fn differing_outputs(
        &self,
        out_dir: &Path,
        planned: &[(&FileEntry, RepoPath)],
        filtered: bool,
        staged: Option<&[PathBuf]>,
    ) -> Result<Vec<String>> {
        let mut differing = Vec::new();
        for (i, (entry, rp)) in planned.iter().enumerate() {
            let dest = rp.under(out_dir);
            let meta = match std::fs::symlink_metadata(&dest) {
                Ok(m) => m,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
                    continue
                }
                Err(source) => return Err(Error::Io { action: "reading", path: dest, source }),
            };
            if meta.is_dir() {
                return Err(Error::InvalidPath { path: dest, reason: "is a directory".into() });
            }
            let differs = match staged {
                _ if !meta.is_file() => true,
                // A whole file: its length, then the file hash a commit of it would record.
                None if !filtered => meta.len() != entry.len || super::super::status::hash_file(&dest)? != entry.hash,
                None => false,
                Some(staged) => !same_bytes(&dest, &staged[i])?,
            };
            if differs {
                differing.push(entry.path.clone());
            }
        }
        Ok(differing)
    }

    /// Checks, before a checkout into the working tree writes anything, that it destroys no
    /// bytes the repository does not hold, the way git's checkout does: a working file may be
    /// replaced when its content is the current version's (committed) or the one about to be
    /// written, or when nothing is there. When `switching`, the current version's files the
    /// target lacks are to be removed, and may be when unmodified (files `rm`-ed since the last
    /// commit are left alone: they are the user's now). Returns those files to remove. With
    /// `force`, every conflict is overwritten or removed instead of refused.
    pub(super) fn protect_working_tree(&self, targets: &[&FileEntry], switching: bool, force: bool) -> Result<Cleared> {
        let current = match self.refs.head_version()? {
            Some(head) => Some(self.version(&head)?),
            None => None,
        };
        let committed = |path: &str| current.as_ref().and_then(|v| v.file(path));
        let (mut modified, mut untracked) = (Vec::new(), Vec::new());
        let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        // Directories standing where a file is to be written.
        let mut dirs = Vec::new();
        for entry in targets {
            let rp = self.stored_path(entry)?;
            if is_dir(&rp.under(&self.root)) {
                dirs.push(rp);
                continue;
            }
            let mut candidates = vec![(entry.len, entry.hash)];
            candidates.extend(committed(&entry.path).map(|c| (c.len, c.hash)));
            // With force the content does not matter (nothing is refused): not hashed.
            let seen = if force { self.observe_kind(&rp) } else { self.observe(&rp, &candidates)? };
            match seen {
                Observed::Missing | Observed::Matches(_) => {}
                Observed::NotAFile | Observed::Differs => match committed(&entry.path) {
                    Some(_) => modified.push(entry.path.clone()),
                    None => untracked.push(entry.path.clone()),
                },
            }
        }
        let mut to_remove = Vec::new();
        if let (true, Some(current)) = (switching, &current) {
            let removals = self.pending_removals()?;
            for old in &current.files {
                if targets.iter().any(|t| t.path == old.path) || removals.contains(&old.path) {
                    continue;
                }
                let rp = self.stored_path(old)?;
                let seen = if force { self.observe_kind(&rp) } else { self.observe(&rp, &[(old.len, old.hash)])? };
                match seen {
                    Observed::Missing => {}
                    Observed::Matches(_) => to_remove.push(rp),
                    // A directory now stands where the file was: not the file, not removed.
                    Observed::NotAFile if is_dir(&rp.under(&self.root)) => {}
                    Observed::NotAFile | Observed::Differs => {
                        modified.push(old.path.clone());
                        to_remove.push(rp);
                    }
                }
            }
        }
        // A file standing where a directory is needed (a checked-out path under it) must
        // be on its way out (or, with force, goes), or the renames would fail half-way; a
        // symbolic link there is refused (checkout never writes through one).
        for entry in targets {
            let mut at = self.root.clone();
            let parts: Vec<&str> = entry.path.split('/').collect();
            for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
                at.push(part);
                let Ok(meta) = std::fs::symlink_metadata(&at) else { break };
                if meta.file_type().is_symlink() {
                    // Refused here rather than when the file is written, after others were.
                    return Err(Error::InvalidPath {
                        path: at,
                        reason: "is a symbolic link; not writing through it".into(),
                    });
                }
                let prefix = parts[..=i].join("/");
                let removed = to_remove.iter().any(|r| r.as_str() == prefix);
                if !meta.is_dir() && !removed {
                    match RepoPath::parse(&prefix) {
                        Ok(rp) if force => {
                            to_remove.push(rp);
                            break;
                        }
                        _ => {
                            return Err(Error::NotADirectory { path: at, creating: rp_parent(&self.root, &entry.path) })
                        }
                    }
                }
            }
        }
        let conflicts = !(modified.is_empty() && untracked.is_empty());
        if conflicts && !force {
            modified.sort();
            untracked.sort();
            return Err(Error::DirtyWorkingTree { paths: modified, untracked });
        }
        // A directory in the way goes when the files removed above were all it held (as with
        // git, which also refuses when it holds untracked files), or with force whatever it holds.
        if !force {
            for dir in &dirs {
                let mut inside = Vec::new();
                files_under(&self.root, &dir.under(&self.root), &mut inside)?;
                inside.retain(|f| !to_remove.iter().any(|r| r.as_str() == f));
                if !inside.is_empty() {
                    inside.sort();
                    return Err(Error::InvalidPath {
                        path: dir.under(&self.root),
                        reason: format!(
                            "is a directory where the version has a file, and holds files that would be lost: {}; \
                             move them, or pass --force to delete the directory",
                            inside.join(", ")
                        ),
                    });
                }
            }
        }
        Ok(Cleared { files: to_remove, dirs, force })
    }

    /// The validated path of a version's file entry.
    fn stored_path(&self, entry: &FileEntry) -> Result<RepoPath> {
        RepoPath::parse(&entry.path).map_err(|reason| Error::CorruptMetadata {
            id: entry.manifest,
            reason: format!("path {:?}: {reason}", entry.path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry under `root` (directories too, as `/`), sorted, with its bytes.
    fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let path = e.unwrap().path();
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    out.push((rel, b"/".to_vec()));
                    stack.push(path);
                } else {
                    out.push((rel, std::fs::read(&path).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    /// A file staged in `dir` holding `bytes`.
    fn staged(dir: &Path, bytes: &[u8]) -> tempfile::TempPath {
        let tmp = tempfile::NamedTempFile::new_in(dir).unwrap();
        std::fs::write(tmp.path(), bytes).unwrap();
        tmp.into_temp_path()
    }

    #[test]
    fn changes_are_undone_newest_first_or_finished() {
        let dir = tempfile::tempdir().unwrap();
        let (root, staging) = (dir.path().join("root"), dir.path().join("staging"));
        std::fs::create_dir_all(root.join("gone/deep")).unwrap();
        std::fs::create_dir(&staging).unwrap();
        std::fs::write(root.join("gone/deep/f"), b"removed").unwrap();
        std::fs::write(root.join("kept"), b"replaced").unwrap();
        std::fs::create_dir_all(root.join("in-the-way/sub")).unwrap();
        let before = tree(&root);
        let run = |finish: bool| {
            let mut c = Changes { root: &root, aside: staging.join("aside"), done: Vec::new() };
            c.set_aside(&root.join("gone/deep/f")).unwrap();
            c.set_aside(&root.join("in-the-way")).unwrap();
            c.set_aside(&root.join("not-there")).unwrap();
            c.place(staged(&staging, b"new"), &root.join("in-the-way")).unwrap();
            c.place(staged(&staging, b"new"), &root.join("kept")).unwrap();
            c.create_dirs(&root.join("a/b")).unwrap();
            c.place(staged(&staging, b"new"), &root.join("a/b/c")).unwrap();
            assert_eq!(c.done.len(), 8, "nothing set aside where nothing was");
            if finish {
                c.finish();
            } else {
                let (err, kept) = c.undo(Error::NothingToCommit);
                assert!(!kept && err.to_string().contains("was undone"), "{err}");
            }
        };
        run(false);
        assert_eq!(tree(&root), before, "undone");
        run(true);
        let after = tree(&root);
        let names: Vec<&str> = after.iter().map(|(p, _)| p.as_str()).collect();
        // The removal emptied gone/deep and gone: both went; what was set aside went too.
        assert_eq!(names, ["a", "a/b", "a/b/c", "in-the-way", "kept"]);
        assert_eq!(after[2].1, b"new");
        assert!(std::fs::read_dir(staging.join("aside")).unwrap().next().is_none());
    }
}
