//! Manifests and versions: their JSON form (what is hashed) and the checks a reader applies.
//!
//! Serialization is `serde_json::to_vec` of these structs: compact, fields in declaration order,
//! strings escaped the serde_json way. The object id is the blake3 of exactly those bytes; a
//! reader hashes the bytes as stored and never re-serializes, so the canonical form matters
//! only for deduplication (the same manifest written twice gets the same id).

use super::path::RepoPath;
use super::{Error, Result};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Format number written in every version, and in every manifest without bundles. 2: a file's
/// `hash` is [`file_hash`] (format 1 used the blake3 of the whole file; its repositories are
/// not read).
pub const MODEL_FORMAT: u32 = 2;

/// Format number of a manifest with bundles ([`Bundle`]). Written only for those, so a
/// file without small tensors keeps the manifest (and id) it had, and a build that reads only
/// format 2 still reads every other file.
pub const BUNDLED_MANIFEST_FORMAT: u32 = 3;

/// Largest bundle, in bytes. A bundle is decoded whole when its tensors are read (checkout,
/// `diff`, verify), and one per dtype may be live at once: 4 MiB keeps that small while a
/// bundle is still many chunks (each coded and checked on its own).
pub(super) const BUNDLE_MAX: u64 = 4 << 20;

/// Caps on what a manifest or version may hold (docs/format.md, "Caps on untrusted sizes").
/// Manifests and versions arrive from remotes, so a reader must not let their bytes decide how
/// much memory it uses: a 421 KiB object can decode to a gigabyte of JSON listing 12 million
/// segments. The JSON size is capped by the store ([`crate::store::MAX_DATA_OBJECT_LEN`],
/// checked from the object's header before anything is decoded); the counts below are checked
/// while the JSON is parsed (a list fails at its first element past the cap, and is never
/// pre-allocated from a count it claims); string lengths after parsing (their memory is
/// bounded by the JSON size). A commit refuses to write anything past these caps, so every
/// object ckpt writes is one it can read.
pub mod limits {
    /// Segments in one manifest: a million tensors and gaps (a 70B-parameter model has about
    /// 1,000 tensors). Parsed, a segment takes about 150 bytes, so this bounds a manifest to
    /// some 300 MB of memory however its JSON is laid out.
    pub(crate) const MAX_SEGMENTS: usize = 1 << 20;
    /// Bundles in one manifest (at least 2 members each, so never more than half the segments).
    pub(crate) const MAX_BUNDLES: usize = MAX_SEGMENTS / 2;
    /// Dimensions of a tensor's shape (numpy allows 64; safetensors and torch files in practice
    /// use at most a handful).
    pub(crate) const MAX_DIMS: usize = 64;
    /// Bytes of a tensor name (names are dotted module paths, typically under 100 bytes).
    pub(crate) const MAX_NAME_LEN: usize = 64 << 10;
    /// Bytes of a dtype name (the longest safetensors name is 7 bytes).
    pub(crate) const MAX_DTYPE_LEN: usize = 16;
    /// Length of one file (a pebibyte: far beyond any checkpoint, small enough that sums of a
    /// million of them cannot overflow).
    pub(crate) const MAX_FILE_LEN: u64 = 1 << 50;
    /// Files in one version.
    pub(crate) const MAX_FILES: usize = 1 << 20;
    /// Parents of one version (ckpt writes at most one).
    pub(crate) const MAX_PARENTS: usize = 16;
    /// Bytes of a commit message (git has no limit; a megabyte is a long log).
    pub(crate) const MAX_MESSAGE_LEN: usize = 1 << 20;
}

