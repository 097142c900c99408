//! Reverse deltas: turning the parent's whole blobs into XOR deltas against a new version's.
//!
//! Under `delta_policy: "reverse"` a commit stores the new version whole. The parent's blobs of
//! the same tensors then become deltas against the new ones ([`Store::rewrite_as_delta_against`],
//! from the store alone: no working file is read). That second coding pass is as costly as the
//! first, so it need not hold up the commit: with `CommitOptions::defer_deltas` the commit
//! records the new version in `.ckpt/pending-deltas` and returns, and [`Repo::compact`] does
//! the rewrites later (`ckpt commit` starts `ckpt compact` in the background, the way git runs
//! `gc --auto` after a commit). Until then the parent stays whole: the store is larger for a
//! while, never wrong.
//!
//! Each rewrite is atomic (temp object, fsync, rename over the old one), and a rewrite whose
//! blob is a delta already is skipped, so an interrupted compaction is simply run again.

use super::bundle::FS_BLOCK;
use super::model::{FileEntry, Version};
use super::{now_secs, Error, Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::{self, DeltaOutcome, Store, Written};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// Versions whose parent's blobs are still to be rewritten as deltas against theirs, a JSON list
/// of version ids, oldest first (docs/format.md, "Repository").
pub(super) const PENDING_FILE: &str = "pending-deltas";

/// Where `ckpt commit` sends the stderr of the background compaction it starts.
pub const COMPACTION_LOG: &str = "compact.log";

/// Bytes of the end of [`COMPACTION_LOG`] that `status` shows.
const COMPACTION_LOG_TAIL: usize = 2000;

/// Settings of [`Repo::compact`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactOptions {
    /// Stop between two rewrites when another writer is waiting for the writer lock (a new
    /// commit), leaving the rest pending. What the background compaction after `ckpt commit`
    /// does, so that it never holds up the next commit for longer than one tensor's rewrite.
    pub yield_to_writers: bool,
}

/// What [`Repo::compact`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    /// Versions whose parent's blobs were processed.
    pub versions: usize,
    /// Blobs rewritten as deltas.
    pub rewritten: usize,
    /// Bytes of the objects rewritten, before.
    pub bytes_before: u64,
    /// Bytes of the objects rewritten, after.
    pub bytes_after: u64,
    /// Versions left pending (a writer was waiting).
    pub pending: usize,
    /// Blobs a save stored uncoded (`Repo::store_piece`), now coded.
    pub coded: usize,
    /// Bytes of those blobs, before.
    pub coded_bytes_before: u64,
    /// Bytes of those blobs, after.
    pub coded_bytes_after: u64,
}

/// One planned rewrite: `older`, a blob of the parent, as a delta against `newer`.
struct Rewrite {
    older: ObjectId,
    newer: ObjectId,
    len: u64,
}

impl Repo {
    /// Rewrites the blobs of the parents of the versions in `.ckpt/pending-deltas` as XOR
    /// deltas against the versions' own blobs, oldest version first (so each rewrite's newer
    /// blob is still whole). Takes the writer lock. Versions that no longer exist are dropped.
    pub fn compact(&self, options: &CompactOptions) -> Result<CompactReport> {
        let _lock = self.lock()?;
        self.compact_locked(options)
    }

    /// [`Self::compact`] with the writer lock held. A failure (a full disk, an unreadable
    /// version) is appended to `.ckpt/compact.log` and returned as [`Error::CompactionFailed`];
    /// the version stays in `.ckpt/pending-deltas`, so the next compaction retries it (the
    /// rewrites it did finish are deltas already and are skipped then). A compaction that leaves
    /// nothing pending empties the log: whatever failed before is done.
    pub(super) fn compact_locked(&self, options: &CompactOptions) -> Result<CompactReport> {
        let mut pending = self.pending_deltas()?;
        let mut report = CompactReport::default();
        let stop = || options.yield_to_writers && self.writer_waiting();
        while let Some(id) = pending.first().copied() {
            if stop() {
                break;
            }
            let finished = self
                .compact_version(&id, &mut report, &stop)
                .and_then(|finished| {
                    if finished {
                        self.write_pending_deltas(&pending[1..])?;
                    }
                    Ok(finished)
                })
                .map_err(|e| self.compaction_failed(&id, e))?;
            if !finished {
                break;
            }
            report.versions += 1;
            pending.remove(0);
        }
        report.pending = pending.len();
        self.flush_index();
        if pending.is_empty() {
            self.clear_compaction_log();
        }
        Ok(report)
    }

