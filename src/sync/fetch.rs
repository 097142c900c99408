//! `fetch`: the network half walks down from the remote's refs and downloads what this store
//! lacks into a staging directory without the writer lock; the local half takes the lock and
//! imports it bottom-up, each object verified (blobs bases first, manifests, versions parents
//! first), then moves the remote-tracking refs.

use super::remotes::{open_remote, remote_refs, RefUpdate};
use super::transfer::{parallel, receive_into, reopen, Staging};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, RefKind, Repo, VersionId, WriterLock};
use crate::store::ObjectKind;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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

/// What the network half of a fetch downloaded (temp files in a [`Staging`] directory).
#[derive(Default)]
struct Staged {
    /// Versions with their parents (the content is parsed again when stored: a fetch of a
    /// long history holds no more than one version's content at a time).
    versions: Vec<(VersionId, Vec<VersionId>, tempfile::TempPath)>,
    /// Manifests (checked against their ids).
    manifests: Vec<(ObjectId, tempfile::TempPath)>,
    /// Blobs (not checked yet) with the reference their header names.
    blobs: HashMap<ObjectId, (tempfile::TempPath, Option<ObjectId>)>,
    /// Versions whose parents stay behind (a partial clone's depth).
    cut: Vec<VersionId>,
    /// Objects the walk found already stored here and so did not download: they must still
    /// be here when the lock is taken.
    assumed: Vec<ObjectId>,
    /// Bytes downloaded.
    bytes: u64,
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
/// bottom-up (blobs bases first, manifests, versions parents first), so that an object
/// present here always has everything it needs and an interrupted fetch is resumed by
/// walking down from the roots again. The caller holds the writer lock (for the whole
/// transfer: used where the network is not the bottleneck, or by the git filter).
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
    let stage = Staging::create(repo.ckpt_dir())?;
    let mut staged = Staged::default();
    if let Err(e) = download_to_stage(repo, remote, roots, transfers, depth, &stage, &mut staged) {
        keep_arrived_blobs(repo, &mut staged.blobs);
        return Err(e);
    }
    import_staged(repo, staged, report, remote_name)
}

/// Stores the staged blobs that can be stored (standalone, or with their reference here),
/// bases first, skipping any that fails: what an interrupted fetch keeps. The caller holds
/// the writer lock.
fn keep_arrived_blobs(repo: &Repo, blobs: &mut HashMap<ObjectId, (tempfile::TempPath, Option<ObjectId>)>) {
    loop {
        let ready: Vec<ObjectId> =
            blobs.iter().filter(|(_, (_, r))| r.is_none_or(|r| repo.store().contains(&r))).map(|(id, _)| *id).collect();
        if ready.is_empty() {
            break;
        }
        for id in ready {
            let (path, _) = blobs.remove(&id).expect("ready is staged");
            // Best effort: a blob that fails to store is downloaded again by the rerun.
            let _ = reopen(path).and_then(|tmp| Ok(repo.import_object(&id, ObjectKind::Blob, tmp)?));
        }
    }
    repo.flush_index();
}

/// Downloads what `roots` need into `stage`, then takes the writer lock to store it:
/// the lock is held for local work only (docs/architecture.md, "What the lock covers").
/// If something the download took as present here is gone when the lock is taken (a gc
/// ran meanwhile), the download is done again under the lock.
pub(super) fn download_then_lock(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    report: &mut FetchReport,
    depth: Option<usize>,
    remote_name: &str,
) -> Result<WriterLock> {
    let stage = Staging::create(repo.ckpt_dir())?;
    let mut staged = Staged::default();
    if let Err(e) = download_to_stage(repo, remote, roots, transfers, depth, &stage, &mut staged) {
        // Keep the blobs that arrived (each needs nothing but its chain), so that a rerun
        // does not download them again; briefly locked, and only if the lock is free.
        if !staged.blobs.is_empty() {
            if let Some(_lock) = repo.try_lock() {
                keep_arrived_blobs(repo, &mut staged.blobs);
            }
        }
        return Err(e);
    }
    let lock = repo.lock()?;
    if staged.assumed.iter().all(|id| repo.store().contains(id)) {
        import_staged(repo, staged, report, remote_name)?;
    } else {
        // Done again under the lock: what `download` does for callers holding it.
        drop((staged, stage));
        download(repo, remote, roots, transfers, report, depth, remote_name)?;
    }
    Ok(lock)
}

