//! `checkout`: a version's files, rebuilt blob by blob into a temp file next to the target,
//! hash-checked, then renamed into place. A damaged object makes the file fail; nothing wrong is
//! ever left under the target name.

use super::model::{FileEntry, FileFormat, Manifest};
use super::status::{now_ns, Observed};
use super::{Error, Repo, RepoPath, Result, VersionId};
use crate::object_id::ObjectId;
use crate::object_id::{NodeHash, RangeHashes};
use crate::safetensors;
use crate::store;
use rayon::prelude::*;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Chunks decoded per work unit of a parallel checkout (2 MiB with the default chunk size):
/// small enough to balance two cores on a 2 MiB tensor.
const UNIT_CHUNKS: usize = 8;
/// Bytes per window of a whole-file checkout, per worker thread: decoded in parallel, then
/// hashed and written by one thread while the next window decodes. Two such buffers are live.
/// 2 MiB per thread (one unit of 8 default chunks each; 4 MiB on two cores) rather than a
/// fixed 16 MiB: the buffers are fresh memory the kernel faults in and zeroes, which on a
/// 45 MB file was half of the checkout (0.08 s against 0.04 s on two cores, medians of 11, A/B;
/// 52 against 100 ms with transparent huge pages on);
/// on a 2 GiB file HEAD checked out in 1.09 s against 1.22 s, with 22 MiB of RSS instead of 53
/// (docs/BENCHMARKS.md, "Fixed costs again"). Per thread, so that many cores still find a unit
/// each in every window.
const WINDOW_BYTES_PER_THREAD: usize = 2 << 20;
/// The smallest window, whatever the thread count.
const MIN_WINDOW_BYTES: usize = 4 << 20;
/// Original bytes of the segments decoded together (at least one segment per batch).
const BATCH_BYTES: u64 = 64 << 20;

/// A run of chunks of one blob, decoded as one task of a whole-file checkout.
struct Unit {
    /// Index of the blob's decoder in the batch.
    decoder: usize,
    /// The blob's chunks.
    chunks: Range<usize>,
    /// Where the run's bytes go in the file.
    offset: u64,
    /// Length of the run's bytes.
    len: usize,
}

/// Selects tensors by name for `checkout --tensor`.
///
/// A pattern containing `*` or `?` is a glob over the whole name: `*` matches any run of
/// characters (including `.` and `/`, which are ordinary characters in tensor names), `?`
/// exactly one. Any other pattern matches names that contain it as a substring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorFilter {
    pattern: String,
}

impl TensorFilter {
    /// A filter for `pattern`.
    pub fn new(pattern: &str) -> TensorFilter {
        TensorFilter { pattern: pattern.to_string() }
    }

    /// Whether tensor `name` is selected.
    pub fn matches(&self, name: &str) -> bool {
        if self.pattern.contains(['*', '?']) {
            let p: Vec<char> = self.pattern.chars().collect();
            let n: Vec<char> = name.chars().collect();
            glob(&p, &n)
        } else {
            name.contains(&self.pattern)
        }
    }
}

/// How [`Repo::checkout_version`] writes a version: the internal form of [`CheckoutOptions`].
pub(super) struct Target<'a> {
    /// Only these files.
    pub files: Option<&'a [PathBuf]>,
    /// Instead of the working tree.
    pub output_dir: Option<&'a Path>,
    /// Only these tensors.
    pub filter: Option<&'a TensorFilter>,
    /// Destroy changes rather than refuse.
    pub force: bool,
    /// `switch`: also remove the current version's files that the target lacks.
    pub switching: bool,
}

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
fn refuse_overwriting(out_dir: &Path, mut differing: Vec<String>) -> Result<()> {
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

impl Changes<'_> {
    /// Renames what stands at `path` (a file, a symbolic link, or a directory with whatever it
    /// holds) aside; nothing there is no step.
    fn set_aside(&mut self, path: &Path) -> Result<()> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let n = self.done.len();
        std::fs::create_dir_all(&self.aside).map_err(super::error::io("creating", &self.aside))?;
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
        let result = super::path::create_dirs(dir);
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

/// Iterative glob matching with backtracking to the last `*` (linear in practice).
fn glob(p: &[char], n: &[char]) -> bool {
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// What a checkout wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckoutSummary {
    /// The version checked out.
    pub version: VersionId,
    /// Paths written, relative to the output directory.
    pub files: Vec<String>,
    /// Bytes written.
    pub bytes: u64,
}

/// What [`Repo::checkout_with`] writes and how.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckoutOptions {
    /// Only these files (absolute, or relative to the repository root); `None`: all of them.
    pub files: Option<Vec<PathBuf>>,
    /// Write under this directory instead of the working tree. It must not lie inside the
    /// repository's `.ckpt` directory.
    pub output: Option<PathBuf>,
    /// Only the tensors this pattern selects ([`TensorFilter`]).
    pub tensor: Option<String>,
    /// Overwrite working files even when that destroys changes the repository does not hold
    /// (a modified tracked file, an untracked file in the way, a directory where a file goes),
    /// and let `tensor` replace whole working files; with `output`, overwrite files there that
    /// hold other bytes than the version's (refused otherwise, naming them).
    pub force: bool,
}

