//! Finding a grid ([`detect`], on a sample of a tensor) and fitting it to one chunk
//! (`fit_chunk`: a scale per group, a code per element, escapes for the rest).
//!
//! A group's scale is not recovered as "the" quantizer's scale (the rounding to bf16 loses
//! it): any f32 that reproduces the values works. Each value `v = round(q × s)` bounds `s` to
//! the rounding interval of `v` divided by `q`; the encoder intersects those intervals, starting
//! from the largest code (the tightest), takes the f32 with the fewest significant bits in the
//! intersection, and then checks every element in the decoder's arithmetic
//! ([`super::element_bits`]): what does not come back bit-exact is an escape.

use super::{element_bits, fp8_value, supports, Arithmetic, Codes, GridChunk, Layout};
use crate::codec::cross_precision::{bf16_to_f32, f16_to_f32};
use crate::dtype::Dtype;

/// A grid found for a tensor: how its chunks are fitted and coded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GridPlan {
    /// The tensor's dtype (BF16, F16 or F32).
    pub dtype: Dtype,
    /// Which elements share a scale.
    pub layout: Layout,
    /// How values are recomputed.
    pub arithmetic: Arithmetic,
    /// What the codes are.
    pub codes: Codes,
    /// Integer code bits (8 for fp8).
    pub bits: u8,
    /// Whether the integer codes have a zero point (the scale spans `2^bits − 1` steps from the
    /// group's minimum to its maximum) rather than being symmetric (`±(2^(bits−1) − 1)`).
    pub zero_point: bool,
}

impl GridPlan {
    /// The first guess at a group's scale from its finite values' extremes.
    fn first_scale(&self, stats: &Extremes) -> f64 {
        match self.codes {
            Codes::Fp8E4m3 => stats.absmax / 448.0,
            Codes::Fp8E5m2 => stats.absmax / 57344.0,
            _ if self.zero_point => (stats.max - stats.min) / f64::from((1u32 << self.bits) - 1),
            _ => stats.absmax / f64::from((1u32 << (self.bits - 1)) - 1),
        }
    }
}

/// Finite extremes of a group, with the elements that hold them.
#[derive(Clone, Copy, Debug)]
struct Extremes {
    absmax: f64,
    min: f64,
    max: f64,
    /// (position, bits) of the minimum and of the maximum.
    at: [(u32, u32); 2],
}

impl Extremes {
    const EMPTY: Extremes = Extremes { absmax: 0.0, min: 0.0, max: 0.0, at: [(u32::MAX, 0); 2] };

    fn add(&mut self, pos: u32, bits: u32, v: f64) {
        if !v.is_finite() {
            return;
        }
        if self.at[0].0 == u32::MAX {
            (self.min, self.max, self.at) = (v, v, [(pos, bits); 2]);
        }
        self.absmax = self.absmax.max(v.abs());
        if v < self.min {
            (self.min, self.at[0]) = (v, (pos, bits));
        }
        if v > self.max {
            (self.max, self.at[1]) = (v, (pos, bits));
        }
    }
}

/// Element `bits` of `dtype` as a value.
#[inline]
pub(crate) fn value_of(bits: u32, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Bf16 => f64::from(f32::from_bits(bf16_to_f32(bits as u16))),
        Dtype::F16 => f64::from(f32::from_bits(f16_to_f32(bits as u16))),
        _ => f64::from(f32::from_bits(bits)),
    }
}

/// Element `i` of `data` (little-endian `width`-byte elements) as bits.
#[inline]
pub(crate) fn bits_at(data: &[u8], width: usize, i: usize) -> u32 {
    match width {
        2 => u32::from(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])),
        _ => u32::from_le_bytes(data[4 * i..4 * i + 4].try_into().expect("4 bytes")),
    }
}

