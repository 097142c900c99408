//! Choosing a [`Method`] for one byte group of one chunk from cheap statistics, without trying
//! every coder. One pass builds a byte histogram (which gives the zero count and an estimate of
//! the Huffman size); only when zeros are common does a second pass measure the longest zero run.
//!
//! Rules (ZipNN's findings, thresholds tuned on the corpus: docs/BENCHMARKS.md, "method choice"):
//! - every byte zero: `Zero`;
//! - zeros at least `zstd_zero_fraction` of the group, or a zero run at least `zstd_zero_run` of
//!   it: `Sparse`, zero-run tokens coded by zstd (Huffman cannot spend less than one bit per
//!   byte; zstd can), which the coder turns into plain `Zstd` when the tokens do not pay;
//! - zeros common (at least `zstd_zero_run` of the group): compare a zstd size estimate (zero runs
//!   as matches at `zstd_sequence_cost` bytes each, the rest as literals at order-0 entropy) with
//!   the Huffman estimate and take `Sparse` when it is smaller;
//! - estimated Huffman size at least `raw_fraction` of the group: `Raw`;
//! - otherwise `Huffman`.
//!
//! The coders still verify the choice: a Huffman or zstd result that is not smaller than the
//! input is stored `Raw`.
//!
//! Why `Sparse` and not plain `Zstd` for these groups: on the corpus's XOR deltas, the groups
//! this rule picks code 14–19% smaller as tokens, and decode plus XOR into a chain runs about 3×
//! faster, because only the nonzero bytes are expanded and touched (docs/BENCHMARKS.md).

use super::Method;

/// How methods are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Selection {
    /// From statistics (the default).
    Auto,
    /// Try Huffman, zstd, sparse and raw and keep the smallest (slow; used to tune and check
    /// `Auto`).
    Exhaustive,
    /// Always try this method, falling back when it does not pay: sparse to zstd, any method to
    /// raw; `Only(Zero)` stores all-zero groups as zero and everything else raw.
    Only(Method),
}

/// How hard the coder works for ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Today's speed targets: rANS only where statistics predict a clear win, order-0; the two
    /// groups of a 2-byte float chunk coded as a pair ([`super::paired`]) where estimated smaller.
    #[default]
    Default,
    /// Every group that is not all zero is also tried with rANS with up to 16 contexts from
    /// the previous byte, the same element's higher byte groups or (deltas) the reference's
    /// bytes, and the smaller coding kept: slower to compress, decodes at rANS speed.
    Max,
}

impl Level {
    /// The level's name in the CLI and config (`default`, `max`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Default => "default",
            Level::Max => "max",
        }
    }
}

impl std::str::FromStr for Level {
    type Err = super::Error;
    fn from_str(s: &str) -> Result<Level, super::Error> {
        match s {
            "default" => Ok(Level::Default),
            "max" => Ok(Level::Max),
            other => Err(super::Error::InvalidInput(format!("unknown compression level {other:?} (default, max)"))),
        }
    }
}

/// Codec settings. `Default` gives the tuned values.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Bytes of input per chunk: a power of two, 4 KiB ..= 4 MiB ([`super::chunk::is_valid_chunk_size`]).
    pub chunk_size: usize,
    /// zstd level for groups coded with zstd (plain or as sparse tokens).
    pub zstd_level: i32,
    /// How methods are picked.
    pub selection: Selection,
    /// Fraction of zero bytes from which sparse tokens (zstd) are chosen.
    pub zstd_zero_fraction: f64,
    /// Longest zero run, as a fraction of the group, from which sparse tokens (zstd) are chosen.
    pub zstd_zero_run: f64,
    /// Estimated bytes a zero run of 4 or more costs as a sparse token (see [`zstd_estimate`]).
    pub zstd_sequence_cost: f64,
    /// Factor on the entropy of zstd literals (see [`zstd_estimate`]).
    pub zstd_literal_penalty: f64,
    /// Estimated Huffman size, as a fraction of the group, from which the group is stored raw.
    pub raw_fraction: f64,
    /// After a group is stored raw, the same group of this many following chunks (of the same
    /// stripe) is stored raw without looking at it. 0 disables skipping.
    pub skip_after_raw: u32,
    /// How hard to work for ratio (see [`Level`]).
    pub level: Level,
    /// At the default level, rANS is tried on a group when its estimated order-0 size is below
    /// this fraction of what the chosen method stored.
    pub rans_gain: f64,
}

