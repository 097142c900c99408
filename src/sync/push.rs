//! `push`: the objects the pushed versions need that the remote lacks, a delta's reference
//! before the delta and every object before any ref; then each ref by compare-and-swap, only
//! forward.

use super::checked::{find_damaged_there, replace_there, Checked};
use super::freshness::{check_deadline, is_fresh, upload_object, GcWatch, Moment};
use super::partial::check_pushable;
use super::recode::{finish_journals, journal_key, plan_recodes, recode, write_journal, Journal, Recode};
use super::remote_view::{put_ref, read_ref, ref_key, remote_refs, tip_blobs, RemoteObjects, RemoteRef};
use super::remotes::{open_remote, remote_layout, Layout, RefUpdate};
use super::transfer::parallel;
use super::wire_delta::{plan_wire_deltas, upload_wire_delta, WireDelta};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote, Uploaded};
use crate::repo::graph::{self, Node};
use crate::repo::Error as RepoError;
use crate::repo::{Head, Needed, RefKind, Repo, VersionId};
use crate::store::ObjectKind;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// What `push` should send.
#[derive(Clone, Debug, Default)]
pub struct PushOptions {
    /// Branches and tags to push by name (a name is looked up as a branch, then a tag). Empty:
    /// the current branch.
    pub refs: Vec<String>,
    /// Every branch and tag.
    pub all: bool,
    /// Transfers in flight at once (at least 1).
    pub transfers: usize,
    /// The remote's layout. `None`: the remote's setting in `.ckpt/remotes` for [`push`],
    /// [`Layout::Mirror`] for [`push_to`].
    pub layout: Option<Layout>,
    /// The remote's name here, whose remote-tracking refs (`refs/remotes/NAME/*`) name
    /// versions the remote has ([`push`] sets it): their objects are counted on whatever their
    /// age (docs/format.md, "Garbage on a remote").
    pub remote_name: Option<String>,
    /// Also download and check the remote's copy of every object the pushed refs need (their
    /// whole history, the remote's refs' versions included), and replace each damaged one by
    /// an intact copy from this store: repairs a remote from a healthy clone (docs/format.md,
    /// "Bit rot and repairs"). Costs a download of all of it.
    pub repair: bool,
}

/// What a push did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PushReport {
    /// The remote's URL.
    pub remote: String,
    /// Refs moved or created.
    pub updated: Vec<RefUpdate>,
    /// Refs already where they should be.
    pub up_to_date: Vec<String>,
    /// Objects uploaded.
    pub objects_sent: u64,
    /// Bytes uploaded.
    pub bytes_sent: u64,
    /// Objects the pushed versions need that the remote already had (found by listing, or
    /// found present on upload).
    pub objects_present: u64,
    /// Of `objects_sent`, blobs sent as XOR deltas against a blob the remote already had
    /// (docs/format.md, "Remotes": deltas on the wire).
    pub objects_sent_as_deltas: u64,
    /// Of `objects_sent`, blobs of older versions replaced on the remote by XOR deltas against
    /// the newer blobs this push uploaded (the mirror layout's recodes, including those of
    /// journals a killed push left); their bytes are in `bytes_sent`.
    pub objects_recoded: u64,
    /// Requests sent to the remote.
    pub requests: u64,
    /// Versions a remote ref named whose version object or manifests the remote lacked: their
    /// missing objects were uploaded again (hex ids).
    pub repaired: Vec<String>,
    /// With [`PushOptions::repair`]: objects the remote holds that were downloaded and checked,
    /// and their bytes.
    pub remote_checked: u64,
    /// See `remote_checked`.
    pub remote_bytes_checked: u64,
    /// With [`PushOptions::repair`]: objects whose remote copy did not decode to their id,
    /// replaced there by an intact copy from this store (hex ids; their bytes are in
    /// `bytes_sent`).
    pub replaced_damaged: Vec<String>,
    /// With [`PushOptions::repair`]: remote objects that could not be checked here (deltas
    /// against objects this store lacks), left as they are.
    pub remote_unchecked: u64,
}

