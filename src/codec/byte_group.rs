//! Byte grouping with exponent extraction: `split` turns elements into one stream per byte
//! position, `regroup` turns the streams back into elements. Both optionally XOR with reference
//! bytes on the way (the delta of [`super::xor_delta`]), so a delta costs no extra pass.
//!
//! Exponent extraction rotates each little-endian element left by one bit before grouping. For
//! BF16 (sign|exponent 8|mantissa 7) the top byte then holds the whole exponent and the low byte
//! holds the mantissa with the sign in its lowest bit; for F32 the top byte is the exponent and
//! the sign lands in bit 0 of byte 0; for F16 and F64 the exponent starts at the top bit of the top
//! byte. Rotation is a bit permutation, so it commutes with XOR: grouping a delta is the delta of
//! the groupings.
//!
//! Layout of the grouped buffer: group `g` (byte `g` of every element, least significant first)
//! occupies `grouped[g * n .. (g + 1) * n]` where `n` is the element count.

use super::{Error, Layout, Result};

macro_rules! split_width {
    ($name:ident, $int:ty, $w:expr) => {
        fn $name(input: &[u8], reference: Option<&[u8]>, rotate: bool, grouped: &mut [u8]) {
            // One monomorphised loop per (xor, rotate) pair keeps branches out of the hot loop.
            #[inline(always)]
            fn run<const XOR: bool, const ROT: bool>(input: &[u8], reference: &[u8], grouped: &mut [u8]) {
                let n = input.len() / $w;
                let groups: [&mut [u8]; $w] = split_groups_mut::<$w>(grouped, n);
                let reference = if XOR { reference } else { input };
                for (i, (e, r)) in input.chunks_exact($w).zip(reference.chunks_exact($w)).enumerate() {
                    let mut v = <$int>::from_le_bytes(e.try_into().expect("width-sized chunk"));
                    if XOR {
                        v ^= <$int>::from_le_bytes(r.try_into().expect("width-sized chunk"));
                    }
                    if ROT {
                        v = v.rotate_left(1);
                    }
                    let bytes = v.to_le_bytes();
                    for g in 0..$w {
                        groups[g][i] = bytes[g];
                    }
                }
            }
            match (reference, rotate) {
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
        fn $name(groups: [&[u8]; $w], reference: Option<&[u8]>, rotate: bool, out: &mut [u8]) {
            #[inline(always)]
            fn run<const XOR: bool, const ROT: bool>(groups: [&[u8]; $w], reference: &[u8], out: &mut [u8]) {
                let n = out.len() / $w;
                let groups: [&[u8]; $w] = std::array::from_fn(|g| &groups[g][..n]);
                for i in 0..n {
                    let mut bytes = [0u8; $w];
                    for g in 0..$w {
                        bytes[g] = groups[g][i];
                    }
                    let mut v = <$int>::from_le_bytes(bytes);
                    if ROT {
                        v = v.rotate_right(1);
                    }
                    let at = i * $w;
                    if XOR {
                        v ^= <$int>::from_le_bytes(reference[at..at + $w].try_into().expect("width-sized slice"));
                    }
                    out[at..at + $w].copy_from_slice(&v.to_le_bytes());
                }
            }
            match (reference, rotate) {
                (Some(r), true) => run::<true, true>(groups, r, out),
                (Some(r), false) => run::<true, false>(groups, r, out),
                (None, true) => run::<false, true>(groups, &[], out),
                (None, false) => run::<false, false>(groups, &[], out),
            }
        }
    };
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

fn check_lengths(layout: Layout, len: usize, reference: Option<&[u8]>, other: usize) -> Result<()> {
    if !matches!(layout.width, 1 | 2 | 4 | 8) {
        return Err(Error::InvalidInput(format!("element width {} is not 1, 2, 4 or 8", layout.width)));
    }
    if !len.is_multiple_of(layout.width) {
        return Err(Error::InvalidInput(format!(
            "{len} bytes is not a whole number of {}-byte elements",
            layout.width
        )));
    }
    if reference.is_some_and(|r| r.len() != len) || other != len {
        return Err(Error::InvalidInput("buffers of different lengths".into()));
    }
    Ok(())
}

/// Splits `input` (optionally XORed with `reference`) into byte groups written to `grouped`,
/// which must have the same length as `input`.
pub fn split(input: &[u8], reference: Option<&[u8]>, layout: Layout, grouped: &mut [u8]) -> Result<()> {
    check_lengths(layout, input.len(), reference, grouped.len())?;
    let rotate = layout.extract_exponent;
    match layout.width {
        1 => match reference {
            Some(r) => super::xor_delta::xor_into(input, r, grouped)?,
            None => grouped.copy_from_slice(input),
        },
        2 => split2(input, reference, rotate, grouped),
        4 => split4(input, reference, rotate, grouped),
        _ => split8(input, reference, rotate, grouped),
    }
    Ok(())
}

/// Inverse of [`split`]: rebuilds elements from `groups` (one slice of `out.len() / width` bytes
/// per byte position) into `out`, XORing with `reference` if given.
pub fn regroup(groups: &[&[u8]], reference: Option<&[u8]>, layout: Layout, out: &mut [u8]) -> Result<()> {
    check_lengths(layout, out.len(), reference, out.len())?;
    let n = out.len() / layout.width;
    if groups.len() != layout.width || groups.iter().any(|g| g.len() != n) {
        return Err(Error::InvalidInput("group count or group length does not match the output".into()));
    }
    let rotate = layout.extract_exponent;
    match layout.width {
        1 => match reference {
            Some(r) => super::xor_delta::xor_into(groups[0], r, out)?,
            None => out.copy_from_slice(groups[0]),
        },
        2 => regroup2([groups[0], groups[1]], reference, rotate, out),
        4 => regroup4([groups[0], groups[1], groups[2], groups[3]], reference, rotate, out),
        _ => regroup8(std::array::from_fn(|g| groups[g]), reference, rotate, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layouts() -> impl Strategy<Value = Layout> {
        (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], any::<bool>())
            .prop_map(|(width, x)| Layout { width, extract_exponent: x && width > 1 })
    }

    #[test]
    fn bf16_exponent_lands_in_group_1() {
        // -1.5 in bf16 = 0xBFC0: sign 1, exponent 0x7F, mantissa 0x40.
        let input = 0xBFC0u16.to_le_bytes();
        let mut grouped = [0u8; 2];
        split(&input, None, Layout { width: 2, extract_exponent: true }, &mut grouped).unwrap();
        assert_eq!(grouped[1], 0x7F, "exponent byte");
        assert_eq!(grouped[0], (0x40 << 1) | 1, "mantissa then sign in bit 0");
    }

    #[test]
    fn f32_golden_vector() {
        // 1.0f32 = 0x3F800000 and -2.0f32 = 0xC0000000, two elements.
        let mut input = Vec::new();
        input.extend_from_slice(&1.0f32.to_le_bytes());
        input.extend_from_slice(&(-2.0f32).to_le_bytes());
        let mut grouped = [0u8; 8];
        split(&input, None, Layout { width: 4, extract_exponent: true }, &mut grouped).unwrap();
        // rotl(0x3F800000,1) = 0x7F000000; rotl(0xC0000000,1) = 0x80000001.
        assert_eq!(grouped, [0x00, 0x01, 0, 0, 0, 0, 0x7F, 0x80]);
    }

    proptest! {
        #[test]
        fn split_regroup_round_trip(layout in layouts(), elems in 0usize..300, seed in any::<u64>(), with_ref in any::<bool>()) {
            let len = elems * layout.width;
            let mut state = seed | 1;
            let mut next = || { state ^= state << 13; state ^= state >> 7; state ^= state << 17; state as u8 };
            let input: Vec<u8> = (0..len).map(|_| next()).collect();
            let reference: Vec<u8> = (0..len).map(|_| next()).collect();
            let r = with_ref.then_some(reference.as_slice());
            let mut grouped = vec![0u8; len];
            split(&input, r, layout, &mut grouped).unwrap();
            let groups: Vec<&[u8]> = if len == 0 { vec![&[][..]; layout.width] } else { grouped.chunks(elems).collect() };
            let mut out = vec![0u8; len];
            regroup(&groups, r, layout, &mut out).unwrap();
            prop_assert_eq!(out, input);
        }
    }

    #[test]
    fn rejects_partial_elements() {
        let mut g = [0u8; 3];
        assert!(split(&[1, 2, 3], None, Layout { width: 2, extract_exponent: false }, &mut g).is_err());
    }
}
