//! Grid recovery (issue #43): float tensors whose values are `round(code × scale)`, the way
//! quantized weights (GPTQ/AWQ 4-bit groups, LLM.int8 rows, DeepSeek-style fp8 blocks) look once
//! they are dequantized into a wide float container. A chunk of such a tensor is stored as one
//! scale per group of elements, one code byte per element and the few elements that do not fit
//! (escapes), each stream coded with the codec's own coders (a nested chunk, [`super::chunk`]).
//!
//! Lossless by construction: the decoder recomputes every value in exactly the arithmetic the
//! stream names ([`Arithmetic`]), and the encoder keeps a code only where that recomputation
//! gives the original bits; everything else is an escape, stored as it is. Which elements share
//! a scale is the [`Layout`]: groups of `k_col` consecutive elements along a row of `cols`,
//! stacked over `k_row` rows (a row, a group of 32/64/128, a 128×128 block, the whole tensor).
//!
//! This module owns the payload of a [`super::Method::Grid`] group and the arithmetic; finding
//! a grid and fitting one to a chunk is [`fit`]. It never panics on untrusted payloads: every
//! count is checked against the chunk before anything is allocated.

pub mod fit;

use super::chunk::{decode_chunk, encode_chunk, ChunkHeader, Data, GroupEntry, SkipState};
use super::cross_precision::{f32_to_bf16, f32_to_f16, Rounding};
use super::select::{Options, MAX_CHUNK_SIZE};
use super::{Error, Grouping, Method, Result};
use crate::dtype::Dtype;

pub use fit::{detect, fit_tensor, GridPlan, TensorGrid};

/// How a value is recomputed from its code and its group's scale: an on-disk tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Arithmetic {
    /// `q × s` rounded to f32 (round to nearest even), then to the tensor's dtype: what a
    /// dequantizer that multiplies in f32 and then casts does (two roundings for bf16/f16).
    ProductF32 = 0,
    /// The exact product `q × s` rounded once to the tensor's dtype: multiplying in the tensor's
    /// own dtype (bf16 × bf16 is exact in f32 before its one rounding), or in f32 for an f32
    /// tensor (the same as [`Arithmetic::ProductF32`] there).
    ProductExact = 1,
}

/// What a code byte stands for: an on-disk tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Codes {
    /// A signed integer: `q = code as i8` (symmetric grids and zero points that keep
    /// `code − zero` within −128..=127, as every 4-bit grid does).
    Signed = 0,
    /// An integer with its group's offset `o` (a byte per group): `q = ((code + o) mod 256) − o`,
    /// for 8-bit grids with a zero point, whose `code − zero` spans −255..=255 across groups.
    Offset = 1,
    /// An fp8 e4m3 (OCP "fn": no infinities, 0x7F/0xFF NaN) value; NaN codes are invalid.
    Fp8E4m3 = 2,
    /// An fp8 e5m2 value; infinity and NaN codes are invalid.
    Fp8E5m2 = 3,
    /// A signed integer, `q = code as i8`, except that `0x80` is −0: a quantizer that rounds in
    /// floating point makes −0 of small negative weights (`round(−0.3) = −0`, `−0 × s = −0`),
    /// and its codes never reach −128.
    SignedZero = 4,
}

impl Codes {
    fn from_tag(tag: u8) -> Result<Codes> {
        [Codes::Signed, Codes::Offset, Codes::Fp8E4m3, Codes::Fp8E5m2, Codes::SignedZero]
            .into_iter()
            .find(|c| *c as u8 == tag)
            .ok_or_else(|| corrupt(format!("unknown code kind {tag}")))
    }

    /// The value of `code` in a group with offset `offset`; `None` for an invalid fp8 code.
    #[inline]
    pub fn value(self, code: u8, offset: u8) -> Option<f32> {
        match self {
            Codes::Signed => Some(f32::from(code as i8)),
            Codes::SignedZero if code == 0x80 => Some(-0.0),
            Codes::SignedZero => Some(f32::from(code as i8)),
            Codes::Offset => Some((i32::from(code.wrapping_add(offset)) - i32::from(offset)) as f32),
            Codes::Fp8E4m3 => fp8_value(code, 4),
            Codes::Fp8E5m2 => fp8_value(code, 5),
        }
    }
}

