//! Byte grouping with exponent extraction: `split` turns elements into one stream per byte
//! position, `regroup` turns the streams back into elements. Both optionally XOR with reference
//! bytes on the way (the delta of [`super::xor_delta`]), so a delta costs no extra pass.
//!
//! Exponent extraction moves each little-endian element's sign bit from the top bit to just
//! below the top byte, shifting the 8 bits after it up into the top byte (a rotation of the top
//! 9 bits). For BF16 and F32 (sign|exponent 8|...) the top byte then holds exactly the exponent
//! and the sign becomes the top bit of the most significant mantissa byte; for F16 and F64 the
//! exponent starts at the top bit of the top byte. The lower mantissa bytes are left alone, so
//! values with trailing zero mantissa bits (weights upcast from BF16 or F16) keep all-zero low
//! groups. It is a bit permutation, so it commutes with XOR: grouping a delta is the delta of
//! the groupings.
//!
//! Layout of the grouped buffer: group `g` (byte `g` of every element, least significant first)
//! occupies `grouped[g * n .. (g + 1) * n]` where `n` is the element count.

use super::{Error, Grouping, Result};

/// The exponent extraction permutation on one element of type `$int` (see the module doc):
/// bits `top-1 .. top-8` move up one place into the top byte, the sign (top bit) moves down to
/// bit `top-9`, every lower bit stays.
macro_rules! extract_exponent {
    ($int:ty, $v:expr) => {{
        const BITS: u32 = <$int>::BITS;
        const TOP_BYTE: $int = 0xFF << (BITS - 8);
        const SIGN_SLOT: $int = 1 << (BITS - 9);
        const LOW: $int = SIGN_SLOT - 1;
        let v: $int = $v;
        ((v << 1) & TOP_BYTE) | ((v >> 8) & SIGN_SLOT) | (v & LOW)
    }};
}

/// Inverse of [`extract_exponent!`].
macro_rules! restore_exponent {
    ($int:ty, $v:expr) => {{
        const BITS: u32 = <$int>::BITS;
        const SIGN: $int = 1 << (BITS - 1);
        const EXPONENT: $int = 0xFF << (BITS - 9);
        const LOW: $int = (1 << (BITS - 9)) - 1;
        let v: $int = $v;
        ((v >> 1) & EXPONENT) | ((v << 8) & SIGN) | (v & LOW)
    }};
}

macro_rules! split_width {
    ($name:ident, $int:ty, $w:expr) => {
        fn $name(input: &[u8], reference: Option<&[u8]>, extract: bool, grouped: &mut [u8]) {
            // One monomorphised loop per (xor, extract) pair keeps branches out of the hot loop.
            #[inline(always)]
            fn run<const XOR: bool, const EXP: bool>(input: &[u8], reference: &[u8], grouped: &mut [u8]) {
                let n = input.len() / $w;
                let mut groups: [&mut [u8]; $w] = split_groups_mut::<$w>(grouped, n);
                let reference = if XOR { reference } else { input };
                // The vector loop takes whole blocks; the scalar loop below finishes the tail.
                let done = simd::$name::<XOR, EXP>(input, reference, &mut groups);
                let (input, reference) = (&input[done * $w..], &reference[done * $w..]);
                let groups: [&mut [u8]; $w] = groups.map(|g| &mut g[done..]);
                for (i, (e, r)) in input.chunks_exact($w).zip(reference.chunks_exact($w)).enumerate() {
                    let mut v = <$int>::from_le_bytes(e.try_into().expect("width-sized chunk"));
                    if XOR {
                        v ^= <$int>::from_le_bytes(r.try_into().expect("width-sized chunk"));
                    }
                    if EXP {
                        v = extract_exponent!($int, v);
                    }
                    let bytes = v.to_le_bytes();
                    for g in 0..$w {
                        groups[g][i] = bytes[g];
                    }
                }
            }
            match (reference, extract) {
                (Some(r), true) => run::<true, true>(input, r, grouped),
                (Some(r), false) => run::<true, false>(input, r, grouped),
                (None, true) => run::<false, true>(input, input, grouped),
                (None, false) => run::<false, false>(input, input, grouped),
            }
        }
    };
}

