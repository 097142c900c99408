use super::*;
use proptest::prelude::*;

fn round_trip(group: &[u8], contexts: usize) -> Option<usize> {
    let mut out = Vec::new();
    if !encode(group, contexts, &mut out).unwrap() {
        assert!(out.is_empty());
        return None;
    }
    assert!(out.len() < group.len());
    let mut back = vec![0xA5; group.len()];
    decode(&out, &mut back).unwrap();
    assert!(back == group, "round trip");
    Some(out.len())
}

/// Adversarial distributions: empty, one byte, all one symbol, all distinct, alternating,
/// and one rare symbol among zeros (sub-one-bit coding).
#[test]
fn adversarial_distributions_round_trip() {
    assert_eq!(round_trip(&[], 15), None);
    assert_eq!(round_trip(&[7], 15), None, "one byte never shrinks");
    let same = vec![0x3Cu8; 100_000];
    let n = round_trip(&same, 15).unwrap();
    assert!(n < 100, "one symbol costs almost nothing: {n}");
    let distinct: Vec<u8> = (0..=255u8).collect();
    assert_eq!(round_trip(&distinct, 15), None);
    let distinct_long: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    // Order-0 cannot shrink it; order-1 (next = previous + 1) only if the tables pay.
    let _ = round_trip(&distinct_long, 15);
    let _ = round_trip(&distinct_long, 0);
    let alternating: Vec<u8> = (0..50_000).map(|i| if i % 2 == 0 { 1 } else { 200 }).collect();
    let order0 = round_trip(&alternating, 0).unwrap();
    let order1 = round_trip(&alternating, 15).unwrap();
    assert!(order0 > 50_000 / 8 - 100, "order-0 pays a bit per byte: {order0}");
    assert!(order1 < 200, "order-1 predicts every byte: {order1}");
}

/// A group that is 99.5% zeros costs well below Huffman's floor of one bit per byte.
#[test]
fn sparse_groups_code_below_one_bit_per_byte() {
    let group: Vec<u8> = crate::test_data::xorshift(5)
        .take(131_072)
        .map(|s| if s % 200 == 0 { (s >> 40) as u8 | 1 } else { 0 })
        .collect();
    let n = round_trip(&group, 0).unwrap();
    assert!(n * 8 < group.len() / 4, "{n} bytes for {} bytes", group.len());
}

/// Exponent-like bytes whose value follows the previous one: order-1 beats order-0.
#[test]
fn context_beats_order_zero_on_correlated_bytes() {
    let mut prev = 120u8;
    let group: Vec<u8> = crate::test_data::xorshift(11)
        .take(131_072)
        .map(|s| {
            prev = match s % 16 {
                0 => prev.saturating_sub(1).max(110),
                1 => (prev + 1).min(125),
                _ => prev,
            };
            prev
        })
        .collect();
    let order0 = round_trip(&group, 0).unwrap();
    let order1 = round_trip(&group, 15).unwrap();
    assert!((order1 as f64) < 0.7 * order0 as f64, "order-1 {order1} vs order-0 {order0}");
}

#[test]
fn order1_entropy_sees_what_order0_cannot() {
    let alternating: Vec<u8> = (0..1000).map(|i| if i % 2 == 0 { 1 } else { 2 }).collect();
    assert!(order1_entropy_bits(&alternating) < 1e-9, "each byte follows from the one before");
    let stats = crate::codec::select::GroupStats::of(&alternating);
    assert!((stats.entropy_bits() - 1000.0).abs() < 1e-9);
    assert_eq!(order1_entropy_bits(&[]), 0.0);
}

#[test]
fn quantized_tables_add_up() {
    let mut counts = [0u32; 256];
    counts[3] = 1;
    counts[9] = 1_000_000;
    counts[200] = 2;
    let alphabet = [3u8, 9, 200];
    let f = quantize(&counts, &alphabet, TOTAL);
    assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), TOTAL);
    assert!(f[3] >= 1 && f[200] >= 1);
    let all: Vec<u8> = (0..=255).collect();
    let mut flat = [1u32; 256];
    flat[0] = 1 << 30;
    let f = quantize(&flat, &all, TOTAL);
    assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), TOTAL);
    assert!(f.iter().all(|&v| v >= 1));
}

