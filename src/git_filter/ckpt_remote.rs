//! The ckpt remote of a git repository: where `git push` sends the objects its pointers need
//! (through the `pre-push` hook) and where smudge takes an object the local store lacks.
//!
//! git carries the pointers; the remote carries objects only (no ckpt refs or versions), in
//! the layout of any ckpt remote (docs/format.md, "Remotes"), so a directory or an
//! `s3://bucket/prefix` serves both. Its URL is `git config ckpt.remote`, else `ckpt.remote`
//! in a committed `.ckptconfig` at the root of the working tree (git-config syntax, like Git
//! LFS's `.lfsconfig`; read from the working tree, else from `HEAD`, so a clone knows it
//! before that file is checked out). A relative directory path is relative to the working
//! tree's root. `git config ckpt.layout` (`mirror`, the default, or `deltas`) sets how the
//! pre-push hook uploads.

use super::pointer::{self, Pointer};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::repo::Repo;
use crate::sync::FileTransfer;
use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;

/// The committed configuration file read for `ckpt.remote`.
pub(crate) const CONFIG_FILE: &str = ".ckptconfig";

/// Where a ckpt remote URL came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The URL, a relative directory path already resolved against the working tree.
    pub url: String,
    /// `git config` or `.ckptconfig`.
    pub source: &'static str,
}

/// The ckpt remote of `git`, if one is configured (see the module documentation).
pub fn remote_url(git: &git2::Repository) -> Result<Option<RemoteUrl>> {
    let base = git.workdir().unwrap_or_else(|| git.path()).to_path_buf();
    let config = git.config().map_err(super::git("reading git config"))?;
    if let Ok(url) = config.get_string("ckpt.remote") {
        return Ok(Some(RemoteUrl { url: resolve(&base, &url), source: "git config ckpt.remote" }));
    }
    let Some(url) = committed_remote(git)? else { return Ok(None) };
    Ok(Some(RemoteUrl { url: resolve(&base, &url), source: CONFIG_FILE }))
}

/// The layout the pre-push hook uploads in: `git config ckpt.layout` (`mirror` or `deltas`),
/// else [`crate::sync::Layout::Mirror`] (docs/format.md, "Layout on the remote").
pub fn layout(git: &git2::Repository) -> Result<crate::sync::Layout> {
    let config = git.config().map_err(super::git("reading git config"))?;
    match config.get_string("ckpt.layout") {
        Ok(name) => name.trim().parse().map_err(|reason: String| Error::Git {
            action: "reading ckpt.layout".into(),
            source: git2::Error::from_str(&reason),
        }),
        Err(_) => Ok(crate::sync::Layout::default()),
    }
}

/// A directory path relative to `base` made absolute; URLs as they are.
fn resolve(base: &Path, url: &str) -> String {
    if url.contains("://") || Path::new(url).is_absolute() {
        return url.to_string();
    }
    base.join(url).to_string_lossy().into_owned()
}

/// `ckpt.remote` from `.ckptconfig` in the working tree, else from the tree of `HEAD`.
fn committed_remote(git: &git2::Repository) -> Result<Option<String>> {
    if let Some(file) = git.workdir().map(|w| w.join(CONFIG_FILE)).filter(|f| f.is_file()) {
        return read_remote_key(&file);
    }
    let blob = git
        .head()
        .ok()
        .and_then(|h| h.peel_to_tree().ok())
        .and_then(|t| t.get_path(Path::new(CONFIG_FILE)).ok())
        .and_then(|e| git.find_blob(e.id()).ok());
    let Some(blob) = blob else { return Ok(None) };
    // git2 reads config syntax from files only.
    let tmp = tempfile::NamedTempFile::new().map_err(|source| Error::Io {
        action: "creating a temporary file for",
        path: CONFIG_FILE.into(),
        source,
    })?;
    std::fs::write(tmp.path(), blob.content()).map_err(|source| Error::Io {
        action: "writing",
        path: tmp.path().to_path_buf(),
        source,
    })?;
    read_remote_key(tmp.path())
}

fn read_remote_key(file: &Path) -> Result<Option<String>> {
    let config = git2::Config::open(file).map_err(super::git(format!("reading {}", file.display())))?;
    match config.get_string("ckpt.remote") {
        Ok(url) if !url.trim().is_empty() => Ok(Some(url.trim().to_string())),
        Ok(_) => Ok(None),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(source) => Err(Error::Git { action: format!("reading ckpt.remote from {}", file.display()), source }),
    }
}

/// Opens the ckpt remote at `url` to read from (S3 settings from the `AWS_*` environment
/// variables; a directory must exist).
pub fn open(url: &str) -> Result<Box<dyn crate::remote::Remote>> {
    crate::remote::open(url, &crate::remote::S3Options::default()).map_err(|e| Error::Sync(e.into()))
}