/// A `Vec` deserialized element by element that refuses more than `max` elements, allocating
/// as elements arrive (never from a length the input claims).
fn bounded_seq<'de, D, T>(d: D, max: usize, what: &'static str) -> std::result::Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T> {
        max: usize,
        what: &'static str,
        marker: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {} {}", self.max, self.what)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() == self.max {
                    return Err(serde::de::Error::custom(format_args!(
                        "more than {} {} (the limit)",
                        self.max, self.what
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded { max, what, marker: std::marker::PhantomData })
}

fn bounded_segments<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<Segment>, D::Error> {
    bounded_seq(d, limits::MAX_SEGMENTS, "segments")
}

fn bounded_bundles<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<Bundle>, D::Error> {
    bounded_seq(d, limits::MAX_BUNDLES, "bundles")
}

fn bounded_shape<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<u64>, D::Error> {
    bounded_seq(d, limits::MAX_DIMS, "dimensions")
}

fn bounded_files<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<FileEntry>, D::Error> {
    bounded_seq(d, limits::MAX_FILES, "files")
}

fn bounded_parents<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<ObjectId>, D::Error> {
    bounded_seq(d, limits::MAX_PARENTS, "parents")
}

/// blake3 key-derivation context of [`file_hash`] (domain separation: a file hash can never
/// equal the id of a blob, manifest or version).
const FILE_HASH_CONTEXT: &str = "ckpt 2026-11-23 file hash from segment ids";

/// The hash that identifies a committed file's content: blake3 in key-derivation mode (context
/// `"ckpt 2026-11-23 file hash from segment ids"`) over the file length (u64 LE), the segment
/// count (u64 LE) and, per segment in file order, its length (u64 LE) and its blob id (the
/// blake3 of its bytes).
///
/// Why not the blake3 of the whole file: every segment is hashed anyway (a blob's id is the
/// blake3 of its bytes), so this costs nothing more, where a whole-file hash was a second
/// blake3 pass over every byte at commit (a quarter of a 2 GiB commit's hashing). It is just as
/// binding: blake3 is collision resistant and the lengths fix where each segment lies. How a
/// file is cut into segments depends only on its bytes, so equal files get equal hashes.
pub fn file_hash(len: u64, segments: impl ExactSizeIterator<Item = (u64, ObjectId)>) -> ObjectId {
    let mut hasher = blake3::Hasher::new_derive_key(FILE_HASH_CONTEXT);
    hasher.update(&len.to_le_bytes());
    hasher.update(&(segments.len() as u64).to_le_bytes());
    for (segment_len, id) in segments {
        hasher.update(&segment_len.to_le_bytes());
        hasher.update(&id.0);
    }
    ObjectId(*hasher.finalize().as_bytes())
}

/// How a committed file was split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// A safetensors file: header, tensors and gaps as separate blobs.
    Safetensors,
    /// Any other file: one opaque blob.
    Bytes,
    /// A `torch.save` archive: each storage a tensor blob, the bytes between them (zip headers,
    /// the pickle, other entries) as opaque blobs.
    Torch,
    /// A `torch.distributed.checkpoint` `.distcp` file: each tensor item (a shard, named by its
    /// fqn and chunk offsets) a tensor blob, the bytes between them (each item's zip framing and
    /// pickle, non-tensor items) as opaque blobs. Its tensors pair with the same items in any
    /// `.distcp` file of the reference version (`pairing`).
    Distcp,
}

/// One committed file: its bytes are the concatenation of its segments' blobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MODEL_FORMAT`].
    pub format: u32,
    /// How the file was split.
    pub kind: FileFormat,
    /// File length.
    pub len: u64,
    /// The file's content hash ([`file_hash`] of its segments).
    pub hash: ObjectId,
    /// Blobs that hold several small tensors each (format 3 only; empty in format 2).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "bounded_bundles")]
    pub bundles: Vec<Bundle>,
    /// Segments in file order, covering the file.
    #[serde(deserialize_with = "bounded_segments")]
    pub segments: Vec<Segment>,
}

/// A blob holding small tensors of one dtype of a file, concatenated in file order: the
/// segments whose `bundle` is its index, in manifest order. It is an ordinary tensor blob of
/// that dtype (byte grouping, chunk coding, dedup, XOR deltas against the same bundle of the
/// reference file, gc, verify), so that 20,000 tensors of 128 bytes are one object and one
/// coded stream instead of 20,000 objects of one file-system block each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// The blob (the blake3 of the members' bytes, concatenated).
    pub blob: ObjectId,
    /// safetensors dtype name of every member.
    pub dtype: String,
    /// Length in bytes: the sum of the members' lengths.
    pub len: u64,
}

