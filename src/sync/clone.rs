//! `pull` (fetch, then fast-forward or rebase the current branch) and `clone` (a new
//! repository with remote `origin`, fetched, optionally to a depth: a partial clone).

use super::fetch::{fetch, fetch_from, fetch_refs, FetchReport};
use super::remote_view::{default_branch, remote_refs};
use super::remotes::{absolute_dir_url, add_remote, Layout};
use super::{Error, Result};
use crate::remote::{self, Remote, S3Options};
use crate::repo::Error as RepoError;
use crate::repo::{Head, RefKind, Repo, VersionId};
use std::path::Path;

/// What `pull` did to the current branch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PullOutcome {
    /// Already at the remote's version.
    UpToDate,
    /// The branch holds versions the remote lacks and nothing new came: push them.
    Ahead,
    /// The branch had diverged and was rebased (`pull --rebase`): its own versions now sit on
    /// top of the remote's, with the same files.
    Rebased {
        /// The old tip.
        from: VersionId,
        /// The remote's version it now builds on.
        onto: VersionId,
        /// The new tip.
        to: VersionId,
    },
    /// Moved forward (and checked out).
    FastForwarded {
        /// Where it was (`None`: the branch had no version).
        from: Option<VersionId>,
        /// Where it is.
        to: VersionId,
    },
}

/// Fetches from `name` and moves the current branch to the remote's branch of the same
/// name if that is a fast-forward, checking its files out (refusing, like `switch`, when a
/// tracked file is modified). A diverged branch is an error that says what to do.
///
/// With `rebase`, a diverged branch is rebased instead: each of its versions the remote
/// lacks (along first parents, oldest first) becomes a new version with the same files
/// and message on top of the remote's, so the working tree is unchanged and the branch
/// can be pushed. Versions are snapshots, so this is exact: nothing is merged.
pub fn pull(repo: &Repo, name: &str, transfers: usize, rebase: bool) -> Result<(FetchReport, PullOutcome)> {
    let report = fetch(repo, name, transfers)?;
    let Head::Branch(branch) = repo.refs().head()? else {
        return Err(Error::from(RepoError::UnknownRevision {
            rev: "HEAD".into(),
            reason: "detached: switch to a branch to pull".into(),
        }));
    };
    let theirs = repo.refs().get_remote(name, &branch)?.ok_or_else(|| {
        Error::from(RepoError::UnknownRevision {
            rev: format!("{name}/{branch}"),
            reason: format!("remote {name:?} has no branch {branch:?}"),
        })
    })?;
    let _lock = repo.lock()?;
    let local = repo.refs().get(RefKind::Branch, &branch)?;
    let outcome = match local {
        Some(l) if l == theirs => PullOutcome::UpToDate,
        Some(l) if repo.is_ancestor(&theirs, &l)? => PullOutcome::Ahead,
        Some(l) if !repo.is_ancestor(&l, &theirs)? => {
            if !rebase {
                return Err(Error::Diverged { branch, remote: name.into(), local: l, theirs });
            }
            let to = rebase_onto(repo, &l, &theirs)?;
            repo.refs().set(RefKind::Branch, &branch, &to)?;
            repo.flush_index();
            PullOutcome::Rebased { from: l, onto: theirs, to }
        }
        _ => {
            // As `switch` does: refuses (naming them) to overwrite modified or untracked files
            // and removes the files the new tip no longer holds.
            // (`pull` has no --force: the message says what to do instead.)
            repo.check_out(&theirs, true).map_err(|e| match e {
                RepoError::DirtyWorkingTree { paths, untracked } => {
                    Error::PullBlocked { branch: branch.clone(), theirs: format!("{name}/{branch}"), paths, untracked }
                }
                e => Error::Repo(e),
            })?;
            repo.refs().set(RefKind::Branch, &branch, &theirs)?;
            PullOutcome::FastForwarded { from: local, to: theirs }
        }
    };
    Ok((report, outcome))
}

/// Rewrites the versions from `tip` back along first parents to (excluding) the first one
/// `onto` already has, as new versions on top of `onto`; returns the new tip.
fn rebase_onto(repo: &Repo, tip: &VersionId, onto: &VersionId) -> Result<VersionId> {
    let mut chain = Vec::new();
    let mut next = Some(*tip);
    while let Some(id) = next {
        if repo.is_ancestor(&id, onto)? {
            break;
        }
        let version = repo.version(&id)?;
        next = version.parents.first().copied();
        chain.push(version);
    }
    let base_every = repo.config().base_every.max(1);
    let mut parent = *onto;
    let mut parent_since_base = repo.version(onto)?.since_base;
    for old in chain.into_iter().rev() {
        let since_base = if parent_since_base + 1 < base_every { parent_since_base + 1 } else { 0 };
        let version = crate::repo::Version {
            parents: vec![parent],
            since_base,
            // The objects are shared with the old version: this one adds none.
            stored_bytes: 0,
            ..old
        };
        parent = repo.record_version(&version)?;
        parent_since_base = since_base;
    }
    Ok(parent)
}

/// Clones: creates a repository in `dir`, adds `url` as remote `origin`, fetches it and
/// checks out its `main` branch (or its first branch), which becomes the current branch.
/// Progress of the download goes to `progress`.
pub fn clone_from(
    url: &str,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
) -> Result<(Repo, FetchReport)> {
    clone_with_depth(url, dir, s3, transfers, progress, None)
}

