//! Coding of one chunk (a run of whole elements, at most `Options::chunk_size` bytes), and of
//! a run of chunks in parallel.
//!
//! A chunk is split into byte groups ([`super::byte_group`]), each group is coded on its own with
//! the method [`super::select`] picks, and the group payloads are concatenated. The
//! [`ChunkHeader`] (method and stored length per group) is kept apart from the payload so that
//! containers can put all headers in one index, readable without touching the data.

use super::select::GroupStats;
use super::select::{predict_with_stats, Level, Options, Selection, MAX_CHUNK_SIZE};
use super::xor_delta::xor_in_place;
use super::{byte_group, huffman, paired, rans, sparse, zstd_block, Error, Grouping, Method, Result};
use rayon::prelude::*;
use std::cell::RefCell;

/// Method and stored size of one byte group of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    /// How the group is stored.
    pub method: Method,
    /// Stored bytes of the group in the chunk payload.
    pub stored_len: u32,
}

/// The per-group entries of one chunk; `width` of the 8 slots are used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    width: u8,
    entries: [GroupEntry; 8],
}

impl ChunkHeader {
    /// Builds a header from per-group entries (1, 2, 4 or 8 of them).
    pub fn new(entries: &[GroupEntry]) -> Result<ChunkHeader> {
        if !matches!(entries.len(), 1 | 2 | 4 | 8) {
            return Err(Error::InvalidInput(format!("{} byte groups", entries.len())));
        }
        let mut all = [GroupEntry { method: Method::Zero, stored_len: 0 }; 8];
        all[..entries.len()].copy_from_slice(entries);
        Ok(ChunkHeader { width: entries.len() as u8, entries: all })
    }

    /// The entry of each byte group, least significant byte first.
    pub fn groups(&self) -> &[GroupEntry] {
        &self.entries[..self.width as usize]
    }

    /// Total payload bytes of the chunk.
    pub fn stored_len(&self) -> u64 {
        self.groups().iter().map(|g| g.stored_len as u64).sum()
    }

    /// Checks the entries against the chunk's original length: raw groups store exactly the
    /// group, zero groups nothing, coded groups less than the group. Untrusted headers pass here
    /// before any payload is touched.
    pub fn validate(&self, chunk_len: usize) -> Result<()> {
        let width = self.width as usize;
        if !chunk_len.is_multiple_of(width) || chunk_len > MAX_CHUNK_SIZE {
            return Err(Error::Corrupt(format!("chunk of {chunk_len} bytes cannot hold {width}-byte elements")));
        }
        let group_len = chunk_len / width;
        for (g, e) in self.groups().iter().enumerate() {
            let ok = match e.method {
                Method::Raw => e.stored_len as usize == group_len,
                Method::Zero => e.stored_len == 0,
                Method::Huffman | Method::Zstd | Method::Sparse | Method::Rans | Method::Paired | Method::Remainder => {
                    (e.stored_len as usize) < group_len
                }
                // The whole chunk's structure, in the top group of a 2- or 4-byte chunk.
                Method::Grid | Method::Masked => g + 1 == width && width >= 2 && (e.stored_len as usize) < chunk_len,
                Method::Within => {
                    e.stored_len == 0
                        && g + 1 < width
                        && matches!(self.groups()[width - 1].method, Method::Grid | Method::Masked)
                }
            };
            if !ok {
                return Err(Error::Corrupt(format!(
                    "byte group {g}: {} method with {} stored bytes for a {group_len}-byte group",
                    e.method.name(),
                    e.stored_len
                )));
            }
            // A pair is a Paired group directly above a Remainder group, nothing else.
            let method_at = |j: usize| self.groups().get(j).map(|e| e.method);
            let paired_ok = match e.method {
                Method::Paired => g >= 1 && method_at(g - 1) == Some(Method::Remainder),
                Method::Remainder => method_at(g + 1) == Some(Method::Paired),
                _ => true,
            };
            if !paired_ok {
                return Err(Error::Corrupt(format!(
                    "byte group {g}: a {} group must {}",
                    e.method.name(),
                    if e.method == Method::Paired { "sit above a remainder group" } else { "sit below a paired group" }
                )));
            }
        }
        Ok(())
    }
}

/// Per-group countdown for skipping incompressible groups (see [`Options::skip_after_raw`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SkipState([u32; 8]);

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    super::with_thread_buffer(&SCRATCH, len, f)
}

fn code_group(group: &[u8], method: Method, options: &Options, out: &mut Vec<u8>) -> Result<Method> {
    code_group_counted(group, method, None, options, out)
}

/// [`code_group`] with the group's byte histogram when the caller has it.
fn code_group_counted(
    group: &[u8],
    method: Method,
    histogram: Option<&[u32; 256]>,
    options: &Options,
    out: &mut Vec<u8>,
) -> Result<Method> {
    let coded = match method {
        Method::Zero if group.iter().all(|&b| b == 0) => return Ok(Method::Zero),
        Method::Zero | Method::Raw => false,
        Method::Huffman => huffman::encode_counted(group, histogram, out)?,
        Method::Zstd => zstd_block::encode(group, options.zstd_level, out)?,
        // A group too dense for tokens to pay may still have long zero runs: plain zstd.
        Method::Sparse if sparse::encode(group, options.zstd_level, out)? => true,
        Method::Sparse => return code_group_counted(group, Method::Zstd, histogram, options, out),
        Method::Rans => rans::encode(group, rans::MAX_CONTEXTS, out)?,
        // Pairs are coded by `paired_trial`, two groups at a time; a group it leaves is raw.
        // Grids are coded whole chunks at a time (`grid`).
        Method::Paired | Method::Remainder | Method::Grid | Method::Within | Method::Masked => false,
    };
    if coded {
        return Ok(method);
    }
    out.extend_from_slice(group);
    Ok(Method::Raw)
}

