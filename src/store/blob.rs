//! Blobs: writing them standalone or as XOR deltas, and reading them back through their
//! reference chain, chunk by chunk.
//!
//! Every blob of a chain has the same length, dtype and chunk size, and each container's chunk
//! `i` covers original bytes `[i * chunk_size, (i + 1) * chunk_size)` (the last one shorter).
//! So chunk `i` of the target is chunk `i` of the base, XORed in order with chunk `i` of every
//! delta above it: a reader holds a few chunks per worker, never a whole tensor.
//!
//! A chain may end, instead of at a standalone base, at a *derived* blob (a cross-precision
//! reference, docs/format.md "Derived blobs"): an XOR residual against a conversion of a blob of
//! another float dtype, itself opened as a chain. Its chunk size is scaled by the ratio of the
//! element widths, so its chunk `i` holds the same elements as the reference's chunk `i`: the
//! base of chunk `i` is then the converted reference chunk.

use super::{Error, ObjectHeader, ObjectKind, RawObject, Result, Store, UnsyncedBlob, Written, MAX_CHAIN_DEPTH};
use crate::codec::chunk::STRIPE_CHUNKS;
use crate::codec::chunk::{Data, GroupedReference, Reference};
use crate::codec::container::{Container, ContainerWriter, FileKind, SegmentInput};
use crate::codec::cross_precision::{self, Conversion};
use crate::codec::select::Selection;
use crate::codec::{byte_group, Grouping, Method, Options};
use crate::dtype::Dtype;
use crate::object_id::{hash_update, ObjectId};
use rayon::prelude::*;
use std::io::Write;
use std::ops::Range;
use std::sync::Mutex;

/// Bytes of input coded (or decoded) per window: bounds memory while keeping both cores busy.
const WINDOW_BYTES: usize = 32 << 20;

thread_local! {
    /// One chunk of a derived blob's prediction while it is coded ([`Prediction`]).
    static PREDICTION_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Grouped form of one chunk while a delta chain is decoded (one per worker thread).
    static CHAIN_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// One reusable window buffer per thread. A fresh 32 MiB buffer per blob cost a page fault
    /// and a kernel page clear per 4 KiB (or 2 MiB huge page) every time: perf of a checkout put
    /// 13% of its time in `clear_page_erms`. Reusing it pays that once per process and thread.
    static WINDOW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes this thread's window buffer out of its slot (a second reader on the thread gets a
/// fresh one); [`return_window`] puts it back.
fn take_window() -> Vec<u8> {
    WINDOW.with(|w| std::mem::take(&mut *w.borrow_mut()))
}

/// Gives a window buffer back to this thread's slot, keeping the larger of the two.
fn return_window(buf: Vec<u8>) {
    WINDOW.with(|w| {
        let mut slot = w.borrow_mut();
        if slot.capacity() < buf.capacity() {
            *slot = buf;
        }
    });
}

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

/// What the object of a blob derived from blob `id` takes from that blob's form in the store
/// (docs/format.md "Derived blobs"): its dtype and length (the pairing), chunk size (the derived
/// blob's is scaled from it), depth (recorded in the header) and the ids of its chain (none
/// may be the derived blob: that would be a cycle). Known without decoding anything: from an
/// opened chain ([`BlobChain::form`]), or from how a blob was just written, before it is
/// readable ([`BlobForm::standalone`], [`BlobForm::delta`], [`DerivedBlob::form`]).
#[derive(Clone, Debug)]
pub struct BlobForm {
    id: ObjectId,
    dtype: Option<Dtype>,
    len: u64,
    chunk_size: usize,
    depth: u32,
    /// `id` first, then what it refers to, down to its standalone base.
    chain: Vec<ObjectId>,
}

impl BlobForm {
    /// The form of `written`, stored standalone in chunks of `chunk_size` (the options' chunk
    /// size it was written with).
    pub fn standalone(written: &Written, chunk_size: usize) -> BlobForm {
        BlobForm {
            id: written.id,
            dtype: written.header.dtype,
            len: written.header.raw_len,
            chunk_size,
            depth: 0,
            chain: vec![written.id],
        }
    }

    /// The form of `written`, stored as an XOR delta against `reference` (whose chunk size a
    /// delta takes).
    pub fn delta(written: &Written, reference: &BlobChain) -> BlobForm {
        BlobForm {
            id: written.id,
            dtype: written.header.dtype,
            len: written.header.raw_len,
            chunk_size: reference.chunk_size,
            depth: reference.depth() + 1,
            chain: std::iter::once(written.id).chain(reference.ids()).collect(),
        }
    }

    /// The blob's id.
    pub fn id(&self) -> ObjectId {
        self.id
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

/// The prediction of a derived blob from its reference's bytes, handed to the codec chunk by
/// chunk in grouped form ([`GroupedReference`]): each chunk converts only the reference
/// elements it covers, in a per-thread buffer.
struct Prediction<'a> {
    conversion: Conversion,
    source: &'a [u8],
    source_dtype: Dtype,
    dtype: Dtype,
    grouping: Grouping,
    release: &'a (dyn Fn(Range<usize>) + Sync),
}

impl Prediction<'_> {
    /// The range of the reference's bytes that predicts data bytes `range`.
    fn source_range(&self, range: Range<usize>) -> Range<usize> {
        let (w, ws) = (self.dtype.size(), self.source_dtype.size());
        range.start / w * ws..range.end / w * ws
    }
}

impl GroupedReference for Prediction<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> crate::codec::Result<()> {
        let w = self.dtype.size();
        let whole = offset.is_multiple_of(w) && grouped.len().is_multiple_of(w);
        let wide = whole.then(|| self.source.get(self.source_range(offset..offset + grouped.len()))).flatten();
        let wide = wide.ok_or_else(|| {
            crate::codec::Error::InvalidInput(format!(
                "{} predicted bytes at offset {offset} are not whole elements of the reference",
                grouped.len()
            ))
        })?;
        PREDICTION_SCRATCH.with(|scratch| {
            let mut predicted = scratch.borrow_mut();
            predicted.resize(grouped.len(), 0);
            cross_precision::predict(self.conversion, wide, self.source_dtype, self.dtype, &mut predicted)?;
            byte_group::split(&predicted, None, self.grouping, grouped)
        })
    }
}

