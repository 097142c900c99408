//! The hooks of whole-chunk structures ([`super::super::grid`], [`super::super::masked`]) in
//! chunk decoding: a chunk whose top group is Grid or Masked decodes from that group alone.

use super::super::grid::{self, TensorGrid};
use super::super::{byte_group, masked, xor_delta::xor_in_place, Grouping, Method, Options, Result};
use super::{encode_chunk, ChunkHeader, Data, Reference, SkipState};

/// Codes one chunk, trying the structures that may fit it: a standalone chunk of a tensor with a
/// grid (`grid`: the grid and the index of the chunk's first element in the tensor) is coded
/// both as byte groups and on the grid, any other standalone chunk of 2 or more bytes per
/// element (with `mask`) both as byte groups and, when enough elements are zero, masked; the
/// smaller is kept.
/// A delta's chunks are XOR deltas as always.
pub(super) fn encode(
    (grid, mask): (Option<(&TensorGrid, u64)>, bool),
    chunk: Data<'_>,
    reference: Option<Reference<'_>>,
    grouping: Grouping,
    options: &Options,
    skip: &mut SkipState,
    out: &mut Vec<u8>,
) -> Result<ChunkHeader> {
    match (grid, reference) {
        (Some((grid, first)), None) => grid::encode_best(grid, first, chunk, options, skip, out),
        (None, None) if mask && grouping.width >= 2 => masked::encode_best(chunk, grouping, options, skip, out),
        _ => encode_chunk(chunk, reference, grouping, options, skip, out),
    }
}

/// The index of a checked chunk's structured group (its top group: Grid or Masked), if any.
pub(super) fn structured_group(header: &ChunkHeader) -> Option<usize> {
    let top = header.groups().len() - 1;
    matches!(header.groups()[top].method, Method::Grid | Method::Masked).then_some(top)
}

/// Decodes a whole chunk's elements from its structured group.
pub(super) fn decode_structured(method: Method, stored: &[u8], grouping: Grouping, out: &mut [u8]) -> Result<()> {
    match method {
        Method::Grid => grid::decode(stored, grouping.width, out),
        _ => masked::decode(stored, grouping, out),
    }
}

/// [`super::decode_chunk_groups`] for a structured chunk: its elements into `elements`
/// (scratch), then split into `grouped` (or XORed into it with `xor_into`).
pub(super) fn decode_groups(
    method: Method,
    stored: &[u8],
    grouping: Grouping,
    elements: &mut [u8],
    grouped: &mut [u8],
    xor_into: bool,
) -> Result<()> {
    decode_structured(method, stored, grouping, elements)?;
    if !xor_into {
        return byte_group::split(elements, None, grouping, grouped);
    }
    let mut split = vec![0u8; grouped.len()];
    byte_group::split(elements, None, grouping, &mut split)?;
    xor_in_place(grouped, &split);
    Ok(())
}
