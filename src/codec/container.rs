//! The container: one compressed file. A fixed header, the chunk payloads, a chunk index and a
//! footer (docs/format.md, "Container"). The original file is a sequence of segments (the
//! safetensors header, each tensor, any gap), each coded in chunks with its own element grouping.
//!
//! The index sits at the end so compression streams: payloads are written as chunks finish and
//! only the small index is kept in memory. The index lists every chunk's methods and stored
//! sizes, so `open` knows where each chunk lives and any byte range decodes on its own, in
//! parallel. Header, index and footer are covered by a checksum in the footer, each chunk
//! payload by an xxh3 checksum in the index (checked on every decode, ranges included), and the
//! whole original by its blake3 hash, which [`Container::decode_to`] verifies.
//!
//! Reading is strict: every count and offset is checked against the bytes actually present
//! before anything is allocated or sliced.

use super::chunk::{
    checked_chunk_size, encode_chunks_gridded, payload_checksum, ChunkHeader, Data, EncodedChunk, GroupEntry,
    Reference, STRIPE_CHUNKS,
};
use super::grid::{self, TensorGrid};
use super::select::Options;
use super::{decode_chunk, Error, Grouping, Method, Result};
use crate::dtype::Dtype;
use crate::object_id::{NodeHash, RangeHashJoin, RangeHashes};
use frame::Frame;
use input_hash::InputHasher;
use le::{read_u32, read_u64};
use rayon::prelude::*;
use std::io::Write;
use std::ops::Range;

/// First bytes of every container (PNG-style: catches text-mode and 7-bit mangling).
pub(crate) const MAGIC: [u8; 8] = *b"\x89CKZ\r\n\x1a\n";
/// Last bytes of every container.
pub(crate) const END_MAGIC: [u8; 8] = *b"CKZ-END\n";
/// The container format version this code writes. Format 7 added reference segments (copies
/// of an earlier segment, or derived from one: docs/format.md, "Reference segments") and the
/// Grid, Within and Masked methods.
pub const FORMAT_VERSION: u16 = 7;
/// The first container format version with reference segments (and the newest read).
pub const REFERENCE_FORMAT_VERSION: u16 = 7;
/// The oldest container format version this code reads. Format 3 only added the `Sparse`
/// method tag, format 4 the `Rans` tag, format 5 rANS context sources, binned and packed tables
/// (flags in a rANS payload's first byte, which format 4 kept zero) and format 6 the `Paired`
/// and `Remainder` tags, and format 7 the `Grid` and `Within` tags, so every container of an
/// older format is a valid format-7 container (checked by decoding the checked-in containers of
/// `tests/fixtures/containers`).
pub(crate) const MIN_READ_VERSION: u16 = 2;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 32;
/// Size of the fixed footer.
pub const FOOTER_LEN: usize = 64;
/// Bytes per group entry in the index: method tag (u8) and stored length (u32 LE).
const ENTRY_LEN: usize = 5;
/// Bytes after a chunk's group entries: xxh3-64 of its payload (u64 LE).
const CHECKSUM_LEN: usize = 8;
/// Bytes per segment record before its chunk entries: original length (u64) and dtype code (u8).
const SEGMENT_RECORD_LEN: usize = 9;

/// Widest element a segment can hold (8-byte dtypes): bytes, and byte groups, per element.
const MAX_ELEMENT_WIDTH: usize = 8;

/// The longest container of an `original_len`-byte original ckpt writes as an object: header
/// and footer; a payload no longer than the original (a group stored raw is as long as the
/// group, every other method is shorter); an index of at most one segment record per chunk and
/// one more (an empty original has one empty segment), and one entry per chunk at the smallest
/// chunk size and the widest element. An object longer than its header allows by this is
/// damaged or forged (padding behind its footer, a flood of empty segments): a download stops
/// there instead of taking what follows (docs/format.md, "Caps on untrusted sizes").
pub fn max_len(original_len: u64) -> u64 {
    let chunks = original_len.div_ceil(super::select::MIN_CHUNK_SIZE as u64);
    let index = chunks
        .saturating_add(1)
        .saturating_mul(SEGMENT_RECORD_LEN as u64)
        .saturating_add(chunks.saturating_mul((MAX_ELEMENT_WIDTH * ENTRY_LEN + CHECKSUM_LEN) as u64))
        .saturating_add(4);
    original_len.saturating_add(index).saturating_add((HEADER_LEN + FOOTER_LEN) as u64)
}

/// What the original file was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FileKind {
    /// Any file, coded as plain bytes.
    Bytes = 0,
    /// A safetensors file, coded tensor by tensor.
    Safetensors = 1,
    /// A `torch.save` archive, coded storage by storage (see `crate::torch_zip`).
    Torch = 2,
}

impl FileKind {
    fn from_tag(tag: u8) -> Result<FileKind> {
        match tag {
            0 => Ok(FileKind::Bytes),
            1 => Ok(FileKind::Safetensors),
            2 => Ok(FileKind::Torch),
            t => Err(Error::Corrupt(format!("unknown file kind {t}"))),
        }
    }
}