/// Outcome of [`Store::write_blob_delta`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaOutcome {
    /// The delta was smaller than the limit and is stored.
    Written(Written),
    /// The delta would take at least the limit; nothing was stored.
    NotSmaller {
        /// Size the delta object would have had.
        stored_len: u64,
    },
}

/// A blob opened with its whole reference chain, checked for consistency (kinds, lengths,
/// dtypes, chunk sizes and grouping, depths). Decoding verifies the result against the blob's id.
pub struct BlobChain {
    /// `[target, its reference, ..., standalone base]`, or down to a derived blob.
    objects: Vec<RawObject>,
    chunk_size: usize,
    chunk_count: usize,
    /// When the last object is derived: how it is predicted, and its reference's chain.
    derived: Option<(Conversion, Box<BlobChain>)>,
}

impl Store {
    /// Opens blob `id` and every blob it is a delta against.
    pub fn open_blob(&self, id: &ObjectId) -> Result<BlobChain> {
        self.open_chain_from(None, id)
    }

    /// Opens the chain of blob `id`, whose own object is `first` when given (an object not in
    /// the store yet: `Store::import` checks a received object this way), else read from the
    /// store; its references are read from the store.
    pub(super) fn open_chain_from(&self, first: Option<RawObject>, id: &ObjectId) -> Result<BlobChain> {
        self.open_chain_within(first, id, MAX_CHAIN_DEPTH)
    }

    /// [`Self::open_chain_from`] following at most `budget` references in all (through derived
    /// blobs too), so that a damaged store with a cycle of references ends in an error.
    fn open_chain_within(&self, first: Option<RawObject>, id: &ObjectId, budget: u32) -> Result<BlobChain> {
        let mut objects: Vec<RawObject> = Vec::new();
        let mut first = first;
        let mut next = Some(*id);
        while let Some(current) = next {
            let read = match first.take() {
                Some(raw) => Ok(raw),
                None => self.raw(&current),
            };
            let raw = match (read, objects.last()) {
                (Ok(raw), _) => raw,
                (Err(Error::Missing { id: missing }), Some(referrer)) => {
                    return Err(Error::Corrupt {
                        id: referrer.id,
                        reason: format!("its delta reference {missing} is missing"),
                    })
                }
                (Err(e), _) => return Err(e),
            };
            if raw.header.kind != ObjectKind::Blob {
                return Err(match objects.last() {
                    None => Error::WrongKind { id: current, expected: ObjectKind::Blob, found: raw.header.kind },
                    Some(referrer) => Error::Corrupt {
                        id: referrer.id,
                        reason: format!("its delta reference {current} is a {}", raw.header.kind),
                    },
                });
            }
            if let Some(referrer) = objects.last() {
                let h = &referrer.header;
                // The header's depth is not compared with the reference's: a reverse-delta
                // commit turns a standalone reference into a delta, which deepens the chains
                // above it without rewriting them (docs/format.md, "Objects"). The chain's
                // real depth is its length, bounded below.
                let problem = if raw.header.raw_len != h.raw_len {
                    Some(format!("{} bytes over a reference of {} bytes", h.raw_len, raw.header.raw_len))
                } else if raw.header.dtype != h.dtype {
                    Some("dtype differs from its reference".to_string())
                } else {
                    None
                };
                if let Some(reason) = problem {
                    return Err(Error::Corrupt { id: referrer.id, reason });
                }
            }
            if objects.len() as u32 > budget {
                return Err(Error::Corrupt { id: *id, reason: "delta chain too long".into() });
            }
            next = raw.header.reference;
            let derived = raw.header.conversion.is_some();
            objects.push(raw);
            if derived {
                break;
            }
        }
        let base = objects.last().expect("at least the target");
        let chunk_size = base.container()?.chunk_size();
        let len = base.header.raw_len;
        let chunk_count = usize::try_from(len.div_ceil(chunk_size as u64))
            .map_err(|_| Error::Corrupt { id: base.id, reason: "too many chunks".into() })?;
        let derived = match (base.header.conversion, base.header.reference) {
            (Some(conversion), Some(reference)) => {
                let rest = budget.saturating_sub(objects.len() as u32);
                Some((conversion, Box::new(self.open_derived_reference(base, conversion, reference, rest)?)))
            }
            _ => None,
        };
        if let Some((_, source)) = &derived {
            // Chunk i of the derived blob holds the elements of its reference's chunk i.
            let width = |d: Option<Dtype>| d.map_or(1, Dtype::size);
            let (w, ws) = (width(base.header.dtype), width(source.dtype()));
            if source.chunk_size * w != chunk_size * ws || source.chunk_count != chunk_count {
                return Err(Error::Corrupt {
                    id: base.id,
                    reason: format!(
                        "chunks of {chunk_size} bytes do not line up with its cross-precision reference's {}",
                        source.chunk_size
                    ),
                });
            }
        }
        let chain = BlobChain { objects, chunk_size, chunk_count, derived };
        // Opening every container checks its layout; decoding re-opens them (cheap: the index).
        chain.containers()?;
        Ok(chain)
    }

    /// Opens the chain of `reference`, the cross-precision reference of the derived blob `base`
    /// (whose conversion is `conversion`), following at most `budget` references; checks that
    /// the two pair (dtypes fit the conversion, equal element counts). Errors blame `base`.
    fn open_derived_reference(
        &self,
        base: &RawObject,
        conversion: Conversion,
        reference: ObjectId,
        budget: u32,
    ) -> Result<BlobChain> {
        let corrupt = |reason: String| Error::Corrupt { id: base.id, reason };
        if budget == 0 {
            return Err(corrupt("delta chain too long".into()));
        }
        let source = match self.open_chain_within(None, &reference, budget - 1) {
            Ok(source) => source,
            Err(Error::Missing { id }) if id == reference => {
                return Err(corrupt(format!("its cross-precision reference {reference} is missing")))
            }
            Err(Error::WrongKind { found, .. }) => {
                return Err(corrupt(format!("its cross-precision reference {reference} is a {found}")))
            }
            Err(e) => return Err(e),
        };
        let target = base.header.dtype.ok_or_else(|| corrupt("a derived blob without a dtype".into()))?;
        let fits = source.dtype().is_some_and(|d| conversion.fits(d, target));
        let elements = |len: u64, d: Option<Dtype>| d.map(|d| (len / d.size() as u64, len % d.size() as u64));
        if !fits || elements(source.len(), source.dtype()) != elements(base.header.raw_len, Some(target)) {
            return Err(corrupt(format!(
                "{} bytes of {target:?} cannot be derived by {conversion} from {} bytes of {:?}",
                base.header.raw_len,
                source.len(),
                source.dtype()
            )));
        }
        Ok(source)
    }