/// Pushes refs to the remote `name` (see [`push_to`]) and records where its branches
/// now are (`refs/remotes/NAME/BRANCH`).
pub fn push(repo: &Repo, name: &str, options: &PushOptions) -> Result<PushReport> {
    let remote = open_remote(repo, name)?;
    let mut options = options.clone();
    if options.layout.is_none() {
        options.layout = Some(remote_layout(repo, name)?);
    }
    options.remote_name = Some(name.to_string());
    let report = push_to(repo, remote.as_ref(), &options)?;
    for update in report.updated.iter().filter(|u| u.kind == "branch") {
        repo.refs().set_remote(name, &update.name, &update.new)?;
    }
    // Also where the remote already had the branch: an earlier push may have moved it
    // without learning so (its answer lost), leaving the remote-tracking ref behind.
    for branch in report.up_to_date.iter().filter_map(|what| what.strip_prefix("branch ")) {
        if let Some(id) = repo.refs().get(RefKind::Branch, branch)? {
            repo.refs().set_remote(name, branch, &id)?;
        }
    }
    Ok(report)
}

/// Pushes refs to `remote`: the objects their versions need that the remote lacks, then
/// each ref by compare-and-swap. A branch moves only forward from where the remote has it,
/// a tag is never moved; otherwise, or if the ref changed on the remote during the push,
/// the push is rejected ("fetch first") and the remote ref left as it was.
///
/// In the mirror layout (docs/format.md, "Remotes") the new versions' objects go up as this
/// store holds them, and once a branch has moved, the blobs of the version it was at that the
/// new version changed are replaced on the remote by deltas against the new blobs, as a
/// journal written first records; journals a killed push left are finished first. In the
/// deltas layout new blobs go up as forward deltas and nothing is replaced.
///
/// Everything the push reads here to send is verified before anything goes up
/// ([`Error::DamagedHere`] otherwise, with nothing of it uploaded), and a recode codes only
/// against a remote blob known good (docs/format.md, "Bit rot and repairs"). With
/// [`PushOptions::repair`], the remote's copies of everything the refs need are also checked,
/// and damaged ones replaced.
pub fn push_to(repo: &Repo, remote: &dyn Remote, options: &PushOptions) -> Result<PushReport> {
    let url = remote.url().to_string();
    // Pending compactions first, as `gc` runs them: the blobs a distributed save stored
    // uncoded (`Repo::store_piece`) then go up coded, and the parent's as the deltas the mirror
    // layout sends as they are. Best effort: a compaction that fails is recorded in
    // `.ckpt/compact.log` and stays pending, and the push sends the objects as they are stored.
    if repo.has_pending_deltas() {
        let _ = repo.compact(&crate::repo::CompactOptions::default());
    }
    let layout = options.layout.unwrap_or_default();
    // The first look at the remote: the refs move within `WRITE_DEADLINE` of it or not at all.
    let started = Moment::now();
    let mut wanted: Vec<(RefKind, String, VersionId)> = Vec::new();
    if options.all {
        for (name, id) in repo.refs().list(RefKind::Branch)? {
            wanted.push((RefKind::Branch, name, id));
        }
        for (name, id) in repo.refs().list(RefKind::Tag)? {
            wanted.push((RefKind::Tag, name, id));
        }
    } else if options.refs.is_empty() {
        let Head::Branch(branch) = repo.refs().head()? else {
            return Err(Error::from(RepoError::UnknownRevision {
                rev: "HEAD".into(),
                reason: "detached: name the branch or tag to push".into(),
            }));
        };
        let id = repo.refs().get(RefKind::Branch, &branch)?.ok_or_else(|| {
            Error::from(RepoError::UnknownRevision {
                rev: branch.clone(),
                reason: "the branch has no version yet".into(),
            })
        })?;
        wanted.push((RefKind::Branch, branch, id));
    } else {
        for name in &options.refs {
            if let Some(id) = repo.refs().get(RefKind::Branch, name)? {
                wanted.push((RefKind::Branch, name.clone(), id));
            } else if let Some(id) = repo.refs().get(RefKind::Tag, name)? {
                wanted.push((RefKind::Tag, name.clone(), id));
            } else {
                return Err(Error::from(RepoError::UnknownRevision {
                    rev: name.clone(),
                    reason: "not a branch or tag".into(),
                }));
            }
        }
    }

    // Where each ref is on the remote, and the tag to compare-and-swap against.
    let mut report = PushReport { remote: url.clone(), ..PushReport::default() };
    let mut moves = Vec::new();
    let mut remote_known: Vec<VersionId> = Vec::new();
    for (kind, name, id) in wanted {
        let key = ref_key(kind, &name);
        let (old, tag) = read_ref(remote, &key)?.unzip();
        let what = format!("{} {name}", kind.name());
        match old {
            Some(old) if old == id => {
                report.up_to_date.push(what);
                remote_known.push(old);
                continue;
            }
            Some(_) if kind == RefKind::Tag => {
                return Err(Error::Rejected {
                    remote: url,
                    what,
                    reason: "the remote has this tag at another version (tags do not move)".into(),
                });
            }
            Some(old) => {
                let known = repo.store().contains(&old);
                if !known || !repo.is_ancestor(&old, &id)? {
                    return Err(Error::Rejected {
                        remote: url,
                        what,
                        reason: format!(
                            "fetch first: the remote has version {} there, which {}",
                            old.short(12),
                            if known { "is not an ancestor of yours" } else { "you do not have" }
                        ),
                    });
                }
                remote_known.push(old);
            }
            None => {}
        }
        let expect = tag.map_or(Expect::Absent, Expect::Tag);
        moves.push((kind, name, key, old, id, expect));
    }
    // A remote ref's version is taken as complete only if the remote still has its version
    // object and manifests (a HEAD each): a remote that lost one (a failed copy, a
    // lifecycle rule, a hand-made ref) would otherwise stay unreadable while every push
    // says "up to date". An incomplete one is pushed again like a new version: its
    // objects the remote lacks (found by listing) go up.
    remote_known.sort();
    remote_known.dedup();
    let mut incomplete = Vec::new();
    for id in &remote_known {
        if !remote_has_version(repo, remote, id)? {
            incomplete.push(*id);
        }
    }
    remote_known.retain(|id| !incomplete.contains(id));
    report.repaired = incomplete.iter().map(|id| id.to_hex()).collect();

    // Journals of mirror pushes that were killed or are still running (one listing): those
    // whose version this push moves a branch to are merged into its own; the others are
    // finished if their branch holds their version.
    let checked = Checked::default();
    let mut own_journals: HashMap<VersionId, Vec<Recode>> = HashMap::new();
    if layout == Layout::Mirror {
        let own = |j: &Journal| j.branch.is_some() && moves.iter().any(|m| m.0 == RefKind::Branch && m.4 == j.version);
        let ((objects, bytes), mine) = finish_journals(repo, remote, &own, options.transfers, &checked)?;
        report.objects_sent += objects;
        report.objects_recoded += objects;
        report.bytes_sent += bytes;
        for journal in mine {
            own_journals.entry(journal.version).or_default().extend(journal.recodes);
        }
    }
    if moves.is_empty() && incomplete.is_empty() && !options.repair {
        report.requests = remote.requests();
        return Ok(report);
    }

    // What the pushed versions need, less what the remote's refs already name (the remote
    // holds all of that, each with its chain: refs move only after their objects). Not
    // less the local chains of those blobs: after a compaction here, an old blob is a delta
    // against a new one, which the remote does not have. A repair takes nothing for granted:
    // everything the remote's refs need too, each object looked for in the listing.
    let have: HashSet<ObjectId> =
        if options.repair { HashSet::new() } else { repo.named(&remote_known)?.into_iter().map(|n| n.id).collect() };
    let mut roots: Vec<VersionId> = moves.iter().map(|m| m.4).chain(incomplete.iter().copied()).collect();
    if options.repair {
        roots.extend(remote_known.iter().copied());
    }
    let mut need = repo.reachable(&roots, &|id| have.contains(id))?;
    // What the remote lists (for the recodes' plan), and of it what this push counts on being
    // there: fresh objects, or objects a remote ref reaches (docs/format.md, "Garbage on a
    // remote"). The others the push needs go up again.
    let mut present: HashSet<ObjectId> = HashSet::new();
    let mut trusted: HashSet<ObjectId> = HashSet::new();
    let mut reached: HashSet<ObjectId> = HashSet::new();
    // What the push's versions will name that no remote ref reaches: checked before the refs
    // move if a gc ran meanwhile (`GcWatch::settle`).
    let mut watch = None;
    let mut relied: Vec<ObjectId> = Vec::new();
    // Remote copies found damaged (`--repair`), replaced before anything else goes up.
    let mut damaged: Vec<ObjectId> = Vec::new();
    if !need.is_empty() {
        watch = Some(GcWatch::begin(remote)?);
        // Objects a previous, interrupted push left there (one listing, not a request per
        // object).
        let now = SystemTime::now();
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for listed in remote.list_modified("objects/")? {
            let Some(id) = remote::object_of_key(&listed.key) else { continue };
            present.insert(id);
            sizes.insert(id, listed.size);
            if is_fresh(listed.modified, now) {
                trusted.insert(id);
            }
        }
        if need.iter().any(|n| present.contains(&n.id) && !trusted.contains(&n.id)) {
            // Only what the listing shows: a reached object the remote lost goes up again.
            reached = remote_refs_reach(repo, remote, options.remote_name.as_deref())?;
            reached.retain(|id| present.contains(id));
            trusted.extend(reached.iter().copied());
        }
        if options.repair {
            let there: Vec<(ObjectId, ObjectKind, u64)> =
                need.iter().filter_map(|n| sizes.get(&n.id).map(|size| (n.id, n.kind, *size))).collect();
            let survey = find_damaged_there(repo, remote, &there, &checked, options.transfers)?;
            report.remote_checked = survey.checked;
            report.remote_bytes_checked = survey.bytes;
            report.remote_unchecked = survey.unchecked.len() as u64;
            damaged = survey.damaged;
        }
        relied = need.iter().map(|n| n.id).filter(|id| !reached.contains(id)).collect();
        let before = need.len();
        need.retain(|n| !trusted.contains(&n.id));
        report.objects_present += (before - need.len()) as u64;
    }
    check_pushable(repo, &need, &|id| have.contains(id) || trusted.contains(id), &url)?;
    // New blobs go up as deltas against the parent version's blobs where the remote has
    // them (wire_delta.rs).
    let versions: Vec<VersionId> = need.iter().filter(|n| n.kind == ObjectKind::Version).map(|n| n.id).collect();
    let need_blobs: HashSet<ObjectId> = need.iter().filter(|n| n.kind == ObjectKind::Blob).map(|n| n.id).collect();
    let wire = match layout {
        Layout::Deltas => {
            plan_wire_deltas(repo, &versions, &need_blobs, &|id| have.contains(id) || trusted.contains(id))?
        }
        Layout::Mirror => HashMap::new(),
    };
    // Mirror: the recodes each moved branch will do, written down before anything goes up.
    let mut journals: Vec<Journal> = Vec::new();
    if layout == Layout::Mirror {
        let mut protected: Option<Option<HashSet<ObjectId>>> = None;
        for (kind, _, _, _, id, _) in &moves {
            if *kind != RefKind::Branch || journals.iter().any(|j| j.version == *id) {
                continue;
            }
            let mut planned = Vec::new();
            if !present.is_empty() {
                // The older blobs among what the push counts on, the newer ones absent from the
                // whole listing (docs/format.md, "A mirror push", step 2).
                planned = plan_recodes(repo, id, &trusted, &HashSet::new())?;
                planned.retain(|r| !present.contains(&r.newer));
            }
            if !planned.is_empty() {
                let moving = |tip: &RemoteRef| moves.iter().any(|m| m.0 == RefKind::Branch && m.1 == tip.name);
                // A tip that cannot be read: no recode could be shown to spare it, none is done.
                match protected.get_or_insert_with(|| tip_blobs(&RemoteObjects::new(repo, remote), &moving).ok()) {
                    Some(protected) => planned.retain(|r| !protected.contains(&r.older)),
                    None => planned.clear(),
                }
            }
            let mut all = own_journals.remove(id).unwrap_or_default();
            for r in planned {
                if !all.contains(&r) {
                    all.push(r);
                }
            }
            if !all.is_empty() {
                let branch = moves.iter().find(|m| m.4 == *id).map(|m| m.1.clone());
                journals.push(Journal { branch, version: *id, recodes: all, written: None });
            }
        }
    }
    // Everything this push reads here to send, verified before anything goes up (one read of
    // it, each object decoded about once): what it uploads, what its deltas are coded against
    // and what its recodes replace remote blobs by. A damaged object refuses the push, so
    // that bit rot here never spreads to the remote.
    let mut to_verify: Vec<ObjectId> = need.iter().map(|n| n.id).chain(damaged.iter().copied()).collect();
    to_verify.extend(wire.values().map(|w| w.reference));
    for journal in &journals {
        to_verify
            .extend(journal.recodes.iter().flat_map(|r| [r.older, r.newer]).filter(|id| repo.store().contains(id)));
    }
    checked.verify_here(repo, remote, to_verify)?;
    let mut recodes: HashMap<VersionId, (Journal, Instant)> = HashMap::new();
    for journal in journals {
        write_journal(repo, remote, &journal)?;
        recodes.insert(journal.version, (journal, Instant::now()));
    }
    for id in &damaged {
        report.bytes_sent += replace_there(repo, remote, id, &checked)?;
        report.objects_sent += 1;
        report.replaced_damaged.push(id.to_hex());
    }
    upload(repo, remote, &need, &wire, options.transfers, &checked, &mut report)?;
    if let Some(watch) = watch {
        watch.settle(repo, remote, &relied)?;
    }
    // A journal older than the grace period whose version no remote ref reaches is taken as
    // abandoned by other pushers (recode.rs, `abandoned`): after a long upload, each is
    // written again, so that the ref moves less than half the grace period after it was.
    let refresh = Duration::from_secs(repo.config().gc_grace_seconds) / 2;
    for (journal, written) in recodes.values_mut() {
        if !refresh.is_zero() && written.elapsed() >= refresh {
            write_journal(repo, remote, journal)?;
            *written = Instant::now();
        }
    }

    for (kind, name, key, old, id, expect) in moves {
        check_deadline(remote, &format!("{} {name}", kind.name()), started)?;
        match put_ref(remote, &key, &id, &expect) {
            Ok(()) => {
                report.updated.push(RefUpdate { kind: kind.name(), name, old, new: id });
                if let Some((journal, _)) = recodes.remove(&id) {
                    let (objects, bytes) = recode(repo, remote, &journal.recodes, options.transfers, &checked)?;
                    report.objects_sent += objects;
                    report.objects_recoded += objects;
                    report.bytes_sent += bytes;
                    remote.delete(&journal_key(&id))?;
                }
            }
            Err(remote::Error::Conflict { .. }) => {
                // Its recodes are not done: the branch does not hold the version.
                if recodes.remove(&id).is_some() {
                    let _ = remote.delete(&journal_key(&id));
                }
                return Err(Error::Rejected {
                    remote: url,
                    what: format!("{} {name}", kind.name()),
                    reason: "fetch first: it changed on the remote during this push".into(),
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    report.requests = remote.requests();
    Ok(report)
}

/// The objects the remote's refs reach as far as this store knows their versions: each ref
/// read now, and the remote-tracking refs of `remote_name` (versions read from this remote
/// earlier); versions this store does not hold name nothing here. Refs only move forward, so
/// these stay reachable: a push counts on them whatever their age.
fn remote_refs_reach(repo: &Repo, remote: &dyn Remote, remote_name: Option<&str>) -> Result<HashSet<ObjectId>> {
    let mut known = Vec::new();
    if let Some(name) = remote_name {
        let prefix = format!("refs/remotes/{name}/");
        for (full, id) in repo.refs().all() {
            if let (true, Ok(id)) = (full.starts_with(&prefix), id) {
                if repo.store().contains(&id) {
                    known.push(id);
                }
            }
        }
    }
    known.extend(remote_refs(remote, None)?.into_iter().map(|r| r.id).filter(|id| repo.store().contains(id)));
    Ok(repo.named(&known)?.into_iter().map(|n| n.id).collect())
}

/// Whether `remote` has version `id`'s object and the manifests of its files (the
/// manifests only if the version object is there).
fn remote_has_version(repo: &Repo, remote: &dyn Remote, id: &VersionId) -> Result<bool> {
    if !remote.exists(&remote::object_key(id))? {
        return Ok(false);
    }
    let edges = graph::edges(repo, Node::Version(*id))?;
    let mut manifests: Vec<ObjectId> = edges.iter().filter(|n| matches!(n, Node::Manifest(_))).map(Node::id).collect();
    manifests.sort();
    manifests.dedup();
    for m in manifests {
        if !remote.exists(&remote::object_key(&m))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Uploads `need`, a delta's reference before the delta (by levels: objects with no
/// reference to upload first, then the deltas on them, ...), each level in parallel.
fn upload(
    repo: &Repo,
    remote: &dyn Remote,
    need: &[Needed],
    wire: &HashMap<ObjectId, WireDelta>,
    transfers: usize,
    checked: &Checked,
    report: &mut PushReport,
) -> Result<()> {
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
            if !index.contains_key(&r) || chain.len() > crate::store::MAX_CHAIN_DEPTH as usize + 1 {
                break;
            }
            chain.push(r);
        }
        let deepest = chain.len() - 1;
        for (i, id) in chain.iter().enumerate() {
            level.entry(*id).or_insert(base_level + deepest - i);
        }
    }
    // Manifests after every blob, versions after every manifest: a push killed part way never
    // leaves a manifest whose blobs are not all there (a writer that finds a manifest takes
    // its file as there), nor a version whose manifests are not.
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
    let total: u64 = need.iter().map(|n| repo.store().stored_len(&n.id).unwrap_or(0)).sum();
    repo.progress().start("push", total);
    let done = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let sent_bytes = AtomicU64::new(0);
    let existed = AtomicU64::new(0);
    let as_deltas = AtomicU64::new(0);
    for ids in levels.values() {
        parallel(ids, transfers, |id| {
            if let Some(plan) = wire.get(id) {
                if let Some((len, uploaded)) = upload_wire_delta(repo, remote, id, plan)? {
                    match uploaded {
                        Uploaded::Created | Uploaded::Replaced => {
                            sent.fetch_add(1, Ordering::Relaxed);
                            sent_bytes.fetch_add(len, Ordering::Relaxed);
                            as_deltas.fetch_add(1, Ordering::Relaxed);
                        }
                        Uploaded::Existed => {
                            existed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let whole = repo.store().stored_len(id).unwrap_or(len);
                    repo.progress().set(done.fetch_add(whole, Ordering::Relaxed) + whole);
                    return Ok(());
                }
            }
            let (len, uploaded) = upload_object(repo, remote, id)?;
            match uploaded {
                Uploaded::Created | Uploaded::Replaced => {
                    // Verified bytes, written there by this push: a recode may code against them.
                    checked.good_there(*id);
                    sent.fetch_add(1, Ordering::Relaxed);
                    sent_bytes.fetch_add(len, Ordering::Relaxed);
                }
                Uploaded::Existed => {
                    existed.fetch_add(1, Ordering::Relaxed);
                }
            }
            repo.progress().set(done.fetch_add(len, Ordering::Relaxed) + len);
            Ok(())
        })?;
    }
    repo.progress().finish();
    report.objects_sent += sent.into_inner();
    report.bytes_sent += sent_bytes.into_inner();
    report.objects_present += existed.into_inner();
    report.objects_sent_as_deltas += as_deltas.into_inner();
    Ok(())
}
