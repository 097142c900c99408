//! Bundles: the small tensors of a file, concatenated per dtype in file order into ordinary
//! tensor blobs ([`super::model::Bundle`]). This module decides which tensors go into which
//! bundle (a pure function of the file's tensor table, so equal files get equal bundles) and
//! reads bundled tensors back (whole bundles, verified against their ids, a few kept decoded).
//!
//! Why bundles: a tensor blob costs an object file (at least one 4 KiB file-system block, plus
//! 72 + 32 + 64 bytes of framing and its chunk index) and its own Huffman tables. A file of
//! 20,000 tensors of 128 bytes took 3.3x its size in 20,000 files that way.

use super::model::{Bundle, Manifest, Segment};
use super::{Error, Repo, Result};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use std::collections::BTreeMap;
use std::ops::Range;

/// The file-system block size assumed when deciding whether a reverse-delta rewrite frees space.
pub(super) const FS_BLOCK: u64 = 4096;

/// Tensors below this many bytes are bundled: one file-system block ([`FS_BLOCK`]).
/// Stored alone such a tensor takes a whole block, and a reverse-delta rewrite of it never frees
/// one, so it would stay whole in every version that changes it. (Larger tensors keep their own
/// blob: a delta of their own, `show` and `diff` per object.)
pub(crate) const BUNDLE_BELOW: u64 = FS_BLOCK;

/// Largest bundle, in bytes (a cap every manifest read is checked against, hence defined with
/// the manifest).
pub(super) use super::model::BUNDLE_MAX;

/// Fewest small tensors of one dtype worth a bundle: a single one is stored as its own blob,
/// as before (a bundle of one would only add a level of indirection).
pub(crate) const BUNDLE_MIN_MEMBERS: usize = 2;

/// Which planned segments go into which bundle: `(dtype, member indices in file order)` per
/// bundle, in the order of their first member. `segments` gives each segment's length and, for
/// a tensor, its dtype. Members: non-empty tensors below [`BUNDLE_BELOW`] bytes whose dtype
/// has at least [`BUNDLE_MIN_MEMBERS`] of them in the file; cut, in file order, into bundles of
/// at most [`BUNDLE_MAX`] bytes.
pub fn plan(segments: impl Iterator<Item = (u64, Option<Dtype>)>) -> Vec<(Dtype, Vec<usize>)> {
    let mut by_dtype: BTreeMap<u8, (Dtype, Vec<(usize, u64)>)> = BTreeMap::new();
    for (i, (len, dtype)) in segments.enumerate() {
        if let Some(d) = dtype.filter(|_| len > 0 && len < BUNDLE_BELOW) {
            by_dtype.entry(d.code()).or_insert_with(|| (d, Vec::new())).1.push((i, len));
        }
    }
    let mut bundles = Vec::new();
    for (dtype, members) in by_dtype.into_values() {
        if members.len() < BUNDLE_MIN_MEMBERS {
            continue;
        }
        let mut current: (Vec<usize>, u64) = (Vec::new(), 0);
        for (i, len) in members {
            if current.1 + len > BUNDLE_MAX && !current.0.is_empty() {
                bundles.push((dtype, std::mem::take(&mut current.0)));
                current.1 = 0;
            }
            current.0.push(i);
            current.1 += len;
        }
        if !current.0.is_empty() {
            bundles.push((dtype, current.0));
        }
    }
    bundles.sort_by_key(|(_, members)| members[0]);
    bundles
}

/// Decoded bundles, read whole (each verified against its id by the store) and kept for the
/// next tensors: members of a bundle are read one after the other, and a file's bundles of
/// different dtypes interleave, hence a few of them.
pub(super) struct BundleCache {
    /// Most recently used last.
    entries: Vec<(ObjectId, Vec<u8>)>,
}

/// Bundles a [`BundleCache`] keeps decoded: one per dtype a file can interleave, at most
/// [`BUNDLE_MAX`] each.
const CACHED_BUNDLES: usize = 16;

impl BundleCache {
    pub(super) fn new() -> BundleCache {
        BundleCache { entries: Vec::new() }
    }

