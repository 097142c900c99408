//! How writers and `ckpt gc --remote` share a remote without a lock (docs/format.md, "Garbage
//! on a remote"): object ages, the deadline of a ref move, and the records a gc announces
//! itself by.
//!
//! The two sides meet on object ages (S3's `LastModified`, a directory's mtimes):
//! - gc deletes an object only if nothing reaches it from the refs, nor from any object
//!   younger than [`REMOTE_GRACE`], and it is older than that itself (`remote_gc.rs`);
//! - a writer counts on an object it finds on the remote only if a remote ref reaches it
//!   (refs only move forward, so that stays true) or it is younger than [`FRESH_FOR`]; an
//!   older one is written again, standalone ([`keep_found`]);
//! - a writer moves its ref within [`WRITE_DEADLINE`] of its first look at the remote, or not
//!   at all ([`check_deadline`]);
//! - gc announces itself under [`GC_RECORDS`] (a record it keeps rewriting while it may delete,
//!   [`GcRecord`], and a generation number it increases before listing), and a writer, before
//!   anything names what it uploaded or counted on, checks whether a gc ran meanwhile; if one
//!   did, it waits for it to end and uploads again what that gc deleted ([`GcWatch::settle`]).
//!
//! `FRESH_FOR + WRITE_DEADLINE` is under `REMOTE_GRACE`, so an object a writer counts on is
//! reachable from a ref (its version's) before gc may delete it; the rest is clock skew.
//!
//! A git repository's filter stores objects on a remote with no ckpt ref naming them (git
//! holds the pointers): such a remote carries [`GIT_FILTER_MARKER`] and gc refuses it.

use super::transfer::{parallel, with_retries};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Listed, Remote, UploadMode};
use crate::repo::Repo;
use crate::store::ObjectKind;
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

/// Where `ckpt gc --remote` announces itself: a running gc's record `gc/run-<32 hex>`, written
/// before its listing, rewritten every 30 s while it runs and deleted after its last
/// delete has been answered; and `gc/generation`, a number every gc increases before its
/// listing.
pub const GC_RECORDS: &str = "gc/";

/// The key whose number every gc increases before it lists ([`GC_RECORDS`]).
const GC_GENERATION: &str = "gc/generation";

/// How often a running gc rewrites its record.
const GC_BEAT: Duration = Duration::from_secs(30);

/// A gc sends no delete when its last rewrite of its record is older than this (by this
/// machine's monotonic clock or its wall clock, whichever says more: a machine that slept has
/// to rewrite it first, and stops when it sees it slept).
const GC_BEAT_LAPSE: Duration = Duration::from_secs(90);

/// A record a watcher has seen unchanged for this long is a dead gc's: over [`GC_BEAT_LAPSE`]
/// plus what one delete may take with the S3 client's own retries at the default stall
/// timeout (6 × 30 s, and 30 s for the last answer), with room to spare.
const GC_DEAD_AFTER: Duration = Duration::from_secs(600);

/// How long a writer waits for running gcs to finish before it gives up ([`GcWatch::settle`]).
const GC_WAIT: Duration = Duration::from_secs(3600);

/// How often a writer waiting for a gc looks at its record.
const GC_POLL: Duration = Duration::from_secs(2);

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

/// A moment, timed on both clocks: the monotonic one does not run while the machine sleeps,
/// the wall clock may be set; [`Moment::elapsed`] takes whichever says more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    instant: Instant,
    wall: SystemTime,
}

impl Moment {
    /// Now.
    pub fn now() -> Moment {
        Moment { instant: Instant::now(), wall: SystemTime::now() }
    }

    /// Time since, by whichever clock says more.
    pub fn elapsed(&self) -> Duration {
        self.instant.elapsed().max(self.wall.elapsed().unwrap_or_default())
    }
}

