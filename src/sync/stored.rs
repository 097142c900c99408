//! Versions written straight to a remote by writers that share only the remote: the ranks of a
//! distributed checkpoint saved with `ckpt.dcp.Writer("s3://…")`, and their reads back
//! (`ckpt.dcp.Reader`). No rank has a repository; each has a cache of its own (a repository
//! used only as an object store: no version of it is ever committed or checked out).
//!
//! A save follows the rules of the push machinery (docs/format.md, "Remotes" and "Distributed
//! saves to a remote"): each rank stores its file in its cache, whole, and uploads the objects
//! the remote lacks, create-if-absent, a manifest after its blobs ([`store_file_to_remote`]).
//! Its blobs are paired with the same tensors of the previous version as a commit pairs them
//! (for a `.distcp` file, the same items in any `.distcp` file of it, the same path's first). In
//! the deltas layout its new blobs go up as forward deltas against their pairs, as the git
//! filter's file transfers send them; in the mirror layout they go up whole and the paired
//! blobs of the previous version are then recoded on the remote as deltas against them, under
//! a journal, as a mirror file transfer does. A rank downloads only the manifests pairing needs
//! and the paired blobs, not whole files of other ranks. One writer then lists every rank's
//! file in one version, uploads it and moves the remote branch by compare-and-swap against the
//! tip read when the save began ([`commit_to_remote`]): a concurrent save of another job that
//! moved the branch first makes it fail, and nothing is overwritten.
//!
//! Reads ([`StoredFileReader`]) decode only the segments a byte range covers, each verified
//! against its id, so a reader holds about what it asked for, not a whole file.
//!
//! The cache is by default kept by the rank from save to save ([`super::RankCache`]), so a save
//! on top of the previous one finds the rank's previous file there; a mirror save notes its
//! journal in the cache, and the rank's next save deletes a journal an earlier save through the
//! same cache left unfinished ([`store_file_to_remote`]).

use super::checked::Checked;
use super::file_objects::{fetch_blobs, fetch_file, push_files_paired, OnRemote};
use super::freshness::{check_deadline, fresh_on, is_fresh, GcWatch, Moment};
use super::recode::{allowed_recodes, file_journal, journal_key, recode, write_journal, Journal, JOURNAL_PREFIX};
use super::remote_view::{
    download_data, put_ref, ref_key, remote_branch_tip, tip_blobs, RemoteObjects, RemoteRef, RemoteTip,
};
use super::remotes::Layout;
use super::transfer::parallel;
use super::upload::{found_on, upload_needed, upload_object};
use super::{Error, FileTransfer, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote};
use crate::repo::graph::Objects;
use crate::repo::Error as RepoError;
use crate::repo::{
    check_name, CommitOptions, Counterpart, FileEntry, Manifest, Needed, RefKind, Repo, RepoPath, Version, VersionId,
};
use crate::repo::{since_base_after, NewVersion};
use crate::store::ObjectKind;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Version `id`, from `cache` or else downloaded from `remote` (verified against its id) into
/// it.
pub fn fetch_version(cache: &Repo, remote: &dyn Remote, id: &VersionId) -> Result<Version> {
    if cache.store().contains(id) {
        return Ok(cache.version(id)?);
    }
    let (tmp, data) = download_data(cache, remote, id, ObjectKind::Version)?;
    let version = Version::parse(*id, &data)?;
    // Imports happen under the writer lock (the download did not need it).
    let _lock = cache.lock()?;
    cache.import_version(id, &version, tmp)?;
    Ok(version)
}

/// The entry of `path` in version `id` of `remote`, with the file's objects (manifest, blobs
/// and their chains) downloaded into `cache` unless it holds them: what a reader needs to
/// read the file's bytes from the cache ([`StoredFileReader`]), and no other file's.
pub fn fetch_stored_file(cache: &Repo, remote: &dyn Remote, id: &VersionId, path: &str) -> Result<FileEntry> {
    let version = fetch_version(cache, remote, id)?;
    let entry = version
        .file(path)
        .cloned()
        .ok_or_else(|| Error::from(RepoError::NotInVersion { path: path.to_string(), version: *id }))?;
    fetch_file(cache, remote, &entry.manifest)?;
    Ok(entry)
}

use crate::torch_zip::dcp::DISTCP_SUFFIX;

