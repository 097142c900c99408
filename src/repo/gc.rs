//! `gc`: deletes every object that no root reaches ([`Repo::roots`]: every ref in any namespace
//! under `refs/`, remote-tracking refs included, a detached `HEAD`, a partial clone's cut
//! versions and the versions pending delta rewrites), keeping every blob a kept delta is coded
//! against (transitively). The working tree's stat records whose content it deletes are
//! forgotten first (docs/format.md, "What gc keeps"). Marking must read every reachable version and
//! manifest and every reachable blob's header; if any of them cannot be read, gc stops before
//! deleting anything, since it cannot know what the unreadable object needs.
//!
//! Unreferenced objects younger than the grace period ([`GcOptions::grace`], the config's
//! `gc_grace_seconds`, one hour by default) are kept: they may belong to a save in flight, whose
//! writers store objects before any version names them (the ranks of a distributed save, which
//! take no lock; a `git add` before git writes its index). A writer that reuses an existing
//! object renews its mtime ([`crate::store::Store::contains_fresh`]), so the period counts from
//! the last use. A save that announces itself ([`Repo::begin_save`], `saves.rs`) is protected
//! beyond that: everything written since a live save began is kept, whatever the grace period.
//! Temp files of interrupted writes are kept as long. An object kept for its age
//! keeps what it is coded against, and the sweep deletes deltas before their references, so no
//! delta is ever left without its reference (which `verify` would report as damage).

use super::partial::HistoryCuts;
use super::{Error, RefKind, Repo, Result, Version, VersionId};
use crate::object_id::ObjectId;
use crate::store::ObjectKind;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// How `gc` treats objects nothing references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcOptions {
    /// Unreferenced objects (and temp files) younger than this are kept.
    pub grace: Duration,
}

impl GcOptions {
    /// No grace: every unreferenced object goes (`ckpt gc --prune=now`). Only safe when no
    /// save is in flight.
    pub fn now() -> GcOptions {
        GcOptions { grace: Duration::ZERO }
    }
}

/// Parses a grace period as `ckpt gc --prune` takes it: `now`, or a number with an optional
/// unit `s`, `m`, `h`, `d` or `w` (seconds without one): `90`, `30m`, `2h`, `1.5d`.
pub fn parse_grace(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "now" {
        return Some(Duration::ZERO);
    }
    let (number, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let scale = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86400.0,
        'w' => 7.0 * 86400.0,
        _ => return None,
    };
    let n: f64 = number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    Duration::try_from_secs_f64(n * scale).ok()
}

/// What `gc` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Versions reachable from refs.
    pub versions: usize,
    /// Objects kept.
    pub kept: usize,
    /// Objects deleted.
    pub deleted: usize,
    /// Bytes of the deleted object files.
    pub bytes_freed: u64,
    /// Leftover temp files of interrupted writes deleted.
    pub temp_files: usize,
    /// Unreferenced objects kept because they are younger than the grace period.
    pub recent: usize,
    /// The grace period, in seconds.
    pub grace_seconds: u64,
    /// Saves in flight (live records in `.ckpt/saves/`): unreferenced objects written since the
    /// oldest one began are kept whatever their age (counted in `recent`).
    pub saves_in_flight: usize,
}

/// The grace period one gc applies, with the save records it was lengthened for.
#[derive(Clone, Copy, Debug)]
struct Grace {
    /// Unreferenced objects and temp files younger than this are kept.
    period: Duration,
    /// Live save records.
    saves: usize,
}

/// What `Repo::gc_keeping` did or, with `dry_run`, would do.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KeepReport {
    /// Files kept (live manifests present in the store).
    pub files_kept: usize,
    /// Live manifests named that the store does not hold (nothing to keep for them).
    pub files_missing: usize,
    /// Objects kept.
    pub kept: usize,
    /// Objects deleted (or that would be).
    pub deleted: usize,
    /// Bytes of those object files.
    pub bytes_freed: u64,
    /// Unreferenced objects kept because they are younger than the grace period.
    pub recent: usize,
    /// Whether nothing was deleted on purpose.
    pub dry_run: bool,
    /// The git repositories (common directories) whose live files were kept (set by the
    /// caller: `ckpt git gc` reads every user of a shared store).
    pub repositories: Vec<String>,
    /// Registered users of the store that no longer use it, or were missing for longer than
    /// the git filter's grace period, forgotten.
    pub pruned: Vec<String>,
    /// Registered users of the store whose path does not exist: every file the store holds is
    /// kept for them until they are forgotten.
    pub missing: Vec<MissingRepository>,
    /// Files (manifests) kept only because a registered user is missing.
    pub kept_for_missing: usize,
}

