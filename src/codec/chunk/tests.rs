use super::*;
use proptest::prelude::*;

fn groupings() -> impl Strategy<Value = Grouping> {
    (prop_oneof![Just(1usize), Just(2), Just(4), Just(8)], any::<bool>())
        .prop_map(|(width, x)| Grouping { width, extract_exponent: x && width > 1 })
}

/// Bytes that look like float weights: skewed high bytes, noisy low bytes, some zero runs.
fn weights(seed: u64, len: usize, zero_every: usize) -> Vec<u8> {
    crate::test_data::xorshift(seed)
        .take(len)
        .enumerate()
        .map(|(i, s)| {
            if zero_every > 0 && (i / 64) % zero_every == 0 {
                0
            } else if i % 2 == 1 {
                0x3C + (s % 4) as u8
            } else {
                s as u8
            }
        })
        .collect()
}

fn selections() -> impl Strategy<Value = Selection> {
    prop_oneof![
        Just(Selection::Auto),
        Just(Selection::Exhaustive),
        Just(Selection::Only(Method::Huffman)),
        Just(Selection::Only(Method::Zstd)),
        Just(Selection::Only(Method::Sparse)),
        Just(Selection::Only(Method::Rans)),
        Just(Selection::Only(Method::Paired)),
        Just(Selection::Only(Method::Raw)),
        Just(Selection::Only(Method::Zero)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn chunk_round_trip(grouping in groupings(), elems in 0usize..3000, seed in any::<u64>(), zero_every in 0usize..4,
                        delta in any::<bool>(), selection in selections(), max in any::<bool>()) {
        let len = elems * grouping.width;
        let input = weights(seed, len, zero_every);
        let mut reference = input.clone();
        for (i, b) in reference.iter_mut().enumerate() { if i % 7 == 0 { *b ^= 1 } }
        let r = delta.then_some(reference.as_slice());
        let level = if max { Level::Max } else { Level::Default };
        let options = Options { selection, level, ..Options::default() };
        let mut payload = Vec::new();
        let header = encode_chunk(Data::Bytes(&input), r.map(Reference::Bytes), grouping, &options, &mut SkipState::default(), &mut payload).unwrap();
        prop_assert_eq!(header.stored_len(), payload.len() as u64);
        prop_assert!(payload.len() <= input.len());
        let mut out = vec![0xAA; len];
        decode_chunk(&payload, &header, grouping, r, &mut out).unwrap();
        prop_assert_eq!(out, input);
    }
}

/// A grouped reference that splits plain bytes on request, as a chain decoder would hand
/// them over.
struct SplitOnRequest<'a> {
    bytes: &'a [u8],
    grouping: Grouping,
}

impl GroupedReference for SplitOnRequest<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> Result<()> {
        let plain = self.bytes.get(offset..offset + grouped.len()).ok_or(Error::InvalidInput("out of range".into()))?;
        byte_group::split(plain, None, self.grouping, grouped)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// A reference supplied in grouped form codes to exactly the bytes of the same reference
    /// given plain, chunk offsets included.
    #[test]
    fn grouped_and_plain_references_code_identically(grouping in groupings(), chunks in 1usize..5, seed in any::<u64>(),
                                                     zero_every in 0usize..4) {
        let options = Options { chunk_size: 4096, ..Options::default() };
        let len = chunks * 4096 - 2 * grouping.width;
        let reference = weights(seed, len, zero_every);
        let mut input = reference.clone();
        for (i, b) in input.iter_mut().enumerate() { if i % 5 == 0 { *b ^= (i % 7) as u8 } }
        let plain = encode_chunks(Data::Bytes(&input), Some(Reference::Bytes(&reference)), grouping, &options).unwrap();
        let source = SplitOnRequest { bytes: &reference, grouping };
        let grouped = encode_chunks(Data::Bytes(&input), Some(Reference::Grouped { source: &source, offset: 0, len: input.len() }), grouping, &options).unwrap();
        prop_assert_eq!(plain.len(), grouped.len());
        for (a, b) in plain.iter().zip(&grouped) {
            prop_assert_eq!(a.header, b.header);
            prop_assert_eq!(&a.payload, &b.payload);
        }
    }

    /// Data supplied in grouped form (a stored blob rewritten as a delta) codes to exactly the
    /// bytes of the same data given plain, standalone and as a delta, and decodes back to it.
    #[test]
    fn grouped_data_codes_like_plain_data_and_round_trips(grouping in groupings(), chunks in 1usize..5,
                                                           seed in any::<u64>(), zero_every in 0usize..4) {
        let options = Options { chunk_size: 4096, ..Options::default() };
        let len = chunks * 4096 - 2 * grouping.width;
        let reference = weights(seed, len, zero_every);
        let mut input = reference.clone();
        for (i, b) in input.iter_mut().enumerate() { if i % 3 == 0 { *b ^= (i % 5) as u8 } }
        let (input_source, reference_source) =
            (SplitOnRequest { bytes: &input, grouping }, SplitOnRequest { bytes: &reference, grouping });
        let data = Data::Grouped { source: &input_source, offset: 0, len };
        for with_reference in [false, true] {
            let plain_reference = with_reference.then_some(Reference::Bytes(&reference));
            let grouped_reference =
                with_reference.then_some(Reference::Grouped { source: &reference_source, offset: 0, len });
            let plain = encode_chunks(Data::Bytes(&input), plain_reference, grouping, &options).unwrap();
            let grouped = encode_chunks(data, grouped_reference, grouping, &options).unwrap();
            prop_assert_eq!(plain.len(), grouped.len());
            let mut decoded = Vec::new();
            for (i, (a, b)) in plain.iter().zip(&grouped).enumerate() {
                prop_assert_eq!(a.header, b.header);
                prop_assert_eq!(&a.payload, &b.payload);
                let range = i * 4096..((i + 1) * 4096).min(len);
                let mut chunk = vec![0; range.len()];
                let r = with_reference.then(|| &reference[range]);
                decode_chunk(&b.payload, &b.header, grouping, r, &mut chunk).unwrap();
                decoded.extend_from_slice(&chunk);
            }
            prop_assert_eq!(&decoded, &input);
        }
    }
}

#[test]
fn grouped_data_refuses_a_plain_reference_and_partial_elements() {
    let grouping = Grouping { width: 4, extract_exponent: true };
    let options = Options { chunk_size: 4096, ..Options::default() };
    let input = weights(5, 4096, 0);
    let source = SplitOnRequest { bytes: &input, grouping };
    let data = Data::Grouped { source: &source, offset: 0, len: input.len() };
    let err = encode_chunks(data, Some(Reference::Bytes(&input)), grouping, &options).unwrap_err();
    assert!(err.to_string().contains("grouped data takes a grouped reference"), "{err}");
    let odd = Data::Grouped { source: &source, offset: 0, len: 4094 };
    let err = encode_chunks(odd, None, grouping, &options).unwrap_err();
    assert!(err.to_string().contains("not a whole number of 4-byte elements"), "{err}");
}

#[test]
fn a_failing_grouped_reference_fails_the_chunk() {
    let grouping = Grouping { width: 2, extract_exponent: true };
    let input = weights(3, 8192, 0);
    let short = &input[..4096];
    let source = SplitOnRequest { bytes: short, grouping };
    let options = Options { chunk_size: 4096, ..Options::default() };
    let result = encode_chunks(
        Data::Bytes(&input),
        Some(Reference::Grouped { source: &source, offset: 0, len: input.len() }),
        grouping,
        &options,
    );
    assert!(result.is_err(), "the second chunk's reference is out of range");
}

#[test]
fn parallel_chunks_round_trip_and_are_deterministic() {
    let grouping = Grouping { width: 2, extract_exponent: true };
    let options = Options { chunk_size: 4096, ..Options::default() };
    let input = weights(7, 4096 * 20 + 6, 3);
    let a = encode_chunks(Data::Bytes(&input), None, grouping, &options).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let b = pool.install(|| encode_chunks(Data::Bytes(&input), None, grouping, &options)).unwrap();
    assert_eq!(a.len(), 21);
    let mut out = Vec::new();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.header, y.header);
        assert_eq!(x.payload, y.payload);
        let mut chunk = vec![0; if out.len() + 4096 <= input.len() { 4096 } else { input.len() - out.len() }];
        decode_chunk(&x.payload, &x.header, grouping, None, &mut chunk).unwrap();
        out.extend_from_slice(&chunk);
    }
    assert_eq!(out, input);
}