impl Repo {
    /// Writes the files of version `rev` (all, or those named in `files`, absolute or relative
    /// to the repository root) under `output_dir` (default: the working tree) at their
    /// committed relative paths. With `tensor_filter` (see [`TensorFilter`]), each safetensors
    /// file is written as a valid safetensors file holding only the matching tensors; files
    /// with no match, and non-safetensors files, are skipped. `HEAD` does not move. Into the
    /// working tree this refuses to destroy changes ([`CheckoutOptions::force`] off): see
    /// [`Repo::checkout_with`].
    pub fn checkout(
        &self,
        rev: &str,
        files: Option<&[PathBuf]>,
        output_dir: Option<&Path>,
        tensor_filter: Option<&str>,
    ) -> Result<CheckoutSummary> {
        let options = CheckoutOptions {
            files: files.map(<[PathBuf]>::to_vec),
            output: output_dir.map(Path::to_path_buf),
            tensor: tensor_filter.map(str::to_string),
            force: false,
        };
        self.checkout_with(rev, &options)
    }

    /// Writes the files of version `rev` as [`CheckoutOptions`] say. Into the working tree
    /// (no output directory, or the root itself), unless `force`: every file to be written is
    /// compared with the current version and the version checked out first (size, mtime, ctime,
    /// inode, else its hash), and a file whose content neither holds (modified since it was
    /// committed or checked out, or untracked) fails the checkout with
    /// [`Error::DirtyWorkingTree`] naming every such file, before anything is written; a
    /// tensor selection fails with [`Error::PartialCheckoutInTree`]. Into an output directory,
    /// unless `force`, a file there holding other bytes than the version's fails it naming
    /// every such file. Either way every file is written and verified in a staging directory
    /// before the first is renamed into place: an error leaves the target as it was.
    pub fn checkout_with(&self, rev: &str, options: &CheckoutOptions) -> Result<CheckoutSummary> {
        let id = self.resolve(rev)?;
        let filter = options.tensor.as_deref().map(TensorFilter::new);
        let target = Target {
            files: options.files.as_deref(),
            output_dir: options.output.as_deref(),
            filter: filter.as_ref(),
            force: options.force,
            switching: false,
        };
        self.checkout_version(&id, &target)
    }

