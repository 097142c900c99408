//! Downloads staged without the writer lock and stored under it, bottom-up: what a fetch, the
//! fetch of one file (the git filter's smudge, a rank reading a file) and a fetch of blobs
//! share. The network half walks the remote's objects through [`graph::edges`], each read
//! into a staging directory as it is downloaded ([`Stage`], an [`Objects`] source), so that a
//! commit of this store does not wait for the network (docs/architecture.md, "What the lock
//! covers"); the local half takes the lock and stores what arrived, each object verified:
//! blobs bases first, then manifests, then versions parents first. So an object present here
//! always has everything it needs, and an interrupted download is resumed by walking down
//! again.

use super::transfer::{parallel, receive_into, reopen, Staging};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::graph::{self, Node, Objects};
use crate::repo::Error as RepoError;
use crate::repo::{Manifest, Repo, Version, VersionId, WriterLock};
use crate::store::{ObjectHeader, ObjectKind, MAX_CHAIN_DEPTH};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// What a download staged so far.
#[derive(Default)]
struct Staged {
    /// Versions with their parents (the content is parsed again when stored: a fetch of a
    /// long history holds no more than one version's content at a time).
    versions: Vec<(VersionId, Vec<VersionId>, tempfile::TempPath)>,
    /// Manifests (checked against their ids).
    manifests: Vec<(ObjectId, tempfile::TempPath)>,
    /// Blobs (checked when stored) with the reference their header names.
    blobs: HashMap<ObjectId, (tempfile::TempPath, Option<ObjectId>)>,
    /// Objects the walk found stored here and so did not download: they must still be here
    /// when the lock is taken.
    assumed: Vec<ObjectId>,
}

/// The objects of a remote read into a staging directory for this store: each read
/// downloads the object whole and keeps it for [`Stage::import`] (a blob's header is that of
/// the blob downloaded).
pub(super) struct Stage<'a> {
    pub(super) repo: &'a Repo,
    remote: &'a dyn Remote,
    staged: Mutex<Staged>,
    /// Bytes downloaded.
    received: AtomicU64,
    staging: Staging,
}

impl<'a> Stage<'a> {
    fn new(repo: &'a Repo, remote: &'a dyn Remote) -> Result<Stage<'a>> {
        let staging = Staging::create(repo.ckpt_dir())?;
        Ok(Stage { repo, remote, staged: Mutex::default(), received: AtomicU64::new(0), staging })
    }

    fn staged(&self) -> MutexGuard<'_, Staged> {
        self.staged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether object `id` is stored here, so not to be downloaded (noted: it must still be
    /// here when the lock is taken).
    pub(super) fn here(&self, id: &ObjectId) -> bool {
        let here = self.repo.store().contains(id);
        if here {
            self.staged().assumed.push(*id);
        }
        here
    }

    /// Bytes downloaded so far.
    pub(super) fn bytes(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    fn download(&self, id: &ObjectId) -> Result<tempfile::NamedTempFile> {
        reopen(receive_into(self.repo, self.remote, id, &self.received, self.staging.dir())?)
    }

    /// Downloads the blobs `wanted` that this store lacks, each with the chain of references
    /// it needs, `transfers` at a time; a reference that is not here joins the next round.
    /// Each wanted blob brings at most a chain of [`MAX_CHAIN_DEPTH`] references: more is a
    /// remote naming objects without end.
    pub(super) fn blobs(&self, wanted: Vec<ObjectId>, transfers: usize) -> Result<()> {
        let limit = wanted.len().saturating_mul(MAX_CHAIN_DEPTH as usize + 1);
        let mut seen: HashSet<ObjectId> = HashSet::new();
        // The delta that asked for each reference (to name it if the reference is missing).
        let mut needed_by: HashMap<ObjectId, ObjectId> = HashMap::new();
        let mut round: Vec<ObjectId> = wanted.into_iter().filter(|id| seen.insert(*id) && !self.here(id)).collect();
        while !round.is_empty() {
            let next = Mutex::new(Vec::new());
            parallel(&round, transfers, |id| {
                let edges = graph::edges(self, Node::Blob(*id)).map_err(|e| match (e, needed_by.get(id)) {
                    (Error::Remote(remote::Error::NotFound { .. }), Some(delta)) => {
                        Error::from(crate::store::Error::Corrupt {
                            id: *delta,
                            reason: format!("its delta base {id} is missing on remote {}", self.remote.url()),
                        })
                    }
                    (e, _) => e,
                })?;
                next.lock().unwrap_or_else(|e| e.into_inner()).extend(edges.iter().map(|n| (n.id(), *id)));
                Ok(())
            })?;
            round = Vec::new();
            for (reference, delta) in next.into_inner().unwrap_or_else(|e| e.into_inner()) {
                if seen.insert(reference) && !self.here(&reference) {
                    if seen.len() > limit {
                        let reason = "its delta chain on the remote does not end".into();
                        return Err(crate::store::Error::Corrupt { id: delta, reason }.into());
                    }
                    round.push(reference);
                    needed_by.insert(reference, delta);
                }
            }
        }
        Ok(())
    }

    /// Whether everything the walk found here is still here.
    fn assumed_here(&self) -> bool {
        self.staged().assumed.iter().all(|id| self.repo.store().contains(id))
    }

    /// Stores the staged blobs that can be stored (standalone, or with their reference here),
    /// bases first, skipping any that fails: what an interrupted download keeps, so that a
    /// rerun does not download them again. Unless `locked` (the caller holds the writer lock),
    /// only if the lock is free, and briefly.
    fn keep_arrived(&self, locked: bool) {
        let mut staged = self.staged();
        if staged.blobs.is_empty() {
            return;
        }
        let _lock = match locked {
            true => None,
            false => match self.repo.try_lock() {
                Some(lock) => Some(lock),
                None => return,
            },
        };
        let blobs = &mut staged.blobs;
        loop {
            let ready: Vec<ObjectId> = blobs
                .iter()
                .filter(|(_, (_, r))| r.is_none_or(|r| self.repo.store().contains(&r)))
                .map(|(id, _)| *id)
                .collect();
            if ready.is_empty() {
                break;
            }
            for id in ready {
                let (path, _) = blobs.remove(&id).expect("ready is staged");
                // Best effort: a blob that fails to store is downloaded again by the rerun.
                let _ = reopen(path).and_then(|tmp| Ok(self.repo.import_object(&id, ObjectKind::Blob, tmp)?));
            }
        }
        self.repo.flush_index();
    }

    /// The local half (the caller holds the writer lock): stores the staged objects
    /// bottom-up, each verified (blobs through their chains, bases first; manifests; versions
    /// parents first). Returns the objects stored.
    pub(super) fn import(self) -> Result<u64> {
        let repo = self.repo;
        let Staged { versions, manifests, blobs: mut pending, assumed: _ } =
            self.staged.into_inner().unwrap_or_else(|e| e.into_inner());
        let stored = AtomicU64::new(0);
        while !pending.is_empty() {
            let ready: Vec<ObjectId> = pending
                .iter()
                .filter(|(_, (_, r))| r.is_none_or(|r| !pending.contains_key(&r)))
                .map(|(id, _)| *id)
                .collect();
            if ready.is_empty() {
                let id = *pending.keys().next().expect("non-empty");
                let reason = "its delta chain on the remote is a cycle".into();
                return Err(crate::store::Error::Corrupt { id, reason }.into());
            }
            let batch: Vec<(ObjectId, Mutex<Option<tempfile::TempPath>>)> = ready
                .iter()
                .map(|id| (*id, Mutex::new(Some(pending.remove(id).expect("ready is pending").0))))
                .collect();
            parallel(&batch, rayon::current_num_threads(), |(id, slot)| {
                let path = slot.lock().unwrap_or_else(|e| e.into_inner()).take().expect("each item once");
                repo.import_object(id, ObjectKind::Blob, reopen(path)?)?;
                stored.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })?;
        }
        let mut stored = stored.into_inner();
        for (id, path) in manifests {
            repo.import_object(&id, ObjectKind::Manifest, reopen(path)?)?;
            stored += 1;
        }
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
                let reason = "its history on the remote is a cycle".into();
                return Err(RepoError::CorruptMetadata { id, reason }.into());
            }
            for id in ready {
                let (_, path) = left.remove(&id).expect("ready is left");
                let tmp = reopen(path)?;
                let version = Version::parse(id, &repo.store().read_received(&id, ObjectKind::Version, &tmp)?)?;
                repo.import_version(&id, &version, tmp)?;
                stored += 1;
            }
        }
        repo.flush_index();
        Ok(stored)
    }
}

