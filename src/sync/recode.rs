//! Recodes of a remote's objects between the two layouts a remote may have ([`Layout`],
//! docs/format.md "Remotes"): the recodes of a mirror push and their journal.
//!
//! - **mirror** (the default): the remote mirrors the local store. A push uploads the new
//!   version's objects as the local store holds them (the newest version whole), then replaces
//!   the blobs of the parent version that the new version changed by XOR deltas against the new
//!   blobs (a *recode*), so readers of the newest version download one checkpoint.
//! - **deltas**: new blobs go up as forward deltas against the parent's blobs (`wire_delta.rs`)
//!   and nothing on the remote is ever replaced: the least upload, for thin uplinks.
//!
//! A recode replaces an object that concurrent readers and pushers may be using, so it follows
//! the rules that keep the remote valid whatever else runs (the proof is in docs/format.md):
//! a pair (older blob Y, newer blob X) is planned only if the listing taken at the start of the
//! push had Y and lacked X (so Y appeared on the remote before X, forever: keys are never
//! deleted), is written down in a journal key `pending/<version>` before anything is uploaded,
//! and is carried out only once X is on the remote and standalone there. A push first finishes
//! the journals a killed push left, and deletes those abandoned: of a version no remote ref
//! reaches, written more than the grace period ago (`gc_grace_seconds`; a push rewrites its
//! journal before it moves its ref if its upload took half of that).
//!
//! [`Layout`]: super::Layout

use super::checked::Checked;
use super::freshness::fresh_on;
use super::remote_view::{read_ref, ref_key, remote_header, remote_refs};
use super::transfer::{parallel, with_retries};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::{Counterpart, RefKind, Repo, VersionId};
use crate::store::{ObjectHeader, ObjectKind, HEADER_LEN};
use std::collections::HashSet;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

/// One planned recode: the remote's `older` blob is to become an XOR delta against `newer`
/// (same tensor, a newer version on the same first-parent line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(super) struct Recode {
    /// The blob that is replaced (it was on the remote before the push listed it).
    pub older: ObjectId,
    /// Its reference (the push's listing did not have it).
    pub newer: ObjectId,
}

/// What a push records on the remote before it uploads anything: the recodes it will do once
/// its ref has moved, so that a rerun can finish them after a kill.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Journal {
    /// The branch pushed; `None` for the git filter's file transfers, which move no ckpt ref
    /// (git moves its own after the pre-push hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The version pushed there (file transfers: the id of the recodes' JSON, naming the key).
    pub version: VersionId,
    /// The recodes, each valid forever (see the module documentation).
    pub recodes: Vec<Recode>,
    /// When it was written (seconds since the Unix epoch, the writer's clock; set by
    /// [`write_journal`]): a journal of a version no remote ref reaches is abandoned once it
    /// is older than the grace period. Absent in journals of older ckpt versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written: Option<u64>,
}

/// Where journals live on the remote.
pub(super) const JOURNAL_PREFIX: &str = "pending/";

/// Largest journal a push reads (about 130 bytes a recode).
const MAX_JOURNAL_LEN: u64 = 64 << 20;

/// A recode must save at least this much (one file-system block, as local compaction).
const MIN_SAVING: u64 = 4096;

pub(super) fn journal_key(version: &VersionId) -> String {
    format!("{JOURNAL_PREFIX}{}", version.to_hex())
}

