//! A commit's objects: the middle of the one commit pipeline (plan → hash → pair → code →
//! store → manifest → version). [`Repo::store_inputs`] takes inputs already cut
//! ([`super::cut`]), hashes them, pairs their tensors with the reference version's
//! ([`super::pairing`]), codes and stores every blob the store lacks (deltas where they pay,
//! cross-precision derivations, bundles) and writes their manifests. Every entry point goes
//! through it: [`Repo::commit`] and [`Repo::commit_sources`] (files and memory), the git
//! filter's [`Repo::store_file`] and a DCP save's [`Repo::store_objects`] (whose pieces it
//! takes as stored); what comes before (which version, which files) and after (the version, the
//! ref) is theirs.

use super::cut::{manifest_of, HashedBundle, HashedSegment, HashedSegments, Input};
use super::model::{FileEntry, TensorRef, Version};
use super::pairing::{gap_key, precision_key, PrecisionIndex, PrecisionKey, ReferenceFiles, TensorBlobs};
use super::pieces::Piece;
use super::{Error, Repo, Result};
use crate::object_id::ObjectId;
use crate::store::{
    self, BlobChain, BlobForm, DeltaOutcome, DerivedBlob, DerivedTarget, Feedback, ObjectKind, SourceBytes, Store,
    Written,
};
use crate::Dtype;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What [`Repo::store_inputs`] does besides storing the inputs' objects.
pub(super) struct ObjectPlan<'a> {
    /// The version whose tensors the inputs pair with ([`ReferenceFiles`]), if any.
    pub(super) reference: Option<&'a Version>,
    /// The `base_every` bounding delta chains, when blobs may be stored as deltas against their
    /// pair; `None` (the `reverse` policy) stores them whole.
    pub(super) deltas: Option<u32>,
    /// For a commit's cross-precision derivations ([`Repo::plan_derivations`]): the files the
    /// version keeps from its parent, and the parent. `None`: no derived blobs.
    pub(super) derive: Option<(&'a BTreeMap<String, FileEntry>, Option<&'a Version>)>,
    /// Manifests of files stored beside the version ([`super::commit::Onto::Stored`]): their
    /// F32 tensors predict the inputs' BF16 and F16 ones, after the version's own files.
    pub(super) beside: Option<&'a [ObjectId]>,
    /// Tensors stored while their file was written ([`super::pieces`]): taken as stored, not
    /// coded again from the holes they left.
    pub(super) pieces: Vec<Piece>,
    /// Whether the caller holds the writer lock. Then the blobs written from a file that
    /// changed while it was read are removed again: nothing else can have stored or referred
    /// to them meanwhile.
    pub(super) locked: bool,
}

/// What [`Repo::store_inputs`] stored.
pub(super) struct StoredInputs {
    /// Every object written (blobs and manifests), in the index already.
    pub(super) objects: Vec<Written>,
    /// Each input's entry, in input order.
    pub(super) entries: Vec<FileEntry>,
}

