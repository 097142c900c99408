//! Inspection: `show` (how each tensor of a version is stored) and `diff` (what changed between
//! two versions, tensor by tensor). Both read only; `diff` decodes tensors window by window.

use super::model::{FileFormat, Manifest, Segment, TensorRef, Version};
use super::{Repo, Result, VersionId};
use crate::codec::{byte_group, Grouping, Method};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use crate::store::{BlobReader, ObjectKind};
use std::collections::{BTreeMap, HashSet};

/// Counts of (chunk, byte group) pairs per coding method.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MethodCounts {
    /// Groups stored as they are.
    pub raw: u64,
    /// All-zero groups (nothing stored).
    pub zero: u64,
    /// Huffman-coded groups.
    pub huffman: u64,
    /// zstd-coded groups.
    pub zstd: u64,
    /// Groups coded as sparse tokens (zstd).
    pub sparse: u64,
    /// rANS-coded groups.
    pub rans: u64,
    /// Groups coded as pairs (format 6): the paired group and the remainder group below it each
    /// count once.
    pub paired: u64,
    /// Groups of structured chunks (format 7: grids and masks of pruned tensors): the
    /// structured group and each group within it.
    pub grid: u64,
}

impl MethodCounts {
    fn add_method(&mut self, m: Method) {
        match m {
            Method::Raw => self.raw += 1,
            Method::Zero => self.zero += 1,
            Method::Huffman => self.huffman += 1,
            Method::Zstd => self.zstd += 1,
            Method::Sparse => self.sparse += 1,
            Method::Rans => self.rans += 1,
            Method::Paired | Method::Remainder => self.paired += 1,
            Method::Grid | Method::Within | Method::Masked => self.grid += 1,
        }
    }
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &MethodCounts) {
        self.raw += o.raw;
        self.zero += o.zero;
        self.huffman += o.huffman;
        self.zstd += o.zstd;
        self.sparse += o.sparse;
        self.rans += o.rans;
        self.paired += o.paired;
        self.grid += o.grid;
    }
    /// Total groups counted.
    pub fn total(&self) -> u64 {
        self.raw + self.zero + self.huffman + self.zstd + self.sparse + self.rans + self.paired + self.grid
    }
}

/// How a blob of a version is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// Added by this version as a standalone object.
    Base,
    /// Added by this version as an XOR delta against `reference`.
    Delta,
    /// Stored before: by an earlier version along first parents, or earlier in this version.
    Duplicate,
}

impl Storage {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Storage::Base => "base",
            Storage::Delta => "delta",
            Storage::Duplicate => "duplicate",
        }
    }
}

/// One segment (tensor, safetensors header, gap, or a whole opaque file) of a shown version.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SegmentShow {
    /// Tensor name, or `(header)`, `(gap)`, `(data)` for other segments.
    pub name: String,
    /// Whether the segment is a tensor.
    pub is_tensor: bool,
    /// safetensors dtype name (tensors only).
    pub dtype: Option<String>,
    /// Dimensions (tensors only).
    pub shape: Option<Vec<u64>>,
    /// The blob (for a tensor in a bundle: the bundle).
    pub blob: ObjectId,
    /// Where a bundled tensor starts in its bundle (`None`: the segment is the whole blob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_offset: Option<u64>,
    /// Length of the content.
    pub raw_bytes: u64,
    /// Size of the blob's object file (for a tensor in a bundle: its share of the bundle's,
    /// in proportion to its length; the shares add up to the bundle's size).
    pub stored_bytes: u64,
    /// Base, delta or duplicate.
    pub storage: Storage,
    /// The blob the object is a delta against (also for duplicates stored as deltas).
    pub reference: Option<ObjectId>,
    /// Deltas between the object and its standalone base (0: standalone).
    pub depth: u32,
    /// Chunks of the object's container (a bundle's are counted on its first tensor only, as
    /// are its methods, so that the totals count each once).
    pub chunks: u64,
    /// Byte groups per chunk.
    pub groups_per_chunk: u64,
    /// Methods of the (chunk, group) pairs of the object's own container.
    pub methods: MethodCounts,
    /// For a derived blob (a cross-precision reference, counted as a delta): the tensor its
    /// reference holds and the conversion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub derived_from: Option<DerivedFrom>,
}

