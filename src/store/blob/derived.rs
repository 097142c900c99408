//! Derived blobs (docs/format.md, "Derived blobs"): a tensor stored as the XOR residual
//! against its prediction from a blob of another float dtype, coded from that blob decoded or
//! from its bytes at hand.

use super::super::{Error, ObjectHeader, ObjectKind, Result, Store, Written, MAX_CHAIN_DEPTH};
use super::{encode_blob, Against, BlobChain, BlobData, BlobForm, Feedback, WINDOW_BYTES};
use crate::codec::chunk::GroupedReference;
use crate::codec::cross_precision::{self, Conversion};
use crate::codec::Options;
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use rayon::prelude::*;
use std::ops::Range;

/// A derived blob coded into a temp file, not stored yet ([`Store::code_blob_derived`]).
pub struct DerivedBlob {
    id: ObjectId,
    header: ObjectHeader,
    tmp: tempfile::NamedTempFile,
    stored_len: u64,
    chunk_size: usize,
    /// Its own id, then its reference's chain.
    chain: Vec<ObjectId>,
}

impl DerivedBlob {
    /// Size the object file will have.
    pub fn stored_len(&self) -> u64 {
        self.stored_len
    }
    /// How it is predicted from its reference.
    pub fn conversion(&self) -> Option<Conversion> {
        self.header.conversion
    }
    /// The object [`Store::keep`] will have written.
    pub fn written(&self) -> Written {
        Written { id: self.id, header: self.header, stored_len: self.stored_len }
    }
    /// The form the blob has once kept.
    pub fn form(&self) -> BlobForm {
        BlobForm {
            id: self.id,
            dtype: self.header.dtype,
            len: self.header.raw_len,
            chunk_size: self.chunk_size,
            depth: self.header.depth,
            chain: self.chain.clone(),
        }
    }
}

/// A tensor to code as a derived blob ([`Store::code_blob_derived`]).
#[derive(Clone, Copy)]
pub struct DerivedTarget<'a> {
    /// The blake3 of `data`: the blob's id.
    pub id: ObjectId,
    /// The tensor's bytes.
    pub data: &'a [u8],
    /// Its element type.
    pub dtype: Dtype,
    /// No object is kept when it would take this many bytes or more.
    pub limit: u64,
}

/// The content of a derived blob's reference at hand ([`Store::code_blob_derived_from_bytes`]).
pub struct SourceBytes<'a> {
    /// The reference's content (a tensor of a file being committed).
    pub bytes: &'a [u8],
    /// The form of the reference's blob.
    pub form: &'a BlobForm,
    /// Called with each range of `bytes` read for the last time (as
    /// [`Feedback::release_input`] is for the data).
    pub release: &'a (dyn Fn(Range<usize>) + Sync),
}

/// Checks that `target` can be derived from the blob `form` describes; returns the reference's
/// dtype and the derived blob's chunk size.
fn derivable(target: &DerivedTarget<'_>, form: &BlobForm) -> Result<(Dtype, usize)> {
    let DerivedTarget { id, data, dtype, .. } = *target;
    let invalid = |reason: String| Error::Encode { id, source: crate::codec::Error::InvalidInput(reason) };
    let source_dtype = form.dtype.ok_or_else(|| invalid("an opaque reference".into()))?;
    let chunk_size = form.chunk_size * dtype.size() / source_dtype.size();
    if !data.len().is_multiple_of(dtype.size())
        || (data.len() / dtype.size()) as u64 * source_dtype.size() as u64 != form.len
    {
        return Err(invalid(format!("{} bytes against a reference of {}", data.len(), form.len)));
    }
    if !chunk_size.is_power_of_two() || !(4096..=4 << 20).contains(&chunk_size) {
        return Err(invalid(format!("a derived chunk size of {chunk_size} bytes")));
    }
    if form.chain.contains(&id) {
        // Storing it would replace an object of its own reference chain: a cycle.
        return Err(invalid(format!("{id} is in its reference's chain")));
    }
    Ok((source_dtype, chunk_size))
}