/// Which elements share a scale: element `i` of the tensor (row `i / cols`, column `i % cols`)
/// is in group `(row / k_row) × ceil(cols / k_col) + column / k_col`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Elements per row (≥ 1).
    pub cols: u64,
    /// Columns per group (≥ 1).
    pub k_col: u64,
    /// Rows per group (≥ 1).
    pub k_row: u64,
}

impl Layout {
    fn check(&self) -> Result<()> {
        if self.cols == 0 || self.k_col == 0 || self.k_row == 0 {
            return Err(corrupt("a grid layout with a zero size".into()));
        }
        Ok(())
    }

    /// The group of element `i` (u128: no layout overflows it).
    #[inline]
    pub(crate) fn group_of(&self, i: u64) -> u128 {
        let (row, col) = (i / self.cols, i % self.cols);
        u128::from(row / self.k_row) * u128::from(self.cols.div_ceil(self.k_col)) + u128::from(col / self.k_col)
    }

    /// Elements from `i` on that share `i`'s group along its row (at least 1).
    #[inline]
    pub(crate) fn run_from(&self, i: u64) -> u64 {
        let col = i % self.cols;
        (self.k_col - col % self.k_col).min(self.cols - col)
    }

    /// Short description for `ckpt stats`: `group 128`, `row`, `block 128x128`, `tensor`.
    pub fn describe(&self, elements: u64) -> String {
        let rows = elements.div_ceil(self.cols.max(1));
        match (self.k_col >= self.cols, self.k_row) {
            (true, 1) => "per row".into(),
            (true, k) if k >= rows => "per tensor".into(),
            (false, 1) => format!("group {}", self.k_col),
            (_, k) => format!("block {k}x{}", self.k_col.min(self.cols)),
        }
    }
}

/// What a grid payload says about itself, for `ckpt stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridInfo {
    /// The tensor's dtype.
    pub dtype: Dtype,
    /// The arithmetic.
    pub arithmetic: Arithmetic,
    /// The kind of codes.
    pub codes: Codes,
    /// Code bits the encoder found (informational).
    pub bits: u8,
    /// Whether the encoder found a zero point (informational).
    pub zero_point: bool,
    /// Scale sharing.
    pub layout: Layout,
    /// Elements stored as they are.
    pub escapes: u32,
}

impl GridInfo {
    /// `int4, group 128, zero point` / `fp8 e4m3, block 128x128` (escapes are counted apart).
    pub fn describe(&self, elements: u64) -> String {
        let codes = match self.codes {
            Codes::Signed | Codes::Offset | Codes::SignedZero => format!("int{}", self.bits),
            Codes::Fp8E4m3 => "fp8 e4m3".into(),
            Codes::Fp8E5m2 => "fp8 e5m2".into(),
        };
        let zero = if self.zero_point { ", zero point" } else { "" };
        format!("{codes}, {}{zero}", self.layout.describe(elements))
    }
}

/// Bytes of the fixed part of a grid payload.
const FIXED_LEN: usize = 56;

fn corrupt(reason: String) -> Error {
    Error::Corrupt(format!("grid payload: {reason}"))
}

/// The value of fp8 `code` with `exp_bits` exponent bits (4: e4m3fn, 5: e5m2); `None` for NaN
/// and infinity codes.
#[inline]
pub(crate) fn fp8_value(code: u8, exp_bits: u32) -> Option<f32> {
    let man_bits = 7 - exp_bits;
    let bias = (1i32 << (exp_bits - 1)) - 1;
    let exp = i32::from(code >> man_bits) & ((1 << exp_bits) - 1);
    let man = i32::from(code) & ((1 << man_bits) - 1);
    let special = match exp_bits {
        4 => exp == 15 && man == (1 << man_bits) - 1,
        _ => exp == 31,
    };
    if special {
        return None;
    }
    let magnitude = if exp == 0 {
        man as f32 * 2f32.powi(1 - bias - man_bits as i32)
    } else {
        (man + (1 << man_bits)) as f32 * 2f32.powi(exp - bias - man_bits as i32)
    };
    Some(if code & 0x80 != 0 { -magnitude } else { magnitude })
}

/// Rounds the exact product `x` (an f64 holding at most 53 significant bits) to an f32 with
/// round-to-odd, so that a second rounding to bf16 or f16 (which keep far fewer bits) equals
/// rounding `x` once.
#[inline]
fn f64_to_f32_odd(x: f64) -> u32 {
    let t = x as f32; // nearest even
    if f64::from(t) == x || x.is_nan() {
        return t.to_bits();
    }
    // Step toward zero if rounding went away from it, then make the last bit 1 (sticky).
    let mut bits = t.to_bits();
    if f64::from(t).abs() > x.abs() {
        bits -= 1;
    }
    bits | 1
}