/// Codes `group` with zstd, appending to `out`, and keeps it if it is no larger than the
/// Huffman `estimate` (bytes); else leaves `out` as it was and returns false. For the single
/// group of plain bytes (a safetensors JSON header, a manifest, a pickle) that method selection
/// gives to Huffman: order-0 Huffman cannot see their repeated strings, which zstd's matches do.
/// A 2 MB JSON header of 20,000 tensor entries took 1.26 MB with Huffman and 154 KB with zstd
/// level 1 per 256 KiB chunk (less than `zstd -3` gives it whole, 188 KB). Not for deltas,
/// whose groups the other methods already cover, nor for wider elements, whose byte groups are
/// not text; only for text ([`is_text`]); and only where Huffman is estimated to save a fifth or more: bytes it cannot
/// shrink that far (floats stored as plain bytes, 85-100%) rarely have repeats for zstd to
/// find, and would pay a second coding pass for nothing. zstd is tried first so that text is
/// coded once.
/// Whether a group with these statistics looks like text: under 1% of its bytes have the top
/// bit set. JSON and other ASCII text pass; numbers stored as bytes (int8 and fp8 weights, whose
/// negative values set the top bit) do not, so they keep their single Huffman pass (zstd on
/// them would only code the same literals with Huffman, more slowly).
fn is_text(stats: &super::select::GroupStats, n: usize) -> bool {
    let high: u64 = stats.histogram[128..].iter().map(|&c| u64::from(c)).sum();
    high * 100 < n as u64
}

fn zstd_beats_huffman(group: &[u8], estimate: f64, options: &Options, out: &mut Vec<u8>) -> Result<bool> {
    if estimate >= 0.8 * group.len() as f64 {
        return Ok(false);
    }
    let start = out.len();
    if zstd_block::encode(group, options.zstd_level, out)? && ((out.len() - start) as f64) <= estimate {
        return Ok(true);
    }
    out.truncate(start);
    Ok(false)
}

fn code_group_exhaustive(group: &[u8], options: &Options, out: &mut Vec<u8>) -> Result<Method> {
    if group.iter().all(|&b| b == 0) {
        return Ok(Method::Zero);
    }
    let start = out.len();
    let mut best = (Method::Raw, group.len());
    let mut trial = Vec::new();
    for method in [Method::Huffman, Method::Zstd, Method::Sparse, Method::Rans] {
        trial.clear();
        if code_group(group, method, options, &mut trial)? == method && trial.len() < best.1 {
            best = (method, trial.len());
            out.truncate(start);
            out.extend_from_slice(&trial);
        }
    }
    if best.0 == Method::Raw {
        out.truncate(start);
        out.extend_from_slice(group);
    }
    Ok(best.0)
}