macro_rules! regroup_width {
    ($name:ident, $int:ty, $w:expr) => {
        fn $name(groups: [&[u8]; $w], reference: Option<&[u8]>, extract: bool, out: &mut [u8]) {
            #[inline(always)]
            fn run<const XOR: bool, const EXP: bool>(groups: [&[u8]; $w], reference: &[u8], out: &mut [u8]) {
                let n = out.len() / $w;
                let groups: [&[u8]; $w] = std::array::from_fn(|g| &groups[g][..n]);
                // The vector loop takes whole blocks; the scalar loop below finishes the tail.
                let done = simd::$name::<XOR, EXP>(groups, reference, out);
                let n = n - done;
                let groups: [&[u8]; $w] = groups.map(|g| &g[done..]);
                let reference = if XOR { &reference[done * $w..] } else { reference };
                let out = &mut out[done * $w..];
                for i in 0..n {
                    let mut bytes = [0u8; $w];
                    for g in 0..$w {
                        bytes[g] = groups[g][i];
                    }
                    let mut v = <$int>::from_le_bytes(bytes);
                    if EXP {
                        v = restore_exponent!($int, v);
                    }
                    let at = i * $w;
                    if XOR {
                        v ^= <$int>::from_le_bytes(reference[at..at + $w].try_into().expect("width-sized slice"));
                    }
                    out[at..at + $w].copy_from_slice(&v.to_le_bytes());
                }
            }
            match (reference, extract) {
                (Some(r), true) => run::<true, true>(groups, r, out),
                (Some(r), false) => run::<true, false>(groups, r, out),
                (None, true) => run::<false, true>(groups, &[], out),
                (None, false) => run::<false, false>(groups, &[], out),
            }
        }
    };
}