/// What a derived blob is predicted from ([`SegmentShow::derived_from`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DerivedFrom {
    /// The name of a tensor of this version or its parent held by the reference blob (the
    /// blob id's first 12 hex digits when neither lists it).
    pub tensor: String,
    /// That tensor's dtype (`None` when not found).
    pub dtype: Option<String>,
    /// The reference blob.
    pub blob: ObjectId,
    /// The conversion: `round-nearest-even`, `truncate` or `widen`.
    pub rule: String,
}

/// One file of a shown version.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FileShow {
    /// Path relative to the repository root.
    pub path: String,
    /// How the file was split.
    pub kind: FileFormat,
    /// blake3 of the file.
    pub hash: ObjectId,
    /// File length.
    pub raw_bytes: u64,
    /// Sum of the object sizes of its segments (duplicates included).
    pub stored_bytes: u64,
    /// Sum of the object sizes of its segments stored by this version (base and delta).
    pub added_bytes: u64,
    /// Segments in file order.
    pub segments: Vec<SegmentShow>,
}

/// Totals of a shown version.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShowTotals {
    /// Files.
    pub files: u64,
    /// Tensors.
    pub tensors: u64,
    /// Segments stored standalone by this version.
    pub base: u64,
    /// Segments stored as deltas by this version.
    pub delta: u64,
    /// Segments stored before.
    pub duplicate: u64,
    /// Sum of the file lengths.
    pub raw_bytes: u64,
    /// Sum of the segments' object sizes (duplicates included; a blob counted once).
    pub stored_bytes: u64,
    /// Object bytes of the segments this version added (base and delta).
    pub added_bytes: u64,
    /// Bytes the version records as added to the store (blobs and manifests).
    pub version_stored_bytes: u64,
    /// Methods over every segment.
    pub methods: MethodCounts,
}

/// What `show` reports of one version.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ShowReport {
    /// The version's id.
    pub id: VersionId,
    /// Commit time, seconds since the Unix epoch (UTC).
    pub time: i64,
    /// Commit time as `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// Commit message.
    pub message: String,
    /// Parent ids.
    pub parents: Vec<VersionId>,
    /// Versions since the last full base (0: this version stores full bases).
    pub since_base: u32,
    /// Files, sorted by path.
    pub files: Vec<FileShow>,
    /// Totals.
    pub totals: ShowTotals,
}

/// A tensor's identity in a diff.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorName {
    /// File path.
    pub file: String,
    /// Tensor name.
    pub name: String,
    /// safetensors dtype name.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
}

/// A tensor whose dtype or shape differs between the two versions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Reshaped {
    /// File path.
    pub file: String,
    /// Tensor name.
    pub name: String,
    /// dtype in the first version.
    pub from_dtype: String,
    /// Shape in the first version.
    pub from_shape: Vec<u64>,
    /// dtype in the second version.
    pub to_dtype: String,
    /// Shape in the second version.
    pub to_shape: Vec<u64>,
}

/// Changes of one byte group (after exponent extraction, least significant byte first).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GroupChange {
    /// Elements whose byte in this group differs.
    pub changed: u64,
    /// `changed` as a percentage of the elements.
    pub percent: f64,
}

/// Changes of one tensor present in both versions with the same dtype and shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorDiff {
    /// File path.
    pub file: String,
    /// Tensor name.
    pub name: String,
    /// safetensors dtype name.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Element count.
    pub elements: u64,
    /// Elements whose bits differ.
    pub changed: u64,
    /// `changed` as a percentage of the elements (0 for an empty tensor).
    pub percent_changed: f64,
    /// Per byte group (after the codec's exponent extraction).
    pub byte_groups: Vec<GroupChange>,
    /// Largest |new − old| over changed elements with a finite difference (float dtypes only).
    pub max_abs_delta: Option<f64>,
    /// Changed elements whose difference is not finite (NaN or infinity involved; floats only).
    pub non_finite: u64,
}

