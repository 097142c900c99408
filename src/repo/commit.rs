//! `commit`: files → blobs (deduplicated, delta-coded where it pays) → manifests → version →
//! ref. All inputs are parsed before anything is written, so an invalid file changes nothing.

use super::layout::{manifest_of, HashedBundle, HashedSegment, HashedSegments, Input, Rules};
use super::model::{FileEntry, Version, MODEL_FORMAT};
use super::pairing::{precision_key, PrecisionIndex, ReferenceFiles, TensorBlobs};
use super::status::now_ns;
use super::{now_secs, DeltaPolicy, Error, Head, RefKind, Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::{
    self, BlobForm, DeltaOutcome, DerivedBlob, DerivedTarget, Feedback, ObjectKind, SourceBytes, Store, Written,
};
use crate::Dtype;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Settings of one commit. `Default` takes everything from the repository config.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit time in seconds since the Unix epoch (default: now).
    pub time: Option<i64>,
    /// Overrides the config's `delta_policy`.
    pub delta_policy: Option<DeltaPolicy>,
    /// Overrides the config's `base_every`.
    pub base_every: Option<u32>,
    /// With the `reverse` delta policy: leave the rewrite of the parent's blobs as deltas to
    /// [`Repo::compact`] (recorded in `.ckpt/pending-deltas`) instead of doing it before
    /// returning. The commit then costs one coding pass instead of two; `ckpt commit` runs the
    /// compaction in a background process.
    pub defer_deltas: bool,
}

impl Repo {
    /// Commits `paths` (absolute, or relative to the repository root) as a new version on top
    /// of `HEAD`, with every file of the parent version that is not named again and not
    /// `rm`-ed. A directory stands for every file under it, as it is now: files the parent
    /// version tracked under it that are gone are dropped (`git add DIR` does the same), so a
    /// DCP checkpoint saved again on fewer ranks leaves no stale rank file
    /// (`.ckpt` and `.git` skipped; a link to a directory refused). Returns the new version's id.
    ///
    /// Files named `*.safetensors` must be valid safetensors; other files are stored tensor by
    /// tensor if they parse as safetensors, storage by storage if they are `torch.save` archives
    /// ([`crate::torch_zip`]), and as opaque bytes otherwise.
    pub fn commit<P: AsRef<Path>>(&self, paths: &[P], message: &str, options: &CommitOptions) -> Result<VersionId> {
        let _lock = self.lock()?;
        let (files, dropped) = self.expand_directories(paths)?;
        let inputs = self.read_inputs(&files)?;
        self.commit_inputs_on(inputs, &dropped, message, options, None)
    }

    /// `paths` with each directory replaced by the files under it (sorted; `.ckpt` and `.git`
    /// directories skipped; a symbolic link to a file is the file, as when named, and one to a
    /// directory is refused rather than followed, which could loop or leave the tree), and the
    /// paths `HEAD` tracks under those directories that are no longer there. A directory with
    /// no file under it and none tracked is an error: there is nothing to commit from it.
    fn expand_directories<P: AsRef<Path>>(&self, paths: &[P]) -> Result<(Vec<PathBuf>, Vec<String>)> {
        let mut files = Vec::new();
        let mut dropped = Vec::new();
        let mut head = None;
        for p in paths {
            let p = p.as_ref();
            let absolute = if p.is_absolute() { p.to_path_buf() } else { self.root.join(p) };
            if !std::fs::metadata(&absolute).is_ok_and(|m| m.is_dir()) {
                // Files, and what is not there: `read_input` names the problem.
                files.push(absolute);
                continue;
            }
            let prefix = if std::fs::canonicalize(&absolute).is_ok_and(|c| c == self.root) {
                String::new()
            } else if std::fs::symlink_metadata(&absolute).is_ok_and(|m| m.file_type().is_symlink()) {
                // As inside a directory (`files_under`): its files are not in the working tree.
                return Err(Error::InvalidPath { path: p.to_path_buf(), reason: LINKED_DIRECTORY.into() });
            } else {
                self.repo_path(&absolute)?.to_string()
            };
            let found = files_under(&absolute)?;
            let mut present = HashSet::new();
            for f in &found {
                present.insert(self.repo_path(f)?.to_string());
            }
            if head.is_none() {
                head = Some(self.refs.head_version()?.map(|id| self.version(&id)).transpose()?);
            }
            let tracked_gone: Vec<String> = head
                .iter()
                .flatten()
                .flat_map(|v| v.files_under(&prefix))
                .filter(|f| !present.contains(&f.path))
                .map(|f| f.path.clone())
                .collect();
            if found.is_empty() && tracked_gone.is_empty() {
                return Err(Error::InvalidPath {
                    path: p.to_path_buf(),
                    reason: "a directory with no file under it: nothing to commit".into(),
                });
            }
            files.extend(found);
            dropped.extend(tracked_gone);
        }
        Ok((files, dropped))
    }

    /// [`Self::commit`] of inputs already mapped and parsed, under the writer lock the caller
    /// holds (the git filter stores a spooled file under its logical path this way).
    pub(super) fn commit_inputs(
        &self,
        inputs: Vec<Input>,
        message: &str,
        options: &CommitOptions,
    ) -> Result<VersionId> {
        self.commit_inputs_on(inputs, &[], message, options, None)
    }