/// A registered user of a shared store that `ckpt git gc` did not find (set by the caller).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MissingRepository {
    /// Its git common directory, as registered.
    pub path: String,
    /// When a gc first found it missing (seconds since the Unix epoch).
    pub missing_since: u64,
    /// When a gc forgets it if it is still missing (seconds since the Unix epoch).
    pub forgotten_after: u64,
}

impl Repo {
    /// Every root's version ([`Repo::roots`]: refs of every namespace, a detached `HEAD`, the
    /// records that name versions); the first root that cannot be read is the error.
    pub(super) fn ref_roots(&self) -> Result<Vec<VersionId>> {
        self.roots().into_iter().map(|r| r.map(|r| r.id)).collect()
    }

    /// The set of objects reachable from the roots, the number of versions among them, and the
    /// file hashes those versions hold.
    fn mark(&self) -> Result<(HashSet<ObjectId>, usize, HashSet<ObjectId>)> {
        self.mark_from(&self.ref_roots()?, &self.cut_versions()?, &HashSet::new())
    }

    /// [`Self::mark`] from `roots`, with history ending at `cut` and the blobs `whole` taken
    /// as standalone.
    fn mark_from(
        &self,
        roots: &[VersionId],
        cut: &HistoryCuts,
        whole: &HashSet<ObjectId>,
    ) -> Result<(HashSet<ObjectId>, usize, HashSet<ObjectId>)> {
        let needed = self.reachable_with_cuts(roots, cut, whole)?;
        let mut versions = 0;
        let mut held = HashSet::new();
        for n in needed.iter().filter(|n| n.kind == ObjectKind::Version) {
            versions += 1;
            held.extend(self.version(&n.id)?.files.into_iter().map(|f| f.hash));
        }
        Ok((needed.into_iter().map(|n| n.id).collect(), versions, held))
    }

    /// Forgets the working-file identities (index `stat` records) whose content no kept version
    /// holds. A record lets `checkout` and `switch` overwrite a file without reading it because
    /// its content is in the store; once gc deletes that content, the file may be its only copy,
    /// so it must count as modified again (and be hashed) instead. Runs before anything is
    /// deleted: a record that cannot be forgotten stops gc.
    fn forget_stats_of_deleted_content(&self, held: &HashSet<ObjectId>) -> Result<()> {
        let Some(ix) = self.index() else { return Ok(()) };
        for (path, record) in ix.stats()? {
            if !held.contains(&record.hash) {
                ix.remove_stat(&path)?;
            }
        }
        Ok(ix.flush()?)
    }

    /// The grace period the config sets (`gc_grace_seconds`).
    pub fn gc_options(&self) -> GcOptions {
        GcOptions { grace: Duration::from_secs(self.config.gc_grace_seconds) }
    }

    /// Deletes unreachable objects and leftover temp files older than the configured grace
    /// period ([`Repo::gc_with`]).
    pub fn gc(&self) -> Result<GcReport> {
        self.gc_with(&self.gc_options())
    }

    /// Deletes unreachable objects and leftover temp files older than `options.grace`.
    pub fn gc_with(&self, options: &GcOptions) -> Result<GcReport> {
        let _lock = self.lock()?;
        self.gc_locked(options, &HashSet::new())
    }

    /// [`Self::gc_with`] with the writer lock held. Unreferenced objects in `whatever_age`
    /// go even when younger than the grace period (the versions a prune dropped: no save in
    /// flight can be writing those).
    pub(super) fn gc_locked(&self, options: &GcOptions, whatever_age: &HashSet<ObjectId>) -> Result<GcReport> {
        let judged = std::time::SystemTime::now();
        // Dead save records go here, under the lock.
        let grace = self.grace_with_saves(options.grace, true);
        let (reachable, versions, held) = self.mark()?;
        let (doomed, mut report) = self.doomed(&reachable, versions, options, grace, whatever_age)?;
        self.forget_stats_of_deleted_content(&held)?;
        let (freed, deleted) = self.sweep(&doomed, judged)?;
        report.bytes_freed = freed;
        report.kept += report.deleted - deleted;
        report.deleted = deleted;
        report.temp_files = self.store.clean_tmp(grace.period)? + self.clean_stale_checkout_staging();
        self.flush_index();
        Ok(report)
    }

