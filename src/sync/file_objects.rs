//! Objects by file rather than by version: their upload to a remote and their download from
//! one. The git filter uses these: git carries the pointers (so no version or ref of the store
//! travels), and only git knows which files are still alive; so do the ranks of a distributed
//! save (`stored.rs`).
//!
//! Built on the same primitives and invariants as `push`/`fetch` (docs/format.md, "Remotes"):
//! a delta's reference goes up before the delta and a manifest after its blobs, so a manifest
//! present on the remote means its file can be restored from there; everything downloaded is
//! verified against its id before it enters the local store, bases first (`stage.rs`).

use super::checked::Checked;
use super::freshness::{fresh_on, mark_git_filter, GcWatch};
use super::recode::{file_journal, finish_journals, journal_key, plan_file_recodes, recode, write_journal, Journal};
use super::remote_view::remote_header;
use super::remotes::Layout;
use super::stage::stage_then_lock;
use super::transfer::parallel;
use super::upload::{found_on, upload_needed};
use super::wire_delta::WireDelta;
use super::Result;
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::graph::{self, Node};
use crate::repo::{Counterpart, Needed, Repo};
use crate::store::{ObjectKind, MAX_CHAIN_DEPTH};
use std::collections::{HashMap, HashSet};

/// What an upload of files takes the remote to hold before it starts.
pub(super) enum OnRemote {
    /// What one listing of `objects/` says: a listing costs a request per thousand objects
    /// of the whole remote, so it is for transfers a person starts (`ckpt push`, the git
    /// filter's transfers), not for a rank saving every few minutes.
    Listed,
    /// These objects (the blobs of the version a save follows: a version is uploaded after
    /// everything it needs), and no listing: any other object is uploaded create-if-absent,
    /// one of at least [`super::upload::LOOK_FIRST`] bytes after one request that finds it
    /// absent (a save retried after a failure finds its blobs there). What a save sends so
    /// stays within the save's own objects, however long the remote's history.
    Known(HashSet<ObjectId>),
}

/// Requests a file transfer keeps in flight.
const TRANSFERS: usize = 4;

/// What [`push_files`] or [`fetch_file`] moved.
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

impl FileTransfer {
    /// Counts recodes done: `objects` replaced, `bytes` uploaded.
    pub(super) fn add_recodes(&mut self, (objects, bytes): (u64, u64)) {
        self.objects += objects;
        self.objects_recoded += objects;
        self.bytes += bytes;
    }
}

/// Uploads to `remote` what the files `manifests` (manifest ids) need and the remote lacks:
/// one listing of the remote's objects, then the missing objects in `Repo::file_objects`
/// order (bases, deltas, manifest last). A file whose manifest the remote already has is
/// skipped whole, including when the local store does not hold it (a clone that never smudged
/// it); a file neither side holds is listed in [`FileTransfer::missing`]. The git filter's
/// pre-push.
pub fn push_files(repo: &Repo, remote: &dyn Remote, manifests: &[ObjectId]) -> Result<FileTransfer> {
    push_files_against(repo, remote, manifests, &HashMap::new(), Layout::Deltas)
}

/// [`push_files`] in `layout`; `previous` maps a file (manifest) to the one the remote
/// already holds for the same path (the pointer at that path in the remote's commit).
///
/// Mirror (docs/format.md, "A mirror push"): journals on the remote are finished first; the
/// files' objects go up as this store holds them (the newest content whole), and then each
/// blob of the previous file that local compaction recoded as a delta against the new file's
/// blob of the same tensor is replaced on the remote by that delta, with the same rules and
/// journal as a push (`recode.rs`).
///
/// Deltas: a blob the remote lacks, stored whole here, goes up as an XOR delta against the
/// blob of the same tensor (name, dtype, shape; bundles by their first tensor) in that file,
/// if the remote holds that file's manifest and blob, the delta is smaller than the object
/// here, and the remote's chain stays within `base_every - 1` deltas (read from the header of
/// the remote's copy of the reference: one ranged read). Otherwise, or if the reference cannot
/// be read here or there, the object goes up as it is (docs/format.md, "Deltas on the wire").
pub fn push_files_against(
    repo: &Repo,
    remote: &dyn Remote,
    manifests: &[ObjectId],
    previous: &HashMap<ObjectId, ObjectId>,
    layout: Layout,
) -> Result<FileTransfer> {
    push_files_paired(repo, remote, manifests, previous, &[], layout, OnRemote::Listed)
}