/// Pins the format: a fixed input gives exactly these payload bytes.
#[test]
fn golden_vector() {
    let group = b"aaaaaaaabbbbccdeaaaaaaaabbbbccdfaaaaaaaabbbbccdeaaaaaaaabbbbccdg".repeat(4);
    let mut out = Vec::new();
    assert!(encode(&group, 0, &mut out).unwrap());
    let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, GOLDEN);
    let mut back = vec![0; group.len()];
    decode(&out, &mut back).unwrap();
    assert_eq!(back, group);
}

const GOLDEN: &str = "00000000000000000000000000fe000000000000000000000000000000000000008010800880048002800140401212127f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc7f01a84228ecbf02a8ecbf0354ec0700c0fc";

#[test]
fn corrupt_payloads_are_rejected_or_decode_without_panic() {
    let group: Vec<u8> = crate::test_data::xorshift(3).take(20_000).map(|s| (s % 5) as u8 * (s % 3) as u8).collect();
    let mut out = Vec::new();
    assert!(encode(&group, 15, &mut out).unwrap());
    let mut back = vec![0; group.len()];
    for cut in 0..out.len() {
        assert!(decode(&out[..cut], &mut back).is_err(), "cut at {cut}");
    }
    let mut flips = 0;
    for i in (0..out.len()).step_by(7) {
        let mut bad = out.clone();
        bad[i] ^= 0x10;
        if decode(&bad, &mut back).is_err() || back != group {
            flips += 1;
        }
    }
    assert!(flips > 0);
}

/// Codes `group` with `source` offered as context bytes in slot `source`, decodes it with
/// only that source available, and returns the payload.
fn round_trip_sourced(group: &[u8], source: Source, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    if !encode_with_sources(group, MAX_CONTEXTS, &[(source, bytes)], &mut out).unwrap() {
        assert!(out.is_empty());
        return None;
    }
    assert!(out.len() < group.len());
    let mut sources = Sources::default();
    match source {
        Source::Group(j) => sources.groups[j as usize] = Some(bytes),
        Source::Reference(j) => sources.reference[j as usize] = Some(bytes),
        Source::Previous => unreachable!("not a candidate"),
    }
    let mut back = vec![0x5A; group.len()];
    decode_with_sources(&out, &mut back, &sources).unwrap();
    assert!(back == group, "round trip with {source:?}");
    Some(out)
}

/// Exponent-like context bytes and a mantissa-like group whose spread depends on them: the
/// same element's byte as context wins, is recorded in the payload, and is needed to decode.
#[test]
fn a_context_source_wins_where_it_predicts_the_group() {
    let mut rng = crate::test_data::xorshift(17);
    let exponents: Vec<u8> = (0..131_072).map(|_| 120 + (rng.next().unwrap() % 8) as u8).collect();
    let group: Vec<u8> = exponents
        .iter()
        .zip(crate::test_data::xorshift(18))
        .map(|(&e, s)| if e % 2 == 0 { (s % 16) as u8 } else { s as u8 })
        .collect();
    let plain = round_trip(&group, MAX_CONTEXTS).unwrap();
    let sourced = round_trip_sourced(&group, Source::Group(1), &exponents).unwrap();
    assert_eq!(payload_source(&sourced), Some(Source::Group(1)));
    // Order-0 costs about 7 bits a byte here, the exponent as context 6.
    assert!(sourced.len() * 10 < plain * 9, "{} vs {plain} bytes", sourced.len());
    let mut back = vec![0; group.len()];
    let err = decode(&sourced, &mut back).unwrap_err().to_string();
    assert!(err.contains("not available"), "{err}");
    let short = &exponents[1..];
    let sources = Sources { groups: [None, Some(short), None, None, None, None, None, None], ..Sources::default() };
    assert!(decode_with_sources(&sourced, &mut back, &sources).is_err(), "source of another length");
    let sources =
        Sources { reference: [None, Some(&exponents), None, None, None, None, None, None], ..Sources::default() };
    assert!(decode_with_sources(&sourced, &mut back, &sources).is_err(), "the reference is not the group");
    // The same bytes offered as a reference's work the same way, with their own tag.
    let by_reference = round_trip_sourced(&group, Source::Reference(3), &exponents).unwrap();
    assert_eq!(payload_source(&by_reference), Some(Source::Reference(3)));
    assert_eq!(by_reference.len(), sourced.len());
}