/// Hand-written SSE2 loops for the 2- and 4-byte element widths (every float checkpoint).
///
/// Why by hand: the scalar loops above compile to one element per iteration (LLVM does not
/// vectorise the strided byte scatter/gather), which made `regroup` about 20% of decompression
/// time. No maintained crate offers a byte-plane transpose with a fused XOR and bit permutation.
/// SSE2 is part of the x86-64 baseline, so no runtime feature detection is needed. Each function
/// handles whole blocks of 16 elements and returns how many elements it did; the caller's scalar
/// loop (the reference implementation, also used on other architectures) does the rest. The
/// proptests below check both paths against each other at every length around the block size.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use std::arch::x86_64::*;

    /// Elements per vector block.
    const BLOCK: usize = 16;

    /// [`extract_exponent!`] on 16 elements given as their two top byte groups (`hi` the top
    /// byte, `lo` the one below): `hi' = hi << 1 | lo >> 7`, `lo' = (hi & 0x80) | (lo & 0x7F)`.
    /// The permutation only touches the top two bytes, so it runs once per 16 elements on the
    /// packed groups instead of on every element vector.
    #[inline(always)]
    fn extract_top_bytes(hi: __m128i, lo: __m128i) -> (__m128i, __m128i) {
        // SAFETY: SSE2 is always available on x86_64.
        unsafe {
            let (b7, low7) = (_mm_set1_epi8(0x80u8 as i8), _mm_set1_epi8(0x7F));
            // 16-bit shifts carry bits between neighbouring bytes; the masks drop them.
            let hi_up = _mm_and_si128(_mm_slli_epi16(hi, 1), _mm_set1_epi8(0xFEu8 as i8));
            let lo_top = _mm_and_si128(_mm_srli_epi16(lo, 7), _mm_set1_epi8(0x01));
            let new_lo = _mm_or_si128(_mm_and_si128(hi, b7), _mm_and_si128(lo, low7));
            (_mm_or_si128(hi_up, lo_top), new_lo)
        }
    }

    /// Inverse of [`extract_top_bytes`]: `hi = hi' >> 1 | (lo' & 0x80)`,
    /// `lo = (hi' << 7) | (lo' & 0x7F)`.
    #[inline(always)]
    fn restore_top_bytes(hi: __m128i, lo: __m128i) -> (__m128i, __m128i) {
        // SAFETY: SSE2 is always available on x86_64.
        unsafe {
            let (b7, low7) = (_mm_set1_epi8(0x80u8 as i8), _mm_set1_epi8(0x7F));
            let hi_down = _mm_and_si128(_mm_srli_epi16(hi, 1), low7);
            let hi_bit0 = _mm_and_si128(_mm_slli_epi16(hi, 7), b7);
            let old_hi = _mm_or_si128(hi_down, _mm_and_si128(lo, b7));
            (old_hi, _mm_or_si128(hi_bit0, _mm_and_si128(lo, low7)))
        }
    }

    /// Loads 16 bytes at `s[at..at + 16]` (bounds-checked).
    #[inline(always)]
    fn load(s: &[u8], at: usize) -> __m128i {
        let bytes: &[u8; 16] = s[at..at + 16].try_into().expect("16-byte slice");
        // SAFETY: `bytes` is 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    }

    /// Stores 16 bytes to `s[at..at + 16]` (bounds-checked).
    #[inline(always)]
    fn store(s: &mut [u8], at: usize, v: __m128i) {
        let bytes: &mut [u8; 16] = (&mut s[at..at + 16]).try_into().expect("16-byte slice");
        // SAFETY: `bytes` is 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), v) }
    }

    /// Narrows eight u16 lanes holding values `0..=255` from each of `a` and `b` to 16 bytes.
    #[inline(always)]
    fn pack16(a: __m128i, b: __m128i) -> __m128i {
        // SAFETY: SSE2 is always available on x86_64.
        unsafe { _mm_packus_epi16(a, b) }
    }

    /// Narrows four u32 lanes holding values `0..=255` from each of four vectors to 16 bytes.
    #[inline(always)]
    fn pack32(v: [__m128i; 4]) -> __m128i {
        // SAFETY: SSE2 is always available on x86_64. Lanes are 0..=255, so the signed
        // saturation of packs_epi32 leaves them unchanged.
        unsafe { _mm_packus_epi16(_mm_packs_epi32(v[0], v[1]), _mm_packs_epi32(v[2], v[3])) }
    }

    /// XORs `v` with the 16 reference bytes at `at` when `XOR`.
    #[inline(always)]
    fn xor_ref<const XOR: bool>(v: __m128i, reference: &[u8], at: usize) -> __m128i {
        if XOR {
            // SAFETY: SSE2 is always available on x86_64.
            unsafe { _mm_xor_si128(v, load(reference, at)) }
        } else {
            v
        }
    }

    pub(super) fn split2<const XOR: bool, const EXP: bool>(
        input: &[u8],
        reference: &[u8],
        groups: &mut [&mut [u8]; 2],
    ) -> usize {
        let blocks = input.len() / 2 / BLOCK;
        for b in 0..blocks {
            let (i, at) = (b * BLOCK, b * BLOCK * 2);
            let v = [
                xor_ref::<XOR>(load(input, at), reference, at),
                xor_ref::<XOR>(load(input, at + 16), reference, at + 16),
            ];
            // SAFETY: SSE2 is always available on x86_64.
            let (mut low, mut high) = unsafe {
                let mask = _mm_set1_epi16(0xFF);
                (
                    pack16(_mm_and_si128(v[0], mask), _mm_and_si128(v[1], mask)),
                    pack16(_mm_srli_epi16(v[0], 8), _mm_srli_epi16(v[1], 8)),
                )
            };
            if EXP {
                (high, low) = extract_top_bytes(high, low);
            }
            store(groups[0], i, low);
            store(groups[1], i, high);
        }
        blocks * BLOCK
    }

    pub(super) fn split4<const XOR: bool, const EXP: bool>(
        input: &[u8],
        reference: &[u8],
        groups: &mut [&mut [u8]; 4],
    ) -> usize {
        let blocks = input.len() / 4 / BLOCK;
        for b in 0..blocks {
            let (i, at) = (b * BLOCK, b * BLOCK * 4);
            let mut v = [load(input, at), load(input, at + 16), load(input, at + 32), load(input, at + 48)];
            for (k, v) in v.iter_mut().enumerate() {
                *v = xor_ref::<XOR>(*v, reference, at + 16 * k);
            }
            // SAFETY: SSE2 is always available on x86_64.
            unsafe {
                let mask = _mm_set1_epi32(0xFF);
                let byte0 = |x| _mm_and_si128(x, mask);
                let byte1 = |x| _mm_and_si128(_mm_srli_epi32(x, 8), mask);
                let byte2 = |x| _mm_and_si128(_mm_srli_epi32(x, 16), mask);
                let byte3 = |x| _mm_srli_epi32(x, 24);
                store(groups[0], i, pack32([byte0(v[0]), byte0(v[1]), byte0(v[2]), byte0(v[3])]));
                store(groups[1], i, pack32([byte1(v[0]), byte1(v[1]), byte1(v[2]), byte1(v[3])]));
                let mut g2 = pack32([byte2(v[0]), byte2(v[1]), byte2(v[2]), byte2(v[3])]);
                let mut g3 = pack32([byte3(v[0]), byte3(v[1]), byte3(v[2]), byte3(v[3])]);
                if EXP {
                    (g3, g2) = extract_top_bytes(g3, g2);
                }
                store(groups[2], i, g2);
                store(groups[3], i, g3);
            }
        }
        blocks * BLOCK
    }

    pub(super) fn regroup2<const XOR: bool, const EXP: bool>(
        groups: [&[u8]; 2],
        reference: &[u8],
        out: &mut [u8],
    ) -> usize {
        let blocks = out.len() / 2 / BLOCK;
        for b in 0..blocks {
            let (i, at) = (b * BLOCK, b * BLOCK * 2);
            let (mut low, mut high) = (load(groups[0], i), load(groups[1], i));
            if EXP {
                (high, low) = restore_top_bytes(high, low);
            }
            // SAFETY: SSE2 is always available on x86_64.
            let v = unsafe { [_mm_unpacklo_epi8(low, high), _mm_unpackhi_epi8(low, high)] };
            for (k, v) in v.into_iter().enumerate() {
                store(out, at + 16 * k, xor_ref::<XOR>(v, reference, at + 16 * k));
            }
        }
        blocks * BLOCK
    }

    pub(super) fn regroup4<const XOR: bool, const EXP: bool>(
        groups: [&[u8]; 4],
        reference: &[u8],
        out: &mut [u8],
    ) -> usize {
        let blocks = out.len() / 4 / BLOCK;
        for b in 0..blocks {
            let (i, at) = (b * BLOCK, b * BLOCK * 4);
            // (No `array::map` in these loops: it is not always inlined, and a call per block
            // made this loop 4x slower.)
            let mut g = [load(groups[0], i), load(groups[1], i), load(groups[2], i), load(groups[3], i)];
            if EXP {
                (g[3], g[2]) = restore_top_bytes(g[3], g[2]);
            }
            // SAFETY: SSE2 is always available on x86_64.
            let v = unsafe {
                let (b01_lo, b01_hi) = (_mm_unpacklo_epi8(g[0], g[1]), _mm_unpackhi_epi8(g[0], g[1]));
                let (b23_lo, b23_hi) = (_mm_unpacklo_epi8(g[2], g[3]), _mm_unpackhi_epi8(g[2], g[3]));
                [
                    _mm_unpacklo_epi16(b01_lo, b23_lo),
                    _mm_unpackhi_epi16(b01_lo, b23_lo),
                    _mm_unpacklo_epi16(b01_hi, b23_hi),
                    _mm_unpackhi_epi16(b01_hi, b23_hi),
                ]
            };
            for (k, v) in v.into_iter().enumerate() {
                store(out, at + 16 * k, xor_ref::<XOR>(v, reference, at + 16 * k));
            }
        }
        blocks * BLOCK
    }

    /// 8-byte elements (F64, I64, U64) are rare in checkpoints: scalar only.
    pub(super) fn split8<const XOR: bool, const EXP: bool>(_: &[u8], _: &[u8], _: &mut [&mut [u8]; 8]) -> usize {
        0
    }

    /// 8-byte elements (F64, I64, U64) are rare in checkpoints: scalar only.
    pub(super) fn regroup8<const XOR: bool, const EXP: bool>(_: [&[u8]; 8], _: &[u8], _: &mut [u8]) -> usize {
        0
    }
}