thread_local! {
    /// A rANS payload being tried against the group's first coding.
    static TRIAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// After `group` was coded with `chosen` into `out[start..]`, tries rANS where it may win and
/// keeps it (replacing `out[start..]`) when it is smaller; returns whether it did.
///
/// At [`Level::Max`] every group that is not all zero is tried, with up to 16 contexts from the
/// previous byte or from one of `candidates` ([`context_candidates`]). At the
/// default level, rANS is only tried order-0 (cheap to build and fast to decode) and only where
/// the histogram predicts a clear win over what the group already costs: a group whose order-0
/// entropy plus table is under [`Options::rans_gain`] of the stored size. That is where Huffman's
/// one-bit floor or zstd's overhead on mostly-zero groups (late-training deltas) bites; on
/// ordinary exponent groups Huffman is within a few percent of the entropy and nothing is tried.
fn rans_trial(
    group: &[u8],
    chosen: Method,
    stats: Option<&super::select::GroupStats>,
    candidates: &[(rans::Source, &[u8])],
    options: &Options,
    start: usize,
    out: &mut Vec<u8>,
) -> Result<bool> {
    let stored = out.len() - start;
    let max_contexts = match (options.level, chosen) {
        (_, Method::Zero) => return Ok(false),
        (Level::Max, _) => rans::MAX_CONTEXTS,
        (Level::Default, Method::Raw) => return Ok(false),
        (Level::Default, _) => {
            let owned;
            let stats = match stats {
                Some(s) => s,
                None => {
                    owned = super::select::GroupStats::of(group);
                    &owned
                }
            };
            if rans::order0_estimate(stats) >= options.rans_gain * stored as f64 {
                return Ok(false);
            }
            0
        }
    };
    TRIAL.with(|cell| {
        let mut trial = cell.borrow_mut();
        trial.clear();
        if rans::encode_with_sources(group, max_contexts, candidates, &mut trial)? && trial.len() < stored {
            out.truncate(start);
            out.extend_from_slice(&trial);
            return Ok(true);
        }
        Ok(false)
    })
}

/// A source of XOR-delta reference bytes that holds them in grouped form. A stored delta chain
/// decodes to grouped form before it regroups (see [`decode_chunk_groups`]), and XOR commutes
/// with grouping, so the encoder XORs grouped bytes directly: the reference is never regrouped
/// only to be split again, and never sits whole in memory.
pub trait GroupedReference: Sync {
    /// Writes the grouped form ([`byte_group::split`]'s layout) of reference bytes
    /// `offset..offset + grouped.len()` into `grouped`. Called once per chunk, from any worker
    /// thread; `offset` is where the chunk starts in the segment being coded.
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> Result<()>;
}

/// What an XOR delta is taken against: bytes as long as the input, plain or grouped.
pub type Reference<'a> = Data<'a>;

thread_local! {
    /// A chunk's grouped reference while it is coded (kept apart from [`SCRATCH`], which holds
    /// the grouped input at the same time, and from [`GROUP_SCRATCH`], which a chain decoder
    /// filling the reference may use).
    static REFERENCE_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The bytes a chunk (or a run of chunks) codes, or XORs with ([`Reference`]).
#[derive(Clone, Copy)]
pub enum Data<'a> {
    /// Plain bytes.
    Bytes(&'a [u8]),
    /// `len` bytes of `source` from `offset` on, fetched chunk by chunk in grouped form: bytes
    /// that are already stored (a delta reference; a blob rewritten as a delta against another)
    /// are XORed or coded without being regrouped and split again, and never sit whole in
    /// memory.
    Grouped {
        /// Where the bytes come from.
        source: &'a dyn GroupedReference,
        /// Offset in `source` of the first byte.
        offset: usize,
        /// Number of bytes.
        len: usize,
    },
}

impl<'a> Data<'a> {
    /// Number of bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Bytes(b) => b.len(),
            Data::Grouped { len, .. } => *len,
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `range` of these.
    pub fn slice(self, range: std::ops::Range<usize>) -> Data<'a> {
        match self {
            Data::Bytes(b) => Data::Bytes(&b[range]),
            Data::Grouped { source, offset, len } => {
                assert!(range.start <= range.end && range.end <= len, "data range out of bounds");
                Data::Grouped { source, offset: offset + range.start, len: range.len() }
            }
        }
    }

    /// The plain bytes, if these are plain bytes.
    pub fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Data::Bytes(b) => Some(b),
            Data::Grouped { .. } => None,
        }
    }
}

/// Codes one chunk of plain or grouped [`Data`]: appends the payload to `out` and returns its
/// header. With `reference`, the chunk is coded as `input XOR reference` (an XOR delta; same
/// length required).
pub fn encode_chunk(
    input: Data<'_>,
    reference: Option<Reference<'_>>,
    grouping: Grouping,
    options: &Options,
    skip: &mut SkipState,
    out: &mut Vec<u8>,
) -> Result<ChunkHeader> {
    let len = input.len();
    if len > MAX_CHUNK_SIZE {
        return Err(Error::InvalidInput(format!("chunk of {len} bytes is over the limit")));
    }
    let width = grouping.width;
    let plain = reference.is_none();
    // At the max level a delta keeps its reference in grouped form beside the XOR: the
    // reference's bytes are rANS context sources.
    let keep_reference = options.level == Level::Max && reference.is_some();
    with_scratch(len, |grouped| {
        let grouped_reference = match (input, reference) {
            (Data::Bytes(bytes), Some(Reference::Bytes(r))) if !keep_reference => {
                byte_group::split(bytes, Some(r), grouping, grouped)?;
                None
            }
            (Data::Bytes(bytes), r) => {
                byte_group::split(bytes, None, grouping, grouped)?;
                r
            }
            (Data::Grouped { .. }, Some(Reference::Bytes(_))) => {
                return Err(Error::InvalidInput("grouped data takes a grouped reference".into()));
            }
            (Data::Grouped { source, offset, .. }, r) => {
                if !len.is_multiple_of(width) {
                    return Err(Error::InvalidInput(format!(
                        "chunk of {len} bytes is not a whole number of {width}-byte elements"
                    )));
                }
                source.grouped(offset, grouped)?;
                r
            }
        };
        let reference_len = if grouped_reference.is_some() { len } else { 0 };
        super::with_thread_buffer(&REFERENCE_SCRATCH, reference_len, |reference_groups| {
            match grouped_reference {
                Some(Reference::Grouped { source, offset, .. }) => source.grouped(offset, reference_groups)?,
                Some(Reference::Bytes(r)) => byte_group::split(r, None, grouping, reference_groups)?,
                None => {}
            }
            if grouped_reference.is_some() {
                xor_in_place(grouped, reference_groups);
            }
            let reference_groups = keep_reference.then_some(&*reference_groups);
            encode_groups(grouped, reference_groups, plain, grouping, options, skip, out)
        })
    })
}