/// A skewed but wide group (a Gaussian's sign and mantissa bits: more small mantissas) codes
/// smaller with binned tables than with a full table per context, and round-trips.
#[test]
fn binned_tables_pay_on_wide_skewed_groups() {
    let exponents: Vec<u8> = crate::test_data::xorshift(31).take(131_072).map(|s| 100 + (s % 12) as u8).collect();
    let group: Vec<u8> = exponents
        .iter()
        .zip(crate::test_data::xorshift(32))
        .map(|(&e, s)| {
            // Bin `b` of 16 is drawn with weight 16 - b, more so for odd exponents.
            let r = (s % 136) as u32;
            let mut bin = 0u32;
            let mut acc = 16;
            while r >= acc && bin < 15 {
                bin += 1;
                acc += 16 - bin;
            }
            let bin = if e % 2 == 1 { bin / 2 } else { bin };
            (bin * 16) as u8 | ((s >> 20) as u8 & 15)
        })
        .collect();
    let payload = round_trip_sourced(&group, Source::Group(1), &exponents).unwrap();
    assert!(payload[0] & FLAG_BINNED != 0, "binned tables: head {:#x}", payload[0]);
    assert_eq!(payload_source(&payload), Some(Source::Group(1)));
}

/// Sources that carry no information (one value; every value in turn) still round-trip, and
/// the coder falls back to the previous byte or order-0 when they do not pay.
#[test]
fn uninformative_sources_round_trip() {
    let group: Vec<u8> = crate::test_data::xorshift(5).take(50_000).map(|s| (s % 7) as u8).collect();
    let one = vec![9u8; group.len()];
    let distinct: Vec<u8> = (0..group.len()).map(|i| i as u8).collect();
    for bytes in [&one, &distinct] {
        let payload = round_trip_sourced(&group, Source::Group(2), bytes).unwrap();
        assert_eq!(payload_source(&payload), None, "no gain, no source");
    }
    // The source is all one value and the group all distinct, or both constant.
    let _ = round_trip_sourced(&distinct, Source::Reference(0), &one);
    let _ = round_trip_sourced(&one, Source::Reference(0), &one);
    let _ = round_trip_sourced(&distinct, Source::Group(1), &distinct);
}

/// Packed tables: chosen at the max level where they are smaller, and their Exp-Golomb
/// codes round-trip at every order, up to the largest frequency.
#[test]
fn packed_tables_round_trip() {
    for k in 0..=MAX_EG_ORDER {
        let values: Vec<u32> = (0..=TOTAL).step_by(7).chain([0, 1, TOTAL]).collect();
        let mut out = Vec::new();
        let mut w = BitWriter { out: &mut out, acc: 0, len: 0 };
        for &v in &values {
            w.put_eg(v, k);
        }
        w.finish();
        let bits: u32 = values.iter().map(|&v| eg_bits(v, k)).sum();
        assert_eq!(out.len(), bits.div_ceil(8) as usize);
        let mut r = BitReader { bytes: &out, bit: 0 };
        for &v in &values {
            assert_eq!(r.get_eg(k, TOTAL).unwrap(), v);
        }
        assert!(BitReader { bytes: &out, bit: 0 }.get_eg(k, 0).is_err() || values[0] == 0);
    }
    // An exponent-like group with contexts: packed, smaller than the same model unpacked.
    let mut prev = 120u8;
    let group: Vec<u8> = crate::test_data::xorshift(12)
        .take(131_072)
        .map(|s| {
            prev = match s % 16 {
                0 => prev.saturating_sub(1).max(100),
                1 => (prev + 1).min(130),
                _ => prev,
            };
            prev
        })
        .collect();
    let mut out = Vec::new();
    assert!(encode(&group, MAX_CONTEXTS, &mut out).unwrap());
    assert!(out[0] & FLAG_PACKED != 0, "head {:#x}", out[0]);
    let mut back = vec![0; group.len()];
    decode(&out, &mut back).unwrap();
    assert!(back == group);
    // The default level's order-0 payloads are never packed (format 4's bytes).
    out.clear();
    assert!(encode(&group, 0, &mut out).unwrap());
    assert_eq!(out[0], 0);
}

#[test]
fn bad_flags_and_sources_are_rejected() {
    let mut back = [0u8; 100];
    for payload in [&[0x80u8, 0][..], &[0x10], &[0x10, 0x00], &[0x10, 0x38], &[0x10, 0x48], &[0x43]] {
        assert!(decode(payload, &mut back).is_err(), "{payload:?}");
    }
}

