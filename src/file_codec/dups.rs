//! Which segments of a file a container stores as references to earlier ones (docs/format.md,
//! "Reference segments"): a tensor whose bytes equal an earlier tensor's (tied embeddings saved
//! twice, shared layers) is a copy, found by its blake3 id as a repository finds a blob it
//! holds already; a float tensor whose bf16/f16 copy, or whose f32 master, came earlier in the
//! file is derived from it by the cross-precision prediction of derived blobs.

use super::Planned;
use crate::codec::container::SegmentLink;
use crate::codec::cross_precision::{self, Conversion, Rounding};
use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use rayon::prelude::*;
use std::collections::HashMap;

/// Tensors below this are never references: a reference record saves little on them, and
/// small tensors are coded in runs anyway.
const MIN_LINK_BYTES: u64 = 4096;

/// Elements of each sample a pairing across precisions is checked on, before the whole.
const SAMPLE_ELEMENTS: usize = 1024;

/// Prefixes that training code wraps parameter names in (`DistributedDataParallel`'s `module.`,
/// `torch.compile`'s `_orig_mod.`, a `model.` or `state_dict.` level of the saved dict): two
/// precisions of one model saved by different code paths may differ only by them.
const WRAPPER_PREFIXES: [&str; 4] = ["module.", "_orig_mod.", "model.", "state_dict."];

/// What pairs tensors across precisions: the name without [`WRAPPER_PREFIXES`] (repeatedly, as
/// long as something is left) and the shape. (A commit pairs tensors of different files by it;
/// inside one file names differ, so [`plan_links`] prefers it and falls back on the values.)
pub(crate) fn precision_key(name: &str, shape: &[u64]) -> (String, Vec<u64>) {
    let mut n = name;
    while let Some(rest) = WRAPPER_PREFIXES.iter().find_map(|p| n.strip_prefix(p)).filter(|r| !r.is_empty()) {
        n = rest;
    }
    (n.to_string(), shape.to_vec())
}

/// The link of each of `segments` of `file`: `None` for a segment coded as itself.
pub(super) fn plan_links(file: &[u8], segments: &[Planned]) -> Vec<Option<SegmentLink>> {
    let bytes = |s: &Planned| &file[s.range.start as usize..s.range.end as usize];
    let candidate =
        |s: &Planned| s.dtype.is_some() && s.tensor.is_some() && s.range.end - s.range.start >= MIN_LINK_BYTES;
    let mut links = vec![None; segments.len()];
    // Copies: only lengths held by two tensors or more are hashed.
    let mut by_len: HashMap<u64, usize> = HashMap::new();
    for s in segments.iter().filter(|s| candidate(s)) {
        *by_len.entry(s.range.end - s.range.start).or_default() += 1;
    }
    let hashed: Vec<(usize, ObjectId)> = segments
        .par_iter()
        .enumerate()
        .filter(|(_, s)| candidate(s) && by_len[&(s.range.end - s.range.start)] > 1)
        .map(|(i, s)| (i, ObjectId::hash(bytes(s))))
        .collect();
    let mut first: HashMap<ObjectId, usize> = HashMap::new();
    for (i, id) in hashed {
        match first.get(&id) {
            Some(&source) => links[i] = Some(SegmentLink { source: source as u32, conversion: None }),
            None => {
                first.insert(id, i);
            }
        }
    }
    // Derived: each float tensor not a copy, from the first earlier plain tensor of the
    // partner precision and the same shape that it rounds to or from (same name first).
    let mut plain_by_shape: HashMap<&[u64], Vec<usize>> = HashMap::new();
    for (i, s) in segments.iter().enumerate() {
        let (Some(dtype), Some((name, shape))) = (s.dtype, &s.tensor) else { continue };
        if links[i].is_some() || !candidate(s) || !matches!(dtype, Dtype::F32 | Dtype::Bf16 | Dtype::F16) {
            continue;
        }
        let earlier = plain_by_shape.get(shape.as_slice()).map(Vec::as_slice).unwrap_or_default();
        let key = precision_key(name, shape);
        let by_name = earlier
            .iter()
            .copied()
            .filter(|&j| segments[j].tensor.as_ref().is_some_and(|(n, sh)| precision_key(n, sh) == key));
        let partner = by_name.chain(earlier.iter().copied()).find_map(|j| {
            let source = &segments[j];
            derivation(bytes(source), source.dtype?, bytes(s), dtype).map(|c| (j, c))
        });
        match partner {
            Some((j, conversion)) => links[i] = Some(SegmentLink { source: j as u32, conversion: Some(conversion) }),
            None => plain_by_shape.entry(shape.as_slice()).or_default().push(i),
        }
    }
    links
}