/// Refuses to move `what` (a ref) on `remote` if the writer's first look at the remote was
/// [`WRITE_DEADLINE`] ago or more: what it counted on may have become garbage since.
pub(super) fn check_deadline(remote: &dyn Remote, what: &str, started: Moment) -> Result<()> {
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

/// The records of gcs on `remote` ([`GC_RECORDS`]: `gc/run-*`), each key with its age there.
fn gc_records(remote: &dyn Remote) -> Result<Vec<Listed>> {
    Ok(remote.list_modified(GC_RECORDS)?.into_iter().filter(|l| l.key != GC_GENERATION).collect())
}

/// The gc generation on `remote` (`None`: no gc ever ran).
fn gc_generation(remote: &dyn Remote) -> Result<Option<Vec<u8>>> {
    Ok(remote.get_small(GC_GENERATION)?.map(|s| s.bytes))
}

/// Waits until no gc runs on `remote`: every record there is gone or has not changed for
/// [`GC_DEAD_AFTER`] while watched (its gc is dead, and stopped deleting before that). Past
/// `limit`, an error naming the record. Returns the dead records.
///
/// Each record it waits for is told to the user through `note` ([`waiting_note`]): the wait
/// can last ten minutes after a gc was killed, and nothing else moves meanwhile.
fn wait_for_gcs(
    remote: &dyn Remote,
    limit: Duration,
    what: &str,
    interrupted: &dyn Fn() -> Result<()>,
    note: &dyn Fn(&str),
) -> Result<Vec<String>> {
    let began = Instant::now();
    let give_up = SystemTime::now() + limit;
    // Each record's age as first seen, and when it was first seen so.
    let mut seen: HashMap<String, (SystemTime, Instant)> = HashMap::new();
    // Records told about, and whether a rewrite (a live gc) was told too.
    let mut told: HashMap<String, bool> = HashMap::new();
    loop {
        let records = gc_records(remote)?;
        let mut live = None;
        let mut dead = Vec::new();
        for r in &records {
            let entry = seen.entry(r.key.clone()).or_insert((r.modified, Instant::now()));
            let rewritten = entry.0 != r.modified;
            if rewritten {
                *entry = (r.modified, Instant::now());
            }
            if entry.1.elapsed() >= GC_DEAD_AFTER {
                dead.push(r.key.clone());
                continue;
            }
            live = Some(r.key.clone());
            let unchanged_since = SystemTime::now() - entry.1.elapsed();
            // Told once when first seen, and once more if it is rewritten (the gc is alive).
            let before = told.get(&r.key).copied();
            if before.is_none() || (rewritten && before == Some(false)) {
                note(&waiting_note(remote, &r.key, what, r.modified, unchanged_since, give_up, rewritten));
                told.insert(r.key.clone(), rewritten);
            }
        }
        let Some(live) = live else {
            // Records watched dead go, so that later writers need not watch them again.
            for key in &dead {
                let _ = remote.delete(key);
            }
            if !told.is_empty() {
                let ended = match dead.len() {
                    0 => "the ckpt gc --remote ended".to_string(),
                    _ => format!(
                        "took the ckpt gc --remote of {} for dead (unchanged for {} minutes) and deleted its record",
                        dead.join(", "),
                        GC_DEAD_AFTER.as_secs() / 60
                    ),
                };
                note(&format!("{}: {ended}; {what} goes on", remote.url()));
            }
            return Ok(dead);
        };
        if began.elapsed() >= limit {
            return Err(Error::Rejected {
                remote: remote.url().to_string(),
                what: what.to_string(),
                reason: format!(
                    "a ckpt gc --remote is still running after {} minutes ({live}); run this again once it is done",
                    limit.as_secs() / 60
                ),
            });
        }
        // Polled in short steps, so that an interrupt is answered at once.
        let slept = Instant::now();
        while slept.elapsed() < GC_POLL {
            interrupted()?;
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What [`wait_for_gcs`] tells the user of the gc record `key` it waits for: what waits, the
/// record, when it was last written (the remote's clock) and since when it is seen unchanged,
/// when it will be taken for dead if it stays so, and when the wait ends at the latest. With
/// `alive`, the record was just rewritten: the gc is running.
fn waiting_note(
    remote: &dyn Remote,
    key: &str,
    what: &str,
    written: SystemTime,
    unchanged_since: SystemTime,
    give_up: SystemTime,
    alive: bool,
) -> String {
    let utc = |t: SystemTime| {
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        crate::repo::format_time(i64::try_from(secs).unwrap_or(i64::MAX))
    };
    let url = remote.url();
    if alive {
        return format!(
            "{url}: the ckpt gc --remote of record {key} is running (rewritten at {}); {what} waits for it to end, \
             until {} at the latest",
            utc(written),
            utc(give_up)
        );
    }
    format!(
        "{url}: {what} waits for a ckpt gc --remote to end: its record {key} was last written at {} and is \
         unchanged since {}; if it stays unchanged, the gc is taken for dead at {} (a killed gc leaves its \
         record), and the wait ends at {} at the latest",
        utc(written),
        utc(unchanged_since),
        utc(unchanged_since + GC_DEAD_AFTER),
        utc(give_up)
    )
}

/// What a writer saw of gcs on the remote before its first look at the objects: the
/// generation, and whether a gc was running. [`GcWatch::settle`] uses it before anything names
/// what the writer uploaded or counted on.
#[derive(Clone, Debug)]
pub(super) struct GcWatch {
    generation: Option<Vec<u8>>,
    gc_was_running: bool,
}

impl GcWatch {
    /// Reads the generation, then the records (two requests).
    pub(super) fn begin(remote: &dyn Remote) -> Result<GcWatch> {
        let generation = gc_generation(remote)?;
        let gc_was_running = !gc_records(remote)?.is_empty();
        Ok(GcWatch { generation, gc_was_running })
    }

    /// Makes [`GcWatch::settle`] check the objects even if no gc ran: the write counts on
    /// objects another write uploaded and may not have settled (a fresh manifest standing for
    /// its file).
    pub(super) fn check_anyway(&mut self) {
        self.gc_was_running = true;
    }

    /// Before anything names `relied` (the objects a write uploaded or counted on as fresh;
    /// not those a remote ref reaches, which no gc deletes): if no gc ran since [`GcWatch::begin`]
    /// (the generation is the same and none was running then), nothing to do (two requests).
    /// Otherwise waits until no gc runs, checks each object with a `HEAD`, uploads again
    /// (standalone, create-if-absent) those a gc deleted, and looks again. A gc that begins
    /// after the last look lists these objects as young and keeps them.
    pub(super) fn settle(mut self, repo: &Repo, remote: &dyn Remote, relied: &[ObjectId]) -> Result<()> {
        loop {
            wait_for_gcs(remote, GC_WAIT, "the upload", &|| Ok(()), &|line| repo.progress().note(line))?;
            let generation = gc_generation(remote)?;
            if !self.gc_was_running && generation == self.generation {
                return Ok(());
            }
            self = GcWatch { generation, gc_was_running: false };
            let gone = std::sync::Mutex::new(Vec::new());
            parallel(relied, 16, |id| {
                if remote.modified(&remote::object_key(id))?.is_none() {
                    gone.lock().unwrap_or_else(|e| e.into_inner()).push(*id);
                }
                Ok(())
            })?;
            // In `relied`'s order, so a reference goes up before a delta on it.
            let gone: HashSet<ObjectId> = gone.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().collect();
            for id in relied.iter().filter(|id| gone.contains(id)) {
                upload_standalone(repo, remote, id)?;
            }
        }
    }
}

/// After an upload of object `id` found it on `remote` already: if it is not fresh
/// ([`is_fresh`]; gc may count it as garbage), it is replaced by a standalone encoding,
/// which gives it a new age. Returns the bytes that went up (0: it was fresh).
pub(super) fn keep_found(repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<u64> {
    let key = remote::object_key(id);
    match remote.modified(&key)? {
        Some(m) if is_fresh(m, SystemTime::now()) => return Ok(0),
        _ => {}
    }
    let (tmp, len) = standalone_form(repo, remote, id)?;
    with_retries(|| Ok(remote.replace(&key, tmp.as_file(), tmp.path(), len)?))?;
    Ok(len)
}

/// Uploads object `id` standalone, create-if-absent: what a writer sends again after a gc
/// deleted it ([`GcWatch::settle`]), whatever form it has here now.
fn upload_standalone(repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<()> {
    let (tmp, len) = standalone_form(repo, remote, id)?;
    let key = remote::object_key(id);
    with_retries(|| Ok(remote.upload(&key, tmp.as_file(), tmp.path(), len, UploadMode::CreateOnly)?))?;
    Ok(())
}

/// Object `id` in a standalone form, in a temp file, for `remote`: a copy of the object
/// file if it is one (a manifest, a version, a standalone blob), else the blob decoded
/// through its chain and coded whole. A standalone form references nothing, so writing it
/// over any form closes no reference cycle. The object is verified here first (coding
/// takes the content as given): a damaged one is an error and nothing is written.
pub(super) fn standalone_form(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
) -> Result<(tempfile::NamedTempFile, u64)> {
    let bad = repo.damaged(&[*id])?;
    if !bad.is_empty() {
        return Err(Error::DamagedHere { remote: remote.url().to_string(), objects: bad });
    }
    let header = repo.store().header(id)?;
    if header.kind == ObjectKind::Blob && header.reference.is_some() {
        let chain = repo.store().open_blob(id)?;
        return Ok(repo.store().encode_standalone_for_transfer(&chain, &repo.config().codec_options())?);
    }
    let path = repo.store().object_path(id);
    let io = |action| {
        let path = path.clone();
        move |source| Error::Io { action, path, source }
    };
    let tmp = repo.store().receive_file()?;
    let mut from = std::fs::File::open(&path).map_err(io("opening"))?;
    let len = std::io::copy(&mut from, &mut tmp.as_file()).map_err(io("copying"))?;
    Ok((tmp, len))
}

/// A running gc's record on the remote (`gc/run-<32 hex>`, [`GC_RECORDS`]): written before the
/// generation is increased and the objects listed, rewritten every [`GC_BEAT`] ([`GcRecord::beat`],
/// called during the walk and before every delete), deleted when the gc ends, by
/// [`GcRecord::finish`] or, on an error, when dropped. A killed gc's record stops changing, so
/// writers and the next gc take it as dead after watching it for [`GC_DEAD_AFTER`].
pub(super) struct GcRecord<'a> {
    remote: &'a dyn Remote,
    /// Its key (`None`: a dry run, which writes no record).
    pub(super) key: Option<String>,
    /// The last successful rewrite.
    beat: Mutex<Moment>,
}

impl<'a> GcRecord<'a> {
    /// Waits for running gcs (at most [`GC_WAIT`]), deletes dead ones' records, writes this
    /// gc's record and increases the generation (none of that for a dry run, which deletes
    /// nothing). Two gcs that began at once each see the other's record afterwards: both stop.
    pub(super) fn announce(
        remote: &'a dyn Remote,
        dry_run: bool,
        interrupted: &dyn Fn() -> Result<()>,
        note: &dyn Fn(&str),
    ) -> Result<GcRecord<'a>> {
        if dry_run {
            return Ok(GcRecord { remote, key: None, beat: Mutex::new(Moment::now()) });
        }
        for dead in wait_for_gcs(remote, GC_WAIT, "this gc", interrupted, note)? {
            remote.delete(&dead)?;
        }
        let seed = format!("{:?} {} {:?}", SystemTime::now(), std::process::id(), std::thread::current().id());
        let hex = ObjectId::hash(seed.as_bytes()).to_hex();
        let key = format!("{GC_RECORDS}run-{}", &hex[..32]);
        remote.put_small(&key, &record_text(0), &Expect::Absent)?;
        let record = GcRecord { remote, key: Some(key.clone()), beat: Mutex::new(Moment::now()) };
        // The generation, by compare-and-swap (another gc's increase in between: read again).
        loop {
            let current = remote.get_small(GC_GENERATION)?;
            let n: u64 =
                current.as_ref().and_then(|s| std::str::from_utf8(&s.bytes).ok()?.trim().parse().ok()).unwrap_or(0);
            let expect = current.map_or(Expect::Absent, |s| Expect::Tag(s.tag));
            match remote.put_small(GC_GENERATION, format!("{}\n", n + 1).as_bytes(), &expect) {
                Ok(()) => break,
                Err(remote::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(other) = gc_records(remote)?.iter().find(|l| l.key != key) {
            return Err(Error::RemoteGc {
                remote: remote.url().to_string(),
                reason: format!("another ckpt gc --remote began at the same time ({}); run it again later", other.key),
            });
        }
        Ok(record)
    }

    /// Rewrites the record if [`GC_BEAT`] has passed since the last rewrite; an error if more
    /// than [`GC_BEAT_LAPSE`] has (the machine slept or stalled: writers may have taken this gc
    /// for dead, so it must not delete any more).
    pub(super) fn beat(&self) -> Result<()> {
        let Some(key) = &self.key else { return Ok(()) };
        let mut last = self.beat.lock().unwrap_or_else(|e| e.into_inner());
        let since = last.elapsed();
        if since >= GC_BEAT_LAPSE {
            return Err(Error::RemoteGc {
                remote: self.remote.url().to_string(),
                reason: format!(
                    "stopped: its record went {} s without a rewrite (the machine slept or stalled), so \
                     writers may have taken it for dead; run it again",
                    since.as_secs()
                ),
            });
        }
        if since >= GC_BEAT {
            let mut tmp = tempfile::NamedTempFile::new().map_err(|e| Error::Io {
                action: "creating",
                path: std::env::temp_dir(),
                source: e,
            })?;
            // Timed from before the write: a write that took long leaves less time, not more.
            let sent = Moment::now();
            let text = record_text(since.as_secs());
            std::io::Write::write_all(&mut tmp, &text).map_err(|e| Error::Io {
                action: "writing",
                path: tmp.path().into(),
                source: e,
            })?;
            self.remote.replace(key, tmp.as_file(), tmp.path(), text.len() as u64)?;
            *last = sent;
        }
        Ok(())
    }

    /// Deletes the record: every delete of this gc has been answered.
    pub(super) fn finish(mut self, remote: &dyn Remote) -> Result<()> {
        if let Some(key) = self.key.take() {
            remote.delete(&key)?;
        }
        Ok(())
    }
}

/// The text of a gc record (it changes with each rewrite, so that its age does).
fn record_text(beat: u64) -> Vec<u8> {
    format!(
        "ckpt gc --remote running (pid {}, beat {beat}); writers that counted on objects wait for it\n",
        std::process::id()
    )
    .into_bytes()
}

impl Drop for GcRecord<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let _ = self.remote.delete(&key);
        }
    }
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