/// Codes the byte groups of one chunk (`grouped`, already XORed with the reference for a delta;
/// `reference_groups`: the reference's groups, kept at the max level as context sources).
fn encode_groups(
    grouped: &[u8],
    reference_groups: Option<&[u8]>,
    plain: bool,
    grouping: Grouping,
    options: &Options,
    skip: &mut SkipState,
    out: &mut Vec<u8>,
) -> Result<ChunkHeader> {
    let width = grouping.width;
    let n = grouped.len() / width;
    let mut entries = [GroupEntry { method: Method::Zero, stored_len: 0 }; 8];
    let mut predictions: [Option<(Method, Option<GroupStats>)>; 8] = Default::default();
    let paired_k = match grouping.extract_exponent {
        true => paired_trial(grouped, width, options, skip, &mut predictions)?,
        false => None,
    };
    for g in 0..width {
        let group = &grouped[g * n..(g + 1) * n];
        let start = out.len();
        if let Some(k) = paired_k.filter(|_| g + 2 >= width) {
            let method = if g + 2 == width {
                paired::pack_remainders(group, k, out);
                Method::Remainder
            } else {
                PAIRED_UPPER.with(|bytes| out.extend_from_slice(&bytes.borrow()));
                Method::Paired
            };
            let stored_len = u32::try_from(out.len() - start).expect("chunk groups are below 4 GiB");
            entries[g] = GroupEntry { method, stored_len };
            continue;
        }
        let method = match options.selection {
            Selection::Exhaustive => code_group_exhaustive(group, options, out)?,
            Selection::Only(m) => code_group(group, m, options, out)?,
            // The max level looks at every group: one that rANS cannot shrink in this chunk may
            // shrink in the next with its context.
            Selection::Auto if skip.0[g] > 0 && options.level == Level::Default => {
                skip.0[g] -= 1;
                code_group(group, Method::Raw, options, out)?
            }
            Selection::Auto => {
                let (predicted, stats) = predictions[g].take().unwrap_or_else(|| predict_with_stats(group, options));
                let histogram = stats.as_ref().map(|s| &s.histogram);
                let text_like = width == 1 && plain && predicted == Method::Huffman;
                let chosen = match stats.as_ref().filter(|s| text_like && is_text(s, group.len())) {
                    Some(stats) if zstd_beats_huffman(group, stats.huffman_estimate(), options, out)? => Method::Zstd,
                    _ => code_group_counted(group, predicted, histogram, options, out)?,
                };
                let candidates = match options.level {
                    Level::Max => context_candidates(grouped, reference_groups, width, g),
                    Level::Default => Vec::new(),
                };
                let chosen = match rans_trial(group, chosen, stats.as_ref(), &candidates, options, start, out)? {
                    true => Method::Rans,
                    false => chosen,
                };
                if chosen == Method::Raw {
                    skip.0[g] = options.skip_after_raw;
                }
                chosen
            }
        };
        let stored_len = u32::try_from(out.len() - start).expect("chunk groups are below 4 GiB");
        entries[g] = GroupEntry { method, stored_len };
    }
    ChunkHeader::new(&entries[..width])
}