/// The element value (its bits, in `dtype`) of code value `q` times `scale` by `arithmetic`.
#[inline]
pub fn element_bits(q: f32, scale: f32, dtype: Dtype, arithmetic: Arithmetic) -> u32 {
    match (dtype, arithmetic) {
        (Dtype::F32, _) => (q * scale).to_bits(),
        (Dtype::Bf16, Arithmetic::ProductF32) => u32::from(f32_to_bf16((q * scale).to_bits(), Rounding::NearestEven)),
        (_, Arithmetic::ProductF32) => u32::from(f32_to_f16((q * scale).to_bits(), Rounding::NearestEven)),
        (Dtype::Bf16, Arithmetic::ProductExact) => {
            u32::from(f32_to_bf16(f64_to_f32_odd(f64::from(q) * f64::from(scale)), Rounding::NearestEven))
        }
        (_, Arithmetic::ProductExact) => {
            u32::from(f32_to_f16(f64_to_f32_odd(f64::from(q) * f64::from(scale)), Rounding::NearestEven))
        }
    }
}

/// Whether `dtype` tensors can be gridded.
pub(crate) fn supports(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32)
}

/// The streams of one gridded chunk, before coding.
pub(crate) struct GridChunk {
    pub(crate) plan: GridPlan,
    /// Index in the tensor of the chunk's first element.
    pub(crate) first_element: u64,
    /// Group of `scales[0]`.
    pub(crate) first_group: u64,
    /// One per group `first_group..`, f32.
    pub(crate) scales: Vec<f32>,
    /// One per group, for [`Codes::Offset`] (empty otherwise).
    pub(crate) offsets: Vec<u8>,
    /// One per element.
    pub(crate) codes: Vec<u8>,
    /// Positions (in the chunk, ascending) and original bits of the elements stored as they are.
    pub(crate) escapes: Vec<(u32, u32)>,
}

/// Appends a nested chunk: decoded length (u32), its group entries, its payload.
pub(crate) fn put_stream(bytes: &[u8], grouping: Grouping, options: &Options, out: &mut Vec<u8>) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| Error::InvalidInput("grid stream over 4 GiB".into()))?;
    out.extend_from_slice(&len.to_le_bytes());
    let at = out.len();
    out.resize(at + grouping.width * 5, 0);
    if bytes.is_empty() {
        // Zero groups of no bytes (tag 1, length 0), written out: the coders want input.
        for g in 0..grouping.width {
            out[at + g * 5] = Method::Zero as u8;
        }
        return Ok(());
    }
    let mut skip = SkipState::default();
    let mut inner = Options { skip_after_raw: 0, ..options.clone() };
    inner.chunk_size = inner.chunk_size.max(bytes.len());
    let header = encode_chunk(Data::Bytes(bytes), None, grouping, &inner, &mut skip, out)?;
    for (g, e) in header.groups().iter().enumerate() {
        out[at + g * 5] = e.method as u8;
        out[at + g * 5 + 1..at + g * 5 + 5].copy_from_slice(&e.stored_len.to_le_bytes());
    }
    Ok(())
}

/// Reads a nested chunk of exactly `expected` decoded bytes (or, with `expected == None`, at
/// most `max` bytes) from `at`, decoding it into a new vector.
pub(crate) fn take_stream(
    stored: &[u8],
    at: &mut usize,
    grouping: Grouping,
    expected: Option<usize>,
    max: usize,
) -> Result<Vec<u8>> {
    let len = read_u32(stored, *at)? as usize;
    if expected.is_some_and(|e| e != len) || len > max || !len.is_multiple_of(grouping.width) {
        return Err(corrupt(format!("a stream of {len} bytes where {expected:?} (at most {max}) fit")));
    }
    *at += 4;
    let mut entries = [GroupEntry { method: Method::Zero, stored_len: 0 }; 8];
    for (g, e) in entries.iter_mut().take(grouping.width).enumerate() {
        let tag = *stored.get(*at + g * 5).ok_or_else(|| corrupt("truncated stream header".into()))?;
        let method = Method::try_from(tag)?;
        if matches!(method, Method::Grid | Method::Within | Method::Masked) {
            return Err(corrupt(format!("a nested {} group", method.name())));
        }
        *e = GroupEntry { method, stored_len: read_u32(stored, *at + g * 5 + 1)? };
    }
    *at += grouping.width * 5;
    let header = ChunkHeader::new(&entries[..grouping.width])?;
    let payload_len = usize::try_from(header.stored_len()).map_err(|_| corrupt("stream too long".into()))?;
    let end = at.checked_add(payload_len).filter(|&e| e <= stored.len());
    let end = end.ok_or_else(|| corrupt("a stream runs past the payload".into()))?;
    let mut out = vec![0u8; len];
    decode_chunk(&stored[*at..end], &header, grouping, None, &mut out)?;
    *at = end;
    Ok(out)
}