/// Largest chunk size the container accepts; bounds every decode buffer.
pub(crate) const MAX_CHUNK_SIZE: usize = 4 << 20;
/// Smallest chunk size.
pub(crate) const MIN_CHUNK_SIZE: usize = 4 << 10;

impl Default for Options {
    fn default() -> Self {
        Options {
            chunk_size: 256 << 10,
            zstd_level: 1,
            selection: Selection::Auto,
            zstd_zero_fraction: 0.90,
            zstd_zero_run: 0.03,
            zstd_sequence_cost: 1.5,
            zstd_literal_penalty: 1.20,
            raw_fraction: 0.985,
            skip_after_raw: 8,
            level: Level::Default,
            rans_gain: 0.85,
        }
    }
}

/// Statistics of one byte group.
#[derive(Clone, Debug)]
pub struct GroupStats {
    /// Bytes in the group.
    pub len: usize,
    /// Occurrences of each byte value.
    pub histogram: [u32; 256],
}

impl GroupStats {
    /// Builds the histogram of `group` (at most `u32::MAX` bytes; chunks are far smaller).
    pub fn of(group: &[u8]) -> GroupStats {
        // Eight sub-histograms fed from two 8-byte loads per step, so runs of equal bytes (XOR
        // deltas are mostly zeros) do not serialise on one counter's store-to-load chain:
        // measured 2.25 -> 2.8 GiB/s on 80%-zero data, unchanged on noise, against four
        // sub-histograms fed byte by byte.
        let mut h = [[0u32; 256]; 8];
        let mut blocks = group.chunks_exact(16);
        for block in &mut blocks {
            let lo = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            let hi = u64::from_le_bytes(block[8..].try_into().expect("8 bytes"));
            for (k, table) in h.iter_mut().enumerate() {
                table[((lo >> (8 * k)) & 0xFF) as usize] += 1;
            }
            for (k, table) in h.iter_mut().enumerate() {
                table[((hi >> (8 * k)) & 0xFF) as usize] += 1;
            }
        }
        for &b in blocks.remainder() {
            h[0][b as usize] += 1;
        }
        let mut histogram = [0u32; 256];
        for (i, slot) in histogram.iter_mut().enumerate() {
            *slot = h.iter().map(|t| t[i]).sum();
        }
        GroupStats { len: group.len(), histogram }
    }

    /// Number of zero bytes.
    pub fn zeros(&self) -> usize {
        self.histogram[0] as usize
    }

    /// Order-0 entropy of the group in bits (the bound for any per-byte coder).
    pub(crate) fn entropy_bits(&self) -> f64 {
        let n = self.len as f64;
        self.histogram
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let c = c as f64;
                c * (n / c).log2()
            })
            .sum()
    }

    /// Estimated Huffman size in bytes: entropy with a floor of one bit per symbol (a prefix code
    /// cannot do better), plus the code table.
    pub(crate) fn huffman_estimate(&self) -> f64 {
        let n = self.len as f64;
        let mut bits = 0.0;
        let mut distinct = 0usize;
        for &c in self.histogram.iter().filter(|&&c| c > 0) {
            let c = c as f64;
            bits += c * (n / c).log2().max(1.0);
            distinct += 1;
        }
        bits / 8.0 + distinct as f64 / 2.0 + 8.0
    }
}

/// Zero runs of a group: how many runs of at least [`MIN_ZERO_RUN`] bytes, how many zeros they
/// hold, and the longest run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroRuns {
    /// Runs of at least `MIN_ZERO_RUN` zeros.
    pub runs: usize,
    /// Zero bytes inside those runs.
    pub zeros_in_runs: usize,
    /// Length of the longest run of zeros (any length).
    pub longest: usize,
}

/// Shortest zero run the sparse coder turns into a token rather than keeping it in literals.
pub const MIN_ZERO_RUN: usize = super::sparse::MIN_ZERO_RUN;

