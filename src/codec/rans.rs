//! [`Method::Rans`](super::Method::Rans): a static-model rANS coder with an optional context,
//! for the two things Huffman cannot do (docs/format.md, "rANS payload"):
//! - code a byte in less than one bit: the mostly-zero groups of late-training XOR deltas cost
//!   their order-0 entropy (a zero at 99% costs 0.015 bits, not Huffman's 1 bit);
//! - use context: a byte is coded with the frequency table of its context, which gets below the
//!   order-0 entropy that bounds Huffman.
//!
//! The context comes from one **source** per group, recorded in the payload ([`Source`]): the
//! previous byte of the group (format 4's only source: the previous weight's exponent predicts
//! this one's), the same element's byte in a group decoded before this one (format 5: the sign
//! and top mantissa bits of a float are skewed given its exponent, a Gaussian's density falling
//! across each binade), or, in a delta, the reference element's byte (format 5: how many
//! mantissa bits an update flips depends on the weight's magnitude). benches/context_entropy.py
//! measures each on the corpus.
//!
//! Model: the group's alphabet (the byte values present) and `K + 1` frequency tables over it,
//! each quantized to a total of 4096 (12 bits). Context 0 is the default; contexts 1..=K belong
//! to K source byte values chosen by the encoder (the most frequent), or (format 5) the context
//! is the source byte's top four bits (16 contexts). `K = 0` is plain order-0 coding. Tables
//! cost bytes, and for a 128 KiB group a full 256-context model would eat its gain, so the
//! encoder picks `K` from the measured counts, table costs included; and (format 5) a table may
//! be binned: one frequency per run of 16 byte values, each value of the run coded at that
//! frequency. A sign-and-mantissa byte given its exponent is the case: its 256 values are all
//! present, nearly flat within a run of 16, so a full table per context costs more than the
//! context gains, and a binned one (16 entries) keeps most of the gain. The max level also
//! bit-packs alphabet and tables (Exp-Golomb codes) where that is smaller than format 4's
//! bitmap and varints.
//!
//! The group is coded as four lanes (quarters of the group; with the previous byte as the
//! source, each starts in the context of 0) with their own rANS state, decoded in lockstep: one
//! lane's next symbol depends on its previous one (state, and context with the previous byte as
//! the source), so interleaving four independent lanes lets the CPU overlap them.
//!
//! Why not a crate: `constriction` 0.5 (checked with `cargo info`) has rANS stack coders over
//! categorical models, but neither a compact table serialization nor a context switch per
//! symbol without building a model object per context, and its decoder's behaviour on corrupt
//! input is not documented as panic-free. The coder below is the textbook rANS of Duda
//! ("Asymmetric numeral systems", 2013) in the 32-bit state / 16-bit word form of ryg_rans,
//! with table-driven decoding; it is fuzzed (fuzz/fuzz_targets/rans_decode.rs).

use super::{Error, Result};
use std::cell::RefCell;

mod decode;

pub use decode::{decode, decode_with_sources};

/// Bits of the frequency total: tables sum to 4096.
pub(crate) const SCALE_BITS: u32 = 12;
const TOTAL: u32 = 1 << SCALE_BITS;
/// Decoding slots of the largest model (16 tables of 4096): the decoder keeps them this size,
/// so a slot index masked to it needs no bounds check in the decoding loop.
const SLOT_COUNT: usize = (MAX_CONTEXTS + 1) << SCALE_BITS;
/// Lower bound of the normalized state interval `[L, L << 16)`.
const L: u32 = 1 << 16;
/// Lanes per group.
pub(crate) const LANES: usize = 4;
/// Most dedicated contexts a payload may have (so at most 16 tables).
pub const MAX_CONTEXTS: usize = 15;
/// Context counts the encoder tries (the default level only 0; the max level all of them).
const CONTEXT_CHOICES: [usize; 11] = [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 15];
/// Flag of the payload's first byte (whose low 4 bits are `k`): a context source byte follows
/// (without it, the context is the previous byte, as in format 4).
const FLAG_SOURCE: u8 = 0x10;
/// Flag: tables are binned (one frequency per run of [`BIN`] byte values).
const FLAG_BINNED: u8 = 0x20;
/// Flag: the context is the source byte's top four bits (16 contexts, `k` = 15, no context bytes).
const FLAG_NIBBLE: u8 = 0x40;
/// Flag: alphabet and tables are bit-packed: the alphabet as its first and last entries and a
/// bit per entry between them, each table as its Exp-Golomb order (4 bits) and its frequencies
/// in that code. Exponent alphabets span a few dozen values and most frequencies are small, so
/// this takes about half the bytes of a bitmap and one varint per frequency.
const FLAG_PACKED: u8 = 0x80;
/// Largest Exp-Golomb order of a packed table (a frequency is at most 4096 = 2^12).
const MAX_EG_ORDER: u32 = 12;
/// Most zero bits before an Exp-Golomb code's first 1 (order 0, value 4096: 12).
const MAX_EG_ZEROS: u32 = 13;
/// Byte values per bin of a binned table.
const BIN: usize = 16;
/// What a binned table's frequencies add up to: each of a bin's 16 symbols has the bin's
/// frequency, so the symbols' frequencies add up to [`TOTAL`].
const BIN_TOTAL: u32 = TOTAL / BIN as u32;
/// Fixed bytes of a payload besides its flags, source, contexts, alphabet and tables: lane
/// lengths (at most 5 bytes each) and lane states.
const LANE_BYTES: usize = 5 * LANES + 4 * LANES;