    /// How many deltas lie between blob `id` and its standalone base now, read from the
    /// headers along its chain. (A header's own depth field is the depth when it was written,
    /// which a reverse-delta commit may have deepened since.)
    pub fn chain_depth(&self, id: &ObjectId) -> Result<u32> {
        let mut depth = 0;
        let mut next = self.header(id)?.reference;
        while let Some(reference) = next {
            depth += 1;
            if depth > MAX_CHAIN_DEPTH {
                return Err(Error::Corrupt { id: *id, reason: "delta chain too long".into() });
            }
            next = self.header(&reference)?.reference;
        }
        Ok(depth)
    }

    /// Stores `data` (whose blake3 is `id`) as a standalone blob of `dtype` elements.
    /// `progress` is called with the number of bytes coded so far.
    pub fn write_blob(
        &self,
        id: ObjectId,
        data: &[u8],
        dtype: Option<Dtype>,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<Written> {
        let header = ObjectHeader::standalone_blob(dtype, data.len() as u64);
        let written = self.write_object(id, header, None, |out| {
            encode_blob(id, out, BlobData::Bytes(data), Against::Nothing, dtype, options, feedback)
        })?;
        Ok(written.expect("no size limit"))
    }

    /// Writes `data` as a standalone blob of `dtype` elements with every byte group stored
    /// raw: grouped (and exponent-extracted) as any blob, but not entropy coded, so the write
    /// costs one pass (blake3, grouping, payload checksums) and no method selection. Its id is
    /// the blake3 computed on the way. A save that defers coding writes its tensors so
    /// (`Repo::store_piece`), and compaction codes them later
    /// ([`Store::recode_standalone`]): an uncoded blob reads like any other. The object is
    /// left in a temp file for [`Store::persist_unsynced`].
    pub fn write_blob_uncoded(&self, data: &[u8], dtype: Option<Dtype>, chunk_size: usize) -> Result<UnsyncedBlob> {
        let header = ObjectHeader::standalone_blob(dtype, data.len() as u64);
        let options = Options { chunk_size, selection: Selection::Only(Method::Raw), ..Options::default() };
        // The id is the hash this pass computes (and the container records), so there is none
        // to give it beforehand or to check it against after.
        let unknown = ObjectId([0; 32]);
        let (tmp, stored_len, hash) = self.write_temp_hashed(header, |out| {
            encode_blob(unknown, out, BlobData::Bytes(data), Against::Nothing, dtype, &options, &Feedback::NONE)
        })?;
        let written = Written { id: ObjectId(*hash.as_bytes()), header, stored_len };
        Ok(UnsyncedBlob { tmp: tmp.into_temp_path(), written })
    }

    /// Codes the standalone blob `chain` again with `options`, from its stored form (chunk by
    /// chunk in grouped form, as a reverse-delta rewrite reads it), and replaces it (same id,
    /// atomically) if the new object is smaller; `None` otherwise. How compaction codes the
    /// blobs a save stored uncoded ([`Store::write_blob_uncoded`]).
    pub fn recode_standalone(&self, chain: &BlobChain, options: &Options) -> Result<Option<Written>> {
        if chain.depth() != 0 {
            let reason = format!("{} is not stored standalone", chain.id());
            return Err(Error::Encode { id: chain.id(), source: crate::codec::Error::InvalidInput(reason) });
        }
        let header = ObjectHeader::standalone_blob(chain.dtype(), chain.len());
        let options = Options { chunk_size: chain.chunk_size(), ..options.clone() };
        self.write_object(chain.id(), header, Some(chain.stored_len()), |out| {
            encode_blob(
                chain.id(),
                out,
                BlobData::Stored(chain),
                Against::Nothing,
                header.dtype,
                &options,
                &Feedback::NONE,
            )
        })
    }

    /// Stores `data` (whose blake3 is `id`) as an XOR delta against `reference`, unless the
    /// delta object would take `limit` bytes or more. `data` must have the reference's length
    /// and dtype. The reference's payloads are checksum-checked as they are decoded; a damaged
    /// reference is an error naming it (and nothing is stored).
    pub fn write_blob_delta(
        &self,
        id: ObjectId,
        data: &[u8],
        reference: &BlobChain,
        limit: u64,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<DeltaOutcome> {
        if data.len() as u64 != reference.len() {
            return Err(Error::Encode {
                id,
                source: crate::codec::Error::InvalidInput(format!(
                    "{} bytes against a reference of {}",
                    data.len(),
                    reference.len()
                )),
            });
        }
        self.write_delta_object(id, BlobData::Bytes(data), reference, limit, options, feedback)
    }

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
        let prediction = Prediction {
            conversion,
            source: source.bytes,
            source_dtype,
            dtype,
            grouping: Grouping::for_dtype(Some(dtype)),
            release: source.release,
        };
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
    /// [`Store::with_background_sync`] view, as every write).
    pub fn keep(&self, blob: DerivedBlob) -> Result<Written> {
        let DerivedBlob { id, header, tmp, stored_len, .. } = blob;
        self.make_durable(super::TempObject::Open(tmp), id)?;
        Ok(Written { id, header, stored_len })
    }

    /// Replaces the standalone blob `older` by an XOR delta against `newer`, a standalone blob
    /// of the same length, dtype and chunk size, unless the delta object would take `limit`
    /// bytes or more (at most `older`'s object size).
    ///
    /// This is how reverse deltas keep the newest version whole: XOR is symmetric, so the delta
    /// of `newer` against `older` is also the delta of `older` against `newer`. Both are read
    /// from the store chunk by chunk in grouped form (their payload checksums checked), XORed
    /// and coded, with `older`'s id as the content hash the container records: no working file
    /// is needed, and nothing is regrouped or held whole. `newer` must already be durable: the
    /// replacement is renamed over `older`'s object, and from then on `older` is read through
    /// `newer`. Chains that went through `older` get one level deeper; their headers keep the
    /// depth they were written with. Since `newer` must be standalone, no rewrite can close a
    /// reference cycle.
    pub fn rewrite_as_delta_against(
        &self,
        older: &BlobChain,
        newer: &BlobChain,
        limit: u64,
        options: &Options,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DeltaOutcome> {
        let mismatch = if older.depth() != 0 {
            Some(format!("{} is not stored standalone", older.id()))
        } else if newer.depth() != 0 {
            Some(format!("{} is not stored standalone", newer.id()))
        } else if newer.id() == older.id() {
            Some(format!("{} against itself", older.id()))
        } else if newer.len() != older.len() {
            Some(format!("{} bytes against {}", newer.len(), older.len()))
        } else if newer.dtype() != older.dtype() || newer.chunk_size() != older.chunk_size() {
            Some("dtype or chunk size differs".to_string())
        } else {
            None
        };
        if let Some(reason) = mismatch {
            return Err(Error::Encode { id: older.id(), source: crate::codec::Error::InvalidInput(reason) });
        }
        let limit = limit.min(older.stored_len());
        let feedback = Feedback { progress, release_input: &|_| {}, input_xxh3: None };
        self.write_delta_object(older.id(), BlobData::Stored(older), newer, limit, options, &feedback)
    }

    /// Codes blob `target` standalone (no reference) for another store, whatever form it has
    /// here: into a temp file in `tmp/`, never into this store. What a writer uploads over an
    /// object of the remote that `ckpt gc --remote` may already count as garbage: a standalone
    /// form references nothing, so replacing any form by it closes no reference cycle
    /// (docs/format.md, "Garbage on a remote"). Returns the temp file and its length.
    pub fn encode_standalone_for_transfer(
        &self,
        target: &BlobChain,
        options: &Options,
    ) -> Result<(tempfile::NamedTempFile, u64)> {
        let header = ObjectHeader::standalone_blob(target.dtype(), target.len());
        let options = Options { chunk_size: target.chunk_size(), ..options.clone() };
        let written = self.write_temp_object(target.id(), header, None, |out| {
            encode_blob(
                target.id(),
                out,
                BlobData::Stored(target),
                Against::Nothing,
                header.dtype,
                &options,
                &Feedback::NONE,
            )
        })?;
        Ok(written.expect("no limit, so always written"))
    }

    /// Codes blob `target` as an XOR delta against blob `reference` for another store that
    /// holds `reference` (a remote): the object goes to a temp file in `tmp/`, never into this
    /// store, whatever form either blob has here (XOR is symmetric: `target` may even be stored
    /// here as a delta against `reference` or the reverse). Its header names `reference` and
    /// records `depth`, the depth the other store's chain will have. Both chains are read chunk
    /// by chunk in grouped form (payload checksums checked), as a reverse-delta rewrite reads
    /// them. Returns `None` when the object would take `limit` bytes or more; the temp file and
    /// its length otherwise.
    pub fn encode_delta_for_transfer(
        &self,
        target: &BlobChain,
        reference: &BlobChain,
        depth: u32,
        limit: u64,
        options: &Options,
    ) -> Result<Option<(tempfile::NamedTempFile, u64)>> {
        let mismatch = if target.id() == reference.id() {
            Some(format!("{} against itself", target.id()))
        } else if target.len() != reference.len() {
            Some(format!("{} bytes against {}", target.len(), reference.len()))
        } else if target.dtype() != reference.dtype() || target.chunk_size() != reference.chunk_size() {
            Some("dtype or chunk size differs".to_string())
        } else if depth == 0 || depth > MAX_CHAIN_DEPTH {
            Some(format!("chain depth {depth}"))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            return Err(Error::Encode { id: target.id(), source: crate::codec::Error::InvalidInput(reason) });
        }
        let header = ObjectHeader {
            kind: ObjectKind::Blob,
            dtype: target.dtype(),
            reference: Some(reference.id()),
            depth,
            conversion: None,
            raw_len: target.len(),
        };
        // The delta must use the reference's chunk size so chunk i lines up with chunk i.
        let options = Options { chunk_size: reference.chunk_size, ..options.clone() };
        self.write_temp_object(target.id(), header, Some(limit), |out| {
            encode_blob(
                target.id(),
                out,
                BlobData::Stored(target),
                Against::Chain(reference),
                header.dtype,
                &options,
                &Feedback::NONE,
            )
        })
    }

    /// Writes object `id`, an XOR delta against `xor_with` (of `data`'s length and dtype), its
    /// container coding `data` XORed with `xor_with`, unless the object would take `limit`
    /// bytes or more. The container records `id` as its
    /// content hash: for stored data it is taken as given; for bytes with
    /// `feedback.input_xxh3` it is taken as given and the bytes are checked against the xxh3,
    /// else they are hashed and must be `id`.
    fn write_delta_object(
        &self,
        id: ObjectId,
        data: BlobData<'_>,
        xor_with: &BlobChain,
        limit: u64,
        options: &Options,
        feedback: &Feedback<'_>,
    ) -> Result<DeltaOutcome> {
        let header = ObjectHeader {
            kind: ObjectKind::Blob,
            dtype: xor_with.dtype(),
            reference: Some(xor_with.id()),
            depth: xor_with.depth() + 1,
            conversion: None,
            raw_len: data.len() as u64,
        };
        // The delta must use the reference's chunk size so chunk i lines up with chunk i.
        let options = Options { chunk_size: xor_with.chunk_size, ..options.clone() };
        let mut stored = 0;
        let written = self.write_object(id, header, Some(limit), |out| {
            let mut counting = CountingWriter { inner: out, count: 0 };
            let result =
                encode_blob(id, &mut counting, data, Against::Chain(xor_with), header.dtype, &options, feedback);
            stored = counting.count;
            result
        })?;
        Ok(match written {
            Some(w) => DeltaOutcome::Written(w),
            None => DeltaOutcome::NotSmaller { stored_len: stored + super::HEADER_LEN as u64 },
        })
    }
}

/// What a blob write XORs its data with: nothing (a standalone blob), a stored blob (a delta),
/// or bytes (a derived blob's prediction).
#[derive(Clone, Copy)]
enum Against<'a> {
    Nothing,
    Chain(&'a BlobChain),
    Bytes(&'a [u8]),
    /// A derived blob's prediction made chunk by chunk from its reference's bytes.
    Predicted(&'a Prediction<'a>),
}

/// What a blob write codes: bytes the caller has (a file being committed), or a blob that is
/// already stored (rewritten as a delta).
#[derive(Clone, Copy)]
enum BlobData<'a> {
    Bytes(&'a [u8]),
    Stored(&'a BlobChain),
}

impl BlobData<'_> {
    fn len(&self) -> usize {
        match self {
            BlobData::Bytes(b) => b.len(),
            // A stored blob's length fits in memory: it was mapped when opened.
            BlobData::Stored(chain) => chain.len() as usize,
        }
    }
}

struct CountingWriter<'a> {
    inner: &'a mut dyn Write,
    count: u64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The caller's side of a blob write besides the data: what it wants reported while the write
/// runs, and what it already knows about the data.
pub struct Feedback<'a> {
    /// Called with the input bytes coded so far.
    pub progress: &'a (dyn Fn(u64) + Sync),
    /// Called with each input range (relative to the data) once it is coded and will not be
    /// read again, so a caller whose input is memory-mapped can drop those pages from its
    /// resident set (`mmap::Map::release`): memory then stays bounded by the window, not by
    /// the tensor.
    pub release_input: &'a (dyn Fn(std::ops::Range<usize>) + Sync),
    /// The xxh3-64 of the data, if the caller computed it together with the id. The write then
    /// records the id as the content's blake3 and only checks the bytes it codes against this
    /// (`ContainerWriter::with_known_hash`: a sixth of the cost of a second blake3 pass);
    /// without it the bytes are blake3-hashed again as they are coded. Either way, data that
    /// changes while it is read fails the write with [`Error::ChangedWhileWriting`].
    pub input_xxh3: Option<u64>,
}

impl Feedback<'static> {
    /// No progress reports, nothing to release, nothing known: the data is hashed as coded.
    pub const NONE: Feedback<'static> = Feedback { progress: &|_| {}, release_input: &|_| {}, input_xxh3: None };
}

/// Window length in bytes for `chunk_size`: whole stripes, about [`WINDOW_BYTES`].
fn window_len(chunk_size: usize) -> usize {
    let stripe = chunk_size * STRIPE_CHUNKS;
    (WINDOW_BYTES / stripe).max(1) * stripe
}

/// Codes `data` as a one-segment container, XORed with `reference` when given. Returns the
/// blake3 of `data` as the container records it (hashed as it was coded).
///
/// A delta takes its reference chunk by chunk, in grouped form, straight from the chain's
/// objects ([`ChainReference`]): nothing is regrouped and no reference window is held. The
/// reference's payloads are checksum-checked as they are decoded, which catches any damaged
/// byte of it; its content hash is not recomputed here. That is safe because a delta only has
/// to undo what the decoder produces: checkout XORs the delta with the same decoded reference
/// (`ckpt verify` is what re-hashes whole chains).
fn encode_blob(
    id: ObjectId,
    out: &mut dyn Write,
    data: BlobData<'_>,
    against: Against<'_>,
    dtype: Option<Dtype>,
    options: &Options,
    feedback: &Feedback<'_>,
) -> Result<blake3::Hash> {
    let encode = |e| match e {
        crate::codec::Error::InputChanged => Error::ChangedWhileWriting { id },
        source => Error::Encode { id, source },
    };
    let len = data.len();
    let mut w = ContainerWriter::new(out, FileKind::Bytes, len as u64, options.clone()).map_err(encode)?;
    let given = blake3::Hash::from_bytes(id.0);
    w = match (data, feedback.input_xxh3) {
        (BlobData::Stored(_), _) => w.with_given_hash(given),
        (BlobData::Bytes(_), Some(xxh3)) => w.with_known_hash(given, xxh3),
        (BlobData::Bytes(_), None) => w,
    };
    let chain_source = |chain| ChainReference { chain, containers: Vec::new(), error: Mutex::new(None) };
    let mut source = match against {
        Against::Chain(chain) => Some(chain_source(chain)),
        Against::Nothing | Against::Bytes(_) | Against::Predicted(_) => None,
    };
    let mut stored = match data {
        BlobData::Stored(chain) => Some(chain_source(chain)),
        BlobData::Bytes(_) => None,
    };
    for s in source.iter_mut().chain(stored.iter_mut()) {
        s.containers = s.chain.containers()?;
    }
    let input = SegmentInput {
        data: match (data, &stored) {
            (BlobData::Bytes(bytes), _) => Data::Bytes(bytes),
            (BlobData::Stored(_), Some(s)) => Data::Grouped { source: s, offset: 0, len },
            (BlobData::Stored(_), None) => unreachable!("a stored blob has its source"),
        },
        dtype,
        reference: match (against, &source) {
            (Against::Bytes(bytes), _) => Some(Reference::Bytes(bytes)),
            (Against::Predicted(prediction), _) => Some(Reference::Grouped { source: prediction, offset: 0, len }),
            (_, Some(s)) => Some(Reference::Grouped { source: s, offset: 0, len }),
            (_, None) => None,
        },
    };
    // Pages of the input and of the stored objects read are dropped every window once coded,
    // so the resident set stays about one window whatever the blob's size.
    let window = window_len(options.chunk_size);
    let mut released = 0;
    let coded = w.segment_inputs(&[input], &mut |covered| {
        let covered = covered as usize;
        (feedback.progress)(covered as u64);
        if covered - released >= window || covered == len {
            (feedback.release_input)(released..covered);
            if let Against::Predicted(prediction) = against {
                (prediction.release)(prediction.source_range(released..covered));
            }
            for s in source.iter().chain(stored.iter()) {
                s.chain.release_pages();
            }
            released = covered;
        }
    });
    if let Err(e) = coded {
        // A stored blob that failed to decode is that blob's problem, not this one's.
        let stored_error =
            |s: Option<ChainReference<'_>>| s.and_then(|s| s.error.into_inner().unwrap_or_else(|p| p.into_inner()));
        return Err(stored_error(source).or_else(|| stored_error(stored)).unwrap_or_else(|| encode(e)));
    }
    Ok(w.finish().map_err(encode)?.1)
}

/// A stored blob chain as the reference of a new delta: chunk `i` in grouped form is the base's
/// groups XORed with every delta's ([`BlobChain::apply_member_groups`]).
struct ChainReference<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
    /// The first store error, kept with its object id (the codec's error type cannot carry it).
    error: Mutex<Option<Error>>,
}

impl GroupedReference for ChainReference<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> crate::codec::Result<()> {
        let chain = self.chain;
        let i = offset / chain.chunk_size;
        if !offset.is_multiple_of(chain.chunk_size)
            || i >= chain.chunk_count
            || chain.chunk_range(i).len() != grouped.len()
        {
            return Err(crate::codec::Error::InvalidInput(format!(
                "{} reference bytes at offset {offset} are not a chunk of the reference",
                grouped.len()
            )));
        }
        chain.apply_member_groups(&self.containers, i, 0..chain.objects.len(), grouped).map_err(|e| {
            let reason = e.to_string();
            self.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            crate::codec::Error::Corrupt(format!("delta reference: {reason}"))
        })
    }
}

