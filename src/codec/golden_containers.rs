//! Compatibility: containers written by earlier formats, checked in under
//! `tests/fixtures/containers/v<N>/`, must keep decoding bit-exactly. Each fixture's input is
//! regenerated here from a fixed seed, and the decoded bytes are compared with it (the container's
//! own blake3 check runs as well).
//!
//! The fixtures were written by `write_golden_containers` (ignored; run it with
//! `CKPT_WRITE_GOLDEN=1 cargo test --lib golden_containers -- --ignored` only to add the fixtures
//! of a new format version into a new directory: the files of an older version never change).

use super::container::{Container, ContainerWriter, FileKind};
use super::select::{Level, Options, Selection};
use super::Method;
use crate::dtype::Dtype;
use crate::test_data::xorshift;

/// Float-like weights of `n` elements: roughly normal values of scale `scale`, as f32.
fn gaussian_f32(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = xorshift(seed);
    (0..n)
        .map(|_| {
            // Sum of four uniforms: close enough to a bell curve for realistic exponents.
            let u: f32 = (0..4).map(|_| (s.next().expect("endless") >> 40) as f32 / (1u64 << 24) as f32).sum();
            (u - 2.0) * scale
        })
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect()
}

/// A crude f16 (truncated, finite, no subnormals): only the byte statistics matter here.
fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| {
            let b = v.to_bits();
            let sign = ((b >> 16) & 0x8000) as u16;
            let exp = ((b >> 23) & 0xFF) as i32 - 127 + 15;
            let h = if exp <= 0 { sign } else { sign | ((exp.min(30) as u16) << 10) | ((b >> 13) & 0x3FF) as u16 };
            h.to_le_bytes()
        })
        .collect()
}

fn f64_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| f64::from(*v).to_le_bytes()).collect()
}

/// One golden container: its file name, the segments coded (bytes and dtype), optional
/// reference (for a delta container) and the options.
struct Golden {
    name: &'static str,
    segments: Vec<(Vec<u8>, Option<Dtype>)>,
    reference: Option<Vec<u8>>,
    options: Options,
}

impl Golden {
    fn original(&self) -> Vec<u8> {
        self.segments.iter().flat_map(|(b, _)| b.iter().copied()).collect()
    }
}

/// Segments of several dtypes: text, bf16, f32 (two scales), f16, f64, i32 counters, a zero
/// region and a mostly-zero region, so that automatic selection meets every method.
fn mixed_segments(seed: u64) -> Vec<(Vec<u8>, Option<Dtype>)> {
    let mut text = Vec::new();
    for i in 0..150 {
        text.extend_from_slice(
            format!("{{\"layer.{i}.weight\":{{\"dtype\":\"BF16\",\"shape\":[64,64]}}}},").as_bytes(),
        );
    }
    let mut mostly_zero = vec![0u8; 8192];
    for (i, s) in xorshift(seed ^ 9).take(120).enumerate() {
        mostly_zero[(s as usize) % 8192] = (i as u8) | 1;
    }
    let counters: Vec<u8> = (0..1500i32).flat_map(|i| (i * 3).to_le_bytes()).collect();
    vec![
        (text, None),
        (bf16_bytes(&gaussian_f32(seed, 4000, 0.05)), Some(Dtype::Bf16)),
        (f32_bytes(&gaussian_f32(seed + 1, 2500, 0.02)), Some(Dtype::F32)),
        (f16_bytes(&gaussian_f32(seed + 2, 2000, 0.1)), Some(Dtype::F16)),
        (f64_bytes(&gaussian_f32(seed + 3, 800, 1.0)), Some(Dtype::F64)),
        (counters, Some(Dtype::I32)),
        (vec![0u8; 4096], Some(Dtype::Bf16)),
        (mostly_zero, Some(Dtype::U8)),
        (xorshift(seed + 4).take(2000).map(|s| s as u8).collect(), None),
    ]
}