/// Plans the recodes of a mirror push of `tip`: the blobs of the newest version on `tip`'s
/// first-parent line that the remote holds (`present`, the push's listing) which the next
/// whole version above it changed, each paired with the same tensor's blob there (tensors
/// matched with [`Repo::counterparts`], as local compaction pairs them). The whole version
/// above is `tip`, or the pinned version closest above it if there is one (its blobs stay
/// whole). Kept only where the older blob is on the remote, the newer is not (so it is
/// uploaded by this push), the older version is not pinned, and the older blob is not held by
/// the tip or the whole version ([`allowed_recodes`]).
pub(super) fn plan_recodes(repo: &Repo, tip: &VersionId, present: &HashSet<ObjectId>) -> Result<Vec<Recode>> {
    let tip_version = repo.version(tip)?;
    let mut whole = tip_version.clone();
    let mut current = tip_version.clone();
    let older = loop {
        let Some(parent) = current.parents.first().copied() else { return Ok(Vec::new()) };
        // A version this store lacks (a partial clone's cut): nothing to plan.
        let Ok(parent_version) = repo.version(&parent) else { return Ok(Vec::new()) };
        if present.contains(&parent) {
            break parent_version;
        }
        if parent_version.is_pinned() {
            whole = parent_version.clone();
        }
        current = parent_version;
    };
    if older.is_pinned() {
        return Ok(Vec::new());
    }
    let mut keep: HashSet<ObjectId> = HashSet::new();
    for v in [&tip_version, &whole] {
        for f in &v.files {
            keep.extend(repo.manifest(&f.manifest)?.blobs());
        }
    }
    let mut changed = Vec::new();
    for f in whole.files.iter().filter(|f| older.file(&f.path).is_none_or(|p| p.manifest != f.manifest)) {
        changed.push((f.path.as_str(), repo.manifest(&f.manifest)?));
    }
    let pairs = repo.counterparts(changed.iter().map(|(path, m)| (*path, m)), &older);
    Ok(allowed_recodes(repo, &pairs, &|id| present.contains(id), &keep))
}

/// Of `pairs` (a blob of an older file and the same tensor's blob of a newer one), the
/// recodes the rules allow, each older blob once: the older is on the remote (`present`) and
/// the newer is not (so it goes up now), the older is not held whole by a file that stays
/// (`keep`), and this store holds both.
pub(super) fn allowed_recodes(
    repo: &Repo,
    pairs: &[Counterpart],
    present: &dyn Fn(&ObjectId) -> bool,
    keep: &HashSet<ObjectId>,
) -> Vec<Recode> {
    let mut seen = HashSet::new();
    let allowed = |p: &&Counterpart| {
        p.new != p.old
            && present(&p.old)
            && !present(&p.new)
            && !keep.contains(&p.old)
            && repo.store().contains(&p.old)
            && repo.store().contains(&p.new)
    };
    pairs.iter().filter(allowed).filter(|p| seen.insert(p.old)).map(|p| Recode { older: p.old, newer: p.new }).collect()
}

/// Plans the recodes of the git filter's file transfers in the mirror layout: for each file
/// `wanted` (manifest) whose path's previous content `previous` names and the remote holds
/// (`present`), each blob of that previous file paired with the same tensor's blob of the new
/// one ([`crate::repo::Manifest::same_tensor_blobs`]), kept if the older is on the remote and the
/// newer is not (as for a push), neither is held whole by a `wanted` file, and this store holds
/// the older as exactly that delta already: local compaction made it, under the local chain
/// bound (the filter's store pins versions as any store does), which the remote so keeps.
pub(super) fn plan_file_recodes(
    repo: &Repo,
    wanted: &[ObjectId],
    previous: &std::collections::HashMap<ObjectId, ObjectId>,
    present: &HashSet<ObjectId>,
) -> Result<Vec<Recode>> {
    let mut keep = HashSet::new();
    for m in wanted {
        keep.extend(repo.manifest(m)?.blobs());
    }
    let mut pairs = Vec::new();
    for m in wanted {
        let Some(old) = previous.get(m).filter(|o| *o != m && present.contains(o)) else { continue };
        if repo.store().contains(old) {
            pairs.extend(repo.manifest(m)?.same_tensor_blobs(&repo.manifest(old)?));
        }
    }
    let mut recodes = allowed_recodes(repo, &pairs, &|id| present.contains(id), &keep);
    // Only where local compaction made exactly that delta.
    recodes.retain(|r| repo.store().header(&r.older).is_ok_and(|h| h.reference == Some(r.newer)));
    Ok(recodes)
}