    /// The bytes of bundle `bundle`, decoded and checked against its id on first use.
    pub(super) fn get(&mut self, repo: &Repo, bundle: &Bundle) -> Result<&[u8]> {
        if let Some(i) = self.entries.iter().position(|(id, _)| *id == bundle.blob) {
            let entry = self.entries.remove(i);
            self.entries.push(entry);
        } else {
            let bytes = read_bundle(repo, bundle)?;
            if self.entries.len() >= CACHED_BUNDLES {
                self.entries.remove(0);
            }
            self.entries.push((bundle.blob, bytes));
        }
        Ok(&self.entries.last().expect("pushed above").1)
    }

    /// The bytes of segment `s` of `manifest` when it is bundled, else `None`.
    pub(super) fn segment(&mut self, repo: &Repo, manifest: &Manifest, s: &Segment) -> Result<Option<&[u8]>> {
        let Some(b) = s.bundle else { return Ok(None) };
        let bundle = &manifest.bundles[b as usize];
        let (_, range) = manifest.location(s);
        let bytes = self.get(repo, bundle)?;
        Ok(Some(&bytes[range.start as usize..range.end as usize]))
    }
}

/// The content of `bundle`, checked against its id, as one buffer (at most [`BUNDLE_MAX`]
/// bytes for bundles ckpt wrote; a longer one is refused before anything is allocated).
pub(super) fn read_bundle(repo: &Repo, bundle: &Bundle) -> Result<Vec<u8>> {
    let chain = repo.store.open_blob(&bundle.blob)?;
    if chain.len() != bundle.len || bundle.len > BUNDLE_MAX {
        return Err(Error::CorruptMetadata {
            id: bundle.blob,
            reason: format!("bundle of {} bytes (manifest) is a blob of {} bytes", bundle.len, chain.len()),
        });
    }
    let mut bytes = Vec::with_capacity(bundle.len as usize);
    chain.copy_to(&mut bytes)?;
    Ok(bytes)
}

/// The id of every segment of `manifest` (blobs as recorded, bundled tensors hashed from their
/// bundle's bytes, one bundle decoded at a time) and the file hash they give, for checking it
/// against the recorded one.
pub(super) fn file_hash_of(repo: &Repo, manifest: &Manifest) -> Result<ObjectId> {
    let empty = ObjectId::hash(&[]);
    let mut ids: Vec<ObjectId> = manifest.segments.iter().map(|s| s.blob.unwrap_or(empty)).collect();
    for (bundle, members) in manifest.bundles.iter().zip(manifest.bundle_members()) {
        let bytes = read_bundle(repo, bundle)?;
        for i in members {
            ids[i] = ObjectId::hash(&bytes[slice(manifest, &manifest.segments[i])]);
        }
    }
    Ok(super::model::file_hash(manifest.len, manifest.segments.iter().map(|s| s.len).zip(ids)))
}

/// The range of bundled segment `s` in its bundle's bytes.
pub(super) fn slice(manifest: &Manifest, s: &Segment) -> Range<usize> {
    let (_, r) = manifest.location(s);
    r.start as usize..r.end as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tensors_of_one_dtype_are_bundled_in_file_order_and_capped() {
        let f32 = Some(Dtype::F32);
        let bf16 = Some(Dtype::Bf16);
        // header, two small F32, a large F32, one small BF16 (alone: not bundled), a small F32,
        // an empty F32, a gap.
        let segs = [(100, None), (128, f32), (64, f32), (BUNDLE_BELOW, f32), (8, bf16), (4, f32), (0, f32), (3, None)];
        assert_eq!(plan(segs.into_iter()), vec![(Dtype::F32, vec![1, 2, 5])]);
        let many: Vec<(u64, Option<Dtype>)> = (0..3000).map(|_| (2048, f32)).collect();
        let bundles = plan(many.into_iter());
        let per_bundle = (BUNDLE_MAX / 2048) as usize;
        assert_eq!(bundles.len(), 3000usize.div_ceil(per_bundle));
        assert!(bundles.iter().all(|(_, m)| m.len() <= per_bundle));
        let all: Vec<usize> = bundles.into_iter().flat_map(|(_, m)| m).collect();
        assert_eq!(all, (0..3000).collect::<Vec<_>>());
    }
}