/// The reals that round to `bits` in `dtype`: [lower, upper] (ties either way; the exact check
/// decides).
fn rounding_interval(bits: u32, dtype: Dtype) -> (f64, f64) {
    let (sign, mag_mask) = match dtype {
        Dtype::F32 => (0x8000_0000u32, 0x7FFF_FFFFu32),
        _ => (0x8000, 0x7FFF),
    };
    let key = |b: u32| -> i64 {
        if b & sign != 0 {
            -i64::from(b & mag_mask)
        } else {
            i64::from(b & mag_mask)
        }
    };
    let from_key = |k: i64| -> u32 {
        if k < 0 {
            sign | (-k) as u32
        } else {
            k as u32
        }
    };
    let k = key(bits);
    let v = value_of(bits, dtype);
    let (mut below, mut above) = (value_of(from_key(k - 1), dtype), value_of(from_key(k + 1), dtype));
    if above.is_infinite() {
        above = v + (v - below);
    }
    if below.is_infinite() {
        below = v - (above - v);
    }
    ((below + v) / 2.0, (v + above) / 2.0)
}

/// The f32 with the fewest significant bits in `[lo, hi]` (0 < lo ≤ hi), if any.
fn simplest_f32(lo: f64, hi: f64) -> Option<f32> {
    let mut a = lo as f32;
    if f64::from(a) < lo {
        a = f32::from_bits(a.to_bits() + 1);
    }
    let mut b = hi as f32;
    if f64::from(b) > hi {
        b = f32::from_bits(b.to_bits() - 1);
    }
    if !(a.is_finite() && b.is_finite()) || a > b || a <= 0.0 {
        return None;
    }
    let (a, b) = (a.to_bits(), b.to_bits());
    (0..31u32).rev().find_map(|k| {
        let step = 1u32 << k;
        let c = a.checked_add(step - 1)? & !(step - 1);
        (c <= b).then(|| f32::from_bits(c))
    })
}

/// The nearest code to `x` (a value divided by the scale) and its value.
#[inline]
fn nearest_code(x: f64, codes: Codes) -> Option<(i32, f32)> {
    match codes {
        Codes::Signed | Codes::Offset | Codes::SignedZero => {
            let n = x.round();
            (n.abs() <= 255.0).then_some((n as i32, n as f32))
        }
        Codes::Fp8E4m3 | Codes::Fp8E5m2 => {
            let table = fp8_table(codes);
            let i = table.partition_point(|&(v, _)| f64::from(v) < x);
            let pick = [i.checked_sub(1), Some(i)]
                .into_iter()
                .flatten()
                .filter_map(|j| table.get(j))
                .min_by(|p, q| (f64::from(p.0) - x).abs().total_cmp(&(f64::from(q.0) - x).abs()))?;
            Some((i32::from(pick.1), pick.0))
        }
    }
}

/// The finite values of an fp8 kind, ascending, with their codes (-0 left out).
fn fp8_table(codes: Codes) -> &'static [(f32, u8)] {
    use std::sync::OnceLock;
    static E4M3: OnceLock<Vec<(f32, u8)>> = OnceLock::new();
    static E5M2: OnceLock<Vec<(f32, u8)>> = OnceLock::new();
    let (cell, exp_bits) = if codes == Codes::Fp8E4m3 { (&E4M3, 4) } else { (&E5M2, 5) };
    cell.get_or_init(|| {
        let mut t: Vec<(f32, u8)> =
            (0..=255u8).filter(|&c| c != 0x80).filter_map(|c| fp8_value(c, exp_bits).map(|v| (v, c))).collect();
        t.sort_by(|p, q| p.0.total_cmp(&q.0));
        t
    })
}

/// A group's elements: position in the chunk and bits.
type Elements = [(u32, u32)];

/// The scale of one group: intersects the rounding intervals of its values under codes
/// estimated from `s0`, largest code first.
fn solve_scale(elements: &Elements, plan: &GridPlan, s0: f64) -> Option<f32> {
    let estimates: Vec<(f64, f64, u32)> = elements
        .iter()
        .filter_map(|&(_, bits)| {
            let v = value_of(bits, plan.dtype);
            let (_, q) = nearest_code(v / s0, plan.codes)?;
            (v.is_finite() && q != 0.0).then_some((f64::from(q), v, bits))
        })
        .collect();
    let start = estimates.iter().max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()))?;
    // Each interval is narrowed by a thousandth of its width at both ends: a scale on an end
    // would make that element a tie (which rounding to even may send either way), or, where the
    // product is rounded to f32 first, fall just outside.
    let interval = |&(q, _, bits): &(f64, f64, u32)| {
        let (lo, hi) = rounding_interval(bits, plan.dtype);
        let margin = (hi - lo) / 1024.0;
        let (lo, hi) = (lo + margin, hi - margin);
        if q > 0.0 {
            (lo / q, hi / q)
        } else {
            (hi / q, lo / q)
        }
    };
    let (mut lo, mut hi) = interval(start);
    for e in &estimates {
        let (a, b) = interval(e);
        if a <= hi && b >= lo {
            (lo, hi) = (lo.max(a), hi.min(b));
        }
    }
    if lo <= 0.0 {
        return None;
    }
    simplest_f32(lo, hi)
}

