//! Sparse tokens against plain zstd, on the groups where they compete: for each consecutive pair
//! of FILES (XOR deltas of tensors matched by name), every (chunk, byte group) that the automatic
//! choice sends to the zstd family is coded both as plain zstd and as sparse tokens (falling back
//! to plain zstd when the tokens do not pay, as the coder does). Prints the stored bytes of both
//! and the single-thread time to decode each and XOR it into an accumulator, as a delta-chain
//! level does.
//!
//! `cargo run --release --example sparse_vs_zstd -- EPOCH_0.safetensors EPOCH_1.safetensors ...`

use ckpt::codec::byte_group::split;
use ckpt::codec::select::predict;
use ckpt::codec::{sparse, zstd_block, Grouping, Method, Options};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Totals {
    groups: u64,
    group_bytes: u64,
    zstd_bytes: u64,
    sparse_bytes: u64,
    fallbacks: u64,
    zstd_time: Duration,
    sparse_time: Duration,
}

fn measure(group: &[u8], options: &Options, t: &mut Totals) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut zstd = Vec::new();
    if !zstd_block::encode(group, options.zstd_level, &mut zstd)? {
        return Ok(());
    }
    let mut tokens = Vec::new();
    let sparse_ok = sparse::encode(group, options.zstd_level, &mut tokens)?;
    t.groups += 1;
    t.group_bytes += group.len() as u64;
    t.zstd_bytes += zstd.len() as u64;
    t.sparse_bytes += if sparse_ok { tokens.len() } else { zstd.len() } as u64;
    t.fallbacks += u64::from(!sparse_ok);
    let mut acc = vec![1u8; group.len()];
    let mut scratch = vec![0u8; group.len()];
    let start = Instant::now();
    zstd_block::decode(&zstd, &mut scratch)?;
    for (a, b) in acc.iter_mut().zip(&scratch) {
        *a ^= b;
    }
    let zstd_time = start.elapsed();
    t.zstd_time += zstd_time;
    if sparse_ok {
        let start = Instant::now();
        sparse::decode(&tokens, &mut acc, true)?;
        t.sparse_time += start.elapsed();
    } else {
        t.sparse_time += zstd_time;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.len() < 2 {
        return Err("usage: sparse_vs_zstd EPOCH_0.safetensors EPOCH_1.safetensors ...".into());
    }
    let options = Options::default();
    let mut t = Totals::default();
    for pair in files.windows(2) {
        let (old, new) = (std::fs::read(&pair[0])?, std::fs::read(&pair[1])?);
        let (old_header, new_header) = (ckpt::safetensors::parse(&old)?, ckpt::safetensors::parse(&new)?);
        for tensor in &new_header.tensors {
            let Some(o) = old_header
                .tensors
                .iter()
                .find(|o| o.name == tensor.name && o.dtype == tensor.dtype && o.shape == tensor.shape)
            else {
                continue;
            };
            let grouping = Grouping::for_dtype(Some(tensor.dtype));
            let new_bytes = &new[tensor.begin as usize..tensor.end as usize];
            let old_bytes = &old[o.begin as usize..o.end as usize];
            for (a, b) in new_bytes.chunks(options.chunk_size).zip(old_bytes.chunks(options.chunk_size)) {
                let mut grouped = vec![0u8; a.len()];
                split(a, Some(b), grouping, &mut grouped)?;
                let n = a.len() / grouping.width;
                for group in grouped.chunks_exact(n.max(1)) {
                    if predict(group, &options) == Method::Sparse {
                        measure(group, &options, &mut t)?;
                    }
                }
            }
        }
    }
    println!(
        "{} groups ({:.1} MB): plain zstd {} B, sparse {} B ({:+.2}%; {} fell back to zstd); \
         decode + XOR: zstd {:.3} s, sparse {:.3} s ({:.2}x)",
        t.groups,
        t.group_bytes as f64 / 1e6,
        t.zstd_bytes,
        t.sparse_bytes,
        100.0 * (t.sparse_bytes as f64 / t.zstd_bytes.max(1) as f64 - 1.0),
        t.fallbacks,
        t.zstd_time.as_secs_f64(),
        t.sparse_time.as_secs_f64(),
        t.zstd_time.as_secs_f64() / t.sparse_time.as_secs_f64().max(1e-9)
    );
    Ok(())
}