/// One file a rank stores to a remote ([`store_file_to_remote`], [`upload_file_to_remote`]).
#[derive(Clone, Copy, Debug)]
pub struct FileUpload<'a> {
    /// The file on disk.
    pub disk: &'a Path,
    /// Its path in the version.
    pub path: &'a RepoPath,
    /// The version the save follows (the new version's parent), if any.
    pub previous: Option<&'a VersionId>,
    /// A `.distcp` file's items as its writer reports them.
    pub written: Option<&'a [crate::torch_zip::dcp::Item]>,
    /// How the remote stores versions.
    pub layout: Layout,
    /// Transfers in flight at once.
    pub transfers: usize,
}

/// Stores the file at `disk` as the content of `path` in `cache` (whole; a `.distcp` file cut
/// by `written`, the items its writer reports, as [`Repo::store_objects`] cuts it) and uploads
/// what the remote lacks of it (create-if-absent, the manifest last), for [`commit_to_remote`]
/// to list in a version whose parent is `previous`. Its blobs are paired with the same tensors
/// of `previous` as a commit pairs them (for a `.distcp` file, the same items in any `.distcp`
/// file of it, the same path's first), downloading only the manifests that takes and only the
/// paired blobs of `previous` into `cache`. In `layout`:
///
/// - deltas: each new blob goes up as a forward XOR delta against its pair, where that pays
///   and the remote's chain stays within bounds (the git filter's deltas-layout transfer,
///   docs/format.md "Deltas on the wire");
/// - mirror: the new blobs go up whole; then each paired blob of `previous` that the remote
///   held before this upload and whose new counterpart the remote lacked is replaced there by
///   an XOR delta against it, under a journal written first, unless the previous version is
///   pinned (docs/format.md, "A mirror push"). The journal's key is noted in `cache` first; a
///   journal an earlier save through `cache` noted and left (killed or failed mid-way, so it
///   left no version) is deleted, not finished: its recodes would be against blobs no version
///   names.
///
/// Returns the file's entry, what moved, and what the remote stores anew for it.
pub fn store_file_to_remote(cache: &Repo, remote: &dyn Remote, upload: &FileUpload) -> Result<RemoteFile> {
    let mut file = upload_file_to_remote(cache, remote, upload)?;
    if let Some(recodes) = file.recodes.take() {
        file.transfer.add_recodes(finish_recodes(cache, remote, vec![recodes], upload.transfers)?);
        file.transfer.requests = remote.requests();
    }
    Ok(file)
}

/// [`store_file_to_remote`] up to the mirror layout's recodes, which it leaves to
/// [`finish_recodes`] ([`RemoteFile::recodes`]): the file is on the remote, complete, once this
/// returns, and a version may list it at once. The recodes only make the previous version's
/// blobs smaller on the remote, so they may run after the version is committed, while the
/// training job goes on. Left undone (the process ended first), their journal stays on the
/// remote, noted in `cache`, and the rank's next save through `cache` deletes it: the previous
/// version's blobs then stay whole, which costs space, never data.
pub fn upload_file_to_remote(cache: &Repo, remote: &dyn Remote, upload: &FileUpload) -> Result<RemoteFile> {
    let FileUpload { disk, path, previous, written, layout, .. } = *upload;
    let version = previous.map(|p| fetch_version(cache, remote, p)).transpose()?;
    let distcp = path.as_str().ends_with(DISTCP_SUFFIX);
    // Another file (`.metadata`): the same path's previous file, downloaded whole (small).
    let mut earlier = None;
    if let (Some(v), false) = (&version, distcp) {
        if let Some(f) = v.file(path.as_str()) {
            fetch_file(cache, remote, &f.manifest)?;
            earlier = Some(f.manifest);
        }
    }
    // Whole: the deltas go up coded for the remote, against what it holds.
    let entry = cache.store_objects(disk, path, None, written, None)?;
    let manifest = cache.manifest(&entry.manifest)?;
    let mut pairs = match (&version, earlier) {
        (None, _) => Vec::new(),
        (Some(_), Some(old)) => manifest.same_tensor_blobs(&cache.manifest(&old)?),
        (Some(v), None) => reference_pairs(cache, remote, path.as_str(), &manifest, v)?,
    };
    // A pinned previous version keeps its blobs whole on a mirror remote: only its unchanged
    // blobs are paired (as known to be there), none is recoded.
    if layout == Layout::Mirror && version.as_ref().is_some_and(Version::is_pinned) {
        pairs.retain(|p| p.new == p.old);
    }
    if distcp {
        // Only the blobs a delta may be coded against (not the unchanged ones).
        fetch_blobs(cache, remote, pairs.iter().filter(|p| p.new != p.old).map(|p| p.old).collect())?;
    }
    // What the remote holds of the previous version, without listing the remote (whose
    // history a long job makes millions of objects): its files' manifests and the blobs
    // paired with this file's (a version goes up after everything it needs).
    let mut known: HashSet<ObjectId> = pairs.iter().map(|p| p.old).collect();
    if let Some(v) = &version {
        known.extend(v.files.iter().map(|f| f.manifest));
    }
    let (transfer, stored_bytes, recodes) = match layout {
        Layout::Deltas => {
            let on_remote = OnRemote::Known(known);
            let t = push_files_paired(
                cache,
                remote,
                &[entry.manifest],
                &HashMap::new(),
                &pairs,
                Layout::Deltas,
                on_remote,
            )?;
            let stored = t.bytes;
            (t, stored, None)
        }
        Layout::Mirror => push_whole_then_recode(cache, remote, upload, (&entry.manifest, &manifest), &pairs, &known)?,
    };
    Ok(RemoteFile { entry, transfer, stored_bytes, recodes })
}