/// A group's scale and offset from its extremes and a sample of its elements (which holds the
/// extremes).
fn group_scale(sample: &Elements, stats: &Extremes, plan: &GridPlan) -> (f32, u8) {
    let s0 = plan.first_scale(stats);
    let mut scale = 0.0f32;
    if s0 > 0.0 && s0.is_finite() {
        scale = solve_scale(sample, plan, s0).unwrap_or(s0 as f32);
        // A second pass with codes from the better scale.
        if let Some(better) = solve_scale(sample, plan, f64::from(scale)) {
            scale = better;
        }
    }
    let offset = match plan.codes {
        Codes::Offset if scale > 0.0 => (-(stats.min / f64::from(scale)).round().clamp(-255.0, 0.0)) as u8,
        _ => 0,
    };
    (scale, offset)
}

/// The code byte that reproduces `bits` exactly, if any (the nearest code, then its
/// neighbours).
#[inline]
fn code_for(bits: u32, scale: f32, offset: u8, plan: &GridPlan) -> Option<u8> {
    let v = value_of(bits, plan.dtype);
    if !v.is_finite() {
        return None;
    }
    if v == 0.0 && v.is_sign_negative() {
        let code = match plan.codes {
            Codes::SignedZero | Codes::Fp8E4m3 | Codes::Fp8E5m2 => 0x80,
            Codes::Signed | Codes::Offset => return None,
        };
        return (element_bits(-0.0, scale, plan.dtype, plan.arithmetic) == bits).then_some(code);
    }
    let (n, _) = if scale > 0.0 { nearest_code(v / f64::from(scale), plan.codes)? } else { (0, 0.0) };
    let candidates: &[i32] = match plan.codes {
        Codes::Signed | Codes::Offset | Codes::SignedZero => &[0, 1, -1],
        _ => &[0],
    };
    for d in candidates {
        let code = match plan.codes {
            Codes::Signed => i8::try_from(n + d).ok()? as u8,
            Codes::SignedZero => i8::try_from(n + d).ok().filter(|&c| c != i8::MIN)? as u8,
            Codes::Offset => {
                let n = n + d;
                if n < -i32::from(offset) || n > 255 - i32::from(offset) {
                    continue;
                }
                n as u8
            }
            _ => n as u8,
        };
        let q = plan.codes.value(code, offset)?;
        if element_bits(q, scale, plan.dtype, plan.arithmetic) == bits {
            return Some(code);
        }
    }
    None
}

/// A grid fitted to a whole tensor: its plan and every group's scale (and offset).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorGrid {
    /// The grid.
    pub plan: GridPlan,
    scales: Vec<f32>,
    offsets: Vec<u8>,
}

/// Elements of a group sampled for its scale: the first ones and its extremes.
const SAMPLE_ELEMENTS: usize = 1 << 16;

/// The rows of group `g` that lie in a tensor of `n` elements: ranges of element indices.
fn group_ranges(layout: &Layout, n: u64, g: u64) -> impl Iterator<Item = std::ops::Range<u64>> + '_ {
    let per_row = layout.cols.div_ceil(layout.k_col);
    let (block_row, block_col) = (g / per_row, g % per_row);
    let c0 = block_col * layout.k_col;
    let c1 = (c0 + layout.k_col).min(layout.cols);
    let rows = block_row.saturating_mul(layout.k_row)..(block_row + 1).saturating_mul(layout.k_row);
    rows.map(move |row| (row * layout.cols + c0).min(n)..(row * layout.cols + c1).min(n)).take_while(|r| !r.is_empty())
}