/// The network half of a fetch, without the lock: walks down from `roots` and downloads
/// every version, manifest and blob (with the delta references it needs) this store
/// lacks into `stage`. Versions and manifests are checked against their ids and parsed
/// here (to learn what they need); blobs are checked when stored.
fn download_to_stage(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    depth: Option<usize>,
    stage: &Staging,
    staged: &mut Staged,
) -> Result<()> {
    let dir = stage.dir();
    let received = AtomicU64::new(0);
    repo.progress().start("fetch", 0);
    let mut blobs: Vec<ObjectId> = Vec::new();
    let mut seen: HashSet<ObjectId> = HashSet::new();
    let contains = |id: &ObjectId, assumed: &mut Vec<ObjectId>| {
        let here = repo.store().contains(id);
        if here {
            assumed.push(*id);
        }
        here
    };
    // Breadth first, so that a version's distance from the roots is its shortest.
    let mut queue: std::collections::VecDeque<(VersionId, usize)> = roots.iter().map(|r| (*r, 0)).collect();
    while let Some((id, level)) = queue.pop_front() {
        if contains(&id, &mut staged.assumed) || !seen.insert(id) {
            continue;
        }
        let tmp = reopen(receive_into(repo, remote, &id, &received, dir)?)?;
        let version = crate::repo::Version::parse(id, &repo.store().read_received(&id, ObjectKind::Version, &tmp)?)?;
        for file in &version.files {
            if contains(&file.manifest, &mut staged.assumed) || !seen.insert(file.manifest) {
                continue;
            }
            let mtmp = reopen(receive_into(repo, remote, &file.manifest, &received, dir)?)?;
            let manifest = crate::repo::Manifest::parse(
                file.manifest,
                &repo.store().read_received(&file.manifest, ObjectKind::Manifest, &mtmp)?,
            )?;
            for blob in manifest.blobs() {
                if !contains(&blob, &mut staged.assumed) && seen.insert(blob) {
                    blobs.push(blob);
                }
            }
            staged.manifests.push((file.manifest, mtmp.into_temp_path()));
        }
        if depth.is_some_and(|d| level + 1 >= d) {
            if version.parents.iter().any(|p| !repo.store().contains(p)) {
                staged.cut.push(id);
            }
        } else {
            queue.extend(version.parents.iter().map(|p| (*p, level + 1)));
        }
        staged.versions.push((id, version.parents, tmp.into_temp_path()));
    }

    // Blobs, in parallel; a delta's reference that is not here joins the next round.
    // The delta that asked for each base fetched in a later round (to name it if the base
    // is missing on the remote).
    let mut needed_by: HashMap<ObjectId, ObjectId> = HashMap::new();
    let mut round = blobs;
    while !round.is_empty() {
        let got: Mutex<Vec<(ObjectId, tempfile::TempPath, Option<ObjectId>)>> = Mutex::new(Vec::new());
        let result = parallel(&round, transfers, |id| {
            let path = match (receive_into(repo, remote, id, &received, dir), needed_by.get(id)) {
                (Err(Error::Remote(remote::Error::NotFound { .. })), Some(delta)) => {
                    return Err(crate::store::Error::Corrupt {
                        id: *delta,
                        reason: format!("its delta base {id} is missing on remote {}", remote.url()),
                    }
                    .into())
                }
                (result, _) => result?,
            };
            let tmp = reopen(path)?;
            let header = repo.store().received_header(id, &tmp)?;
            if header.kind != ObjectKind::Blob {
                return Err(
                    crate::store::Error::WrongKind { id: *id, expected: ObjectKind::Blob, found: header.kind }.into()
                );
            }
            got.lock().unwrap_or_else(|e| e.into_inner()).push((*id, tmp.into_temp_path(), header.reference));
            Ok(())
        });
        if result.is_err() {
            // What arrived stays staged for the caller (an interrupted fetch keeps it).
            for (id, path, reference) in got.into_inner().unwrap_or_else(|e| e.into_inner()) {
                staged.blobs.insert(id, (path, reference));
            }
            return result;
        }
        round = Vec::new();
        for (id, path, reference) in got.into_inner().unwrap_or_else(|e| e.into_inner()) {
            if let Some(r) = reference {
                if !contains(&r, &mut staged.assumed) && seen.insert(r) {
                    round.push(r);
                    needed_by.insert(r, id);
                }
            }
            staged.blobs.insert(id, (path, reference));
        }
    }
    staged.bytes = received.into_inner();
    repo.progress().finish();
    Ok(())
}

