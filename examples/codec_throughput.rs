//! In-process codec timing, for comparing with libraries timed in memory (ZipNN's byte API):
//! reads FILE into memory, then times one compress into a `Vec` and one hash-verified decompress
//! into a buffer on a pool of THREADS threads, checks the round trip, and prints JSON
//! `{"size": stored_bytes, "comp_s": seconds, "decomp_s": seconds, "ok": bool}`.
//! Used by benches/compare.py. `codec_throughput FILE THREADS [SKIP_AFTER_RAW [RAW_FRACTION]]`
//!
//! With `CKPT_LEVEL=max` it compresses at [`ckpt::codec::Level::Max`]; `CKPT_CHUNK_KIB=K` sets
//! the chunk size; `CKPT_RANS_GAIN=0` turns rANS off at the default level (for A/B runs).
//!
//! With `CKPT_BENCH_REPEAT=R` it runs R compressions, then R decompressions, into the same
//! buffers and reports the median of each (the first run also pays the page faults of fresh
//! buffers, which on the project's VM cost as much as the codec itself and vary run to run).

use ckpt::codec::container::Container;
use ckpt::codec::Options;
use ckpt::file_codec::{compress, Format};
use std::time::Instant;

// The same allocator as the `ckpt` binary, so this measures what the CLI runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // As the `ckpt` binary does (src/main.rs): never return freed memory to the OS.
    // SAFETY: sets an integer option (15 = mi_option_purge_delay) before any thread starts.
    unsafe { libmimalloc_sys::mi_option_set(15, -1) };
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: codec_throughput FILE THREADS")?;
    let threads: usize = args.next().ok_or("usage: codec_throughput FILE THREADS")?.parse()?;
    let mut options = Options::default();
    if let Some(skip) = args.next() {
        options.skip_after_raw = skip.parse()?;
    }
    if let Some(raw_fraction) = args.next() {
        options.raw_fraction = raw_fraction.parse()?;
    }
    if let Ok(kib) = std::env::var("CKPT_CHUNK_KIB") {
        options.chunk_size = kib.parse::<usize>()? << 10;
    }
    if let Ok(gain) = std::env::var("CKPT_RANS_GAIN") {
        options.rans_gain = gain.parse()?;
    }
    if let Ok(level) = std::env::var("CKPT_LEVEL") {
        options.level = level.parse()?;
    }
    let repeat: usize = std::env::var("CKPT_BENCH_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let data = std::fs::read(&path)?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let mut packed = Vec::with_capacity(data.len() + (1 << 20));
    let mut restored = vec![0u8; data.len()];
    let (comp_s, decomp_s) = pool.install(|| -> Result<(f64, f64), Box<dyn std::error::Error + Send + Sync>> {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut comp = Vec::new();
        for _ in 0..repeat {
            packed.clear();
            let t = Instant::now();
            compress(&data, Format::Detect, &options, &mut packed, &mut |_| {})?;
            comp.push(t.elapsed().as_secs_f64());
        }
        let mut decomp = Vec::new();
        for _ in 0..repeat {
            let t = Instant::now();
            Container::open(&packed)?.decode_into(&mut restored)?;
            decomp.push(t.elapsed().as_secs_f64());
        }
        Ok((median(comp), median(decomp)))
    })?;
    println!(r#"{{"size": {}, "comp_s": {comp_s}, "decomp_s": {decomp_s}, "ok": {}}}"#, packed.len(), restored == data);
    Ok(())
}