/// Where the context of a group's byte comes from (docs/format.md, "rANS payload").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The byte before it in its lane (a lane's first byte: 0). The only source of format 4.
    Previous,
    /// The same element's byte in byte group `j` of the same chunk. Groups decode from the top
    /// (most significant) down, so `j` is above the group coded (the exponent for the mantissa).
    Group(u8),
    /// The reference element's byte in byte group `j`: for a delta chunk, the byte of the
    /// version it is XORed with (grouped like the chunk), which the decoder has before the delta.
    Reference(u8),
}

impl Source {
    /// The payload's source byte.
    fn tag(self) -> u8 {
        match self {
            Source::Previous => 0,
            Source::Group(j) => 0x10 | j,
            Source::Reference(j) => 0x20 | j,
        }
    }

    fn from_tag(tag: u8) -> Result<Source> {
        match (tag >> 4, tag & 0x0F) {
            (1, j) if j < 8 => Ok(Source::Group(j)),
            (2, j) if j < 8 => Ok(Source::Reference(j)),
            _ => Err(corrupt(&format!("unknown context source {tag:#04x}"))),
        }
    }
}

/// The bytes a group's context sources point at, each as long as the group: the groups of the
/// chunk decoded before it and the reference's groups (a delta chunk). What is absent cannot be
/// a payload's source.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sources<'a> {
    /// The chunk's byte groups decoded so far (those above the group), by group index.
    pub groups: [Option<&'a [u8]>; 8],
    /// The reference's byte groups, by group index (a delta chunk only).
    pub reference: [Option<&'a [u8]>; 8],
}

impl<'a> Sources<'a> {
    fn get(&self, source: Source) -> Option<&'a [u8]> {
        match source {
            Source::Previous => None,
            Source::Group(j) => self.groups.get(j as usize).copied().flatten(),
            Source::Reference(j) => self.reference.get(j as usize).copied().flatten(),
        }
    }
}

/// The source a payload's contexts come from, when it is not the previous byte: read from its
/// first two bytes without decoding it (a malformed payload gives `None`; decoding rejects it).
pub fn payload_source(stored: &[u8]) -> Option<Source> {
    match stored {
        [head, tag, ..] if head & FLAG_SOURCE != 0 => Source::from_tag(*tag).ok(),
        _ => None,
    }
}

/// How source byte values map to contexts.
#[derive(Clone, Debug, PartialEq)]
enum ContextMap {
    /// These values have contexts `1..=len` of their own; every other value context 0.
    Values(Vec<u8>),
    /// Context = value >> 4 (16 contexts).
    Nibble,
}

/// A quantized model: the context source, which contexts exist and a frequency table per context.
struct Model {
    source: Source,
    map: ContextMap,
    /// Context index for each source byte value.
    context_of: [u8; 256],
    /// Whether tables have one frequency per bin of 16 byte values.
    binned: bool,
    /// Whether alphabet and tables are bit-packed ([`FLAG_PACKED`]).
    packed: bool,
    /// The alphabet: byte values present in the group, or bins (`value / 16`) when binned.
    alphabet: Vec<u8>,
    /// `tables[c][a]`: quantized frequency of alphabet entry `a` in context `c` (0 if it never
    /// occurs there); for a binned table, the frequency of each symbol of bin `a`.
    tables: Vec<[u16; 256]>,
}