#[test]
fn chains_xor_in_grouped_form() {
    let grouping = Grouping { width: 4, extract_exponent: true };
    let options = Options::default();
    let base = weights(11, 4096, 0);
    let mut versions = vec![base.clone()];
    for step in 1..4u8 {
        let mut next = versions.last().unwrap().clone();
        for (i, b) in next.iter_mut().enumerate() {
            // Dense changes in the first version, sparse ones later (late training).
            if i % (5 + 40 * (step as usize - 1)) == 0 {
                *b ^= step;
            }
        }
        versions.push(next);
    }
    // base standalone, then each version as a delta against the one before.
    let mut coded = Vec::new();
    for (k, v) in versions.iter().enumerate() {
        let reference = if k == 0 { None } else { Some(versions[k - 1].as_slice()) };
        let mut payload = Vec::new();
        let header = encode_chunk(
            Data::Bytes(v),
            reference.map(Reference::Bytes),
            grouping,
            &options,
            &mut SkipState::default(),
            &mut payload,
        )
        .unwrap();
        coded.push((header, payload));
    }
    let methods: Vec<Method> = coded[1..].iter().flat_map(|(h, _)| h.groups().iter().map(|e| e.method)).collect();
    assert!(methods.contains(&Method::Sparse), "sparse deltas in the chain: {methods:?}");
    assert!(methods.contains(&Method::Huffman) || methods.contains(&Method::Raw), "dense deltas: {methods:?}");
    let mut grouped = vec![0xEE; base.len()];
    for (k, (header, payload)) in coded.iter().enumerate() {
        decode_chunk_groups(payload, header, grouping, &mut grouped, k > 0).unwrap();
    }
    let n = base.len() / 4;
    let groups: Vec<&[u8]> = grouped.chunks(n).collect();
    let mut out = vec![0u8; base.len()];
    byte_group::regroup(&groups, None, grouping, &mut out).unwrap();
    assert_eq!(&out, versions.last().unwrap());
}