/// Opens the ckpt remote at `url` to push to: as [`open`], but a directory remote is created
/// if missing (as `ckpt remote add` does).
pub fn open_for_push(url: &str) -> Result<Box<dyn crate::remote::Remote>> {
    if url.starts_with("file://") || !url.contains("://") {
        let dir = crate::remote::local::DirRemote::create(url).map_err(|e| Error::Sync(e.into()))?;
        return Ok(Box::new(dir));
    }
    open(url)
}

// ---- pre-push -------------------------------------------------------------------------------

/// One line git writes to a `pre-push` hook's stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedRef {
    /// The local ref (`(delete)` for a deletion).
    pub local_ref: String,
    /// The commit pushed (all zeros for a deletion).
    pub local: git2::Oid,
    /// The ref on the remote.
    pub remote_ref: String,
    /// Where the remote has it (all zeros for a new ref).
    pub remote: git2::Oid,
}

/// Longest stdin line accepted from git (two ref names and two object ids).
const MAX_LINE: u64 = 64 * 1024;

/// Parses git's `pre-push` stdin: `<local ref> <local oid> <remote ref> <remote oid>` lines.
pub fn parse_pushed_refs(input: impl BufRead) -> Result<Vec<PushedRef>> {
    let mut out = Vec::new();
    let mut input = input;
    let mut n = 0;
    loop {
        let mut line = Vec::new();
        let read = std::io::Read::take(&mut input, MAX_LINE).read_until(b'\n', &mut line).map_err(|source| {
            Error::Io { action: "reading git's pre-push input from", path: "stdin".into(), source }
        })?;
        if read == 0 {
            return Ok(out);
        }
        n += 1;
        let bad = |reason: &str| Error::PrePushInput { line: n, reason: reason.to_string() };
        if !line.ends_with(b"\n") && read as u64 == MAX_LINE {
            return Err(bad("longer than 64 KiB"));
        }
        let text = std::str::from_utf8(&line).map_err(|_| bad("not UTF-8"))?.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            continue;
        }
        let fields: Vec<&str> = text.split(' ').collect();
        let &[local_ref, local, remote_ref, remote] = fields.as_slice() else {
            return Err(bad("expected `<local ref> <local sha> <remote ref> <remote sha>`"));
        };
        let oid = |s: &str| git2::Oid::from_str(s).ok().filter(|_| s.len() >= 40).ok_or_else(|| bad("a bad object id"));
        out.push(PushedRef {
            local_ref: local_ref.to_string(),
            local: oid(local)?,
            remote_ref: remote_ref.to_string(),
            remote: oid(remote)?,
        });
    }
}

/// The pointers in the trees of the commits `refs` push: reachable from each pushed commit
/// and not from where the remote has the ref (every commit of a new ref); each pointer once,
/// with one path it was seen at.
pub fn pushed_pointers(git: &git2::Repository, refs: &[PushedRef]) -> Result<Vec<(String, Pointer)>> {
    let mut walk = git.revwalk().map_err(super::git("walking history"))?;
    let mut any = false;
    for r in refs {
        if r.local.is_zero() {
            continue; // a deletion pushes nothing
        }
        walk.push(r.local).map_err(super::git(format!("reading the pushed commit {}", r.local)))?;
        any = true;
        // A remote commit this repository does not have hides nothing (git would have
        // refused a non-fast-forward push anyway, unless forced).
        if !r.remote.is_zero() && git.find_commit(r.remote).is_ok() {
            walk.hide(r.remote).map_err(super::git(format!("reading the remote's commit {}", r.remote)))?;
        }
    }
    let mut out = Vec::new();
    if !any {
        return Ok(out);
    }
    let mut seen_trees = HashSet::new();
    let mut seen_blobs = HashSet::new();
    for oid in walk {
        let oid = oid.map_err(super::git("walking history"))?;
        let tree = git.find_commit(oid).and_then(|c| c.tree()).map_err(super::git(format!("reading commit {oid}")))?;
        if !seen_trees.insert(tree.id()) {
            continue;
        }
        let mut blobs = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| match entry.kind() {
            // A subtree seen in another commit holds the same pointers.
            Some(git2::ObjectType::Tree) if !seen_trees.insert(entry.id()) => git2::TreeWalkResult::Skip,
            Some(git2::ObjectType::Blob) => {
                if seen_blobs.insert(entry.id()) {
                    blobs.push((format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes())), entry.id()));
                }
                git2::TreeWalkResult::Ok
            }
            _ => git2::TreeWalkResult::Ok,
        })
        .map_err(super::git(format!("reading the tree of {oid}")))?;
        for (path, id) in blobs {
            let Ok(blob) = git.find_blob(id) else { continue };
            if blob.size() <= pointer::MAX_LEN {
                if let Ok(p) = Pointer::parse(blob.content()) {
                    out.push((path, p));
                }
            }
        }
    }
    Ok(out)
}