impl BlobChain {
    /// The blob's id.
    pub fn id(&self) -> ObjectId {
        self.objects[0].id
    }
    /// The blob's header.
    pub fn header(&self) -> &ObjectHeader {
        &self.objects[0].header
    }
    /// Length of the blob's content.
    pub fn len(&self) -> u64 {
        self.header().raw_len
    }
    /// Whether the blob is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element type.
    pub fn dtype(&self) -> Option<Dtype> {
        self.header().dtype
    }
    /// Number of deltas above the standalone base (0: the blob is standalone): the chain's
    /// length now, which may exceed the depth its header recorded when it was written.
    pub fn depth(&self) -> u32 {
        let own = (self.objects.len() - 1) as u32;
        match &self.derived {
            Some((_, source)) => own + 1 + source.depth(),
            None => own,
        }
    }
    /// When the chain ends at a derived blob: its conversion and its reference's chain.
    pub fn derived_from(&self) -> Option<(Conversion, &BlobChain)> {
        self.derived.as_ref().map(|(c, source)| (*c, source.as_ref()))
    }
    /// Chunk size shared by every object of the chain.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }
    /// Drops the chain's mapped object pages from the process's resident set (they are read
    /// from the page cache again if touched). See `mmap::Map::release`.
    pub fn release_pages(&self) {
        for o in &self.objects {
            o.release_pages();
        }
        if let Some((_, source)) = &self.derived {
            source.release_pages();
        }
    }