/// What `diff` reports between two versions.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DiffReport {
    /// The first version.
    pub from: VersionId,
    /// The second version.
    pub to: VersionId,
    /// Tensors in both with the same dtype and shape, by file then name.
    pub tensors: Vec<TensorDiff>,
    /// Tensors only in the second version.
    pub added: Vec<TensorName>,
    /// Tensors only in the first version.
    pub removed: Vec<TensorName>,
    /// Tensors in both whose dtype or shape differ.
    pub reshaped: Vec<Reshaped>,
    /// Files only in the second version.
    pub files_added: Vec<String>,
    /// Files only in the first version.
    pub files_removed: Vec<String>,
    /// Files in both whose bytes differ.
    pub files_changed: Vec<String>,
}

impl Repo {
    /// How each segment of version `rev` is stored: base, delta (reference, depth) or
    /// duplicate, its sizes and the method mix of its chunks.
    pub fn show(&self, rev: &str) -> Result<ShowReport> {
        let id = self.resolve(rev)?;
        let v = self.version(&id)?;
        let earlier = self.ancestor_blobs(&v)?;
        let mut seen: HashSet<ObjectId> = HashSet::new();
        let mut totals = ShowTotals { version_stored_bytes: v.stored_bytes, ..ShowTotals::default() };
        let mut files = Vec::with_capacity(v.files.len());
        for f in &v.files {
            let m = self
                .manifest(&f.manifest)
                .map_err(|e| super::Error::File { path: f.path.clone(), source: Box::new(e) })?;
            let mut file = FileShow {
                path: f.path.clone(),
                kind: m.kind,
                hash: f.hash,
                raw_bytes: f.len,
                stored_bytes: 0,
                added_bytes: 0,
                segments: Vec::with_capacity(m.segments.len()),
            };
            // Each bundle's object, looked at once (at its first tensor): (show of the object,
            // whether this version is the first to list it).
            let mut bundles: Vec<Option<(SegmentShow, bool)>> = vec![None; m.bundles.len()];
            for (i, s) in m.segments.iter().enumerate() {
                let (blob, range) = m.location(s);
                let file_err = |e| super::Error::File { path: f.path.clone(), source: Box::new(e) };
                let (seg, first_here) = match s.bundle {
                    None => {
                        let first_here = seen.insert(blob);
                        let seg =
                            self.show_segment(&m, i, s, first_here && !earlier.contains(&blob)).map_err(file_err)?;
                        (seg, first_here)
                    }
                    Some(b) => {
                        let slot = &mut bundles[b as usize];
                        let (mut seg, first_here) = match slot {
                            Some((shown, first_here)) => {
                                let mut seg = shown.clone();
                                (seg.chunks, seg.methods) = (0, MethodCounts::default());
                                seg.name.clone_from(&s.tensor.as_ref().expect("bundles hold tensors").name);
                                (seg, *first_here)
                            }
                            None => {
                                let first_here = seen.insert(blob);
                                let new = first_here && !earlier.contains(&blob);
                                let seg = self.show_segment(&m, i, s, new).map_err(file_err)?;
                                *slot = Some((seg.clone(), first_here));
                                (seg, first_here)
                            }
                        };
                        let bundle_len = u128::from(m.bundles[b as usize].len.max(1));
                        let bundle_stored = u128::from(seg.stored_bytes);
                        let share = |at: u64| (bundle_stored * u128::from(at) / bundle_len) as u64;
                        seg.stored_bytes = share(range.end) - share(range.start);
                        seg.raw_bytes = s.len;
                        seg.bundle_offset = Some(range.start);
                        seg.dtype = s.tensor.as_ref().map(|t| t.dtype.clone());
                        seg.shape = s.tensor.as_ref().map(|t| t.shape.clone());
                        (seg, first_here)
                    }
                };
                file.stored_bytes += seg.stored_bytes;
                match seg.storage {
                    Storage::Base => totals.base += 1,
                    Storage::Delta => totals.delta += 1,
                    Storage::Duplicate => totals.duplicate += 1,
                }
                if seg.storage != Storage::Duplicate {
                    file.added_bytes += seg.stored_bytes;
                }
                if first_here {
                    totals.stored_bytes += seg.stored_bytes;
                }
                totals.tensors += u64::from(seg.is_tensor);
                totals.methods.add(&seg.methods);
                file.segments.push(seg);
            }
            totals.files += 1;
            totals.raw_bytes += file.raw_bytes;
            totals.added_bytes += file.added_bytes;
            files.push(file);
        }
        self.name_derivation_sources(&v, &mut files);
        Ok(ShowReport {
            id,
            time: v.time,
            date: super::format_time(v.time),
            message: v.message,
            parents: v.parents,
            since_base: v.since_base,
            files,
            totals,
        })
    }