/// The journal of a file transfer's `recodes`, named by their own id.
pub(super) fn file_journal(recodes: Vec<Recode>) -> Journal {
    let version = ObjectId::hash(&serde_json::to_vec(&recodes).expect("recodes serialize"));
    Journal { branch: None, version, recodes, written: None }
}

/// Lists and finishes the journals on the remote (a push in the mirror layout does this
/// first); journals of versions in `own` are returned instead, to be merged into the caller's.
/// A journal that cannot be finished (its branch does not hold its version) is deleted if it
/// is abandoned ([`abandoned`]). Returns the recodes done and their bytes, and the journals
/// left to the caller.
pub(super) fn finish_journals(
    repo: &Repo,
    remote: &dyn Remote,
    own: &dyn Fn(&Journal) -> bool,
    transfers: usize,
    checked: &Checked,
) -> Result<((u64, u64), Vec<Journal>)> {
    let keys = remote.list(JOURNAL_PREFIX)?;
    let mut done = (0, 0);
    let mut mine = Vec::new();
    if keys.is_empty() {
        return Ok((done, mine));
    }
    let mut waiting = Vec::new();
    for journal in read_journals(remote, &keys)? {
        if own(&journal) {
            mine.push(journal);
        } else if let Some((objects, bytes)) = finish_journal(repo, remote, &journal, transfers, checked)? {
            done.0 += objects;
            done.1 += bytes;
        } else {
            waiting.push(journal);
        }
    }
    if !waiting.is_empty() {
        let grace = std::time::Duration::from_secs(repo.config().gc_grace_seconds);
        let now = unix_now();
        for journal in abandoned(repo, remote, waiting, now, grace)? {
            match journal.written {
                // Past the grace period: its push is dead, or its ref can no longer move
                // there (the journal is refreshed before a ref moves, see `push.rs`).
                Some(_) => remote.delete(&journal_key(&journal.version))?,
                // Of an older ckpt, which wrote no time: stamped now, so that a later push
                // can tell its age. Its pusher, if alive, finds and deletes it as before.
                None => write_journal(repo, remote, &journal)?,
            }
        }
    }
    Ok((done, mine))
}

/// The current time in seconds since the Unix epoch (0 for a clock before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Of the branch `journals` a push could not finish (their branch does not hold their
/// version), those that are abandoned: no ref on the remote (branch or tag) reaches their
/// version, and they were written more than `grace` before `now` (or carry no time at all).
/// Reachability is decided only where this store knows the whole history of every remote ref:
/// if any ref's version, or any ancestor of one, is not here (another pusher's version, a
/// partial clone's cut), nothing is abandoned; a remote ref that cannot be read is an error.
/// A journal of no branch (a file transfer's) is never waiting, so never abandoned.
pub(super) fn abandoned(
    repo: &Repo,
    remote: &dyn Remote,
    journals: Vec<Journal>,
    now: u64,
    grace: std::time::Duration,
) -> Result<Vec<Journal>> {
    let old = |j: &Journal| j.written.is_none_or(|t| now.saturating_sub(t) > grace.as_secs());
    let journals: Vec<Journal> = journals.into_iter().filter(|j| j.branch.is_some() && old(j)).collect();
    if journals.is_empty() {
        return Ok(journals);
    }
    let mut reached: HashSet<VersionId> = HashSet::new();
    let mut stack: Vec<VersionId> = remote_refs(remote, None)?.into_iter().map(|r| r.id).collect();
    while let Some(v) = stack.pop() {
        if !reached.insert(v) {
            continue;
        }
        let Ok(version) = repo.version(&v) else { return Ok(Vec::new()) };
        stack.extend(version.parents);
    }
    Ok(journals.into_iter().filter(|j| !reached.contains(&j.version)).collect())
}

