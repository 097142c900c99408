//! Paired coding of two byte groups (docs/format.md, "Paired payload"): each element's byte of an
//! upper group (a float's exponent) and the top `k` bits of its byte of the group below (the sign
//! and top mantissa bits) as one Huffman symbol, coded by huff0 through [`huffman`]; the other
//! `8 - k` bits of the lower byte bit-packed.
//!
//! # Why
//!
//! Within one binade of a bell-shaped weight distribution, small magnitudes are more common than
//! large ones, so the top mantissa bits depend on the exponent. The default level stores the
//! sign-and-mantissa group raw (it is near 8 bits of entropy on its own), and a Huffman code of
//! the exponent alone cannot see that dependence. A joint symbol can, at huff0's speed: on the
//! corpus's bf16 files it saves about 0.4% of the file (docs/BENCHMARKS.md, "Paired groups"),
//! where rANS with the same context decodes three times slower (branch `ransdefault`).
//!
//! `k` is at most 3 so that a symbol stays a byte: the upper group may hold at most `256 >> k`
//! distinct values in a chunk (bf16 exponents of trained weights: 21 in the median chunk of the
//! corpus, 49 at most), each named by its index in the payload's value set. When that set is one
//! range (ckpt's encoder names the whole range between the extremes when it can), the index is
//! the value minus the smallest, and coding and decoding run on whole words or SIMD registers
//! without a table; otherwise through a 256-entry table.
//!
//! # Why by hand, and the SIMD
//!
//! No crate codes such symbol pairs. The decoding loops that turn symbols back into bytes were
//! the pair's main cost after huff0 itself, so they have SSSE3 and AVX2 versions (runtime
//! checks) and BMI2 `pdep`/`pext` word versions, each beside a portable loop that a property test
//! checks them against (docs/BENCHMARKS.md, "Paired groups", has the steps and timings).
//!
//! # Untrusted input
//!
//! [`decode`] checks `k`, the value set and the remainder's exact length before decoding, lets
//! [`huffman::decode`] check the symbol payload, and rejects a symbol outside the value set
//! before any table lookup. Nothing is allocated; the SIMD loops take whole blocks whose reads
//! stay inside the payload, and leave the rest to the word loops.

use super::select::GroupStats;
use super::{huffman, Error, Result};

/// Length of the fixed head of a Paired payload: `k` and the 256-bit value set.
pub(crate) const HEAD_LEN: usize = 33;

/// Largest `k`.
pub(crate) const MAX_K: u32 = 3;

/// How a pair of groups would be coded: `k`, the upper values symbols may name, and each
/// value's index among them.
#[derive(Clone, Debug)]
pub struct Plan {
    k: u32,
    present: [u8; 32],
    rank: [u8; 256],
    /// The smallest value, when the values are a contiguous range (the fast path of both
    /// coding and decoding: an index is then the value minus this, in eight bytes at once).
    base: Option<u8>,
}

impl Plan {
    /// The plan for an upper group with this histogram: the largest `k` its number of distinct
    /// values allows (on the corpus each step of `k` up to 3 saved more, or the same), or `None`
    /// when it holds more than 128 distinct values. The values named are the whole range from
    /// the smallest to the largest when that range allows the same `k` (on the corpus's weights,
    /// 497 of 507 chunks; Adam moments, whose zeros sit far below the other exponents, about
    /// half), else exactly the values present.
    pub fn for_histogram(histogram: &[u32; 256]) -> Option<Plan> {
        let largest_k = |count: usize| (1..=MAX_K).rev().find(|&k| count <= 256 >> k);
        let distinct = histogram.iter().filter(|&&c| c > 0).count();
        let k = largest_k(distinct)?;
        let low = histogram.iter().position(|&c| c > 0)?;
        let high = histogram.iter().rposition(|&c| c > 0)?;
        let range = low..=high;
        Some(match largest_k(high - low + 1) == Some(k) {
            true => Plan::with_k(|v| range.contains(&v), k),
            false => Plan::with_k(|v| histogram[v] > 0, k),
        })
    }

    /// The plan for an upper group whose values lie in `low..=high`, known without its histogram:
    /// the whole range, with the largest `k` it allows, or `None` for a range over 128 values.
    pub(crate) fn for_range(low: u8, high: u8) -> Option<Plan> {
        let range = (low as usize)..=(high as usize);
        let k = (1..=MAX_K).rev().find(|&k| range.clone().count() <= 256 >> k)?;
        Some(Plan::with_k(|v| range.contains(&v), k))
    }

    /// The upper group's histogram from the symbols' (each symbol names one upper value).
    pub(crate) fn upper_histogram(&self, symbol_histogram: &[u32; 256]) -> [u32; 256] {
        let mut values = [0u8; 256];
        for v in 0..256 {
            if self.present[v / 8] & (1 << (v % 8)) != 0 {
                values[self.rank[v] as usize] = v as u8;
            }
        }
        let mut histogram = [0u32; 256];
        for (symbol, &count) in symbol_histogram.iter().enumerate() {
            histogram[values[symbol >> self.k] as usize] += count;
        }
        histogram
    }

