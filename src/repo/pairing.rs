//! Pairing: the same tensor in the reference version. A new file's tensors are delta-coded
//! against the same tensors (by name, dtype and shape; bundles by their first tensor) of one
//! file of a reference version: the file at the same path, or for a new path the reference
//! version's file that holds the most of its tensors ([`ReferenceFiles`]); a `.distcp` file's
//! against the same items in any `.distcp` file of the reference version, the one at the same
//! path first (DCP moves items between ranks; a change of rank count, between files). The
//! commit codes
//! against these, the reverse-delta rewrite (`compact`) rewrites them, and pushes send new
//! blobs as deltas against them ([`Repo::counterparts`], [`Manifest::same_tensor_blobs`]).

use super::cut::{Input, DISTCP_SUFFIX};
use super::model::{FileEntry, FileFormat, Manifest, TensorRef, Version};
use super::Repo;
use crate::object_id::ObjectId;
use crate::Dtype;
use std::collections::{HashMap, HashSet};

/// The files of the reference version, for finding each input's reference manifest.
pub(super) struct ReferenceFiles<'v> {
    version: Option<&'v Version>,
    /// The reference version's files, most recently changed first (see [`Self::by_recency`]),
    /// computed on first need.
    recency: Option<Vec<&'v FileEntry>>,
    /// Manifests loaded so far, by id.
    manifests: HashMap<ObjectId, Manifest>,
    /// The blobs of every `.distcp` file's tensors in the reference version, by name, dtype and
    /// shape (the most recently changed file's first), computed on first need.
    distcp: Option<TensorBlobs>,
}

/// Versions walked back along first parents to order the reference version's files by when they
/// last changed; files unchanged for longer come after, in path order.
const RECENCY_WALK: usize = 32;

impl<'v> ReferenceFiles<'v> {
    pub(super) fn new(version: Option<&'v Version>) -> Self {
        ReferenceFiles::with_manifests(version, HashMap::new())
    }

    /// [`Self::new`], with `manifests` read elsewhere (a rank saving to a remote downloads the
    /// previous version's manifests it needs without storing them): looked up before the store.
    pub(super) fn with_manifests(version: Option<&'v Version>, manifests: HashMap<ObjectId, Manifest>) -> Self {
        ReferenceFiles { version, recency: None, manifests, distcp: None }
    }

    /// The blobs `input`'s tensors are delta-coded against: of its reference file
    /// ([`Self::for_input`]), or for a `.distcp` file, [`Self::distcp_blobs`].
    pub(super) fn blobs_for_input(&mut self, repo: &Repo, input: &Input) -> TensorBlobs {
        if input.distcp {
            return self.distcp_blobs(repo, input.path.as_str());
        }
        self.for_input(repo, input).as_ref().map(TensorBlobs::of).unwrap_or_default()
    }