/// Writes `journal` under its key, stamped with the current time (replacing a journal of the
/// same version, whose recodes the caller merged into this one).
pub(super) fn write_journal(repo: &Repo, remote: &dyn Remote, journal: &Journal) -> Result<()> {
    let stamped = Journal { written: Some(unix_now()), ..journal.clone() };
    let bytes = serde_json::to_vec(&stamped).expect("a journal serializes");
    let mut tmp = repo.store().receive_file()?;
    std::io::Write::write_all(tmp.as_file_mut(), &bytes).map_err(|e| Error::Io {
        action: "writing",
        path: tmp.path().to_path_buf(),
        source: e,
    })?;
    let key = journal_key(&journal.version);
    with_retries(|| Ok(remote.replace(&key, tmp.as_file(), tmp.path(), bytes.len() as u64)?))
}

/// The journals on the remote (`keys`, from a listing of [`JOURNAL_PREFIX`]); one that vanished
/// meanwhile (finished by another push) or does not parse (not ckpt's) is left out.
pub(super) fn read_journals(remote: &dyn Remote, keys: &[String]) -> Result<Vec<Journal>> {
    let mut out = Vec::new();
    for key in keys {
        let mut bytes = Vec::new();
        match remote.download(key, &mut bytes, MAX_JOURNAL_LEN) {
            Ok(_) => {}
            Err(remote::Error::NotFound { .. } | remote::Error::TooLarge { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
        if let Ok(journal) = serde_json::from_slice::<Journal>(&bytes) {
            if journal_key(&journal.version) == *key {
                out.push(journal);
            }
        }
    }
    Ok(out)
}

/// Finishes `journal` if its branch on the remote holds its version, or a version this store
/// knows to descend from it (a file transfer's journal: always): does its recodes, then deletes
/// it. A journal whose push never moved its ref (killed before, or rejected) waits for that
/// push's rerun, or until it is abandoned ([`abandoned`]). Returns the recodes done and their
/// bytes.
pub(super) fn finish_journal(
    repo: &Repo,
    remote: &dyn Remote,
    journal: &Journal,
    transfers: usize,
    checked: &Checked,
) -> Result<Option<(u64, u64)>> {
    if let Some(branch) = &journal.branch {
        let Some((tip, _)) = read_ref(remote, &ref_key(RefKind::Branch, branch))? else { return Ok(None) };
        let holds = tip == journal.version
            || (repo.store().contains(&tip)
                && repo.store().contains(&journal.version)
                && repo.is_ancestor(&journal.version, &tip).unwrap_or(false));
        if !holds {
            return Ok(None);
        }
    }
    // A journal with no branch is a distributed save's, whose version may never exist: its
    // newer blobs may be garbage, so only those still fresh are recoded against (gc keeps a
    // fresh blob, and one a kept blob is a delta against: docs/format.md, "Garbage on a
    // remote"); the others stay whole.
    let mut recodes = journal.recodes.clone();
    if journal.branch.is_none() {
        let mut fresh = Vec::new();
        for r in recodes {
            if fresh_on(remote, &r.newer)? {
                fresh.push(r);
            }
        }
        recodes = fresh;
    }
    let done = recode(repo, remote, &recodes, transfers, checked)?;
    remote.delete(&journal_key(&journal.version))?;
    Ok(Some(done))
}

/// Carries out `recodes` (in parallel): each older blob whose newer blob is on the remote and
/// standalone there, and which is itself still standalone there, is replaced by an XOR delta
/// against the newer one, if that saves at least [`MIN_SAVING`] bytes. Both blobs are verified
/// here first (`checked`: a damaged one refuses them all), and the remote's newer blob must be
/// known good ([`Checked::reference_there`]: uploaded by this process after it verified it, or
/// downloaded and checked now): a recode against a damaged copy would make the older version
/// unreadable on the remote. Returns the objects replaced and the bytes uploaded (replacements
/// of damaged newer blobs included).
pub(super) fn recode(
    repo: &Repo,
    remote: &dyn Remote,
    recodes: &[Recode],
    transfers: usize,
    checked: &Checked,
) -> Result<(u64, u64)> {
    let here = recodes.iter().flat_map(|r| [r.older, r.newer]).filter(|id| repo.store().contains(id));
    checked.verify_here(repo, remote, here.collect::<Vec<_>>())?;
    let objects = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    parallel(recodes, transfers, |r| {
        if let Some(len) = recode_one(repo, remote, r, checked)? {
            objects.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(len, Ordering::Relaxed);
        }
        Ok(())
    })?;
    Ok((objects.into_inner(), bytes.into_inner()))
}

/// The header of object `id` on the remote and its size there; `None` if it is absent or its
/// header does not decode (then nothing is coded against it or replaces it).
fn header_there(remote: &dyn Remote, id: &ObjectId) -> Result<Option<(ObjectHeader, u64)>> {
    match remote_header(remote, id) {
        Err(Error::Store(_)) => Ok(None),
        found => found,
    }
}

fn recode_one(repo: &Repo, remote: &dyn Remote, r: &Recode, checked: &Checked) -> Result<Option<u64>> {
    // The newer blob must be standalone at this moment: from then on it can only become a
    // recode against a blob newer still, so no chain from it leads back to the older one.
    let Some((newer, _)) = header_there(remote, &r.newer)? else { return Ok(None) };
    if newer.kind != ObjectKind::Blob || newer.reference.is_some() {
        return Ok(None);
    }
    // Already a delta (this recode done by an earlier run, or another encoding): left alone.
    let Some((older, remote_len)) = header_there(remote, &r.older)? else { return Ok(None) };
    if older.kind != ObjectKind::Blob || older.reference.is_some() {
        return Ok(None);
    }
    if !repo.store().contains(&r.older) || !repo.store().contains(&r.newer) {
        return Ok(None);
    }
    if !checked.reference_there(repo, remote, &r.newer)? {
        return Ok(None);
    }
    let limit = remote_len.saturating_sub(MIN_SAVING);
    let key = remote::object_key(&r.older);
    // The delta local compaction made, if it is exactly this one: sent as it is (the open
    // file, whose header was read: a compaction cannot change it under the upload).
    let path = repo.store().object_path(&r.older);
    if let Ok(mut file) = std::fs::File::open(&path) {
        let mut head = Vec::with_capacity(HEADER_LEN);
        let read = (&mut file).take(HEADER_LEN as u64).read_to_end(&mut head);
        let len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        if read.is_ok()
            && ObjectHeader::decode(r.older, &head).is_ok_and(|h| h.reference == Some(r.newer) && h.depth == 1)
            && len < limit
        {
            with_retries(|| Ok(remote.replace(&key, &file, &path, len)?))?;
            return Ok(Some(len));
        }
    }
    let target = repo.store().open_blob(&r.older)?;
    let reference = repo.store().open_blob(&r.newer)?;
    let coded =
        match repo.store().encode_delta_for_transfer(&target, &reference, 1, limit, &repo.config().codec_options()) {
            Ok(coded) => coded,
            // A pair the coder refuses (another chunk size since a config change): left whole.
            Err(crate::store::Error::Encode { source: crate::codec::Error::InvalidInput(reason), .. })
                if !reason.starts_with("writing") =>
            {
                None
            }
            Err(e) => return Err(e.into()),
        };
    let Some((tmp, len)) = coded else { return Ok(None) };
    with_retries(|| Ok(remote.replace(&key, tmp.as_file(), tmp.path(), len)?))?;
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_round_trips_and_a_file_journal_is_named_by_its_recodes() {
        let r = Recode { older: ObjectId::hash(b"y"), newer: ObjectId::hash(b"x") };
        let j = Journal { branch: Some("main".into()), version: ObjectId::hash(b"v"), recodes: vec![r], written: None };
        let text = serde_json::to_vec(&j).unwrap();
        assert_eq!(serde_json::from_slice::<Journal>(&text).unwrap(), j);
        let f = file_journal(vec![r]);
        assert_eq!(f.branch, None);
        assert_eq!(f.version, file_journal(vec![r]).version);
        assert_ne!(f.version, file_journal(vec![Recode { older: r.newer, newer: r.older }]).version);
        assert!(!String::from_utf8(serde_json::to_vec(&f).unwrap()).unwrap().contains("branch"));
    }
}