/// Other architectures: the scalar loops do everything.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    pub(super) fn split2<const X: bool, const R: bool>(_: &[u8], _: &[u8], _: &mut [&mut [u8]; 2]) -> usize {
        0
    }
    pub(super) fn split4<const X: bool, const R: bool>(_: &[u8], _: &[u8], _: &mut [&mut [u8]; 4]) -> usize {
        0
    }
    pub(super) fn split8<const X: bool, const R: bool>(_: &[u8], _: &[u8], _: &mut [&mut [u8]; 8]) -> usize {
        0
    }
    pub(super) fn regroup2<const X: bool, const R: bool>(_: [&[u8]; 2], _: &[u8], _: &mut [u8]) -> usize {
        0
    }
    pub(super) fn regroup4<const X: bool, const R: bool>(_: [&[u8]; 4], _: &[u8], _: &mut [u8]) -> usize {
        0
    }
    pub(super) fn regroup8<const X: bool, const R: bool>(_: [&[u8]; 8], _: &[u8], _: &mut [u8]) -> usize {
        0
    }
}

split_width!(split2, u16, 2);
split_width!(split4, u32, 4);
split_width!(split8, u64, 8);
regroup_width!(regroup2, u16, 2);
regroup_width!(regroup4, u32, 4);
regroup_width!(regroup8, u64, 8);

