//! [`Method::Rans`](super::Method::Rans): a static-model rANS coder with an optional order-1
//! context (the previous byte of the group), for the two things Huffman cannot do
//! (docs/format.md, "rANS payload"):
//! - code a byte in less than one bit: the mostly-zero groups of late-training XOR deltas cost
//!   their order-0 entropy (a zero at 99% costs 0.015 bits, not Huffman's 1 bit);
//! - use context: in an exponent group, the previous weight's exponent predicts this one's
//!   (rows and channels share a scale), so coding with one frequency table per previous value
//!   gets below the order-0 entropy that bounds Huffman.
//!
//! Model: the group's alphabet (the byte values present) and `K + 1` frequency tables over it,
//! each quantized to a total of 4096 (12 bits). Context 0 is the default; contexts 1..=K belong
//! to K byte values chosen by the encoder (the most frequent previous bytes): a symbol is coded
//! with the table of the context of the byte before it. `K = 0` is plain order-0 coding. Tables
//! cost bytes, and for a 128 KiB exponent group a full 256-context model would eat its gain, so
//! the encoder picks `K` (0, 1, 3, 7 or 15) from the measured counts, table costs included.
//!
//! The group is coded as four lanes (quarters of the group, each starting in context 0) with
//! their own rANS state, decoded in lockstep: one lane's next symbol depends on its previous
//! one (context and state), so interleaving four independent lanes lets the CPU overlap them.
//!
//! Why not a crate: `constriction` 0.5 (checked with `cargo info`) has rANS stack coders over
//! categorical models, but neither a compact table serialization nor a context switch per
//! symbol without building a model object per context, and its decoder's behaviour on corrupt
//! input is not documented as panic-free. The coder below is the textbook rANS of Duda
//! ("Asymmetric numeral systems", 2013) in the 32-bit state / 16-bit word form of ryg_rans,
//! with table-driven decoding; it is fuzzed (fuzz/fuzz_targets/rans_decode.rs).

use super::{Error, Result};
use std::cell::RefCell;

/// Bits of the frequency total: tables sum to 4096.
pub const SCALE_BITS: u32 = 12;
const TOTAL: u32 = 1 << SCALE_BITS;
/// Lower bound of the normalized state interval `[L, L << 16)`.
const L: u32 = 1 << 16;
/// Lanes per group.
pub const LANES: usize = 4;
/// Most dedicated contexts a payload may have (so at most 16 tables).
pub const MAX_CONTEXTS: usize = 15;
/// Context counts the encoder tries.
const CONTEXT_CHOICES: [usize; 5] = [0, 1, 3, 7, 15];

/// A quantized model: which contexts exist and a frequency table per context.
struct Model {
    /// Byte values that have their own context (context `1 + index`).
    context_bytes: Vec<u8>,
    /// Context index for each previous byte value.
    context_of: [u8; 256],
    /// The alphabet: byte values present in the group.
    alphabet: Vec<u8>,
    /// `freqs[c][s]`: quantized frequency of symbol `s` in context `c` (0 if it never occurs).
    freqs: Vec<[u16; 256]>,
}