fn cannot_predict(id: ObjectId, source_dtype: Dtype, dtype: Dtype) -> Error {
    let reason = format!("{dtype:?} cannot be predicted from {source_dtype:?}");
    Error::Encode { id, source: crate::codec::Error::InvalidInput(reason) }
}

/// [`cross_precision::choose`] of `data` from `source.bytes`, window by window (releasing the
/// pages of both once checked, so the resident set stays about a window) and in parallel
/// within a window: the same choice, the first rule every element follows, else round to
/// nearest even.
fn choose_streaming(
    source: &SourceBytes<'_>,
    source_dtype: Dtype,
    data: &[u8],
    dtype: Dtype,
    feedback: &Feedback<'_>,
) -> Option<Conversion> {
    let narrow = match cross_precision::narrow_of(dtype) {
        Some(narrow) if source_dtype == Dtype::F32 => narrow,
        // Widening is exact: nothing to detect (`choose` decides without reading).
        _ => return cross_precision::choose(&[], source_dtype, &[], dtype),
    };
    let elements = data.len() / dtype.size();
    if source.bytes.len() / source_dtype.size() != elements {
        return None;
    }
    let mut rules = vec![cross_precision::Rounding::NearestEven, cross_precision::Rounding::Truncate];
    let window = WINDOW_BYTES / source_dtype.size();
    let piece = 1 << 16;
    let mut start = 0;
    while start < elements && !rules.is_empty() {
        let end = (start + window).min(elements);
        let wide = &source.bytes[start * 4..end * 4];
        let narrow_bytes = &data[start * 2..end * 2];
        rules.retain(|&rule| {
            wide.par_chunks(piece * 4)
                .zip(narrow_bytes.par_chunks(piece * 2))
                .all(|(w, n)| cross_precision::is_rounding(w, n, narrow, rule).unwrap_or(false))
        });
        (source.release)(start * 4..end * 4);
        (feedback.release_input)(start * 2..end * 2);
        start = end;
    }
    Some(Conversion::narrow(rules.first().copied().unwrap_or(cross_precision::Rounding::NearestEven)))
}

/// The prediction of a derived blob from its reference's bytes ([`cross_precision::Predictor`]),
/// with the release of the reference's pages once read.
pub(super) struct Prediction<'a> {
    predictor: cross_precision::Predictor<'a>,
    release: &'a (dyn Fn(Range<usize>) + Sync),
}

impl Prediction<'_> {
    /// Releases the pages of the reference's bytes that predict data bytes `range`, read for
    /// the last time.
    pub(super) fn release(&self, range: Range<usize>) {
        (self.release)(self.predictor.source_range(range));
    }
}

impl GroupedReference for Prediction<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> crate::codec::Result<()> {
        self.predictor.grouped(offset, grouped)
    }
}