fn read_u32(b: &[u8], at: usize) -> Result<u32> {
    let s = b.get(at..at + 4).ok_or_else(|| corrupt("truncated".into()))?;
    Ok(u32::from_le_bytes(s.try_into().expect("4 bytes")))
}

fn read_u64(b: &[u8], at: usize) -> Result<u64> {
    let s = b.get(at..at + 8).ok_or_else(|| corrupt("truncated".into()))?;
    Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

/// Writes the payload of a Grid group for `chunk` (docs/format.md, "Grid payload").
pub(crate) fn encode_payload(chunk: &GridChunk, options: &Options, out: &mut Vec<u8>) -> Result<()> {
    let plan = &chunk.plan;
    let mut fixed = [0u8; FIXED_LEN];
    fixed[0] = plan.dtype.code();
    fixed[1] = plan.arithmetic as u8;
    fixed[2] = plan.codes as u8;
    fixed[3] = plan.bits;
    fixed[4] = u8::from(plan.zero_point);
    fixed[8..16].copy_from_slice(&chunk.first_element.to_le_bytes());
    fixed[16..24].copy_from_slice(&plan.layout.cols.to_le_bytes());
    fixed[24..32].copy_from_slice(&plan.layout.k_col.to_le_bytes());
    fixed[32..40].copy_from_slice(&plan.layout.k_row.to_le_bytes());
    fixed[40..48].copy_from_slice(&chunk.first_group.to_le_bytes());
    fixed[48..52].copy_from_slice(&(chunk.scales.len() as u32).to_le_bytes());
    fixed[52..56].copy_from_slice(&(chunk.escapes.len() as u32).to_le_bytes());
    out.extend_from_slice(&fixed);
    let scales: Vec<u8> = chunk.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    put_stream(&scales, Grouping::for_dtype(Some(Dtype::F32)), options, out)?;
    if plan.codes == Codes::Offset {
        put_stream(&chunk.offsets, Grouping::BYTES, options, out)?;
    }
    put_stream(&chunk.codes, Grouping::BYTES, options, out)?;
    let mut gaps = Vec::with_capacity(chunk.escapes.len() * 2);
    let mut values = Vec::with_capacity(chunk.escapes.len() * plan.dtype.size());
    let mut last = 0u32;
    for &(pos, bits) in &chunk.escapes {
        let mut gap = pos - last;
        last = pos + 1;
        while gap >= 0x80 {
            gaps.push((gap as u8) | 0x80);
            gap >>= 7;
        }
        gaps.push(gap as u8);
        values.extend_from_slice(&bits.to_le_bytes()[..plan.dtype.size()]);
    }
    put_stream(&gaps, Grouping::BYTES, options, out)?;
    put_stream(&values, Grouping::for_dtype(Some(plan.dtype)), options, out)
}

/// Codes a standalone chunk (element `first_element` of its tensor on) both ways, as byte
/// groups and on `grid`, appends the smaller payload to `out` and returns its header.
pub(crate) fn encode_best(
    grid: &TensorGrid,
    first_element: u64,
    chunk: Data<'_>,
    options: &Options,
    skip: &mut SkipState,
    out: &mut Vec<u8>,
) -> Result<ChunkHeader> {
    let start = out.len();
    let grouping = Grouping::for_dtype(Some(grid.plan.dtype));
    let header = encode_chunk(chunk, None, grouping, options, skip, out)?;
    let Some(bytes) = chunk.bytes() else { return Ok(header) };
    let m = bytes.len() / grouping.width;
    let fitted = match fit::fit_chunk(grid, first_element, bytes) {
        Some(f) if f.escapes.len() <= m / 4 => f,
        _ => return Ok(header),
    };
    let mut payload = Vec::new();
    encode_payload(&fitted, options, &mut payload)?;
    if payload.len() >= out.len() - start {
        return Ok(header);
    }
    out.truncate(start);
    out.extend_from_slice(&payload);
    let mut entries = [GroupEntry { method: Method::Within, stored_len: 0 }; 8];
    let stored_len = u32::try_from(payload.len()).expect("smaller than the chunk");
    entries[grouping.width - 1] = GroupEntry { method: Method::Grid, stored_len };
    ChunkHeader::new(&entries[..grouping.width])
}

/// The Grid payload of `grid` (fitted to a tensor) for `chunk` (elements from `first_element` of their
/// tensor on), or `None` when the chunk's groups cannot be numbered within it: what a chunk
/// coded as a grid stores in its Grid group. For tools and fuzzing.
pub fn encode(grid: &TensorGrid, first_element: u64, chunk: &[u8], options: &Options) -> Result<Option<Vec<u8>>> {
    let dtype = grid.plan.dtype;
    if !chunk.len().is_multiple_of(dtype.size()) || chunk.len() > MAX_CHUNK_SIZE {
        return Err(Error::InvalidInput(format!("{} bytes of {dtype:?} cannot be a grid chunk", chunk.len())));
    }
    let Some(fitted) = fit::fit_chunk(grid, first_element, chunk) else { return Ok(None) };
    let mut payload = Vec::new();
    encode_payload(&fitted, options, &mut payload)?;
    Ok(Some(payload))
}

/// Decodes a Grid payload into `out`, a chunk of `width`-byte elements (at most the largest
/// chunk size): the decoder of [`super::Method::Grid`] groups, for tools and fuzzing.
pub fn decode_payload(stored: &[u8], width: usize, out: &mut [u8]) -> Result<()> {
    if !matches!(width, 2 | 4) || !out.len().is_multiple_of(width) || out.len() > MAX_CHUNK_SIZE {
        return Err(Error::InvalidInput(format!("{} bytes of {width}-byte elements", out.len())));
    }
    decode(stored, width, out)
}

/// A parsed payload's fixed part.
struct Fixed {
    info: GridInfo,
    first_element: u64,
    first_group: u64,
    groups: usize,
}

fn parse_fixed(stored: &[u8], width: usize, elements: usize) -> Result<Fixed> {
    let f = stored.get(..FIXED_LEN).ok_or_else(|| corrupt("shorter than its fixed part".into()))?;
    let dtype = Dtype::from_code(f[0]).filter(|d| supports(*d) && d.size() == width);
    let dtype = dtype.ok_or_else(|| corrupt(format!("dtype code {} in a {width}-byte chunk", f[0])))?;
    let arithmetic = match f[1] {
        0 => Arithmetic::ProductF32,
        1 => Arithmetic::ProductExact,
        t => return Err(corrupt(format!("unknown arithmetic {t}"))),
    };
    let codes = Codes::from_tag(f[2])?;
    if !(1..=8).contains(&f[3]) || f[4] > 1 || f[5..8] != [0, 0, 0] {
        return Err(corrupt("bad bits, flags or reserved bytes".into()));
    }
    let layout = Layout { cols: read_u64(f, 16)?, k_col: read_u64(f, 24)?, k_row: read_u64(f, 32)? };
    layout.check()?;
    let groups = read_u32(f, 48)? as usize;
    let escapes = read_u32(f, 52)?;
    if groups > elements.max(1) || escapes as usize > elements {
        return Err(corrupt(format!("{groups} groups and {escapes} escapes in {elements} elements")));
    }
    let info = GridInfo { dtype, arithmetic, codes, bits: f[3], zero_point: f[4] == 1, layout, escapes };
    Ok(Fixed { info, first_element: read_u64(f, 8)?, first_group: read_u64(f, 40)?, groups })
}

/// What a Grid group's payload says (for `ckpt stats`), without decoding its streams.
pub fn info(stored: &[u8], width: usize, elements: usize) -> Result<GridInfo> {
    Ok(parse_fixed(stored, width, elements)?.info)
}

/// Decodes a Grid group's payload into `out`: the chunk's elements (`width` bytes each).
pub(crate) fn decode(stored: &[u8], width: usize, out: &mut [u8]) -> Result<()> {
    let m = out.len() / width;
    let fixed = parse_fixed(stored, width, m)?;
    let info = &fixed.info;
    let mut at = FIXED_LEN;
    let f32_grouping = Grouping::for_dtype(Some(Dtype::F32));
    let scale_bytes = take_stream(stored, &mut at, f32_grouping, Some(fixed.groups * 4), fixed.groups * 4)?;
    let scales: Vec<f32> = scale_bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))).collect();
    if let Some(bad) = scales.iter().find(|s| !s.is_finite()) {
        return Err(corrupt(format!("a scale of {bad}")));
    }
    let offsets = match info.codes {
        Codes::Offset => take_stream(stored, &mut at, Grouping::BYTES, Some(fixed.groups), fixed.groups)?,
        _ => Vec::new(),
    };
    let codes = take_stream(stored, &mut at, Grouping::BYTES, Some(m), m)?;
    let escapes = info.escapes as usize;
    let gaps = take_stream(stored, &mut at, Grouping::BYTES, None, escapes * 5)?;
    let values =
        take_stream(stored, &mut at, Grouping::for_dtype(Some(info.dtype)), Some(escapes * width), escapes * width)?;
    if at != stored.len() {
        return Err(corrupt("trailing bytes".into()));
    }
    fill(&fixed, &scales, &offsets, &codes, out)?;
    apply_escapes(&gaps, &values, escapes, width, out)
}