/// [`clone_from`]; with `depth`, a partial clone: only the cloned branch (`main`, or
/// the first), and only its newest `depth` versions with what they need (partial.rs).
pub fn clone_with_depth(
    url: &str,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
    depth: Option<usize>,
) -> Result<(Repo, FetchReport)> {
    remote::check_no_secrets(url)?;
    if let Some(endpoint) = &s3.endpoint {
        remote::check_no_secrets(endpoint)?;
    }
    let cwd = std::env::current_dir().map_err(|e| Error::Io { action: "reading", path: ".".into(), source: e })?;
    let url = &absolute_dir_url(url, &cwd);
    // Open the remote first: a bad URL leaves no repository behind.
    let remote = remote::open(url, &s3)?;
    // As `git clone`: into a new or empty directory only, and a failed clone removes what
    // it created (the directories it made, or what it put in the empty one).
    // A clone of the same URL killed in this directory: resumed (its downloads too).
    if let Some(marker) = interrupted_clone(dir) {
        if marker == (Cloning { url: url.clone(), depth }) {
            return clone_into(url, remote.as_ref(), dir, s3, transfers, progress, depth);
        }
    }
    let created = match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::from(RepoError::InvalidPath {
                    path: dir.to_path_buf(),
                    reason: "exists and is not an empty directory (clone into a new or empty one)".into(),
                }));
            }
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The outermost directory this clone will create.
            let mut top = dir.to_path_buf();
            while let Some(parent) = top.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
                top = parent.to_path_buf();
            }
            Some(top)
        }
        Err(source) => return Err(Error::Io { action: "reading", path: dir.to_path_buf(), source }),
    };
    let result = clone_into(url, remote.as_ref(), dir, s3, transfers, progress, depth);
    if result.is_err() {
        match &created {
            Some(top) => {
                let _ = std::fs::remove_dir_all(top);
            }
            None => {
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for entry in entries.flatten() {
                        let path = entry.path();
                        let _ = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                            std::fs::remove_dir_all(&path)
                        } else {
                            std::fs::remove_file(&path)
                        };
                    }
                }
            }
        }
    }
    result
}

/// What `.ckpt/cloning` holds while a clone runs (docs/format.md, "Transfer state").
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Cloning {
    /// The URL cloned, as stored for `origin`.
    url: String,
    /// `--depth`, if given.
    depth: Option<usize>,
}

/// The marker file of a clone in progress.
const CLONING_FILE: &str = "cloning";

/// What `dir` holds if it is a clone that was killed: only `.ckpt`, with a readable
/// `.ckpt/cloning` (at most 64 KiB).
fn interrupted_clone(dir: &Path) -> Option<Cloning> {
    let mut entries = std::fs::read_dir(dir).ok()?;
    let only = entries.next()?.ok()?;
    if only.file_name() != ".ckpt" || entries.next().is_some() {
        return None;
    }
    let file = std::fs::File::open(only.path().join(CLONING_FILE)).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 64 << 10), &mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The body of [`clone_with_depth`], once `dir` is known to be new or empty, or to hold a
/// killed clone of the same URL and depth (which is resumed).
fn clone_into(
    url: &str,
    remote: &dyn Remote,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
    depth: Option<usize>,
) -> Result<(Repo, FetchReport)> {
    let only_branch = match depth {
        Some(0) => {
            return Err(Error::from(RepoError::UnknownRevision {
                rev: "--depth 0".into(),
                reason: "the depth must be at least 1".into(),
            }))
        }
        Some(_) => {
            // Read, not only listed: a branch that cannot be read is an error, not left out.
            default_branch(remote_refs(remote, None)?.into_iter().filter(|r| r.kind == RefKind::Branch).map(|r| r.name))
        }
        None => None,
    };
    let resume = dir.join(".ckpt").join(CLONING_FILE).is_file();
    let mut repo = if resume { Repo::open(dir)? } else { Repo::init(dir)? };
    if let Some(p) = progress {
        repo.set_progress(p);
    }
    let marker = repo.ckpt_dir().join(CLONING_FILE);
    if !resume {
        let mut text = serde_json::to_string(&Cloning { url: url.to_string(), depth }).expect("serializes");
        text.push('\n');
        repo.refs().write(&marker, &text)?;
    }
    // Killed before it was added, a resumed clone adds it now.
    if !resume || !super::remotes::remotes(&repo)?.contains_key("origin") {
        add_remote(&repo, "origin", url, s3, Layout::default())?;
    }
    let report = match (&only_branch, depth) {
        (Some(b), Some(_)) => fetch_refs(&repo, remote, "origin", transfers, Some(b), depth)?,
        _ => fetch_from(&repo, remote, "origin", transfers)?,
    };
    let fetched = report.updated.iter().filter(|u| u.kind == "branch");
    if let Some(branch) = default_branch(fetched.filter_map(|u| u.name.strip_prefix("origin/").map(str::to_string))) {
        let tip = repo.refs().get_remote("origin", &branch)?.expect("just fetched");
        repo.check_out(&tip, false)?;
        repo.refs().set(RefKind::Branch, &branch, &tip)?;
        repo.refs().set_head(&Head::Branch(branch))?;
    }
    std::fs::remove_file(&marker).map_err(|e| Error::Io { action: "removing", path: marker, source: e })?;
    Ok((repo, report))
}