    pub(super) fn checkout_version(&self, id: &VersionId, target: &Target<'_>) -> Result<CheckoutSummary> {
        let filter = target.filter;
        let version = self.version(id)?;
        let selected: Vec<&FileEntry> = match target.files {
            None => version.files.iter().collect(),
            Some(paths) => {
                // A path the version holds no file at may be a directory: every file under it
                // (as `ckpt commit DIR` took them).
                let mut selected = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for p in paths {
                    let rp = self.repo_path(p)?;
                    let files = version.files_at(rp.as_str());
                    if files.is_empty() {
                        return Err(Error::NotInVersion { path: rp.to_string(), version: *id });
                    }
                    selected.extend(files.into_iter().filter(|f| seen.insert(f.path.as_str())));
                }
                selected
            }
        };
        let (out_dir, in_tree) = match target.output_dir {
            None => (self.root.clone(), true),
            Some(d) => {
                // Checked before anything is created: `refs/` or `objects/` overwritten by a
                // checkout would break the repository.
                if super::path::resolve_prospective(d).is_some_and(|r| r.starts_with(&self.dir)) {
                    return Err(Error::OutputInRepository { path: d.to_path_buf(), ckpt_dir: self.dir.clone() });
                }
                super::path::create_dirs(d)?;
                let d = std::fs::canonicalize(d).map_err(|source| Error::Io {
                    action: "resolving",
                    path: d.to_path_buf(),
                    source,
                })?;
                let in_tree = d == self.root;
                (d, in_tree)
            }
        };
        let mut planned = Vec::with_capacity(selected.len());
        for entry in selected {
            let rp = RepoPath::parse(&entry.path).map_err(|reason| Error::CorruptMetadata {
                id: *id,
                reason: format!("path {:?}: {reason}", entry.path),
            })?;
            // An output directory above the root must not reach `.ckpt` through a stored path
            // such as `repo/.ckpt/HEAD` (out_dir is canonical; symlinked directories below it
            // are refused below).
            if rp.under(&out_dir).starts_with(&self.dir) {
                return Err(Error::OutputInRepository { path: rp.under(&out_dir), ckpt_dir: self.dir.clone() });
            }
            planned.push((entry, rp));
        }
        // A file `a` and a file `a/b` cannot both be written: a version holding both was not
        // written by ckpt (commit refuses it), and is refused before anything is written.
        if let Some((file, under)) = super::path::prefix_conflict(planned.iter().map(|(e, _)| e.path.as_str())) {
            return Err(Error::CorruptMetadata {
                id: *id,
                reason: format!("it holds both the file {file:?} and {under:?} under it; no tree can hold both"),
            });
        }
        if in_tree && !target.force {
            if let Some(f) = filter {
                return Err(Error::PartialCheckoutInTree {
                    pattern: f.pattern.clone(),
                    files: planned.iter().map(|(e, _)| e.path.clone()).collect(),
                });
            }
        }
        // Never write through a symlinked directory (it could lead anywhere): refused before
        // anything is written.
        for (_, rp) in &planned {
            rp.refuse_beyond_symlink(&out_dir, "written")?;
        }
        let cleared = if in_tree {
            let entries: Vec<&FileEntry> = planned.iter().map(|(e, _)| *e).collect();
            self.protect_working_tree(&entries, target.switching, target.force)?
        } else {
            if !target.force {
                let differing = self.differing_outputs(&out_dir, &planned, filter.is_some(), None)?;
                refuse_overwriting(&out_dir, differing)?;
            }
            Cleared::default()
        };
        // Every file is written and verified in a staging directory first, and renamed into
        // place only once all are: a damaged object or a full disk leaves the target as it was.
        let staging_parent = if in_tree { self.dir.join("tmp") } else { out_dir.clone() };
        let staging = tempfile::Builder::new()
            .prefix(".ckpt-checkout-")
            .tempdir_in(&staging_parent)
            .map_err(|source| Error::Io { action: "creating a directory in", path: staging_parent.clone(), source })?;
        let total = planned.iter().map(|(f, _)| f.len).sum();
        self.progress.start("checkout", total);
        let mut staged = Vec::with_capacity(planned.len());
        let mut bytes = 0u64;
        for (entry, rp) in planned {
            let written = self
                .stage_file(entry, staging.path(), filter, bytes)
                .map_err(|e| Error::File { path: entry.path.clone(), source: Box::new(e) })?;
            if let Some((tmp, n)) = written {
                bytes += n;
                staged.push((entry, rp, tmp, n));
            }
        }
        self.progress.finish();
        if !in_tree && !target.force && filter.is_some() {
            // Subsets of tensors could not be compared before they were written.
            let differing = self.differing_outputs(
                &out_dir,
                &staged.iter().map(|(e, rp, _, _)| (*e, rp.clone())).collect::<Vec<_>>(),
                filter.is_some(),
                Some(&staged.iter().map(|(_, _, t, _)| t.to_path_buf()).collect::<Vec<_>>()),
            )?;
            refuse_overwriting(&out_dir, differing)?;
        }
        let mut changes = Changes { root: &out_dir, aside: staging.path().join("aside"), done: Vec::new() };
        let placed = match Self::apply(&mut changes, &cleared, staged) {
            Ok(placed) => placed,
            Err(e) => {
                let (error, kept) = changes.undo(e);
                if kept {
                    // It holds what could not be put back.
                    let _ = staging.keep();
                }
                return Err(error);
            }
        };
        changes.finish();
        let mut summary = CheckoutSummary { version: *id, files: Vec::new(), bytes: 0 };
        for (entry, rp, len) in placed {
            summary.bytes += len;
            summary.files.push(entry.path.clone());
            if in_tree && filter.is_none() {
                self.record_stat(&rp, entry);
            }
        }
        self.flush_index();
        Ok(summary)
    }