/// Computes every element from its code and its group's scale.
fn fill(fixed: &Fixed, scales: &[f32], offsets: &[u8], codes: &[u8], out: &mut [u8]) -> Result<()> {
    let info = &fixed.info;
    let (layout, width) = (info.layout, info.dtype.size());
    let m = codes.len() as u64;
    fixed.first_element.checked_add(m).ok_or_else(|| corrupt("element index overflows".into()))?;
    let mut pos = 0u64;
    while pos < m {
        let i = fixed.first_element + pos;
        let run = layout.run_from(i).min(m - pos) as usize;
        let group = layout.group_of(i).checked_sub(u128::from(fixed.first_group));
        let g = group
            .filter(|&g| g < scales.len() as u128)
            .ok_or_else(|| corrupt(format!("element {i} outside the groups")))? as usize;
        let (scale, offset) = (scales[g], offsets.get(g).copied().unwrap_or(0));
        let p = pos as usize;
        let dst = &mut out[p * width..(p + run) * width];
        let src = &codes[p..p + run];
        fill_run(src, scale, offset, info, dst)?;
        pos += run as u64;
    }
    Ok(())
}

/// One run of elements sharing a scale: the decoder's inner loop, specialised per dtype.
#[inline]
fn fill_run(codes: &[u8], scale: f32, offset: u8, info: &GridInfo, out: &mut [u8]) -> Result<()> {
    let (kind, dtype, arithmetic) = (info.codes, info.dtype, info.arithmetic);
    let value = |c: u8| kind.value(c, offset).ok_or_else(|| corrupt(format!("invalid code {c:#04x}")));
    match dtype {
        Dtype::F32 => {
            for (c, o) in codes.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&(value(*c)? * scale).to_le_bytes());
            }
        }
        _ => {
            for (c, o) in codes.iter().zip(out.chunks_exact_mut(2)) {
                let bits = element_bits(value(*c)?, scale, dtype, arithmetic) as u16;
                o.copy_from_slice(&bits.to_le_bytes());
            }
        }
    }
    Ok(())
}

fn apply_escapes(gaps: &[u8], values: &[u8], count: usize, width: usize, out: &mut [u8]) -> Result<()> {
    let m = out.len() / width;
    let (mut at, mut pos, mut seen) = (0usize, 0usize, 0usize);
    while at < gaps.len() {
        let mut gap = 0u64;
        let mut shift = 0;
        loop {
            let b = *gaps.get(at).ok_or_else(|| corrupt("truncated escape gap".into()))?;
            at += 1;
            if shift > 28 {
                return Err(corrupt("escape gap too long".into()));
            }
            gap |= u64::from(b & 0x7F) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        let p = (pos as u64).checked_add(gap).filter(|&p| p < m as u64);
        let p = p.ok_or_else(|| corrupt("an escape outside the chunk".into()))? as usize;
        if seen >= count {
            return Err(corrupt("more escape gaps than escapes".into()));
        }
        out[p * width..(p + 1) * width].copy_from_slice(&values[seen * width..(seen + 1) * width]);
        seen += 1;
        pos = p + 1;
    }
    if seen != count {
        return Err(corrupt(format!("{seen} escape positions for {count} escapes")));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
