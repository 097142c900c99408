//! Pruned tensors (issue #43): a chunk whose elements are often exactly zero (50% unstructured
//! or 2:4 structured sparsity) stored as a bitmap of its non-zero elements and those elements
//! alone. Byte groups would pay for the zeros once per group (each group's coder sees a zero
//! byte at every pruned position); the bitmap pays once, and a 2:4 bitmap has only 6 patterns
//! per 4 elements, which its coder turns into about 0.65 bits per element.
//!
//! This module owns the payload of a [`super::Method::Masked`] group: a chunk's top group, with
//! every group below it [`super::Method::Within`]. Both streams are nested chunks coded with the
//! codec's own coders ([`super::grid`]'s stream framing).

use super::chunk::{encode_chunk, ChunkHeader, Data, GroupEntry, SkipState};
use super::grid::{put_stream, take_stream};
use super::select::Options;
use super::{Error, Grouping, Method, Result};

/// Fewest zero elements, as a fraction of the chunk, for which a mask is tried.
const MIN_ZERO_FRACTION: f64 = 0.25;

fn corrupt(reason: String) -> Error {
    Error::Corrupt(format!("masked payload: {reason}"))
}

/// Codes a standalone chunk of `width ≥ 2`-byte elements both ways, as byte groups and (when at
/// least a quarter of its elements are zero) as a mask and its non-zero elements, appends the
/// smaller payload to `out` and returns its header.
pub(crate) fn encode_best(
    chunk: Data<'_>,
    grouping: Grouping,
    options: &Options,
    skip: &mut SkipState,
    out: &mut Vec<u8>,
) -> Result<ChunkHeader> {
    let start = out.len();
    let header = encode_chunk(chunk, None, grouping, options, skip, out)?;
    let width = grouping.width;
    let Some(bytes) = chunk.bytes().filter(|_| width >= 2) else { return Ok(header) };
    let m = bytes.len() / width;
    let zeros = bytes.chunks_exact(width).filter(|e| e.iter().all(|&b| b == 0)).count();
    if m == 0 || (zeros as f64) < MIN_ZERO_FRACTION * m as f64 {
        return Ok(header);
    }
    let mut mask = vec![0u8; m.div_ceil(8)];
    let mut values = Vec::with_capacity(bytes.len() - zeros * width);
    for (j, e) in bytes.chunks_exact(width).enumerate() {
        if e.iter().any(|&b| b != 0) {
            mask[j / 8] |= 1 << (j % 8);
            values.extend_from_slice(e);
        }
    }
    let mut payload = Vec::new();
    put_stream(&mask, Grouping::BYTES, options, &mut payload)?;
    put_stream(&values, grouping, options, &mut payload)?;
    if payload.len() >= out.len() - start {
        return Ok(header);
    }
    out.truncate(start);
    out.extend_from_slice(&payload);
    let mut entries = [GroupEntry { method: Method::Within, stored_len: 0 }; 8];
    let stored_len = u32::try_from(payload.len()).expect("smaller than the chunk");
    entries[width - 1] = GroupEntry { method: Method::Masked, stored_len };
    ChunkHeader::new(&entries[..width])
}

/// Decodes a Masked group's payload into `out`: the chunk's elements (`grouping.width` bytes
/// each).
pub fn decode(stored: &[u8], grouping: Grouping, out: &mut [u8]) -> Result<()> {
    let width = grouping.width;
    if width < 2 || !out.len().is_multiple_of(width) {
        return Err(corrupt(format!("a chunk of {} bytes of {width}-byte elements", out.len())));
    }
    let m = out.len() / width;
    let mut at = 0;
    let mask = take_stream(stored, &mut at, Grouping::BYTES, Some(m.div_ceil(8)), m.div_ceil(8))?;
    if !m.is_multiple_of(8) && mask.last().is_some_and(|&b| b >> (m % 8) != 0) {
        return Err(corrupt("mask bits past the chunk".into()));
    }
    let nonzero: usize = mask.iter().map(|b| b.count_ones() as usize).sum();
    let values = take_stream(stored, &mut at, grouping, Some(nonzero * width), nonzero * width)?;
    if at != stored.len() {
        return Err(corrupt("trailing bytes".into()));
    }
    let mut next = values.chunks_exact(width);
    for (j, e) in out.chunks_exact_mut(width).enumerate() {
        if mask[j / 8] >> (j % 8) & 1 == 1 {
            e.copy_from_slice(next.next().expect("one value per mask bit"));
        } else {
            e.fill(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::container::{Container, ContainerWriter, FileKind, SegmentInput};
    use crate::dtype::Dtype;
    use crate::test_data::xorshift;
    use proptest::prelude::*;

    /// Weights with a fraction of them pruned: unstructured (each element with probability
    /// `pruned`/8) or 2:4 (two of every four).
    fn pruned(seed: u64, n: usize, pruned: u64, two_four: bool, width: usize) -> Vec<u8> {
        let mut rng = xorshift(seed);
        let mut out = Vec::with_capacity(n * width);
        for i in 0..n {
            let r = rng.next().unwrap();
            let zero = if two_four {
                (r >> 60).is_multiple_of(2) && i % 4 < 2 || (r >> 60) % 2 == 1 && i % 4 >= 2
            } else {
                r % 8 < pruned
            };
            let v = ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            let bytes = if zero { 0f32.to_bits() } else { v.to_bits() };
            out.extend_from_slice(&bytes.to_le_bytes()[4 - width..]);
        }
        out
    }

    fn round_trip(data: &[u8], dtype: Dtype) -> (usize, usize) {
        let options = Options { chunk_size: 16 << 10, ..Options::default() };
        let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
        let input =
            SegmentInput { data: Data::Bytes(data), dtype: Some(dtype), reference: None, link: None, row_len: None };
        w.segment_inputs(&[input], &mut |_| {}).unwrap();
        let (container, _) = w.finish().unwrap();
        let c = Container::open(&container).unwrap();
        let mut out = Vec::new();
        c.decode_to(&mut out).unwrap();
        assert!(out == data, "decoded bytes differ");
        let masked = (0..c.chunk_count()).filter(|&i| c.chunk(i).2.groups().last().unwrap().method == Method::Masked);
        (masked.count(), container.len())
    }

    #[test]
    fn pruned_weights_are_masked_and_smaller() {
        for (pruned_eighths, two_four) in [(4, false), (0, true)] {
            let data = pruned(1, 1 << 15, pruned_eighths, two_four, 2);
            let (masked, size) = round_trip(&data, Dtype::Bf16);
            assert!(masked > 0, "{two_four}");
            assert!(size < data.len() * 3 / 4, "{two_four}: {size} of {}", data.len());
        }
        let (masked, _) = round_trip(&pruned(2, 1 << 14, 0, false, 4), Dtype::F32);
        assert_eq!(masked, 0, "dense chunks are not masked");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn sparse_tensors_round_trip(seed in any::<u64>(), pruned_eighths in 0u64..=8, two_four in any::<bool>(), wide in any::<bool>(), n in 0usize..20_000) {
            let (width, dtype) = if wide { (4, Dtype::F32) } else { (2, Dtype::Bf16) };
            round_trip(&pruned(seed, n, pruned_eighths, two_four, width), dtype);
        }

        #[test]
        fn damaged_payloads_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), wide in any::<bool>(), n in 0usize..400) {
            let grouping = Grouping::for_dtype(Some(if wide { Dtype::F32 } else { Dtype::Bf16 }));
            let _ = decode(&bytes, grouping, &mut vec![0u8; n * grouping.width]);
        }
    }
}
