//! Fuzzes `codec::huffman`: decoding arbitrary bytes must never panic (nor, under ASan, touch
//! memory out of bounds), and encoding arbitrary bytes must round-trip.
//!
//! Input: 4 bytes little-endian choosing the output length (capped at 1 MiB), then the payload.
#![no_main]

use ckpt::codec::huffman;

/// Largest output length tried, so one run stays fast.
const MAX_OUT: usize = 1 << 20;

/// Encodes `data`, and if it was coded, decodes it back and checks it.
fn round_trip(data: &[u8]) {
    let mut coded = vec![0xEE];
    if huffman::encode(data, &mut coded).expect("encoding never fails") {
        assert!(coded.len() - 1 < data.len(), "coded is not smaller");
        let mut back = vec![0u8; data.len()];
        huffman::decode(&coded[1..], &mut back).expect("own payload decodes");
        assert!(back == data, "round trip mismatch");
        // The same payload with any other length is an error.
        let mut other = vec![0u8; data.len() - 1];
        assert!(huffman::decode(&coded[1..], &mut other).is_err());
    } else {
        assert_eq!(coded, [0xEE], "out changed although encode returned false");
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize % (MAX_OUT + 1);
    let mut out = vec![0u8; len];
    let _ = huffman::decode(payload, &mut out);

    round_trip(payload);
    // The same bytes folded onto a small alphabet, so that huff0 (not raw) blocks get coded.
    let alphabet = 1 + (data[0] & 15);
    let folded: Vec<u8> = payload.iter().map(|b| b % alphabet).collect();
    round_trip(&folded);
});
