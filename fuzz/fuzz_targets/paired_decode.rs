//! Fuzzes `codec::paired`: decoding arbitrary bytes as a Paired payload and the Remainder payload
//! below it, into groups of any length and straight into 2-byte elements, must never panic (nor,
//! under ASan, touch memory out of bounds); and coding arbitrary groups as a pair, with every `k`
//! their values allow, must round-trip both ways.
//!
//! Input: 4 bytes little-endian choosing the group length (capped at 1 MiB), 4 bytes choosing
//! where the rest splits into the Paired and the Remainder payload, then the payloads.
#![no_main]

use ckpt::codec::paired::{self, Plan};
use ckpt::codec::select::GroupStats;
use ckpt::codec::{byte_group, Grouping};

/// Largest group length tried, so one run stays fast.
const MAX_OUT: usize = 1 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let Some((split, payloads)) = rest.split_first_chunk::<4>() else {
        return;
    };
    let len = u32::from_le_bytes(*len) as usize % (MAX_OUT + 1);
    let split = u32::from_le_bytes(*split) as usize % (payloads.len() + 1);
    let (upper_stored, lower_stored) = payloads.split_at(split);
    let (mut upper, mut lower) = (vec![0u8; len], vec![0u8; len]);
    let _ = paired::decode(upper_stored, lower_stored, &mut upper, &mut lower);
    // The same payloads straight into 2-byte elements.
    let (mut elements, mut scratch) = (vec![0u8; 2 * len], vec![0u8; 2 * len]);
    let _ = paired::decode_elements(upper_stored, lower_stored, &mut scratch, &mut elements);

    // The payload bytes as a pair of groups: the upper one narrowed to few values (as exponents
    // are) so that a plan exists, the lower one as it is.
    let n = payloads.len() / 2;
    let (a, b) = payloads.split_at(n);
    let b = &b[..n];
    let narrowed: Vec<u8> = a.iter().map(|&x| 100 + x % 23).collect();
    for group in [a, &narrowed[..]] {
        let stats = GroupStats::of(group);
        let Some(plan) = Plan::for_histogram(&stats.histogram) else {
            continue;
        };
        let mut symbols = vec![0u8; n];
        plan.symbols(group, b, &mut symbols);
        let (mut up, mut low) = (vec![0xEE], vec![0xEE]);
        if paired::encode(&plan, &symbols, None, b, &mut up, &mut low).expect("encoding never fails") {
            assert!(up.len() - 1 < n && low.len() - 1 < n, "a pair is not smaller");
            let (mut u, mut l) = (vec![0x55u8; n], vec![0x55u8; n]);
            paired::decode(&up[1..], &low[1..], &mut u, &mut l).expect("own payload decodes");
            assert!(u == group && l == b, "round trip mismatch");
            let mut elements = vec![0x55u8; 2 * n];
            let mut scratch = vec![0u8; 2 * n];
            paired::decode_elements(&up[1..], &low[1..], &mut scratch, &mut elements).expect("own payload decodes");
            let mut regrouped = vec![0u8; 2 * n];
            let grouping = Grouping { width: 2, extract_exponent: true };
            byte_group::regroup(&[b, group], None, grouping, &mut regrouped).expect("regroup");
            assert!(elements == regrouped, "elements differ from the regrouped groups");
        } else {
            assert_eq!((up, low), (vec![0xEE], vec![0xEE]), "out changed although encode returned false");
        }
    }
});