    /// [`Self::commit_inputs`], also dropping the parent's files at the paths `dropped`; with `on` (the git filter's store, docs/format.md "The git
    /// filter's store versions"), the new version lists only the inputs, its first parent (what
    /// its deltas and `since_base` follow) is `on`'s version, and `HEAD`'s version, when
    /// another, is its last parent, so that every version stays reachable from the branch.
    pub(super) fn commit_inputs_on(
        &self,
        inputs: Vec<Input>,
        dropped: &[String],
        message: &str,
        options: &CommitOptions,
        on: Option<Option<VersionId>>,
    ) -> Result<VersionId> {
        let policy = options.delta_policy.unwrap_or(self.config.delta_policy);
        // Clamped like the config (`Config::check`), so no caller can make chains the reader refuses.
        let base_every = options.base_every.unwrap_or(self.config.base_every).clamp(1, super::config::MAX_BASE_EVERY);
        let head = self.refs.head()?;
        let head_version = self.refs.head_version()?;
        let parent_id = match on {
            Some(on) => on,
            None => head_version,
        };
        let parent = parent_id.map(|id| self.version(&id)).transpose()?;
        let mut removals = self.pending_removals()?;
        removals.extend(dropped.iter().cloned());
        let mut parents: Vec<VersionId> = parent_id.into_iter().collect();
        if on.is_some() {
            parents.extend(head_version.filter(|h| Some(*h) != parent_id));
        }

        if inputs.is_empty() && removals.is_empty() {
            return Err(Error::NothingToCommit);
        }

        let since_base = match &parent {
            Some(p) if p.since_base + 1 < base_every => p.since_base + 1,
            _ => 0,
        };
        let reference = match (since_base, policy, &parent) {
            (_, _, None) => None,
            // The parent's tensors are what the new ones' deltas are taken of, also when the
            // new version is a pinned base.
            (_, DeltaPolicy::Reverse, Some(p)) => Some(p.clone()),
            (0, _, _) => None,
            (_, DeltaPolicy::Previous, Some(p)) => Some(p.clone()),
            (_, DeltaPolicy::Base, Some(p)) => self.ancestor_since_base(p, 0),
            (s, DeltaPolicy::Skip, Some(p)) => self.ancestor_since_base(p, s & (s - 1)),
        };

        let mut files: BTreeMap<String, FileEntry> = parent
            .iter()
            .filter(|_| on.is_none())
            .flat_map(|p| p.files.iter())
            .map(|f| (f.path.clone(), f.clone()))
            .collect();
        for r in &removals {
            files.remove(r);
        }
        // A version holding both `a` and `a/b` could never be checked out: refused before
        // anything is stored, naming both (one may be kept from the parent).
        let named = inputs.iter().map(|i| i.path.as_str());
        let conflict = if on.is_none() {
            super::path::prefix_conflict(files.keys().map(String::as_str).chain(named))
        } else {
            None
        };
        if let Some((file, under)) = conflict {
            return Err(Error::InvalidPath {
                path: std::path::PathBuf::from(&under),
                reason: format!(
                    "cannot be in the same version as the file {file:?}: {file:?} cannot be both a file and a \
                     directory; stop tracking one of them first (ckpt rm)"
                ),
            });
        }
        // 1. Plan and hash every file.
        let mut references = ReferenceFiles::new(reference.as_ref());
        let hashed: Vec<HashedFile> = inputs
            .iter()
            .map(|input| {
                let reference = references.blobs_for_input(self, input);
                hash_file(input, reference)
            })
            .collect();
        // 2. Store every blob not stored yet (each id once).
        let jobs = self.jobs_to_store(&hashed);
        let derivations = self.plan_derivations(&inputs, &hashed, &files, parent.as_ref());
        // A blob derived from a blob this commit writes is coded right after it, in the same
        // unit of work, from the same input bytes (pages still in the cache): it needs how its
        // reference was stored (chunk size, depth), not its content from the store.
        let units = derivations.units(&jobs, &hashed);
        // 2 and 3 write through a view of the store that fsyncs and renames the objects on
        // other threads while the next ones are coded; it returns once all are durable, before
        // the version that points to them is written.
        let deltas = if policy == DeltaPolicy::Reverse { None } else { Some(base_every) };
        // Derived blobs whose reference this commit writes are coded in the same pass but
        // stored only once it is durable (below): a crash in between must not leave one whose
        // reference is missing, which a later commit would deduplicate against.
        let unsynced = Mutex::new(Vec::new());
        let stored = self.store.with_background_sync(|store| {
            let blobs = self.store_units(store, &inputs, &hashed, &units, deltas, &derivations, &unsynced)?;
            // 3. Manifests.
            let mut manifests = Vec::new();
            let mut entries = Vec::new();
            for (input, h) in inputs.iter().zip(&hashed) {
                let (entry, w) = self
                    .write_manifest(store, input, h)
                    .map_err(|e| Error::File { path: input.path.to_string(), source: Box::new(e) })?;
                manifests.extend(w);
                entries.push(entry);
            }
            Ok::<_, Error>((blobs.into_iter().chain(manifests).collect::<Vec<_>>(), entries))
        });
        // Every input is read by now. One that changed meanwhile (a training loop rewriting it
        // with O_TRUNC) fails the commit here, before any ref moves: the objects written from it
        // are complete but unreferenced (gc deletes them), and a retry reads the file anew.
        // Checked before the store's own error, which such a change may have caused.
        if let Some(changed) = inputs.iter().position(|i| i.check_unchanged().is_err()) {
            // The blobs this commit wrote from a changed file may hold other bytes than their id
            // says: the id (blake3) and the xxh3 the store checks the coded bytes against are
            // taken in one pass but are two reads of the map, which a concurrent rewrite can
            // tell apart. They are removed, so that no later commit deduplicates against them.
            // (Jobs name only objects that were not stored before this commit, which holds the
            // writer lock; nothing refers to them yet.)
            let mut removed = HashSet::new();
            for job in jobs.iter().filter(|j| inputs[j.file].check_unchanged().is_err()) {
                let id = hashed[job.file].id_of(job.target);
                let _ = self.store.remove(&id);
                removed.insert(id);
            }
            // A blob derived from a removed one would be left without its reference, and a
            // later commit would deduplicate against it. One predicted from the bytes of a file
            // that changed (its reference may be stored, even from an earlier commit) has a
            // residual against other bytes than its reference's: it would decode to other bytes
            // than its id says.
            let changed_source = |j: &Job| {
                derivations.at_hand_source(j).is_some_and(|(file, _)| inputs[file].check_unchanged().is_err())
            };
            let dangling = |j: &Job| derivations.source_of(j).is_some_and(|s| removed.contains(&s));
            for job in jobs.iter().filter(|j| dangling(j) || changed_source(j)) {
                let _ = self.store.remove(&hashed[job.file].id_of(job.target));
            }
            return Err(Error::FileChanged { path: inputs[changed].path.to_string() });
        }
        let (mut objects, entries) = stored?;
        // Every input was unchanged up to here, so these were predicted from their
        // references' content; their references are durable now.
        let unsynced = unsynced.into_inner().unwrap_or_else(|p| p.into_inner());
        self.store.with_background_sync(|store| unsynced.into_iter().try_for_each(|d| store.keep(d).map(drop)))?;
        // Reverse deltas: the parent's blobs become deltas against the new ones, now durable,
        // here or (deferred) in a later `compact`.
        let mut replaced_len = 0;
        // (Only tensors are rewritten: a commit of opaque files leaves nothing to do.)
        let reverse_parent = parent.as_ref().filter(|_| {
            policy == DeltaPolicy::Reverse
                && base_every >= 2
                && inputs.iter().any(|i| i.header.is_some() || i.torch.is_some())
        });
        let mut compaction_error = None;
        if let (Some(p), false) = (reverse_parent, options.defer_deltas) {
            let rewrites = || {
                // Deferred rewrites first, oldest first: the parent's own may be among them, and
                // it must still be whole when its turn comes.
                if self.has_pending_deltas() {
                    self.compact_locked(&super::CompactOptions::default())?;
                }
                Ok::<_, Error>(
                    self.store
                        .with_background_sync(|store| self.rewrite_parent_blobs(store, &entries, p, &|| false))?
                        .0,
                )
            };
            match rewrites() {
                Ok(rewritten) => {
                    for (w, old_len) in rewritten {
                        replaced_len += old_len;
                        objects.push(w);
                    }
                }
                // The version itself is complete and durable: it is committed anyway, with the
                // parent left whole and this version pending (below), as a deferred commit
                // leaves it; the failure is recorded once the version has an id.
                Err(e) => compaction_error = Some(e),
            }
        }
        for w in &objects {
            self.index_object(w);
        }
        for entry in entries {
            files.insert(entry.path.clone(), entry);
        }

        let files: Vec<FileEntry> = files.into_values().collect();
        let version = Version {
            format: MODEL_FORMAT,
            parents,
            time: options.time.unwrap_or_else(now_secs),
            message: message.to_string(),
            since_base,
            raw_bytes: files.iter().map(|f| f.len).sum(),
            // What the store grew by: rewritten objects replace larger ones.
            stored_bytes: objects.iter().map(|w| w.stored_len).sum::<u64>().saturating_sub(replaced_len),
            files,
        };
        version.check_limits().map_err(|reason| Error::OverLimit { what: "the version".into(), reason })?;
        let written = self.store.write_data(ObjectKind::Version, &version.to_bytes(), &self.config.codec_options())?;
        self.index_object(&written);
        self.index_version(&written.id, &version);
        // The ref moves last: until here, the new objects are unreferenced.
        match head {
            Head::Branch(b) => self.refs.set(RefKind::Branch, &b, &written.id)?,
            Head::Detached(_) => self.refs.set_head(&Head::Detached(written.id))?,
        }
        if reverse_parent.is_some() && (options.defer_deltas || compaction_error.is_some()) {
            let mut pending = self.pending_deltas()?;
            pending.push(written.id);
            self.write_pending_deltas(&pending)?;
        }
        if let Some(e) = compaction_error {
            // Reported through `.ckpt/compact.log` and the pending list (`ckpt commit` warns);
            // the commit succeeded.
            let _ = self.compaction_failed(&written.id, e);
        }
        self.write_removals(&[])?;
        self.record_stats(&inputs, &version);
        self.flush_index();
        Ok(written.id)
    }