    /// The plan naming the values `named` selects with a given `k` (1 to 3; the caller checks
    /// that `256 >> k` values suffice).
    fn with_k(named: impl Fn(usize) -> bool, k: u32) -> Plan {
        let mut present = [0u8; 32];
        let mut rank = [0u8; 256];
        let mut next = 0u8;
        for v in (0..256).filter(|&v| named(v)) {
            present[v / 8] |= 1 << (v % 8);
            rank[v] = next;
            next = next.wrapping_add(1);
        }
        Plan { k, present, rank, base: contiguous_base(&present) }
    }

    /// `k`: top bits of the lower byte carried in the symbol.
    pub fn k(&self) -> u32 {
        self.k
    }

    /// Writes each element's symbol into `symbols` (as long as `upper` and `lower`) and returns
    /// their statistics. (Counting them on the way, in the same loop, took twice as long as
    /// counting them after it.)
    pub fn symbols(&self, upper: &[u8], lower: &[u8], symbols: &mut [u8]) -> GroupStats {
        match (self.k, self.base) {
            (1, Some(base)) => symbols_range::<1>(base, upper, lower, symbols),
            (2, Some(base)) => symbols_range::<2>(base, upper, lower, symbols),
            (_, Some(base)) => symbols_range::<3>(base, upper, lower, symbols),
            (k, None) => {
                // Each value's index, already shifted into place in the symbol.
                let shifted = self.rank.map(|r| r << k);
                match k {
                    1 => symbols_k::<1>(&shifted, upper, lower, symbols),
                    2 => symbols_k::<2>(&shifted, upper, lower, symbols),
                    _ => symbols_k::<3>(&shifted, upper, lower, symbols),
                }
            }
        }
        GroupStats::of(symbols)
    }
}

/// The smallest value of a value set that is one contiguous range, else `None`.
fn contiguous_base(present: &[u8; 32]) -> Option<u8> {
    let bits = u128::from_le_bytes(present[..16].try_into().expect("16 bytes"));
    let high = u128::from_le_bytes(present[16..].try_into().expect("16 bytes"));
    let (count, low) = match (bits, high) {
        (0, 0) => return None,
        (0, h) => (h.count_ones(), 128 + h.trailing_zeros()),
        (b, h) => (b.count_ones() + h.count_ones(), b.trailing_zeros()),
    };
    // Contiguous: the set equals `count` ones from `low` up.
    let run = |from: u32| -> (u128, u128) {
        let ones = |n: u32, at: u32| if n == 0 { 0 } else { (u128::MAX >> (128 - n)) << at };
        if from >= 128 {
            (0, ones(count, from - 128))
        } else {
            let in_low = count.min(128 - from);
            (ones(in_low, from), ones(count - in_low, 0))
        }
    };
    ((bits, high) == run(low)).then_some(low as u8)
}

/// [`Plan::symbols`] for a contiguous value range from `base`: indices are `value - base`, eight
/// elements per u64 word without a table (no byte borrows or carries: every value is at least
/// `base`, every index shifted by `K` stays below 256).
fn symbols_range<const K: u32>(base: u8, upper: &[u8], lower: &[u8], symbols: &mut [u8]) {
    let top_bits = BYTES * ((1 << K) - 1);
    let bases = BYTES * base as u64;
    let mut out = symbols.chunks_exact_mut(8);
    let mut ups = upper.chunks_exact(8);
    let mut lows = lower.chunks_exact(8);
    for ((o, u), l) in (&mut out).zip(&mut ups).zip(&mut lows) {
        let u = u64::from_le_bytes(u.try_into().expect("8 bytes"));
        let l = u64::from_le_bytes(l.try_into().expect("8 bytes"));
        let word = ((u - bases) << K) | ((l >> (8 - K)) & top_bits);
        o.copy_from_slice(&word.to_le_bytes());
    }
    for ((o, &u), &l) in out.into_remainder().iter_mut().zip(ups.remainder()).zip(lows.remainder()) {
        *o = ((u - base) << K) | (l >> (8 - K));
    }
}

/// `0x01` in every byte of a u64: times a byte value, that value in every byte.
const BYTES: u64 = 0x0101_0101_0101_0101;

/// [`Plan::symbols`] for one `K`, eight elements per step as u64 words (the lower bytes' top
/// bits move down within their byte; nothing crosses a byte).
fn symbols_k<const K: u32>(shifted_rank: &[u8; 256], upper: &[u8], lower: &[u8], symbols: &mut [u8]) {
    let top_bits = BYTES * ((1 << K) - 1);
    let mut out = symbols.chunks_exact_mut(8);
    let mut ups = upper.chunks_exact(8);
    let mut lows = lower.chunks_exact(8);
    for ((o, u), l) in (&mut out).zip(&mut ups).zip(&mut lows) {
        let l = u64::from_le_bytes(l.try_into().expect("8 bytes"));
        let mut word = (l >> (8 - K)) & top_bits;
        for (j, &u) in u.iter().enumerate() {
            word |= (shifted_rank[u as usize] as u64) << (8 * j);
        }
        o.copy_from_slice(&word.to_le_bytes());
    }
    for ((o, &u), &l) in out.into_remainder().iter_mut().zip(ups.remainder()).zip(lows.remainder()) {
        *o = shifted_rank[u as usize] | (l >> (8 - K));
    }
}

/// Bytes of the Remainder payload for `n` elements and this `k`.
pub fn remainder_len(n: usize, k: u32) -> usize {
    (n * (8 - k as usize)).div_ceil(8)
}

