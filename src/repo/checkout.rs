//! `checkout`: a version's files, rebuilt blob by blob into a temp file next to the target,
//! hash-checked, then renamed into place. A damaged object makes the file fail; nothing wrong is
//! ever left under the target name.

use super::model::{FileEntry, FileFormat, Manifest, Version};
use super::status::now_ns;
use super::{Error, Repo, RepoPath, Result, VersionId};
use crate::safetensors;
use crate::store;
use std::io::Write;
use std::path::{Path, PathBuf};

mod whole_file;
mod working_tree;

use working_tree::{place_staged, refuse_overwriting, Cleared, Staged};

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

    /// Writes the files of version `id` as `target` says: selects them, plans their paths,
    /// guards the target directory, stages every file (verified), then puts them all in place
    /// or none.
    pub(super) fn checkout_version(&self, id: &VersionId, target: &Target<'_>) -> Result<CheckoutSummary> {
        let filter = target.filter;
        let version = self.version(id)?;
        let selected = self.selected_files(&version, id, target.files)?;
        let (out_dir, in_tree) = self.checkout_dir(target.output_dir)?;
        let planned = self.plan_paths(id, selected, &out_dir)?;
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
        let staged = self.stage_files(planned, staging.path(), filter)?;
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
        let placed = place_staged(&out_dir, staging, &cleared, staged)?;
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

    /// The files of `version` (id `id`) a checkout writes: all, or those at `paths`. A path the
    /// version holds no file at may be a directory: every file under it (as `ckpt commit DIR`
    /// took them).
    fn selected_files<'v>(
        &self,
        version: &'v Version,
        id: &VersionId,
        paths: Option<&[PathBuf]>,
    ) -> Result<Vec<&'v FileEntry>> {
        let Some(paths) = paths else { return Ok(version.files.iter().collect()) };
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
        Ok(selected)
    }

    /// The directory a checkout writes under (canonical, created if missing), and whether it
    /// is the working tree.
    fn checkout_dir(&self, output_dir: Option<&Path>) -> Result<(PathBuf, bool)> {
        let Some(d) = output_dir else { return Ok((self.root.clone(), true)) };
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
        Ok((d, in_tree))
    }

    /// The repository path of each selected file of version `id`, checked to stay out of
    /// `.ckpt` under `out_dir` and to be writable together.
    fn plan_paths<'e>(
        &self,
        id: &VersionId,
        selected: Vec<&'e FileEntry>,
        out_dir: &Path,
    ) -> Result<Vec<(&'e FileEntry, RepoPath)>> {
        let mut planned = Vec::with_capacity(selected.len());
        for entry in selected {
            let rp = RepoPath::parse(&entry.path).map_err(|reason| Error::CorruptMetadata {
                id: *id,
                reason: format!("path {:?}: {reason}", entry.path),
            })?;
            // An output directory above the root must not reach `.ckpt` through a stored path
            // such as `repo/.ckpt/HEAD` (out_dir is canonical; symlinked directories below it
            // are refused below).
            if rp.under(out_dir).starts_with(&self.dir) {
                return Err(Error::OutputInRepository { path: rp.under(out_dir), ckpt_dir: self.dir.clone() });
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
        Ok(planned)
    }

    /// Writes every planned file, verified, into `staging`, reporting progress over them all;
    /// a file the filter selects nothing in is left out.
    fn stage_files<'e>(
        &self,
        planned: Vec<(&'e FileEntry, RepoPath)>,
        staging: &Path,
        filter: Option<&TensorFilter>,
    ) -> Result<Vec<Staged<'e>>> {
        let total = planned.iter().map(|(f, _)| f.len).sum();
        self.progress.start("checkout", total);
        let mut staged = Vec::with_capacity(planned.len());
        let mut bytes = 0u64;
        for (entry, rp) in planned {
            let written = self
                .stage_file(entry, staging, filter, bytes)
                .map_err(|e| Error::File { path: entry.path.clone(), source: Box::new(e) })?;
            if let Some((tmp, n)) = written {
                bytes += n;
                staged.push((entry, rp, tmp, n));
            }
        }
        self.progress.finish();
        Ok(staged)
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