/// The fixtures of format `version`: one fixture forcing each of its methods, automatic choice,
/// a delta, from format 5 the max level (rANS context sources), standalone and as a delta, and
/// from format 6 float tensors whose top two groups the default level codes as pairs.
fn goldens(version: u16) -> Vec<Golden> {
    let methods = methods_of(version);
    let options = |selection| Options { chunk_size: 4096, selection, ..Options::default() };
    let mut all = vec![Golden {
        name: "auto_mixed.ckz",
        segments: mixed_segments(1),
        reference: None,
        options: options(Selection::Auto),
    }];
    for &method in methods {
        all.push(Golden {
            name: leak(format!("only_{}.ckz", method.name())),
            segments: mixed_segments(2 + method as u64),
            reference: None,
            options: options(Selection::Only(method)),
        });
    }
    // A delta: the next "epoch" of f32 and bf16 weights, a few values changed a little.
    let base = gaussian_f32(20, 3000, 0.03);
    let next: Vec<f32> = base
        .iter()
        .zip(xorshift(21))
        .map(|(v, s)| if s % 5 == 0 { v + ((s >> 32) as f32 / u32::MAX as f32 - 0.5) * 1e-4 } else { *v })
        .collect();
    let bf16_next: Vec<f32> = base.iter().zip(xorshift(22)).map(|(v, s)| if s % 40 == 0 { -v } else { *v }).collect();
    let reference = [f32_bytes(&base), bf16_bytes(&base)].concat();
    all.push(Golden {
        name: "delta_auto.ckz",
        segments: vec![(f32_bytes(&next), Some(Dtype::F32)), (bf16_bytes(&bf16_next), Some(Dtype::Bf16))],
        reference: Some(reference.clone()),
        options: options(Selection::Auto),
    });
    if version >= 5 {
        // Chunks large enough for context models to pay for their tables.
        let max = Options { chunk_size: 64 << 10, level: Level::Max, ..Options::default() };
        let floats = gaussian_f32(30, 40_000, 0.04);
        all.push(Golden {
            name: "max_floats.ckz",
            segments: vec![(bf16_bytes(&floats), Some(Dtype::Bf16)), (f32_bytes(&floats), Some(Dtype::F32))],
            reference: None,
            options: max.clone(),
        });
        let moved: Vec<f32> = floats
            .iter()
            .zip(xorshift(31))
            .map(|(v, s)| v + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2e-3)
            .collect();
        all.push(Golden {
            name: "max_delta.ckz",
            segments: vec![(bf16_bytes(&moved), Some(Dtype::Bf16)), (f32_bytes(&moved), Some(Dtype::F32))],
            reference: Some([bf16_bytes(&floats), f32_bytes(&floats)].concat()),
            options: max,
        });
    }
    if version >= 6 {
        // Chunks of float weights large enough for a pair's head to pay, and some whose exponent
        // group holds more values than k = 3 allows and not as one range (a zero block and
        // tiny weights among the others).
        let options = Options { chunk_size: 64 << 10, ..Options::default() };
        let mut floats = gaussian_f32(40, 60_000, 0.04);
        floats[20_000..20_200].fill(0.0);
        for (j, v) in floats[30_000..30_100].iter_mut().enumerate() {
            *v *= (-(j as f32 % 45.0) - 10.0).exp2();
        }
        all.push(Golden {
            name: "paired_floats.ckz",
            segments: vec![(bf16_bytes(&floats), Some(Dtype::Bf16)), (f32_bytes(&floats), Some(Dtype::F32))],
            reference: None,
            options,
        });
    }
    if version >= 7 {
        // Quantized weights in float containers (issue 43): 4-bit groups of 128 with a zero
        // point in bf16, 8-bit groups of 64 in f32 and in f16, a few values off the grid.
        use super::grid::tests::{int_tensor, to_bytes, Dequant};
        let options = Options { chunk_size: 32 << 10, ..Options::default() };
        let mut int4 = int_tensor(50, (32, 512, 128), 4, true, Dtype::Bf16, Dequant::F32ThenCast);
        int4[1000] ^= 3;
        let int8 = int_tensor(51, (16, 512, 64), 8, false, Dtype::F32, Dequant::Exact);
        let half = int_tensor(52, (16, 512, 64), 8, false, Dtype::F16, Dequant::Exact);
        // 2:4-pruned bf16 weights: masked chunks.
        let mut pruned = gaussian_f32(53, 16_384, 0.04);
        for (i, v) in pruned.iter_mut().enumerate() {
            if (i / 4 + i) % 4 < 2 {
                *v = 0.0;
            }
        }
        all.push(Golden {
            name: "grid_floats.ckz",
            segments: vec![
                (to_bytes(&int4, Dtype::Bf16), Some(Dtype::Bf16)),
                (to_bytes(&int8, Dtype::F32), Some(Dtype::F32)),
                (to_bytes(&half, Dtype::F16), Some(Dtype::F16)),
                (bf16_bytes(&pruned), Some(Dtype::Bf16)),
            ],
            reference: None,
            options,
        });
    }
    all
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Methods of each format version.
const FORMAT_3_METHODS: [Method; 5] = [Method::Raw, Method::Zero, Method::Huffman, Method::Zstd, Method::Sparse];

/// Methods of format 4: those of format 3 and rANS.
const FORMAT_4_METHODS: [Method; 6] =
    [Method::Raw, Method::Zero, Method::Huffman, Method::Zstd, Method::Sparse, Method::Rans];

/// Methods of format 6 forced one by one: those of format 4 and pairs (`Only(Paired)` codes the
/// top two groups of float segments as pairs and stores the other groups raw).
const FORMAT_6_METHODS: [Method; 7] =
    [Method::Raw, Method::Zero, Method::Huffman, Method::Zstd, Method::Sparse, Method::Rans, Method::Paired];

fn methods_of(version: u16) -> &'static [Method] {
    match version {
        3 => &FORMAT_3_METHODS,
        4 | 5 => &FORMAT_4_METHODS,
        _ => &FORMAT_6_METHODS,
    }
}