    /// What each version of `history` (a [`Repo::log`], newest first, along first parents)
    /// takes in the store now: its version object plus the manifests and blobs it was the
    /// first along first parents to hold, at their current sizes. Unlike the `stored_bytes`
    /// a version records at commit time, this follows later rewrites: with reverse deltas a
    /// version is whole while it is the newest and a delta once a newer one is compacted. The
    /// figures of a history back to its root add up to what its versions take in the store.
    /// Objects that are missing or cannot be read count 0, and what they would have listed is
    /// not counted (`ckpt verify` names them): history stays readable in a damaged store.
    pub fn sizes_now(&self, history: &[super::VersionInfo]) -> Vec<u64> {
        let mut seen: HashSet<ObjectId> = HashSet::new();
        let mut sizes = vec![0; history.len()];
        let size = |id: &ObjectId| self.store.stored_len(id).unwrap_or(0);
        for (info, out) in history.iter().zip(sizes.iter_mut()).rev() {
            *out += size(&info.id);
            let Ok(v) = self.version(&info.id) else { continue };
            for f in &v.files {
                if seen.insert(f.manifest) {
                    *out += size(&f.manifest);
                    let Ok(m) = self.manifest(&f.manifest) else { continue };
                    for blob in m.blobs() {
                        if seen.insert(blob) {
                            *out += size(&blob);
                        }
                    }
                }
            }
        }
        sizes
    }

    /// Names the tensors derived blobs of `files` are derived from: a tensor of `v` or of its
    /// first parent held by the reference blob.
    fn name_derivation_sources(&self, v: &Version, files: &mut [FileShow]) {
        let derived = files.iter().flat_map(|f| &f.segments).any(|s| s.derived_from.is_some());
        if !derived {
            return;
        }
        let mut names: std::collections::HashMap<ObjectId, (String, String)> = std::collections::HashMap::new();
        let parent = v.parents.first().and_then(|p| self.version(p).ok());
        for f in v.files.iter().chain(parent.iter().flat_map(|p| &p.files)) {
            let Ok(m) = self.manifest(&f.manifest) else { continue };
            for (t, seg) in m.tensors() {
                if let Some(blob) = seg.blob {
                    names.entry(blob).or_insert_with(|| (t.name.clone(), t.dtype.clone()));
                }
            }
        }
        for d in files.iter_mut().flat_map(|f| &mut f.segments).filter_map(|s| s.derived_from.as_mut()) {
            if let Some((name, dtype)) = names.get(&d.blob) {
                d.tensor.clone_from(name);
                d.dtype = Some(dtype.clone());
            }
        }
    }

    /// Blob ids of every version before `v` along first parents.
    fn ancestor_blobs(&self, v: &Version) -> Result<HashSet<ObjectId>> {
        let mut blobs = HashSet::new();
        let mut manifests = HashSet::new();
        // A partial clone's history ends where a parent is missing (partial.rs).
        let partial = !self.cut_versions()?.is_empty();
        let here = |p: &VersionId| !partial || self.store.contains(p);
        let mut next = v.parents.first().copied().filter(here);
        let mut n = 0u64;
        while let Some(id) = next {
            let pv = self.version(&id)?;
            for f in &pv.files {
                if manifests.insert(f.manifest) {
                    blobs.extend(self.manifest(&f.manifest)?.blobs());
                }
            }
            next = pv.parents.first().copied().filter(here);
            n += 1;
            if n > 10_000_000 {
                return Err(super::Error::CorruptMetadata { id, reason: "history does not end".into() });
            }
        }
        Ok(blobs)
    }