    /// Maps and parses every input; fails on the first invalid one before anything is stored.
    fn read_inputs<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<Input>> {
        let mut seen = HashSet::new();
        let mut inputs = Vec::new();
        for p in paths {
            let path = self.repo_path(p.as_ref())?;
            if !seen.insert(path.clone()) {
                continue;
            }
            inputs.push(self.read_input(p.as_ref())?);
        }
        Ok(inputs)
    }

    /// Maps and parses the file at `p` (absolute, or relative to the repository root). A named
    /// pipe, socket or device is refused before anything blocks on it (the writer lock is held),
    /// and so is a path beyond a symbolic link to a directory (git's rule: a later `switch`
    /// would delete, and a checkout write, wherever the link leads).
    pub(super) fn read_input(&self, p: &Path) -> Result<Input> {
        let path = self.repo_path(p)?;
        path.refuse_beyond_symlink(&self.root, "tracked")?;
        let abs = path.under(&self.root);
        Input::open(&abs, path, Rules::Commit)
    }

    /// The version at or before `v` along first parents that is `target` versions after its
    /// full base (`since_base == target`; 0: the full base itself). `since_base` drops by exactly
    /// one per first parent in a history ckpt wrote; any other step (a version written by
    /// something else) ends the walk with `None`, which means no delta, after at most
    /// `v.since_base - target` steps.
    fn ancestor_since_base(&self, v: &Version, target: u32) -> Option<Version> {
        if v.since_base <= target {
            return (v.since_base == target).then(|| v.clone());
        }
        let mut since = v.since_base;
        let mut id = *v.parents.first()?;
        loop {
            let (s, parent) = self.since_base_step(&id)?;
            if s + 1 != since {
                return None;
            }
            since = s;
            if since == target {
                return self.version(&id).ok();
            }
            id = parent?;
        }
    }