    /// What a blob derived from this one takes from it ([`BlobForm`]).
    pub fn form(&self) -> BlobForm {
        BlobForm {
            id: self.id(),
            dtype: self.dtype(),
            len: self.len(),
            chunk_size: self.chunk_size,
            depth: self.depth(),
            chain: self.ids(),
        }
    }

    /// Ids of the chain, target first, standalone base last.
    pub fn ids(&self) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = self.objects.iter().map(|o| o.id).collect();
        if let Some((_, source)) = &self.derived {
            ids.extend(source.ids());
        }
        ids
    }
    /// Size of the standalone base's object file: an estimate of what this content costs
    /// stored on its own.
    pub fn base_stored_len(&self) -> u64 {
        self.objects.last().expect("at least the target").bytes().len() as u64
    }
    /// Whether this is a standalone tensor blob whose every byte group is stored raw: what
    /// [`Store::write_blob_uncoded`] writes, left for compaction to code. (A blob the codec
    /// chose to store all raw reads the same; coding it again only finds nothing smaller.)
    pub fn is_uncoded(&self) -> Result<bool> {
        if self.depth() != 0 || self.derived.is_some() || self.dtype().is_none() || self.is_empty() {
            return Ok(false);
        }
        let containers = self.own_containers()?;
        let Some(base) = containers.first() else { return Ok(false) };
        Ok((0..base.chunk_count()).all(|i| base.chunk(i).2.groups().iter().all(|g| g.method == Method::Raw)))
    }

    /// Size of the blob's own object file.
    pub fn stored_len(&self) -> u64 {
        self.objects[0].bytes().len() as u64
    }

    /// Opens every container of the chain and checks that they line up: the chain's own
    /// objects first, then, for a chain ending at a derived blob, its reference's containers.
    fn containers(&self) -> Result<Vec<Container<'_>>> {
        let mut containers = self.own_containers()?;
        if let Some((_, source)) = &self.derived {
            containers.extend(source.containers()?);
        }
        Ok(containers)
    }

    fn own_containers(&self) -> Result<Vec<Container<'_>>> {
        let grouping = Grouping::for_dtype(self.dtype());
        let len = self.len();
        self.objects
            .iter()
            .map(|o| {
                let c = o.container()?;
                let corrupt = |reason: String| Error::Corrupt { id: o.id, reason };
                if c.chunk_size() != self.chunk_size {
                    return Err(corrupt(format!(
                        "chunk size {} differs from its chain's {}",
                        c.chunk_size(),
                        self.chunk_size
                    )));
                }
                if c.chunk_count() != self.chunk_count {
                    return Err(corrupt(format!(
                        "{} chunks where its chain has {}",
                        c.chunk_count(),
                        self.chunk_count
                    )));
                }
                if let Some(s) = c.segments().iter().find(|s| Grouping::for_dtype(s.dtype) != grouping) {
                    return Err(corrupt(format!("a segment of {:?} in a blob of {:?}", s.dtype, self.dtype())));
                }
                for i in 0..c.chunk_count() {
                    let expected = self.chunk_range(i);
                    let (_, range, _) = c.chunk(i);
                    if range != (expected.start as u64..expected.end as u64) {
                        return Err(corrupt(format!("chunk {i} covers bytes {range:?}, expected {expected:?}")));
                    }
                }
                debug_assert!(len == c.original_len());
                Ok(c)
            })
            .collect()
    }

    fn chunk_range(&self, i: usize) -> Range<usize> {
        let start = i * self.chunk_size;
        start..(start + self.chunk_size).min(self.len() as usize)
    }

    /// Decodes chunks `chunks` through the whole chain into `out` (their total length), in
    /// parallel. Not hash-checked.
    fn decode_chunks(&self, containers: &[Container<'_>], chunks: Range<usize>, out: &mut [u8]) -> Result<()> {
        let mut rest = out;
        let mut work = Vec::with_capacity(chunks.len());
        for i in chunks {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(self.chunk_range(i).len());
            rest = tail;
            work.push((i, head));
        }
        work.into_par_iter().try_for_each(|(i, dst)| self.decode_chunk(containers, i, dst))
    }

    fn decode_chunk(&self, containers: &[Container<'_>], i: usize, dst: &mut [u8]) -> Result<()> {
        let n = self.objects.len();
        let corrupt =
            |k: usize| move |e: crate::codec::Error| Error::Corrupt { id: self.objects[k].id, reason: e.to_string() };
        if n == 1 && self.derived.is_none() {
            return containers[0].decode_chunk_into(i, dst).map_err(corrupt(0));
        }
        // Decode the chain in grouped form: XOR the byte groups of every member into one buffer
        // and regroup once, instead of regrouping once per chain member.
        crate::codec::with_thread_buffer(&CHAIN_SCRATCH, dst.len(), |grouped| {
            self.decode_chunk_grouped(containers, i, grouped, dst)
        })
    }

    /// [`Self::decode_chunk`] of a chain, with `grouped` (the chunk's length) as scratch.
    fn decode_chunk_grouped(
        &self,
        containers: &[Container<'_>],
        i: usize,
        grouped: &mut [u8],
        dst: &mut [u8],
    ) -> Result<()> {
        let n = self.objects.len();
        self.apply_member_groups(containers, i, 0..n, grouped)?;
        self.regroup_chunk(grouped, dst, n - 1)
    }

    /// Writes the grouped form of the prediction of chunk `i` of the derived blob this chain
    /// ends at into `grouped`: the reference's chunk `i` decoded (through its own chain, from
    /// `containers`, the reference's), converted, split. Errors about the conversion blame the
    /// derived blob.
    fn predicted_groups(
        &self,
        conversion: Conversion,
        source: &BlobChain,
        containers: &[Container<'_>],
        i: usize,
        grouped: &mut [u8],
    ) -> Result<()> {
        let base = self.objects.last().expect("at least the target");
        let corrupt = |e: crate::codec::Error| Error::Corrupt { id: base.id, reason: e.to_string() };
        let mut plain = vec![0u8; source.chunk_range(i).len()];
        // Through neither `decode_chunk` nor the container's `decode_chunk_into`, even for a
        // standalone reference: their thread buffers are the callers' while this runs (the
        // codec's chunk scratch holds the input of a delta being coded against this chain).
        let mut scratch = vec![0u8; plain.len()];
        source.decode_chunk_grouped(containers, i, &mut scratch, &mut plain)?;
        let (Some(from), Some(to)) = (source.dtype(), self.dtype()) else {
            return Err(corrupt(crate::codec::Error::InvalidInput("a derived blob of opaque bytes".into())));
        };
        let mut predicted = vec![0u8; grouped.len()];
        cross_precision::predict(conversion, &plain, from, to, &mut predicted).map_err(corrupt)?;
        byte_group::split(&predicted, None, Grouping::for_dtype(self.dtype()), grouped).map_err(corrupt)
    }

    /// Applies chunk `i`'s byte groups of chain `members` (indices into the chain, oldest =
    /// highest first) to `grouped`. When `members` reaches the standalone base, its groups
    /// overwrite `grouped` (every byte is written before any delta); each delta's groups are
    /// XORed in. A delta chunk whose byte groups are all Zero leaves the reference unchanged
    /// (late in training most are): its empty payload is skipped.
    fn apply_member_groups(
        &self,
        containers: &[Container<'_>],
        i: usize,
        members: Range<usize>,
        grouped: &mut [u8],
    ) -> Result<()> {
        let base = self.objects.len() - 1;
        for k in members.rev() {
            let mut fresh = k == base;
            if let (true, Some((conversion, source))) = (fresh, &self.derived) {
                // The derived blob's residual applies to its prediction, not to nothing.
                self.predicted_groups(*conversion, source, &containers[base + 1..], i, grouped)?;
                fresh = false;
            }
            let (_, _, header) = containers[k].chunk(i);
            if !fresh && header.groups().iter().all(|g| g.method == Method::Zero) {
                continue;
            }
            containers[k]
                .decode_chunk_groups_into(i, grouped, !fresh)
                .map_err(|e| Error::Corrupt { id: self.objects[k].id, reason: e.to_string() })?;
        }
        Ok(())
    }

    /// Regroups one chunk from its grouped form into `dst`; errors blame chain member `blame`.
    fn regroup_chunk(&self, grouped: &[u8], dst: &mut [u8], blame: usize) -> Result<()> {
        let grouping = Grouping::for_dtype(self.dtype());
        let group_len = dst.len() / grouping.width;
        let groups: Vec<&[u8]> = (0..grouping.width).map(|g| &grouped[g * group_len..(g + 1) * group_len]).collect();
        byte_group::regroup(&groups, None, grouping, dst)
            .map_err(|e| Error::Corrupt { id: self.objects[blame].id, reason: e.to_string() })
    }

    /// Verifies a run of this chain's members at once, decoding every object once: `members`
    /// is how many chain members, counted from the standalone base's side up to and including
    /// the target, to check (1 = only the target; `ids().len()` = all of them, base first).
    /// Window by window, the oldest checked member's content is decoded through the rest of
    /// the chain in grouped form, then each newer member's delta groups are XORed on top and
    /// the result regrouped and hashed for that member. Checking the d + 1 members of a chain
    /// one by one would decode (d + 1)(d + 2) / 2 objects instead of d + 1.
    ///
    /// Errors name the first object found damaged; the caller can then check members one by
    /// one to find every affected one.
    pub fn verify_members(&self, members: usize) -> Result<()> {
        let n = self.objects.len();
        let members = members.clamp(1, n);
        let containers = self.containers()?;
        // Chain indices of the checked members, oldest first: members - 1, ..., 0.
        let oldest = members - 1;
        let mut hashers: Vec<blake3::Hasher> = (0..members).map(|_| blake3::Hasher::new()).collect();
        let per_window = (window_len(self.chunk_size) / self.chunk_size).max(1);
        let mut grouped = Vec::new();
        let mut plain = Vec::new();
        let mut first = 0;
        while first < self.chunk_count {
            let chunks = first..(first + per_window).min(self.chunk_count);
            let len: usize = chunks.clone().map(|i| self.chunk_range(i).len()).sum();
            grouped.resize(len, 0);
            plain.resize(len, 0);
            for k in (0..=oldest).rev() {
                // Per chunk, in parallel: bring the grouped state up to member k, regroup.
                let mut work = Vec::with_capacity(chunks.len());
                let (mut g_rest, mut p_rest) = (&mut grouped[..], &mut plain[..]);
                for i in chunks.clone() {
                    let l = self.chunk_range(i).len();
                    let (g, gt) = std::mem::take(&mut g_rest).split_at_mut(l);
                    let (p, pt) = std::mem::take(&mut p_rest).split_at_mut(l);
                    g_rest = gt;
                    p_rest = pt;
                    work.push((i, g, p));
                }
                // The oldest checked member starts from the standalone base; each newer one
                // applies only its own delta on top.
                let apply = if k == oldest { oldest..n } else { k..k + 1 };
                work.into_par_iter().try_for_each(|(i, g, p)| -> Result<()> {
                    self.apply_member_groups(&containers, i, apply.clone(), g)?;
                    self.regroup_chunk(g, p, k)
                })?;
                hash_update(&mut hashers[k], &plain);
            }
            self.release_pages();
            first = chunks.end;
        }
        for (k, hasher) in hashers.iter().enumerate() {
            if ObjectId(*hasher.finalize().as_bytes()) != self.objects[k].id {
                return Err(Error::Corrupt {
                    id: self.objects[k].id,
                    reason: "decoded bytes do not match the object id".into(),
                });
            }
        }
        Ok(())
    }

    /// Opens every container of the chain for decoding arbitrary chunk ranges in any order, on
    /// any thread ([`ChainDecoder`]). Nothing it decodes is hash-checked: the caller verifies
    /// the assembled content (e.g. a whole file against its recorded hash).
    pub fn decoder(&self) -> Result<ChainDecoder<'_>> {
        Ok(ChainDecoder { chain: self, containers: self.containers()? })
    }

    /// Checks that `hash`, the blake3 of the blob's content as a caller decoded it, is the
    /// blob's id; names the chain when it is not.
    pub fn check_hash(&self, hash: ObjectId) -> Result<()> {
        if hash == self.id() {
            return Ok(());
        }
        let reason = if self.objects.len() > 1 {
            format!(
                "decoded bytes hash to {hash} (through a delta chain of {} objects: {})",
                self.objects.len(),
                self.ids().iter().map(|i| i.short(12)).collect::<Vec<_>>().join(" <- ")
            )
        } else {
            format!("decoded bytes hash to {hash}")
        };
        Err(Error::Corrupt { id: self.id(), reason })
    }

    /// A reader that decodes the blob window by window (about 32 MiB of whole chunks each) and
    /// checks the blake3 of the whole content against the id after the last window.
    pub fn reader(&self) -> Result<BlobReader<'_>> {
        let containers = self.containers()?;
        let per_window = (window_len(self.chunk_size) / self.chunk_size).max(1);
        Ok(BlobReader {
            chain: self,
            containers,
            per_window,
            next_chunk: 0,
            buf: take_window(),
            hasher: blake3::Hasher::new(),
            done: false,
        })
    }

    /// Writes the blob's content to `out`, in windows, verifying its blake3 against the id at
    /// the end. On an error the caller must discard what was written.
    pub fn copy_to(&self, out: &mut dyn Write) -> Result<u64> {
        self.copy_to_with_progress(out, &|_| {})
    }

    /// [`Self::copy_to`], calling `progress` with the bytes written so far after each window.
    pub fn copy_to_with_progress(&self, out: &mut dyn Write, progress: &dyn Fn(u64)) -> Result<u64> {
        let mut reader = self.reader()?;
        let mut done = 0u64;
        while let Some(window) = reader.next_window()? {
            out.write_all(window).map_err(|source| Error::Output { id: self.id(), source })?;
            done += window.len() as u64;
            progress(done);
        }
        Ok(done)
    }
}

/// Decodes chunks of a blob in any order ([`BlobChain::decoder`]); `Sync`, so workers can
/// share it. Each payload is checksum-checked as it is decoded; the content as a whole is not.
pub struct ChainDecoder<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
}

impl ChainDecoder<'_> {
    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chain.chunk_count
    }
    /// Byte range of chunks `chunks` within the blob's content.
    pub fn byte_range(&self, chunks: Range<usize>) -> Range<usize> {
        if chunks.is_empty() {
            return 0..0;
        }
        self.chain.chunk_range(chunks.start).start..self.chain.chunk_range(chunks.end - 1).end
    }
    /// Decodes chunks `chunks` through the chain into `out` (exactly their length), on the
    /// calling thread. A chunk index past the end is an error, not a panic.
    pub fn decode_into(&self, chunks: Range<usize>, out: &mut [u8]) -> Result<()> {
        if chunks.end > self.chain.chunk_count || out.len() != self.byte_range(chunks.clone()).len() {
            return Err(Error::Output {
                id: self.chain.id(),
                source: std::io::Error::other(format!("chunks {chunks:?} do not fit the request")),
            });
        }
        let mut rest = out;
        for i in chunks {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(self.chain.chunk_range(i).len());
            rest = tail;
            self.chain.decode_chunk(&self.containers, i, dst)?;
        }
        Ok(())
    }
}

