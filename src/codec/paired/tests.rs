use super::*;
use proptest::prelude::*;

/// Codes with `plan`, decodes, and checks both groups come back; returns the stored sizes.
fn round_trip(plan: &Plan, upper: &[u8], lower: &[u8]) -> Option<(usize, usize)> {
    let mut symbols = vec![0u8; upper.len()];
    let stats = plan.symbols(upper, lower, &mut symbols);
    assert_eq!(stats.histogram, GroupStats::of(&symbols).histogram, "symbols counted on the way");
    let (mut up, mut low) = (Vec::new(), Vec::new());
    if !encode(plan, &symbols, None, lower, &mut up, &mut low).unwrap() {
        assert!(up.is_empty() && low.is_empty());
        return None;
    }
    let (mut u, mut l) = (vec![0u8; upper.len()], vec![0u8; lower.len()]);
    decode(&up, &low, &mut u, &mut l).unwrap();
    assert!(u == upper && l == lower, "paired groups decode to other bytes (k = {})", plan.k);
    Some((up.len(), low.len()))
}

fn histogram(bytes: &[u8]) -> [u32; 256] {
    GroupStats::of(bytes).histogram
}

/// A float-like pair: few upper values, the lower byte's top bits skewed by the upper value.
fn skewed(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut s = crate::test_data::xorshift(seed);
    let mut upper = Vec::with_capacity(n);
    let mut lower = Vec::with_capacity(n);
    for _ in 0..n {
        let r = s.next().expect("endless");
        let e = 120 - (r % 7).min((r >> 8) % 9) as u8;
        let top = if (r >> 20).is_multiple_of(3) { (r >> 24) as u8 & 0x80 } else { 0 };
        upper.push(e);
        lower.push(top | ((r >> 32) as u8 & 0x7F) >> ((e & 1) as u32 * 2));
    }
    (upper, lower)
}

#[test]
fn golden_vector() {
    // Eleven elements, k = 3: the payload's head, and the remainder bits exactly as
    // docs/format.md describes them.
    let upper = [5u8, 9, 5, 5, 9, 5, 5, 5, 9, 5, 5];
    let lower = [0x00u8, 0xFF, 0x21, 0xE3, 0x1F, 0x00, 0x40, 0x20, 0x07, 0x00, 0xA5];
    let h = histogram(&upper);
    let plan = Plan::with_k(|v| h[v] > 0, 3);
    let mut symbols = [0u8; 11];
    plan.symbols(&upper, &lower, &mut symbols);
    assert_eq!(symbols, [0, 15, 1, 7, 8, 0, 2, 1, 8, 0, 5]);
    let mut low = Vec::new();
    pack_remainders(&lower, 3, &mut low);
    // 5-bit remainders 0, 31, 1, 3, 31, 0, 0, 0 | 7, 0, 5, LSB first.
    let bits: u128 = [0u128, 31, 1, 3, 31, 0, 0, 0, 7, 0, 5].iter().enumerate().map(|(i, r)| r << (5 * i)).sum();
    assert_eq!(low, bits.to_le_bytes()[..remainder_len(11, 3)].to_vec());
    assert_eq!(low.len(), 7);
    assert_eq!(plan.present[0], 1 << 5);
    assert_eq!(plan.present[1], 1 << 1);
    let (mut u, mut l) = ([0u8; 11], [0u8; 11]);
    let mut up = vec![3u8];
    up.extend_from_slice(&plan.present);
    // A raw Huffman block (kind 0): the symbols as they are.
    up.push(11);
    up.extend_from_slice(&(11u32 << 2).to_le_bytes()); // kind 0 (raw), 11 bytes
    up.extend_from_slice(&symbols);
    decode(&up, &low, &mut u, &mut l).unwrap();
    assert_eq!((u, l), (upper, lower));
}

#[test]
fn contiguous_value_sets_are_recognised() {
    let set = |values: &[usize]| {
        let mut present = [0u8; 32];
        for &v in values {
            present[v / 8] |= 1 << (v % 8);
        }
        contiguous_base(&present)
    };
    assert_eq!(set(&[]), None);
    assert_eq!(set(&[0]), Some(0));
    assert_eq!(set(&[255]), Some(255));
    assert_eq!(set(&[127, 128]), Some(127));
    assert_eq!(set(&(120..=140).collect::<Vec<_>>()), Some(120));
    assert_eq!(set(&(0..=255).collect::<Vec<_>>()), Some(0));
    assert_eq!(set(&[5, 9]), None);
    assert_eq!(set(&[0, 200]), None);
    assert_eq!(set(&[127, 129]), None);
    // A range from the upper group's extremes when it allows the same k; else the values.
    let mut h = [0u32; 256];
    for v in [100, 103, 110] {
        h[v] = 5;
    }
    assert_eq!(Plan::for_histogram(&h).unwrap().base, Some(100));
    h[0] = 1;
    let plan = Plan::for_histogram(&h).unwrap();
    assert_eq!((plan.k, plan.base), (3, None));
}