    fn show_segment(&self, m: &Manifest, i: usize, s: &Segment, new: bool) -> Result<SegmentShow> {
        let (blob, _) = m.location(s);
        let raw = self.store.raw(&blob)?;
        if raw.header.kind != ObjectKind::Blob {
            return Err(crate::store::Error::WrongKind {
                id: blob,
                expected: ObjectKind::Blob,
                found: raw.header.kind,
            }
            .into());
        }
        let container = raw.container()?;
        let mut methods = MethodCounts::default();
        let mut groups_per_chunk = Grouping::for_dtype(raw.header.dtype).width as u64;
        for c in 0..container.chunk_count() {
            let (_, _, header) = container.chunk(c);
            groups_per_chunk = header.groups().len() as u64;
            for g in header.groups() {
                methods.add_method(g.method);
            }
        }
        let storage = match (new, raw.header.reference) {
            (false, _) => Storage::Duplicate,
            (true, None) => Storage::Base,
            (true, Some(_)) => Storage::Delta,
        };
        let name = match (&s.tensor, m.kind) {
            (Some(t), _) => t.name.clone(),
            (None, FileFormat::Bytes) => "(data)".into(),
            (None, FileFormat::Safetensors) if i == 0 => "(header)".into(),
            (None, FileFormat::Safetensors) => "(gap)".into(),
            (None, FileFormat::Torch | FileFormat::Distcp) => "(archive)".into(),
        };
        Ok(SegmentShow {
            name,
            is_tensor: s.tensor.is_some(),
            dtype: s.tensor.as_ref().map(|t| t.dtype.clone()),
            shape: s.tensor.as_ref().map(|t| t.shape.clone()),
            blob,
            bundle_offset: None,
            raw_bytes: s.len,
            stored_bytes: raw.bytes().len() as u64,
            storage,
            reference: raw.header.reference,
            depth: self.store.chain_depth(&blob)?,
            chunks: container.chunk_count() as u64,
            groups_per_chunk,
            methods,
            derived_from: match (raw.header.conversion, raw.header.reference) {
                (Some(rule), Some(reference)) => Some(DerivedFrom {
                    tensor: reference.short(12),
                    dtype: None,
                    blob: reference,
                    rule: rule.name().to_string(),
                }),
                _ => None,
            },
        })
    }

