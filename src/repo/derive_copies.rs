//! The git filter's second chance for a bf16/f16 copy cleaned before its F32 master in one
//! `git add` (git cleans in path order: `model_bf16.safetensors` before
//! `model_fp32.safetensors`): once the master is stored, the copy's standalone blobs are
//! rewritten as blobs derived from it (docs/format.md, "Derived blobs"), the objects
//! `ckpt commit` of both files in one version would have written. Same ids, same content:
//! nothing that names them changes.

use super::model::Manifest;
use super::pairing::PrecisionIndex;
use super::{Repo, Result, VersionId};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use crate::store::{self, DerivedTarget, Feedback};
use std::collections::HashMap;

/// Copies larger than this stay as they are: a rewrite holds the copy and its reference
/// decoded in memory.
const MAX_DERIVED_IN_PLACE: u64 = 256 << 20;

/// A file stored by [`Repo::store_file`] that a later master may be the source of.
#[derive(Clone, Debug)]
pub struct StoredCopy {
    /// Its manifest.
    pub manifest: ObjectId,
    /// The version that stored it.
    pub version: VersionId,
    /// Its path in that version.
    pub path: String,
}

impl Repo {
    /// Rewrites each BF16 or F16 tensor of `copies` whose F32 namesake (name without wrapper
    /// prefixes, shape) the file `master` (a manifest) holds as a blob derived from it, when
    /// the derived object is smaller: a standalone blob, or one derived from an older master
    /// (git's `HEAD`). Where the rewrite changes the blob's chunk size, only a standalone blob
    /// no delta refers to is rewritten (its path's previous content may have been rewritten as
    /// a reverse delta against it, whose chunks line up with it as it is). Returns the bytes
    /// saved.
    pub fn derive_copies_from(&self, copies: &[StoredCopy], master: &ObjectId) -> Result<u64> {
        let master = self.manifest(master)?;
        if !master.tensors().any(|(t, s)| s.blob.is_some() && t.dtype == Dtype::F32.safetensors_name()) {
            return Ok(0);
        }
        let mut masters = PrecisionIndex::default();
        masters.add_manifest(&master);
        let _lock = self.lock()?;
        let mut saved = 0;
        for copy in copies {
            let Ok(m) = self.manifest(&copy.manifest) else { continue };
            let previous = self.previous_blobs(copy);
            for (t, seg) in m.tensors() {
                let (Some(blob), Some(dtype)) = (seg.blob, Dtype::from_safetensors_name(&t.dtype)) else { continue };
                if !matches!(dtype, Dtype::Bf16 | Dtype::F16) || seg.len == 0 || seg.len > MAX_DERIVED_IN_PLACE {
                    continue;
                }
                let Some(source) = masters.source(&t.name, &t.shape, dtype) else { continue };
                let referred = |r: &ObjectId| self.store.header(r).is_ok_and(|h| h.reference == Some(blob));
                let alone =
                    self.store.header(&blob)?.reference.is_none() && !previous.get(&t.name).is_some_and(referred);
                saved += self.derive_in_place(blob, dtype, source, alone)?;
            }
        }
        Ok(saved)
    }

    /// Tensor name → blob of `copy`'s path in the first parent of its version: the blobs a
    /// reverse delta against `copy`'s may have rewritten.
    fn previous_blobs(&self, copy: &StoredCopy) -> HashMap<String, ObjectId> {
        let parent = self.version(&copy.version).ok().and_then(|v| v.parents.first().copied());
        let file = parent.and_then(|p| self.version(&p).ok()).and_then(|v| v.file(&copy.path).cloned());
        let manifest: Option<Manifest> = file.and_then(|f| self.manifest(&f.manifest).ok());
        manifest.map(|m| m.tensors().filter_map(|(t, s)| Some((t.name.clone(), s.blob?))).collect()).unwrap_or_default()
    }

    /// Replaces `blob` by the same content derived from `source`, if smaller; returns the
    /// bytes saved. Unless `alone` (standalone, no delta refers to it), only when its chunk
    /// size stays. A pair the store cannot derive (chunk sizes, a reference chain through
    /// `blob`) is left as it is.
    fn derive_in_place(&self, blob: ObjectId, dtype: Dtype, source: ObjectId, alone: bool) -> Result<u64> {
        let (chain, reference) = (self.store.open_blob(&blob)?, self.store.open_blob(&source)?);
        let chunk_size = reference.chunk_size() * dtype.size() / Dtype::F32.size();
        if chain.id() == source || (!alone && chain.chunk_size() != chunk_size) {
            return Ok(0);
        }
        let old = self.store.stored_len(&blob)?;
        let mut data = Vec::new();
        chain.copy_to(&mut data)?;
        drop(chain);
        let target = DerivedTarget { id: blob, data: &data, dtype, limit: old };
        let derived =
            match self.store.code_blob_derived(target, &reference, &self.config.codec_options(), &Feedback::NONE) {
                Ok(Some(derived)) => derived,
                Ok(None) | Err(store::Error::Encode { .. }) => return Ok(0),
                Err(e) => return Err(e.into()),
            };
        let written = self.store.keep(derived)?;
        self.index_object(&written);
        Ok(old.saturating_sub(written.stored_len))
    }
}
