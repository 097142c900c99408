//! Deterministic pseudo-random data for the unit tests: one xorshift64 stream that each test
//! shapes into the bytes it needs (float-like weights, sparse deltas, noise).

/// The xorshift64 sequence from `seed` (made odd: zero is a fixed point of xorshift).
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed | 1;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}

/// `len` pseudo-random bytes from `seed` (the low byte of each step).
pub(crate) fn random_bytes(seed: u64, len: u64) -> Vec<u8> {
    xorshift(seed).take(len as usize).map(|s| s as u8).collect()
}