/// Pins the format of a sourced, binned payload.
#[test]
fn golden_vector_with_a_source() {
    let exponents: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 5) as u8).collect();
    let group: Vec<u8> =
        exponents.iter().enumerate().map(|(i, &e)| (e * 40) | ((i * 13 % 16) as u8 >> (e % 3))).collect();
    let payload = round_trip_sourced(&group, Source::Group(3), &exponents).unwrap();
    let hex: String = payload[..40].iter().map(|b| format!("{b:02x}")).collect();
    let summary = (hex.as_str(), payload.len(), xxhash_rust::xxh3::xxh3_64(&payload));
    assert_eq!(summary, (GOLDEN_SOURCED, 1700, GOLDEN_SOURCED_XXH3));
}

/// The payload's first 40 bytes: head 0x94 (packed tables, a source byte follows, 4
/// dedicated contexts), source 0x13 (group 3), the 4 context values, the alphabet's span
/// (0x00 ..= 0xa7) and its bits, then the tables' orders and codes.
const GOLDEN_SOURCED: &str = "94130004030200a7ffff000000ff000000000f00000000ff00000000fff0ff0ff01fe03fc07f0009";
const GOLDEN_SOURCED_XXH3: u64 = 14109669590494710870;

fn sources_of(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    match kind % 4 {
        0 => vec![(seed % 256) as u8; len],
        1 => (0..len).map(|i| i as u8).collect(),
        2 => crate::test_data::xorshift(seed).take(len).map(|s| (s % 6) as u8).collect(),
        _ => crate::test_data::xorshift(seed).take(len).map(|s| s as u8).collect(),
    }
}

fn distributions() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..3000),
        (any::<u8>(), 0usize..5000).prop_map(|(b, n)| vec![b; n]),
        (any::<u8>(), any::<u8>(), 0usize..5000)
            .prop_map(|(a, b, n)| (0..n).map(|i| if i % 2 == 0 { a } else { b }).collect()),
        (0usize..5000).prop_map(|n| (0..n).map(|i| i as u8).collect()),
        (any::<u64>(), 0usize..20_000, 1u64..1000).prop_map(|(seed, n, every)| crate::test_data::xorshift(seed)
            .take(n)
            .map(|s| if s % every == 0 { (s >> 33) as u8 } else { 0 })
            .collect()),
        (any::<u64>(), 0usize..20_000).prop_map(|(seed, n)| {
            let mut prev = 120u8;
            crate::test_data::xorshift(seed)
                .take(n)
                .map(|s| {
                    prev = prev.wrapping_add((s % 5) as u8).wrapping_sub(2);
                    prev
                })
                .collect()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn round_trips(group in distributions(), contexts in 0usize..=16) {
        round_trip(&group, contexts);
    }

    /// Every context source round-trips arbitrary and adversarial groups, whatever the source
    /// bytes are (one value, all distinct, few values, noise) or how they relate to the group.
    #[test]
    fn round_trips_with_sources(group in distributions(), seed in any::<u64>(), kind in any::<u8>(),
                                reference in any::<bool>(), j in 0u8..8, derived in any::<bool>()) {
        let bytes = if derived {
            group.iter().map(|&b| b >> 3).collect()
        } else {
            sources_of(group.len(), seed, kind)
        };
        let source = if reference { Source::Reference(j) } else { Source::Group(j) };
        round_trip_sourced(&group, source, &bytes);
    }

    /// Arbitrary payloads with arbitrary sources available never panic.
    #[test]
    fn arbitrary_sourced_payloads_do_not_panic(mut payload in proptest::collection::vec(any::<u8>(), 0..400),
                                                n in 0usize..300, head in any::<u8>(), tag in any::<u8>(), seed in any::<u64>()) {
        if payload.len() >= 2 {
            payload[0] = head;
            payload[1] = tag;
        }
        let bytes = sources_of(n, seed, head);
        let sources = Sources { groups: [Some(&bytes[..]); 8], reference: [Some(&bytes[..]); 8] };
        let mut out = vec![0; n];
        let _ = decode_with_sources(&payload, &mut out, &sources);
    }

    /// Arbitrary payloads never panic and never write outside the group.
    #[test]
    fn arbitrary_payloads_do_not_panic(payload in proptest::collection::vec(any::<u8>(), 0..400), n in 0usize..300) {
        let mut out = vec![0; n];
        let _ = decode(&payload, &mut out);
    }
}