/// Recodes a mirror upload left to do ([`upload_file_to_remote`]): the previous version's
/// blobs replaced on the remote by XOR deltas against the new ones, each only if the new blob
/// is standalone there at that moment (as a mirror push recodes); then each journal is
/// deleted, and once all are, `cache`'s note of them. Returns the objects replaced and the
/// bytes uploaded.
pub fn finish_recodes(
    cache: &Repo,
    remote: &dyn Remote,
    pending: Vec<PendingRecodes>,
    transfers: usize,
) -> Result<(u64, u64)> {
    let (mut objects, mut bytes) = (0, 0);
    for PendingRecodes { journal, planned, checked } in pending {
        // A recode makes a blob of the previous version a delta against a blob no version may
        // ever name (if this save fails): only while that blob is fresh, which gc keeps.
        if planned.elapsed() < super::FRESH_FOR {
            let (o, b) = recode(cache, remote, &journal.recodes, transfers, &checked)?;
            objects += o;
            bytes += b;
        }
        remote.delete(&journal_key(&journal.version))?;
    }
    remove_journals_note(cache)?;
    Ok((objects, bytes))
}

/// The recodes of one mirror upload, not done yet ([`finish_recodes`]); their journal is on
/// the remote and noted in the rank's cache.
#[derive(Debug)]
pub struct PendingRecodes {
    journal: Journal,
    /// When the upload looked for the new blobs (before uploading them).
    planned: Moment,
    /// What the upload verified here and wrote there (the recodes' newer blobs, so that they
    /// are neither decoded nor downloaded again to be coded against).
    checked: Checked,
}

impl PendingRecodes {
    /// Blobs planned for recoding.
    pub fn len(&self) -> usize {
        self.journal.recodes.len()
    }

    /// Whether nothing is planned (never the case for a value an upload returns).
    pub fn is_empty(&self) -> bool {
        self.journal.recodes.is_empty()
    }
}

/// A file stored to a remote by [`store_file_to_remote`] or [`upload_file_to_remote`].
#[derive(Debug)]
pub struct RemoteFile {
    /// Its entry, for [`commit_to_remote`].
    pub entry: FileEntry,
    /// What moved.
    pub transfer: FileTransfer,
    /// The size of the objects of the file that this upload created on the remote (its new
    /// blobs, as deltas or whole, and its manifest; not the mirror layout's recodes of the
    /// previous version's blobs): what the version's `stored_bytes` adds up.
    pub stored_bytes: u64,
    /// The mirror layout's recodes left to do ([`upload_file_to_remote`]; none after
    /// [`store_file_to_remote`]).
    pub recodes: Option<PendingRecodes>,
}

