//! Garbage on a remote (docs/format.md, "Garbage on a remote"): `ckpt gc --remote` deletes
//! the objects no remote ref reaches once they are older than a grace period, and the rules
//! that let every writer (push, a distributed save's ranks) run at the same time without
//! losing an object it counts on.
//!
//! The remote has no lock, so the two sides meet on object ages (S3's `LastModified`, a
//! directory's mtimes):
//! - gc deletes an object only if nothing reaches it from the refs, nor from any object
//!   younger than [`REMOTE_GRACE`], and it is older than that itself;
//! - a writer counts on an object it finds on the remote only if a remote ref reaches it
//!   (refs only move forward, so that stays true) or it is younger than [`FRESH_FOR`]; an
//!   older one is written again, standalone ([`Repo::keep_found`]);
//! - a writer moves its ref within [`WRITE_DEADLINE`] of its first look at the remote, or not
//!   at all ([`check_deadline`]);
//! - gc announces itself with a record under [`GC_RECORDS`] for as long as it may delete, and a
//!   writer that wrote over a key (which a running gc may have listed before) checks, once no
//!   gc runs, that the key is still there ([`settle_rewrites`]).
//!
//! `FRESH_FOR + WRITE_DEADLINE` is under `REMOTE_GRACE`, so an object a writer counts on is
//! reachable from a ref (its version's) before gc may delete it; the rest is clock skew.
//!
//! A git repository's filter stores objects on a remote with no ckpt ref naming them (git
//! holds the pointers): such a remote carries [`GIT_FILTER_MARKER`] and gc refuses it.

use super::transfer::{parallel, reopen, with_retries};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Listed, Remote};
use crate::repo::Repo;
use crate::store::{ObjectHeader, ObjectKind, HEADER_LEN, MAX_DATA_OBJECT_LEN};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// How long an object no ref reaches stays on a remote at least: `ckpt gc --remote`'s default
/// grace period. One day: a save that failed tonight is collected tomorrow.
pub const REMOTE_GRACE: Duration = Duration::from_secs(24 * 3600);

/// How old an object a writer finds on a remote (listed, or found by a `HEAD` or a
/// create-if-absent upload) may be for the writer to count on it when no ref is known to reach
/// it. Older ones are written again.
pub const FRESH_FOR: Duration = Duration::from_secs(10 * 3600);

/// Longest time from a writer's first look at a remote (its listing, or reading the branch a
/// distributed save follows) to its ref move: past it, the ref is not moved and the writer
/// fails; a rerun finds what it uploaded there.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10 * 3600);

/// The key a git repository's filter writes on a remote it stores objects on (no ckpt ref
/// names them): `ckpt gc --remote` refuses a remote that has it.
pub const GIT_FILTER_MARKER: &str = "git-filter";

/// Where a running `ckpt gc --remote` keeps its record (`gc/<32 hex>`), from before its
/// listing until its last delete has been answered.
pub const GC_RECORDS: &str = "gc/";

/// Longest a gc may delete for after it began: past it, it stops (a rerun lists afresh).
pub const GC_MAX_RUN: Duration = Duration::from_secs(6 * 3600);

/// A gc record older than this (by its own age on the remote) is a killed gc's: it cannot
/// delete any more ([`GC_MAX_RUN`], and two hours of clock difference).
pub const GC_RECORD_DEAD_AFTER: Duration = Duration::from_secs(8 * 3600);

/// How long a writer waits for running gcs to finish before it gives up ([`settle_rewrites`]).
const GC_WAIT: Duration = Duration::from_secs(3600);

/// Whether an object written at `modified` (the remote's clock) counts as fresh at `now` (this
/// machine's): younger than [`FRESH_FOR`]. A time in the future (clock skew) is fresh.
pub(super) fn is_fresh(modified: SystemTime, now: SystemTime) -> bool {
    now.duration_since(modified).map_or(true, |age| age < FRESH_FOR)
}

/// Whether object `id` is on `remote` and fresh ([`is_fresh`]): one `HEAD`.
pub(super) fn fresh_on(remote: &dyn Remote, id: &ObjectId) -> Result<bool> {
    let modified = remote.modified(&remote::object_key(id))?;
    Ok(modified.is_some_and(|m| is_fresh(m, SystemTime::now())))
}