/// The local half of a fetch (the caller holds the writer lock): records cut versions,
/// then stores the staged objects bottom-up, each verified (blobs through their chains,
/// bases first), so that an object present here always has everything it needs.
fn import_staged(repo: &Repo, staged: Staged, report: &mut FetchReport, remote_name: &str) -> Result<()> {
    let Staged { versions, manifests, blobs: mut pending, cut, bytes, assumed: _ } = staged;
    if !cut.is_empty() {
        repo.add_cut(remote_name, &cut)?;
    }
    let stored = AtomicU64::new(0);
    while !pending.is_empty() {
        let ready: Vec<ObjectId> = pending
            .iter()
            .filter(|(_, (_, r))| r.is_none_or(|r| !pending.contains_key(&r)))
            .map(|(id, _)| *id)
            .collect();
        if ready.is_empty() {
            let id = *pending.keys().next().expect("non-empty");
            return Err(
                crate::store::Error::Corrupt { id, reason: "its delta chain on the remote is a cycle".into() }.into()
            );
        }
        let batch: Vec<(ObjectId, Mutex<Option<tempfile::TempPath>>)> =
            ready.iter().map(|id| (*id, Mutex::new(Some(pending.remove(id).expect("ready is pending").0)))).collect();
        parallel(&batch, rayon::current_num_threads(), |(id, slot)| {
            let path = slot.lock().unwrap_or_else(|e| e.into_inner()).take().expect("each item once");
            repo.import_object(id, ObjectKind::Blob, reopen(path)?)?;
            stored.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })?;
    }
    let mut stored_objects = stored.into_inner();
    for (id, path) in manifests {
        repo.import_object(&id, ObjectKind::Manifest, reopen(path)?)?;
        stored_objects += 1;
    }
    // Versions, parents first.
    let mut left: HashMap<VersionId, (Vec<VersionId>, tempfile::TempPath)> =
        versions.into_iter().map(|(id, parents, path)| (id, (parents, path))).collect();
    while !left.is_empty() {
        let ready: Vec<VersionId> = left
            .iter()
            .filter(|(_, (parents, _))| parents.iter().all(|p| !left.contains_key(p)))
            .map(|(id, _)| *id)
            .collect();
        if ready.is_empty() {
            let id = *left.keys().next().expect("non-empty");
            return Err(Error::from(RepoError::CorruptMetadata {
                id,
                reason: "its history on the remote is a cycle".into(),
            }));
        }
        for id in ready {
            let (_, path) = left.remove(&id).expect("ready is left");
            let tmp = reopen(path)?;
            let version =
                crate::repo::Version::parse(id, &repo.store().read_received(&id, ObjectKind::Version, &tmp)?)?;
            repo.import_version(&id, &version, tmp)?;
            stored_objects += 1;
        }
    }
    report.objects_received += stored_objects;
    report.bytes_received += bytes;
    repo.flush_index();
    Ok(())
}