/// One segment to code: its bytes, element type and, for an XOR delta, its reference.
#[derive(Clone, Copy)]
pub(crate) struct SegmentInput<'a> {
    /// The segment's original bytes. Grouped data (bytes already stored) needs a writer that
    /// was given the original's hash ([`ContainerWriter::with_given_hash`]): there are no plain
    /// bytes to hash.
    pub data: Data<'a>,
    /// Element type (`None`: plain bytes).
    pub dtype: Option<Dtype>,
    /// For an XOR delta: what `data` is XORed with before grouping.
    pub reference: Option<Reference<'a>>,
    /// A reference segment: a copy of an earlier segment (nothing coded; `data` is still its
    /// bytes, hashed), or derived from one (`reference` is then its prediction). Only in a
    /// writer made by [`ContainerWriter::with_reference_segments`].
    pub link: Option<SegmentLink>,
    /// Elements per row of the tensor the segment holds (its last dimension), when it is one
    /// tensor: where a grid's groups start ([`super::grid`]).
    pub row_len: Option<u64>,
}

/// Streams a container to `W`: [`ContainerWriter::segment`] once per segment, in file order,
/// then [`ContainerWriter::finish`].
pub struct ContainerWriter<W: Write> {
    out: W,
    options: Options,
    original_len: u64,
    header: [u8; HEADER_LEN],
    written: u64,
    covered: u64,
    segments: u32,
    index: Vec<u8>,
    hasher: InputHasher,
    /// Whether reference segments may be written ([`Self::with_reference_segments`]): the
    /// store refuses objects holding them.
    references: bool,
}

/// Original bytes of one unit of work in [`Container::decode_into`], decoded and then hashed by
/// one worker: small enough to still be in cache when hashed (a Zen 4 core's L2 is 1 MiB), large
/// enough that a unit is several chunks. Batches of 1–2 MiB per thread measured best before.
const DECODE_UNIT: usize = 1 << 20;

/// Input bytes a compression codes ahead of the unit it writes next: bounds memory to about
/// this much payload. Four stripes per thread keep every thread busy while the writer waits for
/// a slow stripe; counted in bytes, not units, because a file of small tensors has many tiny
/// units.
fn bytes_in_flight(chunk_size: usize) -> usize {
    chunk_size * STRIPE_CHUNKS * 4 * rayon::current_num_threads().max(1)
}

/// Original bytes [`Container::decode_to_reporting`] decodes per parallel batch before writing
/// them: bounds its memory. Four chunks per thread (1 MiB at the default chunk size): the two
/// batch buffers are reused from batch to batch, so their size is also the fresh memory a
/// decompression faults in. At 8 MiB per batch (the earlier size), a 6 MB file was one batch
/// whose buffer was all new pages: the kernel zeroing them (`clear_page_erms`) was 14% of
/// `ckpt decompress`'s time in perf, more than decoding.
fn decode_batch_len(chunk_size: usize) -> usize {
    chunk_size * 4 * rayon::current_num_threads().max(1)
}

impl<W: Write> ContainerWriter<W> {
    /// Writes the header of a container for an original file of `original_len` bytes.
    pub fn new(out: W, kind: FileKind, original_len: u64, options: Options) -> Result<Self> {
        Self::with_version(out, kind, original_len, options, FORMAT_VERSION)
    }

    /// [`Self::new`] for a container that may hold reference segments ([`SegmentInput::link`]):
    /// its header says format [`REFERENCE_FORMAT_VERSION`], which older readers refuse.
    pub(crate) fn with_reference_segments(out: W, kind: FileKind, original_len: u64, options: Options) -> Result<Self> {
        let mut writer = Self::with_version(out, kind, original_len, options, REFERENCE_FORMAT_VERSION)?;
        writer.references = true;
        Ok(writer)
    }

