use std::time::Instant;
fn main() {
    let dir = tempfile::tempdir_in("/work/bench").unwrap();
    let store = ckpt::store::Store::init(&dir.path().join("s")).unwrap();
    let data: Vec<u8> = (0..64u64 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for round in 0..5 {
        let t = Instant::now();
        let h = blake3::hash(&data[..]);
        let t_blake = t.elapsed();
        let t = Instant::now();
        let mut n = 0;
        for piece in data.chunks(4 << 20) {
            let b = store.write_blob_uncoded(piece, Some(ckpt::Dtype::F32), 256 << 10).unwrap();
            n += b.written.stored_len;
        }
        let t_write = t.elapsed();
        let t = Instant::now();
        let mut out = vec![0u8; 4 << 20];
        for piece in data.chunks(4 << 20) {
            let layout = ckpt::codec::Layout::for_dtype(Some(ckpt::Dtype::F32));
            ckpt::codec::byte_group::split(piece, None, layout, &mut out).unwrap();
        }
        let t_split = t.elapsed();
        let t = Instant::now();
        let mut x = 0u64;
        for piece in data.chunks(256 << 10) {
            x ^= xxhash_rust::xxh3::xxh3_64(piece);
        }
        let t_xxh = t.elapsed();
        println!(
            "round {round}: blake3 {t_blake:?} uncoded-write {t_write:?} ({n} B) split {t_split:?} xxh3 {t_xxh:?} {}{}",
            h.as_bytes()[0],
            x & 1
        );
    }
}