    /// Codes the blobs of version `id` that its save stored uncoded, then rewrites the blobs of
    /// its parent as deltas against `id`'s; returns whether every blob was tried (`stop` can
    /// end it early).
    fn compact_version(
        &self,
        id: &VersionId,
        report: &mut CompactReport,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<bool> {
        let v = match self.version(id) {
            Ok(v) => v,
            // Gone (gc of a deleted branch): nothing to rewrite.
            Err(Error::Store(store::Error::Missing { .. })) => return Ok(true),
            Err(e) => return Err(e),
        };
        let parent = v.parents.first().map(|p| self.version(p));
        let changed: Vec<FileEntry> = match &parent {
            Some(Ok(parent)) => v
                .files
                .iter()
                .filter(|f| parent.file(&f.path).is_none_or(|p| p.manifest != f.manifest))
                .cloned()
                .collect(),
            _ => v.files.clone(),
        };
        // The version's own blobs that its save stored uncoded are coded first, so the chains
        // the parent's rewrites start end at coded bases.
        let (coded, finished) =
            self.store.with_background_sync(|store| self.code_uncoded_blobs(store, &changed, stop))?;
        for (w, old_len) in &coded {
            report.coded_bytes_before += old_len;
            report.coded_bytes_after += w.stored_len;
            self.index_object(w);
        }
        report.coded += coded.len();
        let parent = match parent {
            Some(Ok(parent)) if finished => parent,
            // Stopped early; or a root version, or a parent gone (gc): nothing to rewrite.
            _ => return Ok(finished),
        };
        let (rewritten, finished) =
            self.store.with_background_sync(|store| self.rewrite_parent_blobs(store, &changed, &parent, stop))?;
        for (w, old_len) in &rewritten {
            report.bytes_before += old_len;
            report.bytes_after += w.stored_len;
            self.index_object(w);
        }
        report.rewritten += rewritten.len();
        Ok(finished)
    }

    /// Codes, in place (same ids), the blobs of `files` that a save stored uncoded
    /// ([`Repo::store_piece`]: tensors of at least [`super::pieces::PIECE_MIN`] bytes whose
    /// byte groups are all raw). Stops early, between blobs, when `stop` says so. Returns each
    /// object written with the size of the object it replaced, and whether every blob was tried.
    fn code_uncoded_blobs(
        &self,
        store: &Store,
        files: &[FileEntry],
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(Written, u64)>, bool)> {
        let mut seen = HashSet::new();
        let mut plan = Vec::new();
        for f in files {
            let m = self.manifest(&f.manifest)?;
            for s in &m.segments {
                if let (Some(blob), Some(_)) = (s.blob, &s.tensor) {
                    if s.len >= super::pieces::PIECE_MIN as u64 && seen.insert(blob) {
                        plan.push((blob, s.len));
                    }
                }
            }
        }
        let options = self.config.codec_options();
        let stopped = AtomicBool::new(false);
        let written = self.run_sized(
            "code",
            &plan,
            |(_, len)| *len,
            |(blob, _), _| {
                if stopped.load(Ordering::Relaxed) || stop() {
                    stopped.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
                // Damaged or gone: left as it is, as a rewrite leaves it (`rewrite_one`).
                let Ok(chain) = store.open_blob(blob) else { return Ok(None) };
                if !chain.is_uncoded().unwrap_or(false) {
                    return Ok(None);
                }
                let before = chain.stored_len();
                Ok(store.recode_standalone(&chain, &options)?.map(|w| (w, before)))
            },
        )?;
        Ok((written.into_iter().flatten().collect(), !stopped.load(Ordering::Relaxed)))
    }

    /// Records that compacting `version` failed with `error` in `.ckpt/compact.log` (best
    /// effort: on a full disk even that may fail; the error still reaches the caller) and
    /// returns the error to report.
    pub(super) fn compaction_failed(&self, version: &VersionId, error: Error) -> Error {
        if matches!(error, Error::CompactionFailed { .. }) {
            return error;
        }
        let error = Error::CompactionFailed { version: *version, source: Box::new(error) };
        let line = format!("{} {error}\n", now_secs());
        let _ = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.ckpt_dir().join(COMPACTION_LOG))
            .and_then(|mut log| std::io::Write::write_all(&mut log, line.as_bytes()));
        error
    }

    /// Empties `.ckpt/compact.log` (nothing is pending: earlier failures are resolved).
    fn clear_compaction_log(&self) {
        let path = self.ckpt_dir().join(COMPACTION_LOG);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            let _ = std::fs::File::options().write(true).open(&path).and_then(|f| f.set_len(0));
        }
    }

    /// Whether versions wait for their parent's blobs to be rewritten ([`Repo::compact`]).
    pub fn has_pending_deltas(&self) -> bool {
        self.pending_deltas().is_ok_and(|p| !p.is_empty())
    }