    /// What gc would delete when the objects `reachable` (`versions` versions) are kept, and
    /// the report of it (nothing deleted yet, no temp file counted).
    fn doomed(
        &self,
        reachable: &HashSet<ObjectId>,
        versions: usize,
        options: &GcOptions,
        grace: Grace,
        whatever_age: &HashSet<ObjectId>,
    ) -> Result<(Vec<ObjectId>, GcReport)> {
        let all = self.store.list()?;
        let unreferenced: Vec<ObjectId> = all.iter().filter(|id| !reachable.contains(id)).copied().collect();
        let unreferenced_ids = unreferenced.clone();
        let (aged, mut doomed): (Vec<ObjectId>, Vec<ObjectId>) =
            unreferenced.into_iter().partition(|id| !whatever_age.contains(id));
        let (old, mut recent) = self.past_grace(aged, grace.period);
        doomed.extend(old);
        recent += self.keep_references_of_young(&unreferenced_ids, &mut doomed);
        let report = GcReport {
            versions,
            kept: all.len() - doomed.len(),
            recent,
            grace_seconds: options.grace.as_secs(),
            saves_in_flight: grace.saves,
            bytes_freed: doomed.iter().map(|id| self.store.stored_len(id).unwrap_or(0)).sum(),
            deleted: doomed.len(),
            ..GcReport::default()
        };
        Ok((doomed, report))
    }

    /// Takes out of `doomed` every object that an unreferenced object kept for its age (one of
    /// `unreferenced` not in `doomed`) is coded against, transitively: a delta rewritten after
    /// its reference was written is younger than it, and no sweep may leave a delta without
    /// its reference. Returns how many were taken out.
    fn keep_references_of_young(&self, unreferenced: &[ObjectId], doomed: &mut Vec<ObjectId>) -> usize {
        if unreferenced.len() == doomed.len() {
            return 0;
        }
        let doomed_set: HashSet<ObjectId> = doomed.iter().copied().collect();
        let mut chained = HashSet::new();
        for id in unreferenced.iter().filter(|id| !doomed_set.contains(id)) {
            let mut next = self.reference_of(id);
            while let Some(r) = next.filter(|r| doomed_set.contains(r) && chained.insert(*r)) {
                next = self.reference_of(&r);
            }
        }
        doomed.retain(|id| !chained.contains(id));
        chained.len()
    }

    /// What [`Self::gc_locked`] would delete if `roots` were the roots, history ended at
    /// `cut` and the blobs `whole` were standalone: nothing is deleted (a dry run of a prune).
    pub(super) fn gc_preview(
        &self,
        roots: &[VersionId],
        cut: &HistoryCuts,
        whole: &HashSet<ObjectId>,
        options: &GcOptions,
        whatever_age: &HashSet<ObjectId>,
    ) -> Result<GcReport> {
        let (reachable, versions, _) = self.mark_from(roots, cut, whole)?;
        let grace = self.grace_with_saves(options.grace, false);
        Ok(self.doomed(&reachable, versions, options, grace, whatever_age)?.1)
    }

    /// The grace period one gc applies (the save records read once): `grace`, lengthened while
    /// saves are in flight ([`Repo::begin_save`]) to reach back to the oldest one's start (and
    /// a margin for clocks: see `saves.rs`). Dead records are deleted when `delete_dead`.
    fn grace_with_saves(&self, grace: Duration, delete_dead: bool) -> Grace {
        let saves = self.saves_in_flight(delete_dead);
        let period = match saves.keep_since {
            Some(since) => grace.max(std::time::SystemTime::now().duration_since(since).unwrap_or_default()),
            None => grace,
        };
        Grace { period, saves: saves.live }
    }

    /// Splits unreferenced objects into those older than `grace` (returned, to delete) and
    /// the number of younger ones (kept). An object whose age cannot be read is kept.
    fn past_grace(&self, unreferenced: Vec<ObjectId>, grace: Duration) -> (Vec<ObjectId>, usize) {
        if grace.is_zero() {
            return (unreferenced, 0);
        }
        let total = unreferenced.len();
        let old: Vec<ObjectId> =
            unreferenced.into_iter().filter(|id| self.store.age(id).is_ok_and(|age| age >= grace)).collect();
        let recent = total - old.len();
        (old, recent)
    }