impl Model {
    /// Frequency of each byte value in context `c`.
    fn symbol_freqs(&self, c: usize) -> [u16; 256] {
        if self.binned {
            std::array::from_fn(|s| self.tables[c][s / BIN])
        } else {
            self.tables[c]
        }
    }

    /// The payload's first byte.
    fn head(&self) -> u8 {
        let mut head = (self.tables.len() - 1) as u8;
        if self.source != Source::Previous {
            head |= FLAG_SOURCE;
        }
        if self.binned {
            head |= FLAG_BINNED;
        }
        if self.map == ContextMap::Nibble {
            head |= FLAG_NIBBLE;
        }
        if self.packed {
            head |= FLAG_PACKED;
        }
        head
    }
}

thread_local! {
    /// Pair counts `[context byte][symbol]` of the group being coded.
    static PAIRS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Decoding tables of the group being decoded: 4096 entries per context.
    static SLOTS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Words of one lane while it is coded (emitted backwards).
    static WORDS: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Counts of each symbol after each context byte: the previous byte of its lane (the first byte
/// of each lane follows 0), or the source's byte at the same position.
fn pair_counts(group: &[u8], source: Option<&[u8]>, pairs: &mut Vec<u32>) {
    pairs.clear();
    pairs.resize(256 * 256, 0);
    match source {
        None => {
            for lane in lanes(group.len()) {
                let mut prev = 0usize;
                for &b in &group[lane] {
                    pairs[prev * 256 + b as usize] += 1;
                    prev = b as usize;
                }
            }
        }
        Some(src) => {
            for (&c, &b) in src.iter().zip(group) {
                pairs[c as usize * 256 + b as usize] += 1;
            }
        }
    }
}

/// The byte ranges of the lanes of a group of `n` bytes: quarters (rounded up), the last shorter.
fn lanes(n: usize) -> [std::ops::Range<usize>; LANES] {
    let q = n.div_ceil(LANES);
    std::array::from_fn(|i| (i * q).min(n)..((i + 1) * q).min(n))
}

/// Quantizes `counts` (over the alphabet) to frequencies summing to `total`, every counted
/// entry at least 1. A context with no counts gets all its weight on the first alphabet entry
/// (the format wants every table to sum to its total; such a table is never used).
fn quantize(counts: &[u32; 256], alphabet: &[u8], total: u32) -> [u16; 256] {
    let mut f = [0u16; 256];
    let sum_counts: u64 = alphabet.iter().map(|&s| u64::from(counts[s as usize])).sum();
    if sum_counts == 0 {
        f[alphabet[0] as usize] = total as u16;
        return f;
    }
    let target = i64::from(total);
    let mut sum: i64 = 0;
    for &s in alphabet {
        let c = u64::from(counts[s as usize]);
        if c > 0 {
            let q = ((c * u64::from(total) + sum_counts / 2) / sum_counts).max(1);
            f[s as usize] = q as u16;
            sum += q as i64;
        }
    }
    // Fix the total on the largest frequencies (each stays at least 1; there are at most 256
    // entries, at most 16 of them for the total 256 of binned tables, so the total is reachable).
    while sum != target {
        let (idx, _) = alphabet
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| f[s] > 1 || (sum < target && f[s] > 0))
            .map(|s| (s, f[s]))
            .max_by_key(|&(_, v)| v)
            .expect("a counted symbol exists");
        if sum > target {
            let cut = (sum - target).min(i64::from(f[idx]) - 1);
            f[idx] -= cut as u16;
            sum -= cut;
        } else {
            let add = target - sum;
            f[idx] += add as u16;
            sum += add;
        }
    }
    f
}

/// Bits to code `counts` with the quantized table `freqs` (of a 4096 total; for bins, the
/// frequency of each of the bin's symbols, so the bin's counts cost the same per symbol).
fn coded_bits(counts: &[u32; 256], freqs: &[u16; 256], alphabet: &[u8]) -> f64 {
    alphabet
        .iter()
        .map(|&s| s as usize)
        .filter(|&s| counts[s] > 0)
        .map(|s| f64::from(counts[s]) * (f64::from(SCALE_BITS) - f64::from(freqs[s]).log2()))
        .sum()
}

/// Bytes of a table as written: one LEB128 varint per alphabet entry.
fn table_bytes(freqs: &[u16; 256], alphabet: &[u8]) -> usize {
    alphabet.iter().map(|&s| if freqs[s as usize] < 128 { 1 } else { 2 }).sum()
}

/// Bits of `v` in the Exp-Golomb code of order `k` as written here: `n - k` zero bits, a one,
/// then the `n` low bits of `w = v + 2^k` (`n` = the position of `w`'s top bit).
fn eg_bits(v: u32, k: u32) -> u32 {
    let n = 31 - (v + (1 << k)).leading_zeros();
    2 * n - k + 1
}

/// The Exp-Golomb order that codes `table`'s alphabet entries in the fewest bits, and the bits.
fn best_eg_order(table: &[u16; 256], alphabet: &[u8]) -> (u32, u32) {
    (0..=MAX_EG_ORDER)
        .map(|k| (k, alphabet.iter().map(|&a| eg_bits(u32::from(table[a as usize]), k)).sum::<u32>()))
        .min_by_key(|&(_, bits)| bits)
        .expect("orders to try")
}

/// Bytes of the alphabet and tables bit-packed ([`FLAG_PACKED`]).
fn packed_bytes(tables: &[[u16; 256]], alphabet: &[u8]) -> usize {
    let span = u32::from(alphabet[alphabet.len() - 1] - alphabet[0]) + 1;
    let bits: u32 = span + tables.iter().map(|t| 4 + best_eg_order(t, alphabet).1).sum::<u32>();
    2 + bits.div_ceil(8) as usize
}

/// Appends bits least significant first.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    len: u32,
}