#[test]
fn float_like_pairs_shrink_and_round_trip() {
    let (upper, lower) = skewed(100_000, 7);
    let plan = Plan::for_histogram(&histogram(&upper)).unwrap();
    assert_eq!(plan.k, 3);
    let (up, low) = round_trip(&plan, &upper, &lower).unwrap();
    assert_eq!(low, remainder_len(upper.len(), 3));
    // Huffman of the upper group alone plus the lower group raw would store more.
    let alone = GroupStats::of(&upper).huffman_estimate() as usize + lower.len();
    assert!(up + low < alone, "{} vs {alone}", up + low);
}

#[test]
fn adversarial_distributions_round_trip_or_decline() {
    let n = 5000;
    let alternating: Vec<u8> = (0..n).map(|i| if i % 2 == 0 { 3 } else { 250 }).collect();
    let distinct: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let one = vec![77u8; n];
    let lowers = [vec![0u8; n], vec![0xFFu8; n], (0..n).map(|i| (i * 37) as u8).collect::<Vec<u8>>()];
    for upper in [&alternating, &one] {
        for lower in &lowers {
            for k in 1..=3 {
                let h = histogram(upper);
                round_trip(&Plan::with_k(|v| h[v] > 0, k), upper, lower);
            }
        }
    }
    // 256 distinct values leave no room for a symbol.
    assert!(Plan::for_histogram(&histogram(&distinct)).is_none());
    // 128 allow k = 1 only.
    let half: Vec<u8> = (0..n).map(|i| (i % 128) as u8 * 2).collect();
    let plan = Plan::for_histogram(&histogram(&half)).unwrap();
    assert_eq!(plan.k, 1);
    round_trip(&plan, &half, &lowers[2]);
}

#[test]
fn hostile_payloads_are_refused() {
    let (upper, lower) = skewed(4000, 3);
    let plan = Plan::for_histogram(&histogram(&upper)).unwrap();
    let mut symbols = vec![0u8; upper.len()];
    plan.symbols(&upper, &lower, &mut symbols);
    let (mut up, mut low) = (Vec::new(), Vec::new());
    assert!(encode(&plan, &symbols, None, &lower, &mut up, &mut low).unwrap());
    let (mut u, mut l) = (vec![0u8; 4000], vec![0u8; 4000]);
    let refused = |up: &[u8], low: &[u8], u: &mut [u8], l: &mut [u8]| decode(up, low, u, l).unwrap_err().to_string();
    let mut bad_k = up.clone();
    bad_k[0] = 4;
    assert!(refused(&bad_k, &low, &mut u, &mut l).contains("k = 4"));
    let mut too_many = up.clone();
    too_many[1..HEAD_LEN].fill(0xFF);
    assert!(refused(&too_many, &low, &mut u, &mut l).contains("values"));
    assert!(refused(&up[..10], &low, &mut u, &mut l).contains("no head"));
    assert!(refused(&up, &low[1..], &mut u, &mut l).contains("remainder"));
    // One value fewer: some symbols now point past the set.
    let mut fewer = up.clone();
    let last = (1..HEAD_LEN).rev().find(|&i| fewer[i] != 0).unwrap();
    fewer[last] &= fewer[last] - 1;
    assert!(refused(&fewer, &low, &mut u, &mut l).contains("outside"));
    assert!(decode(&up, &low, &mut u[..3999], &mut l).is_err());
}