/// Estimated stored bytes of both groups coded as a pair, from the symbols' statistics.
pub fn estimate(symbol_stats: &GroupStats, k: u32) -> f64 {
    symbol_stats.huffman_estimate() + HEAD_LEN as f64 + remainder_len(symbol_stats.len, k) as f64
}

/// Codes `upper` and `lower` (the same length) as a pair with `plan`, from their `symbols`
/// ([`Plan::symbols`]) and the symbols' histogram when the caller has it: appends the Paired
/// payload to `upper_out` and the Remainder payload to `lower_out`. Returns false, leaving both
/// as they were, when either payload would not be smaller than its group.
pub fn encode(
    plan: &Plan,
    symbols: &[u8],
    histogram: Option<&[u32; 256]>,
    lower: &[u8],
    upper_out: &mut Vec<u8>,
    lower_out: &mut Vec<u8>,
) -> Result<bool> {
    if symbols.len() != lower.len() {
        return Err(Error::InvalidInput(format!("{} symbols for {} elements", symbols.len(), lower.len())));
    }
    if !encode_upper(plan, symbols, histogram, upper_out)? {
        return Ok(false);
    }
    pack_remainders(lower, plan.k, lower_out);
    Ok(true)
}

/// The Paired half of [`encode`]: appends the Paired payload of `symbols` to `upper_out`, or
/// returns false (leaving it as it was) when the pair would not pay: its payload not smaller
/// than the group, or the Remainder payload not smaller than its group.
pub(crate) fn encode_upper(
    plan: &Plan,
    symbols: &[u8],
    histogram: Option<&[u32; 256]>,
    upper_out: &mut Vec<u8>,
) -> Result<bool> {
    let n = symbols.len();
    if remainder_len(n, plan.k) >= n {
        return Ok(false);
    }
    let start = upper_out.len();
    upper_out.push(plan.k as u8);
    upper_out.extend_from_slice(&plan.present);
    if !huffman::encode_counted(symbols, histogram, upper_out)? || upper_out.len() - start >= n {
        upper_out.truncate(start);
        return Ok(false);
    }
    Ok(true)
}

/// Appends the Remainder payload of `lower` for `k` (the other half of [`encode`], for a caller
/// that writes the two payloads at different times).
pub fn pack_remainders(lower: &[u8], k: u32, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + remainder_len(lower.len(), k), 0);
    let packed = &mut out[start..];
    #[cfg(target_arch = "x86_64")]
    if bmi2::pack(k, lower, packed) {
        return;
    }
    match k {
        1 => pack_k::<1, false>(lower, packed),
        2 => pack_k::<2, false>(lower, packed),
        _ => pack_k::<3, false>(lower, packed),
    }
}

/// The low `8 - K` bits of each byte of `lower`, bit-packed into `packed` (exactly
/// [`remainder_len`] bytes): eight elements fill `8 - K` bytes.
#[inline(always)]
fn pack_k<const K: u32, const PEXT: bool>(lower: &[u8], packed: &mut [u8]) {
    let width = 8 - K as usize;
    let full = lower.len() / 8;
    // Eight bytes stored per step (the next step overwrites the extra ones), while they fit.
    let wide = if packed.len() >= 8 { ((packed.len() - 8) / width + 1).min(full) } else { 0 };
    for (b, block) in lower.chunks_exact(8).take(wide).enumerate() {
        let word = gather_with::<K, PEXT>(u64::from_le_bytes(block.try_into().expect("8 bytes")));
        packed[b * width..b * width + 8].copy_from_slice(&word.to_le_bytes());
    }
    for b in wide..lower.len().div_ceil(8) {
        let block = &lower[b * 8..(b * 8 + 8).min(lower.len())];
        let mut bytes = [0u8; 8];
        bytes[..block.len()].copy_from_slice(block);
        let word = gather::<K>(u64::from_le_bytes(bytes));
        let at = b * width;
        let len = (block.len() * width).div_ceil(8);
        packed[at..at + len].copy_from_slice(&word.to_le_bytes()[..len]);
    }
}

/// Decodes a Paired payload (`upper_stored`) and the Remainder payload below it
/// (`lower_stored`) into the two groups `upper` and `lower` (the same length, the chunk's
/// element count).
pub fn decode(upper_stored: &[u8], lower_stored: &[u8], upper: &mut [u8], lower: &mut [u8]) -> Result<()> {
    let n = upper.len();
    if lower.len() != n {
        return Err(Error::InvalidInput(format!("paired groups of {n} and {} bytes", lower.len())));
    }
    let (k, present) = decode_symbols(upper_stored, lower_stored, upper)?;
    decode_from_symbols(k, &present, upper, lower, lower_stored);
    Ok(())
}