impl Objects for Stage<'_> {
    type Error = Error;

    fn version(&self, id: &VersionId) -> Result<Version> {
        let tmp = self.download(id)?;
        let version = Version::parse(*id, &self.repo.store().read_received(id, ObjectKind::Version, &tmp)?)?;
        self.staged().versions.push((*id, version.parents.clone(), tmp.into_temp_path()));
        Ok(version)
    }

    fn manifest(&self, id: &ObjectId) -> Result<Manifest> {
        let tmp = self.download(id)?;
        let manifest = Manifest::parse(*id, &self.repo.store().read_received(id, ObjectKind::Manifest, &tmp)?)?;
        self.staged().manifests.push((*id, tmp.into_temp_path()));
        Ok(manifest)
    }

    fn header(&self, id: &ObjectId) -> Result<ObjectHeader> {
        let tmp = self.download(id)?;
        let header = self.repo.store().received_header(id, &tmp)?;
        if header.kind == ObjectKind::Blob {
            self.staged().blobs.insert(*id, (tmp.into_temp_path(), header.reference));
        }
        Ok(header)
    }
}

/// Walks the remote with `walk` (which downloads what it reads into a [`Stage`]) without the
/// writer lock, then takes the lock: the lock is held for local work only. If something the
/// walk found here is gone by then (a gc ran meanwhile), the walk is done again under the
/// lock. A failed walk keeps the blobs that arrived (each needs nothing but its chain),
/// briefly locked and only if the lock is free. Returns the lock, the stage to import and
/// what `walk` returned.
pub(super) fn stage_then_lock<'a, T>(
    repo: &'a Repo,
    remote: &'a dyn Remote,
    walk: impl Fn(&Stage) -> Result<T>,
) -> Result<(WriterLock, Stage<'a>, T)> {
    let stage = Stage::new(repo, remote)?;
    let found = match walk(&stage) {
        Ok(found) => found,
        Err(e) => {
            stage.keep_arrived(false);
            return Err(e);
        }
    };
    let lock = repo.lock()?;
    if stage.assumed_here() {
        return Ok((lock, stage, found));
    }
    drop(stage);
    let (stage, found) = stage_locked(repo, remote, walk)?;
    Ok((lock, stage, found))
}

/// [`stage_then_lock`] for a caller that holds the writer lock.
pub(super) fn stage_locked<'a, T>(
    repo: &'a Repo,
    remote: &'a dyn Remote,
    walk: impl Fn(&Stage) -> Result<T>,
) -> Result<(Stage<'a>, T)> {
    let stage = Stage::new(repo, remote)?;
    match walk(&stage) {
        Ok(found) => Ok((stage, found)),
        Err(e) => {
            stage.keep_arrived(true);
            Err(e)
        }
    }
}