/// Group `g`'s extremes (over all of it) and a sample of at most `cap` of its elements that
/// holds them; positions are element indices in the tensor.
fn sample_group(data: &[u8], plan: &GridPlan, g: u64, cap: usize) -> (Extremes, Vec<(u32, u32)>) {
    let width = plan.dtype.size();
    let n = (data.len() / width) as u64;
    let mut stats = Extremes::EMPTY;
    let mut sample = Vec::new();
    for range in group_ranges(&plan.layout, n, g) {
        for i in range {
            let bits = bits_at(data, width, i as usize);
            stats.add(i as u32, bits, value_of(bits, plan.dtype));
            if sample.len() < cap {
                sample.push((i as u32, bits));
            }
        }
    }
    for e in stats.at {
        if e.0 != u32::MAX && !sample.contains(&e) {
            sample.push(e);
        }
    }
    (stats, sample)
}

/// Fits `plan` to a whole tensor: each group's scale from its extremes and a sample of it.
pub fn fit_tensor(data: &[u8], plan: &GridPlan) -> TensorGrid {
    use rayon::prelude::*;
    let n = (data.len() / plan.dtype.size()) as u64;
    let groups = if n == 0 { 0 } else { plan.layout.group_of(n - 1) as u64 + 1 };
    let fitted: Vec<(f32, u8)> = (0..groups)
        .into_par_iter()
        .map(|g| {
            let (stats, sample) = sample_group(data, plan, g, SAMPLE_ELEMENTS);
            group_scale(&sample, &stats, plan)
        })
        .collect();
    let offsets = if plan.codes == Codes::Offset { fitted.iter().map(|f| f.1).collect() } else { Vec::new() };
    TensorGrid { plan: *plan, scales: fitted.into_iter().map(|f| f.0).collect(), offsets }
}

/// Codes a chunk of `data` whose first element is element `first_element` of the tensor
/// `grid` was fitted to. `None` when its groups cannot be numbered within it or are not the
/// tensor's.
pub(crate) fn fit_chunk(grid: &TensorGrid, first_element: u64, data: &[u8]) -> Option<GridChunk> {
    let plan = &grid.plan;
    let width = plan.dtype.size();
    let m = data.len() / width;
    let layout = plan.layout;
    first_element.checked_add(m as u64)?;
    let (mut first, mut last) = (u128::MAX, 0u128);
    let mut pos = 0u64;
    while pos < m as u64 {
        let g = layout.group_of(first_element + pos);
        (first, last) = (first.min(g), last.max(g));
        pos += layout.run_from(first_element + pos).min(m as u64 - pos);
    }
    if m == 0 || last >= grid.scales.len() as u128 || last - first >= m as u128 {
        return None;
    }
    let (first, last) = (first as usize, last as usize);
    let mut chunk = GridChunk {
        plan: *plan,
        first_element,
        first_group: first as u64,
        scales: grid.scales[first..=last].to_vec(),
        offsets: grid.offsets.get(first..=last).map(<[u8]>::to_vec).unwrap_or_default(),
        codes: vec![0; m],
        escapes: Vec::new(),
    };
    let mut pos = 0u64;
    while pos < m as u64 {
        let i = first_element + pos;
        let run = layout.run_from(i).min(m as u64 - pos) as usize;
        let g = layout.group_of(i) as usize;
        let (scale, offset) = (grid.scales[g], grid.offsets.get(g).copied().unwrap_or(0));
        for p in pos as usize..pos as usize + run {
            let bits = bits_at(data, width, p);
            match code_for(bits, scale, offset, plan) {
                Some(c) => chunk.codes[p] = c,
                None => chunk.escapes.push((p as u32, bits)),
            }
        }
        pos += run as u64;
    }
    Some(chunk)
}

/// Fewest elements a tensor needs for a grid to be looked for.
pub(crate) const MIN_ELEMENTS: usize = 4096;
/// Groups of each layout a detection samples.
const SAMPLE_GROUPS: u64 = 4;
/// Elements of a sampled group first tried with each kind of code (the rest only when these fit).
const QUICK_ELEMENTS: usize = 64;
/// Largest fraction of sampled elements that may escape for a grid to be used.
const MAX_ESCAPES: f64 = 0.05;