/// The new `.distcp` file `manifest` at `path` paired with the same items of `version`'s
/// `.distcp` files as a commit pairs them ([`Repo::store_objects`]: the same path's first, then
/// any file holding the item), downloading only the manifests that takes (kept in memory, not
/// stored: a manifest in the cache would claim its blobs are there): the same path's, and only
/// if it leaves a tensor unpaired (a change of rank count, an item DCP's de-duplication moved),
/// the other `.distcp` files'.
fn reference_pairs(
    cache: &Repo,
    remote: &dyn Remote,
    path: &str,
    manifest: &Manifest,
    version: &Version,
) -> Result<Vec<Counterpart>> {
    let objects = RemoteObjects::new(cache, remote);
    let mut manifests = HashMap::new();
    if let Some(f) = version.file(path) {
        let same = objects.manifest(&f.manifest)?;
        let complete = manifest.pairs_every_tensor_with(&same);
        manifests.insert(f.manifest, same);
        if complete {
            return Ok(manifest.same_tensor_blobs(&manifests[&f.manifest]));
        }
    }
    for f in version.files.iter().filter(|f| f.path.ends_with(DISTCP_SUFFIX)) {
        if let std::collections::hash_map::Entry::Vacant(e) = manifests.entry(f.manifest) {
            e.insert(objects.manifest(&f.manifest)?);
        }
    }
    Ok(cache.distcp_counterparts_in(path, manifest, version, manifests))
}

/// The mirror layout's upload of one file ([`upload_file_to_remote`]), stored here as
/// `manifest` (its id and content), with `present` what the remote is known to hold (the
/// previous version's manifests and the blobs paired with this file's; the remote is not
/// listed): the recodes planned (an older blob paired with a new one the remote lacks) and
/// written down in a journal; then the upload of what is not known there, create-if-absent
/// ([`found_on`] for large objects). Returns what moved, the bytes of the objects the upload
/// created, and the recodes left to do ([`finish_recodes`]).
fn push_whole_then_recode(
    cache: &Repo,
    remote: &dyn Remote,
    upload: &FileUpload,
    (manifest, new_m): (&ObjectId, &Manifest),
    pairs: &[Counterpart],
    present: &HashSet<ObjectId>,
) -> Result<(FileTransfer, u64, Option<PendingRecodes>)> {
    let mut report = FileTransfer { remote: remote.url().to_string(), files: 1, ..Default::default() };
    forget_journals_of_failed_saves(cache, remote)?;
    // What the file's objects are that no ref reaches (not the previous version's): checked
    // before the file is handed back if a gc ran meanwhile (`GcWatch::settle`).
    let mut watch = GcWatch::begin(remote)?;
    let objects = cache.file_objects(&[*manifest])?;
    let relied: Vec<ObjectId> = objects.iter().map(|n| n.id).filter(|id| !present.contains(id)).collect();
    if present.contains(manifest) || fresh_on(remote, manifest)? {
        // A fresh manifest stands for its whole file (uploaded before it, by a save that
        // failed, perhaps before it could settle): its objects are checked whatever gcs did.
        if !present.contains(manifest) {
            watch.check_anyway();
        }
        watch.settle(cache, remote, &relied)?;
        report.files_present = 1;
        report.requests = remote.requests();
        return Ok((report, 0, None));
    }
    // The new counterparts of the pairs to recode, looked for on the remote (in parallel):
    // one there already is not recoded against, nor uploaded. As a listing before the upload
    // did, this keeps every recode's X absent before this rank's upload, and every Y is in
    // the previous version, so two ranks never recode two blobs against each other.
    let planned = Moment::now();
    let looked_for: HashSet<ObjectId> = pairs
        .iter()
        .filter(|p| p.new != p.old && !present.contains(&p.new) && cache.store().contains(&p.new))
        .map(|p| p.new)
        .collect();
    let (found, found_fresh) = look_for(remote, &looked_for, upload.transfers)?;
    // One found there but not fresh (docs/format.md, "Garbage on a remote") is not recoded
    // against either, but goes up again (`keep_found`).
    let need: Vec<Needed> =
        objects.into_iter().filter(|n| !present.contains(&n.id) && !found_fresh.contains(&n.id)).collect();
    // A blob the new file holds stays whole.
    let there = |id: &ObjectId| present.contains(id) || found.contains(id);
    let mut recodes = allowed_recodes(cache, pairs, &there, &new_m.blobs().collect());
    if !recodes.is_empty() {
        // The other branches' tips stay whole, as a push leaves the tips of the branches it
        // does not move; the tip this save follows is `previous`.
        let followed = |tip: &RemoteRef| Some(&tip.id) == upload.previous;
        match tip_blobs(&RemoteObjects::new(cache, remote), &followed) {
            Ok(protected) => recodes.retain(|r| !protected.contains(&r.older)),
            // Another tip that cannot be read (a damaged or partial remote): no recode could
            // be shown to spare it, so none is done; the save itself does not need them.
            Err(_) => recodes.clear(),
        }
    }
    let journal = (!recodes.is_empty()).then(|| file_journal(recodes));
    // Written before anything goes up: a later push finishes the recodes after a kill. Noted
    // in the cache first, so that this rank's next save through it deletes a journal this save
    // leaves (killed, or failed).
    let checked = Checked::default();
    let mut to_verify: Vec<ObjectId> = need.iter().map(|n| n.id).collect();
    if let Some(journal) = &journal {
        to_verify.extend(journal.recodes.iter().flat_map(|r| [r.older, r.newer]));
    }
    checked.verify_here(cache, remote, to_verify)?;
    if let Some(journal) = &journal {
        note_journal(cache, &journal_key(&journal.version))?;
        write_journal(cache, remote, journal)?;
    }
    // A large object a retried save left there is found with one request and not sent again
    // (those `looked_for` were looked for already; found there but not fresh, `upload_object`
    // writes it again).
    let left_there = |id: &ObjectId| Ok(!looked_for.contains(id) && found_on(cache, remote, id)?);
    let no_deltas = HashMap::new();
    let sent = upload_needed(cache, remote, &need, &no_deltas, &left_there, upload.transfers, &checked)?;
    watch.settle(cache, remote, &relied)?;
    report.objects += sent.objects;
    report.bytes += sent.bytes;
    report.requests = remote.requests();
    Ok((report, sent.bytes, journal.map(|journal| PendingRecodes { journal, planned, checked })))
}

