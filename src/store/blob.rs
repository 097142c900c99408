//! Blobs: writing them standalone or as XOR deltas (here), reading them back through their
//! reference chain chunk by chunk ([`chain`]), and coding derived blobs ([`derived`]).
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

use super::{Error, ObjectHeader, ObjectKind, Result, Store, UnsyncedBlob, Written, MAX_CHAIN_DEPTH};
use crate::codec::chunk::STRIPE_CHUNKS;
use crate::codec::chunk::{Data, Reference};
use crate::codec::container::{ContainerWriter, FileKind, SegmentInput};
use crate::codec::select::Selection;
use crate::codec::{Method, Options};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use std::io::Write;

mod chain;
mod derived;

use chain::ChainReference;
pub use chain::{BlobChain, BlobReader, ChainDecoder};
use derived::Prediction;
pub use derived::{DerivedBlob, DerivedTarget, SourceBytes};

/// Bytes of input coded (or decoded) per window: bounds memory while keeping both cores busy.
const WINDOW_BYTES: usize = 32 << 20;

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
            chunk_size: reference.chunk_size(),
            depth: reference.depth() + 1,
            chain: std::iter::once(written.id).chain(reference.ids()).collect(),
        }
    }

    /// The blob's id.
    pub fn id(&self) -> ObjectId {
        self.id
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

impl Store {
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
    /// left in a temp file for `Store::persist_unsynced`.
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
    pub(crate) fn encode_standalone_for_transfer(
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
    pub(crate) fn encode_delta_for_transfer(
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
        let options = Options { chunk_size: reference.chunk_size(), ..options.clone() };
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
        let options = Options { chunk_size: xor_with.chunk_size(), ..options.clone() };
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
    let source = match against {
        Against::Chain(chain) => Some(ChainReference::open(chain)?),
        Against::Nothing | Against::Bytes(_) | Against::Predicted(_) => None,
    };
    let stored = match data {
        BlobData::Stored(chain) => Some(ChainReference::open(chain)?),
        BlobData::Bytes(_) => None,
    };
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
        link: None,
        row_len: None,
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
                prediction.release(released..covered);
            }
            for s in source.iter().chain(stored.iter()) {
                s.release_pages();
            }
            released = covered;
        }
    });
    if let Err(e) = coded {
        // A stored blob that failed to decode is that blob's problem, not this one's.
        let stored_error = |s: Option<ChainReference<'_>>| s.and_then(ChainReference::into_error);
        return Err(stored_error(source).or_else(|| stored_error(stored)).unwrap_or_else(|| encode(e)));
    }
    Ok(w.finish().map_err(encode)?.1)
}