thread_local! {
    /// The element symbols of a pair being tried, and the Paired payload of a pair being coded
    /// (the Remainder payload is written straight into the chunk's payload).
    static PAIRED_SYMBOLS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static PAIRED_UPPER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Fewest elements in a chunk for which a pair is tried: its head (33 bytes) and a second code
/// table must pay for themselves.
const PAIRED_MIN_ELEMENTS: usize = 1024;

/// A pair is kept when its estimate is under this fraction of the two groups' estimates apart.
/// The gain on float weights is small in relative terms (about 0.6% of the two groups), and both
/// sides are estimated the same way, so the margin only keeps out ties.
const PAIRED_GAIN: f64 = 0.999;

/// Whether the top two groups of a float chunk (the exponent, and the sign with the top mantissa
/// bits) are coded as a pair ([`paired`]): if so, its `k`, with the Paired payload in
/// [`PAIRED_UPPER`]. At the default level with automatic selection, for 2-byte floats, tried
/// when the exponent group would be Huffman-coded and the group below stored raw or Huffman-coded (a standalone
/// float tensor; not a delta, whose groups are mostly zero), and kept when estimated smaller.
/// `Selection::Only(Method::Paired)` pairs whenever the groups allow it. The statistics taken
/// are left in `predictions` for the groups' own coding when no pair is made. Like a raw group,
/// a raw lower group is not looked at again for [`Options::skip_after_raw`] chunks.
fn paired_trial(
    grouped: &[u8],
    width: usize,
    options: &Options,
    skip: &mut SkipState,
    predictions: &mut [Option<(Method, Option<GroupStats>)>; 8],
) -> Result<Option<u32>> {
    let n = grouped.len() / width;
    let forced = options.selection == Selection::Only(Method::Paired);
    let auto = options.selection == Selection::Auto && options.level == Level::Default;
    // The default level pairs 2-byte floats only: there the pair is the whole element and
    // decodes straight into it (`paired::decode_elements`). An f32's pair saved 0.2 pp of the
    // file on the corpus but decoded 12% slower (a pass over two of its four groups before
    // regrouping), against the default level's speed target; `Only(Paired)` still pairs any
    // width.
    let auto = auto && width == 2;
    if width < 2 || !(forced || auto) || n < PAIRED_MIN_ELEMENTS || (auto && skip.0[width - 1] > 0) {
        return Ok(None);
    }
    let (upper_g, lower_g) = (width - 1, width - 2);
    let upper = &grouped[upper_g * n..(upper_g + 1) * n];
    let lower = &grouped[lower_g * n..(lower_g + 1) * n];
    // The usual case, a weight tensor's exponents within 64 values: the plan from the group's
    // extremes (one vectorised pass), and its histogram from the symbols' (which the Huffman
    // coder needs anyway), instead of a histogram of its own: a third of a pair's extra cost.
    // Not for a group that looks mostly zero (a delta's), which `predict_with_stats` settles
    // from a sample without any histogram.
    let range_plan = match auto && !super::select::sample_is_half_zero(upper) {
        true => {
            let (low, high) = upper.iter().fold((u8::MAX, 0u8), |(low, high), &b| (low.min(b), high.max(b)));
            (low <= high && high - low < 64).then(|| paired::Plan::for_range(low, high)).flatten()
        }
        false => None,
    };
    let coded = super::with_thread_buffer(&PAIRED_SYMBOLS, n, |symbols| -> Result<Option<u32>> {
        let (plan, symbol_stats, upper_stats) = match range_plan {
            Some(plan) => {
                let symbol_stats = plan.symbols(upper, lower, symbols);
                let histogram = plan.upper_histogram(&symbol_stats.histogram);
                let (method, stats) =
                    super::select::predict_from_stats(upper, GroupStats { len: n, histogram }, options);
                predictions[upper_g] = Some((method, stats));
                (plan, Some(symbol_stats), None)
            }
            None => {
                let upper_stats = if forced {
                    GroupStats::of(upper)
                } else {
                    let (method, stats) = predict_with_stats(upper, options);
                    predictions[upper_g] = Some((method, stats));
                    match &predictions[upper_g] {
                        Some((Method::Huffman, Some(stats))) => stats.clone(),
                        _ => return Ok(None),
                    }
                };
                let Some(plan) = paired::Plan::for_histogram(&upper_stats.histogram) else {
                    return Ok(None);
                };
                (plan, None, Some(upper_stats))
            }
        };
        // With k = 1 (65 to 128 upper values: f16 exponents with their top mantissa bits)
        // pairs saved nothing on the corpus; trying them cost a fifth of coding an f16 file.
        if auto && plan.k() < 2 {
            return Ok(None);
        }
        let apart = if forced {
            f64::INFINITY
        } else {
            let upper_estimate = match (&predictions[upper_g], &upper_stats) {
                (Some((Method::Huffman, Some(stats))), _) => stats.huffman_estimate(),
                _ => return Ok(None),
            };
            let lower_cost = if skip.0[lower_g] > 0 {
                n as f64
            } else {
                let (method, stats) = predict_with_stats(lower, options);
                let cost = match (method, &stats) {
                    (Method::Raw, _) => n as f64,
                    (Method::Huffman, Some(stats)) => stats.huffman_estimate(),
                    _ => f64::NAN,
                };
                predictions[lower_g] = Some((method, stats));
                if cost.is_nan() {
                    return Ok(None);
                }
                cost
            };
            upper_estimate + lower_cost
        };
        let symbol_stats = match symbol_stats {
            Some(stats) => stats,
            None => plan.symbols(upper, lower, symbols),
        };
        if paired::estimate(&symbol_stats, plan.k()) >= PAIRED_GAIN * apart {
            return Ok(None);
        }
        let coded = PAIRED_UPPER.with(|up| {
            let mut up = up.borrow_mut();
            up.clear();
            paired::encode_upper(&plan, symbols, Some(&symbol_stats.histogram), &mut up)
        })?;
        Ok(coded.then_some(plan.k()))
    })?;
    let Some(k) = coded else {
        return Ok(None);
    };
    // The lower group is not coded on its own this time: a skip it used counts down here, and
    // a lower group that looked raw is taken as raw for the next chunks' estimates.
    if skip.0[lower_g] > 0 {
        skip.0[lower_g] -= 1;
    } else if matches!(predictions[lower_g], Some((Method::Raw, _))) {
        skip.0[lower_g] = options.skip_after_raw;
    }
    Ok(Some(k))
}

/// The context sources the max level tries for group `g` of a chunk of `width`-byte elements:
/// the same element's bytes in every group above `g` (they decode before it: groups decode from
/// the top down), and for a delta the reference's byte in every group. On the corpus
/// (benches/context_entropy.py) the sign-and-top-mantissa byte is best predicted by the
/// exponent, an f32's lowest mantissa byte by the top bits of its top mantissa byte, and in an
/// fp32 delta the XOR of the lowest mantissa byte by the top bits of the reference's top
/// mantissa byte, that of the top mantissa byte by the reference's exponent.
fn context_candidates<'a>(
    grouped: &'a [u8],
    reference_groups: Option<&'a [u8]>,
    width: usize,
    g: usize,
) -> Vec<(rans::Source, &'a [u8])> {
    let n = grouped.len() / width;
    let group = |bytes: &'a [u8], j: usize| &bytes[j * n..(j + 1) * n];
    let mut candidates: Vec<(rans::Source, &[u8])> =
        (g + 1..width).map(|j| (rans::Source::Group(j as u8), group(grouped, j))).collect();
    if let Some(r) = reference_groups {
        for j in 0..width {
            candidates.push((rans::Source::Reference(j as u8), group(r, j)));
        }
    }
    candidates
}

