//! `commit`: files → blobs (deduplicated, delta-coded where it pays) → manifests → version →
//! ref. All inputs are parsed before anything is written, so an invalid file changes nothing.

use super::model::{Bundle, FileEntry, FileFormat, Manifest, Segment, TensorRef, Version, MODEL_FORMAT};
use super::{now_secs, DeltaPolicy, Error, Head, RefKind, Repo, RepoPath, Result, VersionId};
use crate::mmap::{self, Map};
use crate::object_id::ObjectId;
use crate::safetensors;
use crate::store::{self, DeltaOutcome, Feedback, ObjectKind, Store, Written};
use crate::torch_zip;
use crate::Dtype;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// A file to commit, mapped and parsed.
pub(super) struct Input {
    pub(super) path: RepoPath,
    pub(super) map: Map,
    pub(super) header: Option<safetensors::Header>,
    /// The storages of a `torch.save` archive (when `header` is `None`).
    pub(super) torch: Option<torch_zip::Layout>,
    pub(super) metadata: std::fs::Metadata,
    /// The open file, whose metadata is compared with `metadata` once it is read
    /// ([`Input::check_unchanged`]).
    pub(super) file: std::fs::File,
    /// Whether the file is the working-tree file at `path`, whose size and times `status`
    /// remembers; not for bytes committed from memory (`commit_memory`).
    pub(super) in_working_tree: bool,
}

impl Input {
    /// Parses a mapped file as a commit reads it: a file named `*.safetensors` must be valid
    /// safetensors; any other file is safetensors if it parses as such, else a `torch.save`
    /// archive if it is one, else opaque bytes.
    pub(super) fn parse(path: RepoPath, map: Map, metadata: std::fs::Metadata, file: std::fs::File) -> Result<Input> {
        let mut input = Input { path, map, header: None, torch: None, metadata, file, in_working_tree: true };
        let parsed = safetensors::parse(&input.map);
        if parsed.is_err() {
            // A header cut short by a rewrite is the change, not an invalid file.
            input.check_unchanged()?;
        }
        input.header = if input.path.as_str().ends_with(".safetensors") {
            Some(parsed.map_err(|source| Error::Safetensors { path: input.path.to_string(), source })?)
        } else {
            parsed.ok()
        };
        input.torch = torch_layout(&input.map, input.header.as_ref());
        Ok(input)
    }

    /// Fails with [`Error::FileChanged`] if the file shrank (its map read zeros past the new end:
    /// see [`crate::mmap`]) or was rewritten since it was opened: what was read may mix two
    /// versions of it, so nothing read from it may become a version.
    pub(super) fn check_unchanged(&self) -> Result<()> {
        if mmap::FileStamp::of(&self.metadata).changed(&self.file, &self.map) {
            return Err(Error::FileChanged { path: self.path.to_string() });
        }
        Ok(())
    }
}

/// One planned segment: byte range, dtype, tensor identity.
struct Planned {
    range: Range<u64>,
    dtype: Option<Dtype>,
    tensor: Option<TensorRef>,
}

impl Repo {
    /// Commits `paths` (absolute, or relative to the repository root) as a new version on top
    /// of `HEAD`, with every file of the parent version that is not named again and not
    /// `rm`-ed. Returns the new version's id.
    ///
    /// Files named `*.safetensors` must be valid safetensors; other files are stored tensor by
    /// tensor if they parse as safetensors, storage by storage if they are `torch.save` archives
    /// ([`torch_zip`]), and as opaque bytes otherwise.
    pub fn commit<P: AsRef<Path>>(&self, paths: &[P], message: &str, options: &CommitOptions) -> Result<VersionId> {
        let _lock = self.lock()?;
        let inputs = self.read_inputs(paths)?;
        self.commit_inputs(inputs, message, options)
    }