    /// The blobs a `.distcp` file at `path` is delta-coded against: each item's in the reference
    /// version's file at `path`, or else in any `.distcp` file of that version holding it (same
    /// name, dtype and shape; the most recently changed file first, as [`Self::for_file`]
    /// orders them). DCP's de-duplication may write an item from another rank than last time,
    /// and a change of rank count moves items between files; names (fqn and chunk offsets) are
    /// unique in a checkpoint, so the index holds each item of the latest save once.
    pub(super) fn distcp_blobs(&mut self, repo: &Repo, path: &str) -> TensorBlobs {
        let Some(version) = self.version else { return TensorBlobs::default() };
        let mut out = TensorBlobs::default();
        if let Some(m) = version.file(path).and_then(|f| load(&mut self.manifests, repo, &f.manifest)) {
            out.add(m);
        }
        if self.distcp.is_none() {
            let recency = self.recency.get_or_insert_with(|| Self::by_recency(repo, version));
            let mut index = TensorBlobs::default();
            for f in recency.iter().filter(|f| f.path.ends_with(DISTCP_SUFFIX)) {
                if let Some(m) = load(&mut self.manifests, repo, &f.manifest).filter(|m| m.kind == FileFormat::Distcp) {
                    index.add(m);
                }
            }
            self.distcp = Some(index);
        }
        if let Some(index) = &self.distcp {
            out.add_missing(index);
        }
        out
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
    pub(super) fn for_input(&mut self, repo: &Repo, input: &Input) -> Option<Manifest> {
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
    pub(super) fn for_file(
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

/// The blobs of a reference file's tensors: whole tensors by their tensor, bundles by their
/// first member's tensor. Bundled tensors have no blob of their own and pair only through
/// their bundle (whose length the consumers check).
#[derive(Default)]
pub(super) struct TensorBlobs {
    tensors: HashMap<TensorRef, ObjectId>,
    bundles: HashMap<TensorRef, ObjectId>,
    /// The opaque segments of `.distcp` files, by [`gap_key`]: an item's zip framing and pickle,
    /// the same length and nearly the same bytes in every save (a random `serialization_id` and
    /// the CRCs differ), so they are delta-coded against the same item's as tensors are.
    gaps: HashMap<String, (ObjectId, u64)>,
    /// The same, by length: an item with no namesake (the chunks of a save on another number
    /// of ranks are named anew) has framing of the same length as other items of its dtype and
    /// rank of shape, which differs from it in a few bytes (names, sizes, the random id).
    gaps_by_len: HashMap<u64, ObjectId>,
}

/// What names the opaque segment `segments[i]` of a `.distcp` file across versions: the name of
/// the first tensor after it (whose item's local headers and pickle it ends with), or `(end)`
/// for the bytes after the last tensor.
pub(super) fn gap_key<'t>(mut after: impl Iterator<Item = Option<&'t TensorRef>>) -> String {
    after.find_map(|t| t.map(|t| t.name.clone())).unwrap_or_else(|| "(end)".to_string())
}

impl TensorBlobs {
    /// The blobs of `reference`'s tensors and bundles.
    pub(super) fn of(reference: &Manifest) -> TensorBlobs {
        let mut out = TensorBlobs::default();
        out.add(reference);
        out
    }

    /// Adds the blobs of `reference`'s tensors and bundles not held yet (those held stay), and
    /// of a `.distcp` file, its opaque segments' ([`gap_key`]).
    fn add(&mut self, reference: &Manifest) {
        if reference.kind == FileFormat::Distcp {
            let segments = &reference.segments;
            for (i, s) in segments.iter().enumerate() {
                if let (None, Some(blob)) = (&s.tensor, s.blob) {
                    let key = gap_key(segments[i + 1..].iter().map(|s| s.tensor.as_ref()));
                    self.gaps.entry(key).or_insert((blob, s.len));
                    self.gaps_by_len.entry(s.len).or_insert(blob);
                }
            }
        }
        for (t, s) in reference.tensors() {
            if let Some(blob) = s.blob {
                self.tensors.entry(t.clone()).or_insert(blob);
            }
        }
        for (k, b) in reference.bundle_keys().into_iter().zip(&reference.bundles) {
            if let Some(k) = k {
                self.bundles.entry(k.clone()).or_insert(b.blob);
            }
        }
    }

    /// Adds `other`'s blobs of tensors and bundles not held yet.
    fn add_missing(&mut self, other: &TensorBlobs) {
        for (t, blob) in &other.tensors {
            self.tensors.entry(t.clone()).or_insert(*blob);
        }
        for (k, blob) in &other.bundles {
            self.bundles.entry(k.clone()).or_insert(*blob);
        }
        for (k, blob) in &other.gaps {
            self.gaps.entry(k.clone()).or_insert(*blob);
        }
        for (len, blob) in &other.gaps_by_len {
            self.gaps_by_len.entry(*len).or_insert(*blob);
        }
    }

    /// The blob of tensor `t` stored whole, if the reference holds it so.
    pub(super) fn tensor(&self, t: &TensorRef) -> Option<ObjectId> {
        self.tensors.get(t).copied()
    }

    /// The blob of the opaque segment of a `.distcp` file named `key` ([`gap_key`]), else of
    /// one of the same length, if the reference has one of `len` bytes (a delta pairs blobs of
    /// one length).
    pub(super) fn gap(&self, key: &str, len: u64) -> Option<ObjectId> {
        let named = self.gaps.get(key).filter(|(_, l)| *l == len).map(|(blob, _)| *blob);
        named.or_else(|| self.gaps_by_len.get(&len).copied())
    }

    /// The blob of the bundle starting with tensor `key`, if the reference has one.
    pub(super) fn bundle(&self, key: &TensorRef) -> Option<ObjectId> {
        self.bundles.get(key).copied()
    }
}

/// A tensor's name without wrapper prefixes, and its shape ([`precision_key`]).
pub(super) type PrecisionKey = (String, Vec<u64>);

pub(super) use crate::file_codec::precision_key;

/// Whether `dtype` takes part in cross-precision references.
fn is_precision_dtype(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::Bf16 | Dtype::F16)
}

/// The float tensors of one version stored as blobs of their own (bundled tensors have none), by
/// [`precision_key`], the first blob per dtype: where a cross-precision reference is looked for
/// (docs/format.md, "Derived blobs"). Any file of the version may hold the partner: a
/// `model_bf16.safetensors` beside `model_fp32.safetensors`, or the fp32 master weights in
/// another file than the low-precision copy.
#[derive(Default)]
pub(super) struct PrecisionIndex {
    blobs: HashMap<PrecisionKey, Vec<(Dtype, ObjectId)>>,
}

impl PrecisionIndex {
    /// Adds a tensor's blob, unless one of its key and dtype is held already.
    pub(super) fn add(&mut self, name: &str, shape: &[u64], dtype: Dtype, blob: ObjectId) {
        if !is_precision_dtype(dtype) {
            return;
        }
        let entry = self.blobs.entry(precision_key(name, shape)).or_default();
        if !entry.iter().any(|(d, _)| *d == dtype) {
            entry.push((dtype, blob));
        }
    }

    /// Adds every tensor blob of `m`.
    pub(super) fn add_manifest(&mut self, m: &Manifest) {
        for (t, seg) in m.tensors() {
            if let (Some(blob), Some(dtype)) = (seg.blob, Dtype::from_safetensors_name(&t.dtype)) {
                if seg.len > 0 {
                    self.add(&t.name, &t.shape, dtype, blob);
                }
            }
        }
    }

    /// The index of every file of `version` (files whose manifest cannot be read are left out:
    /// they only cost a reference).
    pub(super) fn of_version(repo: &Repo, version: &Version) -> PrecisionIndex {
        let mut index = PrecisionIndex::default();
        for f in &version.files {
            if let Ok(m) = repo.manifest(&f.manifest) {
                index.add_manifest(&m);
            }
        }
        index
    }

    /// The blob of the same tensor in another precision a tensor of `dtype` is predicted from:
    /// for BF16 or F16, the F32 one; for F32, a BF16 (else F16) one.
    pub(super) fn source(&self, name: &str, shape: &[u64], dtype: Dtype) -> Option<ObjectId> {
        let partners = self.blobs.get(&precision_key(name, shape))?;
        let find = |want: Dtype| partners.iter().find(|(d, _)| *d == want).map(|(_, b)| *b);
        match dtype {
            Dtype::Bf16 | Dtype::F16 => find(Dtype::F32),
            Dtype::F32 => find(Dtype::Bf16).or_else(|| find(Dtype::F16)),
            _ => None,
        }
    }
}

/// A blob of a new file and the blob of the same tensor (or bundle) in the reference file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counterpart {
    /// The new file's blob.
    pub(crate) new: ObjectId,
    /// The reference file's blob of the same tensor or bundle.
    pub(crate) old: ObjectId,
    /// The new blob's length (the segment's, or the bundle's).
    pub(crate) len: u64,
}

impl Manifest {
    /// Pairs each blob of this manifest with the blob of the same tensor in `reference`:
    /// tensors by name, dtype and shape, bundles by their first tensor (as a commit matches
    /// them); whole tensors in file order, then bundles in order; then for a `.distcp` file,
    /// its opaque segments with the same item's (or framing of the same length: [`gap_key`]).
    pub(crate) fn same_tensor_blobs(&self, reference: &Manifest) -> Vec<Counterpart> {
        self.same_tensor_blobs_in(&TensorBlobs::of(reference))
    }