/// Checks an untrusted header against the element grouping, the chunk's original length and the
/// payload length before any payload byte is touched.
fn check_chunk(payload: &[u8], header: &ChunkHeader, grouping: Grouping, chunk_len: usize) -> Result<()> {
    if header.groups().len() != grouping.width {
        return Err(Error::Corrupt(format!(
            "chunk has {} byte groups, its element type has {}",
            header.groups().len(),
            grouping.width
        )));
    }
    header.validate(chunk_len)?;
    if header.stored_len() != payload.len() as u64 {
        return Err(Error::Corrupt(format!(
            "chunk payload is {} bytes, its header says {}",
            payload.len(),
            header.stored_len()
        )));
    }
    Ok(())
}

/// Decodes one chunk from its `payload` and `header` into `out` (the chunk's original length),
/// XORing with `reference` when the chunk is a delta.
pub fn decode_chunk(
    payload: &[u8],
    header: &ChunkHeader,
    grouping: Grouping,
    reference: Option<&[u8]>,
    out: &mut [u8],
) -> Result<()> {
    check_chunk(payload, header, grouping, out.len())?;
    let n = out.len() / grouping.width;
    if n == 0 {
        return Ok(());
    }
    let stored = stored_groups(payload, header);
    if let Some(top) = structured_group(header) {
        decode_structured(header.groups()[top].method, stored[top], grouping, out)?;
        if let Some(r) = reference {
            xor_in_place(out, r);
        }
        return Ok(());
    }
    // A 2-byte float chunk stored as one pair decodes straight into its elements.
    let methods = header.groups().iter().map(|e| e.method);
    if reference.is_none() && grouping.extract_exponent && methods.eq([Method::Remainder, Method::Paired]) {
        return with_scratch(out.len(), |scratch| paired::decode_elements(stored[1], stored[0], scratch, out));
    }
    // A group whose rANS contexts are the reference's bytes needs the reference grouped.
    let reference_sourced = stored
        .iter()
        .zip(header.groups())
        .any(|(s, e)| e.method == Method::Rans && matches!(rans::payload_source(s), Some(rans::Source::Reference(_))));
    let reference_len = if reference_sourced && reference.is_some() { out.len() } else { 0 };
    super::with_thread_buffer(&DECODE_REFERENCE, reference_len, |reference_groups| {
        let reference_groups = match reference {
            Some(r) if reference_sourced => {
                byte_group::split(r, None, grouping, reference_groups)?;
                Some(&*reference_groups)
            }
            _ => None,
        };
        with_scratch(out.len(), |scratch| {
            let views = decode_top_down(&stored, header, scratch, reference_groups, false)?;
            byte_group::regroup(&views[..grouping.width], reference, grouping, out)
        })
    })
}

/// The stored bytes of each group of a checked chunk.
fn stored_groups<'a>(payload: &'a [u8], header: &ChunkHeader) -> [&'a [u8]; 8] {
    let mut stored: [&[u8]; 8] = [&[]; 8];
    let mut rest = payload;
    for (slot, e) in stored.iter_mut().zip(header.groups()) {
        let (s, tail) = rest.split_at(e.stored_len as usize);
        *slot = s;
        rest = tail;
    }
    stored
}

/// Decodes a chunk's groups from the top group down (a group's context source is a group above
/// it, or the reference's `reference_groups`), each into its slice of `bufs`, and returns each
/// group's bytes: a raw group's are its stored bytes, not copied, unless `copy_raw` (the caller
/// needs every group in `bufs`).
fn decode_top_down<'v>(
    stored: &[&'v [u8]; 8],
    header: &ChunkHeader,
    bufs: &'v mut [u8],
    reference_groups: Option<&[u8]>,
    copy_raw: bool,
) -> Result<[&'v [u8]; 8]> {
    let n = bufs.len() / header.groups().len();
    let mut free: Vec<&mut [u8]> = bufs.chunks_exact_mut(n).collect();
    let mut views: [&[u8]; 8] = [&[]; 8];
    let mut g = header.groups().len();
    while g > 0 {
        g -= 1;
        let e = header.groups()[g];
        let buf = free.pop().expect("one buffer per group");
        if e.method == Method::Paired {
            // A checked header has the Remainder group right below.
            let lower = free.pop().expect("a remainder group below a paired group");
            paired::decode(stored[g], stored[g - 1], buf, lower)?;
            views[g] = buf;
            views[g - 1] = lower;
            g -= 1;
            continue;
        }
        if e.method == Method::Raw && !copy_raw {
            views[g] = stored[g];
            continue;
        }
        decode_group_with(e.method, stored[g], buf, &context_sources(&views, reference_groups, n, g))?;
        views[g] = buf;
    }
    Ok(views)
}