    /// Changes the target directory of `changes` as planned: `cleared` removed, then each
    /// staged file renamed into place. The first failure stops it, for the caller to undo.
    /// Returns what was placed, with its length.
    fn apply<'e>(
        changes: &mut Changes<'_>,
        cleared: &Cleared,
        staged: Vec<(&'e FileEntry, RepoPath, tempfile::TempPath, u64)>,
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

    /// Of the files planned for `out_dir`, those a checkout would change: any non-regular
    /// file, and a file whose content differs: for whole files, by length and file hash before
    /// anything is written; with a tensor `filter` (whose bytes are known only once written),
    /// byte for byte with `staged` (the staged copies, in the same order).
    fn differing_outputs(
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
                None if !filtered => meta.len() != entry.len || super::status::hash_file(&dest)? != entry.hash,
                None => false,
                Some(staged) => !same_bytes(&dest, &staged[i])?,
            };
            if differs {
                differing.push(entry.path.clone());
            }
        }
        Ok(differing)
    }

    /// Writes one file (to `out_dir`, through a temporary file renamed into place once
    /// verified); `None` if the filter selects nothing in it.
    pub(super) fn checkout_file(
        &self,
        entry: &FileEntry,
        rp: &RepoPath,
        out_dir: &Path,
        filter: Option<&TensorFilter>,
        progress_base: u64,
    ) -> Result<Option<u64>> {
        rp.refuse_beyond_symlink(out_dir, "written")?;
        let dest = rp.under(out_dir);
        let dir = dest.parent().expect("a file path under a directory");
        super::path::create_dirs(dir)?;
        if dest.is_dir() {
            return Err(Error::InvalidPath { path: dest, reason: "is a directory".into() });
        }
        let Some((tmp, written)) = self.stage_file(entry, dir, filter, progress_base)? else { return Ok(None) };
        tmp.persist(&dest).map_err(|e| Error::Io { action: "renaming to", path: dest.clone(), source: e.error })?;
        Ok(Some(written))
    }

    /// Checks, before a checkout into the working tree writes anything, that it destroys no
    /// bytes the repository does not hold, the way git's checkout does: a working file may be
    /// replaced when its content is the current version's (committed) or the one about to be
    /// written, or when nothing is there. When `switching`, the current version's files the
    /// target lacks are to be removed, and may be when unmodified (files `rm`-ed since the last
    /// commit are left alone: they are the user's now). Returns those files to remove. With
    /// `force`, every conflict is overwritten or removed instead of refused.
    fn protect_working_tree(&self, targets: &[&FileEntry], switching: bool, force: bool) -> Result<Cleared> {
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

    /// Writes one file, verified, into a temporary file in `dir`; returns it (deleted when
    /// dropped) and its length, or `None` if the filter selects nothing in it.
    fn stage_file(
        &self,
        entry: &FileEntry,
        dir: &Path,
        filter: Option<&TensorFilter>,
        progress_base: u64,
    ) -> Result<Option<(tempfile::TempPath, u64)>> {
        let manifest = self.manifest(&entry.manifest)?;
        if manifest.len != entry.len || manifest.hash != entry.hash {
            return Err(Error::CorruptMetadata {
                id: entry.manifest,
                reason: "manifest length or hash differs from the version's file entry".into(),
            });
        }
        let segments: Vec<usize> = match filter {
            None => (0..manifest.segments.len()).collect(),
            Some(f) => {
                if manifest.kind != FileFormat::Safetensors {
                    return Ok(None);
                }
                let picked: Vec<usize> = (0..manifest.segments.len())
                    .filter(|&i| manifest.segments[i].tensor.as_ref().is_some_and(|t| f.matches(&t.name)))
                    .collect();
                if picked.is_empty() {
                    return Ok(None);
                }
                picked
            }
        };
        let header = match filter {
            Some(_) => Some(self.filtered_header(&manifest, &segments)?),
            None => None,
        };

        // Mode 0666 minus the umask, as for any file a program creates (tempfile's default
        // 0600 would leave checked-out files private).
        let tmp = tempfile::Builder::new()
            .prefix(".ckpt-tmp-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|source| Error::Io { action: "creating a file in", path: dir.to_path_buf(), source })?;
        if header.is_none() {
            let written = self.write_whole_file(entry, &manifest, &tmp, progress_base)?;
            return Ok(Some((tmp.into_temp_path(), written)));
        }
        // A selection of tensors: each blob is verified against its id as it is copied.
        let io_err = |source| Error::Io { action: "writing", path: tmp.path().to_path_buf(), source };
        let mut w = std::io::BufWriter::with_capacity(4 << 20, tmp.as_file());
        let mut written = 0u64;
        let mut bundles = super::bundle::BundleCache::new();
        if let Some(h) = &header {
            w.write_all(h).map_err(io_err)?;
            written += h.len() as u64;
        }
        for &i in &segments {
            let s = &manifest.segments[i];
            if s.len == 0 {
                continue;
            }
            // A bundled tensor: its bundle was checked against its id when decoded.
            if let Some(bytes) = bundles.segment(self, &manifest, s)? {
                w.write_all(bytes).map_err(io_err)?;
                written += s.len;
                continue;
            }
            let chain = self.open_segment(entry, &manifest, s)?;
            let start = written;
            chain.copy_to_with_progress(&mut w, &|done| self.progress.set(progress_base + start + done))?;
            written += s.len;
        }
        w.flush().map_err(io_err)?;
        drop(w);
        Ok(Some((tmp.into_temp_path(), written)))
    }

    /// Opens the blob of segment `s` (not bundled) of `entry`'s manifest and checks that it
    /// has the segment's length.
    fn open_segment(
        &self,
        entry: &FileEntry,
        manifest: &Manifest,
        s: &super::model::Segment,
    ) -> Result<store::BlobChain> {
        let (blob, _) = manifest.location(s);
        let chain = self.store.open_blob(&blob)?;
        if chain.len() != s.len {
            return Err(Error::CorruptMetadata {
                id: entry.manifest,
                reason: format!("segment of {} bytes names blob {} of {} bytes", s.len, blob, chain.len()),
            });
        }
        Ok(chain)
    }

    /// Writes every segment of `manifest` into `tmp` at its offset, decoding chunks of all
    /// blobs in parallel (a file of many small tensors keeps every core busy, and the copy into
    /// the page cache is spread over the workers too). Each worker hashes the run of chunks it
    /// decoded, while the bytes are in cache, as part of the blob's blake3 ([`RangeHashes`]);
    /// once a blob's parts are in, its hash is checked against its id (naming the damaged
    /// chain if it differs). The file's hash is then derived from those ids and checked against
    /// the recorded one ([`super::model::file_hash`]).
    fn write_whole_file(
        &self,
        entry: &FileEntry,
        manifest: &Manifest,
        tmp: &tempfile::NamedTempFile,
        progress_base: u64,
    ) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let io_err = |action, source| Error::Io { action, path: tmp.path().to_path_buf(), source };
        // (file offset, segment) of every non-empty segment stored as its own blob; the file
        // offset of every bundled one.
        let mut placed = Vec::new();
        let mut bundled_at = vec![0u64; manifest.segments.len()];
        let mut offset = 0u64;
        for (i, s) in manifest.segments.iter().enumerate() {
            if s.bundle.is_some() {
                bundled_at[i] = offset;
            } else if s.len > 0 {
                placed.push((offset, s));
            }
            offset = offset.checked_add(s.len).ok_or_else(|| Error::CorruptMetadata {
                id: entry.manifest,
                reason: "segment lengths overflow".into(),
            })?;
        }
        if offset != manifest.len {
            return Err(Error::CorruptMetadata {
                id: entry.manifest,
                reason: format!("segments cover {offset} bytes of a {}-byte file", manifest.len),
            });
        }
        let file = tmp.as_file();
        file.set_len(manifest.len).map_err(|e| io_err("writing", e))?;
        // The subtree hashes of the blob being checked, so far.
        let mut blob_nodes: Vec<NodeHash> = Vec::new();
        let mut done = 0u64;
        // Two window buffers: the pool decodes into one while this thread checks and writes
        // the other (reused across batches: fresh buffers cost page faults).
        let mut buffers = [Vec::new(), Vec::new()];
        // Segments are opened a batch at a time: the objects of a batch's delta chains are
        // mapped (and count in the resident set) only while the batch is decoded.
        for batch in crate::codec::runs_within(placed.iter().map(|(_, s)| s.len), BATCH_BYTES) {
            // Each blob is opened (mapped) once, however many segments name it: a forged
            // manifest naming one blob 70,000 times ran out of maps (`vm.max_map_count`).
            let mut opened: std::collections::HashMap<ObjectId, std::sync::Arc<store::BlobChain>> =
                std::collections::HashMap::new();
            let chains = placed[batch]
                .iter()
                .map(|(o, s)| {
                    let blob = manifest.location(s).0;
                    let chain = match opened.get(&blob) {
                        Some(chain) if chain.len() == s.len => chain.clone(),
                        _ => {
                            let chain = std::sync::Arc::new(self.open_segment(entry, manifest, s)?);
                            opened.insert(blob, chain.clone());
                            chain
                        }
                    };
                    Ok((*o, chain))
                })
                .collect::<Result<Vec<_>>>()?;
            let decoders = chains.iter().map(|(_, c)| c.decoder()).collect::<Result<Vec<_>, _>>()?;
            // Units start on blake3's 1 KiB grid: a chain's chunk size is a power of two of at
            // least 4 KiB (`Container::open` rejects any other), so the units' subtree hashes
            // cover each blob and join without its bytes.
            let blob_hashes: Vec<RangeHashes> = chains.iter().map(|(_, chain)| RangeHashes::new(chain.len())).collect();
            // Work units in file order.
            let units: Vec<Unit> = decoders
                .iter()
                .enumerate()
                .flat_map(|(d, dec)| {
                    let offset = chains[d].0;
                    (0..dec.chunk_count()).step_by(UNIT_CHUNKS).map(move |first| {
                        let chunks = first..(first + UNIT_CHUNKS).min(dec.chunk_count());
                        let range = dec.byte_range(chunks.clone());
                        Unit { decoder: d, chunks, offset: offset + range.start as u64, len: range.len() }
                    })
                })
                .collect();
            // Windows: runs of consecutive units (in file order) of about this many bytes.
            let window_bytes = (rayon::current_num_threads() * WINDOW_BYTES_PER_THREAD).max(MIN_WINDOW_BYTES);
            let windows = crate::codec::runs_within(units.iter().map(|u| u.len as u64), window_bytes as u64);
            // Decodes window `w` into `buf` and returns the hash of each of its units.
            let decode_window = |w: &Range<usize>, buf: &mut Vec<u8>| -> Result<Vec<Vec<NodeHash>>> {
                let len: usize = units[w.clone()].iter().map(|u| u.len).sum();
                buf.resize(len, 0);
                let mut rest = &mut buf[..];
                let mut work = Vec::with_capacity(w.len());
                for u in &units[w.clone()] {
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(u.len);
                    rest = tail;
                    work.push((u, head));
                }
                let hashes = work
                    .into_par_iter()
                    .map(|(u, dst)| -> Result<Vec<NodeHash>> {
                        decoders[u.decoder].decode_into(u.chunks.clone(), dst)?;
                        // Where the unit starts within its blob (the blob starts at chains[d].0).
                        let start = u.offset - chains[u.decoder].0;
                        let mut nodes = Vec::new();
                        blob_hashes[u.decoder].hash_range(start..start + dst.len() as u64, dst, &mut nodes);
                        Ok(nodes)
                    })
                    .collect::<Result<Vec<_>>>()?;
                // The chain objects' pages of a decoded window are not read again: drop them
                // from the resident set, or a deep delta chain keeps (depth + 1) compressed
                // copies of the batch resident (measured: 319 MiB RSS at depth 10 on a 91 MB
                // fp32 file).
                let mut last = None;
                for u in &units[w.clone()] {
                    if last != Some(u.decoder) {
                        chains[u.decoder].1.release_pages();
                        last = Some(u.decoder);
                    }
                }
                Ok(hashes)
            };
            // While the pool decodes window k, this thread checks and writes window k-1.
            crate::codec::double_buffered(
                windows.len(),
                &mut buffers,
                |k, buf| decode_window(&windows[k], buf),
                |p, decoded, hashes| {
                    for (u, nodes) in units[windows[p].clone()].iter().zip(hashes) {
                        blob_nodes.extend(nodes);
                        if u.chunks.end == decoders[u.decoder].chunk_count() {
                            let (_, chain) = &chains[u.decoder];
                            let joined = blob_hashes[u.decoder]
                                .join(std::mem::take(&mut blob_nodes), None)
                                .expect("the blob's units cover it on blake3's grid");
                            chain.check_hash(ObjectId(*joined.as_bytes()))?;
                        }
                    }
                    // One pwrite per run of units contiguous in the file: bundled tensors
                    // (written below) leave holes between the blobs' segments.
                    let mut at = 0;
                    let window = &units[windows[p].clone()];
                    for run in window.chunk_by(|a, b| a.offset + a.len as u64 == b.offset) {
                        let len: usize = run.iter().map(|u| u.len).sum();
                        file.write_all_at(&decoded[at..at + len], run[0].offset).map_err(|e| io_err("writing", e))?;
                        at += len;
                    }
                    done += decoded.len() as u64;
                    self.progress.set(progress_base + done);
                    Ok(())
                },
            )?;
        }
        // Every non-empty segment matched its blob id above; empty ones are the empty blob.
        let empty = ObjectId::hash(&[]);
        let mut ids: Vec<ObjectId> =
            manifest.segments.iter().map(|s| if s.len == 0 { empty } else { s.blob.unwrap_or(empty) }).collect();
        // Bundles: each decoded whole (at most `BUNDLE_MAX` bytes, checked against its id), its
        // tensors written where they belong and hashed: their ids are not recorded, the file
        // hash below binds them.
        for (bundle, members) in manifest.bundles.iter().zip(manifest.bundle_members()) {
            let bytes = super::bundle::read_bundle(self, bundle)?;
            for i in members {
                let slice = &bytes[super::bundle::slice(manifest, &manifest.segments[i])];
                ids[i] = ObjectId::hash(slice);
                file.write_all_at(slice, bundled_at[i]).map_err(|e| io_err("writing", e))?;
            }
            done += bundle.len;
            self.progress.set(progress_base + done);
        }
        let hash = super::model::file_hash(manifest.len, manifest.segments.iter().map(|s| s.len).zip(ids));
        if hash != entry.hash {
            return Err(Error::HashMismatch { path: entry.path.clone(), expected: entry.hash, actual: hash });
        }
        Ok(manifest.len)
    }

    /// A safetensors header for the tensors of `segments`, in file order, keeping the original
    /// `__metadata__`.
    fn filtered_header(&self, manifest: &Manifest, segments: &[usize]) -> Result<Vec<u8>> {
        let first = manifest.segments.first().filter(|s| s.tensor.is_none()).ok_or_else(|| Error::CorruptMetadata {
            id: manifest.hash,
            reason: "safetensors manifest without a header segment".into(),
        })?;
        let (first_blob, _) = manifest.location(first);
        let mut raw = Vec::with_capacity(first.len as usize);
        self.store.open_blob(&first_blob)?.copy_to(&mut raw)?;
        let parsed = safetensors::parse_header(&raw, manifest.len).map_err(|e| Error::CorruptMetadata {
            id: first_blob,
            reason: format!("stored safetensors header: {e}"),
        })?;
        let tensors: Vec<(String, crate::Dtype, Vec<u64>)> = segments
            .iter()
            .filter_map(|&i| manifest.segments[i].tensor.as_ref())
            .map(|t| {
                let dtype = t.dtype().expect("checked when the manifest was parsed");
                (t.name.clone(), dtype, t.shape.clone())
            })
            .collect();
        safetensors::write_header(&tensors, parsed.metadata.as_ref())
            .map_err(|e| Error::CorruptMetadata { id: first_blob, reason: format!("building a header: {e}") })
    }

    /// Remembers a checked-out working file's size, mtime and hash for `status`.
    fn record_stat(&self, rp: &RepoPath, entry: &FileEntry) {
        if let Ok(m) = std::fs::metadata(rp.under(&self.root)) {
            self.index_stat(rp.as_str(), &super::status::stat_record(&m, entry.hash, now_ns()));
        }
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

    #[test]
    fn tensor_patterns() {
        let f = TensorFilter::new;
        assert!(f("attn").matches("layers.0.attn.q"));
        assert!(!f("mlp").matches("layers.0.attn.q"));
        assert!(f("layers.*.q").matches("layers.0.attn.q"));
        assert!(f("*").matches(""));
        assert!(f("l?yers*").matches("layers.1"));
        assert!(!f("layers.*.k").matches("layers.0.attn.q"));
        assert!(f("*.weight").matches("a.b.weight"));
        assert!(!f("*.weight").matches("a.b.weight.x"));
        assert!(f("a*b*c").matches("aXXbYYc"));
        assert!(!f("a*b*c").matches("aXXbYY"));
    }
}
