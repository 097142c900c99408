//! Cross-precision references (issue #28, item 1): the same weights saved in two precisions (fp32 master weights beside their bf16 or fp16
//! copy) predict each other. A narrow tensor is predicted by converting the wide one with the
//! rounding rule that produced it ([`narrow`], [`detect_rule`]); a wide tensor is predicted by
//! widening the narrow one ([`widen`]), which is exact, so only the low mantissa bits remain.
//! Either way the residual is the XOR of the tensor with its prediction ([`residual`]), which
//! then goes through the normal byte grouping and method selection: a perfect prediction is all
//! zeros, a wrong one is still exact, only larger.
//!
//! Conversions follow IEEE 754: round to nearest, ties to even, or truncation (toward zero);
//! overflow gives infinity (nearest) or the largest finite value (truncation); subnormal
//! results are produced; f32 subnormal inputs become a signed zero in f16 (they are far below
//! half of its smallest subnormal) and keep their top bits in bf16, which shares f32's exponent
//! range. A NaN stays a NaN of the same sign with its top payload bits
//! and the quiet bit set, under both rules (as PyTorch's conversions do).

use super::{Error, Result};
use crate::dtype::Dtype;

/// How a derived blob's prediction is made from its reference blob: an on-disk tag (byte 13 of
/// a derived object's header, docs/format.md "Derived blobs"), fixed forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Conversion {
    /// The reference is F32; the blob (BF16 or F16) is predicted by rounding it to nearest, ties
    /// to even.
    NarrowNearestEven = 1,
    /// The reference is F32; the blob (BF16 or F16) is predicted by truncating it.
    NarrowTruncate = 2,
    /// The reference is BF16 or F16; the blob (F32) is predicted by widening it (exact).
    Widen = 3,
}

impl Conversion {
    /// The conversion with on-disk tag `tag`.
    pub(crate) fn from_tag(tag: u8) -> Option<Conversion> {
        [Conversion::NarrowNearestEven, Conversion::NarrowTruncate, Conversion::Widen]
            .into_iter()
            .find(|c| *c as u8 == tag)
    }

    /// The narrowing conversion by `rule`.
    pub fn narrow(rule: Rounding) -> Conversion {
        match rule {
            Rounding::NearestEven => Conversion::NarrowNearestEven,
            Rounding::Truncate => Conversion::NarrowTruncate,
        }
    }

    /// Short name for `ckpt show` and JSON: `round-nearest-even`, `truncate`, `widen`.
    pub fn name(self) -> &'static str {
        match self {
            Conversion::NarrowNearestEven => "round-nearest-even",
            Conversion::NarrowTruncate => "truncate",
            Conversion::Widen => "widen",
        }
    }

    /// Whether a blob of `target` can be predicted from one of `source` this way.
    pub fn fits(self, source: Dtype, target: Dtype) -> bool {
        match self {
            Conversion::NarrowNearestEven | Conversion::NarrowTruncate => {
                source == Dtype::F32 && narrow_of(target).is_some()
            }
            Conversion::Widen => target == Dtype::F32 && narrow_of(source).is_some(),
        }
    }
}

impl std::fmt::Display for Conversion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The narrow format of a 2-byte float dtype.
pub(crate) fn narrow_of(dtype: Dtype) -> Option<Narrow> {
    match dtype {
        Dtype::Bf16 => Some(Narrow::Bf16),
        Dtype::F16 => Some(Narrow::F16),
        _ => None,
    }
}

/// The conversion that best predicts `target` (`target_dtype` elements) from `source`
/// (`source_dtype` elements, as many): widening from a narrow float to F32, else narrowing F32
/// by the rule [`detect_rule`] finds (round to nearest even when neither reproduces every
/// element: the prediction is still good where most elements are roundings). `None` when the
/// dtypes or lengths do not pair.
pub fn choose(source: &[u8], source_dtype: Dtype, target: &[u8], target_dtype: Dtype) -> Option<Conversion> {
    if source.len() / source_dtype.size() != target.len() / target_dtype.size() {
        return None;
    }
    if Conversion::Widen.fits(source_dtype, target_dtype) {
        return Some(Conversion::Widen);
    }
    let to = narrow_of(target_dtype).filter(|_| source_dtype == Dtype::F32)?;
    let rule = detect_rule(source, target, to).ok()?.unwrap_or(Rounding::NearestEven);
    Some(Conversion::narrow(rule))
}