/// Scans `group` for runs of zero bytes.
///
/// Works on 64-byte blocks turned into a bit mask (bit `i` set: byte `i` is zero) and counts
/// runs with bit operations. A byte-at-a-time loop branches on every byte, and on XOR deltas
/// (zeros and non-zeros interleaved at random) mispredicted branches made it 40% of commit time.
pub(crate) fn zero_runs(group: &[u8]) -> ZeroRuns {
    let mut r = ZeroRuns::default();
    // Length of the zero run still open at the end of what has been scanned.
    let mut open = 0usize;
    let close = |run: usize, r: &mut ZeroRuns| {
        if run >= MIN_ZERO_RUN {
            r.runs += 1;
            r.zeros_in_runs += run;
        }
        r.longest = r.longest.max(run);
    };
    let mut blocks = group.chunks_exact(64);
    for block in &mut blocks {
        let m = zero_mask(block.try_into().expect("64-byte block"));
        if m == u64::MAX {
            open += 64;
            continue;
        }
        // m has a clear bit, so the low and high runs of ones are separate.
        let low = m.trailing_ones() as usize;
        let high = m.leading_ones() as usize;
        close(open + low, &mut r);
        let low_mask = if low == 0 { 0 } else { u64::MAX >> (64 - low) };
        let high_mask = if high == 0 { 0 } else { u64::MAX << (64 - high) };
        let inner = m & !low_mask & !high_mask;
        if inner != 0 {
            // Bytes in runs of at least 4 zeros that lie wholly inside the block.
            let starts = inner & (inner >> 1) & (inner >> 2) & (inner >> 3);
            let in_runs = starts | (starts << 1) | (starts << 2) | (starts << 3);
            r.zeros_in_runs += in_runs.count_ones() as usize;
            r.runs += (in_runs & !(in_runs << 1)).count_ones() as usize;
            if r.longest < 64 && has_run_longer_than(inner, r.longest) {
                // Longest run of ones in `inner`: each step shortens every run by one.
                let (mut x, mut longest) = (inner, 0);
                while x != 0 {
                    x &= x >> 1;
                    longest += 1;
                }
                r.longest = r.longest.max(longest);
            }
        }
        open = high;
    }
    for &b in blocks.remainder() {
        if b == 0 {
            open += 1;
        } else {
            close(open, &mut r);
            open = 0;
        }
    }
    close(open, &mut r);
    r
}

/// Bit `i` of the result is set when `block[i]` is zero.
fn zero_mask(block: &[u8; 64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: SSE2 is part of the x86-64 baseline; the four unaligned 16-byte loads read
    // `block[0..64]`, which is in bounds.
    unsafe {
        use std::arch::x86_64::*;
        let zero = _mm_setzero_si128();
        let lane = |k: usize| {
            let v = _mm_loadu_si128(block.as_ptr().add(16 * k).cast());
            _mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)) as u16 as u64
        };
        lane(0) | (lane(1) << 16) | (lane(2) << 32) | (lane(3) << 48)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        block.iter().enumerate().fold(0u64, |m, (i, &b)| m | (u64::from(b == 0) << i))
    }
}

/// Whether `x` has a run of more than `len` (< 64) consecutive one bits. Doubling shifts take
/// O(log len) steps, where measuring the longest run takes one step per bit of it: on XOR deltas
/// the longest in-block run soon stops growing, and most blocks are then settled by this test
/// (measuring every block was 8% of a delta commit).
fn has_run_longer_than(x: u64, len: usize) -> bool {
    // Invariant: bit i of `y` is set iff bits i..i + covered of `x` are all set.
    let (mut y, mut covered) = (x, 1usize);
    let target = len + 1;
    while covered < target && y != 0 {
        let step = covered.min(target - covered);
        y &= y >> step;
        covered += step;
    }
    y != 0
}

/// Estimated size in bytes of a group with these statistics as sparse tokens coded by zstd:
/// each zero run of at least [`MIN_ZERO_RUN`] becomes a token (about
/// `options.zstd_sequence_cost` bytes once zstd has coded its two lengths), everything else is
/// literals at their order-0 entropy times `options.zstd_literal_penalty` (zstd codes the
/// literals together with the token lengths, and adds block headers). Tuned with
/// `benches/method_table.sh`: the decision sits on a sharp edge (sequence cost 1.25 or 1.75
/// instead of 1.5 moves the worst gap to exhaustive from 0.36% to 1.4–2%), because the
/// mid-training delta groups of one tensor have similar statistics and flip together.
pub fn zstd_estimate(stats: &GroupStats, runs: &ZeroRuns, options: &Options) -> f64 {
    let mut literal_hist = stats.histogram;
    literal_hist[0] -= runs.zeros_in_runs as u32;
    let literals: f64 = literal_hist.iter().map(|&c| c as f64).sum();
    let mut bits = 0.0;
    for &c in literal_hist.iter().filter(|&&c| c > 0) {
        let c = c as f64;
        bits += c * (literals / c).log2();
    }
    bits / 8.0 * options.zstd_literal_penalty + runs.runs as f64 * options.zstd_sequence_cost + 64.0
}