    /// [`Self::same_tensor_blobs`] against the blobs `older` of a reference.
    fn same_tensor_blobs_in(&self, older: &TensorBlobs) -> Vec<Counterpart> {
        let tensors = self
            .tensors()
            .filter_map(|(t, seg)| Some(Counterpart { new: seg.blob?, old: older.tensor(t)?, len: seg.len }));
        let bundles = self
            .bundle_keys()
            .into_iter()
            .zip(&self.bundles)
            .filter_map(|(k, b)| Some(Counterpart { new: b.blob, old: older.bundle(k?)?, len: b.len }));
        let mut out: Vec<Counterpart> = tensors.chain(bundles).collect();
        if self.kind == FileFormat::Distcp {
            for (i, s) in self.segments.iter().enumerate() {
                if let (None, Some(new)) = (&s.tensor, s.blob) {
                    let key = gap_key(self.segments[i + 1..].iter().map(|s| s.tensor.as_ref()));
                    out.extend(older.gap(&key, s.len).map(|old| Counterpart { new, old, len: s.len }));
                }
            }
        }
        out
    }

    /// Whether every tensor stored as a blob of its own and every bundle of this manifest has a
    /// counterpart in `reference` ([`Self::same_tensor_blobs`]): then no other reference file
    /// can add one.
    pub(crate) fn pairs_every_tensor_with(&self, reference: &Manifest) -> bool {
        let older = TensorBlobs::of(reference);
        self.tensors().all(|(t, s)| s.blob.is_none() || older.tensor(t).is_some())
            && self.bundle_keys().into_iter().all(|k| k.is_some_and(|k| older.bundle(k).is_some()))
    }
}

impl Repo {
    /// [`Repo::counterparts`] of the `.distcp` file `manifest` at `path`, looking up the
    /// reference version's manifests in `manifests` before this store: a rank saving to a
    /// remote pairs its file with the previous version's there, whose manifests it downloaded
    /// without storing them (a manifest in its cache would claim the file's blobs are there).
    pub(crate) fn distcp_counterparts_in(
        &self,
        path: &str,
        manifest: &Manifest,
        reference: &Version,
        manifests: HashMap<ObjectId, Manifest>,
    ) -> Vec<Counterpart> {
        let mut references = ReferenceFiles::with_manifests(Some(reference), manifests);
        manifest.same_tensor_blobs_in(&references.distcp_blobs(self, path))
    }