/// Decodes a chunk of 2-byte floats (bf16, f16) whose two groups are a pair straight into its
/// elements `out` (the chunk's bytes, exponent extraction undone), with `scratch` (as long as
/// `out`): the same result as [`decode`] and [`super::byte_group::regroup`], without writing
/// and reading back the two groups (the regrouping pass was 15% of decoding a bf16 file).
pub fn decode_elements(upper_stored: &[u8], lower_stored: &[u8], scratch: &mut [u8], out: &mut [u8]) -> Result<()> {
    let n = out.len() / 2;
    if !out.len().is_multiple_of(2) || scratch.len() != out.len() {
        return Err(Error::InvalidInput(format!(
            "{} bytes of 2-byte elements, {} of scratch",
            out.len(),
            scratch.len()
        )));
    }
    let (symbols, lower) = scratch.split_at_mut(n);
    let (k, present) = decode_symbols(upper_stored, lower_stored, symbols)?;
    let done = match contiguous_base(&present) {
        #[cfg(target_arch = "x86_64")]
        Some(base) => simd::unpack_range_elements(k, symbols, lower_stored, base, out),
        _ => 0,
    };
    // The rest (or all) as two groups, then regrouped.
    let (symbols, lower) = (&mut symbols[done..], &mut lower[done..]);
    let packed = &lower_stored[done * (8 - k as usize) / 8..];
    decode_from_symbols(k, &present, symbols, lower, packed);
    let grouping = super::Grouping { width: 2, extract_exponent: true };
    super::byte_group::regroup(&[&*lower, &*symbols], None, grouping, &mut out[2 * done..])
}

/// [`decode`] after [`decode_symbols`]: the upper values and lower bytes from the symbols (in
/// `upper`, overwritten) and the packed remainders.
fn decode_from_symbols(k: u32, present: &[u8; 32], upper: &mut [u8], lower: &mut [u8], packed: &[u8]) {
    if let Some(base) = contiguous_base(present) {
        unpack_range_any(k, upper, lower, packed, base);
        return;
    }
    let mut upper_of = [0u8; 256];
    let values = (0..=255u8).filter(|&v| present[v as usize / 8] & (1 << (v % 8)) != 0);
    for (j, v) in values.enumerate() {
        upper_of[j << k..(j + 1) << k].fill(v);
    }
    match k {
        1 => unpack_k::<1>(upper, lower, packed, &upper_of),
        2 => unpack_k::<2>(upper, lower, packed, &upper_of),
        _ => unpack_k::<3>(upper, lower, packed, &upper_of),
    }
}

/// [`unpack_range`] with the fastest code the CPU runs: SSSE3 blocks, then BMI2 or portable
/// words. Blocks start at multiples of 8 elements, so their packed remainders start at whole
/// bytes.
fn unpack_range_any(k: u32, upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) {
    #[cfg(target_arch = "x86_64")]
    let done = simd::unpack_range(k, upper, lower, packed, base);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    let (upper, lower) = (&mut upper[done..], &mut lower[done..]);
    let packed = &packed[done * (8 - k as usize) / 8..];
    #[cfg(target_arch = "x86_64")]
    if bmi2::unpack_range(k, upper, lower, packed, base) {
        return;
    }
    match k {
        1 => unpack_range::<1, false>(upper, lower, packed, base),
        2 => unpack_range::<2, false>(upper, lower, packed, base),
        _ => unpack_range::<3, false>(upper, lower, packed, base),
    }
}

/// Checks a pair's payloads for `symbols.len()` elements and decodes its symbols into
/// `symbols`; returns `k` and the value set.
fn decode_symbols(upper_stored: &[u8], lower_stored: &[u8], symbols: &mut [u8]) -> Result<(u32, [u8; 32])> {
    let n = symbols.len();
    if upper_stored.len() < HEAD_LEN {
        return Err(Error::Corrupt(format!("paired payload of {} bytes has no head", upper_stored.len())));
    }
    let k = upper_stored[0] as u32;
    if !(1..=MAX_K).contains(&k) {
        return Err(Error::Corrupt(format!("paired payload with k = {k} (1 to {MAX_K})")));
    }
    let present = &upper_stored[1..HEAD_LEN];
    let m = present.iter().map(|b| b.count_ones()).sum::<u32>() as usize;
    if m == 0 || m > 256 >> k {
        return Err(Error::Corrupt(format!("paired payload with {m} values for k = {k}")));
    }
    let expected = remainder_len(n, k);
    if lower_stored.len() != expected {
        return Err(Error::Corrupt(format!(
            "remainder payload of {} bytes, {expected} expected for {n} elements and k = {k}",
            lower_stored.len()
        )));
    }
    huffman::decode(&upper_stored[HEAD_LEN..], symbols)?;
    // Every symbol must name a present value: one vectorised pass, not a check per element.
    let largest = symbols.iter().fold(0u8, |a, &b| a.max(b)) as usize;
    if n > 0 && largest >= m << k {
        return Err(Error::Corrupt(format!("paired payload has a symbol outside its {m} values")));
    }
    Ok((k, present.try_into().expect("32 bytes")))
}

/// `bits` ones from bit 0 in each `lane`-bit lane of a u64.
const fn lanes(bits: u32, lane: u32) -> u64 {
    let one = (1u64 << bits) - 1;
    let mut r = 0u64;
    let mut at = 0;
    while at < 64 {
        r |= one << at;
        at += lane;
    }
    r
}