    /// Compares versions `a` and `b` tensor by tensor (matched by file path and tensor name):
    /// per tensor of the same dtype and shape, the elements and bytes per byte group that
    /// changed and the largest absolute change of float values; tensors and files added,
    /// removed or reshaped. Tensors are decoded window by window, both at once.
    pub fn diff(&self, a: &str, b: &str) -> Result<DiffReport> {
        let from = self.resolve(a)?;
        let to = self.resolve(b)?;
        let va = self.version(&from)?;
        let vb = self.version(&to)?;
        let mut report = DiffReport {
            from,
            to,
            tensors: Vec::new(),
            added: Vec::new(),
            removed: Vec::new(),
            reshaped: Vec::new(),
            files_added: Vec::new(),
            files_removed: Vec::new(),
            files_changed: Vec::new(),
        };
        type Tensors = BTreeMap<String, (TensorRef, Segment)>;
        let tensors_of = |path: &str, manifest: &ObjectId| -> Result<(Manifest, Tensors)> {
            let m = self
                .manifest(manifest)
                .map_err(|e| super::Error::File { path: path.to_string(), source: Box::new(e) })?;
            let tensors = m.tensors().map(|(t, s)| (t.name.clone(), (t.clone(), s.clone()))).collect();
            Ok((m, tensors))
        };
        let mut bundles = super::bundle::BundleCache::new();
        let name_of = |file: &str, t: &TensorRef| TensorName {
            file: file.to_string(),
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
        };
        // The items of `.distcp` files are compared by name across all the rank files of their
        // directory: DCP's de-duplication, or a save on another number of ranks, moves an item
        // to another file. Per directory, side (0: `a`, 1: `b`): manifests, and each item's
        // (manifest index, path, tensor, segment) by name.
        type Items = (Vec<Manifest>, BTreeMap<String, (usize, String, TensorRef, Segment)>);
        let mut distcp: BTreeMap<String, [Items; 2]> = BTreeMap::new();
        let mut pool = |side: usize, path: &str, (m, tensors): (Manifest, Tensors)| {
            let dir = path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
            let (manifests, items) = &mut distcp.entry(dir).or_default()[side];
            for (name, (t, seg)) in tensors {
                items.entry(name).or_insert((manifests.len(), path.to_string(), t, seg));
            }
            manifests.push(m);
        };
        for fa in &va.files {
            let Some(fb) = vb.file(&fa.path) else {
                report.files_removed.push(fa.path.clone());
                let (ma, ta) = tensors_of(&fa.path, &fa.manifest)?;
                if ma.kind == FileFormat::Distcp {
                    pool(0, &fa.path, (ma, ta));
                } else {
                    for (t, _) in ta.values() {
                        report.removed.push(name_of(&fa.path, t));
                    }
                }
                continue;
            };
            if fa.hash != fb.hash {
                report.files_changed.push(fa.path.clone());
            }
            let (ma, ta) = tensors_of(&fa.path, &fa.manifest)?;
            let (mb, tb) =
                if fb.manifest == fa.manifest { (ma.clone(), ta.clone()) } else { tensors_of(&fb.path, &fb.manifest)? };
            if ma.kind == FileFormat::Distcp && mb.kind == FileFormat::Distcp {
                pool(0, &fa.path, (ma, ta));
                pool(1, &fb.path, (mb, tb));
                continue;
            }
            for (name, (t1, s1)) in &ta {
                let Some((t2, s2)) = tb.get(name) else {
                    report.removed.push(name_of(&fa.path, t1));
                    continue;
                };
                self.compare_tensor(&mut report, &fa.path, name, (t1, &ma, s1), (t2, &mb, s2), &mut bundles)?;
            }
            for (name, (t2, _)) in &tb {
                if !ta.contains_key(name) {
                    report.added.push(name_of(&fb.path, t2));
                }
            }
        }
        for fb in &vb.files {
            if va.file(&fb.path).is_none() {
                report.files_added.push(fb.path.clone());
                let (mb, tb) = tensors_of(&fb.path, &fb.manifest)?;
                if mb.kind == FileFormat::Distcp {
                    pool(1, &fb.path, (mb, tb));
                } else {
                    for (t, _) in tb.values() {
                        report.added.push(name_of(&fb.path, t));
                    }
                }
            }
        }
        for [(manifests_a, items_a), (manifests_b, items_b)] in distcp.into_values() {
            for (name, (i1, path_a, t1, s1)) in &items_a {
                let Some((i2, path_b, t2, s2)) = items_b.get(name) else {
                    report.removed.push(name_of(path_a, t1));
                    continue;
                };
                // Reported under the file the item is in now.
                let (ma, mb) = (&manifests_a[*i1], &manifests_b[*i2]);
                self.compare_tensor(&mut report, path_b, name, (t1, ma, s1), (t2, mb, s2), &mut bundles)?;
            }
            for (name, (_, path_b, t2, _)) in &items_b {
                if !items_a.contains_key(name) {
                    report.added.push(name_of(path_b, t2));
                }
            }
        }
        Ok(report)
    }

    /// Adds the comparison of tensor `name` of `file` (`t1` as segment `s1` of `ma`, then `t2`
    /// as `s2` of `mb`) to `report`: reshaped, or compared element by element.
    fn compare_tensor(
        &self,
        report: &mut DiffReport,
        file: &str,
        name: &str,
        (t1, ma, s1): (&TensorRef, &Manifest, &Segment),
        (t2, mb, s2): (&TensorRef, &Manifest, &Segment),
        bundles: &mut super::bundle::BundleCache,
    ) -> Result<()> {
        if t1.dtype != t2.dtype || t1.shape != t2.shape {
            report.reshaped.push(Reshaped {
                file: file.to_string(),
                name: name.to_string(),
                from_dtype: t1.dtype.clone(),
                from_shape: t1.shape.clone(),
                to_dtype: t2.dtype.clone(),
                to_shape: t2.shape.clone(),
            });
            return Ok(());
        }
        let d = self
            .diff_tensor(file, t1, (ma, s1), (mb, s2), bundles)
            .map_err(|e| super::Error::File { path: format!("{file} [{name}]"), source: Box::new(e) })?;
        report.tensors.push(d);
        Ok(())
    }