    /// The last lines of `.ckpt/compact.log` (compactions that failed since the last one that
    /// left nothing pending, and what background compactions printed on stderr: only errors),
    /// or `None` when it is empty or missing.
    pub fn compaction_log(&self) -> Option<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(self.ckpt_dir().join(COMPACTION_LOG)).ok()?;
        // Only the end is read and shown, however large the file grew.
        file.seek(SeekFrom::End(-(COMPACTION_LOG_TAIL as i64))).or_else(|_| file.seek(SeekFrom::Start(0))).ok()?;
        let mut tail = Vec::with_capacity(COMPACTION_LOG_TAIL);
        file.take(COMPACTION_LOG_TAIL as u64).read_to_end(&mut tail).ok()?;
        let text = String::from_utf8_lossy(&tail).trim().to_string();
        (!text.is_empty()).then_some(text)
    }

    /// Under `reverse`, right after a commit wrote `entries` on top of `parent`: the
    /// compactions left pending first, oldest first (the parent's own may be among them, and
    /// it must still be whole when its turn comes), then `parent`'s blobs as deltas against
    /// the new ones. Returns each object written with the size of the object it replaced.
    pub(super) fn rewrite_parent_now(&self, entries: &[FileEntry], parent: &Version) -> Result<Vec<(Written, u64)>> {
        if self.has_pending_deltas() {
            self.compact_locked(&CompactOptions::default())?;
        }
        Ok(self.store.with_background_sync(|store| self.rewrite_parent_blobs(store, entries, parent, &|| false))?.0)
    }

    /// Leaves version `id` for a later [`Repo::compact`] to rewrite its parent's blobs (and
    /// code the blobs its save stored uncoded): appended to `.ckpt/pending-deltas`.
    pub(super) fn leave_pending(&self, id: &VersionId) -> Result<()> {
        let mut pending = self.pending_deltas()?;
        pending.push(*id);
        self.write_pending_deltas(&pending)
    }

    /// The versions in `.ckpt/pending-deltas`, oldest first.
    pub(super) fn pending_deltas(&self) -> Result<Vec<VersionId>> {
        self.read_list(PENDING_FILE, "pending deltas")
    }

    /// Replaces `.ckpt/pending-deltas` (no fsync: losing the file costs space, not data).
    pub(super) fn write_pending_deltas(&self, pending: &[VersionId]) -> Result<()> {
        self.write_list(PENDING_FILE, pending)
    }

    /// Rewrites each whole blob of `parent` whose tensor `files` (the files a version changed
    /// from `parent`) holds in another whole blob as an XOR delta against that blob, where the
    /// rewrite frees space. The files' own blobs and those of the last pinned version stay
    /// whole; each parent blob is rewritten once. Stops early, between rewrites, when `stop`
    /// says so. Returns each object written with the size of the object it replaced, and
    /// whether every rewrite was tried.
    fn rewrite_parent_blobs(
        &self,
        store: &Store,
        files: &[FileEntry],
        parent: &Version,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<(Written, u64)>, bool)> {
        let mut keep = self.pinned_blobs(parent)?;
        let mut manifests = Vec::new();
        for f in files {
            let m = self.manifest(&f.manifest)?;
            keep.extend(m.blobs());
            manifests.push((f, m));
        }
        let mut claimed = HashSet::new();
        let mut plan = Vec::new();
        // A bundle pairs with the reference file's bundle that starts with the same tensor (the
        // rewrite checks that both have the same length).
        for c in self.counterparts(manifests.iter().map(|(f, m)| (f.path.as_str(), m)), parent) {
            if c.old != c.new && !keep.contains(&c.old) && claimed.insert(c.old) {
                plan.push(Rewrite { older: c.old, newer: c.new, len: c.len });
            }
        }
        let stopped = AtomicBool::new(false);
        let written = self.run_sized(
            "deltas",
            &plan,
            |r| r.len,
            |r, progress| {
                if stopped.load(Ordering::Relaxed) || stop() {
                    stopped.store(true, Ordering::Relaxed);
                    return Ok(None);
                }
                self.rewrite_one(store, r, progress)
            },
        )?;
        Ok((written.into_iter().flatten().collect(), !stopped.load(Ordering::Relaxed)))
    }

    /// One rewrite of [`Self::rewrite_parent_blobs`]: `None` when it does not apply (either blob
    /// is a delta, damaged or of another shape) or frees no file-system block.
    fn rewrite_one(
        &self,
        store: &Store,
        r: &Rewrite,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Option<(Written, u64)>> {
        let (Ok(older), Ok(newer)) = (store.open_blob(&r.older), store.open_blob(&r.newer)) else {
            return Ok(None);
        };
        // A rewrite costs an object write, an fsync pair and a rename; it pays only if the new
        // object frees at least one file-system block. (Most small tensors, biases and norms,
        // are one block either way: in the corpus model 65 of 104 tensors.)
        let blocks = older.stored_len().div_ceil(FS_BLOCK);
        if older.depth() != 0 || newer.depth() != 0 || older.len() != newer.len() || blocks <= 1 {
            return Ok(None);
        }
        // Objects of fewer than `limit` bytes take at most `blocks - 1` blocks.
        let limit = (blocks - 1) * FS_BLOCK + 1;
        match store.rewrite_as_delta_against(&older, &newer, limit, &self.config.codec_options(), progress) {
            Ok(DeltaOutcome::Written(w)) => Ok(Some((w, older.stored_len()))),
            Ok(DeltaOutcome::NotSmaller { .. }) => Ok(None),
            // A damaged blob, or a pair the rewrite refuses (another chunk size since a config
            // change), keeps the older blob as it is; anything else is an error. Not a failure
            // to write (a full disk): skipping that would drop the version from the pending
            // list as if done, and the space would never be reclaimed.
            Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => Ok(None),
            Err(store::Error::Encode { source: crate::codec::Error::InvalidInput(reason), .. })
                if !reason.starts_with("writing") =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}
