//! Criterion benches for each codec stage, `Throughput::Bytes` of original data.
//! Run: `cargo bench --bench codec`. Data: synthetic normally distributed weights (bf16 and f32)
//! and an XOR delta with few changed bits, generated in memory.

use ckpt::codec::chunk::{encode_chunks, Data, Reference, SkipState};
use ckpt::codec::container::{Container, ContainerWriter, FileKind};
use ckpt::codec::select::{predict, Options};
use ckpt::codec::{byte_group, encode_chunk, Grouping};
use ckpt::Dtype;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

fn normal_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * 0.02) as f32
        })
        .collect()
}

fn bf16_bytes(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect()
}

fn f32_bytes(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const MIB: usize = 1 << 20;

fn stages(c: &mut Criterion) {
    let weights = normal_f32(8 * MIB, 1);
    let bf16 = bf16_bytes(&weights);
    let f32b = f32_bytes(&weights[..4 * MIB]);
    let bf16_grouping = Grouping::for_dtype(Some(Dtype::Bf16));
    let f32_grouping = Grouping::for_dtype(Some(Dtype::F32));
    // A "next epoch": every weight nudged by a tiny relative step.
    let next: Vec<f32> =
        weights.iter().enumerate().map(|(i, w)| if i % 3 == 0 { w * (1.0 + 1e-3) } else { *w }).collect();
    let bf16_next = bf16_bytes(&next);

    let mut g = c.benchmark_group("byte_group");
    g.throughput(Throughput::Bytes(bf16.len() as u64));
    let mut grouped = vec![0u8; bf16.len()];
    g.bench_function("split_bf16", |b| b.iter(|| byte_group::split(&bf16, None, bf16_grouping, &mut grouped).unwrap()));
    g.bench_function("split_bf16_xor", |b| {
        b.iter(|| byte_group::split(&bf16_next, Some(&bf16), bf16_grouping, &mut grouped).unwrap())
    });
    let n = bf16.len() / 2;
    let mut out = vec![0u8; bf16.len()];
    g.bench_function("regroup_bf16", |b| {
        b.iter(|| byte_group::regroup(&[&grouped[..n], &grouped[n..]], None, bf16_grouping, &mut out).unwrap())
    });
    let mut grouped32 = vec![0u8; f32b.len()];
    g.throughput(Throughput::Bytes(f32b.len() as u64));
    g.bench_function("split_f32", |b| b.iter(|| byte_group::split(&f32b, None, f32_grouping, &mut grouped32).unwrap()));
    let n32 = f32b.len() / 4;
    let mut out32 = vec![0u8; f32b.len()];
    g.bench_function("regroup_f32", |b| {
        let groups: Vec<&[u8]> = grouped32.chunks(n32).collect();
        b.iter(|| byte_group::regroup(&groups, None, f32_grouping, &mut out32).unwrap())
    });
    // One chunk (256 KiB), as the decoder runs it: in cache.
    let chunk = 256 << 10;
    g.throughput(Throughput::Bytes(chunk as u64));
    g.bench_function("regroup_f32_256k", |b| {
        let groups: Vec<&[u8]> = grouped32[..chunk].chunks(chunk / 4).collect();
        b.iter(|| byte_group::regroup(&groups, None, f32_grouping, &mut out32[..chunk]).unwrap())
    });
    g.bench_function("split_f32_256k", |b| {
        b.iter(|| byte_group::split(&f32b[..chunk], None, f32_grouping, &mut grouped32[..chunk]).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("select");
    let exponent = &grouped[n..n + (128 << 10)];
    g.throughput(Throughput::Bytes(exponent.len() as u64));
    g.bench_function("predict_128k_exponent", |b| b.iter(|| predict(black_box(exponent), &Options::default())));
    g.finish();

    let mut g = c.benchmark_group("chunk_single_thread");
    g.sample_size(10);
    let opts = Options::default();
    let chunk = &bf16[..opts.chunk_size];
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("encode_bf16_256k", |b| {
        let mut payload = Vec::with_capacity(chunk.len());
        b.iter(|| {
            payload.clear();
            encode_chunk(Data::Bytes(chunk), None, bf16_grouping, &opts, &mut SkipState::default(), &mut payload)
                .unwrap()
        })
    });
    g.finish();

    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut g = c.benchmark_group("container");
    g.sample_size(10);
    for (name, data, dtype) in [("bf16", &bf16, Dtype::Bf16), ("f32", &f32b, Dtype::F32)] {
        g.throughput(Throughput::Bytes(data.len() as u64));
        let build = || {
            let mut w =
                ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, Options::default()).unwrap();
            w.segment(data, Some(dtype)).unwrap();
            w.finish().unwrap().0
        };
        g.bench_with_input(BenchmarkId::new("compress_1thread", name), data, |b, _| b.iter(|| pool.install(build)));
        let packed = build();
        g.bench_with_input(BenchmarkId::new("decompress_1thread", name), data, |b, _| {
            let mut out = Vec::with_capacity(data.len());
            b.iter(|| {
                out.clear();
                pool.install(|| Container::open(&packed).unwrap().decode_to(&mut out).unwrap())
            })
        });
    }
    g.throughput(Throughput::Bytes(bf16.len() as u64));
    g.bench_function("xor_delta_bf16_1thread", |b| {
        b.iter(|| {
            pool.install(|| {
                encode_chunks(
                    Data::Bytes(&bf16_next),
                    Some(Reference::Bytes(&bf16)),
                    bf16_grouping,
                    &Options::default(),
                )
                .unwrap()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