/// The default level takes rANS for a group that is almost all zeros (below Huffman's and
/// zstd's floors), and leaves ordinary weight groups to Huffman; the max level takes rANS
/// with contexts where it is smaller.
#[test]
fn levels_choose_rans_where_it_wins() {
    let grouping = Grouping { width: 2, extract_exponent: true };
    let code = |input: &[u8], reference: Option<&[u8]>, level| {
        let options = Options { level, ..Options::default() };
        let mut payload = Vec::new();
        let header = encode_chunk(
            Data::Bytes(input),
            reference.map(Reference::Bytes),
            grouping,
            &options,
            &mut SkipState::default(),
            &mut payload,
        )
        .unwrap();
        let mut back = vec![0; input.len()];
        decode_chunk(&payload, &header, grouping, reference, &mut back).unwrap();
        assert_eq!(back, input);
        (header.groups().iter().map(|g| g.method).collect::<Vec<_>>(), payload.len())
    };
    let base = weights(21, 1 << 18, 0);
    // Late training: one element in 300 changes its low mantissa bits.
    let mut next = base.clone();
    for (i, s) in crate::test_data::xorshift(4).take(next.len() / 2).enumerate() {
        if s % 300 == 0 {
            next[2 * i] ^= ((s >> 20) as u8 & 0x7F) | 1;
        }
    }
    let (methods, delta_size) = code(&next, Some(&base), Level::Default);
    assert_eq!(methods, [Method::Rans, Method::Zero], "sparse delta");
    let (methods, _) = code(&base, None, Level::Default);
    assert!(!methods.contains(&Method::Rans), "ordinary weights: {methods:?}");
    let (_, max_delta) = code(&next, Some(&base), Level::Max);
    assert!(max_delta <= delta_size);
    // Exponents that follow their neighbour: the max level codes them with context.
    let mut e = 0x3Cu8;
    let correlated: Vec<u8> = crate::test_data::xorshift(8)
        .take(1 << 18)
        .enumerate()
        .map(|(i, s)| {
            if i % 2 == 0 {
                return s as u8;
            }
            e = match s % 8 {
                0 => e.saturating_sub(1).max(0x38),
                1 => (e + 1).min(0x3F),
                _ => e,
            };
            e
        })
        .collect();
    let (default_methods, default_size) = code(&correlated, None, Level::Default);
    let (max_methods, max_size) = code(&correlated, None, Level::Max);
    assert_eq!(default_methods[1], Method::Huffman);
    assert_eq!(max_methods[1], Method::Rans);
    assert!((max_size as f64) < 0.95 * default_size as f64, "{max_size} vs {default_size}");
}