    /// Deletes the objects `doomed` (and their index records), reporting progress; returns
    /// the bytes of the deleted object files. The sweep of `gc` and `gc_keeping`.
    ///
    /// An object whose mtime is `judged` or later is spared, with everything it is coded
    /// against: a lockless writer (a rank of a save in flight) found it and renewed it
    /// ([`crate::store::Store::contains_fresh`]) after gc judged it garbage, and counts on it
    /// now. Returns the bytes freed and the objects deleted.
    fn sweep(&self, doomed: &[ObjectId], judged: std::time::SystemTime) -> Result<(u64, usize)> {
        let (mut freed, mut deleted) = (0, 0);
        let mut spared: HashSet<ObjectId> = HashSet::new();
        // Deltas before the blobs they are coded against (deepest chain first, measured along
        // the chain: header depths are a record): a sweep cut short leaves no delta whose
        // reference is gone, which `verify` would report as damage. Unreadable ones first.
        let mut order: Vec<(u32, ObjectId)> =
            doomed.iter().map(|id| (self.store.chain_depth(id).unwrap_or(u32::MAX), *id)).collect();
        order.sort_by(|a, b| b.cmp(a));
        self.progress.start("gc", doomed.len() as u64);
        for (n, id) in order.iter().map(|(_, id)| id).enumerate() {
            // References come after their deltas in `order`, so sparing one in time is possible.
            if spared.contains(id) || self.store.modified(id).is_ok_and(|m| m >= judged) {
                let mut next = Some(*id);
                while let Some(r) = next.filter(|r| spared.insert(*r)) {
                    next = self.reference_of(&r);
                }
                continue;
            }
            let len = self.store.stored_len(id).unwrap_or(0);
            if let Some(ix) = self.index() {
                let _ = ix.remove_object(id);
                let _ = ix.remove_version(id);
            }
            self.store.remove(id)?;
            freed += len;
            deleted += 1;
            self.progress.set(n as u64 + 1);
        }
        self.progress.finish();
        Ok((freed, deleted))
    }