/// For each pushed file (manifest), the file the remote already holds at the same path: the
/// pointer at that path in the commit the remote has the ref at, or for a new ref in the
/// newest commit of `refs/remotes/<remote_name>/*` (commits the remote is known to have). A
/// push sends the file's blobs as deltas against that file's where it pays (see
/// [`crate::sync::push_files_against`]); a path without such a pointer goes up whole.
pub fn previous_files(
    git: &git2::Repository,
    refs: &[PushedRef],
    remote_name: Option<&str>,
    pointers: &[(String, Pointer)],
) -> Result<HashMap<ObjectId, ObjectId>> {
    let mut bases: Vec<git2::Tree> = Vec::new();
    let mut new_ref = false;
    for r in refs.iter().filter(|r| !r.local.is_zero()) {
        match (!r.remote.is_zero()).then(|| git.find_commit(r.remote).ok()).flatten() {
            Some(c) => bases.extend(c.tree().ok()),
            None => new_ref = true,
        }
    }
    if new_ref {
        if let Some(tree) = remote_name.and_then(|name| newest_remote_commit(git, name)) {
            bases.push(tree);
        }
    }
    let mut out = HashMap::new();
    for (path, p) in pointers {
        if out.contains_key(&p.manifest) {
            continue;
        }
        for tree in &bases {
            let Some(old) = tree.get_path(Path::new(path)).ok().and_then(|e| git.find_blob(e.id()).ok()) else {
                continue;
            };
            if old.size() > pointer::MAX_LEN {
                continue;
            }
            if let Ok(old) = Pointer::parse(old.content()) {
                if old.manifest != p.manifest {
                    out.insert(p.manifest, old.manifest);
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// The tree of the newest commit (by committer time) a `refs/remotes/<remote_name>/*` ref
/// names, if any (none for a remote given as a URL, which has no such refs).
fn newest_remote_commit<'a>(git: &'a git2::Repository, remote_name: &str) -> Option<git2::Tree<'a>> {
    let refs = git.references_glob(&format!("refs/remotes/{remote_name}/*")).ok()?;
    let newest = refs.filter_map(|r| r.ok()?.peel_to_commit().ok()).max_by_key(|c| c.time().seconds());
    newest.and_then(|c| c.tree().ok())
}

/// What `ckpt git pre-push` did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrePushReport {
    /// Pointers found in the pushed commits.
    pub pointers: usize,
    /// The transfer (its `files` counts distinct files).
    pub transfer: FileTransfer,
}

/// Uploads to `remote` the objects of the files `pointers` name in `layout` ([`layout`]): in
/// the mirror layout whole, the files `previous` names then recoded on the remote as deltas
/// against them; in the deltas layout as deltas against those files where that pays (see
/// [`crate::sync::push_files_against`] and [`previous_files`]). A file neither the local store nor the remote holds is an error
/// naming its path, after the others went up.
pub fn push_pointers(
    store: &Repo,
    remote: &dyn crate::remote::Remote,
    pointers: &[(String, Pointer)],
    previous: &HashMap<ObjectId, ObjectId>,
    layout: crate::sync::Layout,
) -> Result<PrePushReport> {
    let mut seen = HashSet::new();
    let manifests: Vec<ObjectId> = pointers.iter().map(|(_, p)| p.manifest).filter(|m| seen.insert(*m)).collect();
    let transfer = crate::sync::push_files_against(store, remote, &manifests, previous, layout)?;
    if let Some(missing) = transfer.missing.first() {
        let path = pointers.iter().find(|(_, p)| p.manifest == *missing).map_or("?", |(path, _)| path.as_str());
        return Err(Error::NotPushable {
            path: path.to_string(),
            manifest: *missing,
            remote: transfer.remote.clone(),
            count: transfer.missing.len(),
        });
    }
    Ok(PrePushReport { pointers: pointers.len(), transfer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_push_lines_parse_strictly() {
        let a = "1".repeat(40);
        let zero = "0".repeat(40);
        let input = format!("refs/heads/main {a} refs/heads/main {zero}\n\n(delete) {zero} refs/heads/old {a}\n");
        let refs = parse_pushed_refs(input.as_bytes()).unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].local.to_string(), a);
        assert!(refs[0].remote.is_zero() && refs[1].local.is_zero());
        assert_eq!(refs[1].remote_ref, "refs/heads/old");
        for (bad, why) in [
            (format!("refs/heads/main {} refs/heads/main {zero}\n", &a[..12]), "a bad object id"),
            (format!("refs/heads/main {a} refs/heads/main\n"), "expected"),
            (format!("refs/heads/main {a}  refs/heads/main {zero}\n"), "expected"),
            ("x".repeat(70_000), "longer than 64 KiB"),
            ("\u{ff}".to_string(), "expected"),
        ] {
            let e = parse_pushed_refs(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("line 1") && e.contains(why), "{e}");
        }
        let e = parse_pushed_refs(&b"\xff\xfe\n"[..]).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn relative_directory_remotes_are_relative_to_the_working_tree() {
        let base = Path::new("/repo");
        assert_eq!(resolve(base, "../weights"), "/repo/../weights");
        assert_eq!(resolve(base, "/abs/weights"), "/abs/weights");
        assert_eq!(resolve(base, "s3://bucket/p"), "s3://bucket/p");
        assert_eq!(resolve(base, "file:///w"), "file:///w");
    }
}
