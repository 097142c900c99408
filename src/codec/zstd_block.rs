//! One byte group coded as a plain zstd frame (named `zstd_block` so it does not shadow the
//! `zstd` crate). Frames carry no checksum: the whole file or tensor hash is verified instead.

use super::{Error, Result};
use std::cell::RefCell;

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Appends a zstd frame of `input` at `level` to `out`. Returns `false` (and leaves `out` as it
/// was) if the frame would not be smaller than `input`.
pub fn encode(input: &[u8], level: i32, out: &mut Vec<u8>) -> Result<bool> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().map(|(l, _)| *l) != Some(level) {
            let mut c = zstd::bulk::Compressor::new(level).map_err(|e| Error::Zstd(e.to_string()))?;
            c.include_checksum(false).map_err(|e| Error::Zstd(e.to_string()))?;
            c.include_contentsize(false).map_err(|e| Error::Zstd(e.to_string()))?;
            *slot = Some((level, c));
        }
        let (_, compressor) = slot.as_mut().expect("set above");
        let start = out.len();
        // Room for a frame as large as the input; a larger one is useless to us, and zstd reports
        // dstSize_tooSmall instead of writing it.
        out.resize(start + input.len(), 0);
        match compressor.compress_to_buffer(input, &mut out[start..]) {
            Ok(n) if n < input.len() => {
                out.truncate(start + n);
                Ok(true)
            }
            // Too large for the buffer (zstd reports dstSize_tooSmall) or not smaller: not worth it.
            _ => {
                out.truncate(start);
                Ok(false)
            }
        }
    })
}

/// Decodes one zstd frame into exactly `out.len()` bytes.
pub fn decode(input: &[u8], out: &mut [u8]) -> Result<()> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| Error::Zstd(e.to_string()))?);
        }
        let d = slot.as_mut().expect("set above");
        let n = d.decompress_to_buffer(input, out).map_err(|e| Error::Corrupt(format!("zstd frame: {e}")))?;
        if n != out.len() {
            return Err(Error::Corrupt(format!("zstd frame decoded to {n} bytes, expected {}", out.len())));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(zero_frac in 0u8..=255, len in 0usize..5000, level in 1i32..4) {
            let input: Vec<u8> = (0..len).map(|i| if (i as u8).wrapping_mul(97) < zero_frac { 0 } else { (i * 7 % 251) as u8 }).collect();
            let mut out = Vec::new();
            if encode(&input, level, &mut out).unwrap() {
                prop_assert!(out.len() < input.len());
                let mut back = vec![0u8; len];
                decode(&out, &mut back).unwrap();
                prop_assert_eq!(back, input);
            } else {
                prop_assert!(out.is_empty());
            }
        }
    }

    #[test]
    fn corrupt_frames_are_errors() {
        let input = vec![0u8; 10_000];
        let mut out = Vec::new();
        assert!(encode(&input, 3, &mut out).unwrap());
        let mut back = vec![0u8; 9_999];
        assert!(decode(&out, &mut back).is_err(), "wrong length");
        let mut back = vec![0u8; 10_000];
        assert!(decode(&out[..out.len() - 1], &mut back).is_err(), "truncated");
        assert!(decode(b"not zstd", &mut back).is_err());
    }
}