/// A byte range of a file stored as one blob, or as a slice of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    /// Length in bytes (the blob's length).
    pub len: u64,
    /// The blob holding the bytes (its id is the blake3 of the bytes). `None` for a tensor in a
    /// bundle: its id is not recorded (32 bytes that do not compress, a quarter of a 128-byte
    /// tensor); the file hash, derived from every segment's id, still binds its bytes and is
    /// checked against the bundle's decoded slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<ObjectId>,
    /// The tensor these bytes are, for tensor segments of a safetensors file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorRef>,
    /// Index in [`Manifest::bundles`] of the bundle holding the bytes (format 3).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "in")]
    pub bundle: Option<u32>,
    /// Where the bytes start in the bundle (not stored: the members lie in manifest order;
    /// set by [`Manifest::parse`] and [`Manifest::new`]).
    #[serde(skip)]
    pub offset: u64,
}

impl Segment {
    /// A segment stored as its own blob.
    pub fn whole(len: u64, blob: ObjectId, tensor: Option<TensorRef>) -> Segment {
        Segment { len, blob: Some(blob), tensor, bundle: None, offset: 0 }
    }

    /// A tensor stored in bundle `bundle` (the offset is set by [`Manifest::new`]).
    pub fn bundled(len: u64, tensor: TensorRef, bundle: u32) -> Segment {
        Segment { len, blob: None, tensor: Some(tensor), bundle: Some(bundle), offset: 0 }
    }
}

/// Identity of a tensor for delta matching and `--tensor` filtering.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRef {
    /// The tensor's name (data, never a path).
    pub name: String,
    /// safetensors dtype name.
    pub dtype: String,
    /// Dimensions.
    #[serde(deserialize_with = "bounded_shape")]
    pub shape: Vec<u64>,
}

impl TensorRef {
    /// The reference to a tensor of a parsed safetensors header.
    pub fn of(t: &crate::safetensors::TensorInfo) -> TensorRef {
        TensorRef { name: t.name.clone(), dtype: t.dtype.safetensors_name().to_string(), shape: t.shape.clone() }
    }

    /// The reference to a storage of a `torch.save` archive.
    pub(crate) fn of_storage(s: &crate::torch_zip::Storage) -> TensorRef {
        TensorRef { name: s.name.clone(), dtype: s.dtype.safetensors_name().to_string(), shape: s.shape.clone() }
    }

    /// The parsed dtype (checked by [`Manifest::parse`]).
    pub fn dtype(&self) -> Option<Dtype> {
        Dtype::from_safetensors_name(&self.dtype)
    }
}

/// A version (commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Version {
    /// [`MODEL_FORMAT`].
    pub format: u32,
    /// Parent versions (none for the first version; one otherwise).
    #[serde(deserialize_with = "bounded_parents")]
    pub parents: Vec<ObjectId>,
    /// Commit time, seconds since the Unix epoch (UTC).
    pub time: i64,
    /// Commit message.
    pub message: String,
    /// Versions since the last full-base version along first parents (0: this one stores
    /// full bases).
    pub since_base: u32,
    /// The files, sorted by path, paths unique.
    #[serde(deserialize_with = "bounded_files")]
    pub files: Vec<FileEntry>,
    /// Sum of the files' lengths.
    pub raw_bytes: u64,
    /// Bytes of objects this commit added to the store (blobs and manifests).
    pub stored_bytes: u64,
}

/// One file of a version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Path relative to the repository root, `/`-separated.
    pub path: String,
    /// The file's manifest.
    pub manifest: ObjectId,
    /// File length.
    pub len: u64,
    /// The file's content hash ([`file_hash`]).
    pub hash: ObjectId,
}

fn corrupt(id: ObjectId, reason: impl Into<String>) -> Error {
    Error::CorruptMetadata { id, reason: reason.into() }
}

/// The JSON of a manifest or version is at most [`crate::store::MAX_DATA_OBJECT_LEN`] bytes
/// (the store checks this from an object's header before decoding it; checked again here for
/// callers that parse bytes from elsewhere).
fn check_json_len(id: ObjectId, bytes: &[u8], what: &str) -> Result<()> {
    if bytes.len() as u64 > crate::store::MAX_DATA_OBJECT_LEN {
        return Err(corrupt(
            id,
            format!("a {what} of {} bytes (at most {})", bytes.len(), crate::store::MAX_DATA_OBJECT_LEN),
        ));
    }
    Ok(())
}

