//! Throughput of `codec::huffman` (huff0 via FFI) on bf16-like byte groups, with zstd levels 1
//! and 3 on the same data for comparison. 16 MiB per iteration, coded in 128 KiB calls.
//!
//! `cargo bench --bench huffman -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use ckpt::codec::huffman;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const TOTAL: usize = 16 << 20;
const CALL: usize = 128 << 10;

/// xorshift64* + Box-Muller: N(0, 0.02) weights as bf16, grouped by the codec
/// (`byte_group::split`): (exponent bytes, sign and mantissa bytes).
fn bf16_groups(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        ((state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) + 1) as f64 / (1u64 << 53) as f64
    };
    let elements: Vec<u8> = (0..n)
        .flat_map(|_| {
            let (u, v) = (unit(), unit());
            let x = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * 0.02;
            (((x as f32).to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect();
    let mut grouped = vec![0u8; elements.len()];
    let grouping = ckpt::codec::Grouping::for_dtype(Some(ckpt::dtype::Dtype::Bf16));
    ckpt::codec::byte_group::split(&elements, None, grouping, &mut grouped).expect("whole elements");
    let (mantissa, exponent) = grouped.split_at(n);
    (exponent.to_vec(), mantissa.to_vec())
}

/// Order-0 entropy in bytes.
fn entropy_bytes(data: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    data.iter().for_each(|&b| counts[b as usize] += 1);
    let n = data.len() as f64;
    counts.iter().filter(|&&c| c > 0).map(|&c| -(c as f64) * (c as f64 / n).log2()).sum::<f64>() / 8.0
}

/// Codes every call-sized chunk; `None` for chunks the coder declined (stored raw by callers).
fn huff_encode_all(data: &[u8]) -> Vec<Option<Vec<u8>>> {
    data.chunks(CALL)
        .map(|chunk| {
            let mut out = Vec::new();
            huffman::encode(chunk, &mut out).unwrap().then_some(out)
        })
        .collect()
}

fn stored_size(data: &[u8], coded: &[Option<Vec<u8>>]) -> usize {
    data.chunks(CALL).zip(coded).map(|(raw, c)| c.as_ref().map_or(raw.len(), Vec::len)).sum()
}

fn report(name: &str, data: &[u8], size: usize) {
    let h = entropy_bytes(data);
    eprintln!(
        "{name}: {} -> {size} bytes ({:.3} bits/byte), order-0 entropy {h:.0} bytes ({:.3} bits/byte), size/entropy {:.4}",
        data.len(),
        size as f64 * 8.0 / data.len() as f64,
        h * 8.0 / data.len() as f64,
        size as f64 / h,
    );
}

fn bench(c: &mut Criterion) {
    let (exponent, mantissa) = bf16_groups(TOTAL, 1);
    let mut out = Vec::with_capacity(CALL + 1024);
    let mut back = vec![0u8; CALL];

    for (name, data) in [("exponent", &exponent), ("mantissa", &mantissa)] {
        let coded = huff_encode_all(data);
        report(&format!("huffman {name}"), data, stored_size(data, &coded));
        let mut group = c.benchmark_group(format!("huffman/{name}"));
        group.throughput(Throughput::Bytes(data.len() as u64));
        group.bench_function("encode", |b| {
            b.iter(|| {
                for chunk in data.chunks(CALL) {
                    out.clear();
                    black_box(huffman::encode(black_box(chunk), &mut out).unwrap());
                }
            })
        });
        // Declined chunks are stored raw; decoding them is a copy the caller does.
        if coded.iter().any(Option::is_some) {
            group.bench_function("decode", |b| {
                b.iter(|| {
                    for (chunk, c) in data.chunks(CALL).zip(&coded) {
                        let back = &mut back[..chunk.len()];
                        match c {
                            Some(c) => huffman::decode(black_box(c), back).unwrap(),
                            None => back.copy_from_slice(chunk),
                        }
                        black_box(&back);
                    }
                })
            });
        } else {
            eprintln!("huffman {name}: every chunk declined, no decode benchmark");
        }
        group.finish();
    }

    for level in [1, 3] {
        let coded: Vec<Vec<u8>> = exponent.chunks(CALL).map(|c| zstd::bulk::compress(c, level).unwrap()).collect();
        report(&format!("zstd-{level} exponent"), &exponent, coded.iter().map(Vec::len).sum());
        let mut group = c.benchmark_group(format!("zstd{level}/exponent"));
        group.throughput(Throughput::Bytes(exponent.len() as u64));
        let mut cctx = zstd::bulk::Compressor::new(level).unwrap();
        let mut zout = vec![0u8; zstd::zstd_safe::compress_bound(CALL)];
        group.bench_function("encode", |b| {
            b.iter(|| {
                for chunk in exponent.chunks(CALL) {
                    black_box(cctx.compress_to_buffer(black_box(chunk), &mut zout[..]).unwrap());
                }
            })
        });
        let mut dctx = zstd::bulk::Decompressor::new().unwrap();
        group.bench_function("decode", |b| {
            b.iter(|| {
                for c in &coded {
                    black_box(dctx.decompress_to_buffer(black_box(&c[..]), &mut back[..]).unwrap());
                }
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