impl Repo {
    /// Hashes `inputs`, pairs them with `plan.reference`, stores every blob and manifest the
    /// store lacks and returns the inputs' entries. Every input is read by the end; one that
    /// changed meanwhile (a training loop rewriting it with O_TRUNC) fails it
    /// ([`Error::FileChanged`]), checked before the store's own error, which such a change may
    /// have caused: the objects written from it are complete but unreferenced (gc deletes them),
    /// and a retry reads the file anew.
    pub(super) fn store_inputs(&self, inputs: &[Input], plan: ObjectPlan<'_>) -> Result<StoredInputs> {
        let mut references = ReferenceFiles::new(plan.reference);
        let hashed: Vec<HashedFile> =
            inputs.iter().map(|input| HashedFile::of(input, references.blobs_for_input(self, input))).collect();
        let from_pieces: HashSet<ObjectId> = plan.pieces.iter().map(|p| p.id).collect();
        let jobs = self.jobs_to_store(&hashed, &from_pieces);
        let derivations = match plan.derive {
            Some((kept, parent)) => self.plan_derivations(inputs, &hashed, kept, (plan.beside, parent)),
            None => Derivations::default(),
        };
        // A blob derived from a blob this commit writes is coded right after it, in the same
        // unit of work, from the same input bytes (pages still in the cache): it needs how its
        // reference was stored (chunk size, depth), not its content from the store.
        let units = derivations.units(&jobs, &hashed);
        // Derived blobs whose reference this commit writes are coded in the same pass but
        // stored only once it is durable (below): a crash in between must not leave one whose
        // reference is missing, which a later commit would deduplicate against.
        let unsynced = Mutex::new(Vec::new());
        // Written through a view of the store that fsyncs and renames the objects on other
        // threads while the next ones are coded; it returns once all are durable, before the
        // version that points to them is written.
        let stored = self.store.with_background_sync(|store| {
            let mut objects = Vec::with_capacity(plan.pieces.len());
            for blob in plan.pieces.into_iter().filter_map(|p| p.blob) {
                objects.push(store.persist_unsynced(blob)?);
            }
            let coding = Coding { store, inputs, hashed: &hashed, deltas: plan.deltas, derivations: &derivations };
            objects.extend(self.store_units(&coding, &units, &unsynced)?);
            let mut entries = Vec::with_capacity(inputs.len());
            for (input, h) in inputs.iter().zip(&hashed) {
                let (entry, written) = self
                    .write_manifest(store, input, h)
                    .map_err(|e| Error::File { path: input.path.to_string(), source: Box::new(e) })?;
                objects.extend(written);
                entries.push(entry);
            }
            Ok::<_, Error>(StoredInputs { objects, entries })
        });
        if let Some(changed) = inputs.iter().position(|i| i.check_unchanged().is_err()) {
            if plan.locked {
                self.remove_written_from_changed(inputs, &hashed, &jobs, &derivations);
            }
            return Err(Error::FileChanged { path: inputs[changed].path.to_string() });
        }
        let stored = stored?;
        // Every input was unchanged up to here, so these were predicted from their
        // references' content; their references are durable now.
        let unsynced = unsynced.into_inner().unwrap_or_else(|p| p.into_inner());
        // (Their objects are among those `store_units` returned.)
        self.store.with_background_sync(|store| unsynced.into_iter().try_for_each(|d| store.keep(d).map(drop)))?;
        for w in &stored.objects {
            self.index_object(w);
        }
        Ok(stored)
    }

    /// Removes the blobs written from inputs that changed while they were read: they may hold
    /// other bytes than their id says (the id (blake3) and the xxh3 the store checks the coded
    /// bytes against are taken in one pass but are two reads of the map, which a concurrent
    /// rewrite can tell apart), and no later commit may deduplicate against them. (Jobs name
    /// only objects that were not stored before; the caller holds the writer lock, so nothing
    /// refers to them yet.)
    fn remove_written_from_changed(
        &self,
        inputs: &[Input],
        hashed: &[HashedFile],
        jobs: &[Job],
        derivations: &Derivations,
    ) {
        let mut removed = HashSet::new();
        for job in jobs.iter().filter(|j| inputs[j.file].check_unchanged().is_err()) {
            let id = hashed[job.file].id_of(job.target);
            let _ = self.store.remove(&id);
            removed.insert(id);
        }
        // A blob derived from a removed one would be left without its reference, and a later
        // commit would deduplicate against it. One predicted from the bytes of a file that
        // changed (its reference may be stored, even from an earlier commit) has a residual
        // against other bytes than its reference's: it would decode to other bytes than its id
        // says.
        let changed_source =
            |j: &Job| derivations.at_hand_source(j).is_some_and(|(file, _)| inputs[file].check_unchanged().is_err());
        let dangling = |j: &Job| derivations.source_of(j).is_some_and(|s| removed.contains(&s));
        for job in jobs.iter().filter(|j| dangling(j) || changed_source(j)) {
            let _ = self.store.remove(&hashed[job.file].id_of(job.target));
        }
    }