/// The kinds of code a detection tries: symmetric and zero-point integers of 2 to 8 bits, fp8.
fn code_kinds() -> impl Iterator<Item = (Codes, u8, bool)> {
    let ints = (2..=8u8).flat_map(|bits| {
        let zp_codes = if bits == 8 { Codes::Offset } else { Codes::SignedZero };
        [(Codes::SignedZero, bits, false), (zp_codes, bits, true)]
    });
    ints.chain([(Codes::Fp8E4m3, 8, false), (Codes::Fp8E5m2, 8, false)])
}

/// The layouts a detection tries for a tensor of `n` elements in rows of `cols`.
fn layouts(n: u64, cols: u64) -> Vec<Layout> {
    let rows = n / cols;
    let mut out: Vec<Layout> =
        [32, 64, 128].into_iter().filter(|&k| k < cols).map(|k| Layout { cols, k_col: k, k_row: 1 }).collect();
    if rows > 1 && cols > 128 {
        out.push(Layout { cols, k_col: 128, k_row: 128 });
    }
    if rows > 1 {
        out.push(Layout { cols, k_col: cols, k_row: 1 });
    }
    out.push(Layout { cols, k_col: cols, k_row: rows.max(1) });
    out
}

/// Escapes among `elements` of a group with extremes `stats` under `plan`.
fn escapes_in(elements: &Elements, stats: &Extremes, plan: &GridPlan) -> usize {
    let (scale, offset) = group_scale(elements, stats, plan);
    elements.iter().filter(|&&(_, b)| code_for(b, scale, offset, plan).is_none()).count()
}

/// Looks for a grid in a tensor (`data`: `dtype` elements, rows of `row_len` elements when
/// known), on a sample of its groups: the cost is bounded by `SAMPLE_GROUPS` groups per
/// layout, and each kind of code is first tried on `QUICK_ELEMENTS` of one group. `None` for
/// dense data, or a grid that too many values miss.
pub fn detect(data: &[u8], dtype: Dtype, row_len: Option<u64>) -> Option<GridPlan> {
    let width = dtype.size();
    if !supports(dtype) || data.len() / width < MIN_ELEMENTS || data.len() / width > u32::MAX as usize {
        return None;
    }
    let n = (data.len() / width) as u64;
    let cols = row_len.filter(|&c| c > 0 && n.is_multiple_of(c)).unwrap_or(n);
    let arithmetics: &[Arithmetic] = match dtype {
        Dtype::F32 => &[Arithmetic::ProductExact],
        _ => &[Arithmetic::ProductExact, Arithmetic::ProductF32],
    };
    // The fewest escapes, then the fewest groups, then the first tried.
    let mut best: Option<((f64, u64), GridPlan)> = None;
    for layout in layouts(n, cols) {
        let groups = layout.group_of(n - 1) as u64 + 1;
        let probe = GridPlan {
            dtype,
            layout,
            arithmetic: Arithmetic::ProductExact,
            codes: Codes::Signed,
            bits: 8,
            zero_point: false,
        };
        let picks = SAMPLE_GROUPS.min(groups);
        let sample: Vec<(Extremes, Vec<(u32, u32)>)> =
            (0..picks).map(|j| sample_group(data, &probe, j * groups / picks, 1 << 14)).collect();
        let total: usize = sample.iter().map(|s| s.1.len()).sum();
        for (codes, bits, zero_point) in code_kinds() {
            for &arithmetic in arithmetics {
                let plan = GridPlan { dtype, layout, arithmetic, codes, bits, zero_point };
                // The quick look is at the group of the largest values (not an all-zero one).
                let (stats, first) = sample.iter().max_by(|a, b| a.0.absmax.total_cmp(&b.0.absmax))?;
                let mut quick: Vec<(u32, u32)> = first[..first.len().min(QUICK_ELEMENTS)].to_vec();
                quick.extend(stats.at.iter().filter(|e| e.0 != u32::MAX));
                if escapes_in(&quick, stats, &plan) > quick.len() / 16 {
                    continue;
                }
                let escaped: usize = sample.iter().map(|(stats, elements)| escapes_in(elements, stats, &plan)).sum();
                let fraction = escaped as f64 / total.max(1) as f64;
                let key = (fraction, groups);
                if fraction <= MAX_ESCAPES
                    && best.as_ref().is_none_or(|(k, _)| key.partial_cmp(k) == Some(std::cmp::Ordering::Less))
                {
                    best = Some((key, plan));
                }
            }
        }
    }
    best.map(|(_, plan)| plan)
}