/// The files of an upload, sorted by what the remote holds ([`sort_files`]).
struct Files {
    /// What the upload takes the remote to hold.
    present: HashSet<ObjectId>,
    /// Whether objects not in `present` are looked for before they go up ([`found_on`]).
    look_first: bool,
    /// The files to upload (held here, not on the remote).
    wanted: Vec<ObjectId>,
    /// Files found on the remote by a fresh manifest of a failed save: their objects are
    /// counted on, so checked when the upload settles.
    counted: Vec<ObjectId>,
}

/// [`push_files_against`], where in the deltas layout a blob may also go up as a delta
/// against the blob `pairs` names for it (with the same conditions): the same items of any
/// `.distcp` file of the previous version, for a rank saving to a remote, which passes what it
/// knows the remote holds (`on_remote`) instead of listing it.
pub(super) fn push_files_paired(
    repo: &Repo,
    remote: &dyn Remote,
    manifests: &[ObjectId],
    previous: &HashMap<ObjectId, ObjectId>,
    pairs: &[Counterpart],
    layout: Layout,
    on_remote: OnRemote,
) -> Result<FileTransfer> {
    let mut report = FileTransfer { remote: remote.url().to_string(), files: manifests.len(), ..Default::default() };
    let checked = Checked::default();
    if layout == Layout::Mirror {
        report.add_recodes(finish_journals(repo, remote, &|_| false, TRANSFERS, &checked)?.0);
    }
    // A rank's upload (not the git filter's, whose remote gc refuses) checks before it hands
    // its files back that no gc took what they need (`GcWatch::settle`).
    let mut watch = match on_remote {
        OnRemote::Known(_) => Some(GcWatch::begin(remote)?),
        OnRemote::Listed => None,
    };
    let files = sort_files(repo, remote, manifests, on_remote, watch.as_mut(), &mut report)?;
    let present = &files.present;
    let need: Vec<Needed> =
        repo.file_objects(&files.wanted)?.into_iter().filter(|n| !present.contains(&n.id)).collect();
    let (wire, journal) = match layout {
        Layout::Deltas => (plan_file_deltas(repo, remote, &files.wanted, previous, pairs, &need, present)?, None),
        Layout::Mirror => {
            let recodes = plan_file_recodes(repo, &files.wanted, previous, present)?;
            (HashMap::new(), (!recodes.is_empty()).then(|| file_journal(recodes)))
        }
    };
    // What goes up, what its deltas are coded against and what its recodes replace remote
    // blobs by, verified here before anything goes up (`checked.rs`).
    let mut to_verify: Vec<ObjectId> = need.iter().map(|n| n.id).collect();
    to_verify.extend(wire.values().map(|w| w.reference));
    if let Some(journal) = &journal {
        to_verify
            .extend(journal.recodes.iter().flat_map(|r| [r.older, r.newer]).filter(|id| repo.store().contains(id)));
    }
    checked.verify_here(repo, remote, to_verify)?;
    // Written before anything goes up: a rerun (of any push) finishes the recodes.
    if let Some(journal) = &journal {
        write_journal(repo, remote, journal)?;
    }
    let look_first = |id: &ObjectId| Ok(files.look_first && found_on(repo, remote, id)?);
    let sent = upload_needed(repo, remote, &need, &wire, &look_first, TRANSFERS, &checked)?;
    report.objects += sent.objects;
    report.bytes += sent.bytes;
    report.objects_as_deltas += sent.as_deltas;
    if let Some(watch) = watch {
        // `need` is what the wanted files need and the remote was not known to hold; the
        // files counted on by a fresh manifest add theirs.
        let mut relied: Vec<ObjectId> = need.iter().map(|n| n.id).collect();
        let counted = repo.file_objects(&files.counted)?;
        relied.extend(counted.into_iter().map(|n| n.id).filter(|id| !present.contains(id)));
        watch.settle(repo, remote, &relied)?;
    }
    if let Some(Journal { recodes, version, .. }) = journal {
        report.add_recodes(recode(repo, remote, &recodes, TRANSFERS, &checked)?);
        remote.delete(&journal_key(&version))?;
    }
    report.requests = remote.requests();
    Ok(report)
}

