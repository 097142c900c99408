//! Objects by file rather than by version: what a set of stored files (manifests) needs, their
//! upload to a remote and their download from one, and a gc that keeps exactly the files a
//! caller names. The git filter uses these: git carries the pointers (so no version or ref of
//! the store travels), and only git knows which files are still alive.
//!
//! Built on the same primitives and invariants as `push`/`fetch` (docs/format.md, "Remotes"):
//! a delta's reference goes up before the delta and a manifest after its blobs, so a manifest
//! present on the remote means its file can be restored from there; everything downloaded is
//! verified against its id before it enters the local store, bases first.

use super::checked::Checked;
use super::layout::{file_journal, finish_journals, journal_key, plan_file_recodes, recode, write_journal, Layout};
use super::remote_gc::{fresh_on, mark_git_filter, GcWatch};
use super::transfer::{parallel, receive_into, reopen, upload_wire_delta, with_retries, Staging};
use super::wire_delta::WireDelta;
use super::Error;
use super::Result;
use crate::object_id::ObjectId;
use crate::remote::{self, Remote, UploadMode, Uploaded};
use crate::repo::{Counterpart, Manifest, Needed, Repo};
use crate::store::{ObjectKind, HEADER_LEN, MAX_CHAIN_DEPTH};
use std::collections::{HashMap, HashSet};
use std::io::Read;

/// What [`Repo::fetch_file`] downloaded, before it takes the lock.
#[derive(Default)]
struct StagedFile {
    /// The manifest (checked against its id).
    manifest: Option<tempfile::NamedTempFile>,
    /// Blobs (checked when stored) with the reference each names.
    blobs: HashMap<ObjectId, (tempfile::NamedTempFile, Option<ObjectId>)>,
    /// Blobs found here, and so not downloaded: they must still be here under the lock.
    assumed: Vec<ObjectId>,
}

/// Largest object a download accepts (as `fetch`: a blob is at most a whole tensor plus its
/// container).
const MAX_OBJECT_LEN: u64 = 1 << 40;

/// What an upload of files takes the remote to hold before it starts.
pub(super) enum OnRemote {
    /// What one listing of `objects/` says: a listing costs a request per thousand objects
    /// of the whole remote, so it is for transfers a person starts (`ckpt push`, the git
    /// filter's transfers), not for a rank saving every few minutes.
    Listed,
    /// These objects (the blobs of the version a save follows: a version is uploaded after
    /// everything it needs), and no listing: any other object is uploaded create-if-absent,
    /// one of at least [`LOOK_FIRST`] bytes after one request that finds it absent (a save
    /// retried after a failure finds its blobs there). What a save sends so stays within
    /// the save's own objects, however long the remote's history.
    Known(HashSet<ObjectId>),
}

/// Objects at least this large are looked for on the remote before an upload that does not
/// list it ([`OnRemote::Known`]): one request against a megabyte or more, smaller ones go up
/// create-if-absent directly.
pub(super) const LOOK_FIRST: u64 = 1 << 20;

/// Requests a file transfer keeps in flight.
const TRANSFERS: usize = 4;

/// What [`push_files`](super::push_files) or [`fetch_file`](super::fetch_file) moved.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileTransfer {
    /// The remote's URL.
    pub remote: String,
    /// Files (manifests) asked for.
    pub files: usize,
    /// Files the remote (push) or the local store (fetch) already held whole.
    pub files_present: usize,
    /// Objects uploaded or downloaded and stored.
    pub objects: u64,
    /// Bytes uploaded or downloaded.
    pub bytes: u64,
    /// Of `objects` (push), blobs sent as XOR deltas against the blob of the same tensor in
    /// the file the remote already holds for the same path (fetch: always 0).
    pub objects_as_deltas: u64,
    /// Of `objects` (push, mirror layout), blobs of the files the remote held for the same
    /// paths replaced there by XOR deltas against the new files' blobs (their bytes are in
    /// `bytes`).
    pub objects_recoded: u64,
    /// Requests sent to the remote.
    pub requests: u64,
    /// Files (manifests) of a push that neither the local store nor the remote holds: not
    /// sent (the rest was).
    pub missing: Vec<ObjectId>,
}

/// A writer that keeps the first [`HEADER_LEN`] bytes and then refuses more (ending a
/// download once an object's header is in).
struct HeaderOnly(Vec<u8>);