/// The prediction of a `target` blob from `source` bytes (`source_dtype` elements) by
/// `conversion`, into `out` (as many elements of `target`). Errors when the dtypes do not fit
/// the conversion or the lengths do not pair.
pub fn predict(
    conversion: Conversion,
    source: &[u8],
    source_dtype: Dtype,
    target: Dtype,
    out: &mut [u8],
) -> Result<()> {
    if !conversion.fits(source_dtype, target) {
        return Err(Error::InvalidInput(format!(
            "{target:?} cannot be predicted from {source_dtype:?} by {conversion}"
        )));
    }
    match conversion {
        Conversion::NarrowNearestEven | Conversion::NarrowTruncate => {
            let rule =
                if conversion == Conversion::NarrowTruncate { Rounding::Truncate } else { Rounding::NearestEven };
            narrow(source, narrow_of(target).expect("checked by fits"), rule, out)
        }
        Conversion::Widen => widen(source, narrow_of(source_dtype).expect("checked by fits"), out),
    }
}

thread_local! {
    /// One chunk's prediction while it is coded or decoded ([`Predictor`]).
    static PREDICTION_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The prediction of a tensor from the bytes of its reference (another float dtype, as many
/// elements), handed to the codec chunk by chunk in grouped form
/// ([`super::chunk::GroupedReference`]): each chunk converts only the reference elements it
/// covers, in a per-thread buffer. The one prediction of derived blobs (`store`) and derived
/// container segments (docs/format.md, "Reference segments").
pub(crate) struct Predictor<'a> {
    /// How the prediction is made.
    pub conversion: Conversion,
    /// The reference's bytes.
    pub source: &'a [u8],
    /// The reference's dtype.
    pub source_dtype: Dtype,
    /// The predicted tensor's dtype.
    pub dtype: Dtype,
}

impl Predictor<'_> {
    /// The range of the reference's bytes that predicts bytes `range` of the tensor.
    pub(crate) fn source_range(&self, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
        source_range(self.dtype, self.source_dtype, range)
    }
}

/// The range of a reference of `source_dtype` elements that predicts bytes `range` of a tensor
/// of `dtype` elements (element `k` from element `k`).
pub(crate) fn source_range(dtype: Dtype, source_dtype: Dtype, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    let (w, ws) = (dtype.size(), source_dtype.size());
    range.start / w * ws..range.end / w * ws
}

impl super::chunk::GroupedReference for Predictor<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> Result<()> {
        let w = self.dtype.size();
        let whole = offset.is_multiple_of(w) && grouped.len().is_multiple_of(w);
        let wide = whole.then(|| self.source.get(self.source_range(offset..offset + grouped.len()))).flatten();
        let wide = wide.ok_or_else(|| {
            Error::InvalidInput(format!(
                "{} predicted bytes at offset {offset} are not whole elements of the reference",
                grouped.len()
            ))
        })?;
        PREDICTION_SCRATCH.with(|scratch| {
            let mut predicted = scratch.borrow_mut();
            predicted.resize(grouped.len(), 0);
            predict(self.conversion, wide, self.source_dtype, self.dtype, &mut predicted)?;
            super::byte_group::split(&predicted, None, super::Grouping::for_dtype(Some(self.dtype)), grouped)
        })
    }
}

/// How a wide float was rounded to a narrow one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Rounding {
    /// Round to nearest, ties to even (PyTorch's `.to(torch.bfloat16)` and `.half()`).
    NearestEven = 0,
    /// Round toward zero: drop the low bits.
    Truncate = 1,
}

/// A narrow float format an f32 tensor can be converted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Narrow {
    /// bfloat16: f32's top 16 bits (1 | 8 | 7).
    Bf16,
    /// IEEE half precision (1 | 5 | 10).
    F16,
}