    /// Deletes the staging directories (`.ckpt/tmp/.ckpt-checkout-*`) that a checkout killed
    /// mid-way left behind, once untouched for [`STALE_STAGING`]: checkouts take no lock (they
    /// only read the store), so a younger one may belong to a checkout still writing, whose
    /// every staged file renews the directory's mtime. Best effort: returns how many went.
    fn clean_stale_checkout_staging(&self) -> usize {
        let tmp = self.dir.join("tmp");
        let Ok(entries) = std::fs::read_dir(&tmp) else { return 0 };
        let mut n = 0;
        for entry in entries.flatten() {
            let is_staging = entry.file_name().to_string_lossy().starts_with(".ckpt-checkout-");
            let stale = entry
                .metadata()
                .ok()
                .filter(|m| m.is_dir())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_STAGING);
            if is_staging && stale && std::fs::remove_dir_all(entry.path()).is_ok() {
                n += 1;
            }
        }
        n
    }

    /// Deletes every object of the store that neither the files `live` (manifests: each with
    /// its blobs and their delta chains) nor a tag or branch other than the current one needs
    /// ([`Repo::gc_keeping_with`] with a fixed live set).
    pub(crate) fn gc_keeping(&self, live: &[ObjectId], options: &GcOptions, dry_run: bool) -> Result<KeepReport> {
        self.gc_keeping_with(|| Ok(live.to_vec()), options, dry_run)
    }

    /// Deletes every object of the store that neither the files `live()` returns (manifests:
    /// each with its blobs and their delta chains) nor a tag or branch other than the current
    /// one needs. `live` runs under the writer lock, so no file stored meanwhile can be missed
    /// by it. The current branch's history (the versions [`Repo::store_file`] recorded) is
    /// replaced by one version without parents holding the live files: under the paths the
    /// store's path records (or the current version) give them (so the next content stored
    /// for a path is still coded against its last one), the others under
    /// `gc-kept/<manifest id>`. With `dry_run`, nothing changes and the report says what would
    /// be deleted. Unreferenced objects younger than `options.grace` are kept.
    ///
    /// Marking reads every kept manifest and blob header first; if one cannot be read, nothing
    /// is deleted. Neither the new root version nor anything a ref names is ever deleted, also
    /// when the root's id is one an earlier gc wrote (the same files in the same second).
    pub fn gc_keeping_with<E: From<Error>>(
        &self,
        live: impl FnOnce() -> std::result::Result<Vec<ObjectId>, E>,
        options: &GcOptions,
        dry_run: bool,
    ) -> std::result::Result<KeepReport, E> {
        let mut report = KeepReport { dry_run, ..KeepReport::default() };
        let lock = self.lock()?;
        if !dry_run && self.has_pending_deltas() {
            // Deferred rewrites name versions this gc replaces: done first, while they exist.
            self.compact_locked(&super::CompactOptions::default())?;
        }
        let judged = std::time::SystemTime::now();
        let live = live()?;
        let present: Vec<ObjectId> = {
            let mut seen = HashSet::new();
            live.iter().filter(|m| seen.insert(**m)).filter(|m| self.store.contains(m)).copied().collect()
        };
        report.files_kept = present.len();
        report.files_missing = live.iter().collect::<HashSet<_>>().len() - present.len();

        let head = self.refs.head()?;
        let head_version = self.refs.head_version()?;
        let current_branch = match &head {
            super::Head::Branch(b) => Some(b.clone()),
            super::Head::Detached(_) => None,
        };
        // Roots that stay: everything `gc` keeps (Repo::roots: every ref in any namespace, a
        // detached HEAD, the records) except the current branch, whose history this gc replaces
        // by one version of the live files. A ref that cannot be read stops the gc.
        let current_ref = current_branch.as_ref().map(|b| format!("refs/heads/{b}"));
        let mut roots: Vec<VersionId> = Vec::new();
        for root in self.roots() {
            let root = root?;
            if Some(&root.name) != current_ref.as_ref() {
                roots.push(root.id);
            }
        }
        let mut marked: HashSet<ObjectId> = self.reachable(&roots, &|_| false)?.into_iter().map(|n| n.id).collect();
        marked.extend(self.file_objects(&present)?.into_iter().map(|n| n.id));

        let (root_id, root) = self.live_version(head_version, &present)?;
        // The root is kept whatever its id: two gcs of the same files in the same second
        // build the same root, which the second must not delete under the ref it moves there.
        marked.insert(root_id);
        let all = self.store.list().map_err(Error::from)?;
        let unreferenced: Vec<ObjectId> = all.iter().filter(|id| !marked.contains(id)).copied().collect();
        let grace = self.grace_with_saves(options.grace, false);
        let (mut doomed, mut recent) = self.past_grace(unreferenced.clone(), grace.period);
        recent += self.keep_references_of_young(&unreferenced, &mut doomed);
        report.recent = recent;
        report.kept = all.len() - doomed.len();
        report.deleted = doomed.len();
        report.bytes_freed = doomed.iter().map(|id| self.store.stored_len(id).unwrap_or(0)).sum();
        // The root version itself is kept (it is written below, unless already there).
        if !all.contains(&root_id) {
            report.kept += 1;
        }
        if dry_run {
            return Ok(report);
        }

        // The new root first, then the ref to it, then the deletions: an interruption leaves
        // the old history or the new one, never a ref to a deleted version.
        let written = self
            .store
            .write_data(ObjectKind::Version, &root.to_bytes(), &self.config.codec_options())
            .map_err(Error::from)?;
        self.index_object(&written);
        self.index_version(&written.id, &root);
        match &current_branch {
            Some(b) => self.refs.set(RefKind::Branch, b, &written.id)?,
            None => self.refs.set_head(&super::Head::Detached(written.id))?,
        }
        self.reset_path_records(&written.id, &root)?;
        let (freed, deleted) = self.sweep(&doomed, judged)?;
        report.bytes_freed = freed;
        report.kept += report.deleted - deleted;
        report.deleted = deleted;
        // Rewrites still pending (a failed compaction) for versions now deleted are dropped.
        let pending: Vec<VersionId> = self.pending_deltas()?.into_iter().filter(|v| self.store.contains(v)).collect();
        self.write_pending_deltas(&pending)?;
        self.flush_index();
        drop(lock);
        Ok(report)
    }

    /// The parentless version holding the files `live` (present in the store): each live file
    /// under the paths the path records give it (the version that last stored a path lists it
    /// there) and those of the current version, the others under `gc-kept/<manifest id>` (no
    /// files at all when nothing is live). Returns its id and the version.
    fn live_version(&self, head: Option<VersionId>, live: &[ObjectId]) -> Result<(VersionId, Version)> {
        let live_set: HashSet<ObjectId> = live.iter().copied().collect();
        let mut files: std::collections::BTreeMap<String, super::FileEntry> = std::collections::BTreeMap::new();
        let mut placed = HashSet::new();
        let mut versions: HashMap<VersionId, Version> = HashMap::new();
        let mut candidates: Vec<(String, VersionId)> = self.path_records()?;
        if let Some(h) = head {
            candidates.push((String::new(), h));
        }
        for (path, id) in candidates {
            let v = match versions.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => match self.version(&id) {
                    Ok(v) => e.insert(v),
                    // A record is a hint: one naming an unreadable version places nothing.
                    Err(_) if !path.is_empty() => continue,
                    Err(e) => return Err(e),
                },
            };
            for f in &v.files {
                if (path.is_empty() || f.path == path) && live_set.contains(&f.manifest) && !files.contains_key(&f.path)
                {
                    placed.insert(f.manifest);
                    files.insert(f.path.clone(), f.clone());
                }
            }
        }
        for m in live {
            if placed.insert(*m) {
                let manifest = self.manifest(m)?;
                let path = format!("gc-kept/{m}");
                files.insert(
                    path.clone(),
                    super::FileEntry { path, manifest: *m, len: manifest.len, hash: manifest.hash },
                );
            }
        }
        let files: Vec<super::FileEntry> = files.into_values().collect();
        let version = Version {
            format: super::MODEL_FORMAT,
            parents: Vec::new(),
            time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
            message: "ckpt git gc: the files git still reaches".into(),
            since_base: 0,
            raw_bytes: files.iter().map(|f| f.len).sum(),
            stored_bytes: 0,
            files,
        };
        let id = ObjectId::hash(&version.to_bytes());
        Ok((id, version))
    }
}