/// What a group `g`'s rANS contexts may come from: the groups above it (decoded, in `views`)
/// and the reference's groups.
fn context_sources<'a>(
    views: &[&'a [u8]; 8],
    reference_groups: Option<&'a [u8]>,
    n: usize,
    g: usize,
) -> rans::Sources<'a> {
    let mut sources = rans::Sources::default();
    for (j, v) in views.iter().enumerate().skip(g + 1) {
        if v.len() == n {
            sources.groups[j] = Some(v);
        }
    }
    if let Some(r) = reference_groups {
        for (j, slot) in sources.reference.iter_mut().enumerate().take(r.len() / n) {
            *slot = Some(&r[j * n..(j + 1) * n]);
        }
    }
    sources
}

/// Decodes one group that is not raw into `out`.
fn decode_group_with(method: Method, stored: &[u8], out: &mut [u8], sources: &rans::Sources<'_>) -> Result<()> {
    match method {
        Method::Raw => {
            out.copy_from_slice(stored);
            Ok(())
        }
        Method::Zero => {
            out.fill(0);
            Ok(())
        }
        Method::Huffman => huffman::decode(stored, out),
        Method::Zstd => zstd_block::decode(stored, out),
        Method::Sparse => sparse::decode(stored, out, false),
        Method::Rans => rans::decode_with_sources(stored, out, sources),
        Method::Paired | Method::Remainder | Method::Grid | Method::Within | Method::Masked => Err(unpaired(method)),
    }
}