/// One f32 (as bits) to bf16 bits by `rule`.
pub fn f32_to_bf16(x: u32, rule: Rounding) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((x >> 16) as u16) | 0x0040; // NaN: keep sign and top payload, set the quiet bit
    }
    match rule {
        Rounding::Truncate => (x >> 16) as u16,
        Rounding::NearestEven => {
            // Adding 0x7FFF plus the kept part's low bit rounds half to even; a carry into the
            // exponent is the correct next binade (or infinity from the largest finite value).
            let bias = 0x7FFF + ((x >> 16) & 1);
            (x.wrapping_add(bias) >> 16) as u16
        }
    }
}

/// One f32 (as bits) to f16 bits by `rule`.
pub fn f32_to_f16(x: u32, rule: Rounding) -> u16 {
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xFF) as i32;
    let mant = x & 0x7F_FFFF;
    if exp == 0xFF {
        return if mant == 0 { sign | 0x7C00 } else { sign | 0x7E00 | (mant >> 13) as u16 };
    }
    if exp == 0 {
        return sign; // f32 subnormals are below 2^-126, far under f16's smallest step 2^-24
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return match rule {
            Rounding::NearestEven => sign | 0x7C00,
            Rounding::Truncate => sign | 0x7BFF,
        };
    }
    // Value = m × 2^(exp − 150); f16 steps are 2^(e − 25) for normals, 2^-24 for subnormals.
    let m = mant | 0x80_0000;
    let (kept, shift) = if e <= 0 { (0u32, (14 - e) as u32) } else { ((e as u32) << 10, 13) };
    if shift > 24 {
        return sign; // under half of the smallest subnormal: zero under both rules
    }
    let q = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    // For normals, q holds the implicit bit at bit 10: replace it by the exponent field.
    let mut h = if e <= 0 { q } else { kept | (q & 0x3FF) };
    if rule == Rounding::NearestEven && (rem > half || (rem == half && h & 1 == 1)) {
        h += 1; // a carry moves to the next binade, or from 0x7BFF to infinity: both correct
    }
    sign | h as u16
}

/// bf16 bits to f32 bits (exact).
pub(crate) fn bf16_to_f32(h: u16) -> u32 {
    u32::from(h) << 16
}

/// f16 bits to f32 bits (exact).
pub(crate) fn f16_to_f32(h: u16) -> u32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1F);
    let mant = u32::from(h & 0x3FF);
    match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal, mant × 2^-24: normalise on its top set bit p (0..=9).
            let p = 31 - mant.leading_zeros();
            let m = (mant << (23 - p)) & 0x7F_FFFF;
            sign | ((103 + p) << 23) | m
        }
        (0x1F, 0) => sign | 0x7F80_0000,
        (0x1F, _) => sign | 0x7FC0_0000 | (mant << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (mant << 13),
    }
}

fn check_lengths(wide: &[u8], narrow_bytes: usize) -> Result<usize> {
    if !wide.len().is_multiple_of(4) || narrow_bytes != wide.len() / 2 {
        return Err(Error::InvalidInput(format!(
            "{} f32 bytes cannot pair with {narrow_bytes} bytes of 2-byte floats",
            wide.len()
        )));
    }
    Ok(wide.len() / 4)
}

/// Converts little-endian f32 bytes to `target` by `rule`, into `out` (half as long).
pub fn narrow(wide: &[u8], target: Narrow, rule: Rounding, out: &mut [u8]) -> Result<()> {
    check_lengths(wide, out.len())?;
    for (w, o) in wide.chunks_exact(4).zip(out.chunks_exact_mut(2)) {
        let x = u32::from_le_bytes(w.try_into().expect("4 bytes"));
        let h = match target {
            Narrow::Bf16 => f32_to_bf16(x, rule),
            Narrow::F16 => f32_to_f16(x, rule),
        };
        o.copy_from_slice(&h.to_le_bytes());
    }
    Ok(())
}

/// Converts little-endian `source` narrow floats to f32 bytes, into `out` (twice as long):
/// the prediction of a wide tensor from its narrow copy.
pub fn widen(narrow_bytes: &[u8], source: Narrow, out: &mut [u8]) -> Result<()> {
    check_lengths(out, narrow_bytes.len())?;
    for (n, o) in narrow_bytes.chunks_exact(2).zip(out.chunks_exact_mut(4)) {
        let h = u16::from_le_bytes([n[0], n[1]]);
        let x = match source {
            Narrow::Bf16 => bf16_to_f32(h),
            Narrow::F16 => f16_to_f32(h),
        };
        o.copy_from_slice(&x.to_le_bytes());
    }
    Ok(())
}

