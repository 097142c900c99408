//! Fuzzes `codec::rans`: decoding arbitrary bytes into a group of any length must never panic
//! (nor, under ASan, touch memory out of bounds), and encoding arbitrary bytes, order-0 and with
//! contexts, must round-trip.
//!
//! Input: 4 bytes little-endian choosing the group length (capped at 1 MiB), then the payload.
#![no_main]

use ckpt::codec::rans;

/// Largest group length tried, so one run stays fast.
const MAX_OUT: usize = 1 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize % (MAX_OUT + 1);
    let mut out = vec![0u8; len];
    let _ = rans::decode(payload, &mut out);

    // The payload as a group, and a skewed version of it (so that coding pays), at both the
    // order-0 and the context model.
    let skewed: Vec<u8> = payload.iter().enumerate().map(|(i, &b)| if i % 5 == 0 { b } else { b & 3 }).collect();
    for group in [payload, &skewed[..]] {
        for contexts in [0, rans::MAX_CONTEXTS] {
            let mut coded = vec![0xEE];
            if rans::encode(group, contexts, &mut coded).expect("encoding never fails") {
                assert!(coded.len() - 1 < group.len(), "coded is not smaller");
                let mut back = vec![0x55u8; group.len()];
                rans::decode(&coded[1..], &mut back).expect("own payload decodes");
                assert!(back == group, "round trip mismatch");
            } else {
                assert_eq!(coded, [0xEE], "out changed although encode returned false");
            }
        }
    }
});
