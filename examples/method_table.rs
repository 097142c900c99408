//! Measures the automatic method choice against trying every method, on real files.
//!
//! For each FILE (standalone) and each consecutive pair OLD,NEW given with `--delta` (XOR of
//! tensors matched by name, dtype and shape), codes every tensor with the `Auto` selection,
//! `Exhaustive` (best of Huffman, zstd, raw per group), Huffman only and zstd only, and prints
//! the stored size (payload + 5 index bytes per group) as % of the original and the gap
//! auto vs exhaustive. Also prints single-thread coding time for auto and exhaustive.
//!
//! `cargo run --release --example method_table -- [--chunk-kib K] [--skip N] FILES... [--delta OLD NEW]...`

use ckpt::codec::chunk::{encode_chunks, Data, Reference};
use ckpt::codec::select::Selection;
use ckpt::codec::{Grouping, Method, Options};
use std::time::Instant;

struct Job {
    label: String,
    new: Vec<u8>,
    old: Option<Vec<u8>>,
}

fn code(job: &Job, options: &Options) -> Result<(u64, u64, f64), Box<dyn std::error::Error + Send + Sync>> {
    let header = ckpt::safetensors::parse(&job.new)?;
    let old_header = job.old.as_ref().map(|o| ckpt::safetensors::parse(o)).transpose()?;
    let mut original = header.data_start;
    let mut stored = header.data_start;
    let start = Instant::now();
    for t in &header.tensors {
        let data = &job.new[t.begin as usize..t.end as usize];
        let reference = match (&old_header, &job.old) {
            (Some(h), Some(old)) => h
                .tensors
                .iter()
                .find(|o| o.name == t.name && o.dtype == t.dtype && o.shape == t.shape)
                .map(|o| &old[o.begin as usize..o.end as usize]),
            _ => None,
        };
        let grouping = Grouping::for_dtype(Some(t.dtype));
        let chunks = encode_chunks(Data::Bytes(data), reference.map(Reference::Bytes), grouping, options)?;
        original += data.len() as u64;
        stored += chunks.iter().map(|c| c.payload.len() as u64 + 5 * grouping.width as u64).sum::<u64>();
    }
    Ok((original, stored, start.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut options = Options::default();
    let mut jobs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--chunk-kib" => options.chunk_size = args.next().ok_or("--chunk-kib K")?.parse::<usize>()? * 1024,
            "--skip" => options.skip_after_raw = args.next().ok_or("--skip N")?.parse()?,
            "--zero-frac" => options.zstd_zero_fraction = args.next().ok_or("--zero-frac F")?.parse()?,
            "--zero-run" => options.zstd_zero_run = args.next().ok_or("--zero-run F")?.parse()?,
            "--seq-cost" => options.zstd_sequence_cost = args.next().ok_or("--seq-cost B")?.parse()?,
            "--lit-penalty" => options.zstd_literal_penalty = args.next().ok_or("--lit-penalty F")?.parse()?,
            "--raw-frac" => options.raw_fraction = args.next().ok_or("--raw-frac F")?.parse()?,
            "--zstd-level" => options.zstd_level = args.next().ok_or("--zstd-level L")?.parse()?,
            "--delta" => {
                let old = args.next().ok_or("--delta OLD NEW")?;
                let new = args.next().ok_or("--delta OLD NEW")?;
                let name = |p: &str| {
                    std::path::Path::new(p).file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default()
                };
                jobs.push(Job {
                    label: format!("xor {} -> {}", name(&old), name(&new)),
                    new: std::fs::read(&new)?,
                    old: Some(std::fs::read(&old)?),
                });
            }
            path => jobs.push(Job {
                label: path.rsplit('/').next().unwrap_or(path).to_string(),
                new: std::fs::read(path)?,
                old: None,
            }),
        }
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    println!(
        "chunk {} KiB, skip-after-raw {}, zstd level {}",
        options.chunk_size / 1024,
        options.skip_after_raw,
        options.zstd_level
    );
    println!("| input | auto % | exhaustive % | auto vs best | huffman only % | zstd only % | auto s | exhaustive s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for job in &jobs {
        let run = |selection| pool.install(|| code(job, &Options { selection, ..options.clone() }));
        let (orig, auto, auto_s) = run(Selection::Auto)?;
        let (_, best, best_s) = run(Selection::Exhaustive)?;
        let (_, huff, _) = run(Selection::Only(Method::Huffman))?;
        let (_, zstd, _) = run(Selection::Only(Method::Zstd))?;
        let pct = |x: u64| 100.0 * x as f64 / orig as f64;
        if std::env::var_os("METHOD_TABLE_BYTES").is_some() {
            eprintln!("{}: auto {auto} exhaustive {best} huffman-only {huff} zstd-only {zstd} bytes", job.label);
        }
        println!(
            "| {} | {:.2} | {:.2} | {:+.2}% | {:.2} | {:.2} | {:.2} | {:.2} |",
            job.label,
            pct(auto),
            pct(best),
            100.0 * (auto as f64 / best as f64 - 1.0),
            pct(huff),
            pct(zstd),
            auto_s,
            best_s
        );
    }
    Ok(())
}
