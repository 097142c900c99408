//! Repositories for the unit tests of the floors above `repo` (`repo` itself, `sync`): the
//! lower floors' tests use bytes only (`crate::test_data`).

/// A safetensors file of two BF16 tensors whose values depend on `seed`; `step` changes
/// every 64th element (a training step), so consecutive steps delta-code.
pub(crate) fn steps_checkpoint(seed: u64, step: u64) -> Vec<u8> {
    let tensors =
        vec![("w".to_string(), crate::Dtype::Bf16, vec![64, 256]), ("b".to_string(), crate::Dtype::Bf16, vec![4096])];
    let mut bytes = crate::safetensors::write_header(&tensors, None).unwrap();
    for (i, r) in crate::test_data::xorshift(seed).take(64 * 256 + 4096).enumerate() {
        let low = if i % 64 == 0 { (r >> 8) as u8 ^ step as u8 } else { (r >> 8) as u8 };
        bytes.extend_from_slice(&[low, 0x3f ^ ((r & 1) as u8)]);
    }
    bytes
}

/// A store holding three steps of one path; returns it and (manifest, len, hash, bytes).
pub(crate) fn store_with_steps(dir: &std::path::Path) -> (crate::repo::Repo, Vec<(crate::repo::StoredFile, Vec<u8>)>) {
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
