//! Fuzzes `codec::sparse`: decoding arbitrary bytes, plain or XORed into a buffer, must never
//! panic (nor, under ASan, touch memory out of bounds), and encoding arbitrary bytes must
//! round-trip.
//!
//! Input: 4 bytes little-endian choosing the group length (capped at 1 MiB), then the payload.
#![no_main]

use ckpt::codec::sparse;

/// Largest group length tried, so one run stays fast.
const MAX_OUT: usize = 1 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize % (MAX_OUT + 1);
    let mut out = vec![0u8; len];
    let _ = sparse::decode(payload, &mut out, false);
    let _ = sparse::decode(payload, &mut out, true);
    let _ = sparse::apply(payload, &mut out, true);

    // The bytes with most of them zeroed, so that the transform pays and gets coded.
    let group: Vec<u8> = payload.iter().enumerate().map(|(i, &b)| if i % 7 == 0 { b } else { 0 }).collect();
    let mut coded = vec![0xEE];
    if sparse::encode(&group, 1, &mut coded).expect("encoding never fails") {
        assert!(coded.len() - 1 < group.len(), "coded is not smaller");
        let mut back = vec![0x55u8; group.len()];
        sparse::decode(&coded[1..], &mut back, false).expect("own payload decodes");
        assert!(back == group, "round trip mismatch");
        let mut acc = payload.to_vec();
        sparse::decode(&coded[1..], &mut acc, true).expect("own payload applies");
        assert!(acc.iter().zip(payload).zip(&group).all(|((a, p), g)| *a == p ^ g), "xor mismatch");
    } else {
        assert_eq!(coded, [0xEE], "out changed although encode returned false");
    }
});