    fn with_version(mut out: W, kind: FileKind, original_len: u64, options: Options, version: u16) -> Result<Self> {
        let chunk_size = checked_chunk_size(&options)?;
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..10].copy_from_slice(&version.to_le_bytes());
        header[10] = kind as u8;
        header[12..16].copy_from_slice(&(chunk_size as u32).to_le_bytes());
        header[16..24].copy_from_slice(&original_len.to_le_bytes());
        out.write_all(&header).map_err(io_error)?;
        let mut index = Vec::new();
        index.extend_from_slice(&0u32.to_le_bytes()); // segment count, patched in finish
        Ok(ContainerWriter {
            out,
            options,
            original_len,
            header,
            written: HEADER_LEN as u64,
            covered: 0,
            segments: 0,
            index,
            hasher: InputHasher::Blake3(Box::new(RangeHashJoin::new(original_len))),
            references: false,
        })
    }

    /// Records `hash` as the original's blake3 instead of hashing the bytes as they are coded,
    /// for a caller that hashed them already (a commit hashes every tensor for its id before
    /// coding it). The coded bytes are checked against `xxh3`, the caller's xxh3-64 of the
    /// whole original, at a sixth of blake3's cost; [`Self::finish`] fails with
    /// [`Error::InputChanged`] if they differ (the input changed in between). The guard is
    /// against accidents, not adversaries: xxh3 is not collision resistant, and decoding still
    /// verifies the blake3.
    pub fn with_known_hash(mut self, hash: blake3::Hash, xxh3: u64) -> Self {
        let xxh3_state = Box::new(xxhash_rust::xxh3::Xxh3::new());
        self.hasher = InputHasher::Known { hash, expected_xxh3: xxh3, xxh3: xxh3_state };
        self
    }

    /// Records `hash` as the original's blake3, unchecked: for data that is already stored and
    /// checksum-checked as it is read ([`Data::Grouped`], a stored blob rewritten as a delta).
    pub fn with_given_hash(mut self, hash: blake3::Hash) -> Self {
        self.hasher = InputHasher::Given(hash);
        self
    }

    /// Codes the next `data.len()` bytes of the original file as one segment of `dtype`
    /// elements (`None`: plain bytes).
    pub fn segment(&mut self, data: &[u8], dtype: Option<Dtype>) -> Result<()> {
        self.segment_inputs(
            &[SegmentInput { data: Data::Bytes(data), dtype, reference: None, link: None, row_len: None }],
            &mut |_| {},
        )
    }

    /// Codes several consecutive segments (in file order), in parallel across segments as well
    /// as within them: a file of many small tensors would otherwise run one stripe at a time.
    /// `progress` is called with the original bytes covered so far. The output is the same as
    /// calling [`Self::segment`] for each part.
    pub fn segments(&mut self, parts: &[(&[u8], Option<Dtype>)], progress: &mut dyn FnMut(u64)) -> Result<()> {
        let inputs: Vec<SegmentInput<'_>> = parts
            .iter()
            .map(|&(data, dtype)| SegmentInput {
                data: Data::Bytes(data),
                dtype,
                reference: None,
                link: None,
                row_len: None,
            })
            .collect();
        self.segment_inputs(&inputs, progress)
    }

    /// Like [`Self::segment`], but codes `data XOR reference` (an XOR delta) when `reference` is
    /// given (same length). The recorded hash is still that of `data`; decoding needs the same
    /// reference ([`Container::decode_to_with_reference`]).
    pub fn segment_delta(&mut self, data: &[u8], reference: Option<&[u8]>, dtype: Option<Dtype>) -> Result<()> {
        let reference = reference.map(Reference::Bytes);
        self.segment_inputs(
            &[SegmentInput { data: Data::Bytes(data), dtype, reference, link: None, row_len: None }],
            &mut |_| {},
        )
    }

    /// Codes consecutive segments, each standalone or as an XOR delta against its reference.
    /// Everything else ([`Self::segment`], [`Self::segments`], [`Self::segment_delta`]) is
    /// this with fewer options. `progress` is called with the original bytes covered so far,
    /// after their payloads are written.
    pub(crate) fn segment_inputs(&mut self, parts: &[SegmentInput<'_>], progress: &mut dyn FnMut(u64)) -> Result<()> {
        let chunk_size = self.options.chunk_size;
        let stripe = chunk_size * STRIPE_CHUNKS;
        // Work units: one stripe of one part (an empty part is one empty unit, for its record).
        let mut units: Vec<(usize, Range<usize>)> = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            let width = Grouping::for_dtype(part.dtype).width;
            if !part.data.len().is_multiple_of(width) {
                return Err(Error::InvalidInput(format!(
                    "segment of {} bytes is not a whole number of {} elements",
                    part.data.len(),
                    part.dtype.map_or("byte", |d| d.safetensors_name())
                )));
            }
            if part.reference.is_some_and(|r| r.len() != part.data.len()) {
                return Err(Error::InvalidInput("reference and data lengths differ".into()));
            }
            if part.data.is_empty() {
                units.push((p, 0..0));
            }
            units.extend((0..part.data.len()).step_by(stripe).map(|at| (p, at..(at + stripe).min(part.data.len()))));
        }
        // A pipeline without barriers: each unit is a task on the pool (code it, then hash the
        // blake3 subtrees inside it), and units of at most `window` bytes are coded ahead of the
        // one this thread writes next. This thread writes the units in file order as they
        // arrive, joining their hashes, each unit freeing room for more; while the next one is
        // not done it codes others itself (`rayon::yield_now`) when it is a pool thread. The
        // previous design, batches of stripes with a fork-join each, kept two threads 1.55-1.78
        // CPUs busy (perf stat): every batch waited for its slowest stripe.
        let window = bytes_in_flight(chunk_size);
        let options = &self.options.clone();
        let hash_shape = self.hasher.shape();
        // Where each part starts in the original: the segments written so far cover `covered`.
        let starts: Vec<u64> = parts
            .iter()
            .scan(self.covered, |at, part| {
                let start = *at;
                *at += part.data.len() as u64;
                Some(start)
            })
            .collect();
        // A grid per standalone tensor, looked for on a sample of it (bounded cost).
        let grids: Vec<Option<TensorGrid>> = parts
            .par_iter()
            .map(|part| match (part.data.bytes(), part.dtype, part.reference) {
                (Some(bytes), Some(dtype), None) => {
                    grid::detect(bytes, dtype, part.row_len).map(|plan| grid::fit_tensor(bytes, &plan))
                }
                _ => None,
            })
            .collect();
        type Coded = (Result<Vec<EncodedChunk>>, Vec<NodeHash>);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, std::thread::Result<Coded>)>();
        rayon::in_place_scope_fifo(|scope| {
            let (mut spawned, mut in_flight) = (0, 0);
            let mut arrived = std::collections::BTreeMap::<usize, std::thread::Result<_>>::new();
            for next in 0..units.len() {
                while spawned < units.len() && (spawned <= next || in_flight + units[spawned].1.len() <= window) {
                    let (p, range) = units[spawned].clone();
                    let (part, start, done, unit) = (&parts[p], starts[p], done_tx.clone(), spawned);
                    let grid = grids[p].as_ref().map(|g| (g, (range.start / g.plan.dtype.size()) as u64));
                    scope.spawn_fifo(move |_| {
                        // A panic is sent on, not left to the scope: the scope would report it
                        // only at its end, and this thread would wait for the unit forever.
                        let coded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            let data = part.data.slice(range.clone());
                            let reference = part.reference.map(|r| r.slice(range.clone()));
                            let grouping = Grouping::for_dtype(part.dtype);
                            // Masks for plain standalone bytes (grouped data is already stored).
                            let mask = reference.is_none() && data.bytes().is_some();
                            let chunks = if part.link.is_some_and(|l| l.conversion.is_none()) {
                                Ok(Vec::new()) // a copy: nothing coded
                            } else {
                                encode_chunks_gridded(data, reference, grouping, options, grid, mask)
                            };
                            let mut nodes = Vec::new();
                            if let (Some(shape), Some(bytes)) = (hash_shape, data.bytes()) {
                                let at = start + range.start as u64;
                                shape.hash_range(at..at + bytes.len() as u64, bytes, &mut nodes);
                            }
                            (chunks, nodes)
                        }));
                        // The receiver is gone only when the writer stopped on an error.
                        let _ = done.send((unit, coded));
                    });
                    in_flight += units[spawned].1.len();
                    spawned += 1;
                }
                let chunks = loop {
                    if let Some(coded) = arrived.remove(&next) {
                        break coded.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    }
                    let message = match done_rx.try_recv() {
                        Ok(message) => message,
                        Err(_) if matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) => continue,
                        // Every unit is spawned before it is awaited and each sends once, so
                        // the channel cannot run dry while `next` is missing.
                        Err(_) => done_rx.recv().expect("a spawned unit reports"),
                    };
                    arrived.insert(message.0, message.1);
                };
                let ((chunks, nodes), (p, range)) = (chunks, &units[next]);
                in_flight -= range.len();
                let at = starts[*p] + range.start as u64;
                self.hasher.update(at..at + range.len() as u64, parts[*p].data.slice(range.clone()), nodes)?;
                self.write_unit(&parts[*p], range, chunks?, progress)?;
            }
            Ok(())
        })
    }

    /// Appends one coded unit (a stripe of a segment, opening the segment at its first).
    fn write_unit(
        &mut self,
        part: &SegmentInput<'_>,
        range: &Range<usize>,
        chunks: Vec<EncodedChunk>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        if range.start == 0 {
            self.begin_segment(part.data.len(), part.dtype, part.link)?;
        }
        self.write_chunks(chunks)?;
        self.covered_progress(range.end as u64, part.data.len() as u64, progress);
        Ok(())
    }

    fn begin_segment(&mut self, len: usize, dtype: Option<Dtype>, link: Option<SegmentLink>) -> Result<()> {
        self.covered += len as u64;
        if self.covered > self.original_len {
            return Err(Error::InvalidInput("segments exceed the declared original length".into()));
        }
        let code = dtype.map_or(0, Dtype::code);
        self.index.extend_from_slice(&(len as u64).to_le_bytes());
        match link {
            None => self.index.push(code),
            Some(link) => {
                if !self.references || link.source >= self.segments {
                    return Err(Error::InvalidInput(format!(
                        "segment {}: a reference to segment {} in a container not written for references",
                        self.segments, link.source
                    )));
                }
                self.index.push(code | links::LINK_FLAG);
                self.index.extend_from_slice(&links::record(link));
            }
        }
        self.segments += 1;
        Ok(())
    }

    fn write_chunks(&mut self, chunks: Vec<EncodedChunk>) -> Result<()> {
        for chunk in chunks {
            for e in chunk.header.groups() {
                self.index.push(e.method as u8);
                self.index.extend_from_slice(&e.stored_len.to_le_bytes());
            }
            self.index.extend_from_slice(&chunk.checksum.to_le_bytes());
            self.out.write_all(&chunk.payload).map_err(io_error)?;
            self.written += chunk.payload.len() as u64;
        }
        Ok(())
    }

    fn covered_progress(&self, done_in_segment: u64, segment_len: u64, progress: &mut dyn FnMut(u64)) {
        progress(self.covered - segment_len + done_in_segment);
    }

    /// Writes the index and footer; returns the writer and the blake3 hash of the original.
    pub fn finish(mut self) -> Result<(W, blake3::Hash)> {
        if self.covered != self.original_len {
            return Err(Error::InvalidInput(format!(
                "segments cover {} bytes of a {}-byte file",
                self.covered, self.original_len
            )));
        }
        self.index[..4].copy_from_slice(&self.segments.to_le_bytes());
        let hash = self.hasher.finish()?;
        let mut footer = [0u8; FOOTER_LEN];
        footer[..8].copy_from_slice(&self.written.to_le_bytes());
        footer[8..16].copy_from_slice(&(self.index.len() as u64).to_le_bytes());
        footer[16..48].copy_from_slice(hash.as_bytes());
        let check = checksum(&self.header, &self.index, &footer[..48]);
        footer[48..56].copy_from_slice(&check);
        footer[56..64].copy_from_slice(&END_MAGIC);
        self.out.write_all(&self.index).map_err(io_error)?;
        self.out.write_all(&footer).map_err(io_error)?;
        self.out.flush().map_err(io_error)?;
        Ok((self.out, hash))
    }
}