impl Manifest {
    /// A manifest of `segments` and `bundles` (format 3 if there are bundles, else 2), with
    /// each bundled segment's offset set.
    pub fn new(kind: FileFormat, len: u64, hash: ObjectId, bundles: Vec<Bundle>, segments: Vec<Segment>) -> Manifest {
        let format = if bundles.is_empty() { MODEL_FORMAT } else { BUNDLED_MANIFEST_FORMAT };
        let mut m = Manifest { format, kind, len, hash, bundles, segments };
        m.place_bundled();
        m
    }

    /// Sets the offset of every bundled segment (its members lie in manifest order); returns
    /// the bytes found per bundle.
    fn place_bundled(&mut self) -> Vec<u64> {
        let mut filled = vec![0u64; self.bundles.len()];
        for s in &mut self.segments {
            if let Some(f) = s.bundle.and_then(|b| filled.get_mut(b as usize)) {
                s.offset = *f;
                *f = f.saturating_add(s.len);
            }
        }
        filled
    }

    /// Canonical bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data serializes")
    }

    /// Every blob the file's bytes are stored in: the segments' own blobs and the bundles.
    pub fn blobs(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.segments.iter().filter_map(|s| s.blob).chain(self.bundles.iter().map(|b| b.blob))
    }

    /// Where segment `s` (of this manifest) is stored: the blob and the byte range in it.
    pub fn location(&self, s: &Segment) -> (ObjectId, Range<u64>) {
        match (s.blob, s.bundle) {
            (Some(blob), _) => (blob, 0..s.len),
            (None, Some(b)) => {
                let bundle = &self.bundles[b as usize];
                (bundle.blob, s.offset..s.offset + s.len)
            }
            (None, None) => unreachable!("Manifest::parse and Manifest::new give every segment a blob or a bundle"),
        }
    }

    /// The segments (indices) each bundle holds, in order.
    pub fn bundle_members(&self) -> Vec<Vec<usize>> {
        let mut members = vec![Vec::new(); self.bundles.len()];
        for (i, s) in self.segments.iter().enumerate() {
            if let Some(m) = s.bundle.and_then(|b| members.get_mut(b as usize)) {
                m.push(i);
            }
        }
        members
    }

    /// Each bundle's first member's tensor (how a bundle is matched with the same bundle of
    /// the reference file, for deltas).
    pub fn bundle_keys(&self) -> Vec<Option<&TensorRef>> {
        let mut keys = vec![None; self.bundles.len()];
        for s in &self.segments {
            if let Some(k) = s.bundle.and_then(|b| keys.get_mut(b as usize)) {
                if k.is_none() {
                    *k = s.tensor.as_ref();
                }
            }
        }
        keys
    }

    /// Checks the caps of [`limits`] that parsing does not (string and file lengths); the
    /// reason if one is exceeded. A commit calls this before writing a manifest.
    pub(crate) fn check_limits(&self) -> std::result::Result<(), String> {
        if self.segments.len() > limits::MAX_SEGMENTS || self.bundles.len() > limits::MAX_BUNDLES {
            return Err(format!(
                "{} segments and {} bundles (at most {} and {})",
                self.segments.len(),
                self.bundles.len(),
                limits::MAX_SEGMENTS,
                limits::MAX_BUNDLES
            ));
        }
        if self.len > limits::MAX_FILE_LEN {
            return Err(format!("a file of {} bytes (at most {})", self.len, limits::MAX_FILE_LEN));
        }
        for b in &self.bundles {
            if b.len > BUNDLE_MAX || b.dtype.len() > limits::MAX_DTYPE_LEN {
                return Err(format!("a bundle of {} bytes (at most {})", b.len, BUNDLE_MAX));
            }
        }
        for t in self.segments.iter().filter_map(|s| s.tensor.as_ref()) {
            if t.name.len() > limits::MAX_NAME_LEN || t.dtype.len() > limits::MAX_DTYPE_LEN {
                return Err(format!(
                    "a tensor name of {} bytes or a dtype name of {} bytes (at most {} and {})",
                    t.name.len(),
                    t.dtype.len(),
                    limits::MAX_NAME_LEN,
                    limits::MAX_DTYPE_LEN
                ));
            }
            if t.shape.len() > limits::MAX_DIMS {
                return Err(format!("a tensor of {} dimensions (at most {})", t.shape.len(), limits::MAX_DIMS));
            }
        }
        Ok(())
    }

    /// Parses and checks a manifest read from object `id`. The file hash is checked here
    /// unless the manifest has bundles (the ids of bundled tensors are not recorded): then
    /// checkout and verify check it from the bundles' bytes.
    pub fn parse(id: ObjectId, bytes: &[u8]) -> Result<Manifest> {
        check_json_len(id, bytes, "manifest")?;
        let mut m: Manifest = serde_json::from_slice(bytes).map_err(|e| corrupt(id, format!("manifest JSON: {e}")))?;
        m.check_limits().map_err(|reason| corrupt(id, reason))?;
        let bundled = match m.format {
            MODEL_FORMAT if m.bundles.is_empty() => false,
            BUNDLED_MANIFEST_FORMAT if !m.bundles.is_empty() => true,
            MODEL_FORMAT | BUNDLED_MANIFEST_FORMAT => {
                return Err(corrupt(id, format!("manifest format {} with {} bundles", m.format, m.bundles.len())));
            }
            f => {
                return Err(corrupt(
                    id,
                    format!(
                        "manifest format {f} (this ckpt reads formats {MODEL_FORMAT} and {BUNDLED_MANIFEST_FORMAT})"
                    ),
                ));
            }
        };
        for (i, b) in m.bundles.iter().enumerate() {
            if Dtype::from_safetensors_name(&b.dtype).is_none() {
                return Err(corrupt(id, format!("bundle {i}: dtype {:?}", b.dtype)));
            }
        }
        let mut total = 0u64;
        for s in &m.segments {
            total = total.checked_add(s.len).ok_or_else(|| corrupt(id, "segment lengths overflow"))?;
            match (s.blob, s.bundle) {
                (Some(_), None) => {}
                (None, Some(b)) => {
                    let bundle = m.bundles.get(b as usize).ok_or_else(|| corrupt(id, format!("no bundle {b}")))?;
                    match &s.tensor {
                        Some(t) if t.dtype == bundle.dtype && s.len > 0 => {}
                        _ => {
                            return Err(corrupt(
                                id,
                                format!("bundle {b} holds a segment that is not a {} tensor", bundle.dtype),
                            ))
                        }
                    }
                }
                _ => return Err(corrupt(id, "a segment needs exactly one of a blob and a bundle")),
            }
            if let Some(t) = &s.tensor {
                let dtype =
                    t.dtype().ok_or_else(|| corrupt(id, format!("tensor {:?}: dtype {:?}", t.name, t.dtype)))?;
                let elements = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
                let bytes = if t.shape.contains(&0) {
                    Some(0)
                } else {
                    elements.and_then(|e| e.checked_mul(dtype.size() as u64))
                };
                if bytes != Some(s.len) {
                    return Err(corrupt(
                        id,
                        format!("tensor {:?}: shape {:?} does not match {} bytes", t.name, t.shape, s.len),
                    ));
                }
                if m.kind == FileFormat::Bytes {
                    return Err(corrupt(id, "a tensor in a plain file"));
                }
            }
        }
        if total != m.len {
            return Err(corrupt(id, format!("segments cover {total} of {} bytes", m.len)));
        }
        let filled = m.place_bundled();
        for (i, (b, f)) in m.bundles.iter().zip(filled).enumerate() {
            if b.len != f || f == 0 {
                return Err(corrupt(id, format!("bundle {i} of {} bytes holds {f} bytes of segments", b.len)));
            }
        }
        if !bundled {
            let ids = m.segments.iter().map(|s| (s.len, s.blob.expect("checked above: no bundles")));
            if m.hash != file_hash(m.len, ids) {
                return Err(corrupt(id, "file hash does not match the segments"));
            }
        }
        Ok(m)
    }

    /// The tensor segments by identity (name, dtype, shape).
    pub fn tensors(&self) -> impl Iterator<Item = (&TensorRef, &Segment)> {
        self.segments.iter().filter_map(|s| s.tensor.as_ref().map(|t| (t, s)))
    }
}