/// Which of `ids` are on `remote`, and which of those are fresh: a `HEAD` each, in parallel.
fn look_for(
    remote: &dyn Remote,
    ids: &HashSet<ObjectId>,
    transfers: usize,
) -> Result<(HashSet<ObjectId>, HashSet<ObjectId>)> {
    let ids: Vec<ObjectId> = ids.iter().copied().collect();
    let found = std::sync::Mutex::new((HashSet::new(), HashSet::new()));
    let now = std::time::SystemTime::now();
    parallel(&ids, transfers * LOOKUPS_PER_TRANSFER, |id| {
        if let Some(modified) = remote.modified(&remote::object_key(id))? {
            let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
            found.0.insert(*id);
            if is_fresh(modified, now) {
                found.1.insert(*id);
            }
        }
        Ok(())
    })?;
    Ok(found.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// Existence checks (one small request each) a mirror save keeps in flight per upload it
/// would keep in flight.
const LOOKUPS_PER_TRANSFER: usize = 4;

/// The file in a rank cache's directory (beside its `.ckpt`) listing the keys of the journals
/// its saves wrote on the remote and have not deleted yet.
const JOURNALS_NOTE: &str = "dcp-journals";

/// Notes `key`, a journal about to be written, in `cache`'s list ([`JOURNALS_NOTE`]).
fn note_journal(cache: &Repo, key: &str) -> Result<()> {
    use std::io::Write;
    let path = cache.root().join(JOURNALS_NOTE);
    let io = |source| Error::Io { action: "writing", path: path.clone(), source };
    let mut file = std::fs::File::options().create(true).append(true).open(&path).map_err(io)?;
    file.write_all(format!("{key}\n").as_bytes()).map_err(io)
}

/// Deletes from `remote` the journals `cache`'s list names, then the list: journals of earlier
/// saves through this cache that did not finish (killed or failed mid-way). Such a save left no
/// version (a rank's upload ends before its save can be committed), so its recodes are moot:
/// finishing them would make the previous version's blobs deltas against blobs no version
/// names. Those done before it stopped stay (each a valid delta against an object the remote
/// keeps); the others are left whole, for the next save to pair and recode against its own
/// blobs. A journal the rank deleted itself is no longer there, which is no error.
fn forget_journals_of_failed_saves(cache: &Repo, remote: &dyn Remote) -> Result<()> {
    let path = cache.root().join(JOURNALS_NOTE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::Io { action: "reading", path, source }),
    };
    // Only keys of journals: the list is in a local directory, but not trusted.
    let ids = text.lines().filter_map(|k| k.strip_prefix(JOURNAL_PREFIX)?.parse::<ObjectId>().ok());
    for id in ids {
        remote.delete(&journal_key(&id))?;
    }
    remove_journals_note(cache)
}

/// Deletes `cache`'s list of journals ([`JOURNALS_NOTE`]), if any.
fn remove_journals_note(cache: &Repo) -> Result<()> {
    let path = cache.root().join(JOURNALS_NOTE);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { action: "deleting", path, source }),
    }
}