    /// Compares tensor `t` as segment `a.1` of manifest `a.0` and `b.1` of `b.0`.
    fn diff_tensor(
        &self,
        file: &str,
        t: &TensorRef,
        (ma, a): (&Manifest, &Segment),
        (mb, b): (&Manifest, &Segment),
        bundles: &mut super::bundle::BundleCache,
    ) -> Result<TensorDiff> {
        let (blob_a, range_a) = ma.location(a);
        let (blob_b, range_b) = mb.location(b);
        let dtype = t.dtype().ok_or_else(|| super::Error::CorruptMetadata {
            id: blob_a,
            reason: format!("tensor {:?}: dtype {:?}", t.name, t.dtype),
        })?;
        let width = dtype.size();
        let elements = a.len / width as u64;
        let mut acc = DiffAcc::new(dtype);
        let mut grouped = Vec::new();
        if (blob_a, &range_a) == (blob_b, &range_b) {
            // The same bytes: nothing changed.
        } else if a.bundle.is_some() || b.bundle.is_some() {
            // A small tensor (a bundled one is below `BUNDLE_BELOW` bytes, and both sides have
            // the same length): compared whole.
            let mut bytes_of = |m: &Manifest, s: &Segment| -> Result<Vec<u8>> {
                if let Some(bytes) = bundles.segment(self, m, s)? {
                    return Ok(bytes.to_vec());
                }
                let (blob, _) = m.location(s);
                let chain = self.store.open_blob(&blob)?;
                if chain.len() != s.len || s.len >= super::bundle::BUNDLE_BELOW {
                    return Err(super::Error::CorruptMetadata {
                        id: blob,
                        reason: "blobs of one tensor differ in length".into(),
                    });
                }
                let mut bytes = Vec::with_capacity(s.len as usize);
                chain.copy_to(&mut bytes)?;
                Ok(bytes)
            };
            let (xa, xb) = (bytes_of(ma, a)?, bytes_of(mb, b)?);
            if xa.len() != xb.len() {
                return Err(super::Error::CorruptMetadata { id: blob_b, reason: "tensors differ in length".into() });
            }
            acc.add(&xa, &xb, &mut grouped)
                .map_err(|e| super::Error::CorruptMetadata { id: blob_b, reason: e.to_string() })?;
        } else {
            let ca = self.store.open_blob(&blob_a)?;
            let cb = self.store.open_blob(&blob_b)?;
            let (mut ra, mut rb) = (Stream::new(ca.reader()?), Stream::new(cb.reader()?));
            loop {
                let (more_a, more_b) = (ra.fill()?, rb.fill()?);
                if !more_a || !more_b {
                    if more_a || more_b {
                        return Err(super::Error::CorruptMetadata {
                            id: if more_a { blob_b } else { blob_a },
                            reason: "blobs of one tensor differ in length".into(),
                        });
                    }
                    break;
                }
                let (xa, xb) = (ra.rest(), rb.rest());
                let n = xa.len().min(xb.len());
                acc.add(&xa[..n], &xb[..n], &mut grouped)
                    .map_err(|e| super::Error::CorruptMetadata { id: blob_b, reason: e.to_string() })?;
                ra.pos += n;
                rb.pos += n;
            }
        }
        let percent = |c: u64| if elements == 0 { 0.0 } else { 100.0 * c as f64 / elements as f64 };
        Ok(TensorDiff {
            file: file.to_string(),
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            elements,
            changed: acc.changed,
            percent_changed: percent(acc.changed),
            byte_groups: acc.groups.iter().map(|&c| GroupChange { changed: c, percent: percent(c) }).collect(),
            max_abs_delta: if is_float(dtype) { Some(acc.max_abs) } else { None },
            non_finite: acc.non_finite,
        })
    }
}

/// A blob reader with a position inside its current window.
struct Stream<'a> {
    reader: BlobReader<'a>,
    pos: usize,
}