impl BitWriter<'_> {
    fn put(&mut self, value: u32, bits: u32) {
        self.acc |= u64::from(value) << self.len;
        self.len += bits;
        while self.len >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.len -= 8;
        }
    }

    fn put_eg(&mut self, v: u32, k: u32) {
        let w = v + (1 << k);
        let n = 31 - w.leading_zeros();
        self.put(1 << (n - k), n - k + 1);
        self.put(w & ((1 << n) - 1), n);
    }

    fn finish(self) {
        if self.len > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Reads bits least significant first; every read is bounds-checked.
struct BitReader<'a> {
    bytes: &'a [u8],
    bit: usize,
}

impl BitReader<'_> {
    fn get(&mut self, bits: u32) -> Result<u32> {
        let mut v = 0u32;
        for i in 0..bits {
            let byte = *self.bytes.get(self.bit / 8).ok_or_else(|| corrupt("cut short in its tables"))?;
            v |= u32::from((byte >> (self.bit % 8)) & 1) << i;
            self.bit += 1;
        }
        Ok(v)
    }

    fn get_eg(&mut self, k: u32, max: u32) -> Result<u32> {
        let mut zeros = 0;
        while self.get(1)? == 0 {
            zeros += 1;
            if zeros > MAX_EG_ZEROS {
                return Err(corrupt("Exp-Golomb code too long"));
            }
        }
        let n = zeros + k;
        let w = (1u32 << n) | self.get(n)?;
        let v = w - (1 << k);
        if v > max {
            return Err(corrupt("value out of range"));
        }
        Ok(v)
    }

    /// Bytes read, counting a partly read byte.
    fn bytes_used(&self) -> usize {
        self.bit.div_ceil(8)
    }
}

/// Per-context counts of one context map over the pair counts.
fn map_counts(map: &ContextMap, pairs: &[u32], order0: &[u32; 256]) -> (Vec<[u32; 256]>, [u8; 256]) {
    let mut context_of = [0u8; 256];
    match map {
        ContextMap::Values(values) => {
            for (i, &b) in values.iter().enumerate() {
                context_of[b as usize] = (i + 1) as u8;
            }
            let mut counts = vec![*order0; values.len() + 1];
            for (i, &b) in values.iter().enumerate() {
                let row = &pairs[b as usize * 256..b as usize * 256 + 256];
                counts[i + 1].copy_from_slice(row);
                for (rest, &n) in counts[0].iter_mut().zip(row) {
                    *rest -= n;
                }
            }
            (counts, context_of)
        }
        ContextMap::Nibble => {
            let mut counts = vec![[0u32; 256]; 16];
            for (b, slot) in context_of.iter_mut().enumerate() {
                *slot = (b >> 4) as u8;
                let row = &pairs[b * 256..b * 256 + 256];
                for s in 0..256 {
                    counts[b >> 4][s] += row[s];
                }
            }
            (counts, context_of)
        }
    }
}