/// How long a checkout's staging directory must be untouched before gc takes it for a
/// leftover: far longer than staging one file of any checkpoint takes.
const STALE_STAGING: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::fixtures::{steps_checkpoint as checkpoint, store_with_steps};
    use crate::repo::{CommitOptions, RepoPath};

    #[test]
    fn gc_keeping_deletes_only_what_the_live_files_do_not_need() {
        let dir = tempfile::tempdir().unwrap();
        let (store, files) = store_with_steps(dir.path());
        // A file of another path, not live.
        let spool = dir.path().join("spool");
        let other = checkpoint(9, 0);
        std::fs::write(&spool, &other).unwrap();
        let dead = store
            .store_file(&spool, &RepoPath::parse("other.safetensors").unwrap(), "o", &CommitOptions::default())
            .unwrap();
        let live: Vec<ObjectId> = [&files[0], &files[2]].iter().map(|(f, _)| f.manifest).collect();
        let before = store.store().list().unwrap();
        let dry = store.gc_keeping(&live, &GcOptions::now(), true).unwrap();
        assert_eq!(store.store().list().unwrap(), before);
        let real = store.gc_keeping(&live, &GcOptions::now(), false).unwrap();
        assert_eq!((real.deleted, real.bytes_freed, real.files_kept), (dry.deleted, dry.bytes_freed, 2));
        assert!(!store.store().contains(&dead.manifest));
        assert!(!store.store().contains(&files[1].0.manifest));
        for (f, bytes) in [&files[0], &files[2]] {
            let out = dir.path().join("out");
            store.write_stored_file(&f.manifest, f.len, &f.hash, &out).unwrap();
            assert_eq!(&std::fs::read(&out).unwrap(), bytes);
        }
        assert!(store.verify().unwrap().is_ok(), "store does not verify after gc");
        // The next content of the path is still coded against the last one kept there.
        std::fs::write(&spool, checkpoint(1, 3)).unwrap();
        let path = RepoPath::parse("m.safetensors").unwrap();
        store.store_file(&spool, &path, "s", &CommitOptions::default()).unwrap();
        let m = store.manifest(&files[2].0.manifest).unwrap();
        assert!(m.blobs().any(|b| store.store().header(&b).unwrap().reference.is_some()));
    }
}