/// Bell-shaped floats of `width` bytes (bf16 or f32) and their next version, every weight
/// moved a little (a training step from scratch).
fn float_versions(seed: u64, n: usize, width: usize) -> (Vec<u8>, Vec<u8>) {
    let mut s = crate::test_data::xorshift(seed);
    let mut uniform = move || (s.next().expect("endless") >> 40) as f32 / (1u64 << 24) as f32;
    let bytes = |v: f32| -> Vec<u8> {
        if width == 2 {
            ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec()
        } else {
            v.to_le_bytes().to_vec()
        }
    };
    let (mut base, mut next) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let v = (uniform() + uniform() + uniform() + uniform() - 2.0) * 0.05;
        // A few ulps of the format: bf16 keeps 7 mantissa bits, f32 23.
        let relative = if width == 2 { 3e-2 } else { 2e-5 };
        let step = (uniform() - 0.5) * relative * v.abs().max(1e-3);
        base.extend(bytes(v));
        next.extend(bytes(v + step));
    }
    (base, next)
}

/// At the default level a standalone float chunk codes its top two groups as a pair; the
/// pair decodes plainly, in grouped form, and XORed into a chain (a base under its deltas);
/// a delta's groups are not paired. Headers that break a pair are refused.
#[test]
fn float_chunks_pair_their_top_groups_and_decode_every_way() {
    for width in [2usize, 4] {
        let grouping = Grouping { width, extract_exponent: true };
        let (base, next) = float_versions(60 + width as u64, (256 << 10) / width, width);
        let code = |selection| {
            let options = Options { selection, ..Options::default() };
            let mut payload = Vec::new();
            let header =
                encode_chunk(Data::Bytes(&base), None, grouping, &options, &mut SkipState::default(), &mut payload)
                    .unwrap();
            (header, payload)
        };
        let (header, payload) = code(Selection::Auto);
        let methods: Vec<Method> = header.groups().iter().map(|e| e.method).collect();
        // The default level pairs 2-byte floats; `Only(Paired)` pairs any width.
        let (header, payload) = if width == 2 {
            assert_eq!(methods, [Method::Remainder, Method::Paired], "width {width}: {methods:?}");
            (header, payload)
        } else {
            assert!(!methods.contains(&Method::Paired), "width {width}: {methods:?}");
            let (header, payload) = code(Selection::Only(Method::Paired));
            let methods: Vec<Method> = header.groups().iter().map(|e| e.method).collect();
            assert_eq!(methods, [Method::Raw, Method::Raw, Method::Remainder, Method::Paired]);
            (header, payload)
        };
        // The pair stores less than the top group Huffman-coded and the one below raw.
        let (unpaired_header, _) = code(Selection::Only(Method::Huffman));
        let top_two = |h: &ChunkHeader| h.groups()[width - 2..].iter().map(|e| e.stored_len).sum::<u32>();
        let apart = unpaired_header.groups()[width - 1].stored_len + (base.len() / width) as u32;
        assert!(top_two(&header) < apart, "width {width}: {} vs {apart}", top_two(&header));

        let mut out = vec![0u8; base.len()];
        decode_chunk(&payload, &header, grouping, None, &mut out).unwrap();
        assert!(out == base);
        let mut grouped = vec![0xAAu8; base.len()];
        decode_chunk_groups(&payload, &header, grouping, &mut grouped, false).unwrap();
        let mut expected = vec![0u8; base.len()];
        byte_group::split(&base, None, grouping, &mut expected).unwrap();
        assert!(grouped == expected, "grouped decode, width {width}");
        // XORed into a chain: the delta's groups first, then the base's pair on top.
        let mut delta_payload = Vec::new();
        let delta_header = encode_chunk(
            Data::Bytes(&next),
            Some(Reference::Bytes(&base)),
            grouping,
            &Options::default(),
            &mut SkipState::default(),
            &mut delta_payload,
        )
        .unwrap();
        assert!(!delta_header.groups().iter().any(|e| e.method == Method::Paired), "a delta is not paired");
        let mut chain = vec![0u8; base.len()];
        decode_chunk_groups(&delta_payload, &delta_header, grouping, &mut chain, true).unwrap();
        decode_chunk_groups(&payload, &header, grouping, &mut chain, true).unwrap();
        let mut target = vec![0u8; base.len()];
        byte_group::regroup(&chain.chunks(base.len() / width).collect::<Vec<_>>(), None, grouping, &mut target)
            .unwrap();
        assert!(target == next, "chain decode, width {width}");

        // Broken pairs: a Paired group with no Remainder below, a Remainder alone, a Paired
        // group at the bottom.
        let mut entries: Vec<GroupEntry> = header.groups().to_vec();
        let lower = entries[width - 2];
        entries[width - 2] = GroupEntry { method: Method::Raw, stored_len: (base.len() / width) as u32 };
        let err = ChunkHeader::new(&entries).unwrap().validate(base.len()).unwrap_err();
        assert!(err.to_string().contains("must sit above a remainder group"), "{err}");
        entries[width - 2] = lower;
        entries[width - 1] = GroupEntry { method: Method::Huffman, stored_len: 10 };
        let err = ChunkHeader::new(&entries).unwrap().validate(base.len()).unwrap_err();
        assert!(err.to_string().contains("must sit below a paired group"), "{err}");
    }
    let bottom =
        [GroupEntry { method: Method::Paired, stored_len: 10 }, GroupEntry { method: Method::Raw, stored_len: 100 }];
    let err = ChunkHeader::new(&bottom).unwrap().validate(200).unwrap_err();
    assert!(err.to_string().contains("paired group must sit above"), "{err}");
}