/// The remainder bits of eight elements (`8 - K` bits each, packed) spread one per byte: three
/// halving steps (4 + 4 fields, then 2 + 2 in each half, then 1 + 1), five operations each,
/// where a shift per field took 32 (and `pdep` is not in the x86-64 baseline).
#[inline(always)]
fn spread<const K: u32>(word: u64) -> u64 {
    let w = 8 - K;
    let x = (word & lanes(4 * w, 64)) | ((word >> (4 * w)) & lanes(4 * w, 64)) << 32;
    let x = (x & lanes(2 * w, 32)) | ((x >> (2 * w)) & lanes(2 * w, 32)) << 16;
    (x & lanes(w, 16)) | ((x >> w) & lanes(w, 16)) << 8
}

/// [`spread`] with BMI2's `pdep` when `PDEP` (the caller runs with BMI2 enabled): one
/// instruction.
#[inline(always)]
#[allow(unsafe_code)]
fn spread_with<const K: u32, const PDEP: bool>(word: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if PDEP {
        // SAFETY: only instantiated with `PDEP` inside `bmi2`'s functions, which run with BMI2
        // enabled and only on CPUs that have it.
        return unsafe { core::arch::x86_64::_pdep_u64(word, lanes(8 - K, 8)) };
    }
    spread::<K>(word)
}

/// [`gather`] with BMI2's `pext` when `PEXT` (the caller runs with BMI2 enabled).
#[inline(always)]
#[allow(unsafe_code)]
fn gather_with<const K: u32, const PEXT: bool>(bytes: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if PEXT {
        // SAFETY: only instantiated with `PEXT` inside `bmi2`'s functions, which run with BMI2
        // enabled and only on CPUs that have it.
        return unsafe { core::arch::x86_64::_pext_u64(bytes, lanes(8 - K, 8)) };
    }
    gather::<K>(bytes)
}

/// Entry points compiled with BMI2 enabled (`pdep` spreads eight remainders in one
/// instruction and `pext` packs them; the shifts of `spread` and `gather` took about half of
/// the decoding and a tenth of the coding of a pair).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod bmi2 {
    /// [`super::pack_remainders`] with `pext`, if the CPU has BMI2: returns whether it ran.
    pub(super) fn pack(k: u32, lower: &[u8], packed: &mut [u8]) -> bool {
        if !std::is_x86_feature_detected!("bmi2") {
            return false;
        }
        // SAFETY: the CPU has BMI2 (checked just above).
        unsafe { pack_bmi2(k, lower, packed) };
        true
    }

    /// # Safety
    /// The CPU must have BMI2.
    #[target_feature(enable = "bmi2")]
    unsafe fn pack_bmi2(k: u32, lower: &[u8], packed: &mut [u8]) {
        match k {
            1 => super::pack_k::<1, true>(lower, packed),
            2 => super::pack_k::<2, true>(lower, packed),
            _ => super::pack_k::<3, true>(lower, packed),
        }
    }

    /// [`super::unpack_range`] with `pdep`, if the CPU has BMI2: returns whether it ran.
    pub(super) fn unpack_range(k: u32, upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) -> bool {
        if !std::is_x86_feature_detected!("bmi2") {
            return false;
        }
        // SAFETY: the CPU has BMI2 (checked just above).
        unsafe { unpack_range_bmi2(k, upper, lower, packed, base) };
        true
    }

    /// # Safety
    /// The CPU must have BMI2.
    #[target_feature(enable = "bmi2")]
    unsafe fn unpack_range_bmi2(k: u32, upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) {
        match k {
            1 => super::unpack_range::<1, true>(upper, lower, packed, base),
            2 => super::unpack_range::<2, true>(upper, lower, packed, base),
            _ => super::unpack_range::<3, true>(upper, lower, packed, base),
        }
    }
}