fn split_groups_mut<const W: usize>(grouped: &mut [u8], n: usize) -> [&mut [u8]; W] {
    let mut rest = &mut grouped[..n * W];
    std::array::from_fn(|_| {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        head
    })
}

fn check_lengths(grouping: Grouping, len: usize, reference: Option<&[u8]>, other: usize) -> Result<()> {
    if !matches!(grouping.width, 1 | 2 | 4 | 8) {
        return Err(Error::InvalidInput(format!("element width {} is not 1, 2, 4 or 8", grouping.width)));
    }
    if !len.is_multiple_of(grouping.width) {
        return Err(Error::InvalidInput(format!(
            "{len} bytes is not a whole number of {}-byte elements",
            grouping.width
        )));
    }
    if reference.is_some_and(|r| r.len() != len) || other != len {
        return Err(Error::InvalidInput("buffers of different lengths".into()));
    }
    Ok(())
}

/// Splits `input` (optionally XORed with `reference`) into byte groups written to `grouped`,
/// which must have the same length as `input`.
pub fn split(input: &[u8], reference: Option<&[u8]>, grouping: Grouping, grouped: &mut [u8]) -> Result<()> {
    check_lengths(grouping, input.len(), reference, grouped.len())?;
    let extract = grouping.extract_exponent;
    match grouping.width {
        1 => match reference {
            Some(r) => super::xor_delta::xor_into(input, r, grouped)?,
            None => grouped.copy_from_slice(input),
        },
        2 => split2(input, reference, extract, grouped),
        4 => split4(input, reference, extract, grouped),
        _ => split8(input, reference, extract, grouped),
    }
    Ok(())
}