thread_local! {
    /// Pair counts `[previous][symbol]` of the group being coded.
    static PAIRS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Decoding tables of the group being decoded: 4096 entries per context.
    static SLOTS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Words of one lane while it is coded (emitted backwards).
    static WORDS: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Counts of each symbol after each previous byte (the first byte of each lane follows 0).
fn pair_counts(group: &[u8], pairs: &mut Vec<u32>) {
    pairs.clear();
    pairs.resize(256 * 256, 0);
    for lane in lanes(group.len()) {
        let mut prev = 0usize;
        for &b in &group[lane] {
            pairs[prev * 256 + b as usize] += 1;
            prev = b as usize;
        }
    }
}

/// The byte ranges of the lanes of a group of `n` bytes: quarters (rounded up), the last shorter.
fn lanes(n: usize) -> [std::ops::Range<usize>; LANES] {
    let q = n.div_ceil(LANES);
    std::array::from_fn(|i| (i * q).min(n)..((i + 1) * q).min(n))
}

/// Quantizes `counts` (over the alphabet) to frequencies summing to 4096, every counted symbol
/// at least 1. A context with no counts gets all its weight on the first alphabet symbol (the
/// format wants every table to sum to 4096; such a table is never used).
fn quantize(counts: &[u32; 256], alphabet: &[u8]) -> [u16; 256] {
    let mut f = [0u16; 256];
    let total: u64 = alphabet.iter().map(|&s| u64::from(counts[s as usize])).sum();
    if total == 0 {
        f[alphabet[0] as usize] = TOTAL as u16;
        return f;
    }
    let mut sum: i64 = 0;
    for &s in alphabet {
        let c = u64::from(counts[s as usize]);
        if c > 0 {
            let q = ((c * u64::from(TOTAL) + total / 2) / total).max(1);
            f[s as usize] = q as u16;
            sum += q as i64;
        }
    }
    // Fix the total on the largest frequencies (each stays at least 1; there are at most 256
    // symbols, so the total 4096 is always reachable).
    while sum != i64::from(TOTAL) {
        let (idx, _) = alphabet
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| f[s] > 1 || (sum < i64::from(TOTAL) && f[s] > 0))
            .map(|s| (s, f[s]))
            .max_by_key(|&(_, v)| v)
            .expect("a counted symbol exists");
        if sum > i64::from(TOTAL) {
            let cut = (sum - i64::from(TOTAL)).min(i64::from(f[idx]) - 1);
            f[idx] -= cut as u16;
            sum -= cut;
        } else {
            let add = i64::from(TOTAL) - sum;
            f[idx] += add as u16;
            sum += add;
        }
    }
    f
}

/// Bits to code `counts` with the quantized table `freqs`.
fn coded_bits(counts: &[u32; 256], freqs: &[u16; 256], alphabet: &[u8]) -> f64 {
    alphabet
        .iter()
        .map(|&s| s as usize)
        .filter(|&s| counts[s] > 0)
        .map(|s| f64::from(counts[s]) * (f64::from(SCALE_BITS) - f64::from(freqs[s]).log2()))
        .sum()
}

/// Bytes of a table as written: one LEB128 varint per alphabet symbol.
fn table_bytes(freqs: &[u16; 256], alphabet: &[u8]) -> usize {
    alphabet.iter().map(|&s| if freqs[s as usize] < 128 { 1 } else { 2 }).sum()
}

/// Builds the model for `group` with at most `max_contexts` dedicated contexts, choosing the
/// count that gives the smallest estimated payload. Returns it with the estimated payload size.
fn build_model(group: &[u8], max_contexts: usize) -> (Model, usize) {
    PAIRS.with(|cell| {
        let mut pairs = cell.borrow_mut();
        let mut order0 = [0u32; 256];
        if max_contexts == 0 {
            for &b in group {
                order0[b as usize] += 1;
            }
        } else {
            pair_counts(group, &mut pairs);
            for prev in 0..256 {
                for s in 0..256 {
                    order0[s] += pairs[prev * 256 + s];
                }
            }
        }
        let alphabet: Vec<u8> = (0..=255u8).filter(|&s| order0[s as usize] > 0).collect();
        let fixed = 1 + 32 + 5 * LANES + 4 * LANES; // context count, alphabet, lane lengths, states
        if alphabet.is_empty() {
            let model = Model { context_bytes: vec![], context_of: [0; 256], alphabet, freqs: vec![[0; 256]] };
            return (model, fixed);
        }
        // Previous byte values by how often they precede a symbol (a lane's start counts as 0).
        let mut by_use: Vec<(u32, u8)> = Vec::new();
        if max_contexts > 0 {
            for prev in 0..256 {
                let used: u32 = pairs[prev * 256..prev * 256 + 256].iter().sum();
                if used > 0 {
                    by_use.push((used, prev as u8));
                }
            }
            by_use.sort_by(|a, b| b.cmp(a));
        }
        let mut best: Option<(Model, usize)> = None;
        for &k in CONTEXT_CHOICES.iter().filter(|&&k| k <= max_contexts && k <= by_use.len()) {
            let context_bytes: Vec<u8> = by_use[..k].iter().map(|&(_, b)| b).collect();
            let mut context_of = [0u8; 256];
            for (i, &b) in context_bytes.iter().enumerate() {
                context_of[b as usize] = (i + 1) as u8;
            }
            let mut counts = vec![[0u32; 256]; k + 1];
            if k == 0 {
                counts[0] = order0;
            } else {
                for prev in 0..256 {
                    let c = &mut counts[context_of[prev] as usize];
                    for s in 0..256 {
                        c[s] += pairs[prev * 256 + s];
                    }
                }
            }
            let freqs: Vec<[u16; 256]> = counts.iter().map(|c| quantize(c, &alphabet)).collect();
            let bits: f64 = counts.iter().zip(&freqs).map(|(c, f)| coded_bits(c, f, &alphabet)).sum();
            let tables: usize = freqs.iter().map(|f| table_bytes(f, &alphabet)).sum();
            let size = fixed + k + tables + (bits / 8.0).ceil() as usize;
            if best.as_ref().is_none_or(|(_, s)| size < *s) {
                best = Some((Model { context_bytes, context_of, alphabet: alphabet.clone(), freqs }, size));
            }
        }
        best.expect("k = 0 is always tried")
    })
}