/// The method `Auto` selection predicts for `group`.
pub fn predict(group: &[u8], options: &Options) -> Method {
    predict_with_stats(group, options).0
}

/// [`predict`], also returning the group's histogram when it was needed (the Huffman coder
/// reuses it instead of counting the bytes again).
///
/// A group that is all or mostly zeros (the exponent bytes of an XOR delta late in training) is
/// decided from its zero count alone, taken with a cheap vector scan, without the histogram,
/// which costs several times more per byte. The scan runs only when the group's first
/// 4 KiB (`ZERO_SAMPLE`) are at least half zeros: on the groups of a standalone float tensor,
/// which hold few zeros, it was 2.5% of `ckpt compress` for nothing. When the sample misses
/// (zeros only further on), the histogram's zero count decides the same way, so the choice
/// never depends on the sample.
pub fn predict_with_stats(group: &[u8], options: &Options) -> (Method, Option<GroupStats>) {
    let n = group.len();
    let mostly_zero = |zeros: usize| zeros as f64 >= options.zstd_zero_fraction * n as f64;
    if sample_is_half_zero(group) {
        let zeros = count_zeros(group);
        if zeros == n {
            return (Method::Zero, None);
        }
        if mostly_zero(zeros) {
            return (Method::Sparse, None);
        }
    }
    predict_from_stats(group, GroupStats::of(group), options)
}

/// [`predict_with_stats`] for a group whose statistics the caller has already (a pair's upper
/// group, counted through the pair's symbols).
pub(crate) fn predict_from_stats(group: &[u8], stats: GroupStats, options: &Options) -> (Method, Option<GroupStats>) {
    let n = group.len();
    let method = match stats.zeros() {
        zeros if zeros == n => Method::Zero,
        zeros if zeros as f64 >= options.zstd_zero_fraction * n as f64 => Method::Sparse,
        _ => predict_from(group, &stats, options),
    };
    (method, Some(stats))
}

/// Bytes at the start of a group that [`predict_with_stats`] looks at to decide whether to
/// count its zeros before building its histogram.
const ZERO_SAMPLE: usize = 4096;

/// Whether the first 4 KiB of `group` are at least half zeros: the cheap test
/// that sends a group (a delta's exponents) down the zero-count path instead of a histogram.
pub(crate) fn sample_is_half_zero(group: &[u8]) -> bool {
    let sample = &group[..group.len().min(ZERO_SAMPLE)];
    count_zeros(sample) * 2 >= sample.len()
}

/// The rest of [`predict_with_stats`], for a group that is not mostly zeros.
fn predict_from(group: &[u8], stats: &GroupStats, options: &Options) -> Method {
    let nf = group.len() as f64;
    let zeros = stats.zeros();
    let huffman = stats.huffman_estimate();
    // Zero runs only matter when zeros are common: skip the second pass otherwise.
    if zeros as f64 >= options.zstd_zero_run * nf {
        let runs = zero_runs(group);
        if runs.longest as f64 >= options.zstd_zero_run * nf || zstd_estimate(stats, &runs, options) < huffman {
            return Method::Sparse;
        }
    }
    if huffman >= options.raw_fraction * nf {
        return Method::Raw;
    }
    Method::Huffman
}

