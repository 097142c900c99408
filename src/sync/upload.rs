//! Uploads of what a write to a remote needs, each object as this store holds it or a blob
//! as a wire delta (`wire_delta.rs`), in an order that keeps the remote valid at every moment:
//! a delta's reference before the delta, every blob before any manifest, every manifest before
//! any version (a writer that finds a manifest takes its file as there). An object an upload
//! finds there already is counted on only if fresh, else written again (`freshness.rs`).

use super::checked::Checked;
use super::freshness::{fresh_on, keep_found};
use super::transfer::{parallel, with_retries};
use super::wire_delta::WireDelta;
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote, UploadMode, Uploaded};
use crate::repo::{Needed, Repo};
use crate::store::{ObjectHeader, ObjectKind, HEADER_LEN, MAX_CHAIN_DEPTH};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

/// What [`upload_needed`] sent.
#[derive(Debug, Default)]
pub(super) struct Sent {
    /// Objects created or replaced on the remote.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Of `objects`, blobs sent as wire deltas.
    pub as_deltas: u64,
    /// Objects found there already (and fresh).
    pub existed: u64,
}

/// Uploads `need` (verified already: `checked.rs`) by levels, each level `transfers` at a time:
/// objects with no reference to upload first, then the deltas on them, ..., then the
/// manifests, then the versions. A blob `wire` plans goes up as that delta where it pays. An
/// object `skip` says is there already (a large one a retried save left) is not sent. Each
/// object uploaded as stored here is noted good there in `checked`: a recode may code against
/// it.
pub(super) fn upload_needed(
    repo: &Repo,
    remote: &dyn Remote,
    need: &[Needed],
    wire: &HashMap<ObjectId, WireDelta>,
    skip: &(dyn Fn(&ObjectId) -> Result<bool> + Sync),
    transfers: usize,
    checked: &Checked,
) -> Result<Sent> {
    let total: u64 = need.iter().map(|n| repo.store().stored_len(&n.id).unwrap_or(0)).sum();
    repo.progress().start("push", total);
    let done = AtomicU64::new(0);
    let progress = |len: u64| repo.progress().set(done.fetch_add(len, Ordering::Relaxed) + len);
    let counts: [AtomicU64; 4] = Default::default();
    for ids in levels(need).values() {
        parallel(ids, transfers, |id| {
            if skip(id)? {
                progress(repo.store().stored_len(id).unwrap_or(0));
                return Ok(());
            }
            let delta = match wire.get(id) {
                Some(plan) => upload_wire_delta(repo, remote, id, plan)?,
                None => None,
            };
            let (len, uploaded) = match delta {
                Some(sent) => sent,
                None => upload_object(repo, remote, id)?,
            };
            if uploaded == Uploaded::Existed {
                counts[3].fetch_add(1, Ordering::Relaxed);
            } else {
                if delta.is_none() {
                    checked.good_there(*id);
                }
                counts[0].fetch_add(1, Ordering::Relaxed);
                counts[1].fetch_add(len, Ordering::Relaxed);
                counts[2].fetch_add(u64::from(delta.is_some()), Ordering::Relaxed);
            }
            progress(if delta.is_some() { repo.store().stored_len(id).unwrap_or(len) } else { len });
            Ok(())
        })?;
    }
    repo.progress().finish();
    let [objects, bytes, as_deltas, existed] = counts.map(AtomicU64::into_inner);
    Ok(Sent { objects, bytes, as_deltas, existed })
}

/// The objects of `need` by the level they go up at: a delta one above its reference (when
/// that is uploaded too), manifests above every blob and versions above every manifest, so
/// that a write killed part way never leaves a manifest whose blobs are not all there, nor a
/// version whose manifests are not.
fn levels(need: &[Needed]) -> BTreeMap<usize, Vec<ObjectId>> {
    let index: HashMap<ObjectId, &Needed> = need.iter().map(|n| (n.id, n)).collect();
    let mut level: HashMap<ObjectId, usize> = HashMap::new();
    for n in need {
        // Follow the chain down to the first reference not being uploaded.
        let mut chain = vec![n.id];
        let mut base_level = 0;
        while let Some(r) = index.get(chain.last().expect("non-empty")).and_then(|m| m.reference) {
            if let Some(l) = level.get(&r) {
                base_level = l + 1;
                break;
            }
            if !index.contains_key(&r) || chain.len() > MAX_CHAIN_DEPTH as usize + 1 {
                break;
            }
            chain.push(r);
        }
        let deepest = chain.len() - 1;
        for (i, id) in chain.iter().enumerate() {
            level.entry(*id).or_insert(base_level + deepest - i);
        }
    }
    let top_blob = need.iter().filter(|n| n.kind == ObjectKind::Blob).map(|n| level[&n.id]).max().unwrap_or(0);
    let mut levels: BTreeMap<usize, Vec<ObjectId>> = BTreeMap::new();
    for n in need {
        let at = match n.kind {
            ObjectKind::Manifest => top_blob + 1,
            ObjectKind::Version => top_blob + 2,
            _ => level[&n.id],
        };
        levels.entry(at).or_default().push(n.id);
    }
    levels
}

