//! Strict parser and header writer for the safetensors format.
//!
//! This module owns the interpretation of safetensors bytes: it reads the 8-byte little-endian
//! header length and the JSON header, validates every entry against the file length (dtypes,
//! shapes, `data_offsets`, duplicates, overlap) and returns the tensors sorted by offset together
//! with the header bytes kept verbatim, and it builds headers for files holding a subset of
//! tensors. It is pure: it takes bytes and lengths, never paths, does no I/O, and must never
//! panic, index out of bounds or allocate based on a size read from the input before that size
//! has been checked against the bytes actually present. It does not read or copy tensor data and
//! does not decide what to do with gaps between tensors (callers keep those as opaque bytes).

mod error;
mod json;
mod write;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use error::Error;
pub use write::write_header;

use crate::dtype::Dtype;

/// Largest accepted JSON header length N, in bytes: the same cap as the official `safetensors`
/// crate (100,000,000 bytes), so every file the official reader opens passes this check.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Length of the little-endian u64 that starts every safetensors file.
const LEN_PREFIX: u64 = 8;

/// A parsed and validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The first 8 + N bytes of the file, verbatim: length prefix and JSON including padding.
    pub raw: Vec<u8>,
    /// Offset of the data buffer in the file: 8 + N.
    pub data_start: u64,
    /// Total length of the file.
    pub file_len: u64,
    /// The tensors, sorted by `begin` (ties, which only involve empty tensors, by name).
    /// Names are unique. Non-empty tensors are pairwise disjoint; empty tensors may sit at any
    /// offset in `data_start..=file_len`, including inside a non-empty tensor's range.
    pub tensors: Vec<TensorInfo>,
    /// The `__metadata__` map, if present (for display: `raw` keeps the real bytes).
    pub metadata: Option<BTreeMap<String, String>>,
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name: any string (it is data, never a path).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions; empty for a scalar (one element).
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte (`data_start + data_offsets[0]`).
    pub begin: u64,
    /// Absolute file offset one past the last byte (`data_start + data_offsets[1]`).
    pub end: u64,
}

impl TensorInfo {
    /// Length of the tensor's data in bytes (`end - begin`; 0 if `end < begin`, which a parsed
    /// header never has).
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }

    /// Whether the tensor has no data bytes (a 0 in its shape).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of elements: the product of the shape (1 for a scalar, 0 if any dimension is 0).
    /// Saturates at `u64::MAX`, which cannot happen for a tensor of a parsed header.
    pub fn num_elements(&self) -> u64 {
        num_elements(&self.shape).unwrap_or(u64::MAX)
    }
}

/// Product of the dimensions; `None` on overflow. Any 0 makes it 0, whatever the other dimensions.
fn num_elements(shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1u64, |acc, &dim| acc.checked_mul(dim))
}

/// Bytes of a tensor of this dtype and shape; `None` on overflow.
fn byte_len(dtype: Dtype, shape: &[u64]) -> Option<u64> {
    num_elements(shape)?.checked_mul(dtype.size() as u64)
}

/// Reads the 8-byte little-endian header length N from the first bytes of a file.
///
/// `prefix` must hold at least the first 8 bytes of the file. Checks that the file has 8 bytes,
/// that N <= [`MAX_HEADER_LEN`] and that 8 + N <= `file_len`.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, Error> {
    if file_len < LEN_PREFIX {
        return Err(Error::TooShort { file_len });
    }
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(Error::PrefixTooShort { needed: LEN_PREFIX, available: prefix.len() as u64 })?;
    let n = u64::from_le_bytes(bytes);
    if n > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge { header_len: n, max: MAX_HEADER_LEN });
    }
    // Cannot overflow: n <= MAX_HEADER_LEN.
    let header_end = LEN_PREFIX + n;
    if header_end > file_len {
        return Err(Error::HeaderPastEnd { header_len: n, header_end, file_len });
    }
    Ok(n)
}

/// Parses and validates a header, given at least the first 8 + N bytes of the file (bytes after
/// the header are ignored) and the total file length.
pub(crate) fn parse_header(prefix: &[u8], file_len: u64) -> Result<Header, Error> {
    let n = header_len(prefix, file_len)?;
    let data_start = LEN_PREFIX + n;
    let too_short = Error::PrefixTooShort { needed: data_start, available: prefix.len() as u64 };
    let raw_len = usize::try_from(data_start).map_err(|_| too_short.clone())?;
    let raw = prefix.get(..raw_len).ok_or(too_short)?;
    let json = raw.get(8..).unwrap_or_default();
    let text =
        std::str::from_utf8(json).map_err(|e| Error::HeaderNotUtf8 { offset: LEN_PREFIX + e.valid_up_to() as u64 })?;
    let parsed = json::parse_json(text)?;

    // header_len checked data_start <= file_len.
    let data_len = file_len - data_start;
    let mut tensors = Vec::with_capacity(parsed.entries.len());
    for entry in parsed.entries {
        let json::RawEntry { name, dtype, shape, begin, end } = entry;
        if begin > end {
            return Err(Error::OffsetsReversed { tensor: name, begin, end });
        }
        if end > data_len {
            return Err(Error::OffsetsPastEnd { tensor: name, begin, end, data_len });
        }
        let Some(expected) = byte_len(dtype, &shape) else {
            return Err(Error::SizeOverflow { tensor: name, shape, dtype });
        };
        let actual = end - begin;
        if expected != actual {
            return Err(Error::SizeMismatch { tensor: name, shape, dtype, expected, begin, end, actual });
        }
        // Cannot overflow: end <= data_len, so data_start + end <= file_len.
        tensors.push(TensorInfo { name, dtype, shape, begin: data_start + begin, end: data_start + end });
    }
    tensors.sort_by(|a, b| a.begin.cmp(&b.begin).then_with(|| a.name.cmp(&b.name)));

    // Sorted by begin and disjoint so far, the previous non-empty tensor has the largest end.
    let mut previous: Option<&TensorInfo> = None;
    for t in tensors.iter().filter(|t| !t.is_empty()) {
        if let Some(p) = previous {
            if t.begin < p.end {
                return Err(Error::Overlap {
                    first: p.name.clone(),
                    first_begin: p.begin - data_start,
                    first_end: p.end - data_start,
                    second: t.name.clone(),
                    second_begin: t.begin - data_start,
                    second_end: t.end - data_start,
                });
            }
        }
        previous = Some(t);
    }

    Ok(Header { raw: raw.to_vec(), data_start, file_len, tensors, metadata: parsed.metadata })
}

/// Parses and validates the header of a safetensors file held entirely in memory.
pub fn parse(file: &[u8]) -> Result<Header, Error> {
    parse_header(file, file.len() as u64)
}
