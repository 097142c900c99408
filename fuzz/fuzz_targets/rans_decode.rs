//! Fuzzes `codec::rans`: decoding arbitrary bytes into a group of any length must never panic
//! (nor, under ASan, touch memory out of bounds), with every context source available or with
//! none; and encoding arbitrary bytes, order-0 and with contexts from the previous byte or from
//! a source derived from the input, must round-trip.
//!
//! Input: 4 bytes little-endian choosing the group length (capped at 1 MiB), then the payload.
//! The context sources offered to the decoder are bytes derived from the payload, as long as
//! the group, in every group and reference slot.
#![no_main]

use ckpt::codec::rans::{self, Source, Sources};

/// Largest group length tried, so one run stays fast.
const MAX_OUT: usize = 1 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize % (MAX_OUT + 1);
    let mut out = vec![0u8; len];
    let _ = rans::decode(payload, &mut out);
    let context: Vec<u8> =
        (0..len).map(|i| payload.get(i % payload.len().max(1)).copied().unwrap_or(0) ^ (i >> 8) as u8).collect();
    let all = Sources { groups: [Some(&context[..]); 8], reference: [Some(&context[..]); 8] };
    let _ = rans::decode_with_sources(payload, &mut out, &all);

    // The payload as a group, and a skewed version of it (so that coding pays), at both the
    // order-0 and the context model, with a source that predicts it in part.
    let skewed: Vec<u8> = payload.iter().enumerate().map(|(i, &b)| if i % 5 == 0 { b } else { b & 3 }).collect();
    for group in [payload, &skewed[..]] {
        let source: Vec<u8> = group.iter().enumerate().map(|(i, &b)| (b >> 2) ^ (i % 3) as u8).collect();
        let candidates = [(Source::Group(1), &source[..]), (Source::Reference(0), &source[..])];
        for contexts in [0, rans::MAX_CONTEXTS] {
            let mut coded = vec![0xEE];
            if rans::encode_with_sources(group, contexts, &candidates, &mut coded).expect("encoding never fails") {
                assert!(coded.len() - 1 < group.len(), "coded is not smaller");
                let mut back = vec![0x55u8; group.len()];
                let only = Sources {
                    groups: [None, Some(&source[..]), None, None, None, None, None, None],
                    reference: [Some(&source[..]), None, None, None, None, None, None, None],
                };
                rans::decode_with_sources(&coded[1..], &mut back, &only).expect("own payload decodes");
                assert!(back == group, "round trip mismatch");
            } else {
                assert_eq!(coded, [0xEE], "out changed although encode returned false");
            }
        }
    }
});