/// Number of zero bytes in `bytes`: per 64-byte block, the popcount of [`zero_mask`].
fn count_zeros(bytes: &[u8]) -> usize {
    let mut blocks = bytes.chunks_exact(64);
    let mut zeros: usize =
        (&mut blocks).map(|b| zero_mask(b.try_into().expect("64-byte block")).count_ones() as usize).sum();
    zeros += blocks.remainder().iter().filter(|&&b| b == 0).count();
    zeros
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicts_each_method() {
        let o = Options::default();
        assert_eq!(predict(&[0u8; 1000], &o), Method::Zero);
        let mostly_zero: Vec<u8> = (0..1000).map(|i| if i % 20 == 0 { 7 } else { 0 }).collect();
        assert_eq!(predict(&mostly_zero, &o), Method::Sparse);
        let mut run = vec![0u8; 1000];
        for (i, b) in run.iter_mut().enumerate() {
            *b = (i * 37 % 255 + 1) as u8;
        }
        run[100..200].fill(0);
        assert_eq!(predict(&run, &o), Method::Sparse, "a run of 10% zeros");
        let noise: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        assert_eq!(predict(&noise, &o), Method::Raw);
        let skewed: Vec<u8> =
            (0..4096u32).map(|i| [120u8, 121, 122, 119][(i.wrapping_mul(2654435761) >> 30) as usize]).collect();
        assert_eq!(predict(&skewed, &o), Method::Huffman);
    }

    /// The definition: one byte at a time.
    fn zero_runs_by_definition(group: &[u8]) -> ZeroRuns {
        let mut r = ZeroRuns::default();
        let mut run = 0usize;
        for &b in group.iter().chain([1u8].iter()) {
            if b == 0 {
                run += 1;
                continue;
            }
            if run >= MIN_ZERO_RUN {
                r.runs += 1;
                r.zeros_in_runs += run;
            }
            r.longest = r.longest.max(run);
            run = 0;
        }
        r
    }

    proptest::proptest! {
        /// Random densities of zeros (so runs of every length, across 64-byte block edges) and
        /// lengths that are not multiples of the block.
        #[test]
        fn zero_runs_match_the_definition(len in 0usize..700, zero_per_mille in 0u32..=1000, seed in proptest::prelude::any::<u64>()) {
            let mut state = seed | 1;
            let group: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    if (state % 1000) < u64::from(zero_per_mille) { 0 } else { (state >> 32) as u8 | 1 }
                })
                .collect();
            proptest::prop_assert_eq!(zero_runs(&group), zero_runs_by_definition(&group));
            proptest::prop_assert_eq!(count_zeros(&group), group.iter().filter(|&&b| b == 0).count());

            let by_definition = group.iter().fold([0u32; 256], |mut h, &b| { h[b as usize] += 1; h });
            proptest::prop_assert_eq!(GroupStats::of(&group).histogram, by_definition);
        }
    }

    proptest::proptest! {
        /// Random words with a planted run of ones of every length, at every position.
        #[test]
        fn run_test_matches_measuring(noise in proptest::prelude::any::<u64>(), ones in 0u32..=64, at in 0u32..64) {
            let run = if ones == 64 { u64::MAX } else { ((1u64 << ones) - 1).rotate_left(at) };
            let x = (noise & noise.rotate_left(1)) | run;
            let (mut y, mut longest) = (x, 0);
            while y != 0 { y &= y >> 1; longest += 1; }
            for len in 0..64 {
                proptest::prop_assert_eq!(has_run_longer_than(x, len), longest > len, "{:#x} {}", x, len);
            }
        }
    }

    #[test]
    fn zero_runs_across_blocks() {
        let mut g = vec![1u8; 300];
        g[60..200].fill(0); // one run over three blocks
        g[250..254].fill(0); // a run of exactly 4
        g[256..258].fill(0); // too short to count, but a run
        let r = zero_runs(&g);
        assert_eq!(r, ZeroRuns { runs: 2, zeros_in_runs: 144, longest: 140 });
        assert_eq!(zero_runs(&[0u8; 128]), ZeroRuns { runs: 1, zeros_in_runs: 128, longest: 128 });
    }

    /// The zero count runs only when the first 4 KiB look zero-heavy; a group whose zeros come
    /// after a dense start is still decided by its zeros (from the histogram), as before.
    #[test]
    fn mostly_zero_groups_are_sparse_wherever_their_zeros_are() {
        let o = Options::default();
        let mut late = vec![0u8; 100_000];
        late[..5000].fill(7);
        let mut early = late.clone();
        early.reverse();
        assert_eq!(predict(&late, &o), Method::Sparse);
        assert_eq!(predict(&early, &o), Method::Sparse);
    }

    #[test]
    fn entropy_of_uniform_pair_is_one_bit_per_byte() {
        let s = GroupStats::of(&[1, 2, 1, 2, 1, 2, 1, 2]);
        assert!((s.entropy_bits() - 8.0).abs() < 1e-9);
        assert_eq!(zero_runs(&[0, 0, 1, 0, 0, 0, 2]).longest, 3);
        assert_eq!(zero_runs(&[]).longest, 0);
    }
}
