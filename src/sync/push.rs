//! `push`: the objects the pushed versions need that the remote lacks, a delta's reference
//! before the delta and every object before any ref; then each ref by compare-and-swap, only
//! forward.

use super::checked::{find_damaged_there, replace_there, Checked};
use super::freshness::{check_deadline, is_fresh, GcWatch, Moment};
use super::partial::check_pushable;
use super::recode::{finish_journals, journal_key, plan_recodes, recode, write_journal, Journal, Recode};
use super::remote_view::{put_ref, read_ref, ref_key, remote_refs, tip_blobs, RemoteObjects, RemoteRef};
use super::remotes::{open_remote, remote_layout, Layout, RefUpdate};
use super::upload::upload_needed;
use super::wire_delta::{plan_wire_deltas, WireDelta};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote};
use crate::repo::graph::{self, Node};
use crate::repo::Error as RepoError;
use crate::repo::{Head, Needed, RefKind, Repo, VersionId};
use crate::store::ObjectKind;
use std::collections::{HashMap, HashSet};
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

/// One ref a push moves: where the remote has it and where it goes.
struct Move {
    kind: RefKind,
    name: String,
    /// Its key on the remote.
    key: String,
    /// Where the remote has it.
    old: Option<VersionId>,
    /// Where it goes.
    new: VersionId,
    /// What its compare-and-swap expects.
    expect: Expect,
}

impl Move {
    /// `branch main`, `tag v1`.
    fn what(&self) -> String {
        format!("{} {}", self.kind.name(), self.name)
    }
}

/// What a push uploads, and what it counts on the remote holding.
#[derive(Default)]
struct Upload {
    /// The objects that go up (a delta's reference before the delta in `reachable` order).
    need: Vec<Needed>,
    /// What the remote's refs already name (the remote holds all of it).
    have: HashSet<ObjectId>,
    /// What the remote lists (for the recodes' plan).
    present: HashSet<ObjectId>,
    /// Of `present`, what the push counts on: fresh objects, or objects a remote ref reaches
    /// (docs/format.md, "Garbage on a remote").
    trusted: HashSet<ObjectId>,
    /// What the push's versions will name that no remote ref reaches: checked before the refs
    /// move if a gc ran meanwhile (`GcWatch::settle`, with `watch`).
    relied: Vec<ObjectId>,
    watch: Option<GcWatch>,
    /// Remote copies found damaged (`--repair`), replaced before anything else goes up.
    damaged: Vec<ObjectId>,
    /// Blobs that go up as deltas (the deltas layout).
    wire: HashMap<ObjectId, WireDelta>,
}

impl Upload {
    /// Whether the push counts on the remote holding `id` with all it needs.
    fn counted_on(&self, id: &ObjectId) -> bool {
        self.have.contains(id) || self.trusted.contains(id)
    }
}

/// A push under way: what it pushes with, what it has verified and what it reports.
struct Pushing<'a> {
    repo: &'a Repo,
    remote: &'a dyn Remote,
    options: &'a PushOptions,
    checked: Checked,
    report: PushReport,
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
    let wanted = wanted_refs(repo, options)?;
    let report = PushReport { remote: remote.url().to_string(), ..PushReport::default() };
    let mut push = Pushing { repo, remote, options, checked: Checked::default(), report };
    let (moves, mut remote_known) = push.moves(wanted)?;
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
    push.report.repaired = incomplete.iter().map(|id| id.to_hex()).collect();
    let own_journals = match layout {
        Layout::Mirror => push.finish_others_journals(&moves)?,
        Layout::Deltas => HashMap::new(),
    };
    if moves.is_empty() && incomplete.is_empty() && !options.repair {
        push.report.requests = remote.requests();
        return Ok(push.report);
    }
    let mut roots: Vec<VersionId> = moves.iter().map(|m| m.new).chain(incomplete).collect();
    if options.repair {
        roots.extend(remote_known.iter().copied());
    }
    let mut upload = push.plan_upload(&roots, &remote_known)?;
    check_pushable(repo, &upload.need, &|id| upload.counted_on(id), remote.url())?;
    // New blobs go up as deltas against the parent version's blobs where the remote has
    // them (wire_delta.rs).
    if layout == Layout::Deltas {
        let versions: Vec<VersionId> =
            upload.need.iter().filter(|n| n.kind == ObjectKind::Version).map(|n| n.id).collect();
        let need_blobs: HashSet<ObjectId> =
            upload.need.iter().filter(|n| n.kind == ObjectKind::Blob).map(|n| n.id).collect();
        upload.wire = plan_wire_deltas(repo, &versions, &need_blobs, &|id| upload.counted_on(id))?;
    }
    let journals = match layout {
        Layout::Mirror => push.plan_journals(&moves, &upload, own_journals)?,
        Layout::Deltas => Vec::new(),
    };
    let recodes = push.send(upload, journals)?;
    push.move_refs(moves, recodes, started)?;
    push.report.requests = remote.requests();
    Ok(push.report)
}