impl std::io::Write for HeaderOnly {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let take = buf.len().min(HEADER_LEN - self.0.len());
        if take == 0 && !buf.is_empty() {
            return Err(std::io::Error::other("only the header was wanted"));
        }
        self.0.extend_from_slice(&buf[..take]);
        Ok(take)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Repo {
    /// Uploads to `remote` what the files `manifests` need and the remote lacks: one listing
    /// of the remote's objects, then the missing objects in [`Repo::file_objects`] order
    /// (bases, deltas, manifest last). A file whose manifest the remote already has is skipped
    /// whole, including when the local store does not hold it (a clone that never smudged
    /// it); a file neither side holds is listed in [`FileTransfer::missing`].
    pub(super) fn push_files(&self, remote: &dyn Remote, manifests: &[ObjectId]) -> Result<FileTransfer> {
        self.push_files_against(remote, manifests, &HashMap::new(), Layout::Deltas)
    }

    /// [`Repo::push_files`] in `layout`; `previous` maps a file (manifest) to the one the
    /// remote already holds for the same path (the pointer at that path in the remote's commit).
    ///
    /// Mirror (docs/format.md, "A mirror push"): journals on the remote are finished first; the
    /// files' objects go up as this store holds them (the newest content whole), and then each
    /// blob of the previous file that local compaction recoded as a delta against the new
    /// file's blob of the same tensor is replaced on the remote by that delta, with the same
    /// rules and journal as a push ([`super::layout`]).
    ///
    /// Deltas: a blob the remote lacks, stored whole here, goes up as an
    /// XOR delta against the blob of the same tensor (name, dtype, shape; bundles by their
    /// first tensor) in that file, if the remote holds that file's manifest and blob, the
    /// delta is smaller than the object here, and the remote's chain stays within
    /// `base_every - 1` deltas (read from the header of the remote's copy of the reference:
    /// one short download). Otherwise, or if the reference cannot be read here or there, the
    /// object goes up as it is (docs/format.md, "Deltas on the wire").
    pub(super) fn push_files_against(
        &self,
        remote: &dyn Remote,
        manifests: &[ObjectId],
        previous: &HashMap<ObjectId, ObjectId>,
        layout: Layout,
    ) -> Result<FileTransfer> {
        self.push_files_paired(remote, manifests, previous, &[], layout, OnRemote::Listed)
    }

    /// [`Repo::push_files_against`], where in the deltas layout a blob may also go up as a
    /// delta against the blob `pairs` names for it (with the same conditions): the same items
    /// of any `.distcp` file of the previous version, for a rank saving to a remote, which
    /// passes what it knows the remote holds (`on_remote`) instead of listing it.
    pub(super) fn push_files_paired(
        &self,
        remote: &dyn Remote,
        manifests: &[ObjectId],
        previous: &HashMap<ObjectId, ObjectId>,
        pairs: &[Counterpart],
        layout: Layout,
        on_remote: OnRemote,
    ) -> Result<FileTransfer> {
        let transfers = TRANSFERS;
        let mut report =
            FileTransfer { remote: remote.url().to_string(), files: manifests.len(), ..Default::default() };
        let checked = Checked::default();
        if layout == Layout::Mirror {
            let ((objects, bytes), _) = finish_journals(self, remote, &|_| false, transfers, &checked)?;
            report.objects += objects;
            report.objects_recoded += objects;
            report.bytes += bytes;
        }
        // A rank's upload (not the git filter's, whose remote gc refuses) checks before it
        // hands its files back that no gc took what they need (`GcWatch::settle`).
        let mut counted_files = Vec::new();
        let mut watch = match on_remote {
            OnRemote::Known(_) => Some(GcWatch::begin(remote)?),
            OnRemote::Listed => None,
        };
        let (present, look_first): (HashSet<ObjectId>, bool) = match on_remote {
            // The git filter's transfers: the remote's objects are named by git pointers, not
            // ckpt refs, so it is marked as such (`ckpt gc --remote` refuses it) and what is
            // listed counts as there whatever its age.
            OnRemote::Listed => {
                mark_git_filter(remote)?;
                (remote.list("objects/")?.iter().filter_map(|k| remote::object_of_key(k)).collect(), false)
            }
            OnRemote::Known(known) => (known, true),
        };
        let mut wanted = Vec::new();
        for m in manifests {
            if present.contains(m) || (look_first && fresh_on(remote, m)?) {
                // A fresh manifest (not one the previous version holds) stands for a file a
                // failed save uploaded, perhaps without settling: its objects are checked.
                if let (false, Some(watch)) = (present.contains(m), watch.as_mut()) {
                    watch.check_anyway();
                    if self.store().contains(m) {
                        counted_files.push(*m);
                    }
                }
                report.files_present += 1;
            } else if self.store().contains(m) {
                wanted.push(*m);
            } else {
                report.missing.push(*m);
            }
        }
        let need: Vec<Needed> = self.file_objects(&wanted)?.into_iter().filter(|n| !present.contains(&n.id)).collect();
        let (wire, journal) = match layout {
            Layout::Deltas => (self.plan_file_deltas(remote, &wanted, previous, pairs, &need, &present)?, None),
            Layout::Mirror => {
                let recodes = plan_file_recodes(self, &wanted, previous, &present)?;
                (HashMap::new(), (!recodes.is_empty()).then(|| file_journal(recodes)))
            }
        };
        // What goes up, what its deltas are coded against and what its recodes replace remote
        // blobs by, verified here before anything goes up (`checked.rs`).
        let mut to_verify: Vec<ObjectId> = need.iter().map(|n| n.id).collect();
        to_verify.extend(wire.values().map(|w| w.reference));
        if let Some(journal) = &journal {
            to_verify
                .extend(journal.recodes.iter().flat_map(|r| [r.older, r.newer]).filter(|id| self.store().contains(id)));
        }
        checked.verify_here(self, remote, to_verify)?;
        // Written before anything goes up: a rerun (of any push) finishes the recodes.
        if let Some(journal) = &journal {
            write_journal(self, remote, journal)?;
        }
        let total: u64 = need.iter().map(|n| self.store().stored_len(&n.id).unwrap_or(0)).sum();
        self.progress().start("push", total);
        let mut done = 0;
        for n in &need {
            if look_first && self.found_on(remote, &n.id)? {
                done += self.store().stored_len(&n.id).unwrap_or(0);
                self.progress().set(done);
                continue;
            }
            if let Some(plan) = wire.get(&n.id) {
                if let Some((len, uploaded)) = upload_wire_delta(self, remote, &n.id, plan)? {
                    if uploaded != Uploaded::Existed {
                        report.objects += 1;
                        report.objects_as_deltas += 1;
                        report.bytes += len;
                    }
                    done += self.store().stored_len(&n.id).unwrap_or(len);
                    self.progress().set(done);
                    continue;
                }
            }
            let (len, uploaded) = self.upload_object(remote, &n.id)?;
            if uploaded != Uploaded::Existed {
                // Verified bytes, written there now: a recode may code against them.
                checked.good_there(n.id);
                report.objects += 1;
                report.bytes += len;
            }
            done += len;
            self.progress().set(done);
        }
        self.progress().finish();
        if let Some(watch) = watch {
            // `need` is what the wanted files need and the remote was not known to hold; the
            // files counted on by a fresh manifest add theirs.
            let mut relied: Vec<ObjectId> = need.iter().map(|n| n.id).collect();
            let counted = self.file_objects(&counted_files)?;
            relied.extend(counted.into_iter().map(|n| n.id).filter(|id| !present.contains(id)));
            watch.settle(self, remote, &relied)?;
        }
        if let Some(journal) = journal {
            let (objects, bytes) = recode(self, remote, &journal.recodes, transfers, &checked)?;
            report.objects += objects;
            report.objects_recoded += objects;
            report.bytes += bytes;
            remote.delete(&journal_key(&journal.version))?;
        }
        report.requests = remote.requests();
        Ok(report)
    }

    /// Which blobs of `need` go up as deltas (see [`Repo::push_files_against`]): pairs of a
    /// blob of a `wanted` file and the same tensor's blob in the file `previous` names for it
    /// (the remote holding that file's manifest), then `pairs`, each with the remote holding
    /// the reference blob (`present`), this store holding both blobs, the new one whole and no
    /// other object of `need` coded against it (its chain here would then not match the
    /// remote's).
    fn plan_file_deltas(
        &self,
        remote: &dyn Remote,
        wanted: &[ObjectId],
        previous: &HashMap<ObjectId, ObjectId>,
        pairs: &[Counterpart],
        need: &[Needed],
        present: &HashSet<ObjectId>,
    ) -> Result<HashMap<ObjectId, WireDelta>> {
        let mut plan = HashMap::new();
        let needed: HashSet<ObjectId> = need.iter().map(|n| n.id).collect();
        let referenced: HashSet<ObjectId> = need.iter().filter_map(|n| n.reference).collect();
        // Deepest chain a delta may make on the remote, as the local store bounds its own.
        let max_depth = (self.config().base_every.saturating_sub(1)).clamp(1, MAX_CHAIN_DEPTH);
        let mut candidates = Vec::new();
        for m in wanted {
            let Some(old) = previous.get(m).filter(|o| *o != m && present.contains(o)) else { continue };
            // A clone that never smudged the remote's file cannot code against it.
            if !self.store().contains(old) {
                continue;
            }
            let (new_manifest, old_manifest) = (self.manifest(m)?, self.manifest(old)?);
            candidates.extend(new_manifest.same_tensor_blobs(&old_manifest));
        }
        candidates.extend_from_slice(pairs);
        let mut chosen: Vec<Counterpart> = Vec::new();
        for pair in candidates {
            let (new, reference) = (pair.new, pair.old);
            if new == reference
                || !needed.contains(&new)
                || referenced.contains(&new)
                || !present.contains(&reference)
                || !self.store().contains(&reference)
                || self.store().header(&new)?.reference.is_some()
            {
                continue;
            }
            chosen.push(pair);
        }
        // The remote depth of each reference (`None`: unreadable, no delta on it): one short
        // download each, in parallel (a rank file's items are thousands of references).
        let mut references: Vec<ObjectId> = chosen.iter().map(|p| p.old).collect();
        references.sort_unstable();
        references.dedup();
        let remote_depth = std::sync::Mutex::new(HashMap::new());
        parallel(&references, TRANSFERS, |reference| {
            let depth = self.remote_blob_depth(remote, reference);
            remote_depth.lock().unwrap_or_else(|e| e.into_inner()).insert(*reference, depth);
            Ok(())
        })?;
        let remote_depth = remote_depth.into_inner().unwrap_or_else(|e| e.into_inner());
        // The first pair of each blob whose reference's chain leaves room.
        for pair in chosen {
            if plan.contains_key(&pair.new) {
                continue;
            }
            if let Some(Some(d)) = remote_depth.get(&pair.old) {
                if *d < max_depth {
                    plan.insert(pair.new, WireDelta { reference: pair.old, depth: d + 1 });
                }
            }
        }
        Ok(plan)
    }

    /// Whether object `id`, at least [`LOOK_FIRST`] bytes here, is on `remote` already and
    /// fresh (one request; docs/format.md, "Garbage on a remote"); smaller objects are not
    /// looked for (false), their upload is create-if-absent.
    pub(super) fn found_on(&self, remote: &dyn Remote, id: &ObjectId) -> Result<bool> {
        if self.store().stored_len(id).unwrap_or(0) < LOOK_FIRST {
            return Ok(false);
        }
        fresh_on(remote, id)
    }

    /// The chain depth of blob `id` on `remote`, from its header: the download stops once
    /// the header is in. `None` if it cannot be read or is not a blob (then nothing is coded
    /// against it).
    fn remote_blob_depth(&self, remote: &dyn Remote, id: &ObjectId) -> Option<u32> {
        let mut head = HeaderOnly(Vec::with_capacity(HEADER_LEN));
        // Stopping the download once the header is in makes it return an error: the header
        // decides, whatever the download says.
        let _ = remote.download(&remote::object_key(id), &mut head, MAX_OBJECT_LEN);
        let header = crate::store::ObjectHeader::decode(*id, &head.0).ok()?;
        (header.kind == ObjectKind::Blob).then_some(header.depth)
    }

    /// Uploads one object file as it is now; returns its length and whether it was created.
    /// Callers verify it first (`checked.rs`, [`Checked::verify_here`]: many at once costs
    /// less than one by one, a delta chain being decoded once).
    pub(super) fn upload_object(&self, remote: &dyn Remote, id: &ObjectId) -> Result<(u64, Uploaded)> {
        let path = self.store().object_path(id);
        let io = |action| {
            let path = path.clone();
            move |source| Error::Io { action, path, source }
        };
        let mut file = std::fs::File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::Store(crate::store::Error::Missing { id: *id }),
            _ => Error::Io { action: "opening", path: path.clone(), source: e },
        })?;
        let len = file.metadata().map_err(io("reading"))?.len();
        // The header of the very file that goes up decides whether it may replace (a
        // compaction may rename a delta over the path meanwhile; the open file stays as read).
        let mut head = Vec::with_capacity(HEADER_LEN);
        (&mut file).take(HEADER_LEN as u64).read_to_end(&mut head).map_err(io("reading"))?;
        let header = crate::store::ObjectHeader::decode(*id, &head)?;
        let mode = if header.reference.is_none() { UploadMode::MayReplace } else { UploadMode::CreateOnly };
        let uploaded = with_retries(|| Ok(remote.upload(&remote::object_key(id), &file, &path, len, mode)?))?;
        if uploaded == Uploaded::Existed {
            // Found there: counted on only if fresh, else written again.
            let sent = self.keep_found(remote, id)?;
            if sent > 0 {
                return Ok((sent, Uploaded::Replaced));
            }
        }
        Ok((len, uploaded))
    }

    /// Downloads the file whose manifest is `manifest` from `remote` into this store, unless
    /// the store holds the manifest already: the manifest, its blobs and the references of
    /// those that are deltas, each verified against its id before it is stored, blobs bases
    /// first and the manifest last (so an interrupted download leaves only complete chains and
    /// a rerun fetches what is still missing).
    ///
    /// As `fetch` (docs/architecture.md, "What the lock covers"): the download goes to a
    /// staging directory without the writer lock, so a commit of this store (a git clean in
    /// another worktree) does not wait for the network; the lock is taken to store what
    /// arrived. If a blob the download found here is gone by then (a gc ran meanwhile), the
    /// download is done again under the lock.
    pub(super) fn fetch_file(&self, remote: &dyn Remote, manifest: &ObjectId) -> Result<FileTransfer> {
        let mut report = FileTransfer { remote: remote.url().to_string(), files: 1, ..Default::default() };
        if self.store().contains(manifest) {
            report.files_present = 1;
            return Ok(report);
        }
        self.progress().start("fetch", 0);
        let stage = Staging::create(self.ckpt_dir())?;
        let mut staged = StagedFile::default();
        if let Err(e) = self.stage_remote_file(remote, manifest, &stage, &mut staged, &mut report) {
            // Keep the blobs that arrived and can be stored (a rerun does not download them
            // again); briefly locked, and only if the lock is free.
            if !staged.blobs.is_empty() {
                if let Some(_lock) = self.try_lock() {
                    let _ = self.import_remote_blobs(staged.blobs, &mut report);
                    self.flush_index();
                }
            }
            return Err(e);
        }
        let _lock = self.lock()?;
        if !staged.assumed.iter().all(|id| self.store().contains(id)) {
            staged = StagedFile::default();
            self.stage_remote_file(remote, manifest, &stage, &mut staged, &mut report)?;
        }
        self.import_remote_file(manifest, staged, &mut report)?;
        self.progress().finish();
        self.flush_index();
        report.requests = remote.requests();
        Ok(report)
    }

    /// The network half of [`Repo::fetch_file`]: downloads into `stage` the manifest and every
    /// blob it needs (with the chain of each delta) that this store lacks.
    fn stage_remote_file(
        &self,
        remote: &dyn Remote,
        manifest: &ObjectId,
        stage: &Staging,
        staged: &mut StagedFile,
        report: &mut FileTransfer,
    ) -> Result<()> {
        let mtmp = self.receive_object(remote, manifest, stage, report)?;
        let m = Manifest::parse(*manifest, &self.store().read_received(manifest, ObjectKind::Manifest, &mtmp)?)?;
        staged.manifest = Some(mtmp);
        self.stage_remote_blobs(remote, m.blobs().collect(), stage, staged, report)
    }

    /// Downloads into `stage` the blobs `wanted` that this store lacks, with the chain of each
    /// delta (bounded: at most [`MAX_CHAIN_DEPTH`] references per wanted blob).
    fn stage_remote_blobs(
        &self,
        remote: &dyn Remote,
        wanted: Vec<ObjectId>,
        stage: &Staging,
        staged: &mut StagedFile,
        report: &mut FileTransfer,
    ) -> Result<()> {
        let limit = wanted.len().saturating_mul(MAX_CHAIN_DEPTH as usize + 1);
        let mut queue = wanted;
        let mut seen: HashSet<ObjectId> = HashSet::new();
        while let Some(id) = queue.pop() {
            if !seen.insert(id) {
                continue;
            }
            if self.store().contains(&id) {
                staged.assumed.push(id);
                continue;
            }
            let tmp = self.receive_object(remote, &id, stage, report)?;
            let header = self.store().received_header(&id, &tmp)?;
            if header.kind != ObjectKind::Blob {
                return Err(
                    crate::store::Error::WrongKind { id, expected: ObjectKind::Blob, found: header.kind }.into()
                );
            }
            if let Some(r) = header.reference {
                // Each wanted blob brings at most a chain of references: more is a remote
                // naming objects without end.
                if seen.len() > limit {
                    return Err(crate::store::Error::Corrupt {
                        id,
                        reason: "its delta chain on the remote does not end".into(),
                    }
                    .into());
                }
                queue.push(r);
            }
            staged.blobs.insert(id, (tmp, header.reference));
        }
        Ok(())
    }

    /// Downloads the blobs `wanted` from `remote` into this store, each with its chain, unless
    /// the store holds them: no manifest, so no file claims to be here whole. Verified and
    /// stored as [`Repo::fetch_file`] stores a file's blobs (bases first, under the writer lock).
    pub(super) fn fetch_blobs(&self, remote: &dyn Remote, wanted: Vec<ObjectId>) -> Result<FileTransfer> {
        let mut report = FileTransfer { remote: remote.url().to_string(), ..Default::default() };
        let wanted: Vec<ObjectId> = wanted.into_iter().filter(|id| !self.store().contains(id)).collect();
        if wanted.is_empty() {
            return Ok(report);
        }
        let stage = Staging::create(self.ckpt_dir())?;
        let mut staged = StagedFile::default();
        self.stage_remote_blobs(remote, wanted.clone(), &stage, &mut staged, &mut report)?;
        let _lock = self.lock()?;
        if !staged.assumed.iter().all(|id| self.store().contains(id)) {
            staged = StagedFile::default();
            self.stage_remote_blobs(remote, wanted, &stage, &mut staged, &mut report)?;
        }
        self.import_remote_blobs(staged.blobs, &mut report)?;
        self.flush_index();
        report.requests = remote.requests();
        Ok(report)
    }

    /// The local half of [`Repo::fetch_file`] (the caller holds the writer lock): stores the
    /// staged blobs, each once its reference is here, then the manifest.
    fn import_remote_file(&self, manifest: &ObjectId, staged: StagedFile, report: &mut FileTransfer) -> Result<()> {
        self.import_remote_blobs(staged.blobs, report)?;
        let mtmp = staged
            .manifest
            .ok_or_else(|| crate::store::Error::Corrupt { id: *manifest, reason: "not downloaded".into() })?;
        self.import_received(manifest, ObjectKind::Manifest, mtmp, report)
    }

    /// Stores downloaded blobs (the caller holds the writer lock), each once its reference is
    /// here; a delta whose reference is neither here nor among them is an error.
    fn import_remote_blobs(
        &self,
        mut waiting: HashMap<ObjectId, (tempfile::NamedTempFile, Option<ObjectId>)>,
        report: &mut FileTransfer,
    ) -> Result<()> {
        while !waiting.is_empty() {
            let ready: Vec<ObjectId> = waiting
                .iter()
                .filter(|(_, (_, r))| r.is_none_or(|r| self.store().contains(&r)))
                .map(|(id, _)| *id)
                .collect();
            if ready.is_empty() {
                let (id, (_, r)) = waiting.iter().next().expect("non-empty");
                let r = r.map_or_else(String::new, |r| r.to_string());
                return Err(crate::store::Error::Corrupt {
                    id: *id,
                    reason: format!("its reference {r} is neither here nor fetched (a cycle on the remote)"),
                }
                .into());
            }
            for id in ready {
                let (tmp, _) = waiting.remove(&id).expect("ready is waiting");
                self.import_received(&id, ObjectKind::Blob, tmp, report)?;
            }
        }
        Ok(())
    }

    fn receive_object(
        &self,
        remote: &dyn Remote,
        id: &ObjectId,
        stage: &Staging,
        report: &mut FileTransfer,
    ) -> Result<tempfile::NamedTempFile> {
        // The fetch path's download (retries, a file in the staging directory), counted from
        // this transfer's bytes so far so that the progress bar keeps growing across objects.
        let received = std::sync::atomic::AtomicU64::new(report.bytes);
        let tmp = reopen(receive_into(self, remote, id, &received, stage.dir())?)?;
        report.bytes = received.into_inner();
        Ok(tmp)
    }

    fn import_received(
        &self,
        id: &ObjectId,
        kind: ObjectKind,
        tmp: tempfile::NamedTempFile,
        report: &mut FileTransfer,
    ) -> Result<()> {
        self.import_object(id, kind, tmp)?;
        report.objects += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::local::DirRemote;
    use crate::repo::fixtures::{steps_checkpoint as checkpoint, store_with_steps};
    use crate::repo::{CommitOptions, RepoPath};
    use std::path::Path;

    #[test]
    fn files_go_up_once_and_come_back_verified_and_bit_exact() {
        let dir = tempfile::tempdir().unwrap();
        let (store, files) = store_with_steps(dir.path());
        // Older steps are deltas against newer ones: their chains are part of what they need.
        let needed = store.file_objects(&[files[0].0.manifest]).unwrap();
        assert!(needed.iter().any(|n| n.reference.is_some()), "no delta among {needed:?}");
        // References before the deltas on them, the manifest last.
        for (i, n) in needed.iter().enumerate() {
            if let Some(r) = n.reference {
                assert!(needed[..i].iter().any(|m| m.id == r), "reference after its delta");
            }
        }
        assert_eq!(needed.last().unwrap().id, files[0].0.manifest);

        let remote = DirRemote::create(dir.path().join("remote").to_str().unwrap()).unwrap();
        let manifests: Vec<ObjectId> = files.iter().map(|(f, _)| f.manifest).collect();
        let first = store.push_files(&remote, &manifests).unwrap();
        assert_eq!((first.files, first.files_present), (3, 0));
        assert!(first.objects > 0 && first.missing.is_empty());
        let again = store.push_files(&remote, &manifests).unwrap();
        assert_eq!((again.files_present, again.objects, again.bytes), (3, 0, 0));

        // Another store fetches each file from the remote alone.
        let clone = Repo::init(&dir.path().join("clone")).unwrap();
        for (f, bytes) in &files {
            let got = clone.fetch_file(&remote, &f.manifest).unwrap();
            assert_eq!(got.files_present, 0);
            let out = dir.path().join("out");
            clone.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
            assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        }
        assert_eq!(clone.fetch_file(&remote, &files[0].0.manifest).unwrap().files_present, 1);
        for id in clone.store().list().unwrap() {
            clone.store().verify(&id).unwrap();
        }

        // A file neither side has is reported, not an error of the whole push.
        let absent = ObjectId::hash(b"no such manifest");
        let r = store.push_files(&remote, &[absent]).unwrap();
        assert_eq!(r.missing, vec![absent]);
    }

    #[test]
    fn blobs_go_up_as_deltas_against_the_previous_file_with_the_remote_chain_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        Repo::init(&root).unwrap();
        // Chains on the remote at most `base_every - 1` = 2 deltas deep.
        std::fs::write(root.join(".ckpt/config"), r#"{"base_every": 3}"#).unwrap();
        let store = Repo::open(&root).unwrap();
        let remote_dir = dir.path().join("remote");
        let remote = DirRemote::create(remote_dir.to_str().unwrap()).unwrap();
        let remote_header = |id: &ObjectId| {
            let bytes = std::fs::read(remote_dir.join(crate::remote::object_key(id))).unwrap();
            crate::store::ObjectHeader::decode(*id, &bytes[..HEADER_LEN]).unwrap()
        };
        let path = RepoPath::parse("m.safetensors").unwrap();
        let spool = dir.path().join("spool");
        let mut files = Vec::new();
        let mut previous: Option<ObjectId> = None;
        let mut whole_bytes = 0;
        for step in 0..5 {
            let bytes = checkpoint(1, step);
            std::fs::write(&spool, &bytes).unwrap();
            let f = store.store_file(&spool, &path, "s", &CommitOptions::default()).unwrap();
            let against: HashMap<ObjectId, ObjectId> = previous.map(|p| (f.manifest, p)).into_iter().collect();
            let r = store.push_files_against(&remote, &[f.manifest], &against, Layout::Deltas).unwrap();
            // The blobs this step changed (the safetensors header is the same every step).
            let before: HashSet<ObjectId> =
                previous.map(|p| store.manifest(&p).unwrap().blobs().collect()).unwrap_or_default();
            let changed: Vec<ObjectId> =
                store.manifest(&f.manifest).unwrap().blobs().filter(|b| !before.contains(b)).collect();
            assert_eq!(changed.len(), if step == 0 { 3 } else { 2 }, "step {step}");
            let depths: Vec<u32> = changed.iter().map(|b| remote_header(b).depth).collect();
            // Whole at first, then deltas 1 and 2 deep, whole again at the bound, then a delta.
            let expected = [0, 1, 2, 0, 1][step as usize];
            assert_eq!(depths, vec![expected; depths.len()], "step {step}");
            assert_eq!(r.objects_as_deltas, if expected == 0 { 0 } else { depths.len() as u64 }, "step {step}");
            if expected == 0 {
                whole_bytes = r.bytes;
            } else {
                assert!(r.bytes * 4 < whole_bytes, "step {step}: {} bytes as deltas, {whole_bytes} whole", r.bytes);
            }
            files.push((f, bytes));
            previous = Some(files.last().unwrap().0.manifest);
        }
        // A store with nothing of its own fetches each file from the remote, chains included.
        let clone = Repo::init(&dir.path().join("clone")).unwrap();
        for (f, bytes) in files.iter().rev() {
            clone.fetch_file(&remote, &f.manifest).unwrap();
            let out = dir.path().join("out");
            clone.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
            assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        }
        for id in clone.store().list().unwrap() {
            clone.store().verify(&id).unwrap();
        }
    }

    /// A directory remote whose uploads fail after `left` of them (an interrupted push).
    struct Interrupted {
        inner: DirRemote,
        left: std::sync::atomic::AtomicUsize,
    }

    impl Remote for Interrupted {
        fn url(&self) -> &str {
            self.inner.url()
        }
        fn list(&self, prefix: &str) -> crate::remote::Result<Vec<String>> {
            self.inner.list(prefix)
        }
        fn list_modified(&self, prefix: &str) -> crate::remote::Result<Vec<crate::remote::Listed>> {
            self.inner.list_modified(prefix)
        }
        fn modified(&self, key: &str) -> crate::remote::Result<Option<std::time::SystemTime>> {
            self.inner.modified(key)
        }
        fn get_small(&self, key: &str) -> crate::remote::Result<Option<crate::remote::Small>> {
            self.inner.get_small(key)
        }
        fn put_small(&self, key: &str, bytes: &[u8], expect: &crate::remote::Expect) -> crate::remote::Result<()> {
            self.inner.put_small(key, bytes, expect)
        }
        fn upload(
            &self,
            key: &str,
            file: &std::fs::File,
            path: &Path,
            len: u64,
            mode: UploadMode,
        ) -> crate::remote::Result<Uploaded> {
            use std::sync::atomic::Ordering;
            if self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_err() {
                return Err(crate::remote::Error::NotFound { remote: "interrupted".into(), key: key.into() });
            }
            self.inner.upload(key, file, path, len, mode)
        }
        fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> crate::remote::Result<()> {
            self.inner.replace(key, file, path, len)
        }
        fn delete(&self, key: &str) -> crate::remote::Result<()> {
            self.inner.delete(key)
        }
        fn read_head(&self, key: &str, len: u64) -> crate::remote::Result<(Vec<u8>, u64)> {
            self.inner.read_head(key, len)
        }
        fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> crate::remote::Result<u64> {
            self.inner.download(key, out, limit)
        }
        fn requests(&self) -> u64 {
            self.inner.requests()
        }
    }

    #[test]
    fn an_interrupted_push_leaves_no_manifest_without_its_objects_and_a_rerun_completes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, files) = store_with_steps(dir.path());
        let url = dir.path().join("remote");
        let manifests: Vec<ObjectId> = files.iter().map(|(f, _)| f.manifest).collect();
        let total = store.file_objects(&manifests).unwrap().len();
        for stop in [1, total / 2, total - 1] {
            let _ = std::fs::remove_dir_all(&url);
            let remote = Interrupted {
                inner: DirRemote::create(url.to_str().unwrap()).unwrap(),
                left: std::sync::atomic::AtomicUsize::new(stop),
            };
            assert!(store.push_files(&remote, &manifests).is_err());
            // Whatever manifest arrived can be fetched whole from the remote alone.
            let clone = Repo::init(&dir.path().join(format!("clone{stop}"))).unwrap();
            for (f, bytes) in &files {
                if url.join(crate::remote::object_key(&f.manifest)).exists() {
                    clone.fetch_file(&remote.inner, &f.manifest).unwrap();
                    let out = dir.path().join("out");
                    clone.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
                    assert_eq!(&std::fs::read(&out).unwrap(), bytes);
                }
            }
            // The rerun sends only the rest.
            let rerun = store.push_files(&remote.inner, &manifests).unwrap();
            assert_eq!(rerun.objects as usize, total - stop, "stopped after {stop}");
        }
    }

    #[test]
    fn a_file_damaged_here_is_refused_before_anything_goes_up() {
        let dir = tempfile::tempdir().unwrap();
        let (store, files) = store_with_steps(dir.path());
        let newest = &files[2].0;
        let blob = store.manifest(&newest.manifest).unwrap().blobs().next().unwrap();
        let path = store.store().object_path(&blob);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 0x08;
        std::fs::write(&path, bytes).unwrap();
        let remote_dir = dir.path().join("remote");
        let remote = DirRemote::create(remote_dir.to_str().unwrap()).unwrap();
        for layout in [Layout::Deltas, Layout::Mirror] {
            let e =
                store.push_files_against(&remote, &[newest.manifest], &HashMap::new(), layout).unwrap_err().to_string();
            assert!(e.contains(&blob.to_hex()) && e.contains("damaged"), "{e}");
            assert!(remote.list("objects/").unwrap().is_empty(), "{layout}: something went up");
        }
    }

    #[test]
    fn a_damaged_object_on_the_remote_is_refused_and_never_stored() {
        let dir = tempfile::tempdir().unwrap();
        let (store, files) = store_with_steps(dir.path());
        let remote_dir = dir.path().join("remote");
        let remote = DirRemote::create(remote_dir.to_str().unwrap()).unwrap();
        let newest = &files[2].0;
        store.push_files(&remote, &[newest.manifest]).unwrap();
        // Flip a byte near the end of every blob of the newest file on the remote.
        let m = store.manifest(&newest.manifest).unwrap();
        for blob in m.blobs() {
            let key = crate::remote::object_key(&blob);
            let path = remote_dir.join(&key);
            let mut bytes = std::fs::read(&path).unwrap();
            let n = bytes.len();
            bytes[n - 3] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
        }
        let clone = Repo::init(&dir.path().join("clone")).unwrap();
        let e = clone.fetch_file(&remote, &newest.manifest).unwrap_err().to_string();
        assert!(m.blobs().any(|b| e.contains(&b.to_hex()[..12])), "{e}");
        assert!(!clone.store().contains(&newest.manifest));
        assert!(m.blobs().all(|b| !clone.store().contains(&b)));
    }
}