/// One version the ranks of a save stored the files of ([`commit_to_remote`]).
#[derive(Clone, Debug)]
pub struct RemoteCommit<'a> {
    /// The branch it goes on.
    pub branch: &'a str,
    /// Where the branch was when the save began ([`remote_branch_tip`]).
    pub tip: &'a RemoteTip,
    /// Its files ([`RemoteFile::entry`]).
    pub files: Vec<FileEntry>,
    /// What the ranks' uploads created ([`RemoteFile::stored_bytes`], added up).
    pub stored_bytes: u64,
    /// Its message.
    pub message: &'a str,
    /// Tags to create on it.
    pub tags: &'a [String],
    /// Its time, if given.
    pub options: &'a CommitOptions,
}

/// Writes one version listing `files` (uploaded by [`store_file_to_remote`]) on top of
/// `tip.version` to `remote` and moves `branch` there by compare-and-swap against `tip` (as
/// read by [`remote_branch_tip`] when the save began), then creates `tags` on it. If the
/// branch moved meanwhile (another save), nothing is moved and the error says so; a tag that
/// exists is refused before the branch moves. Every file's manifest must be on the remote (a
/// rank uploads its manifest after its blobs, so a present manifest is a complete file).
/// `cache` holds the version object before it goes up (and the parent's, downloaded). The
/// version's `stored_bytes` is `stored_bytes`, what the ranks' uploads created
/// ([`RemoteFile::stored_bytes`], added up).
pub fn commit_to_remote(cache: &Repo, remote: &dyn Remote, commit: RemoteCommit) -> Result<VersionId> {
    let RemoteCommit { branch, tip, files, stored_bytes, message, tags, options } = commit;
    check_name(branch)?;
    let url = remote.url().to_string();
    let mut seen_tags = HashSet::new();
    for t in tags {
        check_name(t)?;
        if !seen_tags.insert(t.as_str()) {
            return Err(Error::Rejected { remote: url, what: format!("tag {t}"), reason: "given twice".into() });
        }
    }
    if files.is_empty() {
        return Err(RepoError::NothingToCommit.into());
    }
    let mut by_path = BTreeMap::new();
    for f in files {
        RepoPath::parse(&f.path)
            .map_err(|reason| RepoError::InvalidPath { path: f.path.clone().into(), reason: reason.to_string() })?;
        let path = f.path.clone();
        if by_path.insert(path.clone(), f).is_some() {
            return Err(
                RepoError::InvalidPath { path: path.into(), reason: "listed twice in one version".into() }.into()
            );
        }
    }
    for f in by_path.values() {
        if !remote.exists(&remote::object_key(&f.manifest))? {
            let source = Box::new(RepoError::Store(crate::store::Error::Missing { id: f.manifest }));
            return Err(RepoError::File { path: f.path.clone(), source }.into());
        }
    }
    for t in tags {
        if remote.get_small(&ref_key(RefKind::Tag, t))?.is_some() {
            return Err(Error::Rejected {
                remote: url,
                what: format!("tag {t}"),
                reason: "the remote has this tag already (tags do not move)".into(),
            });
        }
    }
    let parent = tip.version.map(|id| fetch_version(cache, remote, &id)).transpose()?;
    let id = cache.write_version(NewVersion {
        parents: tip.version.into_iter().collect(),
        since_base: since_base_after(parent.as_ref(), cache.base_every(None)),
        files: by_path.into_values().collect(),
        stored_bytes,
        message,
        time: options.time,
    })?;
    let watch = GcWatch::begin(remote)?;
    Checked::default().verify_here(cache, remote, [id])?;
    upload_object(cache, remote, &id)?;
    watch.settle(cache, remote, &[id])?;
    let key = ref_key(RefKind::Branch, branch);
    if let Some(read_at) = tip.read_at {
        check_deadline(remote, &format!("branch {branch}"), read_at)?;
    }
    match put_ref(remote, &key, &id, &tip.expect()) {
        Ok(()) => {}
        Err(remote::Error::Conflict { .. }) => {
            let show = |v: Option<VersionId>| v.map_or("no version".to_string(), |v| v.to_hex());
            let now = remote_branch_tip(remote, branch).ok().and_then(|t| t.version);
            return Err(Error::Rejected {
                remote: url,
                what: format!("branch {branch}"),
                reason: format!(
                    "moved to {} since this save began on {}: another save committed first; nothing was overwritten",
                    show(now),
                    show(tip.version)
                ),
            });
        }
        Err(e) => return Err(e.into()),
    }
    for t in tags {
        put_ref(remote, &ref_key(RefKind::Tag, t), &id, &Expect::Absent).map_err(|e| match e {
            remote::Error::Conflict { .. } => Error::Rejected {
                remote: url.clone(),
                what: format!("tag {t}"),
                reason: format!(
                    "version {} was saved, but the tag was created meanwhile by another writer",
                    id.to_hex()
                ),
            },
            e => e.into(),
        })?;
    }
    Ok(id)
}