/// The context source of each rANS group of a coded chunk.
fn sources_of(payload: &[u8], header: &ChunkHeader) -> Vec<rans::Source> {
    let stored = stored_groups(payload, header);
    header
        .groups()
        .iter()
        .zip(stored)
        .filter(|(e, _)| e.method == Method::Rans)
        .filter_map(|(_, s)| rans::payload_source(s))
        .collect()
}

/// At the max level, a float chunk's mantissa groups take the exponent as context and a
/// delta's groups the reference's bytes; both decode plainly (`decode_chunk`) and in a chain
/// (`decode_chunk_groups`, the reference in grouped form), and the grouped reference codes
/// to the same bytes.
#[test]
fn max_level_context_sources_round_trip_plain_and_chained() {
    for width in [2usize, 4] {
        let grouping = Grouping { width, extract_exponent: true };
        let (base, next) = float_versions(40 + width as u64, (256 << 10) / width, width);
        let code = |input: &[u8], reference: Option<Reference<'_>>, level| {
            let options = Options { level, ..Options::default() };
            let mut payload = Vec::new();
            let header = encode_chunk(
                Data::Bytes(input),
                reference,
                grouping,
                &options,
                &mut SkipState::default(),
                &mut payload,
            )
            .unwrap();
            (header, payload)
        };
        let (base_header, base_payload) = code(&base, None, Level::Max);
        let (next_header, next_payload) = code(&next, Some(Reference::Bytes(&base)), Level::Max);
        let own = sources_of(&base_payload, &base_header);
        assert!(own.iter().any(|s| matches!(s, rans::Source::Group(_))), "width {width}: {own:?}");
        let by_reference = sources_of(&next_payload, &next_header);
        assert!(
            by_reference.iter().any(|s| matches!(s, rans::Source::Reference(_))),
            "width {width}: {by_reference:?}"
        );
        // Smaller than the default level, which keeps format 4's coding.
        let (_, default_base) = code(&base, None, Level::Default);
        let (_, default_next) = code(&next, Some(Reference::Bytes(&base)), Level::Default);
        assert!(base_payload.len() < default_base.len(), "{} vs {}", base_payload.len(), default_base.len());
        assert!(next_payload.len() < default_next.len(), "{} vs {}", next_payload.len(), default_next.len());
        // Plain decoding.
        let mut out = vec![0; base.len()];
        decode_chunk(&base_payload, &base_header, grouping, None, &mut out).unwrap();
        assert!(out == base);
        decode_chunk(&next_payload, &next_header, grouping, Some(&base), &mut out).unwrap();
        assert!(out == next);
        // Chained: the base's groups, then the delta's XORed in.
        let mut grouped = vec![0xEE; base.len()];
        decode_chunk_groups(&base_payload, &base_header, grouping, &mut grouped, false).unwrap();
        decode_chunk_groups(&next_payload, &next_header, grouping, &mut grouped, true).unwrap();
        let n = base.len() / width;
        let groups: Vec<&[u8]> = grouped.chunks(n).collect();
        byte_group::regroup(&groups, None, grouping, &mut out).unwrap();
        assert!(out == next);
        // The reference handed over grouped gives the same bytes.
        let source = SplitOnRequest { bytes: &base, grouping };
        let (header, payload) =
            code(&next, Some(Reference::Grouped { source: &source, offset: 0, len: base.len() }), Level::Max);
        assert_eq!(header, next_header);
        assert!(payload == next_payload);
        // Without its reference, a delta whose contexts come from it is refused, not misread.
        let mut lone = vec![0; base.len()];
        let err = decode_chunk_groups(&next_payload, &next_header, grouping, &mut lone, false).unwrap_err();
        assert!(err.to_string().contains("not available"), "{err}");
    }
}