    /// Pairs each blob of `files` (path and manifest of each new file, in order) with the blob
    /// of the same tensor in `reference`'s file at the same path or, for a new path, in the file
    /// a commit would code it against ([`ReferenceFiles::for_file`]); a `.distcp` file's blobs,
    /// with the same items in any `.distcp` file of `reference`, as a commit pairs them
    /// ([`ReferenceFiles::distcp_blobs`]). Files without a reference file contribute nothing.
    pub(crate) fn counterparts<'m>(
        &self,
        files: impl IntoIterator<Item = (&'m str, &'m Manifest)>,
        reference: &Version,
    ) -> Vec<Counterpart> {
        let mut references = ReferenceFiles::new(Some(reference));
        let mut out = Vec::new();
        for (path, m) in files {
            if m.kind == FileFormat::Distcp {
                out.extend(m.same_tensor_blobs_in(&references.distcp_blobs(self, path)));
                continue;
            }
            let tensors: HashSet<TensorRef> = m.tensors().map(|(t, _)| t.clone()).collect();
            let Some(reference) = references.for_file(self, path, (!tensors.is_empty()).then_some(tensors)) else {
                continue;
            };
            out.extend(m.same_tensor_blobs(&reference));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::{CommitOptions, Config, DeltaPolicy};
    use std::path::Path;

    fn fixture(dir: &str, name: &str) -> Vec<u8> {
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dcp").join(dir).join(name)).unwrap()
    }

    /// `.metadata` with the names `__0_0.distcp` and `__1_0.distcp` swapped (same length: the
    /// pickle stays valid), so that each rank's file holds the other's items.
    fn swap_ranks(metadata: &[u8]) -> Vec<u8> {
        let (a, b): (&[u8], &[u8]) = (b"__0_0.distcp", b"__1_0.distcp");
        let mut out = metadata.to_vec();
        for i in 0..=metadata.len() - a.len() {
            let window = &metadata[i..i + a.len()];
            if window == a || window == b {
                out[i..i + a.len()].copy_from_slice(if window == a { b } else { a });
            }
        }
        out
    }

    #[test]
    fn precisions_pair_by_name_without_wrappers_and_shape() {
        let (a, b, c) = (ObjectId::hash(b"a"), ObjectId::hash(b"b"), ObjectId::hash(b"c"));
        let mut index = PrecisionIndex::default();
        index.add("module.fc.weight", &[4, 8], Dtype::F32, a);
        index.add("fc.weight", &[4, 8], Dtype::F32, b); // a second F32 of the key: the first stays
        index.add("model.fc.weight", &[4, 8], Dtype::Bf16, c);
        index.add("fc.ids", &[4], Dtype::I64, c);
        assert_eq!(index.source("fc.weight", &[4, 8], Dtype::Bf16), Some(a));
        assert_eq!(index.source("_orig_mod.fc.weight", &[4, 8], Dtype::F16), Some(a));
        assert_eq!(index.source("fc.weight", &[8, 4], Dtype::Bf16), None, "another shape");
        assert_eq!(index.source("fc.weight", &[4, 8], Dtype::F32), Some(c));
        assert_eq!(index.source("fc.ids", &[4], Dtype::I64), None);
        assert_eq!(precision_key("state_dict.module.fc.weight", &[4, 8]), precision_key("fc.weight", &[4, 8]));
        assert_eq!(precision_key("model.", &[]), ("model.".to_string(), vec![]), "nothing left: kept");
    }

    #[test]
    fn distcp_blobs_pair_with_the_same_items_in_any_distcp_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config { delta_policy: DeltaPolicy::Previous, ..Config::default() };
        Repo::init(dir.path()).unwrap();
        std::fs::write(dir.path().join(".ckpt/config"), config.to_json()).unwrap();
        let repo = Repo::open(dir.path()).unwrap();
        let commit = |files: &[(&str, Vec<u8>)]| {
            std::fs::create_dir_all(dir.path().join("ck")).unwrap();
            for (name, bytes) in files {
                std::fs::write(dir.path().join("ck").join(name), bytes).unwrap();
            }
            let paths: Vec<String> = files.iter().map(|(n, _)| format!("ck/{n}")).collect();
            let abs: Vec<std::path::PathBuf> = paths.iter().map(|p| dir.path().join(p)).collect();
            let id = repo.commit(&abs, "save", &CommitOptions::default()).unwrap();
            repo.version(&id).unwrap()
        };
        let e1 = "mlp_2ranks_epoch1";
        let old = commit(&[
            (".metadata", fixture(e1, ".metadata")),
            ("__0_0.distcp", fixture(e1, "__0_0.distcp")),
            ("__1_0.distcp", fixture(e1, "__1_0.distcp")),
        ]);
        let e2 = "mlp_2ranks_epoch2";
        let new = commit(&[
            (".metadata", swap_ranks(&fixture(e2, ".metadata"))),
            ("__0_0.distcp", fixture(e2, "__1_0.distcp")),
            ("__1_0.distcp", fixture(e2, "__0_0.distcp")),
        ]);
        let manifest = |v: &Version, path: &str| repo.manifest(&v.file(path).unwrap().manifest).unwrap();
        let (new0, old1) = (manifest(&new, "ck/__0_0.distcp"), manifest(&old, "ck/__1_0.distcp"));
        assert_eq!(new0.kind, FileFormat::Distcp);
        // The same path's file holds none of the items: only framing of the same length pairs.
        let same_path = new0.same_tensor_blobs(&manifest(&old, "ck/__0_0.distcp"));
        assert!(same_path.iter().all(|c| !new0.bundles.iter().any(|b| b.blob == c.new)));
        // Through the index over every `.distcp` file, the bundle pairs with the one of the
        // other file that starts with the same item, and each item's framing with its own.
        let pairs = repo.counterparts([("ck/__0_0.distcp", &new0)], &old);
        let bundle = Counterpart { new: new0.bundles[0].blob, old: old1.bundles[0].blob, len: new0.bundles[0].len };
        assert!(pairs.contains(&bundle), "{pairs:?}");
        let gaps_of = |m: &Manifest| -> Vec<ObjectId> {
            m.segments.iter().filter(|s| s.tensor.is_none()).filter_map(|s| s.blob).collect()
        };
        let (new_gaps, old_gaps) = (gaps_of(&new0), gaps_of(&old1));
        assert_eq!(new_gaps.len(), old_gaps.len());
        for (n, o) in new_gaps.iter().zip(&old_gaps) {
            assert!(pairs.iter().any(|c| c.new == *n && c.old == *o), "framing {n} not paired with {o}");
        }
    }
}