    /// `since_base` and first parent of version `id` (cached: see `Repo::since_base_walk`).
    fn since_base_step(&self, id: &VersionId) -> Option<(u32, Option<VersionId>)> {
        if let Some(step) = self.since_base_walk.lock().ok().and_then(|c| c.get(id).copied()) {
            return Some(step);
        }
        let v = self.version(id).ok()?;
        let step = (v.since_base, v.parents.first().copied());
        if let Ok(mut cache) = self.since_base_walk.lock() {
            // A bound on memory for a process that lives long (about 100 bytes an entry).
            if cache.len() >= 1 << 16 {
                cache.clear();
            }
            cache.insert(*id, step);
        }
        Some(step)
    }

    /// Stores the blobs of `jobs` in `store`, as deltas where `deltas` (the `base_every` that
    /// bounds their chains) allows it and they pay. Returns the objects written.
    pub(super) fn store_blobs(
        &self,
        store: &Store,
        inputs: &[Input],
        hashed: &[HashedFile],
        jobs: &[Job],
        deltas: Option<u32>,
    ) -> Result<Vec<Written>> {
        let units = Derivations::default().units(jobs, hashed);
        self.store_units(store, inputs, hashed, &units, deltas, &Derivations::default(), &Mutex::new(Vec::new()))
    }

    /// [`Self::store_blobs`] of every job of `units`, deriving the blobs `derivations` names
    /// from their cross-precision references where that pays: from the reference's bytes in
    /// the inputs when it is a tensor of this commit, else decoded from the store. A derived
    /// blob whose reference is written in the same unit is coded, not stored: it goes to
    /// `unsynced` for the caller to store once its reference is durable (its object is among
    /// those returned).
    #[allow(clippy::too_many_arguments)]
    fn store_units(
        &self,
        store: &Store,
        inputs: &[Input],
        hashed: &[HashedFile],
        units: &[Vec<Job>],
        deltas: Option<u32>,
        derivations: &Derivations,
        unsynced: &Mutex<Vec<DerivedBlob>>,
    ) -> Result<Vec<Written>> {
        let job_len = |j: &Job| hashed[j.file].len_of(j.target);
        let written = self.run_sized(
            "commit",
            units,
            |u| u.iter().map(job_len).sum(),
            |unit, progress| {
                // How the unit's blobs were stored, for the blobs derived from them after.
                let mut forms: HashMap<ObjectId, BlobForm> = HashMap::new();
                let mut written = Vec::with_capacity(unit.len());
                let mut done = 0;
                for job in unit {
                    let offset = done;
                    let progress = |n: u64| progress(offset + n);
                    let path = || inputs[job.file].path.to_string();
                    let (w, form) = self
                        .store_job(store, inputs, hashed, job, deltas, derivations, &forms, unsynced, &progress)
                        .map_err(|e| match e {
                            Error::Store(store::Error::ChangedWhileWriting { .. }) => {
                                Error::FileChanged { path: path() }
                            }
                            other => Error::File { path: path(), source: Box::new(other) },
                        })?;
                    if unit.len() > 1 {
                        forms.insert(w.id, form);
                    }
                    written.push(w);
                    done += job_len(job);
                }
                Ok(written)
            },
        )?;
        Ok(written.into_iter().flatten().collect())
    }