/// Text (a safetensors JSON header) is zstd-coded: order-0 Huffman cannot see its repeats.
/// Bytes Huffman cannot shrink by a fifth are not tried with zstd.
#[test]
fn plain_text_takes_zstd_where_it_beats_huffman() {
    let mut text = Vec::new();
    for i in 0..2000 {
        text.extend_from_slice(format!("\"model.layers.{}.mlp.experts.{}.bias\":{{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[{},{}]}},", i / 50, i % 50, i * 128, i * 128 + 128).as_bytes());
    }
    text.truncate(65536);
    let options = Options::default();
    let code = |bytes: &[u8], selection| {
        let options = Options { selection, ..options.clone() };
        let mut payload = Vec::new();
        let header =
            encode_chunk(Data::Bytes(bytes), None, Grouping::BYTES, &options, &mut SkipState::default(), &mut payload)
                .unwrap();
        (header, payload)
    };
    let (header, payload) = code(&text, Selection::Auto);
    let (_, huffman) = code(&text, Selection::Only(Method::Huffman));
    assert_eq!(header.groups()[0].method, Method::Zstd);
    assert!(payload.len() * 3 < huffman.len(), "zstd {} vs huffman {}", payload.len(), huffman.len());
    let mut back = vec![0; text.len()];
    decode_chunk(&payload, &header, Grouping::BYTES, None, &mut back).unwrap();
    assert_eq!(back, text);
    // Seven bits of noise per byte: Huffman's estimate is 7/8 of the group, above the 4/5
    // from which zstd is tried, so it is coded once, with Huffman.
    let noise: Vec<u8> = crate::test_data::xorshift(9).take(65536).map(|x| x as u8 & 0x7f).collect();
    let (header, _) = code(&noise, Selection::Auto);
    assert_eq!(header.groups()[0].method, Method::Huffman);
    // int8-like weights (negative values set the top bit) are not text either.
    let int8: Vec<u8> = crate::test_data::xorshift(3).take(65536).map(|x| (x % 16) as u8 ^ 0xf8).collect();
    let (header, _) = code(&int8, Selection::Auto);
    assert_eq!(header.groups()[0].method, Method::Huffman);
}

#[test]
fn inconsistent_headers_are_rejected() {
    let grouping = Grouping { width: 2, extract_exponent: false };
    let raw = GroupEntry { method: Method::Raw, stored_len: 4 };
    let bad = ChunkHeader::new(&[raw, GroupEntry { method: Method::Zero, stored_len: 1 }]).unwrap();
    let mut out = [0u8; 8];
    assert!(decode_chunk(&[0; 5], &bad, grouping, None, &mut out).is_err());
    let good = ChunkHeader::new(&[raw, raw]).unwrap();
    assert!(decode_chunk(&[0; 7], &good, grouping, None, &mut out).is_err(), "short payload");
    let huge = ChunkHeader::new(&[raw, GroupEntry { method: Method::Huffman, stored_len: 4 }]).unwrap();
    assert!(decode_chunk(&[0; 8], &huge, grouping, None, &mut out).is_err(), "coded group not smaller");
    let one = ChunkHeader::new(&[raw]).unwrap();
    assert!(decode_chunk(&[0; 4], &one, grouping, None, &mut out).is_err(), "group count");
}
