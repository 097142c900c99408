//! Huffman coding of a byte stream (stub: replaced by the huff0 implementation).

use super::{Error, Result};

/// Appends the Huffman coding of `input` to `out`. Returns `false` (and leaves `out` unchanged)
/// when the coding would not be smaller than `input`.
pub fn encode(input: &[u8], out: &mut Vec<u8>) -> Result<bool> {
    let _ = (input, out);
    Ok(false)
}

/// Decodes `input` into exactly `out.len()` bytes.
pub fn decode(input: &[u8], out: &mut [u8]) -> Result<()> {
    let _ = (input, out);
    Err(Error::Corrupt("huffman not implemented".into()))
}