impl Version {
    /// Whether this version is pinned: a full base with a parent (`since_base == 0`), whose
    /// blobs stay whole, locally and on a remote, so that no chain reaches past it
    /// (docs/format.md, "Commit policy").
    pub(crate) fn is_pinned(&self) -> bool {
        self.since_base == 0 && !self.parents.is_empty()
    }

    /// Canonical bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data serializes")
    }

    /// Checks the caps of [`limits`] that parsing does not (string and file lengths); the
    /// reason if one is exceeded. A commit calls this before writing a version.
    pub(crate) fn check_limits(&self) -> std::result::Result<(), String> {
        if self.files.len() > limits::MAX_FILES || self.parents.len() > limits::MAX_PARENTS {
            return Err(format!(
                "{} files and {} parents (at most {} and {})",
                self.files.len(),
                self.parents.len(),
                limits::MAX_FILES,
                limits::MAX_PARENTS
            ));
        }
        if self.message.len() > limits::MAX_MESSAGE_LEN {
            return Err(format!("a message of {} bytes (at most {})", self.message.len(), limits::MAX_MESSAGE_LEN));
        }
        if let Some(f) = self.files.iter().find(|f| f.len > limits::MAX_FILE_LEN) {
            return Err(format!("file {:?} of {} bytes (at most {})", f.path, f.len, limits::MAX_FILE_LEN));
        }
        Ok(())
    }

    /// Parses and checks a version read from object `id`: paths valid, sorted and unique.
    pub fn parse(id: ObjectId, bytes: &[u8]) -> Result<Version> {
        check_json_len(id, bytes, "version")?;
        let v: Version = serde_json::from_slice(bytes).map_err(|e| corrupt(id, format!("version JSON: {e}")))?;
        v.check_limits().map_err(|reason| corrupt(id, reason))?;
        if v.format != MODEL_FORMAT {
            return Err(corrupt(id, format!("version format {} (this ckpt reads format {MODEL_FORMAT})", v.format)));
        }
        for f in &v.files {
            RepoPath::parse(&f.path).map_err(|reason| corrupt(id, format!("file path {:?}: {reason}", f.path)))?;
        }
        if v.files.windows(2).any(|w| w[0].path >= w[1].path) {
            return Err(corrupt(id, "file paths not sorted and unique"));
        }
        if v.parents.contains(&id) {
            return Err(corrupt(id, "the version is its own parent"));
        }
        Ok(v)
    }

    /// The entry for `path`, if the version has that file.
    pub fn file(&self, path: &str) -> Option<&FileEntry> {
        self.files.binary_search_by(|f| f.path.as_str().cmp(path)).ok().map(|i| &self.files[i])
    }

    /// The entries of the files under directory `dir` (`""`: every file).
    pub fn files_under<'a>(&'a self, dir: &'a str) -> impl Iterator<Item = &'a FileEntry> + 'a {
        self.files.iter().filter(move |f| is_under(&f.path, dir))
    }

    /// The entry for `path`, or if the version has no file there, the entries under the
    /// directory `path` (what `commit`, `checkout` and `rm` of a directory take).
    pub(crate) fn files_at(&self, path: &str) -> Vec<&FileEntry> {
        match self.file(path) {
            Some(f) => vec![f],
            None => self.files.iter().filter(|f| is_under(&f.path, path)).collect(),
        }
    }
}