/// How `target` (`dtype`) is derived from `source` (`source_dtype`), if one is the other's
/// rounding: checked on samples first (start, middle, end), then on the whole for a narrow
/// target (the rule that reproduces it, as [`cross_precision::choose`] picks it).
fn derivation(source: &[u8], source_dtype: Dtype, target: &[u8], dtype: Dtype) -> Option<Conversion> {
    let (wide, narrow_bytes, narrow_dtype) = match (source_dtype, dtype) {
        (Dtype::F32, Dtype::Bf16 | Dtype::F16) => (source, target, dtype),
        (Dtype::Bf16 | Dtype::F16, Dtype::F32) => (target, source, source_dtype),
        _ => return None,
    };
    let narrow = cross_precision::narrow_of(narrow_dtype)?;
    let elements = narrow_bytes.len() / 2;
    if wide.len() != elements * 4 || elements == 0 {
        return None;
    }
    let n = SAMPLE_ELEMENTS.min(elements);
    let starts = [0, (elements - n) / 2, elements - n];
    let sampled = |rule| {
        starts.iter().all(|&k| {
            let (w, h) = (&wide[k * 4..(k + n) * 4], &narrow_bytes[k * 2..(k + n) * 2]);
            cross_precision::is_rounding(w, h, narrow, rule).unwrap_or(false)
        })
    };
    if !sampled(Rounding::NearestEven) && !sampled(Rounding::Truncate) {
        return None;
    }
    if dtype == Dtype::F32 {
        return Some(Conversion::Widen);
    }
    cross_precision::choose(source, source_dtype, target, dtype)
}

#[cfg(test)]
mod tests {
    use super::super::{compress_with, decompress, Format};
    use crate::codec::container::{Container, SegmentLink};
    use crate::codec::cross_precision::{self, Conversion, Narrow, Rounding};
    use crate::codec::Options;
    use crate::dtype::Dtype;
    use crate::test_data::random_bytes;
    use proptest::prelude::*;

    /// A safetensors file of `tensors` (name, dtype, bytes), each of shape `[len / width]`.
    fn file(tensors: &[(&str, Dtype, Vec<u8>)]) -> Vec<u8> {
        let spec: Vec<_> =
            tensors.iter().map(|(n, d, b)| (n.to_string(), *d, vec![(b.len() / d.size()) as u64])).collect();
        let mut out = crate::safetensors::write_header(&spec, None).unwrap();
        for (_, _, b) in tensors {
            out.extend_from_slice(b);
        }
        out
    }

    /// Trained-looking f32 weights: small normal-ish values (random mantissas, few exponents).
    fn weights(seed: u64, elements: usize) -> Vec<u8> {
        let noise = random_bytes(seed * 2 + 1, elements as u64 * 4); // odd: xorshift makes a seed odd
        noise
            .chunks_exact(4)
            .flat_map(|c| {
                let bits = u32::from_le_bytes(c.try_into().unwrap());
                let exponent = 118 + (bits >> 29); // 2^-9 .. 2^-2
                ((bits & 0x807f_ffff) | (exponent << 23)).to_le_bytes()
            })
            .collect()
    }

    fn bf16_of(wide: &[u8]) -> Vec<u8> {
        let mut out = vec![0; wide.len() / 2];
        cross_precision::narrow(wide, Narrow::Bf16, Rounding::NearestEven, &mut out).unwrap();
        out
    }

    /// Compresses `file` with references on and off; checks both decode to it exactly and
    /// returns the container with references, and the sizes with and without.
    fn round_trip(file: &[u8]) -> (Vec<u8>, usize, usize) {
        let options = Options { chunk_size: 16 << 10, ..Options::default() };
        let code = |refs| compress_with(file, Format::Safetensors, &options, refs, Vec::new(), &mut |_| {}).unwrap().0;
        let (with, without) = (code(true), code(false));
        for c in [&with, &without] {
            let mut out = Vec::new();
            decompress(c, &mut out, &mut |_| {}).unwrap();
            assert!(out == file, "round trip");
            let mut whole = vec![0; file.len()];
            Container::open(c).unwrap().decode_into(&mut whole).unwrap();
            assert!(whole == file, "decode_into");
        }
        let (lw, lo) = (with.len(), without.len());
        (with, lw, lo)
    }

    fn links(container: &[u8]) -> Vec<Option<SegmentLink>> {
        Container::open(container).unwrap().segments().iter().map(|s| s.link).collect()
    }