/// Sorts the files `manifests` of an upload by what the remote holds (`on_remote`): there
/// already (counted in `report`), to upload, or held neither here nor there
/// ([`FileTransfer::missing`]). A fresh manifest found on the remote (not listed: a rank's
/// save) stands for a file a failed save uploaded, perhaps without settling: `watch` checks its
/// objects.
fn sort_files(
    repo: &Repo,
    remote: &dyn Remote,
    manifests: &[ObjectId],
    on_remote: OnRemote,
    mut watch: Option<&mut GcWatch>,
    report: &mut FileTransfer,
) -> Result<Files> {
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
    let mut files = Files { present, look_first, wanted: Vec::new(), counted: Vec::new() };
    for m in manifests {
        let listed = files.present.contains(m);
        if listed || (look_first && fresh_on(remote, m)?) {
            if let (false, Some(watch)) = (listed, watch.as_deref_mut()) {
                watch.check_anyway();
                if repo.store().contains(m) {
                    files.counted.push(*m);
                }
            }
            report.files_present += 1;
        } else if repo.store().contains(m) {
            files.wanted.push(*m);
        } else {
            report.missing.push(*m);
        }
    }
    Ok(files)
}

/// Which blobs of `need` go up as deltas (see [`push_files_against`]): pairs of a blob of a
/// `wanted` file and the same tensor's blob in the file `previous` names for it (the remote
/// holding that file's manifest), then `pairs`, each with the remote holding the reference
/// blob (`present`), this store holding both blobs, the new one whole and no other object of
/// `need` coded against it (its chain here would then not match the remote's).
fn plan_file_deltas(
    repo: &Repo,
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
    let max_depth = (repo.config().base_every.saturating_sub(1)).clamp(1, MAX_CHAIN_DEPTH);
    let mut candidates = Vec::new();
    for m in wanted {
        let Some(old) = previous.get(m).filter(|o| *o != m && present.contains(o)) else { continue };
        // A clone that never smudged the remote's file cannot code against it.
        if !repo.store().contains(old) {
            continue;
        }
        let (new_manifest, old_manifest) = (repo.manifest(m)?, repo.manifest(old)?);
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
            || !repo.store().contains(&reference)
            || repo.store().header(&new)?.reference.is_some()
        {
            continue;
        }
        chosen.push(pair);
    }
    // The remote depth of each reference (`None`: unreadable or not a blob, no delta on it):
    // one ranged read each, in parallel (a rank file's items are thousands of references).
    let mut references: Vec<ObjectId> = chosen.iter().map(|p| p.old).collect();
    references.sort_unstable();
    references.dedup();
    let remote_depth = std::sync::Mutex::new(HashMap::new());
    parallel(&references, TRANSFERS, |reference| {
        let header = remote_header(remote, reference).ok().flatten().map(|(h, _)| h);
        let depth = header.filter(|h| h.kind == ObjectKind::Blob).map(|h| h.depth);
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

/// Downloads the file whose manifest is `manifest` from `remote` into `repo`'s store, unless
/// the store holds the manifest already: the manifest, its blobs and the references of those
/// that are deltas, each verified against its id before it is stored, blobs bases first and
/// the manifest last (so an interrupted download leaves only complete chains and a rerun
/// fetches what is still missing). As `fetch`, without the writer lock until what arrived is
/// stored (`stage.rs`). The git filter's smudge of a file the local store lacks.
pub fn fetch_file(repo: &Repo, remote: &dyn Remote, manifest: &ObjectId) -> Result<FileTransfer> {
    let mut report = FileTransfer { remote: remote.url().to_string(), files: 1, ..Default::default() };
    if repo.store().contains(manifest) {
        report.files_present = 1;
        return Ok(report);
    }
    repo.progress().start("fetch", 0);
    let (_lock, stage, ()) = stage_then_lock(repo, remote, |stage| {
        let blobs = graph::edges(stage, Node::Manifest(*manifest))?;
        stage.blobs(blobs.iter().map(Node::id).collect(), TRANSFERS)
    })?;
    report.bytes = stage.bytes();
    report.objects = stage.import()?;
    repo.progress().finish();
    report.requests = remote.requests();
    Ok(report)
}

/// Downloads the blobs `wanted` from `remote` into `repo`'s store, each with its chain, unless
/// the store holds them: no manifest, so no file claims to be here whole. Verified and stored
/// as [`fetch_file`] stores a file's blobs.
pub(super) fn fetch_blobs(repo: &Repo, remote: &dyn Remote, wanted: Vec<ObjectId>) -> Result<FileTransfer> {
    let mut report = FileTransfer { remote: remote.url().to_string(), ..Default::default() };
    let wanted: Vec<ObjectId> = wanted.into_iter().filter(|id| !repo.store().contains(id)).collect();
    if wanted.is_empty() {
        return Ok(report);
    }
    let (_lock, stage, ()) = stage_then_lock(repo, remote, |stage| stage.blobs(wanted.clone(), TRANSFERS))?;
    report.bytes = stage.bytes();
    report.objects = stage.import()?;
    report.requests = remote.requests();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::local::DirRemote;
    use crate::remote::Uploaded;
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
        let first = push_files(&store, &remote, &manifests).unwrap();
        assert_eq!((first.files, first.files_present), (3, 0));
        assert!(first.objects > 0 && first.missing.is_empty());
        let again = push_files(&store, &remote, &manifests).unwrap();
        assert_eq!((again.files_present, again.objects, again.bytes), (3, 0, 0));

        // Another store fetches each file from the remote alone.
        let clone = Repo::init(&dir.path().join("clone")).unwrap();
        for (f, bytes) in &files {
            let got = fetch_file(&clone, &remote, &f.manifest).unwrap();
            assert_eq!(got.files_present, 0);
            let out = dir.path().join("out");
            clone.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
            assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        }
        assert_eq!(fetch_file(&clone, &remote, &files[0].0.manifest).unwrap().files_present, 1);
        for id in clone.store().list().unwrap() {
            clone.store().verify(&id).unwrap();
        }

        // A file neither side has is reported, not an error of the whole push.
        let absent = ObjectId::hash(b"no such manifest");
        let r = push_files(&store, &remote, &[absent]).unwrap();
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
            crate::store::ObjectHeader::decode(*id, &bytes[..crate::store::HEADER_LEN]).unwrap()
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
            let r = push_files_against(&store, &remote, &[f.manifest], &against, Layout::Deltas).unwrap();
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
            fetch_file(&clone, &remote, &f.manifest).unwrap();
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
            mode: crate::remote::UploadMode,
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
            assert!(push_files(&store, &remote, &manifests).is_err());
            // Whatever manifest arrived can be fetched whole from the remote alone.
            let clone = Repo::init(&dir.path().join(format!("clone{stop}"))).unwrap();
            for (f, bytes) in &files {
                if url.join(crate::remote::object_key(&f.manifest)).exists() {
                    fetch_file(&clone, &remote.inner, &f.manifest).unwrap();
                    let out = dir.path().join("out");
                    clone.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
                    assert_eq!(&std::fs::read(&out).unwrap(), bytes);
                }
            }
            // The rerun sends only the rest.
            let rerun = push_files(&store, &remote.inner, &manifests).unwrap();
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
            let e = push_files_against(&store, &remote, &[newest.manifest], &HashMap::new(), layout)
                .unwrap_err()
                .to_string();
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
        push_files(&store, &remote, &[newest.manifest]).unwrap();
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
        let e = fetch_file(&clone, &remote, &newest.manifest).unwrap_err().to_string();
        assert!(m.blobs().any(|b| e.contains(&b.to_hex()[..12])), "{e}");
        assert!(!clone.store().contains(&newest.manifest));
        assert!(m.blobs().all(|b| !clone.store().contains(&b)));
    }
}