/// Reads byte ranges of one stored file from a repository's store (a repository, or a rank's
/// cache after [`fetch_stored_file`]), decoding only the segments a range covers, each through
/// its delta chain and checked against its id. A tensor in a bundle is read from its bundle,
/// decoded once and kept until a range needs another bundle.
#[derive(Debug)]
pub struct StoredFileReader {
    manifest: Manifest,
    /// Where each segment starts in the file.
    starts: Vec<u64>,
    /// The last bundle decoded: its id and bytes.
    bundle: Option<(ObjectId, Vec<u8>)>,
}

/// A `Write` that copies the bytes of `want` (positions in what is written) into `out`, from its
/// start, and drops the rest.
struct RangeSink<'a> {
    want: std::ops::Range<u64>,
    at: u64,
    out: &'a mut [u8],
    /// Bytes of `want` copied so far.
    kept: usize,
}

impl std::io::Write for RangeSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.at + buf.len() as u64;
        let from = self.want.start.max(self.at);
        let to = self.want.end.min(end);
        if from < to {
            let src = buf.get((from - self.at) as usize..(to - self.at) as usize).unwrap_or_default();
            let dst = (from - self.want.start) as usize;
            self.out
                .get_mut(dst..dst + src.len())
                .ok_or_else(|| std::io::Error::other("more bytes than the range asked for"))?
                .copy_from_slice(src);
            self.kept += src.len();
        }
        self.at = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl StoredFileReader {
    /// A reader of the file whose manifest is `manifest` in `repo`'s store.
    pub fn open(repo: &Repo, manifest: &ObjectId) -> Result<StoredFileReader> {
        let manifest = repo.manifest(manifest)?;
        let mut starts = Vec::with_capacity(manifest.segments.len());
        let mut at = 0u64;
        for s in &manifest.segments {
            starts.push(at);
            at = at.saturating_add(s.len);
        }
        Ok(StoredFileReader { manifest, starts, bundle: None })
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.manifest.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.manifest.len == 0
    }

    /// The tensor stored inside the file range `offset..offset + len` (a DCP item), as
    /// `(where its bytes start in the file, its dtype, its shape)`: the range's tensor segments,
    /// when there are any, lie back to back, share a dtype and are row ranges of one row-major
    /// tensor (one segment, or the cells of one chunk: `dcp::cell_rows`); their shapes' rows add
    /// up. `None` otherwise. A segment's shape is that of a tensor viewing its bytes whole and
    /// contiguously (`torch_zip::Storage::shape`), so the bytes are that tensor's elements in
    /// row-major order.
    pub fn tensor_in(&self, offset: u64, len: u64) -> Option<(u64, crate::Dtype, Vec<u64>)> {
        let end = offset.checked_add(len)?;
        let first = self.starts.partition_point(|&s| s < offset);
        let mut found: Option<(u64, crate::Dtype, Vec<u64>)> = None;
        let mut name = "";
        let mut at = 0u64;
        for (i, segment) in self.manifest.segments.iter().enumerate().skip(first) {
            let start = self.starts[i];
            if start >= end || start.checked_add(segment.len)? > end {
                break;
            }
            let Some(tensor) = &segment.tensor else { continue };
            let dtype = crate::Dtype::from_safetensors_name(&tensor.dtype)?;
            let (&rows, rest) = tensor.shape.split_first()?;
            // Cells are named `fqn[rows,...]`: one tensor's cells share the part before `[`.
            let fqn = tensor.name.rsplit_once('[').map_or(tensor.name.as_str(), |(f, _)| f);
            match &mut found {
                None => {
                    found = Some((start, dtype, tensor.shape.clone()));
                    name = fqn;
                }
                // One run of cells, back to back (framing between two tensors: not one tensor).
                Some((_, d, shape)) if start == at && *d == dtype && shape[1..] == *rest && fqn == name => {
                    shape[0] = shape[0].checked_add(rows)?;
                }
                Some(_) => return None,
            }
            at = start.checked_add(segment.len)?;
        }
        let (start, dtype, shape) = found?;
        let bytes = shape.iter().try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d))?;
        (start.checked_add(bytes) == Some(at)).then_some((start, dtype, shape))
    }

    /// The `len` bytes at `offset` (a range past the file's end is an error).
    pub fn read(&mut self, repo: &Repo, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.check_range(offset, len)?;
        let mut out = vec![0u8; len as usize];
        self.read_into(repo, offset, &mut out)?;
        Ok(out)
    }

    /// The `out.len()` bytes at `offset`, decoded straight into `out` (a range past the file's
    /// end is an error; on any error `out` holds garbage). A segment the range covers whole is
    /// decoded chunk by chunk in parallel into its place and then hashed; a segment covered in
    /// part is decoded window by window and only its covered bytes kept. Either way every blob
    /// touched is verified against its id before this returns.
    pub fn read_into(&mut self, repo: &Repo, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        let end = self.check_range(offset, len)?;
        let mut filled = 0usize;
        // The first segment ending after `offset`.
        let mut i = self.starts.partition_point(|&s| s <= offset).saturating_sub(1);
        while filled as u64 != len {
            let (Some(&start), Some(segment)) = (self.starts.get(i), self.manifest.segments.get(i)) else {
                break;
            };
            let seg_end = start.saturating_add(segment.len);
            if seg_end > offset && start < end {
                let (blob, range) = self.manifest.location(segment);
                let want = range.start + (offset.max(start) - start)..range.start + (end.min(seg_end) - start);
                let short = || RepoError::InvalidPath {
                    path: format!("bytes {offset}+{len}").into(),
                    reason: "a segment is longer than the file".into(),
                };
                let dst = out.get_mut(filled..filled + (want.end - want.start) as usize).ok_or_else(short)?;
                if segment.blob.is_none() {
                    // A bundled tensor: the bundle, decoded once for its members.
                    if self.bundle.as_ref().is_none_or(|(id, _)| *id != blob) {
                        self.bundle = None;
                        let mut bytes = Vec::new();
                        repo.store().open_blob(&blob)?.copy_to(&mut bytes)?;
                        self.bundle = Some((blob, bytes));
                    }
                    let bytes = self.bundle.as_ref().map(|(_, b)| b.as_slice()).unwrap_or_default();
                    let slice = bytes.get(want.start as usize..want.end as usize).ok_or_else(|| {
                        crate::store::Error::Corrupt { id: blob, reason: "shorter than its manifest says".into() }
                    })?;
                    dst.copy_from_slice(slice);
                } else {
                    let chain = repo.store().open_blob(&blob)?;
                    if want.start == 0 && want.end == chain.len() {
                        decode_whole(&chain, dst)?;
                    } else {
                        let wanted = dst.len();
                        let mut sink = RangeSink { want, at: 0, out: dst, kept: 0 };
                        chain.copy_to(&mut sink)?;
                        if sink.kept != wanted {
                            return Err(crate::store::Error::Corrupt {
                                id: blob,
                                reason: format!("{} bytes, shorter than its manifest says", chain.len()),
                            }
                            .into());
                        }
                    }
                }
                filled += dst.len();
            }
            i += 1;
        }
        if filled as u64 != len {
            return Err(RepoError::InvalidPath {
                path: format!("bytes {offset}+{len}").into(),
                reason: format!("its segments hold {filled} of them"),
            }
            .into());
        }
        Ok(())
    }

    /// The end of the range `offset`+`len`, if it lies in the file.
    fn check_range(&self, offset: u64, len: u64) -> Result<u64> {
        Ok(offset.checked_add(len).filter(|e| *e <= self.manifest.len).ok_or_else(|| RepoError::InvalidPath {
            path: format!("bytes {offset}+{len}").into(),
            reason: format!("past the end of a file of {} bytes", self.manifest.len),
        })?)
    }
}

/// Decodes the whole content of `chain` into `out` (exactly its length): its chunks in parallel,
/// each straight into its place, then the blake3 of `out` checked against the blob's id.
fn decode_whole(chain: &crate::store::BlobChain, out: &mut [u8]) -> Result<()> {
    let decoder = chain.decoder()?;
    decoder.decode_into_parallel(0..decoder.chunk_count(), out)?;
    let mut hasher = blake3::Hasher::new();
    crate::object_id::hash_update(&mut hasher, out);
    Ok(chain.check_hash(ObjectId(*hasher.finalize().as_bytes()))?)
}
