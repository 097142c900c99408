//! Garbage on a remote (docs/format.md, "Garbage on a remote"): `ckpt gc --remote` deletes
//! the objects no remote ref reaches once they are older than a grace period. It runs while
//! writers (push, a distributed save's ranks) write, by the rules of `freshness.rs`: it keeps
//! everything the refs reach and everything an object younger than the grace period reaches,
//! and announces itself by a record it keeps rewriting while it may delete.

use super::freshness::{GcRecord, GIT_FILTER_MARKER, REMOTE_GRACE};
use super::remote_view::{every_ref, RemoteObjects};
use super::transfer::parallel;
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Listed, Remote};
use crate::repo::graph::{self, Node};
use crate::repo::Repo;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

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
    /// Set (by a signal handler: the CLI's Ctrl-C) to stop the gc: it sends no more deletes,
    /// waits for those in flight to be answered, removes its record and fails with
    /// [`Error::RemoteGcInterrupted`]. A gc killed outright leaves its record, which makes
    /// writers that need to settle wait 10 minutes until they take it for dead.
    pub interrupt: Option<Arc<AtomicBool>>,
}

impl Default for RemoteGcOptions {
    fn default() -> Self {
        RemoteGcOptions { grace: REMOTE_GRACE, dry_run: false, transfers: 16, interrupt: None }
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
    if remote.get_small(GIT_FILTER_MARKER)?.is_some() {
        return Err(refuse(format!(
            "it holds the objects of a git repository's pointers (it has the key {GIT_FILTER_MARKER:?}, written \
             by the git filter's pre-push): only git knows which of them are still needed"
        )));
    }
    let deleted = AtomicU64::new(0);
    let interrupted = || match &options.interrupt {
        Some(flag) if flag.load(Ordering::SeqCst) => {
            Err(Error::RemoteGcInterrupted { remote: url.clone(), deleted: deleted.load(Ordering::SeqCst) })
        }
        _ => Ok(()),
    };
    let record = GcRecord::announce(remote, options.dry_run, &interrupted, &|line| repo.progress().note(line))?;
    // The record is rewritten on a thread of its own as well, so that a long listing or
    // download does not let it lapse; a stalled process stalls that thread too.
    let done = AtomicBool::new(false);
    let mut report = std::thread::scope(|scope| {
        if record.key.is_some() {
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(500));
                    let _ = record.beat();
                }
            });
        }
        // Checked with every beat: before each step of the walk and before each delete. On an
        // interrupt the deletes in flight are answered before `parallel` returns, and the
        // record is removed (dropped) after that, as when the gc ends.
        let beat = || record.beat().and_then(|()| interrupted());
        let report = collect(repo, remote, options, &beat, &deleted, &url);
        done.store(true, Ordering::SeqCst);
        report
    })
    .map_err(|e| match e {
        // Counted again now that the deletes in flight have been answered.
        Error::RemoteGcInterrupted { remote, .. } => {
            Error::RemoteGcInterrupted { remote, deleted: deleted.load(Ordering::SeqCst) }
        }
        e => e,
    })?;
    record.finish(remote)?;
    report.requests = remote.requests();
    Ok(report)
}

/// The listing, the walks and the deletes of [`gc_remote`], under `record`.
fn collect(
    repo: &Repo,
    remote: &dyn Remote,
    options: &RemoteGcOptions,
    beat: &(dyn Fn() -> Result<()> + Sync),
    deleted: &AtomicU64,
    url: &str,
) -> Result<RemoteGcReport> {
    let refuse = |reason: String| Error::RemoteGc { remote: url.to_string(), reason };
    // The listing first, then the refs: a key first written after the listing is not deleted
    // whatever it is (a key written over after it: `GcWatch::settle`), and a ref moved before
    // the refs are read is seen with what it reaches.
    let listed_at = SystemTime::now();
    let listing = remote.list_modified("objects/")?;
    let listed: HashMap<ObjectId, Listed> =
        listing.into_iter().filter_map(|l| remote::object_of_key(&l.key).map(|id| (id, l))).collect();
    // Every key under refs/, whatever its name; a ref that cannot be read, or is a directory,
    // is an error before anything is deleted.
    let refs = every_ref(remote)?;
    if refs.is_empty() {
        return Err(refuse(
            "no ref names a version on it, so every object would be garbage (a git filter's remote of an older \
             ckpt, without the marker, looks like this too)"
                .into(),
        ));
    }
    let mut report = RemoteGcReport {
        remote: url.to_string(),
        refs: refs.len(),
        listed: listed.len(),
        grace_seconds: options.grace.as_secs(),
        dry_run: options.dry_run,
        ..RemoteGcReport::default()
    };
    let objects = RemoteObjects::new(repo, remote);
    let walk_from = |roots: Vec<Node>, kept: &mut HashSet<ObjectId>, strict: bool| {
        walk(&objects, &listed, roots, kept, strict, options.transfers, beat)
    };
    let mut kept: HashSet<ObjectId> = HashSet::new();
    report.versions = walk_from(refs.iter().map(|id| Node::Version(*id)).collect(), &mut kept, true)?;
    let reached = kept.len();
    let young: Vec<ObjectId> = listed
        .iter()
        .filter(|(id, l)| {
            !kept.contains(id) && listed_at.duration_since(l.modified).map_or(true, |age| age < options.grace)
        })
        .map(|(id, _)| *id)
        .collect();
    // What a young object is, no referrer says: its header tells.
    let young_nodes = Mutex::new(Vec::new());
    parallel(&young, options.transfers, |id| {
        beat()?;
        let node = objects.node_of(id)?;
        young_nodes.lock().unwrap_or_else(|e| e.into_inner()).push(node);
        Ok(())
    })?;
    walk_from(young_nodes.into_inner().unwrap_or_else(|e| e.into_inner()), &mut kept, false)?;
    report.kept = listed.keys().filter(|id| kept.contains(id)).count();
    report.recent = kept.len() - reached;
    let doomed: Vec<(ObjectId, u64)> =
        listed.iter().filter(|(id, _)| !kept.contains(id)).map(|(id, l)| (*id, l.size)).collect();
    report.deleted = doomed.len();
    report.bytes_freed = doomed.iter().map(|(_, size)| size).sum();
    if !options.dry_run {
        repo.progress().start("gc", doomed.len() as u64);
        parallel(&doomed, options.transfers, |(id, _)| {
            beat()?;
            remote.delete(&remote::object_key(id))?;
            repo.progress().set(deleted.fetch_add(1, Ordering::SeqCst) + 1);
            Ok(())
        })?;
        repo.progress().finish();
    }
    Ok(report)
}

/// Walks from `roots` into `kept`, layer by layer with `transfers` requests in flight; returns
/// the versions reached. An object not in `listed` (written after the listing) is looked for;
/// one that is missing is an error when `strict` (a ref reaches it), else left out (what a
/// failed save left may be incomplete). Any object that cannot be read or parsed is an error:
/// its edges would be unknown.
fn walk(
    objects: &RemoteObjects,
    listed: &HashMap<ObjectId, Listed>,
    roots: Vec<Node>,
    kept: &mut HashSet<ObjectId>,
    strict: bool,
    transfers: usize,
    beat: &(dyn Fn() -> Result<()> + Sync),
) -> Result<usize> {
    let remote = objects.remote;
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
            beat()?;
            let id = node.id();
            if !listed.contains_key(&id) && remote.modified(&remote::object_key(&id))?.is_none() {
                gone.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                return Ok(());
            }
            let edges = graph::edges(objects, *node)?;
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
