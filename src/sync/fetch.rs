//! `fetch`: the network half walks down from the remote's refs and downloads what this store
//! lacks into a staging directory without the writer lock; the local half takes the lock and
//! imports it bottom-up, each object verified (stage.rs), then moves the remote-tracking refs.

use super::remote_view::remote_refs;
use super::remotes::{open_remote, RefUpdate};
use super::stage::{stage_locked, stage_then_lock, Stage};
use super::Result;
use crate::object_id::ObjectId;
use crate::remote::Remote;
use crate::repo::graph::{self, Node};
use crate::repo::{check_name, RefKind, Repo, VersionId, WriterLock};
use std::collections::{HashSet, VecDeque};

/// What a fetch did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetchReport {
    /// The remote's URL.
    pub remote: String,
    /// Remote-tracking refs (branches) and tags created or moved.
    pub updated: Vec<RefUpdate>,
    /// Objects downloaded and stored.
    pub objects_received: u64,
    /// Bytes downloaded.
    pub bytes_received: u64,
    /// Requests sent to the remote.
    pub requests: u64,
}

/// Fetches from the remote `name`: every version its branches and tags reach that is not
/// here, verified object by object; then `refs/remotes/NAME/BRANCH` for its branches, and
/// its tags as local tags where no local tag of that name exists.
pub fn fetch(repo: &Repo, name: &str, transfers: usize) -> Result<FetchReport> {
    let remote = open_remote(repo, name)?;
    fetch_from(repo, remote.as_ref(), name, transfers)
}

/// [`fetch`] from an opened remote, recorded under the remote name `name`.
pub fn fetch_from(repo: &Repo, remote: &dyn Remote, name: &str, transfers: usize) -> Result<FetchReport> {
    fetch_refs(repo, remote, name, transfers, None, None)
}

/// [`fetch_from`]; with `only_branch`, that branch alone (no tags), and with `depth`
/// only its newest `depth` versions (partial.rs).
pub(super) fn fetch_refs(
    repo: &Repo,
    remote: &dyn Remote,
    name: &str,
    transfers: usize,
    only_branch: Option<&str>,
    depth: Option<usize>,
) -> Result<FetchReport> {
    check_name(name)?;
    let mut report = FetchReport { remote: remote.url().to_string(), ..FetchReport::default() };
    let refs: Vec<(RefKind, String, VersionId)> =
        remote_refs(remote, only_branch)?.into_iter().map(|r| (r.kind, r.name, r.id)).collect();
    let roots: Vec<VersionId> = refs.iter().map(|r| r.2).filter(|id| !repo.store().contains(id)).collect();
    // The transfer runs without the writer lock (commits go on meanwhile); the lock is
    // taken to store what arrived and move the refs.
    let _lock = download_then_lock(repo, remote, &roots, transfers, &mut report, depth, name)?;
    // A ref's version already here when listed may have been deleted by a gc since.
    let gone: Vec<VersionId> = refs.iter().map(|r| r.2).filter(|id| !repo.store().contains(id)).collect();
    if !gone.is_empty() {
        download(repo, remote, &gone, transfers, &mut report, depth, name)?;
    }

    for (kind, ref_name, id) in refs {
        match kind {
            RefKind::Branch => {
                let old = repo.refs().get_remote(name, &ref_name)?;
                if old != Some(id) {
                    repo.refs().set_remote(name, &ref_name, &id)?;
                    report.updated.push(RefUpdate { kind: "branch", name: format!("{name}/{ref_name}"), old, new: id });
                }
            }
            RefKind::Tag => {
                if repo.refs().get(RefKind::Tag, &ref_name)?.is_none() {
                    repo.refs().set(RefKind::Tag, &ref_name, &id)?;
                    report.updated.push(RefUpdate { kind: "tag", name: ref_name, old: None, new: id });
                }
            }
        }
    }
    report.requests = remote.requests();
    Ok(report)
}

/// Downloads what `roots` need and this store lacks, verifies every object and stores it
/// bottom-up (stage.rs), so that an object present here always has everything it needs and an
/// interrupted fetch is resumed by walking down from the roots again. The caller holds the
/// writer lock (for the whole transfer: used where the network is not the bottleneck).
///
/// With `depth`, only versions fewer than `depth` parents away from a root are downloaded
/// (a partial clone); those whose parents stay behind are recorded as cut versions of
/// remote `remote_name` (partial.rs) before anything is stored.
pub(super) fn download(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    report: &mut FetchReport,
    depth: Option<usize>,
    remote_name: &str,
) -> Result<()> {
    let (stage, cut) = stage_locked(repo, remote, |stage| walk_down(stage, roots, transfers, depth))?;
    import(stage, &cut, report, remote_name)
}

/// [`download`] without the writer lock, which is taken to store what arrived (stage.rs,
/// [`stage_then_lock`]) and returned.
pub(super) fn download_then_lock(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    report: &mut FetchReport,
    depth: Option<usize>,
    remote_name: &str,
) -> Result<WriterLock> {
    let (lock, stage, cut) = stage_then_lock(repo, remote, |stage| walk_down(stage, roots, transfers, depth))?;
    import(stage, &cut, report, remote_name)?;
    Ok(lock)
}

/// The network half of a fetch: walks down from `roots` (breadth first, so that a version's
/// distance from the roots is its shortest) and downloads into `stage` every version,
/// manifest and blob (with the delta references it needs) this store lacks. Returns the
/// versions whose parents stay behind (`depth`).
fn walk_down(stage: &Stage, roots: &[VersionId], transfers: usize, depth: Option<usize>) -> Result<Vec<VersionId>> {
    let repo = stage.repo;
    repo.progress().start("fetch", 0);
    let mut blobs: Vec<ObjectId> = Vec::new();
    let mut seen: HashSet<ObjectId> = HashSet::new();
    let mut cut = Vec::new();
    let mut queue: VecDeque<(VersionId, usize)> = roots.iter().map(|r| (*r, 0)).collect();
    while let Some((id, level)) = queue.pop_front() {
        if stage.here(&id) || !seen.insert(id) {
            continue;
        }
        let (parents, files): (Vec<Node>, Vec<Node>) =
            graph::edges(stage, Node::Version(id))?.into_iter().partition(|n| matches!(n, Node::Version(_)));
        for file in files {
            if !stage.here(&file.id()) && seen.insert(file.id()) {
                blobs.extend(graph::edges(stage, file)?.iter().map(Node::id));
            }
        }
        let parents: Vec<VersionId> = parents.iter().map(Node::id).collect();
        if depth.is_some_and(|d| level + 1 >= d) {
            if parents.iter().any(|p| !repo.store().contains(p)) {
                cut.push(id);
            }
        } else {
            queue.extend(parents.into_iter().map(|p| (p, level + 1)));
        }
    }
    stage.blobs(blobs, transfers)?;
    repo.progress().finish();
    Ok(cut)
}

/// The local half of a fetch (the caller holds the writer lock): records the `cut` versions,
/// then stores what `stage` holds.
fn import(stage: Stage, cut: &[VersionId], report: &mut FetchReport, remote_name: &str) -> Result<()> {
    if !cut.is_empty() {
        stage.repo.add_cut(remote_name, cut)?;
    }
    report.bytes_received += stage.bytes();
    report.objects_received += stage.import()?;
    Ok(())
}