/// [`unpack_range`] sixteen elements at a time with SSSE3 (`pshufb` is not in the x86-64
/// baseline, hence the runtime check). Why by hand: LLVM does not vectorise [`unpack_range`]'s
/// loads of `8 - K` bytes at a stride of `8 - K`, and the scalar loop (even with `pdep`) was
/// 4 ms of a 26 ms decode of a 45 MB bf16 file. Each remainder is the 16-bit window of packed
/// bytes that holds it, shifted into place by a multiply (SSE has no per-lane variable shift).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use std::arch::x86_64::*;

    /// Elements per block.
    const BLOCK: usize = 16;

    /// `pshufb` controls putting each element's 16-bit window of packed bytes in a 16-bit lane
    /// (elements 0-7 and 8-15 of a block), and the multipliers that move its field to bit 8.
    const fn windows(width: usize) -> ([[u8; 16]; 2], [[u16; 8]; 2]) {
        let mut shuffle = [[0u8; 16]; 2];
        let mut multiply = [[0u16; 8]; 2];
        let mut i = 0;
        while i < 16 {
            let bit = i * width;
            let (half, lane) = (i / 8, i % 8);
            shuffle[half][2 * lane] = (bit / 8) as u8;
            shuffle[half][2 * lane + 1] = (bit / 8 + 1) as u8;
            multiply[half][lane] = 1 << (8 - bit % 8);
            i += 1;
        }
        (shuffle, multiply)
    }

    /// Decodes whole blocks of a contiguous-range pair ([`super::unpack_range`]) if the CPU has
    /// SSSE3, and returns how many elements it did (a multiple of 16; 0 without SSSE3).
    pub(super) fn unpack_range(k: u32, upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) -> usize {
        if !std::is_x86_feature_detected!("ssse3") {
            return 0;
        }
        // SAFETY: the CPU has SSSE3 (checked just above).
        unsafe {
            match k {
                1 => blocks::<1>(upper, lower, packed, base),
                2 => blocks::<2>(upper, lower, packed, base),
                _ => blocks::<3>(upper, lower, packed, base),
            }
        }
    }

    /// Decodes whole blocks of a contiguous-range pair of a 2-byte float chunk straight into
    /// its elements ([`super::decode_elements`]) if the CPU has SSSE3; returns how many
    /// elements it did (a multiple of 16; 0 without SSSE3).
    pub(super) fn unpack_range_elements(k: u32, symbols: &[u8], packed: &[u8], base: u8, out: &mut [u8]) -> usize {
        if !std::is_x86_feature_detected!("ssse3") {
            return 0;
        }
        // Pairs of blocks with AVX2 where the CPU has it (two blocks per instruction: 1.8 ms
        // instead of 3.1 for a 45 MB bf16 file), then single blocks.
        let done = match std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            true => unsafe {
                match k {
                    1 => element_block_pairs::<1>(symbols, packed, base, out),
                    2 => element_block_pairs::<2>(symbols, packed, base, out),
                    _ => element_block_pairs::<3>(symbols, packed, base, out),
                }
            },
            false => 0,
        };
        let (symbols, out) = (&symbols[done..], &mut out[2 * done..]);
        let packed = &packed[done * (8 - k as usize) / 8..];
        // SAFETY: the CPU has SSSE3 (checked above).
        let single = unsafe {
            match k {
                1 => element_blocks::<1>(symbols, packed, base, out),
                2 => element_blocks::<2>(symbols, packed, base, out),
                _ => element_blocks::<3>(symbols, packed, base, out),
            }
        };
        done + single
    }

    /// [`element_blocks`] two blocks at a time in the two 128-bit lanes of AVX2 registers
    /// (`pshufb` shuffles within a lane, so each lane takes its block's 16 packed bytes).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn element_block_pairs<const K: u32>(symbols: &[u8], packed: &[u8], base: u8, out: &mut [u8]) -> usize {
        let width = 8 - K as usize;
        let n = symbols.len().min(out.len() / 2);
        // The second lane reads 16 bytes from `2 * width` bytes after the first.
        let pairs = (n / (2 * BLOCK)).min(match packed.len() {
            len if len >= 16 + 2 * width => (len - 16 - 2 * width) / (4 * width) + 1,
            _ => 0,
        });
        let (shuffle, multiply) = windows(width);
        let both = |bytes: &[u8; 16]| {
            // SAFETY: 16 readable bytes; the load is unaligned; the CPU has AVX2.
            unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast())) }
        };
        let words = |m: &[u16; 8]| {
            // SAFETY: 16 readable bytes; the load is unaligned; the CPU has AVX2.
            unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(m.as_ptr().cast())) }
        };
        let (shuffle_lo, shuffle_hi) = (both(&shuffle[0]), both(&shuffle[1]));
        let (multiply_lo, multiply_hi) = (words(&multiply[0]), words(&multiply[1]));
        let remainder_mask = _mm256_set1_epi8(((1u32 << width) - 1) as u8 as i8);
        let top_mask = _mm256_set1_epi8(((1u32 << K) - 1) as i8);
        let index_mask = _mm256_set1_epi8((0xFFu32 >> K) as u8 as i8);
        let bases = _mm256_set1_epi8(base as i8);
        let (b7, low7) = (_mm256_set1_epi8(0x80u8 as i8), _mm256_set1_epi8(0x7F));
        let (by_width, by_k) = (_mm_cvtsi32_si128(width as i32), _mm_cvtsi32_si128(K as i32));
        for p in 0..pairs {
            let at = p * 2 * BLOCK;
            let from = p * 4 * width;
            let first: &[u8; 16] = packed[from..from + 16].try_into().expect("16 bytes");
            let second: &[u8; 16] = packed[from + 2 * width..from + 2 * width + 16].try_into().expect("16 bytes");
            let s: &[u8; 32] = symbols[at..at + 2 * BLOCK].try_into().expect("32 bytes");
            // SAFETY: `first` and `second` are 16 readable bytes, `s` 32; unaligned loads.
            let (src, s) = unsafe {
                (
                    _mm256_set_m128i(_mm_loadu_si128(second.as_ptr().cast()), _mm_loadu_si128(first.as_ptr().cast())),
                    _mm256_loadu_si256(s.as_ptr().cast()),
                )
            };
            let low = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(src, shuffle_lo), multiply_lo), 8);
            let high = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(src, shuffle_hi), multiply_hi), 8);
            let remainders = _mm256_and_si256(_mm256_packus_epi16(low, high), remainder_mask);
            let lower = _mm256_or_si256(_mm256_sll_epi16(_mm256_and_si256(s, top_mask), by_width), remainders);
            let upper = _mm256_add_epi8(_mm256_and_si256(_mm256_srl_epi16(s, by_k), index_mask), bases);
            // Undo the exponent extraction, as in `element_blocks`.
            let top = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(upper, 1), low7), _mm256_and_si256(lower, b7));
            let bottom =
                _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(upper, 7), b7), _mm256_and_si256(lower, low7));
            // Per lane: unpacklo = its block's elements 0-7, unpackhi = 8-15.
            let (lo, hi) = (_mm256_unpacklo_epi8(bottom, top), _mm256_unpackhi_epi8(bottom, top));
            let dst: &mut [u8; 64] = (&mut out[2 * at..2 * at + 64]).try_into().expect("64 bytes");
            // SAFETY: `dst` is 64 writable bytes; the stores are unaligned.
            unsafe {
                _mm256_storeu_si256(dst.as_mut_ptr().cast(), _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256(dst.as_mut_ptr().add(32).cast(), _mm256_permute2x128_si256(lo, hi, 0x31));
            }
        }
        pairs * 2 * BLOCK
    }

    /// Whole blocks whose 16-byte read of packed remainders stays inside `packed`, for `n`
    /// elements of `width`-bit remainders.
    fn block_count(n: usize, packed: usize, width: usize) -> usize {
        (n / BLOCK).min(match packed {
            len if len >= 16 => (len - 16) / (2 * width) + 1,
            _ => 0,
        })
    }

    /// One block: the upper values and lower bytes of 16 elements from their symbols `s` and
    /// the 16 packed bytes from their remainders' start.
    ///
    /// # Safety
    /// The CPU must have SSSE3.
    #[target_feature(enable = "ssse3")]
    #[inline]
    unsafe fn block<const K: u32>(s: __m128i, src: __m128i, base: u8) -> (__m128i, __m128i) {
        let width = 8 - K as usize;
        let (shuffle, multiply) = windows(width);
        // SAFETY: the arrays are 16 readable bytes each; the loads are unaligned.
        let (shuffle_lo, shuffle_hi, multiply_lo, multiply_hi) = unsafe {
            (
                _mm_loadu_si128(shuffle[0].as_ptr().cast()),
                _mm_loadu_si128(shuffle[1].as_ptr().cast()),
                _mm_loadu_si128(multiply[0].as_ptr().cast()),
                _mm_loadu_si128(multiply[1].as_ptr().cast()),
            )
        };
        let low = _mm_srli_epi16(_mm_mullo_epi16(_mm_shuffle_epi8(src, shuffle_lo), multiply_lo), 8);
        let high = _mm_srli_epi16(_mm_mullo_epi16(_mm_shuffle_epi8(src, shuffle_hi), multiply_hi), 8);
        let remainders = _mm_and_si128(_mm_packus_epi16(low, high), _mm_set1_epi8(((1u32 << width) - 1) as u8 as i8));
        // Shift counts in registers: immediates cannot depend on `K`. 16-bit shifts: the masks
        // keep every byte's bits in that byte.
        let (by_width, by_k) = (_mm_cvtsi32_si128(width as i32), _mm_cvtsi32_si128(K as i32));
        let top = _mm_and_si128(s, _mm_set1_epi8(((1u32 << K) - 1) as i8));
        let lower = _mm_or_si128(_mm_sll_epi16(top, by_width), remainders);
        let index = _mm_and_si128(_mm_srl_epi16(s, by_k), _mm_set1_epi8((0xFFu32 >> K) as u8 as i8));
        (_mm_add_epi8(index, _mm_set1_epi8(base as i8)), lower)
    }

    /// # Safety
    /// The CPU must have SSSE3.
    #[target_feature(enable = "ssse3")]
    unsafe fn element_blocks<const K: u32>(symbols: &[u8], packed: &[u8], base: u8, out: &mut [u8]) -> usize {
        let width = 8 - K as usize;
        let blocks = block_count(symbols.len().min(out.len() / 2), packed.len(), width);
        let load = |bytes: &[u8]| {
            let bytes: &[u8; 16] = bytes.try_into().expect("16 bytes");
            // SAFETY: 16 readable bytes; the load is unaligned.
            unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
        };
        let (b7, low7) = (_mm_set1_epi8(0x80u8 as i8), _mm_set1_epi8(0x7F));
        for b in 0..blocks {
            let at = b * BLOCK;
            let s = load(&symbols[at..at + BLOCK]);
            let src = load(&packed[b * 2 * width..b * 2 * width + 16]);
            // SAFETY: the CPU has SSSE3 (this function's contract).
            let (upper, lower) = unsafe { block::<K>(s, src, base) };
            // Undo the exponent extraction (docs/format.md): the top byte is the sign and the
            // exponent's top 7 bits, the low byte the exponent's bit 0 and 7 mantissa bits.
            let top = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(upper, 1), low7), _mm_and_si128(lower, b7));
            let bottom = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(upper, 7), b7), _mm_and_si128(lower, low7));
            let dst: &mut [u8; 32] = (&mut out[2 * at..2 * at + 32]).try_into().expect("32 bytes");
            // SAFETY: `dst` is 32 writable bytes; the stores are unaligned.
            unsafe {
                _mm_storeu_si128(dst.as_mut_ptr().cast(), _mm_unpacklo_epi8(bottom, top));
                _mm_storeu_si128(dst.as_mut_ptr().add(16).cast(), _mm_unpackhi_epi8(bottom, top));
            }
        }
        blocks * BLOCK
    }

    /// # Safety
    /// The CPU must have SSSE3.
    #[target_feature(enable = "ssse3")]
    unsafe fn blocks<const K: u32>(upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) -> usize {
        let width = 8 - K as usize;
        let blocks = block_count(upper.len(), packed.len(), width);
        for b in 0..blocks {
            let at = b * BLOCK;
            let src: &[u8; 16] = packed[b * 2 * width..b * 2 * width + 16].try_into().expect("16 bytes");
            let symbols: &mut [u8; 16] = (&mut upper[at..at + BLOCK]).try_into().expect("16 bytes");
            let out: &mut [u8; 16] = (&mut lower[at..at + BLOCK]).try_into().expect("16 bytes");
            // SAFETY: `src`, `symbols` and `out` are 16 bytes each; loads and stores are
            // unaligned; the CPU has SSSE3 (this function's contract).
            unsafe {
                let (values, low) =
                    block::<K>(_mm_loadu_si128(symbols.as_ptr().cast()), _mm_loadu_si128(src.as_ptr().cast()), base);
                _mm_storeu_si128(out.as_mut_ptr().cast(), low);
                _mm_storeu_si128(symbols.as_mut_ptr().cast(), values);
            }
        }
        blocks * BLOCK
    }
}