    /// Stores the blob of `job` (see [`Self::store_units`]); `forms` holds how the blobs stored
    /// before it in its unit were stored. Returns the object written and the form of its blob.
    #[allow(clippy::too_many_arguments)]
    fn store_job(
        &self,
        store: &Store,
        inputs: &[Input],
        hashed: &[HashedFile],
        job: &Job,
        deltas: Option<u32>,
        derivations: &Derivations,
        forms: &HashMap<ObjectId, BlobForm>,
        unsynced: &Mutex<Vec<DerivedBlob>>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(Written, BlobForm)> {
        let h = &hashed[job.file];
        match job.target {
            Target::Segment(s) => {
                let seg = &h.segments[s];
                let reference = deltas.and_then(|base_every| Some((h.reference_of(s)?, base_every)));
                let bytes = &inputs[job.file].map[seg.range.start as usize..seg.range.end as usize];
                let start = seg.range.start as usize;
                let release_input = |r: Range<usize>| inputs[job.file].map.release(start + r.start..start + r.end);
                let feedback = Feedback { progress, release_input: &release_input, input_xxh3: Some(seg.xxh3) };
                if let (Some(source), Some(dtype)) = (derivations.source_of(job), seg.dtype) {
                    let at_hand = derivations.at_hand_source(job).map(|(file, s)| {
                        let range = &hashed[file].segments[s].range;
                        (file, range.start as usize..range.end as usize)
                    });
                    let release_source = |r: Range<usize>| {
                        if let Some((file, range)) = &at_hand {
                            inputs[*file].map.release(range.start + r.start..range.start + r.end);
                        }
                    };
                    let source = match &at_hand {
                        Some((file, range)) => DerivedFrom::AtHand {
                            id: source,
                            bytes: &inputs[*file].map[range.clone()],
                            form: forms.get(&source),
                            release: &release_source,
                        },
                        None => DerivedFrom::Stored(source),
                    };
                    let previous = h.reference_of(s);
                    if let Some(w) =
                        self.store_derived(store, seg.id, bytes, dtype, source, previous, deltas, unsynced, &feedback)?
                    {
                        return Ok(w);
                    }
                }
                self.store_blob(store, seg.id, bytes, seg.dtype, reference, &feedback)
            }
            Target::Bundle(b) => {
                let bundle = &h.bundles[b];
                let reference = deltas.and_then(|base_every| Some((h.reference.bundle(&bundle.key)?, base_every)));
                // The members, gathered (at most `BUNDLE_MAX` bytes); the store checks that
                // they are the bytes hashed (xxh3), or the file changed meanwhile.
                let mut bytes = Vec::with_capacity(bundle.len as usize);
                for &m in &bundle.members {
                    let r = &h.segments[m].range;
                    bytes.extend_from_slice(&inputs[job.file].map[r.start as usize..r.end as usize]);
                }
                let feedback = Feedback { progress, release_input: &|_| {}, input_xxh3: Some(bundle.xxh3) };
                self.store_blob(store, bundle.id, &bytes, Some(bundle.dtype), reference, &feedback)
            }
        }
    }

    /// Reverse deltas: the blobs of the last pinned version before `parent` (its full base, the
    /// last version with `since_base == 0`, unless that is the root), which keep their blobs
    /// whole so that chains reach no further back than it. Those blobs can be shared with the
    /// parent (a tensor unchanged since), hence a set of blobs, not a flag on the parent.
    pub(super) fn pinned_blobs(&self, parent: &Version) -> Result<HashSet<ObjectId>> {
        let mut blobs = HashSet::new();
        if let Some(pin) = self.ancestor_since_base(parent, 0).filter(|v| !v.parents.is_empty()) {
            for file in &pin.files {
                blobs.extend(self.manifest(&file.manifest)?.blobs());
            }
        }
        Ok(blobs)
    }

    /// Runs `f` on every item, `len(item)` bytes of work each, showing progress under `label`:
    /// items under [`PARALLEL_BELOW`] in parallel, larger ones (each parallel inside the codec)
    /// one at a time, so memory stays bounded. `f` reports the bytes it has done so far.
    pub(super) fn run_sized<J: Sync, T: Send>(
        &self,
        label: &str,
        items: &[J],
        len: impl Fn(&J) -> u64 + Sync,
        f: impl Fn(&J, &(dyn Fn(u64) + Sync)) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        self.progress.start(label, items.iter().map(&len).sum());
        let done = AtomicU64::new(0);
        let run = |item: &J| -> Result<T> {
            let seen = AtomicU64::new(0);
            let progress = |n: u64| {
                let step = n.saturating_sub(seen.swap(n, Ordering::Relaxed));
                self.progress.set(done.fetch_add(step, Ordering::Relaxed) + step);
            };
            let out = f(item, &progress)?;
            progress(len(item));
            Ok(out)
        };
        let (large, small): (Vec<&J>, Vec<&J>) = items.iter().partition(|j| len(j) >= PARALLEL_BELOW);
        let mut out = small.par_iter().map(|j| run(j)).collect::<Result<Vec<T>>>()?;
        for j in large {
            out.push(run(j)?);
        }
        self.progress.finish();
        Ok(out)
    }

    /// Stores blob `id` (`bytes` of `dtype` elements) in `store`: as a delta against
    /// `reference` when that is allowed (its chain stays under the given `base_every`) and
    /// pays, else standalone.
    fn store_blob(
        &self,
        store: &Store,
        id: ObjectId,
        bytes: &[u8],
        dtype: Option<Dtype>,
        reference: Option<(ObjectId, u32)>,
        feedback: &Feedback<'_>,
    ) -> Result<(Written, BlobForm)> {
        let options = self.config.codec_options();
        if let Some((r, base_every)) = reference.filter(|(r, _)| *r != id) {
            // A damaged or missing reference only means no delta: store standalone.
            if let Ok(chain) = store.open_blob(&r) {
                if chain.depth() + 1 < base_every && chain.len() == bytes.len() as u64 {
                    let limit = chain.base_stored_len();
                    match store.write_blob_delta(id, bytes, &chain, limit, &options, feedback) {
                        Ok(DeltaOutcome::Written(w)) => return Ok((w, BlobForm::delta(&w, &chain))),
                        Ok(DeltaOutcome::NotSmaller { .. }) => {}
                        Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        let w = store.write_blob(id, bytes, dtype, &options, feedback)?;
        Ok((w, BlobForm::standalone(&w, options.chunk_size)))
    }

    /// Stores blob `id` (`bytes` of `dtype` elements) derived from its cross-precision reference
    /// `source` (docs/format.md, "Derived blobs") if that costs less than the alternatives:
    /// less than a standalone copy (estimated by the stored size of the standalone base of
    /// `previous`, the same tensor's blob in the reference version, else the raw length) and,
    /// when version deltas are allowed (`deltas`, the `base_every` bounding them), less than
    /// the delta against `previous`. `None` when it does not pay or cannot be made (a source
    /// that is missing or damaged, dtypes or chunk sizes that do not pair): the caller stores
    /// the blob as usual.
    #[allow(clippy::too_many_arguments)]
    fn store_derived(
        &self,
        store: &Store,
        id: ObjectId,
        bytes: &[u8],
        dtype: Dtype,
        source: DerivedFrom<'_>,
        previous: Option<ObjectId>,
        deltas: Option<u32>,
        unsynced: &Mutex<Vec<DerivedBlob>>,
        feedback: &Feedback<'_>,
    ) -> Result<Option<(Written, BlobForm)>> {
        let options = self.config.codec_options();
        // Its reference written in this commit, not durable yet.
        let reference_unsynced = matches!(source, DerivedFrom::AtHand { form: Some(_), .. });
        let previous = previous
            .filter(|r| *r != id)
            .and_then(|r| store.open_blob(&r).ok())
            .filter(|chain| chain.len() == bytes.len() as u64);
        // A previous copy that is itself derived says nothing about a standalone copy's size.
        let standalone = previous
            .as_ref()
            .filter(|chain| chain.derived_from().is_none())
            .map_or(bytes.len() as u64 + store::HEADER_LEN as u64, |chain| chain.base_stored_len());
        let version_reference = previous.zip(deltas);
        let target = DerivedTarget { id, data: bytes, dtype, limit: standalone };
        let coded = match source {
            DerivedFrom::Stored(source) => {
                let Ok(source) = store.open_blob(&source) else { return Ok(None) };
                store.code_blob_derived(target, &source, &options, feedback)
            }
            DerivedFrom::AtHand { id: source, bytes: source_bytes, form, release } => {
                // Stored before this commit: its form is read from the store (nothing decoded).
                let opened;
                let form = match form {
                    Some(form) => form,
                    None => match store.open_blob(&source) {
                        Ok(chain) => {
                            opened = chain.form();
                            &opened
                        }
                        Err(_) => return Ok(None),
                    },
                };
                let source = SourceBytes { bytes: source_bytes, form, release };
                store.code_blob_derived_from_bytes(target, &source, &options, feedback)
            }
        };
        let candidate = match coded {
            Ok(Some(candidate)) => candidate,
            Ok(None) => return Ok(None),
            Err(store::Error::Corrupt { .. } | store::Error::Missing { .. } | store::Error::Encode { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        if let Some((chain, _)) = version_reference.filter(|(chain, base_every)| chain.depth() + 1 < *base_every) {
            match store.write_blob_delta(id, bytes, &chain, candidate.stored_len(), &options, feedback) {
                Ok(DeltaOutcome::Written(w)) => return Ok(Some((w, BlobForm::delta(&w, &chain)))),
                Ok(DeltaOutcome::NotSmaller { .. }) => {}
                Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let form = candidate.form();
        if reference_unsynced {
            let written = candidate.written();
            unsynced.lock().unwrap_or_else(|p| p.into_inner()).push(candidate);
            return Ok(Some((written, form)));
        }
        Ok(Some((store.keep(candidate)?, form)))
    }

    /// The cross-precision references of a commit's tensors (docs/format.md, "Derived blobs"):
    /// a BF16 or F16 tensor is derived from the F32 tensor of the same name and shape
    /// ([`PrecisionIndex`]) in this version (any file: an input or a file kept from the
    /// parent), else in the parent. An F32 tensor is derived from a narrow one already stored
    /// (a file of this version kept from the parent, else the parent's), unless this commit
    /// stores a new narrow namesake, which is then derived from it: a reference is always a
    /// blob stored before the one derived from it, so no two blobs refer to each other.
    fn plan_derivations(
        &self,
        inputs: &[Input],
        hashed: &[HashedFile],
        kept: &BTreeMap<String, FileEntry>,
        parent: Option<&Version>,
    ) -> Derivations {
        fn own_blob(seg: &super::layout::HashedSegment) -> Option<(&super::model::TensorRef, Dtype)> {
            let tensor = seg.tensor.as_ref().filter(|_| seg.bundle.is_none() && seg.range.end > seg.range.start)?;
            Some((tensor, seg.dtype?))
        }
        let mut this = PrecisionIndex::default();
        for h in hashed {
            for seg in &h.segments {
                if let Some((t, dtype)) = own_blob(seg) {
                    this.add(&t.name, &t.shape, dtype, seg.id);
                }
            }
        }
        let named: HashSet<&str> = inputs.iter().map(|i| i.path.as_str()).collect();
        // Off only for benchmarks (benches/mixed_precision.py): what a build without derived
        // blobs stores, from the same binary.
        let off = std::env::var_os("CKPT_CROSS_PRECISION").is_some_and(|v| v == "off");
        if off || !hashed.iter().any(|h| h.segments.iter().any(|seg| own_blob(seg).is_some())) {
            return Derivations::default();
        }
        for f in kept.values().filter(|f| !named.contains(f.path.as_str())) {
            if let Ok(m) = self.manifest(&f.manifest) {
                this.add_manifest(&m);
            }
        }
        let previous = parent.map(|p| PrecisionIndex::of_version(self, p)).unwrap_or_default();
        // Narrow tensors this commit stores anew: they derive from their F32 namesake.
        let new_narrow: HashSet<super::pairing::PrecisionKey> = hashed
            .iter()
            .flat_map(|h| &h.segments)
            .filter_map(|seg| Some((own_blob(seg)?, seg.id)))
            .filter(|((_, dtype), id)| matches!(dtype, Dtype::Bf16 | Dtype::F16) && !self.store.contains(id))
            .map(|((t, _), _)| precision_key(&t.name, &t.shape))
            .collect();
        let mut sources = HashMap::new();
        for (file, h) in hashed.iter().enumerate() {
            for (s, seg) in h.segments.iter().enumerate() {
                let Some((t, dtype)) = own_blob(seg) else { continue };
                let source = match dtype {
                    Dtype::Bf16 | Dtype::F16 => {
                        this.source(&t.name, &t.shape, dtype).or_else(|| previous.source(&t.name, &t.shape, dtype))
                    }
                    Dtype::F32 if !new_narrow.contains(&precision_key(&t.name, &t.shape)) => this
                        .source(&t.name, &t.shape, dtype)
                        .filter(|narrow| self.store.contains(narrow))
                        .or_else(|| previous.source(&t.name, &t.shape, dtype)),
                    _ => None,
                };
                if let Some(source) = source.filter(|src| *src != seg.id) {
                    sources.insert((file, s), source);
                }
            }
        }
        // Their bytes at hand when they are tensors of the inputs: predicted from those, not
        // decoded from the store.
        let mut at_hand = HashMap::new();
        let used: HashSet<ObjectId> = sources.values().copied().collect();
        for (file, h) in hashed.iter().enumerate() {
            for (s, seg) in h.segments.iter().enumerate() {
                if own_blob(seg).is_some() && used.contains(&seg.id) {
                    at_hand.entry(seg.id).or_insert((file, s));
                }
            }
        }
        Derivations { sources, at_hand }
    }

    /// Writes `input`'s manifest to `store` unless stored already; returns the file's entry and
    /// the object written, if any.
    pub(super) fn write_manifest(
        &self,
        store: &Store,
        input: &Input,
        h: &HashedFile,
    ) -> Result<(FileEntry, Option<Written>)> {
        let manifest = manifest_of(input, &h.segments, &h.bundles, h.hash);
        let over = |reason| Error::OverLimit { what: input.path.to_string(), reason };
        manifest.check_limits().map_err(over)?;
        let bytes = manifest.to_bytes();
        if bytes.len() as u64 > store::MAX_DATA_OBJECT_LEN {
            return Err(over(format!("a manifest of {} bytes (at most {})", bytes.len(), store::MAX_DATA_OBJECT_LEN)));
        }
        let manifest_id = ObjectId::hash(&bytes);
        let written = if store.contains_fresh(&manifest_id) {
            None
        } else {
            Some(store.write_data(ObjectKind::Manifest, &bytes, &self.config.codec_options())?)
        };
        let entry = FileEntry { path: input.path.to_string(), manifest: manifest_id, len: manifest.len, hash: h.hash };
        Ok((entry, written))
    }

    /// Remembers size, mtime and hash of the committed files for `status`.
    fn record_stats(&self, inputs: &[Input], version: &Version) {
        let now = now_ns();
        for input in inputs.iter().filter(|i| i.in_working_tree) {
            let Some(entry) = version.file(input.path.as_str()) else { continue };
            let record = super::status::stat_record(&input.metadata, entry.hash, now);
            self.index_stat(input.path.as_str(), &record);
        }
    }
}

/// A file's segments and bundles with their ids, its whole-file hash and the blobs of the same
/// tensors (and bundles) in the reference version.
pub(super) struct HashedFile {
    pub(super) segments: Vec<HashedSegment>,
    pub(super) bundles: Vec<HashedBundle>,
    pub(super) hash: ObjectId,
    reference: TensorBlobs,
    /// Whether the file is a `.distcp` file (whose opaque segments pair too).
    distcp: bool,
}

impl HashedFile {
    /// The id of what `target` stores.
    fn id_of(&self, target: Target) -> ObjectId {
        match target {
            Target::Segment(i) => self.segments[i].id,
            Target::Bundle(b) => self.bundles[b].id,
        }
    }

    /// The length of what `target` stores.
    fn len_of(&self, target: Target) -> u64 {
        match target {
            Target::Segment(s) => self.segments[s].range.end - self.segments[s].range.start,
            Target::Bundle(b) => self.bundles[b].len,
        }
    }

    /// The blob of segment `s`'s tensor in the reference version, if it has one; for an opaque
    /// segment of a `.distcp` file, the same item's framing ([`super::pairing::gap_key`]), else
    /// framing of the same length.
    fn reference_of(&self, s: usize) -> Option<ObjectId> {
        match &self.segments[s].tensor {
            Some(t) => self.reference.tensor(t),
            None if self.distcp => {
                let after = self.segments[s + 1..].iter().map(|seg| seg.tensor.as_ref());
                let range = &self.segments[s].range;
                self.reference.gap(&super::pairing::gap_key(after), range.end - range.start)
            }
            None => None,
        }
    }
}

/// The cross-precision references a commit plans ([`Repo::plan_derivations`]): per (file,
/// segment), the blob it is derived from if that pays.
#[derive(Default)]
pub(super) struct Derivations {
    sources: HashMap<(usize, usize), ObjectId>,
    /// Where each source that is a tensor of this commit's inputs lies: (file, segment), its
    /// first occurrence.
    at_hand: HashMap<ObjectId, (usize, usize)>,
}

impl Derivations {
    /// The blob `job`'s segment is to be derived from, if any.
    fn source_of(&self, job: &Job) -> Option<ObjectId> {
        match job.target {
            Target::Segment(s) => self.sources.get(&(job.file, s)).copied(),
            Target::Bundle(_) => None,
        }
    }

    /// Where in the inputs (file, segment) the bytes of `job`'s source are, if they are there.
    fn at_hand_source(&self, job: &Job) -> Option<(usize, usize)> {
        self.at_hand.get(&self.source_of(job)?).copied()
    }

    /// `jobs` grouped into units of work: a job whose source another job writes is coded
    /// right after it, in its unit (a chain of such sources, if any, in order); every other
    /// job is a unit of its own. Each unit is in job order otherwise.
    fn units(&self, jobs: &[Job], hashed: &[HashedFile]) -> Vec<Vec<Job>> {
        let writer: HashMap<ObjectId, usize> =
            jobs.iter().enumerate().map(|(k, j)| (hashed[j.file].id_of(j.target), k)).collect();
        let parent = |k: usize| self.source_of(&jobs[k]).and_then(|s| writer.get(&s).copied()).filter(|p| *p != k);
        // The job at the root of each job's sources, and how far it is from it. Plans have no
        // cycles (a source is stored before what derives from it); a walk longer than the job
        // count is one anyway, and the job is then a unit of its own.
        let mut members: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for k in 0..jobs.len() {
            let (mut root, mut depth) = (k, 0);
            while let Some(p) = parent(root) {
                (root, depth) = (p, depth + 1);
                if depth > jobs.len() {
                    (root, depth) = (k, 0);
                    break;
                }
            }
            members.entry(root).or_default().push((depth, k));
        }
        members
            .into_values()
            .map(|mut unit| {
                unit.sort();
                unit.into_iter().map(|(_, k)| jobs[k]).collect()
            })
            .collect()
    }
}

/// Where a derived blob's reference comes from.
enum DerivedFrom<'a> {
    /// Decoded from the store (a tensor of a kept file or of the parent version).
    Stored(ObjectId),
    /// A tensor of this commit's inputs: blob `id`'s content is `bytes`. `form` is how this
    /// commit stored it, `None` when it was stored before (then read from the store).
    AtHand { id: ObjectId, bytes: &'a [u8], form: Option<&'a BlobForm>, release: &'a (dyn Fn(Range<usize>) + Sync) },
}

/// One blob to store, of file `file`.
#[derive(Clone, Copy)]
pub(super) struct Job {
    pub(super) file: usize,
    pub(super) target: Target,
}

/// What a [`Job`] stores.
#[derive(Clone, Copy)]
pub(super) enum Target {
    /// The segment of this index.
    Segment(usize),
    /// The bundle of this index.
    Bundle(usize),
}

/// Segments below this size are coded several at a time (each is at most one codec stripe or
/// so, which would leave cores idle); larger ones one at a time, parallel inside the codec.
const PARALLEL_BELOW: u64 = 4 << 20;

impl Repo {
    /// What a commit of `hashed` must store: every segment not in a bundle, and every bundle
    /// (bundled tensors are stored in their bundle, not as blobs of their own), each id once and
    /// only if the store lacks it.
    pub(super) fn jobs_to_store(&self, hashed: &[HashedFile]) -> Vec<Job> {
        let mut seen = HashSet::new();
        hashed
            .iter()
            .enumerate()
            .flat_map(|(f, h)| {
                let segments = h.segments.iter().enumerate().filter(|(_, seg)| seg.bundle.is_none());
                let segments = segments.map(move |(s, seg)| (Job { file: f, target: Target::Segment(s) }, seg.id));
                let bundles = h
                    .bundles
                    .iter()
                    .enumerate()
                    .map(move |(b, bundle)| (Job { file: f, target: Target::Bundle(b) }, bundle.id));
                segments.chain(bundles)
            })
            .filter(|(_, id)| seen.insert(*id) && !self.store.contains_fresh(id))
            .map(|(job, _)| job)
            .collect()
    }
}

pub(super) fn hash_file(input: &Input, reference: TensorBlobs) -> HashedFile {
    let (HashedSegments { segments, bundles }, hash) = input.hash();
    HashedFile { segments, bundles, hash, reference, distcp: input.distcp && input.torch.is_some() }
}

/// Why a commit refuses a symbolic link to a directory.
const LINKED_DIRECTORY: &str = "a symbolic link to a directory: not followed (name its target to commit it)";

/// The files under directory `dir`, sorted ([`Repo::expand_directories`]).
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(super::error::io("reading the directory", &d))? {
            let entry = entry.map_err(super::error::io("reading the directory", &d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(super::error::io("reading", &path))?;
            if kind.is_dir() {
                if entry.file_name() != ".ckpt" && entry.file_name() != ".git" {
                    stack.push(path);
                }
            } else if kind.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                return Err(Error::InvalidPath { path, reason: LINKED_DIRECTORY.into() });
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Options;

    /// Stores a version with no files on top of `parent`; returns it and its id.
    fn store_version(repo: &Repo, parent: Option<VersionId>, since_base: u32) -> (Version, VersionId) {
        let v = Version {
            format: MODEL_FORMAT,
            parents: parent.into_iter().collect(),
            time: 0,
            message: format!("since_base {since_base}"),
            since_base,
            files: Vec::new(),
            raw_bytes: 0,
            stored_bytes: 0,
        };
        let written = repo.store.write_data(ObjectKind::Version, &v.to_bytes(), &Options::default()).unwrap();
        (v, written.id)
    }

    #[test]
    fn ancestors_are_found_by_since_base_and_bad_histories_give_none() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let mut chain = Vec::new();
        let mut parent = None;
        for s in 0..6 {
            let (v, id) = store_version(&repo, parent, s);
            chain.push(v);
            parent = Some(id);
        }
        let tip = chain.last().unwrap();
        for target in 0..=5 {
            assert_eq!(repo.ancestor_since_base(tip, target), Some(chain[target as usize].clone()));
        }
        // A version claiming 9 versions since its base on top of one with 5: the walk stops
        // at the first step that does not drop by one instead of trusting the numbers.
        let (odd, _) = store_version(&repo, parent, 9);
        assert_eq!(repo.ancestor_since_base(&odd, 4), None);
        assert_eq!(repo.ancestor_since_base(&odd, 9), Some(odd.clone()));
        // A missing parent is no ancestor either.
        let (orphan, _) = store_version(&repo, Some(ObjectId::hash(b"not stored")), 3);
        assert_eq!(repo.ancestor_since_base(&orphan, 2), None);
    }
}