/// Inverse of [`split`]: rebuilds elements from `groups` (one slice of `out.len() / width` bytes
/// per byte position) into `out`, XORing with `reference` if given.
pub fn regroup(groups: &[&[u8]], reference: Option<&[u8]>, grouping: Grouping, out: &mut [u8]) -> Result<()> {
    check_lengths(grouping, out.len(), reference, out.len())?;
    let n = out.len() / grouping.width;
    if groups.len() != grouping.width || groups.iter().any(|g| g.len() != n) {
        return Err(Error::InvalidInput("group count or group length does not match the output".into()));
    }
    let extract = grouping.extract_exponent;
    match grouping.width {
        1 => match reference {
            Some(r) => super::xor_delta::xor_into(groups[0], r, out)?,
            None => out.copy_from_slice(groups[0]),
        },
        2 => regroup2([groups[0], groups[1]], reference, extract, out),
        4 => regroup4([groups[0], groups[1], groups[2], groups[3]], reference, extract, out),
        _ => regroup8(std::array::from_fn(|g| groups[g]), reference, extract, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn groupings() -> impl Strategy<Value = Grouping> {
        (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], any::<bool>())
            .prop_map(|(width, x)| Grouping { width, extract_exponent: x && width > 1 })
    }

    #[test]
    fn bf16_exponent_lands_in_group_1() {
        // -1.5 in bf16 = 0xBFC0: sign 1, exponent 0x7F, mantissa 0x40.
        let input = 0xBFC0u16.to_le_bytes();
        let mut grouped = [0u8; 2];
        split(&input, None, Grouping { width: 2, extract_exponent: true }, &mut grouped).unwrap();
        assert_eq!(grouped[1], 0x7F, "exponent byte");
        assert_eq!(grouped[0], 0x80 | 0x40, "sign in bit 7, then the mantissa");
    }

    #[test]
    fn f32_golden_vector() {
        // 1.0f32 = 0x3F800000 and -2.0f32 = 0xC0000000, two elements.
        let mut input = Vec::new();
        input.extend_from_slice(&1.0f32.to_le_bytes());
        input.extend_from_slice(&(-2.0f32).to_le_bytes());
        let mut grouped = [0u8; 8];
        split(&input, None, Grouping { width: 4, extract_exponent: true }, &mut grouped).unwrap();
        // 1.0: exponent 0x7F, sign 0 -> 0x7F000000; -2.0: exponent 0x80, sign 1 -> 0x80800000.
        // Groups 0 and 1 (the low mantissa bytes) stay zero: the sign does not land there.
        assert_eq!(grouped, [0, 0, 0, 0, 0x00, 0x80, 0x7F, 0x80]);
    }

    proptest! {
        #[test]
        fn split_regroup_round_trip(grouping in groupings(), elems in 0usize..300, seed in any::<u64>(), with_ref in any::<bool>()) {
            let len = elems * grouping.width;
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state as u8 };
            let input: Vec<u8> = (0..len).map(|_| next()).collect();
            let reference: Vec<u8> = (0..len).map(|_| next()).collect();
            let r = with_ref.then_some(reference.as_slice());
            let mut grouped = vec![0u8; len];
            split(&input, r, grouping, &mut grouped).unwrap();
            let groups: Vec<&[u8]> = if len == 0 { vec![&[][..]; grouping.width] } else { grouped.chunks(elems).collect() };
            let mut out = vec![0u8; len];
            regroup(&groups, r, grouping, &mut out).unwrap();
            prop_assert_eq!(out, input);
        }
    }

    /// The definition, one element at a time, bit by bit, independent of both the scalar and
    /// the vector loops: byte `g` of element `i` (XORed; then, if extracting the exponent, with
    /// bit `p` moved to `new_position(p)`) lands at `grouped[g * n + i]`.
    fn split_by_definition(input: &[u8], reference: Option<&[u8]>, grouping: Grouping) -> Vec<u8> {
        let w = grouping.width;
        let n = input.len() / w;
        let bits = 8 * w as u32;
        // The sign (top bit) goes just below the top byte; the 8 bits below it move up one.
        let new_position = |p: u32| match p {
            p if p == bits - 1 => bits - 9,
            p if p >= bits - 9 => p + 1,
            p => p,
        };
        let mut grouped = vec![0u8; input.len()];
        for i in 0..n {
            let mut v = 0u64;
            for b in 0..w {
                let x = input[i * w + b] ^ reference.map_or(0, |r| r[i * w + b]);
                v |= u64::from(x) << (8 * b);
            }
            if grouping.extract_exponent {
                v = (0..bits).filter(|&p| v >> p & 1 == 1).map(|p| 1u64 << new_position(p)).sum();
            }
            for g in 0..w {
                grouped[g * n + i] = (v >> (8 * g)) as u8;
            }
        }
        grouped
    }

    proptest! {
        /// Lengths around the 16-element vector block, so both the vector loop and the scalar
        /// tail are compared with the definition, in both directions.
        #[test]
        fn split_and_regroup_match_the_definition(grouping in groupings(), elems in 0usize..200, seed in any::<u64>(), with_ref in any::<bool>()) {
            let len = elems * grouping.width;
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state as u8 };
            let input: Vec<u8> = (0..len).map(|_| next()).collect();
            let reference: Vec<u8> = (0..len).map(|_| next()).collect();
            let r = with_ref.then_some(reference.as_slice());
            let expected = split_by_definition(&input, r, grouping);
            let mut grouped = vec![0u8; len];
            split(&input, r, grouping, &mut grouped).unwrap();
            prop_assert_eq!(&grouped, &expected);
            let groups: Vec<&[u8]> = (0..grouping.width).map(|g| &expected[g * elems..(g + 1) * elems]).collect();
            let mut out = vec![0u8; len];
            regroup(&groups, r, grouping, &mut out).unwrap();
            prop_assert_eq!(out, input);
        }
    }

    #[test]
    fn rejects_partial_elements() {
        let mut g = [0u8; 3];
        assert!(split(&[1, 2, 3], None, Grouping { width: 2, extract_exponent: false }, &mut g).is_err());
    }
}