impl Store {
    /// Codes `target` as a derived blob, not stored yet: the XOR residual against the prediction
    /// of it from `reference` (a blob of another float dtype with as many elements) by the
    /// conversion [`cross_precision::choose`] finds; `None` when the object would take
    /// `target.limit` bytes or more. [`Store::keep`] stores the result. The reference is decoded whole and checked
    /// against its id first, so a damaged reference is an error naming it. The object's chunk
    /// size is the reference's scaled by the ratio of element widths (chunk `i` holds the
    /// elements of the reference's chunk `i`); when that is not a valid chunk size, or the
    /// dtypes do not pair, the blob cannot be derived (an [`Error::Encode`]).
    /// [`Self::code_blob_derived_from_bytes`] codes the same object from the reference's bytes
    /// at hand, without decoding it.
    pub fn code_blob_derived(
        &self,
        target: DerivedTarget<'_>,
        reference: &BlobChain,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<Option<DerivedBlob>> {
        let DerivedTarget { id, data, dtype, .. } = target;
        let form = reference.form();
        let (source_dtype, chunk_size) = derivable(&target, &form)?;
        let mut plain = Vec::with_capacity(reference.len() as usize);
        reference.copy_to(&mut plain)?;
        let conversion = cross_precision::choose(&plain, source_dtype, data, dtype)
            .ok_or_else(|| cannot_predict(id, source_dtype, dtype))?;
        let mut predicted = vec![0u8; data.len()];
        cross_precision::predict(conversion, &plain, source_dtype, dtype, &mut predicted)
            .map_err(|source| Error::Encode { id, source })?;
        drop(plain);
        let options = Options { chunk_size, ..options.clone() };
        self.code_derived(&target, &form, conversion, Against::Bytes(&predicted), &options, feedback)
    }

    /// [`Self::code_blob_derived`] (conversion chosen by [`cross_precision::choose`]) from the
    /// reference's content at hand, `source.bytes` (a tensor of the file being committed),
    /// whose blob has, or is getting in the same commit, the form `source.form`: the
    /// prediction is made chunk by chunk from those bytes as the residual is coded, so nothing
    /// is decoded and no whole tensor is copied; the source's pages are released window by
    /// window as the data's are. The object is byte for byte the one `code_blob_derived` makes
    /// from the stored reference when `source.bytes` are its content.
    ///
    /// The caller vouches for that: the bytes are not hashed here. A residual coded from bytes
    /// that are not the reference's content decodes to other bytes than `id`'s, so a caller
    /// whose bytes may have changed meanwhile (a file rewritten during a commit) must check
    /// them afterwards and remove the object if they did.
    pub fn code_blob_derived_from_bytes(
        &self,
        target: DerivedTarget<'_>,
        source: &SourceBytes<'_>,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<Option<DerivedBlob>> {
        let DerivedTarget { id, data, dtype, .. } = target;
        let form = source.form;
        let (source_dtype, chunk_size) = derivable(&target, form)?;
        if source.bytes.len() as u64 != form.len {
            return Err(Error::Encode {
                id,
                source: crate::codec::Error::InvalidInput(format!(
                    "{} reference bytes for a reference of {}",
                    source.bytes.len(),
                    form.len
                )),
            });
        }
        let conversion = choose_streaming(source, source_dtype, data, dtype, feedback)
            .ok_or_else(|| cannot_predict(id, source_dtype, dtype))?;
        let predictor = cross_precision::Predictor { conversion, source: source.bytes, source_dtype, dtype };
        let prediction = Prediction { predictor, release: source.release };
        let options = Options { chunk_size, ..options.clone() };
        self.code_derived(&target, form, conversion, Against::Predicted(&prediction), &options, feedback)
    }

    /// Codes the derived object of `target` against `against`, the prediction of it from the
    /// blob `form` describes by `conversion`, in chunks of `options.chunk_size` (the derived
    /// chunk size [`derivable`] gives).
    fn code_derived(
        &self,
        target: &DerivedTarget<'_>,
        form: &BlobForm,
        conversion: Conversion,
        against: Against<'_>,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<Option<DerivedBlob>> {
        let DerivedTarget { id, data, dtype, limit } = *target;
        let chunk_size = options.chunk_size;
        let header = ObjectHeader {
            kind: ObjectKind::Blob,
            dtype: Some(dtype),
            reference: Some(form.id),
            depth: form.depth.saturating_add(1).min(MAX_CHAIN_DEPTH),
            conversion: Some(conversion),
            raw_len: data.len() as u64,
        };
        let coded = self.write_temp_object(id, header, Some(limit), |out| {
            encode_blob(id, out, BlobData::Bytes(data), against, header.dtype, options, feedback)
        })?;
        let chain = std::iter::once(id).chain(form.chain.iter().copied()).collect();
        Ok(coded.map(|(tmp, stored_len)| DerivedBlob { id, header, tmp, stored_len, chunk_size, chain }))
    }

    /// Stores a blob coded by [`Self::code_blob_derived`] (through the background sync of a
    /// `Store::with_background_sync` view, as every write).
    pub fn keep(&self, blob: DerivedBlob) -> Result<Written> {
        let DerivedBlob { id, header, tmp, stored_len, .. } = blob;
        self.make_durable(super::super::TempObject::Open(tmp), id)?;
        Ok(Written { id, header, stored_len })
    }
}