fn io_error(source: std::io::Error) -> Error {
    Error::Io { action: "writing the container", source }
}

fn checksum(header: &[u8], index: &[u8], footer_head: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(index);
    h.update(footer_head);
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize().as_bytes()[..8]);
    out
}

/// One segment of the original file, as listed in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where the segment lies in the original file.
    pub range: Range<u64>,
    /// Element type (`None`: plain bytes).
    pub dtype: Option<Dtype>,
    /// Indices of its chunks in [`Container::chunk`] numbering.
    pub chunks: Range<usize>,
    /// A reference segment's source and how its bytes follow from the source's.
    pub link: Option<SegmentLink>,
}

/// Location of one chunk.
#[derive(Clone, Copy, Debug)]
struct ChunkSlot {
    segment: u32,
    original_offset: u64,
    original_len: u32,
    payload_offset: u64,
    index_offset: u32,
    /// A chunk of a copy segment: no payload, no index entries (its bytes are the source's).
    copy: bool,
}

/// A parsed container over its bytes (typically a memory map).
pub struct Container<'a> {
    bytes: &'a [u8],
    kind: FileKind,
    chunk_size: usize,
    original_len: u64,
    original_hash: blake3::Hash,
    index: &'a [u8],
    segments: Vec<Segment>,
    chunks: Vec<ChunkSlot>,
}