    #[test]
    fn a_tensor_saved_twice_is_stored_once() {
        let embed = weights(1, 40_000);
        let f = file(&[
            ("embed.weight", Dtype::F32, embed.clone()),
            ("layer.weight", Dtype::F32, weights(2, 20_000)),
            ("lm_head.weight", Dtype::F32, embed.clone()),
            ("lm_head2.weight", Dtype::F32, embed),
        ]);
        let (container, with, without) = round_trip(&f);
        // Segments: header, embed, layer, lm_head (a copy of 1), lm_head2 (of 1, not of 3).
        let copy = Some(SegmentLink { source: 1, conversion: None });
        assert_eq!(links(&container), vec![None, None, None, copy, copy]);
        assert!(with * 10 < without * 6, "{with} against {without}");
        // Without references the container is the format it always was.
        assert_eq!(u16::from_le_bytes([container[8], container[9]]), 7);
    }

    #[test]
    fn a_bf16_copy_is_derived_from_its_master_and_its_duplicate_copies_it() {
        let master = weights(3, 30_000);
        let copy = bf16_of(&master);
        let f = file(&[
            ("master.w", Dtype::F32, master.clone()),
            ("w", Dtype::Bf16, copy.clone()),
            ("w_again", Dtype::Bf16, copy),
            ("other", Dtype::Bf16, bf16_of(&weights(4, 30_000))),
        ]);
        let (container, with, without) = round_trip(&f);
        let derived = Some(SegmentLink { source: 1, conversion: Some(Conversion::NarrowNearestEven) });
        let again = Some(SegmentLink { source: 2, conversion: None });
        assert_eq!(links(&container), vec![None, None, derived, again, None]);
        assert!(with < without, "{with} against {without}");
    }

    #[test]
    fn an_f32_master_after_its_bf16_copy_is_derived_by_widening() {
        let master = weights(5, 30_000);
        let f = file(&[("w.bf16", Dtype::Bf16, bf16_of(&master)), ("w.master", Dtype::F32, master)]);
        let (container, with, without) = round_trip(&f);
        assert_eq!(links(&container)[2], Some(SegmentLink { source: 1, conversion: Some(Conversion::Widen) }));
        assert!(with < without, "{with} against {without}");
    }

    #[test]
    fn unrelated_tensors_of_one_shape_stay_apart() {
        let f = file(&[
            ("a", Dtype::F32, weights(6, 10_000)),
            ("b", Dtype::Bf16, bf16_of(&weights(7, 10_000))),
            ("c", Dtype::F32, weights(8, 10_000)),
        ]);
        let (container, with, without) = round_trip(&f);
        assert!(links(&container).iter().all(Option::is_none), "{:?}", links(&container));
        assert_eq!(with, without);
        assert_eq!(u16::from_le_bytes([container[8], container[9]]), crate::codec::container::FORMAT_VERSION);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any mix of tensors, copies of earlier ones and roundings of earlier ones, in any
        /// order, comes back bit for bit.
        #[test]
        fn duplicates_and_roundings_round_trip(plan in proptest::collection::vec((0u8..4, 0usize..6, 1usize..5000), 1..8)) {
            let mut tensors: Vec<(String, Dtype, Vec<u8>)> = Vec::new();
            for (k, (kind, pick, elements)) in plan.into_iter().enumerate() {
                let earlier = (!tensors.is_empty()).then(|| tensors[pick % tensors.len()].clone());
                let (dtype, bytes) = match (kind, earlier) {
                    (1, Some((_, d, b))) => (d, b),
                    (2, Some((_, Dtype::F32, b))) => (Dtype::Bf16, bf16_of(&b)),
                    (3, Some((_, Dtype::F32, b))) => {
                        let mut h = vec![0; b.len() / 2];
                        cross_precision::narrow(&b, Narrow::F16, Rounding::Truncate, &mut h).unwrap();
                        (Dtype::F16, h)
                    }
                    (2 | 3, Some((_, Dtype::Bf16, b))) => {
                        let mut w = vec![0; b.len() * 2];
                        cross_precision::widen(&b, Narrow::Bf16, &mut w).unwrap();
                        (Dtype::F32, w)
                    }
                    _ => (Dtype::F32, weights(k as u64 + 100, elements)),
                };
                tensors.push((format!("t{k}"), dtype, bytes));
            }
            let refs: Vec<(&str, Dtype, Vec<u8>)> = tensors.iter().map(|(n, d, b)| (n.as_str(), *d, b.clone())).collect();
            round_trip(&file(&refs));
        }
    }
}