/// Estimated payload size for `group` with at most `max_contexts` dedicated contexts (the
/// model is built, nothing is coded).
pub fn estimate(group: &[u8], max_contexts: usize) -> usize {
    build_model(group, max_contexts.min(MAX_CONTEXTS)).1
}

/// Order-1 entropy of `group` in bits: the information of each byte given the byte before it
/// (the first byte given a 0), with one table per previous byte value and table costs not
/// counted: the bound for any coder whose context is the previous byte (`ckpt stats`).
pub fn order1_entropy_bits(group: &[u8]) -> f64 {
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
pub fn order0_estimate(stats: &super::select::GroupStats) -> f64 {
    let distinct = stats.histogram.iter().filter(|&&c| c > 0).count();
    stats.entropy_bits() / 8.0 + 1.5 * distinct as f64 + (1 + 32 + 5 * LANES + 4 * LANES) as f64
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends the rANS payload of `group` to `out` with at most `max_contexts` (≤ 15) dedicated
/// contexts. Returns `false` (with `out` as it was) when it would not be smaller than the group.
pub fn encode(group: &[u8], max_contexts: usize, out: &mut Vec<u8>) -> Result<bool> {
    if u32::try_from(group.len()).is_err() || group.is_empty() {
        return Ok(false);
    }
    let (model, estimate) = build_model(group, max_contexts.min(MAX_CONTEXTS));
    if estimate >= group.len() {
        return Ok(false);
    }
    let start = out.len();
    out.push(model.context_bytes.len() as u8);
    out.extend_from_slice(&model.context_bytes);
    let mut bitmap = [0u8; 32];
    for &s in &model.alphabet {
        bitmap[s as usize / 8] |= 1 << (s % 8);
    }
    out.extend_from_slice(&bitmap);
    for f in &model.freqs {
        for &s in &model.alphabet {
            put_varint(u64::from(f[s as usize]), out);
        }
    }
    // Cumulative frequencies per context.
    let cums: Vec<[u16; 256]> = model
        .freqs
        .iter()
        .map(|f| {
            let mut c = [0u16; 256];
            let mut acc = 0u16;
            for &s in &model.alphabet {
                c[s as usize] = acc;
                acc += f[s as usize];
            }
            c
        })
        .collect();
    let mut streams: Vec<Vec<u8>> = Vec::with_capacity(LANES);
    WORDS.with(|cell| {
        let mut words = cell.borrow_mut();
        for lane in lanes(group.len()) {
            words.clear();
            let bytes = &group[lane];
            let mut x = L;
            for i in (0..bytes.len()).rev() {
                let prev = if i == 0 { 0 } else { bytes[i - 1] };
                let ctx = model.context_of[prev as usize] as usize;
                let s = bytes[i] as usize;
                let freq = u32::from(model.freqs[ctx][s]);
                let cum = u32::from(cums[ctx][s]);
                debug_assert!(freq > 0, "every symbol of the group has a frequency in its context");
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

/// Reads a LEB128 varint of at most `max` from `input` at `*at`.
fn get_varint(input: &[u8], at: &mut usize, max: u64) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..).step_by(7).take(10) {
        let b = *input.get(*at).ok_or_else(|| corrupt("cut short in its tables"))?;
        *at += 1;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            break;
        }
        if shift >= 56 {
            return Err(corrupt("varint too long"));
        }
    }
    if v > max {
        return Err(corrupt("value out of range"));
    }
    Ok(v)
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("rANS group: {what}"))
}

/// One lane being decoded.
struct Lane<'a> {
    x: u32,
    words: &'a [u8],
    at: usize,
    /// Offset of the current context's table in the slot tables.
    table: usize,
}

impl Lane<'_> {
    #[inline(always)]
    fn step(&mut self, slots: &[u32], context_of: &[u32; 256]) -> Result<u8> {
        let e = slots[self.table + (self.x & (TOTAL - 1)) as usize];
        let s = (e >> 24) as u8;
        self.x = ((e & 0xFFF) + 1) * (self.x >> SCALE_BITS) + ((e >> 12) & 0xFFF);
        if self.x < L {
            let w = self.words.get(self.at..self.at + 2).ok_or_else(|| corrupt("stream cut short"))?;
            self.x = (self.x << 16) | u32::from(u16::from_le_bytes([w[0], w[1]]));
            self.at += 2;
        }
        self.table = context_of[s as usize] as usize;
        Ok(s)
    }
}

/// Decodes a rANS payload into `out` (the group; its length is the caller's). Every count and
/// length read from `stored` is checked before use; tables are bounded (16 × 4096 entries), and
/// a payload that does not end exactly where its final states say is corrupt.
pub fn decode(stored: &[u8], out: &mut [u8]) -> Result<()> {
    let mut at = 0usize;
    let k = *stored.first().ok_or_else(|| corrupt("empty payload"))? as usize;
    at += 1;
    if k > MAX_CONTEXTS {
        return Err(corrupt("too many contexts"));
    }
    let context_bytes = stored.get(at..at + k).ok_or_else(|| corrupt("cut short in its contexts"))?;
    at += k;
    let bitmap = stored.get(at..at + 32).ok_or_else(|| corrupt("cut short in its alphabet"))?;
    at += 32;
    let alphabet: Vec<u8> = (0..=255u8).filter(|&s| bitmap[s as usize / 8] & (1 << (s % 8)) != 0).collect();
    if alphabet.is_empty() {
        return Err(corrupt("empty alphabet"));
    }
    // context_of maps a previous byte to its table's offset in `slots`.
    let mut context_of = [0u32; 256];
    for (i, &b) in context_bytes.iter().enumerate() {
        context_of[b as usize] = ((i + 1) as u32) << SCALE_BITS;
    }
    SLOTS.with(|cell| {
        let mut slots = cell.borrow_mut();
        slots.clear();
        slots.resize((k + 1) << SCALE_BITS, 0);
        for c in 0..=k {
            let table = &mut slots[c << SCALE_BITS..(c + 1) << SCALE_BITS];
            let mut cum = 0u32;
            for &s in &alphabet {
                let f = get_varint(stored, &mut at, u64::from(TOTAL))? as u32;
                if cum + f > TOTAL {
                    return Err(corrupt("frequencies over the total"));
                }
                for (bias, slot) in table[cum as usize..(cum + f) as usize].iter_mut().enumerate() {
                    *slot = (u32::from(s) << 24) | ((bias as u32) << 12) | (f - 1);
                }
                cum += f;
            }
            if cum != TOTAL {
                return Err(corrupt("frequencies do not add up to the total"));
            }
        }
        let mut lengths = [0usize; LANES];
        for len in &mut lengths[..LANES - 1] {
            *len = get_varint(stored, &mut at, stored.len() as u64)? as usize;
        }
        let mut rest = &stored[at..];
        let used: usize = lengths[..LANES - 1].iter().sum();
        lengths[LANES - 1] = rest.len().checked_sub(used).ok_or_else(|| corrupt("lanes longer than the payload"))?;
        let mut lanes_state: Vec<Lane<'_>> = Vec::with_capacity(LANES);
        for len in lengths {
            let (stream, tail) = rest.split_at(len);
            rest = tail;
            let (x, words) = stream.split_first_chunk::<4>().ok_or_else(|| corrupt("lane without a state"))?;
            lanes_state.push(Lane { x: u32::from_le_bytes(*x), words, at: 0, table: 0 });
        }
        for lane in &lanes_state {
            if !(L..=u32::MAX).contains(&lane.x) || lane.words.len() % 2 != 0 {
                return Err(corrupt("bad lane state"));
            }
        }
        let ranges = lanes(out.len());
        // Lane lengths do not increase from lane 0 to lane 3.
        let (o0, rest_out) = out.split_at_mut(ranges[0].len());
        let (o1, rest_out) = rest_out.split_at_mut(ranges[1].len());
        let (o2, o3) = rest_out.split_at_mut(ranges[2].len());
        let shortest = o3.len();
        let [l0, l1, l2, l3] = &mut lanes_state[..] else { unreachable!("four lanes") };
        let start = context_of[0] as usize;
        for lane in [&mut *l0, &mut *l1, &mut *l2, &mut *l3] {
            lane.table = start;
        }
        let slots = &slots[..];
        // All four lanes in lockstep while the last (shortest) has symbols, then the rest.
        for i in 0..shortest {
            o0[i] = l0.step(slots, &context_of)?;
            o1[i] = l1.step(slots, &context_of)?;
            o2[i] = l2.step(slots, &context_of)?;
            o3[i] = l3.step(slots, &context_of)?;
        }
        for (lane, o) in [(&mut *l0, o0), (&mut *l1, o1), (&mut *l2, o2)] {
            for b in o[shortest..].iter_mut() {
                *b = lane.step(slots, &context_of)?;
            }
        }
        for lane in [&*l0, &*l1, &*l2, &*l3] {
            if lane.x != L || lane.at != lane.words.len() {
                return Err(corrupt("lane does not end in the initial state"));
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(group: &[u8], contexts: usize) -> Option<usize> {
        let mut out = Vec::new();
        if !encode(group, contexts, &mut out).unwrap() {
            assert!(out.is_empty());
            return None;
        }
        assert!(out.len() < group.len());
        let mut back = vec![0xA5; group.len()];
        decode(&out, &mut back).unwrap();
        assert!(back == group, "round trip");
        Some(out.len())
    }

    /// Adversarial distributions: empty, one byte, all one symbol, all distinct, alternating,
    /// and one rare symbol among zeros (sub-one-bit coding).
    #[test]
    fn adversarial_distributions_round_trip() {
        assert_eq!(round_trip(&[], 15), None);
        assert_eq!(round_trip(&[7], 15), None, "one byte never shrinks");
        let same = vec![0x3Cu8; 100_000];
        let n = round_trip(&same, 15).unwrap();
        assert!(n < 100, "one symbol costs almost nothing: {n}");
        let distinct: Vec<u8> = (0..=255u8).collect();
        assert_eq!(round_trip(&distinct, 15), None);
        let distinct_long: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        // Order-0 cannot shrink it; order-1 (next = previous + 1) only if the tables pay.
        let _ = round_trip(&distinct_long, 15);
        let _ = round_trip(&distinct_long, 0);
        let alternating: Vec<u8> = (0..50_000).map(|i| if i % 2 == 0 { 1 } else { 200 }).collect();
        let order0 = round_trip(&alternating, 0).unwrap();
        let order1 = round_trip(&alternating, 15).unwrap();
        assert!(order0 > 50_000 / 8 - 100, "order-0 pays a bit per byte: {order0}");
        assert!(order1 < 200, "order-1 predicts every byte: {order1}");
    }

    /// A group that is 99.5% zeros costs well below Huffman's floor of one bit per byte.
    #[test]
    fn sparse_groups_code_below_one_bit_per_byte() {
        let group: Vec<u8> = crate::test_data::xorshift(5)
            .take(131_072)
            .map(|s| if s % 200 == 0 { (s >> 40) as u8 | 1 } else { 0 })
            .collect();
        let n = round_trip(&group, 0).unwrap();
        assert!(n * 8 < group.len() / 4, "{n} bytes for {} bytes", group.len());
    }

    /// Exponent-like bytes whose value follows the previous one: order-1 beats order-0.
    #[test]
    fn context_beats_order_zero_on_correlated_bytes() {
        let mut prev = 120u8;
        let group: Vec<u8> = crate::test_data::xorshift(11)
            .take(131_072)
            .map(|s| {
                prev = match s % 16 {
                    0 => prev.saturating_sub(1).max(110),
                    1 => (prev + 1).min(125),
                    _ => prev,
                };
                prev
            })
            .collect();
        let order0 = round_trip(&group, 0).unwrap();
        let order1 = round_trip(&group, 15).unwrap();
        assert!((order1 as f64) < 0.7 * order0 as f64, "order-1 {order1} vs order-0 {order0}");
    }

    #[test]
    fn order1_entropy_sees_what_order0_cannot() {
        let alternating: Vec<u8> = (0..1000).map(|i| if i % 2 == 0 { 1 } else { 2 }).collect();
        assert!(order1_entropy_bits(&alternating) < 1e-9, "each byte follows from the one before");
        let stats = crate::codec::select::GroupStats::of(&alternating);
        assert!((stats.entropy_bits() - 1000.0).abs() < 1e-9);
        assert_eq!(order1_entropy_bits(&[]), 0.0);
    }

    #[test]
    fn quantized_tables_add_up() {
        let mut counts = [0u32; 256];
        counts[3] = 1;
        counts[9] = 1_000_000;
        counts[200] = 2;
        let alphabet = [3u8, 9, 200];
        let f = quantize(&counts, &alphabet);
        assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), TOTAL);
        assert!(f[3] >= 1 && f[200] >= 1);
        let all: Vec<u8> = (0..=255).collect();
        let mut flat = [1u32; 256];
        flat[0] = 1 << 30;
        let f = quantize(&flat, &all);
        assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), TOTAL);
        assert!(f.iter().all(|&v| v >= 1));
    }

    /// Pins the format: a fixed input gives exactly these payload bytes.
    #[test]
    fn golden_vector() {
        let group = b"aaaaaaaabbbbccdeaaaaaaaabbbbccdfaaaaaaaabbbbccdeaaaaaaaabbbbccdg".repeat(4);
        let mut out = Vec::new();
        assert!(encode(&group, 0, &mut out).unwrap());
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN);
        let mut back = vec![0; group.len()];
        decode(&out, &mut back).unwrap();
        assert_eq!(back, group);
    }

    const GOLDEN: &str = "00000000000000000000000000fe000000000000000000000000000000000000008010800880048002800140401212127f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc";

    #[test]
    fn corrupt_payloads_are_rejected_or_decode_without_panic() {
        let group: Vec<u8> =
            crate::test_data::xorshift(3).take(20_000).map(|s| (s % 5) as u8 * (s % 3) as u8).collect();
        let mut out = Vec::new();
        assert!(encode(&group, 15, &mut out).unwrap());
        let mut back = vec![0; group.len()];
        for cut in 0..out.len() {
            assert!(decode(&out[..cut], &mut back).is_err(), "cut at {cut}");
        }
        let mut flips = 0;
        for i in (0..out.len()).step_by(7) {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            if decode(&bad, &mut back).is_err() || back != group {
                flips += 1;
            }
        }
        assert!(flips > 0);
    }

    fn distributions() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..3000),
            (any::<u8>(), 0usize..5000).prop_map(|(b, n)| vec![b; n]),
            (any::<u8>(), any::<u8>(), 0usize..5000)
                .prop_map(|(a, b, n)| (0..n).map(|i| if i % 2 == 0 { a } else { b }).collect()),
            (0usize..5000).prop_map(|n| (0..n).map(|i| i as u8).collect()),
            (any::<u64>(), 0usize..20_000, 1u64..1000).prop_map(|(seed, n, every)| crate::test_data::xorshift(seed)
                .take(n)
                .map(|s| if s % every == 0 { (s >> 33) as u8 } else { 0 })
                .collect()),
            (any::<u64>(), 0usize..20_000).prop_map(|(seed, n)| {
                let mut prev = 120u8;
                crate::test_data::xorshift(seed)
                    .take(n)
                    .map(|s| {
                        prev = prev.wrapping_add((s % 5) as u8).wrapping_sub(2);
                        prev
                    })
                    .collect()
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn round_trips(group in distributions(), contexts in 0usize..=16) {
            round_trip(&group, contexts);
        }

        /// Arbitrary payloads never panic and never write outside the group.
        #[test]
        fn arbitrary_payloads_do_not_panic(payload in proptest::collection::vec(any::<u8>(), 0..400), n in 0usize..300) {
            let mut out = vec![0; n];
            let _ = decode(&payload, &mut out);
        }
    }
}