thread_local! {
    /// The reference of a chunk being decoded, grouped, when a group's contexts come from it.
    static DECODE_REFERENCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Decodes one chunk's byte groups (not yet regrouped) into `grouped`: `width` groups of
/// `grouped.len() / width` bytes, in [`byte_group`] layout. With `xor_into`, each decoded group
/// is XORed into what `grouped` already holds instead of overwriting it.
///
/// Rotation and grouping are bit permutations, so they commute with XOR: for a delta chain
/// (base, d1, .., dk) of one tensor, XORing the grouped chunks of every member gives the grouped
/// chunk of the target, which then needs a single [`byte_group::regroup`] instead of one per
/// chain member.
pub fn decode_chunk_groups(
    payload: &[u8],
    header: &ChunkHeader,
    grouping: Grouping,
    grouped: &mut [u8],
    xor_into: bool,
) -> Result<()> {
    check_chunk(payload, header, grouping, grouped.len())?;
    let n = grouped.len() / grouping.width;
    if n == 0 {
        return Ok(());
    }
    let stored = stored_groups(payload, header);
    if let Some(top) = structured_group(header) {
        return with_group_scratch(grouped.len(), |elements| {
            structured::decode_groups(header.groups()[top].method, stored[top], grouping, elements, grouped, xor_into)
        });
    }
    // Groups that depend on others decode from the top down: rANS groups with a context source,
    // and pairs.
    let sourced = stored
        .iter()
        .zip(header.groups())
        .any(|(s, e)| (e.method == Method::Rans && rans::payload_source(s).is_some()) || e.method == Method::Paired);
    if sourced {
        return decode_sourced_groups(&stored, header, grouped, xor_into);
    }
    for ((e, stored), group) in header.groups().iter().zip(stored).zip(grouped.chunks_exact_mut(n)) {
        match (e.method, xor_into) {
            (Method::Zero, true) => {}
            (Method::Zero, false) => group.fill(0),
            (Method::Raw, false) => group.copy_from_slice(stored),
            (Method::Raw, true) => xor_in_place(group, stored),
            (Method::Huffman | Method::Zstd | Method::Rans, false) => decode_group(e.method, stored, group)?,
            // Tokens touch only the bytes that change: no scratch, no full-group XOR.
            (Method::Sparse, xor_into) => sparse::decode(stored, group, xor_into)?,
            (Method::Huffman | Method::Zstd | Method::Rans, true) => with_group_scratch(n, |tmp| {
                decode_group(e.method, stored, tmp)?;
                xor_in_place(group, tmp);
                Ok(())
            })?,
            // A checked header has no Remainder without a Paired group, which took the path above.
            (Method::Paired | Method::Remainder | Method::Grid | Method::Within | Method::Masked, _) => {
                return Err(unpaired(e.method))
            }
        }
    }
    Ok(())
}

/// [`decode_chunk_groups`] for a chunk with rANS groups whose contexts come from other groups or
/// from the reference: groups decode from the top down, each with the groups above it and (with
/// `xor_into`, a delta) the reference, which `grouped` holds until every group is decoded.
fn decode_sourced_groups(stored: &[&[u8]; 8], header: &ChunkHeader, grouped: &mut [u8], xor_into: bool) -> Result<()> {
    let n = grouped.len() / header.groups().len();
    if !xor_into {
        decode_top_down(stored, header, grouped, None, true)?;
        return Ok(());
    }
    with_group_scratch(grouped.len(), |tmp| {
        let views = decode_top_down(stored, header, tmp, Some(&*grouped), false)?;
        for ((e, view), group) in header.groups().iter().zip(views).zip(grouped.chunks_exact_mut(n)) {
            if e.method != Method::Zero {
                xor_in_place(group, view);
            }
        }
        Ok(())
    })
}

fn decode_group(method: Method, stored: &[u8], out: &mut [u8]) -> Result<()> {
    match method {
        Method::Huffman => huffman::decode(stored, out),
        Method::Zstd => zstd_block::decode(stored, out),
        Method::Rans => rans::decode(stored, out),
        Method::Raw | Method::Zero | Method::Sparse => unreachable!("only Huffman, zstd and rANS groups come here"),
        Method::Paired | Method::Remainder | Method::Grid | Method::Within | Method::Masked => Err(unpaired(method)),
    }
}

/// A paired or remainder group met alone, or a grid group met as a group: [`ChunkHeader::validate`]
/// refuses such headers, and whole grid chunks are decoded before groups are, so this is only a
/// second line of defence.
fn unpaired(method: Method) -> Error {
    Error::Corrupt(format!("a {} group outside its structure", method.name()))
}

thread_local! {
    static GROUP_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_group_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    super::with_thread_buffer(&GROUP_SCRATCH, len, f)
}

/// One coded chunk: header plus payload.
#[derive(Clone, Debug)]
pub struct EncodedChunk {
    /// Methods and sizes per byte group.
    pub header: ChunkHeader,
    /// The group payloads, concatenated.
    pub payload: Vec<u8>,
    /// xxh3-64 of `payload` ([`payload_checksum`]).
    pub checksum: u64,
}

/// The checksum containers keep per chunk payload: xxh3-64.
pub fn payload_checksum(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// Chunks coded sequentially by one worker, sharing skip state. Fixed, so output does not
/// depend on the number of threads.
pub const STRIPE_CHUNKS: usize = 8;

/// Codes `input` (optionally as a delta against `reference`) as consecutive chunks of
/// `options.chunk_size`, in parallel on the current rayon pool. Stripes of [`STRIPE_CHUNKS`]
/// chunks start at multiples of `STRIPE_CHUNKS * chunk_size` from the start of `input`, so a
/// caller that feeds a long tensor in batches should cut batches at such multiples.
pub fn encode_chunks(
    input: Data<'_>,
    reference: Option<Reference<'_>>,
    grouping: Grouping,
    options: &Options,
) -> Result<Vec<EncodedChunk>> {
    encode_chunks_gridded(input, reference, grouping, options, None, false)
}

/// [`encode_chunks`] with structures ([`structured::encode`]); `grid`: a tensor's grid and the
/// index in that tensor of `input`'s first element; `mask`: try masks on mostly-zero chunks.
pub(crate) fn encode_chunks_gridded(
    input: Data<'_>,
    reference: Option<Reference<'_>>,
    grouping: Grouping,
    options: &Options,
    grid: Option<(&super::grid::TensorGrid, u64)>,
    mask: bool,
) -> Result<Vec<EncodedChunk>> {
    let len = input.len();
    if reference.is_some_and(|r| r.len() != len) {
        return Err(Error::InvalidInput("reference and input lengths differ".into()));
    }
    let chunk_size = checked_chunk_size(options)?;
    let stripe = chunk_size * STRIPE_CHUNKS;
    let stripes: Vec<Vec<EncodedChunk>> = (0..len)
        .into_par_iter()
        .step_by(stripe)
        .map(|base| {
            let mut skip = SkipState::default();
            (base..(base + stripe).min(len))
                .step_by(chunk_size)
                .map(|at| {
                    let chunk = input.slice(at..(at + chunk_size).min(len));
                    let r = reference.map(|r| r.slice(at..at + chunk.len()));
                    let mut payload = Vec::with_capacity(payload_capacity(chunk.len()));
                    let grid = grid.map(|(g, first)| (g, first + (at / grouping.width) as u64));
                    let header =
                        structured::encode((grid, mask), chunk, r, grouping, options, &mut skip, &mut payload)?;
                    let checksum = payload_checksum(&payload);
                    Ok(EncodedChunk { header, payload, checksum })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(stripes.into_iter().flatten().collect())
}

/// Capacity that holds a chunk's payload while it is coded without reallocating: the payload
/// never exceeds the chunk, but the coders ask for a little more room than they end up using
/// (huff0 its compress bound per 128 KiB block, about 1/256 more plus a table). Growing the
/// vector instead cost a copy of the payload so far per group (2.5% of a delta commit in perf).
fn payload_capacity(chunk_len: usize) -> usize {
    chunk_len + chunk_len / 128 + 4096
}

/// Whether `c` is a chunk size the format allows: a power of two from 4 KiB to 4 MiB. Powers of
/// two keep every run of a blob's chunks on blake3's 1 KiB grid, so the subtree hashes of the
/// runs that checkout's workers take join into the blob's hash without its bytes
/// ([`crate::object_id::RangeHashes`]).
pub fn is_valid_chunk_size(c: usize) -> bool {
    (super::select::MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&c) && c.is_power_of_two()
}

/// Validates `options.chunk_size` and returns it. (A valid size is a power of two of at least
/// 4 KiB, so a whole number of elements of every width.)
pub(crate) fn checked_chunk_size(options: &Options) -> Result<usize> {
    let c = options.chunk_size;
    if !is_valid_chunk_size(c) {
        return Err(Error::InvalidInput(format!("chunk size {c} is not a power of two between 4 KiB and 4 MiB")));
    }
    Ok(c)
}

mod structured;
use structured::{decode_structured, structured_group};

#[cfg(test)]
mod tests;
