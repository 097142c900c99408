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
pub fn random_bytes(seed: u64, len: u64) -> Vec<u8> {
    xorshift(seed).take(len as usize).map(|s| s as u8).collect()
}

/// A safetensors file of two BF16 tensors whose values depend on `seed`; `step` changes
/// every 64th element (a training step), so consecutive steps delta-code.
pub fn steps_checkpoint(seed: u64, step: u64) -> Vec<u8> {
    let tensors =
        vec![("w".to_string(), crate::Dtype::Bf16, vec![64, 256]), ("b".to_string(), crate::Dtype::Bf16, vec![4096])];
    let mut bytes = crate::safetensors::write_header(&tensors, None).unwrap();
    for (i, r) in xorshift(seed).take(64 * 256 + 4096).enumerate() {
        let low = if i % 64 == 0 { (r >> 8) as u8 ^ step as u8 } else { (r >> 8) as u8 };
        bytes.extend_from_slice(&[low, 0x3f ^ ((r & 1) as u8)]);
    }
    bytes
}

/// A store holding three steps of one path; returns it and (manifest, len, hash, bytes).
pub fn store_with_steps(dir: &std::path::Path) -> (crate::repo::Repo, Vec<(crate::repo::StoredFile, Vec<u8>)>) {
    let store = crate::repo::Repo::init(&dir.join("store")).unwrap();
    let path = crate::repo::RepoPath::parse("m.safetensors").unwrap();
    let spool = dir.join("spool");
    let mut files = Vec::new();
    for step in 0..3 {
        let bytes = steps_checkpoint(1, step);
        std::fs::write(&spool, &bytes).unwrap();
        files.push((store.store_file(&spool, &path, "s", &crate::repo::CommitOptions::default()).unwrap(), bytes));
    }
    (store, files)
}