    /// What must be stored of `hashed`: every segment not in a bundle, and every bundle
    /// (bundled tensors are stored in their bundle, not as blobs of their own), each id once and
    /// only if the store lacks it and it is not among `from_pieces` (stored already).
    fn jobs_to_store(&self, hashed: &[HashedFile], from_pieces: &HashSet<ObjectId>) -> Vec<Job> {
        let mut seen = HashSet::new();
        hashed
            .iter()
            .enumerate()
            .flat_map(|(f, h)| {
                let segments = h.segments.iter().enumerate().filter(|(_, seg)| seg.bundle.is_none());
                let segments = segments
                    .filter(|(_, seg)| !from_pieces.contains(&seg.id))
                    .map(move |(s, seg)| (Job { file: f, target: Target::Segment(s) }, seg.id));
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

    /// The cross-precision references of a commit's tensors (docs/format.md, "Derived blobs"):
    /// a BF16 or F16 tensor is derived from the F32 tensor of the same name and shape
    /// ([`PrecisionIndex`]) in this version (any file: an input or a file kept from the
    /// parent), else in the parent. An F32 tensor is derived from a narrow one already stored
    /// (a file of this version kept from the parent, else the parent's), unless this commit
    /// stores a new narrow namesake, which is then derived from it: a reference is always a
    /// blob stored before the one derived from it, so no two blobs refer to each other. The
    /// files `beside` the version (manifests) offer their F32 tensors to narrow ones, after
    /// the version's own files and before the parent's; with them (the git filter) F32 tensors
    /// are never widened from narrow ones: a narrow copy cleaned first is derived from its
    /// master once that is stored ([`Repo::derive_copies_from`]), as one commit of both
    /// stores them.
    fn plan_derivations(
        &self,
        inputs: &[Input],
        hashed: &[HashedFile],
        kept: &BTreeMap<String, FileEntry>,
        (beside, parent): (Option<&[ObjectId]>, Option<&Version>),
    ) -> Derivations {
        // Off only for benchmarks (benches/mixed_precision.py): what a build without derived
        // blobs stores, from the same binary.
        let off = std::env::var_os("CKPT_CROSS_PRECISION").is_some_and(|v| v == "off");
        let own =
            || hashed.iter().enumerate().flat_map(|(f, h)| h.own_blobs().map(move |(s, t, d, id)| (f, s, t, d, id)));
        if off || own().next().is_none() {
            return Derivations::default();
        }
        let mut this = PrecisionIndex::default();
        for (_, _, t, dtype, id) in own() {
            this.add(&t.name, &t.shape, dtype, id);
        }
        let named: HashSet<&str> = inputs.iter().map(|i| i.path.as_str()).collect();
        for f in kept.values().filter(|f| !named.contains(f.path.as_str())) {
            if let Ok(m) = self.manifest(&f.manifest) {
                this.add_manifest(&m);
            }
        }
        let previous = parent.map(|p| PrecisionIndex::of_version(self, p)).unwrap_or_default();
        // Narrow tensors this commit stores anew: they derive from their F32 namesake.
        let new_narrow: HashSet<PrecisionKey> = own()
            .filter(|(_, _, _, dtype, id)| matches!(dtype, Dtype::Bf16 | Dtype::F16) && !self.store.contains(id))
            .map(|(_, _, t, _, _)| precision_key(&t.name, &t.shape))
            .collect();
        // Read only when there is a narrow tensor to derive (a `git add` of many files that
        // have none reads no manifest of the others).
        let mut near = PrecisionIndex::default();
        let near_files = beside.unwrap_or_default().iter().filter(|_| !new_narrow.is_empty());
        for m in near_files.filter_map(|id| self.manifest(id).ok()) {
            near.add_manifest(&m);
        }
        let mut sources = HashMap::new();
        for (file, s, t, dtype, id) in own() {
            let source = match dtype {
                Dtype::Bf16 | Dtype::F16 => this
                    .source(&t.name, &t.shape, dtype)
                    .or_else(|| near.source(&t.name, &t.shape, dtype))
                    .or_else(|| previous.source(&t.name, &t.shape, dtype)),
                Dtype::F32 if beside.is_none() && !new_narrow.contains(&precision_key(&t.name, &t.shape)) => this
                    .source(&t.name, &t.shape, dtype)
                    .filter(|narrow| self.store.contains(narrow))
                    .or_else(|| previous.source(&t.name, &t.shape, dtype)),
                _ => None,
            };
            if let Some(source) = source.filter(|src| *src != id) {
                sources.insert((file, s), source);
            }
        }
        // Their bytes at hand when they are tensors of the inputs: predicted from those, not
        // decoded from the store.
        let mut at_hand = HashMap::new();
        let used: HashSet<ObjectId> = sources.values().copied().collect();
        for (file, s, _, _, id) in own().filter(|(.., id)| used.contains(id)) {
            at_hand.entry(id).or_insert((file, s));
        }
        Derivations { sources, at_hand }
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
        let written = if store.contains_fresh(&manifest_id) {
            None
        } else {
            Some(store.write_data(ObjectKind::Manifest, &bytes, &self.config.codec_options())?)
        };
        let entry = FileEntry { path: input.path.to_string(), manifest: manifest_id, len: manifest.len, hash: h.hash };
        Ok((entry, written))
    }

    /// Stores the blob of every job of `units`, as deltas where `coding.deltas` allows it and
    /// they pay, and derived from their cross-precision references where that pays: from the
    /// reference's bytes in the inputs when it is a tensor of this commit, else decoded from the
    /// store. A derived blob whose reference is written in the same unit is coded, not stored:
    /// it goes to `unsynced` for the caller to store once its reference is durable (its object
    /// is among those returned).
    fn store_units(
        &self,
        coding: &Coding<'_>,
        units: &[Vec<Job>],
        unsynced: &Mutex<Vec<DerivedBlob>>,
    ) -> Result<Vec<Written>> {
        let job_len = |j: &Job| coding.hashed[j.file].len_of(j.target);
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
                    let path = || coding.inputs[job.file].path.to_string();
                    let (w, form) = self.store_job(coding, job, &forms, unsynced, &progress).map_err(|e| match e {
                        Error::Store(store::Error::ChangedWhileWriting { .. }) => Error::FileChanged { path: path() },
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
    fn store_job(
        &self,
        coding: &Coding<'_>,
        job: &Job,
        forms: &HashMap<ObjectId, BlobForm>,
        unsynced: &Mutex<Vec<DerivedBlob>>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(Written, BlobForm)> {
        let s = match job.target {
            Target::Segment(s) => s,
            Target::Bundle(b) => return self.store_bundle(coding, job.file, b, progress),
        };
        let (store, input, h) = (coding.store, &coding.inputs[job.file], &coding.hashed[job.file]);
        let seg = &h.segments[s];
        let blob =
            Blob { id: seg.id, bytes: &input.map[seg.range.start as usize..seg.range.end as usize], dtype: seg.dtype };
        let start = seg.range.start as usize;
        let release_input = |r: Range<usize>| input.map.release(start + r.start..start + r.end);
        let feedback = Feedback { progress, release_input: &release_input, input_xxh3: Some(seg.xxh3) };
        if let (Some(source), Some(dtype)) = (coding.derivations.source_of(job), seg.dtype) {
            let at_hand = coding.derivations.at_hand_source(job).map(|(file, s)| {
                let range = &coding.hashed[file].segments[s].range;
                (file, range.start as usize..range.end as usize)
            });
            let release_source = |r: Range<usize>| {
                if let Some((file, range)) = &at_hand {
                    coding.inputs[*file].map.release(range.start + r.start..range.start + r.end);
                }
            };
            let source = match &at_hand {
                Some((file, range)) => DerivedFrom::AtHand {
                    id: source,
                    bytes: &coding.inputs[*file].map[range.clone()],
                    form: forms.get(&source),
                    release: &release_source,
                },
                None => DerivedFrom::Stored(source),
            };
            let derived = Derived { dtype, source, previous: h.reference_of(s), deltas: coding.deltas };
            if let Some(w) = self.store_derived(store, &blob, derived, unsynced, &feedback)? {
                return Ok(w);
            }
        }
        let reference = coding.deltas.and_then(|every| Some((h.reference_of(s)?, every)));
        self.store_blob(store, blob, reference, &feedback)
    }

    /// Stores bundle `b` of file `file` (see [`Self::store_units`]).
    fn store_bundle(
        &self,
        coding: &Coding<'_>,
        file: usize,
        b: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(Written, BlobForm)> {
        let (input, h) = (&coding.inputs[file], &coding.hashed[file]);
        let bundle = &h.bundles[b];
        let reference = coding.deltas.and_then(|every| Some((h.reference.bundle(&bundle.key)?, every)));
        // The members, gathered (at most `BUNDLE_MAX` bytes); the store checks that they are
        // the bytes hashed (xxh3), or the file changed meanwhile.
        let mut bytes = Vec::with_capacity(bundle.len as usize);
        for &m in &bundle.members {
            let r = &h.segments[m].range;
            bytes.extend_from_slice(&input.map[r.start as usize..r.end as usize]);
        }
        let feedback = Feedback { progress, release_input: &|_| {}, input_xxh3: Some(bundle.xxh3) };
        let blob = Blob { id: bundle.id, bytes: &bytes, dtype: Some(bundle.dtype) };
        self.store_blob(coding.store, blob, reference, &feedback)
    }

    /// Stores `blob` in `store`: as a delta against `reference` when that is allowed (its chain
    /// stays under the given `base_every`) and pays, else standalone.
    fn store_blob(
        &self,
        store: &Store,
        blob: Blob<'_>,
        reference: Option<(ObjectId, u32)>,
        feedback: &Feedback<'_>,
    ) -> Result<(Written, BlobForm)> {
        let options = self.config.codec_options();
        if let Some((r, base_every)) = reference.filter(|(r, _)| *r != blob.id) {
            // A damaged or missing reference only means no delta: store standalone.
            if let Ok(chain) = store.open_blob(&r) {
                if chain.depth() + 1 < base_every && chain.len() == blob.bytes.len() as u64 {
                    let limit = chain.base_stored_len();
                    if let Some(w) = self.write_delta(store, &blob, &chain, limit, feedback)? {
                        return Ok(w);
                    }
                }
            }
        }
        let w = store.write_blob(blob.id, blob.bytes, blob.dtype, &options, feedback)?;
        Ok((w, BlobForm::standalone(&w, options.chunk_size)))
    }

    /// Writes `blob` as a delta against `chain` if that is smaller than `limit` bytes; `None`
    /// when it is not, or the chain is damaged or missing (the caller stores the blob otherwise).
    fn write_delta(
        &self,
        store: &Store,
        blob: &Blob<'_>,
        chain: &BlobChain,
        limit: u64,
        feedback: &Feedback<'_>,
    ) -> Result<Option<(Written, BlobForm)>> {
        let options = self.config.codec_options();
        match store.write_blob_delta(blob.id, blob.bytes, chain, limit, &options, feedback) {
            Ok(DeltaOutcome::Written(w)) => Ok(Some((w, BlobForm::delta(&w, chain)))),
            Ok(DeltaOutcome::NotSmaller { .. }) => Ok(None),
            Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Stores `blob` derived from its cross-precision reference (docs/format.md, "Derived
    /// blobs") if that costs less than the alternatives: less than a standalone copy (estimated
    /// by the stored size of the standalone base of `derived.previous`, the same tensor's blob
    /// in the reference version, else the raw length) and, when version deltas are allowed
    /// (`derived.deltas`), less than the delta against `previous`. `None` when it does not pay
    /// or cannot be made (a source that is missing or damaged, dtypes or chunk sizes that do
    /// not pair): the caller stores the blob as usual.
    fn store_derived(
        &self,
        store: &Store,
        blob: &Blob<'_>,
        derived: Derived<'_>,
        unsynced: &Mutex<Vec<DerivedBlob>>,
        feedback: &Feedback<'_>,
    ) -> Result<Option<(Written, BlobForm)>> {
        let (id, bytes, dtype) = (blob.id, blob.bytes, derived.dtype);
        let options = self.config.codec_options();
        // Its reference written in this commit, not durable yet.
        let reference_unsynced = matches!(derived.source, DerivedFrom::AtHand { form: Some(_), .. });
        let previous = derived
            .previous
            .filter(|r| *r != id)
            .and_then(|r| store.open_blob(&r).ok())
            .filter(|chain| chain.len() == bytes.len() as u64);
        // A previous copy that is itself derived says nothing about a standalone copy's size.
        let standalone = previous
            .as_ref()
            .filter(|chain| chain.derived_from().is_none())
            .map_or(bytes.len() as u64 + store::HEADER_LEN as u64, |chain| chain.base_stored_len());
        let version_reference = previous.zip(derived.deltas);
        let target = DerivedTarget { id, data: bytes, dtype, limit: standalone };
        let coded = match derived.source {
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
            if let Some(w) = self.write_delta(store, blob, &chain, candidate.stored_len(), feedback)? {
                return Ok(Some(w));
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

    /// Runs `f` on every item, `len(item)` bytes of work each, showing progress under `label`:
    /// items under [`PARALLEL_BELOW`] in parallel, larger ones (each parallel inside the codec)
    /// one at a time, so memory stays bounded. `f` reports the bytes it has done so far. The
    /// coding of a commit and of a compaction both run through it.
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
}

/// Segments below this size are coded several at a time (each is at most one codec stripe or
/// so, which would leave cores idle); larger ones one at a time, parallel inside the codec.
const PARALLEL_BELOW: u64 = 4 << 20;

/// A file's segments and bundles with their ids, its whole-file hash and the blobs of the same
/// tensors (and bundles) in the reference version.
struct HashedFile {
    segments: Vec<HashedSegment>,
    bundles: Vec<HashedBundle>,
    hash: ObjectId,
    reference: TensorBlobs,
    /// Whether the file is a `.distcp` file (whose opaque segments pair too).
    distcp: bool,
}

impl HashedFile {
    /// `input` hashed ([`Input::hash`]), paired with the blobs of `reference`.
    fn of(input: &Input, reference: TensorBlobs) -> HashedFile {
        let (HashedSegments { segments, bundles }, hash) = input.hash();
        HashedFile { segments, bundles, hash, reference, distcp: input.distcp && input.torch.is_some() }
    }

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

    /// The non-empty tensor segments with a blob of their own (not bundled), as (segment,
    /// tensor, dtype, id): what may be derived from another precision, or be derived from.
    fn own_blobs(&self) -> impl Iterator<Item = (usize, &TensorRef, Dtype, ObjectId)> + '_ {
        self.segments.iter().enumerate().filter_map(|(s, seg)| {
            let tensor = seg.tensor.as_ref().filter(|_| seg.bundle.is_none() && seg.range.end > seg.range.start)?;
            Some((s, tensor, seg.dtype?, seg.id))
        })
    }

    /// The blob of segment `s`'s tensor in the reference version, if it has one; for an opaque
    /// segment of a `.distcp` file, the same item's framing ([`gap_key`]), else framing of the
    /// same length.
    fn reference_of(&self, s: usize) -> Option<ObjectId> {
        match &self.segments[s].tensor {
            Some(t) => self.reference.tensor(t),
            None if self.distcp => {
                let after = self.segments[s + 1..].iter().map(|seg| seg.tensor.as_ref());
                let range = &self.segments[s].range;
                self.reference.gap(&gap_key(after), range.end - range.start)
            }
            None => None,
        }
    }
}

/// One coding pass over a commit's inputs: what every job of it reads.
struct Coding<'a> {
    store: &'a Store,
    inputs: &'a [Input],
    hashed: &'a [HashedFile],
    /// As [`ObjectPlan::deltas`].
    deltas: Option<u32>,
    derivations: &'a Derivations,
}

/// A blob to store: its id, content and element type.
struct Blob<'a> {
    id: ObjectId,
    bytes: &'a [u8],
    dtype: Option<Dtype>,
}

/// How a blob may be derived ([`Repo::store_derived`]).
struct Derived<'a> {
    dtype: Dtype,
    /// Its cross-precision reference.
    source: DerivedFrom<'a>,
    /// The same tensor's blob in the reference version, if any.
    previous: Option<ObjectId>,
    /// As [`ObjectPlan::deltas`].
    deltas: Option<u32>,
}

/// The cross-precision references a commit plans ([`Repo::plan_derivations`]): per (file,
/// segment), the blob it is derived from if that pays.
#[derive(Default)]
struct Derivations {
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