/// Whether `bytes` starts like a container.
pub fn is_container(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

impl<'a> Container<'a> {
    /// Parses and checks header, index and footer. Payload bytes are checked when decoded.
    pub fn open(bytes: &'a [u8]) -> Result<Container<'a>> {
        let corrupt = |what: &str| Error::Corrupt(what.to_string());
        let Frame { version, kind, chunk_size, original_len, index_offset, index, original_hash } = Frame::read(bytes)?;

        let segment_count = read_u32(index, 0).ok_or_else(|| corrupt("index too short"))? as usize;
        if segment_count > index.len() / SEGMENT_RECORD_LEN {
            return Err(corrupt("segment count exceeds the index"));
        }
        let mut segments = Vec::with_capacity(segment_count);
        let mut chunks = Vec::new();
        let mut at = 4usize;
        let mut original_offset = 0u64;
        let mut payload_offset = HEADER_LEN as u64;
        for s in 0..segment_count {
            let len = read_u64(index, at).ok_or_else(|| corrupt("index truncated in a segment record"))?;
            let code = *index.get(at + 8).ok_or_else(|| corrupt("index truncated"))?;
            at += SEGMENT_RECORD_LEN;
            let link = match code & links::LINK_FLAG {
                0 => None,
                _ => Some(links::parse(index, &mut at, s, version)?),
            };
            let dtype = match code & !links::LINK_FLAG {
                0 => None,
                c => Some(
                    Dtype::from_code(c)
                        .ok_or_else(|| Error::Corrupt(format!("segment {s}: unknown dtype code {c}")))?,
                ),
            };
            let width = Grouping::for_dtype(dtype).width;
            let end = original_offset
                .checked_add(len)
                .filter(|&e| e <= original_len)
                .ok_or_else(|| Error::Corrupt(format!("segment {s} extends past the original length")))?;
            if len % width as u64 != 0 {
                return Err(Error::Corrupt(format!("segment {s}: {len} bytes is not whole elements")));
            }
            if let Some(link) = link {
                links::check(link, s, &segments, len, dtype)?;
            }
            let copy = link.is_some_and(|l| l.conversion.is_none());
            let count = len.div_ceil(chunk_size as u64);
            if copy {
                // Copies have no index entries to bound their chunks: a few bytes of index must
                // not make a reader allocate without end (docs/format.md, "Reference segments").
                if chunks.len() as u64 + count > links::max_chunks(index.len()) {
                    return Err(Error::Corrupt(format!("segment {s}: copies cover more chunks than the index allows")));
                }
                let first = chunks.len();
                chunks.extend((0..count).map(|c| {
                    let chunk_start = original_offset + c * chunk_size as u64;
                    let original_len = (end - chunk_start).min(chunk_size as u64) as u32;
                    let segment = s as u32;
                    ChunkSlot {
                        segment,
                        original_offset: chunk_start,
                        original_len,
                        payload_offset,
                        index_offset: 0,
                        copy,
                    }
                }));
                segments.push(Segment { range: original_offset..end, dtype, chunks: first..chunks.len(), link });
                original_offset = end;
                continue;
            }
            count
                .checked_mul((width * ENTRY_LEN + CHECKSUM_LEN) as u64)
                .filter(|&n| n <= (index.len() - at) as u64)
                .ok_or_else(|| Error::Corrupt(format!("segment {s}: chunk entries exceed the index")))?;
            let first = chunks.len();
            for c in 0..count {
                let chunk_start = original_offset + c * chunk_size as u64;
                let chunk_len = (end - chunk_start).min(chunk_size as u64) as u32;
                let slot = ChunkSlot {
                    segment: s as u32,
                    original_offset: chunk_start,
                    original_len: chunk_len,
                    payload_offset,
                    index_offset: at as u32,
                    copy,
                };
                let header = parse_chunk_header(index, at, width)?;
                header
                    .validate(chunk_len as usize)
                    .map_err(|e| Error::Corrupt(format!("chunk {}: {e}", chunks.len())))?;
                payload_offset += header.stored_len();
                at += width * ENTRY_LEN + CHECKSUM_LEN;
                chunks.push(slot);
            }
            segments.push(Segment { range: original_offset..end, dtype, chunks: first..chunks.len(), link });
            original_offset = end;
        }
        if at != index.len() {
            return Err(corrupt("trailing bytes after the last index entry"));
        }
        if original_offset != original_len {
            return Err(Error::Corrupt(format!("segments cover {original_offset} of {original_len} bytes")));
        }
        if payload_offset != index_offset {
            return Err(corrupt("chunk sizes do not add up to the payload area"));
        }
        Ok(Container { bytes, kind, chunk_size, original_len, original_hash, index, segments, chunks })
    }

    /// Where the chunk index and footer of a container of `total` bytes lie (from the index's
    /// first byte to the end), read from its last [`FOOTER_LEN`] bytes `footer` alone: what a
    /// reader of a remote container fetches before any payload. [`Container::open`] checks
    /// them again, with their checksum, once they are in place.
    pub fn tail_range(footer: &[u8], total: u64) -> Result<Range<u64>> {
        let corrupt = |what: &str| Error::Corrupt(what.to_string());
        if footer.len() != FOOTER_LEN || footer[56..] != END_MAGIC {
            return Err(corrupt("truncated container (end marker missing)"));
        }
        let index_offset = read_u64(footer, 0).expect("in footer");
        let index_len = read_u64(footer, 8).expect("in footer");
        let end = total.checked_sub(FOOTER_LEN as u64).ok_or_else(|| corrupt("too short for a container"))?;
        if index_offset < HEADER_LEN as u64 || index_offset.checked_add(index_len) != Some(end) {
            return Err(corrupt("index position does not match the file length"));
        }
        Ok(index_offset..total)
    }

    /// Where the stored payloads of chunks `chunks` lie in the container's bytes (one run:
    /// chunks are stored in order); `None` for chunks past the end.
    pub fn payload_range(&self, chunks: Range<usize>) -> Option<Range<u64>> {
        if chunks.is_empty() {
            return Some(0..0);
        }
        let first = self.chunks.get(chunks.start)?;
        let last = self.chunks.get(chunks.end - 1)?;
        let (_, _, header) = self.chunk(chunks.end - 1);
        Some(first.payload_offset..last.payload_offset + header.stored_len())
    }

    /// What the original file was.
    pub fn kind(&self) -> FileKind {
        self.kind
    }
    /// Chunk size the container was written with.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }
    /// Length of the original file.
    pub fn original_len(&self) -> u64 {
        self.original_len
    }
    /// blake3 of the original file.
    pub fn original_hash(&self) -> blake3::Hash {
        self.original_hash
    }
    /// Total container size.
    pub fn stored_len(&self) -> u64 {
        self.bytes.len() as u64
    }
    /// Segments in file order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The segment, original byte range and header of chunk `i` (< [`Self::chunk_count`]).
    /// A chunk of a copy segment has no payload: its header lists every group as Zero with
    /// nothing stored (its bytes are its source's).
    pub fn chunk(&self, i: usize) -> (&Segment, Range<u64>, ChunkHeader) {
        let slot = self.chunks[i];
        let segment = &self.segments[slot.segment as usize];
        let width = Grouping::for_dtype(segment.dtype).width;
        let header = match slot.copy {
            true => ChunkHeader::new(&[GroupEntry { method: Method::Zero, stored_len: 0 }; 8][..width]),
            false => parse_chunk_header(self.index, slot.index_offset as usize, width),
        };
        let header = header.expect("validated in open");
        (segment, slot.original_offset..slot.original_offset + slot.original_len as u64, header)
    }

    /// Decodes chunk `i` into `out`, which must be exactly its original length.
    pub(crate) fn decode_chunk_into(&self, i: usize, out: &mut [u8]) -> Result<()> {
        self.decode_delta_chunk_into(i, None, out)
    }

    /// Decodes chunk `i` of a delta container, XORing with `reference` (the reference bytes of
    /// the same original range), into `out`.
    pub(crate) fn decode_delta_chunk_into(&self, i: usize, reference: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
        if let Some(link) = self.linked(i, reference.is_some())? {
            return self.decode_linked_chunk(i, link, out);
        }
        let (payload, segment, range, header) = self.checked_payload(i)?;
        if out.len() as u64 != range.end - range.start {
            return Err(Error::InvalidInput("output length differs from the chunk length".into()));
        }
        if reference.is_some_and(|r| r.len() != out.len()) {
            return Err(Error::InvalidInput("reference length differs from the chunk length".into()));
        }
        decode_chunk(payload, &header, Grouping::for_dtype(segment.dtype), reference, out)
            .map_err(|e| Error::Corrupt(format!("chunk {i} (original bytes {}..{}): {e}", range.start, range.end)))
    }

    /// Decodes chunk `i`'s byte groups (not regrouped) into `grouped`, or XORs them into it
    /// with `xor_into` (see [`super::chunk::decode_chunk_groups`]). The payload checksum is
    /// verified first.
    pub(crate) fn decode_chunk_groups_into(&self, i: usize, grouped: &mut [u8], xor_into: bool) -> Result<()> {
        self.linked(i, true)?;
        let (payload, segment, range, header) = self.checked_payload(i)?;
        if grouped.len() as u64 != range.end - range.start {
            return Err(Error::InvalidInput("output length differs from the chunk length".into()));
        }
        super::chunk::decode_chunk_groups(payload, &header, Grouping::for_dtype(segment.dtype), grouped, xor_into)
            .map_err(|e| Error::Corrupt(format!("chunk {i} (original bytes {}..{}): {e}", range.start, range.end)))
    }

    /// The stored bytes of chunk `i`'s Grid group (checksum verified), if it is a grid chunk.
    pub fn grid_payload(&self, i: usize) -> Result<Option<&'a [u8]>> {
        let (payload, _, _, header) = self.checked_payload(i)?;
        let Some(top) = header.groups().last().filter(|e| e.method == Method::Grid) else { return Ok(None) };
        Ok(Some(&payload[payload.len() - top.stored_len as usize..]))
    }

    /// Each byte group's entry and stored bytes of chunk `i` (checksum verified), for tests that
    /// look inside payloads.
    #[cfg(test)]
    pub(crate) fn chunk_groups(&self, i: usize) -> Result<Vec<(GroupEntry, &'a [u8])>> {
        let (mut rest, _, _, header) = self.checked_payload(i)?;
        Ok(header
            .groups()
            .iter()
            .map(|e| {
                let (stored, tail) = rest.split_at(e.stored_len as usize);
                rest = tail;
                (*e, stored)
            })
            .collect())
    }

    /// The payload of chunk `i` after its checksum matched, with its segment, range and header.
    fn checked_payload(&self, i: usize) -> Result<(&'a [u8], &Segment, Range<u64>, ChunkHeader)> {
        let slot = self.chunks.get(i).ok_or_else(|| Error::InvalidInput(format!("no chunk {i}")))?;
        let (segment, range, header) = self.chunk(i);
        let start = slot.payload_offset as usize;
        let payload = &self.bytes[start..start + header.stored_len() as usize];
        let width = header.groups().len();
        let recorded = read_u64(self.index, slot.index_offset as usize + width * ENTRY_LEN).expect("validated in open");
        if payload_checksum(payload) != recorded {
            return Err(Error::Corrupt(format!(
                "chunk {i} (original bytes {}..{}): payload checksum mismatch",
                range.start, range.end
            )));
        }
        Ok((payload, segment, range, header))
    }

    /// Decodes the original bytes in `range` into `out` (same length), decoding only the chunks
    /// that overlap it, in parallel. Not hash-verified: only a whole-file decode can be.
    pub fn decode_range(&self, range: Range<u64>, out: &mut [u8]) -> Result<()> {
        if range.start > range.end || range.end > self.original_len || out.len() as u64 != range.end - range.start {
            return Err(Error::InvalidInput(format!(
                "range {range:?} is outside the {}-byte original",
                self.original_len
            )));
        }
        let first = self.chunks.partition_point(|c| c.original_offset + c.original_len as u64 <= range.start);
        let last = self.chunks.partition_point(|c| c.original_offset < range.end);
        let work: Vec<(usize, &mut [u8])> = split_by_chunks(self, first..last, range.start, range.end, out);
        work.into_par_iter().try_for_each(|(i, dst)| {
            let (_, r, _) = self.chunk(i);
            if r.start >= range.start && r.end <= range.end {
                self.decode_chunk_into(i, dst)
            } else {
                let mut tmp = vec![0u8; (r.end - r.start) as usize];
                self.decode_chunk_into(i, &mut tmp)?;
                let from = range.start.max(r.start) - r.start;
                dst.copy_from_slice(&tmp[from as usize..from as usize + dst.len()]);
                Ok(())
            }
        })
    }

    /// Decodes the whole original into `out` in parallel batches, verifying its blake3 hash at
    /// the end. On a mismatch the error says so; the caller must discard what was written.
    pub fn decode_to<W: Write>(&self, out: &mut W) -> Result<blake3::Hash> {
        self.decode_to_with_reference(None, out)
    }

    fn check_original_hash(&self, hash: blake3::Hash) -> Result<blake3::Hash> {
        if hash != self.original_hash {
            return Err(Error::Corrupt(format!(
                "decoded bytes hash to {}, the container records {}",
                hash.to_hex(),
                self.original_hash.to_hex()
            )));
        }
        Ok(hash)
    }

    /// Decodes the whole original into `out` (exactly the original length) in parallel, straight
    /// into place, and verifies its blake3 hash. For callers that hold the output in memory.
    pub fn decode_into(&self, out: &mut [u8]) -> Result<blake3::Hash> {
        if out.len() as u64 != self.original_len {
            return Err(Error::InvalidInput("output length differs from the original length".into()));
        }
        // One parallel pass: each unit of chunks is decoded and then hashed by the same worker
        // while still in cache, as the blake3 subtrees inside it; the join hashes the 1 KiB
        // pieces across unit edges (`RangeHashes`, which says why).
        let hashes = RangeHashes::new(self.original_len);
        let units = super::runs_within(self.chunks.iter().map(|c| c.original_len as u64), DECODE_UNIT as u64);
        let mut work = Vec::with_capacity(units.len());
        let mut rest = &mut *out;
        for run in units {
            let start = self.chunks[run.start].original_offset;
            let last = self.chunks[run.end - 1];
            let end = last.original_offset + last.original_len as u64;
            let (region, tail) = std::mem::take(&mut rest).split_at_mut((end - start) as usize);
            rest = tail;
            work.push((run, start, region));
        }
        let nodes = work
            .into_par_iter()
            .map(|(run, start, region)| -> Result<Vec<NodeHash>> {
                let end = start + region.len() as u64;
                for (c, dst) in split_by_chunks(self, run, start, end, &mut *region) {
                    self.decode_chunk_into(c, dst)?;
                }
                let mut nodes = Vec::new();
                hashes.hash_range(start..end, region, &mut nodes);
                Ok(nodes)
            })
            .collect::<Result<Vec<_>>>()?;
        let hash =
            hashes.join(nodes.into_iter().flatten().collect(), Some(out)).expect("output has the original length");
        self.check_original_hash(hash)
    }

    /// [`Self::decode_to`] for a container written with [`ContainerWriter::segment_delta`]:
    /// `reference` is the whole reference (original length).
    pub fn decode_to_with_reference<W: Write>(&self, reference: Option<&[u8]>, out: &mut W) -> Result<blake3::Hash> {
        self.decode_to_reporting(reference, out, &mut |_| {})
    }

    /// [`Self::decode_to_with_reference`] that calls `progress` with the original bytes written
    /// so far after each batch.
    ///
    /// Batches of chunks are double-buffered: while the pool decodes batch k, each worker
    /// hashing the blake3 subtrees inside the chunks it decoded while they are in cache, this
    /// thread writes batch k-1 and joins its hashes ([`RangeHashJoin`]). (Decoding, then
    /// hashing, then writing each batch in turn left the pool idle during the write and forked
    /// twice per batch.)
    pub fn decode_to_reporting<W: Write>(
        &self,
        reference: Option<&[u8]>,
        out: &mut W,
        progress: &mut dyn FnMut(u64),
    ) -> Result<blake3::Hash> {
        if reference.is_some_and(|r| r.len() as u64 != self.original_len) {
            return Err(Error::InvalidInput("reference length differs from the original length".into()));
        }
        let lens = self.chunks.iter().map(|c| c.original_len as u64);
        let batches = super::runs_within(lens, decode_batch_len(self.chunk_size) as u64);
        let mut join = RangeHashJoin::new(self.original_len);
        let shape = join.shape();
        super::double_buffered(
            batches.len(),
            &mut [Vec::new(), Vec::new()],
            |k, buf| self.decode_batch(batches[k].clone(), reference, shape, buf),
            |k, decoded, nodes| {
                let mut at = 0;
                for (c, nodes) in batches[k].clone().zip(nodes) {
                    let slot = self.chunks[c];
                    let len = slot.original_len as usize;
                    join.add(slot.original_offset..slot.original_offset + len as u64, &decoded[at..at + len], nodes);
                    at += len;
                }
                out.write_all(decoded).map_err(|source| Error::Io { action: "writing the decoded bytes", source })?;
                progress(join.covered());
                Ok(())
            },
        )?;
        let hash = join.finish().ok_or_else(|| Error::Corrupt("the chunks do not cover the original".into()))?;
        self.check_original_hash(hash)
    }

    /// Decodes chunks `run` into `buf` (resized to their bytes), each XORed with its part of
    /// `reference` if given, and returns each chunk's blake3 subtree hashes.
    fn decode_batch(
        &self,
        run: Range<usize>,
        reference: Option<&[u8]>,
        shape: RangeHashes,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<Vec<NodeHash>>> {
        let start = self.chunks[run.start].original_offset;
        let last = self.chunks[run.end - 1];
        let end = last.original_offset + last.original_len as u64;
        buf.resize((end - start) as usize, 0);
        split_by_chunks(self, run, start, end, buf)
            .into_par_iter()
            .map(|(c, dst)| {
                let slot = self.chunks[c];
                let range = slot.original_offset..slot.original_offset + slot.original_len as u64;
                let r = reference.map(|r| &r[range.start as usize..range.end as usize]);
                self.decode_delta_chunk_into(c, r, dst)?;
                let mut nodes = Vec::new();
                shape.hash_range(range, dst, &mut nodes);
                Ok(nodes)
            })
            .collect()
    }
}

/// Splits `out` (original bytes `start..end`) into the parts of chunks `chunks`.
fn split_by_chunks<'o>(
    c: &Container<'_>,
    chunks: Range<usize>,
    start: u64,
    end: u64,
    out: &'o mut [u8],
) -> Vec<(usize, &'o mut [u8])> {
    let mut rest = out;
    let mut work = Vec::with_capacity(chunks.len());
    for i in chunks {
        let slot = c.chunks[i];
        let s = slot.original_offset.max(start);
        let e = (slot.original_offset + slot.original_len as u64).min(end);
        let (head, tail) = std::mem::take(&mut rest).split_at_mut((e - s) as usize);
        rest = tail;
        work.push((i, head));
    }
    work
}

fn parse_chunk_header(index: &[u8], at: usize, width: usize) -> Result<ChunkHeader> {
    let mut entries = [GroupEntry { method: Method::Zero, stored_len: 0 }; 8];
    for (g, e) in entries.iter_mut().take(width).enumerate() {
        let p = at + g * ENTRY_LEN;
        let tag = *index.get(p).ok_or_else(|| Error::Corrupt("index truncated in a chunk entry".into()))?;
        let stored_len =
            read_u32(index, p + 1).ok_or_else(|| Error::Corrupt("index truncated in a chunk entry".into()))?;
        *e = GroupEntry { method: Method::try_from(tag)?, stored_len };
    }
    ChunkHeader::new(&entries[..width])
}

mod frame;
mod input_hash;
mod le;
mod links;
pub use links::SegmentLink;

#[cfg(test)]
mod tests;