/// Objects at least this large are looked for on the remote before an upload that does not
/// list it ([`found_on`]): one request against a megabyte or more, smaller ones go up
/// create-if-absent directly.
pub(super) const LOOK_FIRST: u64 = 1 << 20;

/// Whether object `id`, at least [`LOOK_FIRST`] bytes here, is on `remote` already and fresh
/// (one request); smaller objects are not looked for (false), their upload is
/// create-if-absent.
pub(super) fn found_on(repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<bool> {
    if repo.store().stored_len(id).unwrap_or(0) < LOOK_FIRST {
        return Ok(false);
    }
    fresh_on(remote, id)
}

/// Uploads one object file as it is now; returns its length and whether it was created. Found
/// there already, it is counted on only if fresh, else written again ([`keep_found`]). Callers
/// verify it first (`checked.rs`: many at once costs less than one by one, a delta chain being
/// decoded once).
pub(super) fn upload_object(repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<(u64, Uploaded)> {
    let path = repo.store().object_path(id);
    let io = |action| {
        let path = path.clone();
        move |source| Error::Io { action, path, source }
    };
    let mut file = std::fs::File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Store(crate::store::Error::Missing { id: *id }),
        _ => Error::Io { action: "opening", path: path.clone(), source: e },
    })?;
    let len = file.metadata().map_err(io("reading"))?.len();
    // The header of the very file that goes up decides whether it may replace (a compaction
    // may rename a delta over the path meanwhile; the open file stays as read).
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut file).take(HEADER_LEN as u64).read_to_end(&mut head).map_err(io("reading"))?;
    let header = ObjectHeader::decode(*id, &head)?;
    let mode = if header.reference.is_none() { UploadMode::MayReplace } else { UploadMode::CreateOnly };
    let uploaded = with_retries(|| Ok(remote.upload(&remote::object_key(id), &file, &path, len, mode)?))?;
    if uploaded == Uploaded::Existed {
        let sent = keep_found(repo, remote, id)?;
        if sent > 0 {
            return Ok((sent, Uploaded::Replaced));
        }
    }
    Ok((len, uploaded))
}

/// Codes blob `id` as planned and uploads it (create-only, with retries): its length on the
/// wire and whether it was created; `None` when the delta would not be smaller (the caller
/// then uploads the object as it is).
pub(super) fn upload_wire_delta(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    plan: &WireDelta,
) -> Result<Option<(u64, Uploaded)>> {
    let Some((tmp, len)) = encode_wire_delta(repo, id, plan)? else { return Ok(None) };
    let uploaded = with_retries(|| {
        Ok(remote.upload(&remote::object_key(id), tmp.as_file(), tmp.path(), len, UploadMode::CreateOnly)?)
    })?;
    if uploaded == Uploaded::Existed {
        // Found there: counted on only if fresh, else written again (standalone).
        let sent = keep_found(repo, remote, id)?;
        if sent > 0 {
            return Ok(Some((sent, Uploaded::Replaced)));
        }
    }
    Ok(Some((len, uploaded)))
}

/// Codes blob `id` as planned (a delta against a blob the remote holds) into a temp file;
/// `None` when that would not be smaller than its object here (it then goes up as it is).
fn encode_wire_delta(repo: &Repo, id: &ObjectId, plan: &WireDelta) -> Result<Option<(tempfile::NamedTempFile, u64)>> {
    let target = repo.store().open_blob(id)?;
    let reference = repo.store().open_blob(&plan.reference)?;
    let limit = target.stored_len();
    match repo.store().encode_delta_for_transfer(&target, &reference, plan.depth, limit, &repo.config().codec_options())
    {
        Ok(done) => Ok(done),
        // A pair the coder refuses (another chunk size since a config change): sent whole.
        Err(crate::store::Error::Encode { source: crate::codec::Error::InvalidInput(reason), .. })
            if !reason.starts_with("writing") =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