    /// [`Self::commit`] of inputs already mapped and parsed, under the writer lock the caller
    /// holds (the git filter stores a spooled file under its logical path this way).
    pub(super) fn commit_inputs(
        &self,
        inputs: Vec<Input>,
        message: &str,
        options: &CommitOptions,
    ) -> Result<VersionId> {
        self.commit_inputs_on(inputs, message, options, None)
    }

    /// [`Self::commit_inputs`]; with `on` (the git filter's store, docs/format.md "The git
    /// filter's store versions"), the new version lists only the inputs, its first parent (what
    /// its deltas and `since_base` follow) is `on`'s version, and `HEAD`'s version, when
    /// another, is its last parent, so that every version stays reachable from the branch.
    pub(super) fn commit_inputs_on(
        &self,
        inputs: Vec<Input>,
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
        let removals = self.pending_removals()?;
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
                let reference = references.for_input(self, input);
                hash_file(input, reference.as_ref())
            })
            .collect();
        // 2. Store every blob not stored yet (each id once).
        // (Bundled tensors are stored in their bundle, not as blobs of their own.)
        let mut seen = HashSet::new();
        let jobs: Vec<Job> = hashed
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
            .filter(|(_, id)| seen.insert(*id) && !self.store.contains(id))
            .map(|(job, _)| job)
            .collect();
        // 2 and 3 write through a view of the store that fsyncs and renames the objects on
        // other threads while the next ones are coded; it returns once all are durable, before
        // the version that points to them is written.
        let deltas = if policy == DeltaPolicy::Reverse { None } else { Some(base_every) };
        let stored = self.store.with_background_sync(|store| {
            let blobs = self.store_blobs(store, &inputs, &hashed, &jobs, deltas)?;
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
            for job in jobs.iter().filter(|j| inputs[j.file].check_unchanged().is_err()) {
                let id = match job.target {
                    Target::Segment(i) => hashed[job.file].segments[i].id,
                    Target::Bundle(b) => hashed[job.file].bundles[b].id,
                };
                let _ = self.store.remove(&id);
            }
            return Err(Error::FileChanged { path: inputs[changed].path.to_string() });
        }
        let (mut objects, entries) = stored?;
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

    /// Maps and parses the file at `p` (absolute, or relative to the repository root).
    pub(super) fn read_input(&self, p: &Path) -> Result<Input> {
        let path = self.repo_path(p)?;
        let abs = path.under(&self.root);
        // A named pipe, socket or device is refused here, before anything blocks on it (the
        // writer lock is held).
        let file = mmap::open_regular(&abs).map_err(|source| match source.kind() {
            std::io::ErrorKind::InvalidInput => Error::InvalidPath { path: abs.clone(), reason: source.to_string() },
            _ => Error::Io { action: "opening", path: abs.clone(), source },
        })?;
        let metadata = file.metadata().map_err(|source| Error::Io { action: "reading", path: abs.clone(), source })?;
        let map =
            mmap::map_input(&file).map_err(|source| Error::Io { action: "reading", path: abs.clone(), source })?;
        Input::parse(path, map, metadata, file)
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
    fn store_blobs(
        &self,
        store: &Store,
        inputs: &[Input],
        hashed: &[HashedFile],
        jobs: &[Job],
        deltas: Option<u32>,
    ) -> Result<Vec<Written>> {
        let written = self.run_jobs("commit", inputs, hashed, jobs, |job, progress| {
            let h = &hashed[job.file];
            match job.target {
                Target::Segment(s) => {
                    let seg = &h.segments[s];
                    let reference = deltas.and_then(|base_every| Some((h.reference_of(seg)?, base_every)));
                    let bytes = &inputs[job.file].map[seg.range.start as usize..seg.range.end as usize];
                    let start = seg.range.start as usize;
                    let release_input = |r: Range<usize>| inputs[job.file].map.release(start + r.start..start + r.end);
                    let feedback = Feedback { progress, release_input: &release_input, input_xxh3: Some(seg.xxh3) };
                    self.store_blob(store, seg.id, bytes, seg.dtype, reference, &feedback).map(Some)
                }
                Target::Bundle(b) => {
                    let bundle = &h.bundles[b];
                    let reference =
                        deltas.and_then(|base_every| Some((*h.bundle_reference.get(&bundle.key)?, base_every)));
                    // The members, gathered (at most `BUNDLE_MAX` bytes); the store checks that
                    // they are the bytes hashed (xxh3), or the file changed meanwhile.
                    let mut bytes = Vec::with_capacity(bundle.len as usize);
                    for &m in &bundle.members {
                        let r = &h.segments[m].range;
                        bytes.extend_from_slice(&inputs[job.file].map[r.start as usize..r.end as usize]);
                    }
                    let feedback = Feedback { progress, release_input: &|_| {}, input_xxh3: Some(bundle.xxh3) };
                    self.store_blob(store, bundle.id, &bytes, Some(bundle.dtype), reference, &feedback).map(Some)
                }
            }
        })?;
        Ok(written.into_iter().flatten().collect())
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

    /// Runs `f` on every job (see [`Self::run_sized`]); errors name the job's file. (The
    /// store drops each segment's input pages as it codes them: `Feedback::release_input`.)
    fn run_jobs<T: Send>(
        &self,
        label: &str,
        inputs: &[Input],
        hashed: &[HashedFile],
        jobs: &[Job],
        f: impl Fn(&Job, &(dyn Fn(u64) + Sync)) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let len = |j: &Job| match j.target {
            Target::Segment(s) => hashed[j.file].segments[s].range.end - hashed[j.file].segments[s].range.start,
            Target::Bundle(b) => hashed[j.file].bundles[b].len,
        };
        self.run_sized(label, jobs, len, |job, progress| {
            let path = || inputs[job.file].path.to_string();
            f(job, progress).map_err(|e| match e {
                Error::Store(store::Error::ChangedWhileWriting { .. }) => Error::FileChanged { path: path() },
                other => Error::File { path: path(), source: Box::new(other) },
            })
        })
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
    ) -> Result<Written> {
        let options = self.config.codec_options();
        if let Some((r, base_every)) = reference.filter(|(r, _)| *r != id) {
            // A damaged or missing reference only means no delta: store standalone.
            if let Ok(chain) = store.open_blob(&r) {
                if chain.depth() + 1 < base_every && chain.len() == bytes.len() as u64 {
                    let limit = chain.base_stored_len();
                    match store.write_blob_delta(id, bytes, &chain, limit, &options, feedback) {
                        Ok(DeltaOutcome::Written(w)) => return Ok(w),
                        Ok(DeltaOutcome::NotSmaller { .. }) => {}
                        Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(store.write_blob(id, bytes, dtype, &options, feedback)?)
    }

    /// Writes `input`'s manifest to `store` unless stored already; returns the file's entry and
    /// the object written, if any.
    fn write_manifest(&self, store: &Store, input: &Input, h: &HashedFile) -> Result<(FileEntry, Option<Written>)> {
        let manifest = manifest_of(input, &h.segments, &h.bundles, h.hash);
        let over = |reason| Error::OverLimit { what: input.path.to_string(), reason };
        manifest.check_limits().map_err(over)?;
        let bytes = manifest.to_bytes();
        if bytes.len() as u64 > store::MAX_DATA_OBJECT_LEN {
            return Err(over(format!("a manifest of {} bytes (at most {})", bytes.len(), store::MAX_DATA_OBJECT_LEN)));
        }
        let manifest_id = ObjectId::hash(&bytes);
        let written = if store.contains(&manifest_id) {
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

/// The files of the reference version, for finding each input's reference manifest.
pub(crate) struct ReferenceFiles<'v> {
    version: Option<&'v Version>,
    /// The reference version's files, most recently changed first (see [`Self::by_recency`]),
    /// computed on first need.
    recency: Option<Vec<&'v FileEntry>>,
    /// Manifests loaded so far, by id.
    manifests: HashMap<ObjectId, Manifest>,
}

/// Versions walked back along first parents to order the reference version's files by when they
/// last changed; files unchanged for longer come after, in path order.
const RECENCY_WALK: usize = 32;

impl<'v> ReferenceFiles<'v> {
    pub(crate) fn new(version: Option<&'v Version>) -> Self {
        ReferenceFiles { version, recency: None, manifests: HashMap::new() }
    }

    /// The manifest whose tensors `input`'s tensors are delta-coded against: the file at the same
    /// path in the reference version; or, when there is none (training loops that write
    /// `epoch_3.safetensors` or `checkpoint-1500/model.safetensors`, a new path every time), the
    /// reference version's safetensors file that holds the most of `input`'s tensors (same name,
    /// dtype and shape). Ties go to the file with the same file name
    /// (`checkpoint-1000/ema.safetensors` for `checkpoint-1500/ema.safetensors`), then to the one
    /// changed most recently, so that among older epochs carried along the newest is chosen.
    /// Files are scored newest first and the first that holds every tensor under the same file
    /// name ends the search, so a long history is not read in full.
    fn for_input(&mut self, repo: &Repo, input: &Input) -> Option<Manifest> {
        // The tensor set only matters for a path the reference version lacks (20,000 tensors:
        // a tenth of a commit's CPU time to build and hash).
        let new_path = self.version.is_some_and(|v| v.file(input.path.as_str()).is_none());
        let tensors = match (&input.header, &input.torch) {
            _ if !new_path => None,
            (Some(h), _) => Some(h.tensors.iter().map(TensorRef::of).collect()),
            (None, Some(t)) => Some(t.storages.iter().map(TensorRef::of_storage).collect()),
            (None, None) => None,
        };
        self.for_file(repo, input.path.as_str(), tensors)
    }

    /// [`Self::for_input`] for a file at `path` whose `tensors` are given (`None`: not a
    /// safetensors file).
    pub(crate) fn for_file(
        &mut self,
        repo: &Repo,
        path: &str,
        tensors: Option<HashSet<TensorRef>>,
    ) -> Option<Manifest> {
        let version = self.version?;
        if let Some(f) = version.file(path) {
            return repo.manifest(&f.manifest).ok();
        }
        let wanted = tensors?;
        let name = path.rsplit('/').next();
        let recency = self.recency.get_or_insert_with(|| Self::by_recency(repo, version));
        let mut best: Option<((usize, bool), ObjectId)> = None;
        for f in recency.iter() {
            let Some(m) = load(&mut self.manifests, repo, &f.manifest) else { continue };
            if m.kind == FileFormat::Bytes {
                continue;
            }
            let score = (m.tensors().filter(|(t, _)| wanted.contains(*t)).count(), f.path.rsplit('/').next() == name);
            if score.0 > 0 && best.as_ref().is_none_or(|(b, _)| score > *b) {
                best = Some((score, f.manifest));
                if score == (wanted.len(), true) {
                    break;
                }
            }
        }
        best.and_then(|(_, id)| self.manifests.get(&id).cloned())
    }

    /// The files of `version`, those changed by `version` itself first, then those changed by
    /// its parent, and so on for [`RECENCY_WALK`] versions along first parents; the rest after.
    fn by_recency(repo: &Repo, version: &'v Version) -> Vec<&'v FileEntry> {
        let mut placed: HashSet<&str> = HashSet::new();
        let mut order = Vec::new();
        let mut newer = version.clone();
        for _ in 0..RECENCY_WALK {
            let older = newer.parents.first().and_then(|p| repo.version(p).ok());
            for f in &version.files {
                // `f` is as of `version`; it last changed in `newer` when `newer` holds it and
                // `older` holds another manifest (or none) at that path.
                let in_newer = newer.file(&f.path).is_some_and(|n| n.manifest == f.manifest);
                let in_older = older.as_ref().and_then(|o| o.file(&f.path)).is_some_and(|o| o.manifest == f.manifest);
                if in_newer && !in_older && placed.insert(f.path.as_str()) {
                    order.push(f);
                }
            }
            match older {
                Some(o) => newer = o,
                None => break,
            }
        }
        order.extend(version.files.iter().filter(|f| !placed.contains(f.path.as_str())));
        order
    }
}

/// `id`'s manifest from `cache`, reading it on first use; `None` if it cannot be read.
fn load<'c>(cache: &'c mut HashMap<ObjectId, Manifest>, repo: &Repo, id: &ObjectId) -> Option<&'c Manifest> {
    if !cache.contains_key(id) {
        let m = repo.manifest(id).ok()?;
        cache.insert(*id, m);
    }
    cache.get(id)
}

/// A planned segment with its id.
pub(super) struct HashedSegment {
    pub(super) range: Range<u64>,
    dtype: Option<Dtype>,
    pub(super) tensor: Option<TensorRef>,
    pub(super) id: ObjectId,
    /// xxh3-64 of the segment's bytes.
    xxh3: u64,
    /// The bundle (index in [`HashedSegments::bundles`]) holding it, if any.
    bundle: Option<u32>,
}

/// A planned bundle ([`super::bundle`]) with its id.
pub(super) struct HashedBundle {
    dtype: Dtype,
    /// Its segments, in file order.
    members: Vec<usize>,
    len: u64,
    /// The blake3 of the members' bytes, concatenated.
    id: ObjectId,
    /// Their xxh3-64.
    xxh3: u64,
    /// The first member's tensor: what the same bundle of the reference file starts with.
    key: TensorRef,
}

/// A file's segments and bundles, hashed.
pub(super) struct HashedSegments {
    pub(super) segments: Vec<HashedSegment>,
    pub(super) bundles: Vec<HashedBundle>,
}

/// The manifest of `input` with these hashed segments and bundles: what a commit writes, and
/// what the git filter computes to find a file the store already holds.
pub(super) fn manifest_of(
    input: &Input,
    segments: &[HashedSegment],
    bundles: &[HashedBundle],
    hash: ObjectId,
) -> Manifest {
    let segments = segments
        .iter()
        .map(|s| {
            let len = s.range.end - s.range.start;
            match (s.bundle, &s.tensor) {
                (Some(b), Some(t)) => Segment::bundled(len, t.clone(), b),
                _ => Segment::whole(len, s.id, s.tensor.clone()),
            }
        })
        .collect();
    let bundles = bundles
        .iter()
        .map(|b| Bundle { blob: b.id, dtype: b.dtype.safetensors_name().to_string(), len: b.len })
        .collect();
    let kind = match (&input.header, &input.torch) {
        (Some(_), _) => FileFormat::Safetensors,
        (None, Some(_)) => FileFormat::Torch,
        (None, None) => FileFormat::Bytes,
    };
    Manifest::new(kind, input.map.len() as u64, hash, bundles, segments)
}

/// A file's segments and bundles with their ids, its whole-file hash and the blobs of the same
/// tensors (and bundles) in the reference version.
struct HashedFile {
    segments: Vec<HashedSegment>,
    bundles: Vec<HashedBundle>,
    hash: ObjectId,
    reference: HashMap<TensorRef, ObjectId>,
    /// Bundles of the reference file by their first member's tensor.
    bundle_reference: HashMap<TensorRef, ObjectId>,
}

impl HashedFile {
    /// The blob of `seg`'s tensor in the reference version, if it has one.
    fn reference_of(&self, seg: &HashedSegment) -> Option<ObjectId> {
        seg.tensor.as_ref().and_then(|t| self.reference.get(t)).copied()
    }
}

/// One blob to store, of file `file`.
#[derive(Clone, Copy)]
struct Job {
    file: usize,
    target: Target,
}

/// What a [`Job`] stores.
#[derive(Clone, Copy)]
enum Target {
    /// The segment of this index.
    Segment(usize),
    /// The bundle of this index.
    Bundle(usize),
}

/// The file-system block size assumed when deciding whether a reverse-delta rewrite frees space.
pub(super) const FS_BLOCK: u64 = 4096;

/// Segments below this size are coded several at a time (each is at most one codec stripe or
/// so, which would leave cores idle); larger ones one at a time, parallel inside the codec.
const PARALLEL_BELOW: u64 = 4 << 20;

fn hash_file(input: &Input, reference: Option<&Manifest>) -> HashedFile {
    let (HashedSegments { segments, bundles }, hash) =
        hash_content(&input.map, input.header.as_ref(), input.torch.as_ref());
    let tensors = reference.map(|m| m.tensors().filter_map(|(t, s)| Some((t.clone(), s.blob?))).collect());
    let bundle_reference = reference.map(|m| {
        let keys = m.bundle_keys().into_iter().zip(&m.bundles);
        keys.filter_map(|(k, b)| Some((k?.clone(), b.blob))).collect()
    });
    HashedFile {
        segments,
        bundles,
        hash,
        reference: tensors.unwrap_or_default(),
        bundle_reference: bundle_reference.unwrap_or_default(),
    }
}

/// Plans `map`'s segments (safetensors when `header` is given, a `torch.save` archive's
/// storages and the bytes between them when `torch` is, else one opaque segment) and
/// bundles ([`super::bundle::plan`]), hashes each segment (its blob id) and bundle, and derives
/// the file hash from the segments ([`super::model::file_hash`]). Each segment's pages are
/// dropped from the resident set once hashed. `status` hashes working files with this too, so
/// both agree on what a file's hash is.
pub(super) fn hash_content(
    map: &Map,
    header: Option<&safetensors::Header>,
    torch: Option<&torch_zip::Layout>,
) -> (HashedSegments, ObjectId) {
    let planned = plan(map.len() as u64, header, torch);
    let bundle_plan = super::bundle::plan(
        planned.iter().map(|p| (p.range.end - p.range.start, p.dtype.filter(|_| p.tensor.is_some()))),
    );
    let mut bundle_of: Vec<Option<u32>> = vec![None; planned.len()];
    for (b, (_, members)) in bundle_plan.iter().enumerate() {
        for &m in members {
            bundle_of[m] = Some(b as u32);
        }
    }
    // Segments in parallel: a checkpoint of many small tensors leaves blake3's own tree
    // parallelism little to split (45 MB of MiniLM, 105 segments: 10-14 ms one after the
    // other, ~10 ms side by side in the same phase timestamps; the pass is memory-bound).
    // Bundled ones are hashed with their bundle, below.
    let mut segments: Vec<HashedSegment> = planned
        .into_par_iter()
        .zip(bundle_of)
        .map(|(p, bundle)| {
            let (id, xxh3) = match bundle {
                None => hash_segment(map, p.range.start as usize..p.range.end as usize),
                Some(_) => (ObjectId([0; 32]), 0),
            };
            HashedSegment { range: p.range, dtype: p.dtype, tensor: p.tensor, id, xxh3, bundle }
        })
        .collect();
    // Each member is copied once and hashed from the copy, as itself (its id) and as part of
    // the bundle, so the two agree even if the file changes meanwhile (the store then finds
    // that the bundle's bytes are not those hashed).
    let hashed_bundles: Vec<(HashedBundle, Vec<ObjectId>)> = bundle_plan
        .into_par_iter()
        .map(|(dtype, members)| {
            let mut blake3 = blake3::Hasher::new();
            let mut xxh3 = xxhash_rust::xxh3::Xxh3::new();
            let mut copy = Vec::with_capacity(super::bundle::BUNDLE_BELOW as usize);
            let mut ids = Vec::with_capacity(members.len());
            let mut len = 0;
            for &m in &members {
                let r = &segments[m].range;
                copy.clear();
                copy.extend_from_slice(&map[r.start as usize..r.end as usize]);
                ids.push(ObjectId::hash(&copy));
                blake3.update(&copy);
                xxh3.update(&copy);
                len += copy.len() as u64;
            }
            let key = segments[members[0]].tensor.clone().expect("bundles hold tensors");
            (HashedBundle { dtype, members, len, id: blake3.finalize().into(), xxh3: xxh3.digest(), key }, ids)
        })
        .collect();
    let mut bundles = Vec::with_capacity(hashed_bundles.len());
    for (bundle, ids) in hashed_bundles {
        for (&m, id) in bundle.members.iter().zip(ids) {
            segments[m].id = id;
        }
        bundles.push(bundle);
    }
    let hash = super::model::file_hash(map.len() as u64, segments.iter().map(|s| (s.range.end - s.range.start, s.id)));
    (HashedSegments { segments, bundles }, hash)
}

/// The blake3 (its id) and xxh3-64 (which lets the store check that the bytes it codes are
/// these, without a second blake3 pass: `Feedback::input_xxh3`) of `map[range]`. Block by block,
/// so both read each block while it is in cache, and each block's pages leave the resident set
/// once hashed (segments are hashed in parallel: without this, two 1 GiB tensors would be
/// resident at once).
fn hash_segment(map: &Map, range: Range<usize>) -> (ObjectId, u64) {
    const BLOCK: usize = 8 << 20;
    let mut blake3 = blake3::Hasher::new();
    let mut xxh3 = xxhash_rust::xxh3::Xxh3::new();
    for start in range.clone().step_by(BLOCK) {
        let block = start..(start + BLOCK).min(range.end);
        let bytes = &map[block.clone()];
        // Side by side: the pool splits blake3's tree while one worker runs xxh3 over the block.
        rayon::join(|| crate::object_id::hash_update(&mut blake3, bytes), || xxh3.update(bytes));
        map.release(block);
    }
    (blake3.finalize().into(), xxh3.digest())
}

/// The storages of `map` if it is a `torch.save` archive and not a safetensors file (`header`).
/// Anything the reader does not fully understand (a pickle with other globals or opcodes, a
/// damaged or compressed archive) is `None`: the file is then stored as opaque bytes, never
/// refused. Commit and `status` both call this, so both cut a file the same way.
pub(super) fn torch_layout(map: &Map, header: Option<&safetensors::Header>) -> Option<torch_zip::Layout> {
    if header.is_some() || !torch_zip::looks_like_zip(map) {
        return None;
    }
    torch_zip::parse(map).ok()
}

/// Segments of a file of `len` bytes: a safetensors file as header, tensors (empty ones as
/// zero-length segments) and gaps, in file order; a `torch.save` archive as its storages and
/// the opaque ranges between them; anything else as one opaque segment.
fn plan(len: u64, header: Option<&safetensors::Header>, torch: Option<&torch_zip::Layout>) -> Vec<Planned> {
    if let (None, Some(layout)) = (header, torch) {
        return layout
            .segments()
            .into_iter()
            .map(|(range, s)| Planned { range, dtype: s.map(|s| s.dtype), tensor: s.map(TensorRef::of_storage) })
            .collect();
    }
    let Some(header) = header else {
        return vec![Planned { range: 0..len, dtype: None, tensor: None }];
    };
    let mut out = vec![Planned { range: 0..header.data_start, dtype: None, tensor: None }];
    let mut at = header.data_start;
    for t in &header.tensors {
        let tensor = Some(TensorRef::of(t));
        if t.is_empty() {
            out.push(Planned { range: at..at, dtype: Some(t.dtype), tensor });
            continue;
        }
        if t.begin > at {
            out.push(Planned { range: at..t.begin, dtype: None, tensor: None });
        }
        out.push(Planned { range: t.begin..t.end, dtype: Some(t.dtype), tensor });
        at = t.end;
    }
    if at < len {
        out.push(Planned { range: at..len, dtype: None, tensor: None });
    }
    out
}

/// Nanoseconds since the Unix epoch, now.
pub(super) fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

/// A file's modification time in nanoseconds since the Unix epoch.
pub(super) fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    match m.modified() {
        Ok(t) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        },
        Err(_) => 0,
    }
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