/// Builds the best model for `group` with contexts from `source` (`bytes`: its bytes, `None`
/// for the previous byte) and at most `max_contexts` dedicated contexts: the context count, the
/// map (values or nibble) and full or binned tables that give the smallest estimated payload.
/// With `max_contexts` 0 the model is order-0 with full tables (the default level's, whose
/// bytes are pinned). Returns it with the estimated payload size.
fn build_model(group: &[u8], source: Source, bytes: Option<&[u8]>, max_contexts: usize) -> (Model, usize) {
    PAIRS.with(|cell| {
        let mut pairs = cell.borrow_mut();
        let mut order0 = [0u32; 256];
        if max_contexts == 0 {
            for &b in group {
                order0[b as usize] += 1;
            }
        } else {
            pair_counts(group, bytes, &mut pairs);
            for row in pairs.chunks_exact(256) {
                for (o, &c) in order0.iter_mut().zip(row) {
                    *o += c;
                }
            }
        }
        let alphabet: Vec<u8> = (0..=255u8).filter(|&s| order0[s as usize] > 0).collect();
        let source_bytes = usize::from(source != Source::Previous);
        let fixed = 1 + source_bytes + LANE_BYTES;
        if alphabet.is_empty() {
            let model = Model {
                source: Source::Previous,
                map: ContextMap::Values(vec![]),
                context_of: [0; 256],
                binned: false,
                packed: false,
                alphabet,
                tables: vec![[0; 256]],
            };
            return (model, fixed + 32);
        }
        let mut bins = [0u32; 256];
        for (s, &c) in order0.iter().enumerate() {
            bins[s / BIN] += c;
        }
        let bin_alphabet: Vec<u8> = (0..(256 / BIN) as u8).filter(|&b| bins[b as usize] > 0).collect();
        // Context byte values by how often they come before (or with) a symbol.
        let mut by_use: Vec<(u32, u8)> = Vec::new();
        if max_contexts > 0 {
            for (prev, row) in pairs.chunks_exact(256).enumerate() {
                let used: u32 = row.iter().sum();
                if used > 0 {
                    by_use.push((used, prev as u8));
                }
            }
            by_use.sort_by(|a, b| b.cmp(a));
        }
        let mut maps: Vec<ContextMap> = CONTEXT_CHOICES
            .iter()
            .filter(|&&k| k <= max_contexts && k <= by_use.len())
            .map(|&k| ContextMap::Values(by_use[..k].iter().map(|&(_, b)| b).collect()))
            .collect();
        if max_contexts >= MAX_CONTEXTS && by_use.len() > 16 {
            maps.push(ContextMap::Nibble);
        }
        let mut best: Option<(Model, usize)> = None;
        for map in maps {
            let (counts, context_of) = map_counts(&map, &pairs, &order0);
            let map_bytes = match &map {
                ContextMap::Values(v) => v.len(),
                ContextMap::Nibble => 0,
            };
            for binned in [false, true] {
                if binned && max_contexts == 0 {
                    break;
                }
                let (tables, bits, table_size, bitmap) = if binned {
                    let binned_counts: Vec<[u32; 256]> = counts
                        .iter()
                        .map(|c| {
                            let mut b = [0u32; 256];
                            for (s, &n) in c.iter().enumerate() {
                                b[s / BIN] += n;
                            }
                            b
                        })
                        .collect();
                    let tables: Vec<[u16; 256]> =
                        binned_counts.iter().map(|c| quantize(c, &bin_alphabet, BIN_TOTAL)).collect();
                    let bits: f64 =
                        binned_counts.iter().zip(&tables).map(|(c, f)| coded_bits(c, f, &bin_alphabet)).sum();
                    let size: usize = tables.iter().map(|f| table_bytes(f, &bin_alphabet)).sum();
                    (tables, bits, size, 256 / BIN / 8)
                } else {
                    let tables: Vec<[u16; 256]> = counts.iter().map(|c| quantize(c, &alphabet, TOTAL)).collect();
                    let bits: f64 = counts.iter().zip(&tables).map(|(c, f)| coded_bits(c, f, &alphabet)).sum();
                    let size: usize = tables.iter().map(|f| table_bytes(f, &alphabet)).sum();
                    (tables, bits, size, 32)
                };
                let entries = if binned { &bin_alphabet } else { &alphabet };
                let plain_bytes = bitmap + table_size;
                // The default level (no contexts) keeps format 4's bytes.
                let packed_size = if max_contexts > 0 { packed_bytes(&tables, entries) } else { usize::MAX };
                let packed = packed_size < plain_bytes;
                let size = fixed + map_bytes + plain_bytes.min(packed_size) + (bits / 8.0).ceil() as usize;
                if best.as_ref().is_none_or(|(_, s)| size < *s) {
                    let model = Model {
                        source,
                        map: map.clone(),
                        context_of,
                        binned,
                        packed,
                        alphabet: entries.clone(),
                        tables,
                    };
                    best = Some((model, size));
                }
            }
        }
        let (mut model, mut size) = best.expect("k = 0 is always tried");
        if model.tables.len() == 1 && model.source != Source::Previous {
            // One context: the source is not needed (and not written).
            model.source = Source::Previous;
            size -= 1;
        }
        (model, size)
    })
}