/// The refs `options` names to push, each with the version it names here.
fn wanted_refs(repo: &Repo, options: &PushOptions) -> Result<Vec<(RefKind, String, VersionId)>> {
    let mut wanted = Vec::new();
    if options.all {
        for kind in [RefKind::Branch, RefKind::Tag] {
            wanted.extend(repo.refs().list(kind)?.into_iter().map(|(name, id)| (kind, name, id)));
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
    Ok(wanted)
}

impl Pushing<'_> {
    fn rejected(&self, what: String, reason: String) -> Error {
        Error::Rejected { remote: self.remote.url().to_string(), what, reason }
    }

    /// Where each of the `wanted` refs is on the remote: those already there are reported up
    /// to date, the others become moves (a tag elsewhere, or a branch that would not move
    /// forward, rejects the push). Returns the moves and the versions the remote's refs name.
    fn moves(&mut self, wanted: Vec<(RefKind, String, VersionId)>) -> Result<(Vec<Move>, Vec<VersionId>)> {
        let mut moves = Vec::new();
        let mut remote_known = Vec::new();
        for (kind, name, new) in wanted {
            let key = ref_key(kind, &name);
            let (old, tag) = read_ref(self.remote, &key)?.unzip();
            let what = format!("{} {name}", kind.name());
            match old {
                Some(old) if old == new => {
                    self.report.up_to_date.push(what);
                    remote_known.push(old);
                    continue;
                }
                Some(_) if kind == RefKind::Tag => {
                    let reason = "the remote has this tag at another version (tags do not move)";
                    return Err(self.rejected(what, reason.into()));
                }
                Some(old) => {
                    let known = self.repo.store().contains(&old);
                    if !known || !self.repo.is_ancestor(&old, &new)? {
                        let reason = format!(
                            "fetch first: the remote has version {} there, which {}",
                            old.short(12),
                            if known { "is not an ancestor of yours" } else { "you do not have" }
                        );
                        return Err(self.rejected(what, reason));
                    }
                    remote_known.push(old);
                }
                None => {}
            }
            let expect = tag.map_or(Expect::Absent, Expect::Tag);
            moves.push(Move { kind, name, key, old, new, expect });
        }
        Ok((moves, remote_known))
    }

    /// Journals of mirror pushes that were killed or are still running (one listing): those
    /// whose version this push moves a branch to are returned, to be merged into its own; the
    /// others are finished if their branch holds their version.
    fn finish_others_journals(&mut self, moves: &[Move]) -> Result<HashMap<VersionId, Vec<Recode>>> {
        let own =
            |j: &Journal| j.branch.is_some() && moves.iter().any(|m| m.kind == RefKind::Branch && m.new == j.version);
        let (done, mine) = finish_journals(self.repo, self.remote, &own, self.options.transfers, &self.checked)?;
        self.add_recodes(done);
        let mut own_journals: HashMap<VersionId, Vec<Recode>> = HashMap::new();
        for journal in mine {
            own_journals.entry(journal.version).or_default().extend(journal.recodes);
        }
        Ok(own_journals)
    }

    fn add_recodes(&mut self, (objects, bytes): (u64, u64)) {
        self.report.objects_sent += objects;
        self.report.objects_recoded += objects;
        self.report.bytes_sent += bytes;
    }

    /// What the versions `roots` need, less what the remote's refs (`remote_known`) already
    /// name (the remote holds all of that, each with its chain: refs move only after their
    /// objects). Not less the local chains of those blobs: after a compaction here, an old blob
    /// is a delta against a new one, which the remote does not have. A repair takes nothing for
    /// granted: everything the remote's refs need too, each object looked for in the listing.
    /// Of the rest, what the remote lists and the push may count on is not sent again.
    fn plan_upload(&mut self, roots: &[VersionId], remote_known: &[VersionId]) -> Result<Upload> {
        let (repo, remote, options) = (self.repo, self.remote, self.options);
        let mut upload = Upload::default();
        if !options.repair {
            upload.have = repo.named(remote_known)?.into_iter().map(|n| n.id).collect();
        }
        let have = &upload.have;
        upload.need = repo.reachable(roots, &|id| have.contains(id))?;
        if upload.need.is_empty() {
            return Ok(upload);
        }
        upload.watch = Some(GcWatch::begin(remote)?);
        // Objects a previous, interrupted push left there (one listing, not a request per
        // object); the others the push needs go up again.
        let now = SystemTime::now();
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for listed in remote.list_modified("objects/")? {
            let Some(id) = remote::object_of_key(&listed.key) else { continue };
            upload.present.insert(id);
            sizes.insert(id, listed.size);
            if is_fresh(listed.modified, now) {
                upload.trusted.insert(id);
            }
        }
        let mut reached = HashSet::new();
        if upload.need.iter().any(|n| upload.present.contains(&n.id) && !upload.trusted.contains(&n.id)) {
            // Only what the listing shows: a reached object the remote lost goes up again.
            reached = remote_refs_reach(repo, remote, options.remote_name.as_deref())?;
            reached.retain(|id| upload.present.contains(id));
            upload.trusted.extend(reached.iter().copied());
        }
        if options.repair {
            let there: Vec<(ObjectId, ObjectKind, u64)> =
                upload.need.iter().filter_map(|n| sizes.get(&n.id).map(|size| (n.id, n.kind, *size))).collect();
            let survey = find_damaged_there(repo, remote, &there, &self.checked, options.transfers)?;
            self.report.remote_checked = survey.checked;
            self.report.remote_bytes_checked = survey.bytes;
            self.report.remote_unchecked = survey.unchecked.len() as u64;
            upload.damaged = survey.damaged;
        }
        upload.relied = upload.need.iter().map(|n| n.id).filter(|id| !reached.contains(id)).collect();
        let before = upload.need.len();
        let trusted = &upload.trusted;
        upload.need.retain(|n| !trusted.contains(&n.id));
        self.report.objects_present += (before - upload.need.len()) as u64;
        Ok(upload)
    }

    /// The recodes each moved branch will do in the mirror layout, each branch's in a journal
    /// with those of its killed pushes (`own`): the older blobs among what the push counts on,
    /// the newer ones absent from the whole listing (docs/format.md, "A mirror push", step 2),
    /// none held by the tip of a branch the push does not move.
    fn plan_journals(
        &self,
        moves: &[Move],
        upload: &Upload,
        mut own: HashMap<VersionId, Vec<Recode>>,
    ) -> Result<Vec<Journal>> {
        let mut journals: Vec<Journal> = Vec::new();
        let mut protected: Option<Option<HashSet<ObjectId>>> = None;
        for m in moves {
            if m.kind != RefKind::Branch || journals.iter().any(|j| j.version == m.new) {
                continue;
            }
            let mut planned = Vec::new();
            if !upload.present.is_empty() {
                planned = plan_recodes(self.repo, &m.new, &upload.trusted)?;
                planned.retain(|r| !upload.present.contains(&r.newer));
            }
            if !planned.is_empty() {
                let moving = |tip: &RemoteRef| moves.iter().any(|m| m.kind == RefKind::Branch && m.name == tip.name);
                let objects = RemoteObjects::new(self.repo, self.remote);
                // A tip that cannot be read: no recode could be shown to spare it, none is done.
                match protected.get_or_insert_with(|| tip_blobs(&objects, &moving).ok()) {
                    Some(protected) => planned.retain(|r| !protected.contains(&r.older)),
                    None => planned.clear(),
                }
            }
            let mut all = own.remove(&m.new).unwrap_or_default();
            for r in planned {
                if !all.contains(&r) {
                    all.push(r);
                }
            }
            if !all.is_empty() {
                let branch = moves.iter().find(|n| n.new == m.new).map(|n| n.name.clone());
                journals.push(Journal { branch, version: m.new, recodes: all, written: None });
            }
        }
        Ok(journals)
    }

    /// Verifies everything the push reads here to send (one read of it, each object decoded
    /// about once): what it uploads, what its deltas are coded against and what its recodes
    /// replace remote blobs by; a damaged object refuses the push, so that bit rot here never
    /// spreads to the remote. Then writes the `journals`, replaces the damaged remote copies,
    /// uploads, and settles with any gc that ran. Returns the journals by version, each with
    /// when it was last written.
    fn send(&mut self, upload: Upload, journals: Vec<Journal>) -> Result<HashMap<VersionId, (Journal, Instant)>> {
        let (repo, remote) = (self.repo, self.remote);
        let mut to_verify: Vec<ObjectId> =
            upload.need.iter().map(|n| n.id).chain(upload.damaged.iter().copied()).collect();
        to_verify.extend(upload.wire.values().map(|w| w.reference));
        for journal in &journals {
            let recoded = journal.recodes.iter().flat_map(|r| [r.older, r.newer]);
            to_verify.extend(recoded.filter(|id| repo.store().contains(id)));
        }
        self.checked.verify_here(repo, remote, to_verify)?;
        let mut recodes: HashMap<VersionId, (Journal, Instant)> = HashMap::new();
        for journal in journals {
            write_journal(repo, remote, &journal)?;
            recodes.insert(journal.version, (journal, Instant::now()));
        }
        for id in &upload.damaged {
            self.report.bytes_sent += replace_there(repo, remote, id, &self.checked)?;
            self.report.objects_sent += 1;
            self.report.replaced_damaged.push(id.to_hex());
        }
        let checked = &self.checked;
        let sent =
            upload_needed(repo, remote, &upload.need, &upload.wire, &|_| Ok(false), self.options.transfers, checked)?;
        self.report.objects_sent += sent.objects;
        self.report.bytes_sent += sent.bytes;
        self.report.objects_present += sent.existed;
        self.report.objects_sent_as_deltas += sent.as_deltas;
        if let Some(watch) = upload.watch {
            watch.settle(repo, remote, &upload.relied)?;
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
        Ok(recodes)
    }

    /// Moves each ref by compare-and-swap (within [`super::WRITE_DEADLINE`] of `started`), and
    /// once a branch has moved, does the recodes of its journal.
    fn move_refs(
        &mut self,
        moves: Vec<Move>,
        mut recodes: HashMap<VersionId, (Journal, Instant)>,
        started: Moment,
    ) -> Result<()> {
        let (repo, remote) = (self.repo, self.remote);
        for m in moves {
            check_deadline(remote, &m.what(), started)?;
            match put_ref(remote, &m.key, &m.new, &m.expect) {
                Ok(()) => {
                    let update = RefUpdate { kind: m.kind.name(), name: m.name.clone(), old: m.old, new: m.new };
                    self.report.updated.push(update);
                    if let Some((journal, _)) = recodes.remove(&m.new) {
                        self.add_recodes(recode(
                            repo,
                            remote,
                            &journal.recodes,
                            self.options.transfers,
                            &self.checked,
                        )?);
                        remote.delete(&journal_key(&m.new))?;
                    }
                }
                Err(remote::Error::Conflict { .. }) => {
                    // Its recodes are not done: the branch does not hold the version.
                    if recodes.remove(&m.new).is_some() {
                        let _ = remote.delete(&journal_key(&m.new));
                    }
                    return Err(
                        self.rejected(m.what(), "fetch first: it changed on the remote during this push".into())
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
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