/// Refuses to move `what` (a ref) on `remote` if the writer's first look at the remote was
/// [`WRITE_DEADLINE`] ago or more: what it counted on may have become garbage since.
pub(super) fn check_deadline(remote: &dyn Remote, what: &str, started: Instant) -> Result<()> {
    if started.elapsed() < WRITE_DEADLINE {
        return Ok(());
    }
    Err(Error::Rejected {
        remote: remote.url().to_string(),
        what: what.to_string(),
        reason: format!(
            "more than {} h passed since this write first read the remote, so objects it counted on \
             may have been collected (docs/format.md, \"Garbage on a remote\"); run it again: \
             what it uploaded is found there",
            WRITE_DEADLINE.as_secs() / 3600
        ),
    })
}

/// Writes [`GIT_FILTER_MARKER`] on `remote` unless it is there (a git repository's filter
/// stores objects on it).
pub(super) fn mark_git_filter(remote: &dyn Remote) -> Result<()> {
    let text = b"objects here are named by git pointers, not ckpt refs: ckpt gc --remote refuses this remote\n";
    match remote.put_small(GIT_FILTER_MARKER, text, &Expect::Absent) {
        Ok(()) | Err(remote::Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The records of gcs that may still be deleting on `remote` ([`GC_RECORDS`], younger than
/// [`GC_RECORD_DEAD_AFTER`]).
fn live_gc_records(remote: &dyn Remote) -> Result<Vec<Listed>> {
    let now = SystemTime::now();
    Ok(remote
        .list_modified(GC_RECORDS)?
        .into_iter()
        .filter(|l| now.duration_since(l.modified).map_or(true, |age| age < GC_RECORD_DEAD_AFTER))
        .collect())
}

/// After a writer wrote over the objects `rewritten` ([`remote::Uploaded::Replaced`]), and
/// before anything names them: waits until no gc runs on `remote` (then none that began before
/// the rewrites can delete any more), checks that each is still there, uploads again any that
/// a gc deleted, and repeats. A gc still running after [`GC_WAIT`] fails the write.
pub(super) fn settle_rewrites(repo: &Repo, remote: &dyn Remote, rewritten: &[ObjectId]) -> Result<()> {
    let mut left: Vec<ObjectId> = rewritten.to_vec();
    let began = Instant::now();
    while !left.is_empty() {
        loop {
            let running = live_gc_records(remote)?;
            let Some(record) = running.first() else { break };
            if began.elapsed() >= GC_WAIT {
                return Err(Error::Rejected {
                    remote: remote.url().to_string(),
                    what: "the upload".into(),
                    reason: format!(
                        "a ckpt gc --remote has been running for over {} minutes ({}); run this again once \
                         it is done, or delete that key if its gc was killed",
                        GC_WAIT.as_secs() / 60,
                        record.key
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut gone = Vec::new();
        for id in &left {
            if remote.modified(&remote::object_key(id))?.is_none() {
                gone.push(*id);
            }
        }
        for id in &gone {
            repo.upload_object(remote, id)?;
        }
        left = gone;
    }
    Ok(())
}

impl Repo {
    /// After an upload of object `id` found it on `remote` already: if it is not fresh
    /// ([`is_fresh`]; gc may count it as garbage), it is replaced by a standalone encoding,
    /// which gives it a new age. Returns the bytes that went up (0: it was fresh).
    pub(super) fn keep_found(&self, remote: &dyn Remote, id: &ObjectId) -> Result<u64> {
        let key = remote::object_key(id);
        match remote.modified(&key)? {
            Some(m) if is_fresh(m, SystemTime::now()) => return Ok(0),
            _ => {}
        }
        let header = self.store().header(id)?;
        if header.kind != ObjectKind::Blob || header.reference.is_none() {
            let path = self.store().object_path(id);
            let file = std::fs::File::open(&path).map_err(|e| Error::Io {
                action: "opening",
                path: path.clone(),
                source: e,
            })?;
            let len =
                file.metadata().map_err(|e| Error::Io { action: "reading", path: path.clone(), source: e })?.len();
            with_retries(|| Ok(remote.replace(&key, &file, &path, len)?))?;
            return Ok(len);
        }
        let chain = self.store().open_blob(id)?;
        let (tmp, len) = self.store().encode_standalone_for_transfer(&chain, &self.config().codec_options())?;
        with_retries(|| Ok(remote.replace(&key, tmp.as_file(), tmp.path(), len)?))?;
        Ok(len)
    }
}

/// How `ckpt gc --remote` runs.
#[derive(Clone, Debug)]
pub struct RemoteGcOptions {
    /// Objects no ref reaches are deleted once older than this ([`REMOTE_GRACE`] by default).
    /// Shorter is safe only while nothing writes to the remote.
    pub grace: Duration,
    /// Compute and report, delete nothing.
    pub dry_run: bool,
    /// Requests in flight at once.
    pub transfers: usize,
}

impl Default for RemoteGcOptions {
    fn default() -> Self {
        RemoteGcOptions { grace: REMOTE_GRACE, dry_run: false, transfers: 16 }
    }
}

/// What `ckpt gc --remote` found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemoteGcReport {
    /// The remote's URL.
    pub remote: String,
    /// Refs read (branches and tags).
    pub refs: usize,
    /// Versions the refs reach.
    pub versions: usize,
    /// Objects listed under `objects/`.
    pub listed: usize,
    /// Objects kept: reached from a ref, or younger than the grace period, or reached from one.
    pub kept: usize,
    /// Of `kept`, objects no ref reaches kept only for their age (a save may still be writing).
    pub recent: usize,
    /// Objects deleted (with `dry_run`: that would be).
    pub deleted: usize,
    /// Their bytes.
    pub bytes_freed: u64,
    /// The grace period, in seconds.
    pub grace_seconds: u64,
    /// Nothing was deleted: `--dry-run`.
    pub dry_run: bool,
    /// Requests sent.
    pub requests: u64,
}

/// What an object is known to be when the walk reaches it.
#[derive(Clone, Copy, Debug)]
enum Node {
    Version(ObjectId),
    Manifest(ObjectId),
    Blob(ObjectId),
    /// A root kept for its age: its header tells.
    Unknown(ObjectId),
}

impl Node {
    fn id(&self) -> ObjectId {
        match self {
            Node::Version(id) | Node::Manifest(id) | Node::Blob(id) | Node::Unknown(id) => *id,
        }
    }
}

/// Deletes from `remote` the objects no ref reaches that are older than `options.grace`
/// (docs/format.md, "Garbage on a remote"). The walk follows every edge as the remote holds
/// it: versions to parents and manifests, manifests to blobs, and each blob's header (read on
/// the remote: its form there may differ from this store's) to its reference; it starts from
/// every ref and from every object younger than the grace period. Versions and manifests this
/// store holds are read here (same id, same content); the others are downloaded and verified.
///
/// Refused, with nothing deleted: a remote with [`GIT_FILTER_MARKER`], a remote without refs,
/// a ref that does not parse, and an object a ref reaches that is missing or unreadable.
pub fn gc_remote(repo: &Repo, remote: &dyn Remote, options: &RemoteGcOptions) -> Result<RemoteGcReport> {
    let url = remote.url().to_string();
    let refuse = |reason: String| Error::RemoteGc { remote: url.clone(), reason };
    let started = Instant::now();
    if remote.get_small(GIT_FILTER_MARKER)?.is_some() {
        return Err(refuse(format!(
            "it holds the objects of a git repository's pointers (it has the key {GIT_FILTER_MARKER:?}, written \
             by the git filter's pre-push): only git knows which of them are still needed"
        )));
    }
    let record = GcRecord::announce(remote, options.dry_run)?;
    // The listing first, then the refs: a key first written after the listing is not deleted
    // whatever it is (a key written over after it: `settle_rewrites`), and a ref moved before
    // the refs are read is seen with what it reaches.
    let listed_at = SystemTime::now();
    let listing = remote.list_modified("objects/")?;
    let listed: HashMap<ObjectId, Listed> =
        listing.into_iter().filter_map(|l| remote::object_of_key(&l.key).map(|id| (id, l))).collect();
    let mut refs = Vec::new();
    for key in remote.list("refs/")? {
        let Some(small) = remote.get_small(&key)? else { continue };
        refs.push(super::remotes::parse_ref(remote, &key, &small.bytes)?);
    }
    if refs.is_empty() {
        return Err(refuse(
            "no ref names a version on it, so every object would be garbage (a git filter's remote of an older \
             ckpt, without the marker, looks like this too)"
                .into(),
        ));
    }
    let mut report = RemoteGcReport {
        remote: url.clone(),
        refs: refs.len(),
        listed: listed.len(),
        grace_seconds: options.grace.as_secs(),
        dry_run: options.dry_run,
        ..RemoteGcReport::default()
    };
    let mut kept: HashSet<ObjectId> = HashSet::new();
    let roots: Vec<Node> = refs.iter().map(|id| Node::Version(*id)).collect();
    report.versions = walk(repo, remote, &listed, roots, &mut kept, true, options.transfers)?;
    let reached = kept.len();
    let young: Vec<Node> = listed
        .iter()
        .filter(|(id, l)| {
            !kept.contains(id) && listed_at.duration_since(l.modified).map_or(true, |age| age < options.grace)
        })
        .map(|(id, _)| Node::Unknown(*id))
        .collect();
    walk(repo, remote, &listed, young, &mut kept, false, options.transfers)?;
    report.kept = listed.keys().filter(|id| kept.contains(id)).count();
    report.recent = kept.len() - reached;
    let doomed: Vec<(ObjectId, u64)> =
        listed.iter().filter(|(id, _)| !kept.contains(id)).map(|(id, l)| (*id, l.size)).collect();
    report.deleted = doomed.len();
    report.bytes_freed = doomed.iter().map(|(_, size)| size).sum();
    if !options.dry_run {
        repo.progress().start("gc", doomed.len() as u64);
        let done = std::sync::atomic::AtomicU64::new(0);
        parallel(&doomed, options.transfers, |(id, _)| {
            if started.elapsed() >= GC_MAX_RUN {
                return Err(Error::RemoteGc {
                    remote: remote.url().to_string(),
                    reason: format!(
                        "stopped after {} h, the longest a gc may delete for; run it again",
                        GC_MAX_RUN.as_secs() / 3600
                    ),
                });
            }
            remote.delete(&remote::object_key(id))?;
            repo.progress().set(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
            Ok(())
        })?;
        repo.progress().finish();
    }
    record.finish(remote)?;
    report.requests = remote.requests();
    Ok(report)
}

/// A running gc's record on the remote ([`GC_RECORDS`]). Deleted when the gc ends, by
/// [`GcRecord::finish`] or, on an error, when dropped; a killed gc's stays until it is
/// [`GC_RECORD_DEAD_AFTER`] old, and the next gc deletes it then.
struct GcRecord<'a> {
    remote: &'a dyn Remote,
    key: Option<String>,
}

impl<'a> GcRecord<'a> {
    /// Writes this gc's record (none for a dry run, which deletes nothing), after refusing to
    /// run beside another gc (whose record is live before or after this one is written).
    fn announce(remote: &'a dyn Remote, dry_run: bool) -> Result<GcRecord<'a>> {
        let busy = |other: &Listed| Error::RemoteGc {
            remote: remote.url().to_string(),
            reason: format!(
                "another ckpt gc --remote is running ({}); if it was killed, its record stops counting {} h \
                 after it began, or delete it",
                other.key,
                GC_RECORD_DEAD_AFTER.as_secs() / 3600
            ),
        };
        if let Some(other) = live_gc_records(remote)?.first() {
            return Err(busy(other));
        }
        if dry_run {
            return Ok(GcRecord { remote, key: None });
        }
        let seed = format!("{:?} {} {:?}", SystemTime::now(), std::process::id(), std::thread::current().id());
        let hex = ObjectId::hash(seed.as_bytes()).to_hex();
        let key = format!("{GC_RECORDS}{}", &hex[..32]);
        let text = format!(
            "a ckpt gc --remote began here (pid {}); writers that rewrote objects wait for it\n",
            std::process::id()
        );
        remote.put_small(&key, text.as_bytes(), &Expect::Absent)?;
        let record = GcRecord { remote, key: Some(key.clone()) };
        // Two gcs that began at once each see the other's record here: both stop.
        let live = live_gc_records(remote)?;
        if let Some(other) = live.iter().find(|l| l.key != key) {
            return Err(busy(other));
        }
        // Records of killed gcs.
        for dead in remote.list(GC_RECORDS)? {
            if !live.iter().any(|l| l.key == dead) {
                remote.delete(&dead)?;
            }
        }
        Ok(record)
    }

    /// Deletes the record: every delete of this gc has been answered.
    fn finish(mut self, remote: &dyn Remote) -> Result<()> {
        if let Some(key) = self.key.take() {
            remote.delete(&key)?;
        }
        Ok(())
    }
}

impl Drop for GcRecord<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let _ = self.remote.delete(&key);
        }
    }
}

/// Walks from `roots` into `kept`, layer by layer with `transfers` requests in flight; returns
/// the versions reached. An object not in `listed` (written after the listing) is looked for;
/// one that is missing is an error when `strict` (a ref reaches it), else left out (what a
/// failed save left may be incomplete). Any object that cannot be read or parsed is an error:
/// its edges would be unknown.
fn walk(
    repo: &Repo,
    remote: &dyn Remote,
    listed: &HashMap<ObjectId, Listed>,
    roots: Vec<Node>,
    kept: &mut HashSet<ObjectId>,
    strict: bool,
    transfers: usize,
) -> Result<usize> {
    let mut frontier = roots;
    let mut versions = 0;
    while !frontier.is_empty() {
        let todo: Vec<Node> = frontier.drain(..).filter(|n| kept.insert(n.id())).collect();
        // Objects written since the listing are walked too; a remote that keeps answering
        // with new ones (hostile, or written to faster than walked) stops the gc.
        if kept.len() > listed.len() + remote::MAX_LIST_KEYS {
            return Err(Error::RemoteGc {
                remote: remote.url().to_string(),
                reason: format!(
                    "the walk reached more than {} objects not in the listing; nothing was deleted",
                    remote::MAX_LIST_KEYS
                ),
            });
        }
        versions += todo.iter().filter(|n| matches!(n, Node::Version(_))).count();
        let next: Mutex<Vec<Node>> = Mutex::new(Vec::new());
        let gone = Mutex::new(Vec::new());
        let kept_now: &HashSet<ObjectId> = kept;
        parallel(&todo, transfers, |node| {
            let id = node.id();
            if !listed.contains_key(&id) && remote.modified(&remote::object_key(&id))?.is_none() {
                gone.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                return Ok(());
            }
            let edges = edges(repo, remote, *node)?;
            let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
            next.extend(edges.into_iter().filter(|n| !kept_now.contains(&n.id())));
            Ok(())
        })?;
        let gone = gone.into_inner().unwrap_or_else(|e| e.into_inner());
        for id in &gone {
            kept.remove(id);
        }
        if strict && !gone.is_empty() {
            let shown: Vec<String> = gone.iter().take(5).map(|id| id.to_hex()).collect();
            return Err(Error::RemoteGc {
                remote: remote.url().to_string(),
                reason: format!(
                    "{} objects the refs reach are missing (first: {}); a push from a store that holds them \
                     uploads them again. Nothing was deleted",
                    gone.len(),
                    shown.join(", ")
                ),
            });
        }
        frontier = next.into_inner().unwrap_or_else(|e| e.into_inner());
    }
    Ok(versions)
}

/// The objects `node` points to, read as the remote holds it.
fn edges(repo: &Repo, remote: &dyn Remote, node: Node) -> Result<Vec<Node>> {
    let id = node.id();
    let kind = match node {
        Node::Version(_) => ObjectKind::Version,
        Node::Manifest(_) => ObjectKind::Manifest,
        Node::Blob(_) | Node::Unknown(_) => {
            let (head, _) = remote.read_head(&remote::object_key(&id), HEADER_LEN as u64)?;
            let header = ObjectHeader::decode(id, &head)?;
            if header.kind == ObjectKind::Blob {
                return Ok(header.reference.map(Node::Blob).into_iter().collect());
            }
            header.kind
        }
    };
    if kind == ObjectKind::Version {
        let version = if repo.store().contains(&id) {
            repo.version(&id)?
        } else {
            crate::repo::Version::parse(id, &download_small(repo, remote, &id, kind)?)?
        };
        return Ok(version
            .parents
            .iter()
            .map(|p| Node::Version(*p))
            .chain(version.files.iter().map(|f| Node::Manifest(f.manifest)))
            .collect());
    }
    let manifest = if repo.store().contains(&id) {
        repo.manifest(&id)?
    } else {
        crate::repo::Manifest::parse(id, &download_small(repo, remote, &id, kind)?)?
    };
    Ok(manifest.blobs().map(Node::Blob).collect())
}

/// Version or manifest `id` downloaded from `remote` (at most [`MAX_DATA_OBJECT_LEN`] and a
/// container's framing), verified against its id, not stored.
fn download_small(repo: &Repo, remote: &dyn Remote, id: &ObjectId, kind: ObjectKind) -> Result<Vec<u8>> {
    let limit = MAX_DATA_OBJECT_LEN * 2 + (1 << 20);
    let tmp = with_retries(|| {
        let tmp = repo.store().receive_file()?;
        let mut out = std::io::BufWriter::new(tmp.as_file());
        remote.download(&remote::object_key(id), &mut out, limit)?;
        std::io::Write::flush(&mut out).map_err(|e| Error::Io {
            action: "writing",
            path: tmp.path().into(),
            source: e,
        })?;
        drop(out);
        Ok(tmp.into_temp_path())
    })?;
    Ok(repo.store().read_received(id, kind, &reopen(tmp)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_and_the_deadline_leave_room_inside_the_grace_period() {
        // The safety argument: an object a writer counts on is reachable before gc may
        // delete it, with an hour of clock skew either way to spare.
        assert!(FRESH_FOR + WRITE_DEADLINE + Duration::from_secs(2 * 3600) <= REMOTE_GRACE);
        let now = SystemTime::now();
        assert!(is_fresh(now, now));
        assert!(is_fresh(now + Duration::from_secs(60), now), "a clock ahead of ours");
        assert!(is_fresh(now - FRESH_FOR + Duration::from_secs(1), now));
        assert!(!is_fresh(now - FRESH_FOR, now));
    }
}