/// The rule that turns every element of `wide` (f32) into the same element of `narrow_bytes`
/// (`target`), round-to-nearest-even first; `None` when neither reproduces them all (the narrow
/// tensor is not a plain rounding of this one: it can still be coded against it, just larger).
pub fn detect_rule(wide: &[u8], narrow_bytes: &[u8], target: Narrow) -> Result<Option<Rounding>> {
    check_lengths(wide, narrow_bytes.len())?;
    let matches = |rule| is_rounding(wide, narrow_bytes, target, rule).unwrap_or(false);
    Ok([Rounding::NearestEven, Rounding::Truncate].into_iter().find(|&r| matches(r)))
}

/// Whether every element of `narrow_bytes` (`target`) is the element of `wide` (f32) rounded
/// by `rule`: [`detect_rule`] for one rule, on any part of two tensors.
pub(crate) fn is_rounding(wide: &[u8], narrow_bytes: &[u8], target: Narrow, rule: Rounding) -> Result<bool> {
    check_lengths(wide, narrow_bytes.len())?;
    let convert = match target {
        Narrow::Bf16 => f32_to_bf16,
        Narrow::F16 => f32_to_f16,
    };
    Ok(wide.chunks_exact(4).zip(narrow_bytes.chunks_exact(2)).all(|(w, n)| {
        convert(u32::from_le_bytes(w.try_into().expect("4 bytes")), rule) == u16::from_le_bytes([n[0], n[1]])
    }))
}