/// Whether the stored path `path` lies under the directory `dir` (`""`: the root).
fn is_under(path: &str, dir: &str) -> bool {
    dir.is_empty() || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_is_pinned() {
        let id = ObjectId([0xab; 32]);
        let file = file_hash(12, [(8, id), (4, id)].into_iter());
        let m = Manifest {
            format: 2,
            kind: FileFormat::Safetensors,
            len: 12,
            hash: file,
            bundles: vec![],
            segments: vec![
                Segment::whole(8, id, None),
                Segment::whole(4, id, Some(TensorRef { name: "w".into(), dtype: "BF16".into(), shape: vec![2] })),
            ],
        };
        let (hex, file_hex) = (id.to_hex(), file.to_hex());
        let expected = format!(
            r#"{{"format":2,"kind":"safetensors","len":12,"hash":"{file_hex}","segments":[{{"len":8,"blob":"{hex}"}},{{"len":4,"blob":"{hex}","tensor":{{"name":"w","dtype":"BF16","shape":[2]}}}}]}}"#
        );
        assert_eq!(String::from_utf8(m.to_bytes()).unwrap(), expected);
        assert_eq!(Manifest::parse(id, expected.as_bytes()).unwrap(), m);
        let bad = expected.replace("[2]", "[3]");
        assert!(Manifest::parse(id, bad.as_bytes()).is_err());
        let wrong_hash = expected.replace(&file_hex, &hex);
        assert!(Manifest::parse(id, wrong_hash.as_bytes()).is_err(), "the file hash must match the segments");
        let old_format = expected.replace("\"format\":2", "\"format\":1");
        assert!(Manifest::parse(id, old_format.as_bytes()).is_err());

        let v = Version {
            format: 2,
            parents: vec![],
            time: 5,
            message: "m".into(),
            since_base: 0,
            files: vec![FileEntry { path: "a/b".into(), manifest: id, len: 12, hash: id }],
            raw_bytes: 12,
            stored_bytes: 3,
        };
        let expected = format!(
            r#"{{"format":2,"parents":[],"time":5,"message":"m","since_base":0,"files":[{{"path":"a/b","manifest":"{hex}","len":12,"hash":"{hex}"}}],"raw_bytes":12,"stored_bytes":3}}"#
        );
        assert_eq!(String::from_utf8(v.to_bytes()).unwrap(), expected);
        assert_eq!(Version::parse(ObjectId([1; 32]), expected.as_bytes()).unwrap(), v);
        for evil in ["../x", "/etc/passwd", ".ckpt/HEAD", "a//b", ""] {
            let bad = expected.replace("\"a/b\"", &format!("{evil:?}"));
            assert!(Version::parse(ObjectId([1; 32]), bad.as_bytes()).is_err(), "{evil}");
        }
    }

    /// Format 3: bundles, and bundled segments without their own blob id.
    #[test]
    fn bundled_manifests_are_pinned_and_checked() {
        let (header, bundle) = (ObjectId([0xab; 32]), ObjectId([0xcd; 32]));
        let t = |name: &str| TensorRef { name: name.into(), dtype: "F32".into(), shape: vec![2] };
        let bundles = vec![Bundle { blob: bundle, dtype: "F32".into(), len: 16 }];
        let segments =
            vec![Segment::whole(8, header, None), Segment::bundled(8, t("a"), 0), Segment::bundled(8, t("b"), 0)];
        let hash = ObjectId([0xef; 32]);
        let m = Manifest::new(FileFormat::Safetensors, 24, hash, bundles, segments);
        assert_eq!(m.format, BUNDLED_MANIFEST_FORMAT);
        assert_eq!(m.segments[2].offset, 8);
        assert_eq!(m.location(&m.segments[2]), (bundle, 8..16));
        assert_eq!(m.blobs().collect::<Vec<_>>(), vec![header, bundle]);
        assert_eq!(m.bundle_keys(), vec![Some(&t("a"))]);
        let (h, b, f) = (header.to_hex(), bundle.to_hex(), hash.to_hex());
        let expected = format!(
            r#"{{"format":3,"kind":"safetensors","len":24,"hash":"{f}","bundles":[{{"blob":"{b}","dtype":"F32","len":16}}],"segments":[{{"len":8,"blob":"{h}"}},{{"len":8,"tensor":{{"name":"a","dtype":"F32","shape":[2]}},"in":0}},{{"len":8,"tensor":{{"name":"b","dtype":"F32","shape":[2]}},"in":0}}]}}"#
        );
        assert_eq!(String::from_utf8(m.to_bytes()).unwrap(), expected);
        // (The file hash of a bundled manifest is checked against the bundles' bytes later.)
        assert_eq!(Manifest::parse(header, expected.as_bytes()).unwrap(), m);
        for bad in [
            expected.replace("\"format\":3", "\"format\":2"),
            expected.replace("\"in\":0}]", "\"in\":1}]"),
            expected.replace("\"len\":16", "\"len\":17"),
            expected.replace("\"dtype\":\"F32\",\"len\"", "\"dtype\":\"BF16\",\"len\""),
            expected.replace("{\"len\":8,\"blob\":\"", "{\"len\":8,\"in\":0,\"blob\":\""),
            expected.replace(",\"in\":0}]}", "}]}"),
        ] {
            assert_ne!(bad, expected);
            assert!(Manifest::parse(header, bad.as_bytes()).is_err(), "{bad}");
        }
    }

    /// Counts are capped while parsing (the error comes at the first element past the cap),
    /// lengths right after: a manifest or version can cost no more memory than its caps allow.
    #[test]
    fn caps_on_untrusted_sizes() {
        let id = ObjectId([7; 32]);
        let hex = id.to_hex();
        let message = |e: Error| e.to_string();
        // One segment past the cap, in the smallest JSON a segment can have.
        let mut json = format!(r#"{{"format":2,"kind":"bytes","len":0,"hash":"{hex}","segments":["#);
        json.push_str(&vec![r#"{"len":0}"#; limits::MAX_SEGMENTS + 1].join(","));
        json.push_str("]}");
        let err = message(Manifest::parse(id, json.as_bytes()).unwrap_err());
        assert!(err.contains("more than 1048576 segments"), "{err}");

        let shape = vec!["1"; limits::MAX_DIMS + 1].join(",");
        let json = format!(
            r#"{{"format":2,"kind":"safetensors","len":4,"hash":"{hex}","segments":[{{"len":4,"blob":"{hex}","tensor":{{"name":"t","dtype":"F32","shape":[{shape}]}}}}]}}"#
        );
        let err = message(Manifest::parse(id, json.as_bytes()).unwrap_err());
        assert!(err.contains("more than 64 dimensions"), "{err}");

        let name = "n".repeat(limits::MAX_NAME_LEN + 1);
        let json = format!(
            r#"{{"format":2,"kind":"safetensors","len":4,"hash":"{hex}","segments":[{{"len":4,"blob":"{hex}","tensor":{{"name":"{name}","dtype":"F32","shape":[1]}}}}]}}"#
        );
        let err = message(Manifest::parse(id, json.as_bytes()).unwrap_err());
        assert!(err.contains("tensor name of 65537 bytes"), "{err}");

        let version = |parents: usize, message: &str| {
            let parents = vec![format!("\"{hex}\""); parents].join(",");
            format!(
                r#"{{"format":2,"parents":[{parents}],"time":5,"message":"{message}","since_base":0,"files":[],"raw_bytes":0,"stored_bytes":0}}"#
            )
        };
        let other = ObjectId([8; 32]);
        assert!(Version::parse(other, version(1, "m").as_bytes()).is_ok());
        let err = message(Version::parse(other, version(limits::MAX_PARENTS + 1, "m").as_bytes()).unwrap_err());
        assert!(err.contains("more than 16 parents"), "{err}");
        let long = "m".repeat(limits::MAX_MESSAGE_LEN + 1);
        let err = message(Version::parse(other, version(1, &long).as_bytes()).unwrap_err());
        assert!(err.contains("a message of 1048577 bytes"), "{err}");
    }

    /// Pinned value: a change to the file hash's definition is a format change.
    #[test]
    fn file_hash_is_pinned_and_binds_lengths_and_order() {
        let (a, b) = (ObjectId::hash(b"a"), ObjectId::hash(b"b"));
        let h = file_hash(3, [(1, a), (2, b)].into_iter());
        // Computed independently: Python `blake3` 1.0, `derive_key_context=FILE_HASH_CONTEXT`.
        assert_eq!(h.to_hex(), "2807a8c12ea8d0a57794dfdc19b8db7737f223d8ad98813d113c15f23592e9d5");
        assert_ne!(h, file_hash(3, [(2, b), (1, a)].into_iter()), "order");
        assert_ne!(h, file_hash(3, [(2, a), (1, b)].into_iter()), "lengths");
        assert_ne!(h, file_hash(4, [(1, a), (2, b)].into_iter()), "file length");
        assert_ne!(file_hash(0, std::iter::empty()), ObjectId::hash(&[]), "domain-separated from plain blake3");
    }
}