proptest! {
    #[test]
    fn any_pair_round_trips(
        upper_values in proptest::collection::vec(any::<u8>(), 1..40),
        picks in proptest::collection::vec(any::<u16>(), 0..3000),
        lower_seed in any::<u64>(),
        k in 1u32..=3,
    ) {
        let upper: Vec<u8> = picks.iter().map(|&p| upper_values[p as usize % upper_values.len()]).collect();
        let lower: Vec<u8> = crate::test_data::xorshift(lower_seed).take(upper.len()).map(|s| s as u8).collect();
        let h = histogram(&upper);
        let distinct = h.iter().filter(|&&c| c > 0).count();
        prop_assume!(distinct <= 256 >> k);
        round_trip(&Plan::with_k(|v| h[v] > 0, k), &upper, &lower);
        // The plan ckpt picks: often a contiguous range here (the fast paths).
        if let Some(plan) = Plan::for_histogram(&h) {
            round_trip(&plan, &upper, &lower);
        }
    }

    /// Every decoding path gives the same groups: [`decode`] (SSSE3 blocks and BMI2 where
    /// the CPU has them), the portable word loops, and [`decode_elements`] (straight into
    /// 2-byte elements) against regrouping.
    #[test]
    fn every_decoding_path_agrees(
        base in 0u8..200,
        spread_values in 1u8..40,
        zero_every in 0usize..50,
        n in 0usize..700,
        lower_seed in any::<u64>(),
    ) {
        let mut s = crate::test_data::xorshift(lower_seed);
        let upper: Vec<u8> = (0..n)
            .map(|i| if zero_every > 0 && i % zero_every == 7 { 0 } else { base + (s.next().unwrap() % spread_values as u64) as u8 })
            .collect();
        let lower: Vec<u8> = (0..n).map(|_| s.next().unwrap() as u8).collect();
        let h = histogram(&upper);
        let Some(plan) = Plan::for_histogram(&h) else { return Ok(()) };
        let mut symbols = vec![0u8; n];
        plan.symbols(&upper, &lower, &mut symbols);
        let (mut up, mut low) = (Vec::new(), Vec::new());
        up.push(plan.k as u8);
        up.extend_from_slice(&plan.present);
        // Symbols stored raw (a raw Huffman payload), so that every n has a payload.
        let mut raw = Vec::new();
        huffman::encode(&symbols, &mut raw).unwrap();
        if raw.is_empty() {
            raw.push(n as u8 & 0x7F);
            prop_assume!(n < 128);
            if n > 0 {
                raw.extend_from_slice(&((n as u32) << 2).to_le_bytes());
                raw.extend_from_slice(&symbols);
            }
        }
        up.extend_from_slice(&raw);
        pack_remainders(&lower, plan.k, &mut low);
        let (mut u, mut l) = (vec![0u8; n], vec![0u8; n]);
        decode(&up, &low, &mut u, &mut l).unwrap();
        prop_assert!(u == upper && l == lower);
        if let Some(b) = plan.base {
            let (mut u2, mut l2) = (symbols.clone(), vec![0u8; n]);
            match plan.k {
                1 => unpack_range::<1, false>(&mut u2, &mut l2, &low, b),
                2 => unpack_range::<2, false>(&mut u2, &mut l2, &low, b),
                _ => unpack_range::<3, false>(&mut u2, &mut l2, &low, b),
            }
            prop_assert!(u2 == upper && l2 == lower, "portable words");
        }
        let mut elements = vec![0u8; 2 * n];
        let mut scratch = vec![0u8; 2 * n];
        decode_elements(&up, &low, &mut scratch, &mut elements).unwrap();
        let mut regrouped = vec![0u8; 2 * n];
        let grouping = super::super::Grouping { width: 2, extract_exponent: true };
        super::super::byte_group::regroup(&[&lower, &upper], None, grouping, &mut regrouped).unwrap();
        prop_assert_eq!(elements, regrouped);
    }

    #[test]
    fn clustered_values_round_trip_on_the_range_path(
        base in any::<u8>(),
        picks in proptest::collection::vec(0u8..32, 1..3000),
        lower_seed in any::<u64>(),
    ) {
        let upper: Vec<u8> = picks.iter().map(|&p| base.saturating_add(p)).collect();
        let lower: Vec<u8> = crate::test_data::xorshift(lower_seed).take(upper.len()).map(|s| s as u8).collect();
        let plan = Plan::for_histogram(&histogram(&upper)).unwrap();
        prop_assert!(plan.base.is_some());
        round_trip(&plan, &upper, &lower);
    }

    #[test]
    fn any_payload_decodes_or_errs(
        up in proptest::collection::vec(any::<u8>(), 0..200),
        low in proptest::collection::vec(any::<u8>(), 0..200),
        n in 0usize..300,
    ) {
        let (mut u, mut l) = (vec![0u8; n], vec![0u8; n]);
        let _ = decode(&up, &low, &mut u, &mut l);
    }
}