/// `out = actual XOR predicted`, byte by byte (all three the same length): the residual that is
/// coded, and, applied again to the prediction, the tensor back.
pub fn residual(actual: &[u8], predicted: &[u8], out: &mut [u8]) -> Result<()> {
    if actual.len() != predicted.len() || actual.len() != out.len() {
        return Err(Error::InvalidInput("residual of tensors of different lengths".into()));
    }
    for ((o, a), p) in out.iter_mut().zip(actual).zip(predicted) {
        *o = a ^ p;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Special values: NaNs (quiet, signalling, negative, low payload only), infinities, zeros,
    /// f32 subnormals, f16 subnormal and overflow edges, ties.
    const SPECIAL: [u32; 16] = [
        0x7FC0_0000,
        0x7F80_0001,
        0xFFC1_2345,
        0x7F80_0000,
        0xFF80_0000,
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x807F_FFFF,
        0x3380_0000, // 2^-24, f16's smallest subnormal
        0x3300_0000, // 2^-25: a tie between 0 and the smallest subnormal
        0x477F_E000, // 65504, f16's largest finite
        0x477F_F000, // 65520: a tie between 65504 and 2^16 (overflow)
        0x3F80_8000, // a bf16 tie (1 + 2^-8), even below
        0x3F81_8000, // a bf16 tie, even above
        0x7F7F_FFFF, // f32's largest finite: rounds to infinity in bf16 (nearest)
    ];

    fn value(bits: u32) -> f64 {
        f64::from(f32::from_bits(bits))
    }

    /// `h` is the correctly rounded narrow value of `x`: checked against its neighbours.
    fn assert_rounded(x: u32, h: u16, target: Narrow, rule: Rounding) {
        let widen = |h: u16| match target {
            Narrow::Bf16 => bf16_to_f32(h),
            Narrow::F16 => f16_to_f32(h),
        };
        let xf = f32::from_bits(x);
        let back = f32::from_bits(widen(h));
        if xf.is_nan() {
            assert!(back.is_nan() && back.is_sign_negative() == xf.is_sign_negative(), "{x:#x} -> {h:#x}");
            return;
        }
        assert_eq!(back.is_sign_negative(), xf.is_sign_negative(), "sign of {x:#x} -> {h:#x}");
        let mag = h & 0x7FFF;
        let (xa, ba) = (value(x).abs(), f64::from(back).abs());
        let max_finite = match target {
            Narrow::Bf16 => 0x7F7F,
            Narrow::F16 => 0x7BFF,
        };
        let subnormal_f32 = x & 0x7F80_0000 == 0 && target == Narrow::F16;
        if subnormal_f32 {
            assert_eq!(mag, 0);
            return;
        }
        let next_mag = |m: u16| f64::from(f32::from_bits(widen(m + 1))).abs();
        match rule {
            Rounding::Truncate => {
                assert!(ba <= xa, "{x:#x} -> {h:#x}: truncation grew");
                if mag < max_finite {
                    assert!(next_mag(mag) > xa, "{x:#x} -> {h:#x}: not the largest below");
                }
            }
            Rounding::NearestEven => {
                if ba.is_infinite() {
                    assert!(xa.is_infinite() || mag == 0x7F80 || mag == 0x7C00);
                    let largest = f64::from(f32::from_bits(widen(max_finite)));
                    assert!(xa.is_infinite() || xa >= largest, "{x:#x} overflowed early");
                    return;
                }
                let below = if mag == 0 { 0.0 } else { f64::from(f32::from_bits(widen(mag - 1))).abs() };
                let above = if mag < max_finite { next_mag(mag) } else { f64::INFINITY };
                let d = (xa - ba).abs();
                assert!(d <= (xa - below).abs() && d <= (above - xa).abs(), "{x:#x} -> {h:#x}: not nearest");
                let tie = (mag > 0 && d == (xa - below).abs()) || d == (above - xa).abs();
                if tie && d > 0.0 {
                    assert_eq!(mag & 1, 0, "{x:#x} -> {h:#x}: tie not to even");
                }
            }
        }
    }

    #[test]
    fn special_values_convert_by_each_rule() {
        for x in SPECIAL {
            for rule in [Rounding::NearestEven, Rounding::Truncate] {
                assert_rounded(x, f32_to_bf16(x, rule), Narrow::Bf16, rule);
                assert_rounded(x, f32_to_f16(x, rule), Narrow::F16, rule);
            }
        }
        assert_eq!(f32_to_f16(0x477F_F000, Rounding::NearestEven), 0x7C00, "65520 rounds to infinity");
        assert_eq!(f32_to_f16(0x477F_F000, Rounding::Truncate), 0x7BFF);
        assert_eq!(f32_to_f16(0x3300_0000, Rounding::NearestEven), 0, "2^-25 ties to even zero");
        assert_eq!(f32_to_f16(0x3380_0000, Rounding::NearestEven), 1);
        assert_eq!(f32_to_bf16(0x3F80_8000, Rounding::NearestEven), 0x3F80);
        assert_eq!(f32_to_bf16(0x3F81_8000, Rounding::NearestEven), 0x3F82);
        assert_eq!(f32_to_bf16(0x8000_0000, Rounding::NearestEven), 0x8000, "-0.0 stays negative");
        for h in [0u16, 1, 0x3FF, 0x400, 0x7BFF, 0x7C00, 0x8001, 0x3C00] {
            assert_eq!(f32_to_f16(f16_to_f32(h), Rounding::NearestEven), h, "f16 {h:#x} widens exactly");
        }
    }

    fn floats() -> impl Strategy<Value = u32> {
        prop_oneof![
            any::<u32>(),
            proptest::sample::select(SPECIAL.to_vec()),
            // Around f16's range, where subnormals and overflow happen.
            (0x3000_0000u32..0x4800_0000, any::<bool>()).prop_map(|(x, neg)| x | (u32::from(neg) << 31)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn conversions_round_correctly(x in floats()) {
            for rule in [Rounding::NearestEven, Rounding::Truncate] {
                assert_rounded(x, f32_to_bf16(x, rule), Narrow::Bf16, rule);
                assert_rounded(x, f32_to_f16(x, rule), Narrow::F16, rule);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// For every rule and target: the rule is detected, the residual against the
        /// prediction is all zero, and a reference that is not a rounding (some elements
        /// changed) still reconstructs exactly. Widening predicts the wide tensor exactly
        /// in its top bits.
        #[test]
        fn predictions_round_trip(values in proptest::collection::vec(floats(), 1..300), bf16 in any::<bool>(),
                                  truncate in any::<bool>(), noise in any::<u64>()) {
            let target = if bf16 { Narrow::Bf16 } else { Narrow::F16 };
            let rule = if truncate { Rounding::Truncate } else { Rounding::NearestEven };
            let wide: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut actual = vec![0u8; wide.len() / 2];
            narrow(&wide, target, rule, &mut actual).unwrap();
            let detected = detect_rule(&wide, &actual, target).unwrap();
            // Where both rules give the same bytes, nearest-even is reported first.
            prop_assert!(detected == Some(rule) || detected == Some(Rounding::NearestEven));
            let mut predicted = vec![0u8; actual.len()];
            narrow(&wide, target, detected.unwrap(), &mut predicted).unwrap();
            let mut r = vec![0xAA; actual.len()];
            residual(&actual, &predicted, &mut r).unwrap();
            prop_assert!(r.iter().all(|&b| b == 0));

            // A narrow tensor that is not a rounding of the wide one.
            let mut other = actual.clone();
            for (i, s) in crate::test_data::xorshift(noise).take(other.len()).enumerate() {
                if s % 3 == 0 { other[i] ^= (s >> 8) as u8 | 1; }
            }
            residual(&other, &predicted, &mut r).unwrap();
            let mut back = vec![0u8; other.len()];
            residual(&r, &predicted, &mut back).unwrap();
            prop_assert_eq!(&back, &other);

            // The other direction: the wide tensor predicted from its narrow copy.
            let mut widened = vec![0u8; wide.len()];
            widen(&actual, target, &mut widened).unwrap();
            let mut wr = vec![0u8; wide.len()];
            residual(&wide, &widened, &mut wr).unwrap();
            let mut wide_back = vec![0u8; wide.len()];
            residual(&wr, &widened, &mut wide_back).unwrap();
            prop_assert_eq!(&wide_back, &wide);
            if target == Narrow::Bf16 && rule == Rounding::Truncate {
                // Truncation keeps the top half of every non-NaN element: only the low half is left.
                for (v, res) in values.iter().zip(wr.chunks_exact(4)) {
                    if !f32::from_bits(*v).is_nan() {
                        prop_assert_eq!(&res[2..], &[0u8, 0][..]);
                    }
                }
            }
        }
    }

    #[test]
    fn conversion_tags_are_pinned() {
        assert_eq!(Conversion::NarrowNearestEven as u8, 1);
        assert_eq!(Conversion::NarrowTruncate as u8, 2);
        assert_eq!(Conversion::Widen as u8, 3);
        for tag in 0..=255u8 {
            assert_eq!(Conversion::from_tag(tag).map(|c| c as u8), (1..=3).contains(&tag).then_some(tag));
        }
        assert!(Conversion::Widen.fits(Dtype::Bf16, Dtype::F32));
        assert!(!Conversion::Widen.fits(Dtype::F32, Dtype::Bf16));
        assert!(Conversion::NarrowTruncate.fits(Dtype::F32, Dtype::F16));
        assert!(!Conversion::NarrowTruncate.fits(Dtype::F64, Dtype::F16));
        let wide: Vec<u8> = [1.0f32, -2.5, 3.0e-3].iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        let mut bf = vec![0u8; 6];
        narrow(&wide, Narrow::Bf16, Rounding::Truncate, &mut bf).unwrap();
        assert_eq!(
            choose(&wide, Dtype::F32, &bf, Dtype::Bf16),
            Some(Conversion::narrow(detect_rule(&wide, &bf, Narrow::Bf16).unwrap().unwrap()))
        );
        assert_eq!(choose(&bf, Dtype::Bf16, &wide, Dtype::F32), Some(Conversion::Widen));
        assert_eq!(choose(&wide[..8], Dtype::F32, &bf, Dtype::Bf16), None, "element counts differ");
        let mut out = vec![0u8; 6];
        assert!(predict(Conversion::Widen, &wide, Dtype::F32, Dtype::Bf16, &mut out).is_err());
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let mut out = [0u8; 3];
        assert!(narrow(&[0; 8], Narrow::Bf16, Rounding::NearestEven, &mut out).is_err());
        assert!(detect_rule(&[0; 6], &[0; 3], Narrow::F16).is_err());
        assert!(residual(&[0; 2], &[0; 3], &mut [0; 2]).is_err());
    }
}
