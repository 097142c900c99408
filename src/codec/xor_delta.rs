//! The XOR delta between two versions of a tensor: `new XOR reference`. XOR is its own inverse,
//! costs no extra bits, and turns every unchanged byte into a zero, which the per-group method
//! choice then codes as `Zero`, zstd runs or short Huffman codes. The chunk coder fuses the XOR
//! into byte grouping ([`super::byte_group::split`]); this module holds the plain primitive.

use super::{Error, Result};

/// Writes `a XOR b` to `out`. All three must have the same length (same dtype and shape).
pub fn xor_into(a: &[u8], b: &[u8], out: &mut [u8]) -> Result<()> {
    if a.len() != b.len() || a.len() != out.len() {
        return Err(Error::InvalidInput(format!(
            "XOR of buffers with different lengths ({}, {}, {})",
            a.len(),
            b.len(),
            out.len()
        )));
    }
    // Word-at-a-time; LLVM vectorises this loop.
    for ((o, x), y) in out.chunks_exact_mut(8).zip(a.chunks_exact(8)).zip(b.chunks_exact(8)) {
        let v = u64::from_ne_bytes(x.try_into().expect("8 bytes")) ^ u64::from_ne_bytes(y.try_into().expect("8 bytes"));
        o.copy_from_slice(&v.to_ne_bytes());
    }
    let tail = a.len() / 8 * 8;
    for ((o, x), y) in out[tail..].iter_mut().zip(&a[tail..]).zip(&b[tail..]) {
        *o = x ^ y;
    }
    Ok(())
}

/// XORs `other` into `acc` in place, over the shorter of the two (callers pass equal lengths).
/// Used wherever a decoded delta group is applied to what a chain has decoded so far.
pub(crate) fn xor_in_place(acc: &mut [u8], other: &[u8]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a ^= b;
    }
}

/// Returns `a XOR b` as a new vector.
pub fn xor(a: &[u8], b: &[u8]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; a.len()];
    xor_into(a, b, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn xor_is_an_involution(a in proptest::collection::vec(any::<u8>(), 0..100), seed in any::<u8>()) {
            let b: Vec<u8> = a.iter().map(|x| x.wrapping_mul(31).wrapping_add(seed)).collect();
            let d = xor(&a, &b).unwrap();
            prop_assert_eq!(xor(&d, &b).unwrap(), a.clone());
            prop_assert!(xor(&a, &a).unwrap().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn rejects_length_mismatch() {
        assert!(xor(&[1, 2], &[1]).is_err());
    }
}