/// Estimated payload size for `group` with at most `max_contexts` dedicated contexts from the
/// previous byte (the model is built, nothing is coded).
pub fn estimate(group: &[u8], max_contexts: usize) -> usize {
    build_model(group, Source::Previous, None, max_contexts.min(MAX_CONTEXTS)).1
}

/// Order-1 entropy of `group` in bits: the information of each byte given the byte before it
/// (the first byte given a 0), with one table per previous byte value and table costs not
/// counted: the bound for any coder whose context is the previous byte (`ckpt stats`).
pub(crate) fn order1_entropy_bits(group: &[u8]) -> f64 {
    PAIRS.with(|cell| {
        let mut pairs = cell.borrow_mut();
        pairs.clear();
        pairs.resize(256 * 256, 0);
        let mut prev = 0usize;
        for &b in group {
            pairs[prev * 256 + b as usize] += 1;
            prev = b as usize;
        }
        let mut bits = 0.0;
        for row in pairs.chunks_exact(256) {
            let total: f64 = row.iter().map(|&c| f64::from(c)).sum();
            for &c in row.iter().filter(|&&c| c > 0) {
                bits += f64::from(c) * (total / f64::from(c)).log2();
            }
        }
        bits
    })
}

/// Estimated order-0 payload size in bytes from a group's histogram: the entropy, the tables
/// (about 1.5 bytes per symbol present) and the fixed fields. Cheap: no model is built.
pub(crate) fn order0_estimate(stats: &super::select::GroupStats) -> f64 {
    let distinct = stats.histogram.iter().filter(|&&c| c > 0).count();
    stats.entropy_bits() / 8.0 + 1.5 * distinct as f64 + (1 + 32 + LANE_BYTES) as f64
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends the rANS payload of `group` to `out` with at most `max_contexts` (≤ 15) dedicated
/// contexts from the previous byte. Returns `false` (with `out` as it was) when it would not be
/// smaller than the group.
pub fn encode(group: &[u8], max_contexts: usize, out: &mut Vec<u8>) -> Result<bool> {
    encode_with_sources(group, max_contexts, &[], out)
}

/// [`encode`] that also tries each of `candidates` (a source and its bytes, as long as the
/// group) as the context, and keeps the model with the smallest estimated payload. The previous
/// byte is always tried; with `max_contexts` 0 nothing else is (order-0).
pub fn encode_with_sources(
    group: &[u8],
    max_contexts: usize,
    candidates: &[(Source, &[u8])],
    out: &mut Vec<u8>,
) -> Result<bool> {
    if u32::try_from(group.len()).is_err() || group.is_empty() {
        return Ok(false);
    }
    let (model, estimate, source_bytes) = choose_model(group, max_contexts.min(MAX_CONTEXTS), candidates)?;
    if estimate >= group.len() {
        return Ok(false);
    }
    let start = out.len();
    write_model(&model, out);
    let streams = encode_lanes(group, &model, source_bytes);
    for s in &streams[..LANES - 1] {
        put_varint(s.len() as u64, out);
    }
    for s in &streams {
        out.extend_from_slice(s);
    }
    if out.len() - start >= group.len() {
        out.truncate(start);
        return Ok(false);
    }
    Ok(true)
}

/// The model with the smallest estimated payload for `group`, from the previous byte or one of
/// `candidates`, with that estimate and the chosen source's bytes (`None` for the previous
/// byte).
fn choose_model<'a>(
    group: &[u8],
    max_contexts: usize,
    candidates: &[(Source, &'a [u8])],
) -> Result<(Model, usize, Option<&'a [u8]>)> {
    let (mut model, mut estimate) = build_model(group, Source::Previous, None, max_contexts);
    let mut source_bytes: Option<&[u8]> = None;
    if max_contexts > 0 {
        for &(source, bytes) in candidates {
            if bytes.len() != group.len() || source == Source::Previous {
                return Err(Error::InvalidInput(format!(
                    "context source {source:?} of {} bytes for a group of {}",
                    bytes.len(),
                    group.len()
                )));
            }
            let (m, e) = build_model(group, source, Some(bytes), max_contexts);
            if e < estimate {
                source_bytes = (m.source != Source::Previous).then_some(bytes);
                (model, estimate) = (m, e);
            }
        }
    }
    Ok((model, estimate, source_bytes))
}

/// Writes the payload's head, source, context map, alphabet and frequency tables.
fn write_model(model: &Model, out: &mut Vec<u8>) {
    out.push(model.head());
    if model.source != Source::Previous {
        out.push(model.source.tag());
    }
    if let ContextMap::Values(values) = &model.map {
        out.extend_from_slice(values);
    }
    if model.packed {
        let (first, last) = (model.alphabet[0], model.alphabet[model.alphabet.len() - 1]);
        out.extend_from_slice(&[first, last]);
        let mut bits = BitWriter { out: &mut *out, acc: 0, len: 0 };
        for a in first..=last {
            bits.put(u32::from(model.alphabet.contains(&a)), 1);
        }
        for table in &model.tables {
            let (order, _) = best_eg_order(table, &model.alphabet);
            bits.put(order, 4);
            for &a in &model.alphabet {
                bits.put_eg(u32::from(table[a as usize]), order);
            }
        }
        bits.finish();
    } else {
        let mut bitmap = [0u8; 32];
        for &a in &model.alphabet {
            bitmap[a as usize / 8] |= 1 << (a % 8);
        }
        let entries = if model.binned { 256 / BIN } else { 256 };
        out.extend_from_slice(&bitmap[..entries / 8]);
        for table in &model.tables {
            for &a in &model.alphabet {
                put_varint(u64::from(table[a as usize]), out);
            }
        }
    }
}

/// The rANS stream of each lane of `group` under `model` (final state, then the renormalization
/// words in decoding order), its contexts from `source_bytes` or else the previous byte. The
/// encoder's kernel.
fn encode_lanes(group: &[u8], model: &Model, source_bytes: Option<&[u8]>) -> Vec<Vec<u8>> {
    // Frequencies and cumulative frequencies per context, per byte value.
    let freqs: Vec<[u16; 256]> = (0..model.tables.len()).map(|c| model.symbol_freqs(c)).collect();
    let cums: Vec<[u16; 256]> = freqs
        .iter()
        .map(|f| {
            let mut c = [0u16; 256];
            let mut acc = 0u16;
            for s in 0..256 {
                c[s] = acc;
                acc = acc.wrapping_add(f[s]);
            }
            c
        })
        .collect();
    let mut streams: Vec<Vec<u8>> = Vec::with_capacity(LANES);
    WORDS.with(|cell| {
        let mut words = cell.borrow_mut();
        for lane in lanes(group.len()) {
            words.clear();
            let first = lane.start;
            let bytes = &group[lane.clone()];
            let context_bytes = source_bytes.map(|s| &s[lane]);
            let mut x = L;
            for i in (0..bytes.len()).rev() {
                let context_byte = match context_bytes {
                    Some(c) => c[i],
                    None if i == 0 => 0,
                    None => bytes[i - 1],
                };
                let ctx = model.context_of[context_byte as usize] as usize;
                let s = bytes[i] as usize;
                let freq = u32::from(freqs[ctx][s]);
                let cum = u32::from(cums[ctx][s]);
                debug_assert!(freq > 0, "symbol {s} at {} has no frequency in its context", first + i);
                if u64::from(x) >= u64::from(freq) << (32 - SCALE_BITS) {
                    words.push(x as u16);
                    x >>= 16;
                }
                x = ((x / freq) << SCALE_BITS) + (x % freq) + cum;
            }
            let mut stream = Vec::with_capacity(4 + 2 * words.len());
            stream.extend_from_slice(&x.to_le_bytes());
            for &w in words.iter().rev() {
                stream.extend_from_slice(&w.to_le_bytes());
            }
            streams.push(stream);
        }
    });
    streams
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("rANS group: {what}"))
}

#[cfg(test)]
mod tests;