fn write(golden: &Golden) -> Vec<u8> {
    let original = golden.original();
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, original.len() as u64, golden.options.clone())
        .expect("writer");
    let mut at = 0;
    for (bytes, dtype) in &golden.segments {
        let reference = golden.reference.as_ref().map(|r| &r[at..at + bytes.len()]);
        w.segment_delta(bytes, reference, *dtype).expect("segment");
        at += bytes.len();
    }
    w.finish().expect("finish").0
}

fn fixture_dir(version: u16) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/containers/v{version}"))
}

/// Writes the fixtures of the current format version (never over existing ones).
#[test]
#[ignore = "writes fixtures; run by hand when the format version is bumped"]
fn write_golden_containers() {
    if std::env::var_os("CKPT_WRITE_GOLDEN").is_none() {
        return;
    }
    let dir = fixture_dir(super::container::FORMAT_VERSION);
    std::fs::create_dir_all(&dir).unwrap();
    for golden in goldens(super::container::FORMAT_VERSION) {
        let path = dir.join(golden.name);
        assert!(!path.exists(), "{} exists: fixtures of a released format never change", path.display());
        std::fs::write(&path, write(&golden)).unwrap();
    }
}

/// Decodes every fixture of `version` and checks it against its regenerated input; returns the
/// methods met, so callers can check the fixtures cover them.
fn check_fixtures(version: u16) -> std::collections::BTreeSet<Method> {
    let dir = fixture_dir(version);
    let mut methods = std::collections::BTreeSet::new();
    for golden in goldens(version) {
        let path = dir.join(golden.name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), version, "{}", golden.name);
        let container = Container::open(&bytes).unwrap_or_else(|e| panic!("{}: {e}", golden.name));
        for i in 0..container.chunk_count() {
            methods.extend(container.chunk(i).2.groups().iter().map(|g| g.method));
        }
        let mut out = Vec::new();
        container.decode_to_with_reference(golden.reference.as_deref(), &mut out).unwrap();
        assert!(out == golden.original(), "{} decodes to other bytes", golden.name);
    }
    methods
}

/// Format 3 containers (Raw, Zero, Huffman, Zstd and Sparse groups; several dtypes; a delta)
/// still decode bit-exactly.
#[test]
fn format_3_containers_still_decode() {
    let methods = check_fixtures(3);
    assert!(FORMAT_3_METHODS.iter().all(|m| methods.contains(m)), "fixtures cover {methods:?}");
}