/// The inverse of [`spread`]: the low `8 - K` bits of each byte of `bytes`, packed.
#[inline(always)]
fn gather<const K: u32>(bytes: u64) -> u64 {
    let w = 8 - K;
    let x = bytes & lanes(w, 8);
    let x = (x & lanes(w, 16)) | ((x >> 8) & lanes(w, 16)) << w;
    let x = (x & lanes(2 * w, 32)) | ((x >> 16) & lanes(2 * w, 32)) << (2 * w);
    (x & lanes(4 * w, 64)) | ((x >> 32) & lanes(4 * w, 64)) << (4 * w)
}

/// The packed remainders of elements `8 * b ..` as a u64 (eight bytes at once where the
/// payload has them: all but the last steps).
#[inline(always)]
fn packed_word(packed: &[u8], b: usize, width: usize) -> u64 {
    let at = b * width;
    match packed.get(at..at + 8) {
        Some(w) => u64::from_le_bytes(w.try_into().expect("8 bytes")),
        None => {
            let mut w = [0u8; 8];
            let rest = &packed[at..(at + 8).min(packed.len())];
            w[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(w)
        }
    }
}

/// [`unpack_k`] for a contiguous value range from `base`: the value is `base` plus the index,
/// eight elements per u64 word without a table.
#[inline(always)]
fn unpack_range<const K: u32, const PDEP: bool>(upper: &mut [u8], lower: &mut [u8], packed: &[u8], base: u8) {
    let width = 8 - K as usize;
    let top_bits = BYTES * ((1 << K) - 1);
    let index_bits = BYTES * (0xFF >> K);
    let bases = BYTES * base as u64;
    let mut ups = upper.chunks_exact_mut(8);
    let mut lows = lower.chunks_exact_mut(8);
    for (b, (u, l)) in (&mut ups).zip(&mut lows).enumerate() {
        let s = u64::from_le_bytes((&*u).try_into().expect("8 bytes"));
        let word = packed_word(packed, b, width);
        l.copy_from_slice(&(((s & top_bits) << width) | spread_with::<K, PDEP>(word)).to_le_bytes());
        u.copy_from_slice(&(((s >> K) & index_bits) + bases).to_le_bytes());
    }
    let full = upper.len() / 8;
    let (u, l) = (&mut upper[full * 8..], &mut lower[full * 8..]);
    if !u.is_empty() {
        let word = spread::<K>(packed_word(packed, full, width));
        for (j, (u, l)) in u.iter_mut().zip(l.iter_mut()).enumerate() {
            *l = ((*u & ((1 << K) - 1)) << width) | (word >> (8 * j)) as u8;
            *u = base + (*u >> K);
        }
    }
}

/// Turns the symbols in `upper` into the upper values and writes the lower bytes from the
/// symbols' low `K` bits (moved to the top of each byte) and the packed remainders, eight
/// elements per step as u64 words.
fn unpack_k<const K: u32>(upper: &mut [u8], lower: &mut [u8], packed: &[u8], upper_of: &[u8; 256]) {
    let width = 8 - K as usize;
    let top_bits = BYTES * ((1 << K) - 1);
    let mut ups = upper.chunks_exact_mut(8);
    let mut lows = lower.chunks_exact_mut(8);
    for (b, (u, l)) in (&mut ups).zip(&mut lows).enumerate() {
        let s = u64::from_le_bytes((&*u).try_into().expect("8 bytes"));
        let word = packed_word(packed, b, width);
        l.copy_from_slice(&(((s & top_bits) << width) | spread::<K>(word)).to_le_bytes());
        let mut values = 0u64;
        for j in 0..8 {
            values |= (upper_of[((s >> (8 * j)) & 0xFF) as usize] as u64) << (8 * j);
        }
        u.copy_from_slice(&values.to_le_bytes());
    }
    let full = upper.len() / 8;
    let (u, l) = (&mut upper[full * 8..], &mut lower[full * 8..]);
    if !u.is_empty() {
        let word = spread::<K>(packed_word(packed, full, width));
        for (j, (u, l)) in u.iter_mut().zip(l.iter_mut()).enumerate() {
            *l = ((*u & ((1 << K) - 1)) << width) | (word >> (8 * j)) as u8;
            *u = upper_of[*u as usize];
        }
    }
}

#[cfg(test)]
mod tests;