/// Decodes a blob window by window ([`BlobChain::reader`]): memory is one window.
pub struct BlobReader<'a> {
    chain: &'a BlobChain,
    containers: Vec<Container<'a>>,
    per_window: usize,
    next_chunk: usize,
    buf: Vec<u8>,
    hasher: blake3::Hasher,
    done: bool,
}

impl Drop for BlobReader<'_> {
    fn drop(&mut self) {
        return_window(std::mem::take(&mut self.buf));
    }
}

impl BlobReader<'_> {
    /// The next window of the blob's content (a whole number of chunks; every window but the
    /// last is a multiple of the chunk size), or `None` after the last one. Returning `None`
    /// means the whole content hashed to the blob's id; otherwise it is [`Error::Corrupt`].
    pub fn next_window(&mut self) -> Result<Option<&[u8]>> {
        let chain = self.chain;
        if self.next_chunk >= chain.chunk_count {
            self.buf.clear();
            if !self.done {
                self.done = true;
                chain.check_hash(ObjectId(*self.hasher.finalize().as_bytes()))?;
            }
            return Ok(None);
        }
        let first = self.next_chunk;
        let last = (first + self.per_window).min(chain.chunk_count);
        let len = chain.chunk_range(last - 1).end - chain.chunk_range(first).start;
        self.buf.resize(len, 0);
        chain.decode_chunks(&self.containers, first..last, &mut self.buf)?;
        hash_update(&mut self.hasher, &self.buf);
        self.next_chunk = last;
        Ok(Some(&self.buf))
    }

    /// The window the last [`Self::next_window`] returned (empty before the first call).
    pub fn current(&self) -> &[u8] {
        &self.buf
    }
}