impl<'a> Stream<'a> {
    fn new(reader: BlobReader<'a>) -> Self {
        Stream { reader, pos: 0 }
    }
    /// Makes sure bytes are available; false at the end of the blob.
    fn fill(&mut self) -> Result<bool> {
        while self.pos >= self.reader.current().len() {
            if self.reader.next_window()?.is_none() {
                return Ok(false);
            }
            self.pos = 0;
        }
        Ok(true)
    }
    fn rest(&self) -> &[u8] {
        &self.reader.current()[self.pos..]
    }
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::Bf16 | Dtype::F16 | Dtype::F32 | Dtype::F64)
}

/// Running counts of a tensor diff.
struct DiffAcc {
    dtype: Dtype,
    grouping: Grouping,
    changed: u64,
    groups: Vec<u64>,
    max_abs: f64,
    non_finite: u64,
}

impl DiffAcc {
    fn new(dtype: Dtype) -> DiffAcc {
        let grouping = Grouping::for_dtype(Some(dtype));
        DiffAcc { dtype, grouping, changed: 0, groups: vec![0; grouping.width], max_abs: 0.0, non_finite: 0 }
    }

    /// Adds aligned slices (a whole number of elements) of the old and new tensor.
    fn add(&mut self, a: &[u8], b: &[u8], grouped: &mut Vec<u8>) -> crate::codec::Result<()> {
        let w = self.grouping.width;
        grouped.resize(a.len(), 0);
        byte_group::split(a, Some(b), self.grouping, grouped)?;
        let n = a.len() / w;
        for (g, count) in self.groups.iter_mut().enumerate() {
            *count += grouped[g * n..(g + 1) * n].iter().filter(|&&x| x != 0).count() as u64;
        }
        for (ea, eb) in a.chunks_exact(w).zip(b.chunks_exact(w)) {
            if ea == eb {
                continue;
            }
            self.changed += 1;
            if let (Some(x), Some(y)) = (to_f64(self.dtype, ea), to_f64(self.dtype, eb)) {
                let d = (y - x).abs();
                if d.is_finite() {
                    self.max_abs = self.max_abs.max(d);
                } else {
                    self.non_finite += 1;
                }
            }
        }
        Ok(())
    }
}

/// The value of one little-endian float element (`None` for other dtypes).
pub fn to_f64(dtype: Dtype, bytes: &[u8]) -> Option<f64> {
    Some(match dtype {
        Dtype::F64 => f64::from_le_bytes(bytes.try_into().ok()?),
        Dtype::F32 => f32::from_le_bytes(bytes.try_into().ok()?) as f64,
        Dtype::Bf16 => f32::from_bits((u16::from_le_bytes(bytes.try_into().ok()?) as u32) << 16) as f64,
        Dtype::F16 => f16_to_f64(u16::from_le_bytes(bytes.try_into().ok()?)),
        _ => return None,
    })
}

/// IEEE half precision to f64, by bit manipulation.
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1F) as i32;
    let man = (h & 0x3FF) as f64;
    sign * match exp {
        0 => man * 2f64.powi(-24),
        31 if man == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + man / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats_decode() {
        assert_eq!(f16_to_f64(0x3C00), 1.0);
        assert_eq!(f16_to_f64(0xC000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
        assert_eq!(f16_to_f64(0x7BFF), 65504.0);
        assert_eq!(f16_to_f64(0x7C00), f64::INFINITY);
        assert!(f16_to_f64(0x7E00).is_nan());
        assert_eq!(to_f64(Dtype::Bf16, &0x3F80u16.to_le_bytes()), Some(1.0));
        assert_eq!(to_f64(Dtype::Bf16, &0xC040u16.to_le_bytes()), Some(-3.0));
        assert_eq!(to_f64(Dtype::I32, &[0; 4]), None);
    }

    #[test]
    fn diff_counts_groups_and_deltas() {
        let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [1.0f32, 2.5, 3.0, -4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut acc = DiffAcc::new(Dtype::F32);
        acc.add(&a, &b, &mut Vec::new()).unwrap();
        assert_eq!(acc.changed, 2);
        assert_eq!(acc.max_abs, 8.0);
        // 2.0 -> 2.5 changes a mantissa bit of byte 2; 4 -> -4 only the sign, which the
        // exponent extraction moves to the top bit of byte 2 as well.
        assert_eq!(acc.groups, vec![0, 0, 2, 0]);
    }
}