/// Format 4 containers (format 3's methods and rANS) still decode bit-exactly.
#[test]
fn format_4_containers_still_decode() {
    let methods = check_fixtures(4);
    assert!(FORMAT_4_METHODS.iter().all(|m| methods.contains(m)), "fixtures cover {methods:?}");
}

/// Format 5 containers (rANS with context sources and binned tables, written at the max level,
/// standalone and as a delta) decode bit-exactly, and the max-level fixtures do use every kind
/// of source: a higher group of the same element, and the reference's bytes.
#[test]
fn format_5_containers_still_decode() {
    let methods = check_fixtures(5);
    assert!(FORMAT_4_METHODS.iter().all(|m| methods.contains(m)), "fixtures cover {methods:?}");
    let mut sources = std::collections::BTreeSet::new();
    for name in ["max_floats.ckz", "max_delta.ckz"] {
        let bytes = std::fs::read(fixture_dir(5).join(name)).unwrap();
        let container = Container::open(&bytes).unwrap();
        for i in 0..container.chunk_count() {
            for (entry, stored) in container.chunk_groups(i).unwrap() {
                if entry.method == Method::Rans {
                    sources.extend(super::rans::payload_source(stored).map(|s| format!("{s:?}")));
                }
            }
        }
    }
    assert!(sources.iter().any(|s| s.starts_with("Group")), "{sources:?}");
    assert!(sources.iter().any(|s| s.starts_with("Reference")), "{sources:?}");
}

/// Format 6 containers (pairs of groups, forced and chosen automatically) decode bit-exactly,
/// and the automatic fixture pairs with more than one `k`, with value sets that are one range
/// and that are not.
#[test]
fn format_6_containers_still_decode() {
    let methods = check_fixtures(6);
    assert!(FORMAT_6_METHODS.iter().all(|m| methods.contains(m)), "fixtures cover {methods:?}");
    assert!(methods.contains(&Method::Remainder), "fixtures cover {methods:?}");
    let bytes = std::fs::read(fixture_dir(6).join("paired_floats.ckz")).unwrap();
    let container = Container::open(&bytes).unwrap();
    let (mut ks, mut ranges) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for i in 0..container.chunk_count() {
        for (entry, stored) in container.chunk_groups(i).unwrap() {
            if entry.method == Method::Paired {
                ks.insert(stored[0]);
                // Whether the value set is one range (decoded without a table) or not.
                let bits = u128::from_le_bytes(stored[1..17].try_into().unwrap());
                let high = u128::from_le_bytes(stored[17..33].try_into().unwrap());
                let count = bits.count_ones() + high.count_ones();
                let first = if bits != 0 { bits.trailing_zeros() } else { 128 + high.trailing_zeros() };
                let last = if high != 0 { 255 - high.leading_zeros() } else { 127 - bits.leading_zeros() };
                ranges.insert(last - first + 1 == count);
            }
        }
    }
    assert!(ks.len() >= 2, "k values {ks:?}");
    assert_eq!(ranges.len(), 2, "value sets as ranges and not");
}

/// Format 7 containers (grids: 4-bit with a zero point in bf16, 8-bit in f32 and f16; masks of
/// pruned bf16) decode bit-exactly, the gridded segments stored as grids, and older methods still.
#[test]
fn format_7_containers_still_decode() {
    let methods = check_fixtures(7);
    assert!(FORMAT_6_METHODS.iter().all(|m| methods.contains(m)), "fixtures cover {methods:?}");
    for m in [Method::Grid, Method::Within, Method::Masked] {
        assert!(methods.contains(&m), "fixtures cover {methods:?}");
    }
    let bytes = std::fs::read(fixture_dir(7).join("grid_floats.ckz")).unwrap();
    let container = Container::open(&bytes).unwrap();
    for segment in &container.segments()[..3] {
        let gridded = segment.chunks.clone().filter(|&i| container.grid_payload(i).unwrap().is_some()).count();
        assert_eq!(gridded, segment.chunks.len(), "{:?}", segment.dtype);
    }
}
