//! Fuzzes `codec::grid`: decoding arbitrary bytes as a Grid payload into a chunk of 2- or
//! 4-byte elements must never panic (nor, under ASan, touch memory out of bounds); and a grid
//! built from the input (codes, a scale per group, a few values off the grid) must round-trip
//! bit-exactly through the encoder, whatever the encoder makes of it.
//!
//! Input: 1 byte choosing the element width (bit 0: 2 or 4 bytes) and the test's dtype, 2 bytes
//! little-endian choosing the chunk's element count (capped at 16 Ki), then the payload.
#![no_main]

use ckpt::codec::grid::{self, Arithmetic, Codes, GridPlan, Layout};
use ckpt::codec::Options;
use ckpt::dtype::Dtype;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Some((count, payload)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let width = if choice & 1 == 0 { 2 } else { 4 };
    let elements = usize::from(u16::from_le_bytes(*count)) % (16 << 10);
    let mut out = vec![0u8; elements * width];
    let _ = grid::decode_payload(payload, width, &mut out);

    // The payload bytes as codes on a grid of groups of 32, with scales from the first bytes.
    let dtype = match (width, choice & 2) {
        (4, _) => Dtype::F32,
        (_, 0) => Dtype::Bf16,
        _ => Dtype::F16,
    };
    let codes = match (choice >> 2) & 3 {
        0 => Codes::Signed,
        1 => Codes::Offset,
        2 => Codes::Fp8E4m3,
        _ => Codes::Fp8E5m2,
    };
    let arithmetic = if choice & 16 == 0 { Arithmetic::ProductF32 } else { Arithmetic::ProductExact };
    let plan = GridPlan {
        dtype,
        layout: Layout { cols: 96, k_col: 32, k_row: 1 + u64::from(choice >> 7) },
        arithmetic,
        codes,
        bits: 8,
        zero_point: codes == Codes::Offset,
    };
    let n = payload.len();
    let scale = |g: usize| f32::from(payload.get(g).copied().unwrap_or(1)) * 1e-3 + 1e-4;
    let tensor: Vec<u8> = (0..n)
        .flat_map(|i| {
            let q = codes.value(payload[i], 0).unwrap_or(0.0);
            let bits = grid::element_bits(q, scale(i / 32), dtype, arithmetic);
            // Every 97th value off the grid.
            let bits = if i % 97 == 5 { bits ^ 1 } else { bits };
            bits.to_le_bytes()[..width].to_vec()
        })
        .collect();
    let fitted = grid::fit_tensor(&tensor, &plan);
    if let Ok(Some(stored)) = grid::encode(&fitted, 0, &tensor, &Options::default()) {
        let mut back = vec![0u8; tensor.len()];
        grid::decode_payload(&stored, width, &mut back).expect("own payload decodes");
        assert!(back == tensor, "round trip mismatch");
    }
});
