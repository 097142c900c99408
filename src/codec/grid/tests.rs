use super::fit::{detect, fit_chunk, fit_tensor, GridPlan};
use super::*;
use crate::codec::container::{Container, ContainerWriter, FileKind, SegmentInput};
use crate::codec::cross_precision::{f32_to_bf16, f32_to_f16, Rounding};
use crate::codec::select::Level;
use crate::test_data::xorshift;
use proptest::prelude::*;

/// How a test quantizer produced its values (the arithmetic a real dequantizer uses).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dequant {
    /// `(q − z) × s` in f32, then cast: [`Arithmetic::ProductF32`].
    F32ThenCast,
    /// The exact product rounded once (f64 here, an independent implementation).
    Exact,
}

/// Rounds the exact `x` to `dtype` once: through f64 → f32 round-to-odd written out separately
/// from the codec's, so the test does not check the codec against itself.
fn round_once(x: f64, dtype: Dtype) -> u32 {
    if dtype == Dtype::F32 {
        return (x as f32).to_bits();
    }
    // Exact midpoints are rare but exist: decide them on f64 directly.
    let keep = if dtype == Dtype::Bf16 { 8 } else { 11 };
    let (m, e) = frexp(x);
    let scaled = m * f64::from(1u32 << keep);
    let floor = scaled.floor();
    let frac = scaled - floor;
    let mut r = floor;
    if frac > 0.5 || (frac == 0.5 && (floor as i64) % 2 != 0) {
        r += 1.0;
    }
    let y = r / f64::from(1u32 << keep) * 2f64.powi(e);
    // Subnormals and overflow are left to the plain conversions (tests keep values normal).
    match dtype {
        Dtype::Bf16 => u32::from(f32_to_bf16((y as f32).to_bits(), Rounding::NearestEven)),
        _ => u32::from(f32_to_f16((y as f32).to_bits(), Rounding::NearestEven)),
    }
}

fn frexp(x: f64) -> (f64, i32) {
    if x == 0.0 {
        return (0.0, 0);
    }
    let e = x.abs().log2().floor() as i32 + 1;
    let m = x / 2f64.powi(e);
    if m.abs() >= 1.0 {
        (m / 2.0, e + 1)
    } else if m.abs() < 0.5 {
        (m * 2.0, e - 1)
    } else {
        (m, e)
    }
}

/// One dequantized value: code value `q` times `scale`.
pub(crate) fn dequant(q: f32, scale: f32, dtype: Dtype, how: Dequant) -> u32 {
    match (how, dtype) {
        (_, Dtype::F32) => (q * scale).to_bits(),
        (Dequant::F32ThenCast, Dtype::Bf16) => u32::from(f32_to_bf16((q * scale).to_bits(), Rounding::NearestEven)),
        (Dequant::F32ThenCast, _) => u32::from(f32_to_f16((q * scale).to_bits(), Rounding::NearestEven)),
        (Dequant::Exact, d) => round_once(f64::from(q) * f64::from(scale), d),
    }
}

pub(crate) fn to_bytes(bits: &[u32], dtype: Dtype) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()[..dtype.size()].to_vec()).collect()
}

/// A quantized tensor of `rows × cols` normal-ish weights: `bits`-bit integer codes (symmetric
/// absmax, or min/max with a zero point) with one f32 scale per group of `k` along each row,
/// dequantized into `dtype`.
pub(crate) fn int_tensor(
    seed: u64,
    (rows, cols, k): (usize, usize, usize),
    bits: u32,
    zero_point: bool,
    dtype: Dtype,
    how: Dequant,
) -> Vec<u32> {
    let mut rng = xorshift(seed);
    let mut gauss = || -> f32 {
        let u: f32 = (0..4).map(|_| (rng.next().expect("endless") >> 40) as f32 / (1u64 << 24) as f32).sum();
        (u - 2.0) * 0.05
    };
    let w: Vec<f32> = (0..rows * cols).map(|_| gauss()).collect();
    let mut out = vec![0u32; rows * cols];
    for r in 0..rows {
        for g0 in (0..cols).step_by(k) {
            let idx: Vec<usize> = (g0..(g0 + k).min(cols)).map(|c| r * cols + c).collect();
            let (lo, hi) = idx.iter().fold((f32::MAX, f32::MIN), |(a, b), &i| (a.min(w[i]), b.max(w[i])));
            if zero_point {
                let levels = ((1u32 << bits) - 1) as f32;
                let s = (hi - lo) / levels;
                let z = (-lo / s).round();
                for &i in &idx {
                    let c = ((w[i] / s).round() + z).clamp(0.0, levels);
                    out[i] = dequant(c - z, s, dtype, how);
                }
            } else {
                let qmax = ((1u32 << (bits - 1)) - 1) as f32;
                let s = lo.abs().max(hi.abs()) / qmax;
                for &i in &idx {
                    out[i] = dequant((w[i] / s).round().clamp(-qmax, qmax), s, dtype, how);
                }
            }
        }
    }
    out
}

/// Round trip of a one-segment container of `bits` (a tensor in rows of `row_len`); returns the
/// number of chunks stored as grids.
fn round_trip(bits: &[u32], dtype: Dtype, row_len: Option<u64>, level: Level) -> usize {
    let data = to_bytes(bits, dtype);
    let options = Options { chunk_size: 16 << 10, level, ..Options::default() };
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
    let input = SegmentInput { data: Data::Bytes(&data), dtype: Some(dtype), reference: None, link: None, row_len };
    w.segment_inputs(&[input], &mut |_| {}).unwrap();
    let (container, _) = w.finish().unwrap();
    let c = Container::open(&container).unwrap();
    let mut out = Vec::new();
    c.decode_to(&mut out).unwrap();
    assert!(out == data, "decoded bytes differ");
    // Range decodes and grouped decodes (chains) see the same bytes.
    let mut part = vec![0u8; data.len() / 3];
    c.decode_range(7 * dtype.size() as u64..(7 * dtype.size() + part.len()) as u64, &mut part).unwrap();
    assert!(part[..] == data[7 * dtype.size()..7 * dtype.size() + part.len()]);
    (0..c.chunk_count()).filter(|&i| c.chunk(i).2.groups().last().unwrap().method == Method::Grid).count()
}

#[test]
fn int4_groups_with_a_zero_point_are_found_and_round_trip() {
    for dtype in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
        let bits = int_tensor(1, (64, 512, 128), 4, true, dtype, Dequant::F32ThenCast);
        let plan = detect(&to_bytes(&bits, dtype), dtype, Some(512)).expect("a grid");
        assert_eq!((plan.bits, plan.zero_point, plan.layout.k_col), (4, true, 128), "{dtype:?} {plan:?}");
        assert!(round_trip(&bits, dtype, Some(512), Level::Default) > 0, "{dtype:?}");
    }
}

#[test]
fn int8_rows_and_whole_tensors_are_found() {
    for dtype in [Dtype::Bf16, Dtype::F32] {
        let bits = int_tensor(2, (64, 1024, 1024), 8, false, dtype, Dequant::F32ThenCast);
        let plan = detect(&to_bytes(&bits, dtype), dtype, Some(1024)).expect("a grid");
        assert_eq!((plan.bits, plan.zero_point), (8, false), "{dtype:?} {plan:?}");
        assert_eq!(plan.layout.k_col, 1024, "{plan:?}");
        assert!(round_trip(&bits, dtype, Some(1024), Level::Max) > 0);
    }
    // 8 bits with a zero point need a per-group offset.
    let bits = int_tensor(3, (32, 512, 128), 8, true, Dtype::F32, Dequant::Exact);
    let plan = detect(&to_bytes(&bits, Dtype::F32), Dtype::F32, Some(512)).expect("a grid");
    assert_eq!(plan.codes, Codes::Offset, "{plan:?}");
    assert!(round_trip(&bits, Dtype::F32, Some(512), Level::Default) > 0);
}

/// Groups whose scale makes code ±3 land next to a bf16 tie: the f32 product rounds onto the
/// tie and then to even, the exact product rounds by the side it lies on, so the two
/// arithmetics disagree on about half of those elements.
fn near_ties(how: Dequant) -> Vec<u32> {
    let codes = [3.0f32, -3.0, 7.0, -7.0, 1.0, 2.0, -5.0, 3.0, 3.0, -3.0, 0.0, 6.0];
    let mut out = Vec::new();
    for (g, r) in xorshift(9).take(64).enumerate() {
        let a = 0x3C00u32 + (r % 0x300) as u32; // a bf16 between 2^-7 and 2^-1
        let mid = (f64::from(f32::from_bits(a << 16)) + f64::from(f32::from_bits((a + 1) << 16))) / 2.0;
        let s = (mid / 3.0) as f32;
        out.extend((0..256).map(|j| dequant(codes[(j + g) % codes.len()], s, Dtype::Bf16, how)));
    }
    out
}

#[test]
fn a_grid_that_fits_only_one_rounding_is_found_with_it() {
    // With the generator's scales the two arithmetics disagree on the near-tie elements; the
    // encoder finds a grid (an arithmetic and scales) that reproduces every value anyway.
    for how in [Dequant::F32ThenCast, Dequant::Exact] {
        let bits = near_ties(how);
        let data = to_bytes(&bits, Dtype::Bf16);
        let disagree = xorshift(9)
            .take(64)
            .filter(|r| {
                let a = 0x3C00u32 + (r % 0x300) as u32;
                let mid = (f64::from(f32::from_bits(a << 16)) + f64::from(f32::from_bits((a + 1) << 16))) / 2.0;
                let s = (mid / 3.0) as f32;
                element_bits(3.0, s, Dtype::Bf16, Arithmetic::ProductF32)
                    != element_bits(3.0, s, Dtype::Bf16, Arithmetic::ProductExact)
            })
            .count();
        assert!(disagree > 10, "{disagree} groups where the roundings differ");
        let plan = detect(&data, Dtype::Bf16, Some(256)).expect("a grid");
        let chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data).unwrap();
        assert!(chunk.escapes.len() * 50 < bits.len(), "{how:?}: {plan:?}, {} escapes", chunk.escapes.len());
        assert!(round_trip(&bits, Dtype::Bf16, Some(256), Level::Default) > 0);
    }
}

/// DeepSeek-V3 style: e4m3 codes, one f32 scale per 128×128 block, dequantized in f32 to bf16.
pub(crate) fn fp8_blocks(seed: u64, rows: usize, cols: usize) -> Vec<u32> {
    let mut rng = xorshift(seed);
    // Each 128×128 block at its own magnitude, so that block scales differ.
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let block = (i / cols / 128) * cols.div_ceil(128) + (i % cols) / 128;
            let magnitude = 0.02 + 0.1 * ((block * 37 % 11) as f32 / 11.0);
            ((rng.next().unwrap() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * magnitude
        })
        .collect();
    let table: Vec<(f32, u8)> = (0..=255u8).filter_map(|c| fp8_value(c, 4).map(|v| (v, c))).collect();
    let nearest = |x: f32| table.iter().min_by(|a, b| (a.0 - x).abs().total_cmp(&(b.0 - x).abs())).unwrap().0;
    let mut out = vec![0u32; rows * cols];
    for br in (0..rows).step_by(128) {
        for bc in (0..cols).step_by(128) {
            let cells =
                || (br..(br + 128).min(rows)).flat_map(move |r| (bc..(bc + 128).min(cols)).map(move |c| r * cols + c));
            let amax = cells().fold(0f32, |a, i| a.max(w[i].abs()));
            let s = amax / 448.0;
            for i in cells() {
                out[i] = dequant(nearest(w[i] / s), s, Dtype::Bf16, Dequant::F32ThenCast);
            }
        }
    }
    out
}

#[test]
fn fp8_blocks_are_found_and_round_trip() {
    let bits = fp8_blocks(5, 256, 384);
    let plan = detect(&to_bytes(&bits, Dtype::Bf16), Dtype::Bf16, Some(384)).expect("a grid");
    assert_eq!(plan.codes, Codes::Fp8E4m3, "{plan:?}");
    assert_eq!((plan.layout.k_col, plan.layout.k_row), (128, 128), "{plan:?}");
    assert!(round_trip(&bits, Dtype::Bf16, Some(384), Level::Max) > 0);
}

#[test]
#[ignore = "prints what a detection sees; for debugging"]
fn debug_detection() {
    let bits = int_tensor(1, (64, 512, 128), 4, true, Dtype::Bf16, Dequant::F32ThenCast);
    let data = to_bytes(&bits, Dtype::Bf16);
    let plan = GridPlan {
        dtype: Dtype::Bf16,
        layout: Layout { cols: 512, k_col: 128, k_row: 1 },
        arithmetic: Arithmetic::ProductF32,
        codes: Codes::SignedZero,
        bits: 4,
        zero_point: true,
    };
    let grid = fit_tensor(&data, &plan);
    let chunk = fit_chunk(&grid, 0, &data[..8192]).unwrap();
    eprintln!("scales {:?}", &chunk.scales[..4]);
    for &(p, b) in chunk.escapes.iter().take(10) {
        eprintln!("escape at {p}: {b:#06x} = {}", super::fit::value_of(b, Dtype::Bf16));
    }
    eprintln!("{} escapes; detect: {:?}", chunk.escapes.len(), detect(&data, Dtype::Bf16, Some(512)));
    let bits = int_tensor(8, (32, 512, 128), 4, true, Dtype::Bf16, Dequant::F32ThenCast);
    eprintln!("describe: {:?}", detect(&to_bytes(&bits, Dtype::Bf16), Dtype::Bf16, Some(512)));
    let bits = fp8_blocks(5, 256, 384);
    eprintln!("fp8: {:?}", detect(&to_bytes(&bits, Dtype::Bf16), Dtype::Bf16, Some(384)));
    let bits = int_tensor(4, (64, 1024, 1024), 8, false, Dtype::Bf16, Dequant::F32ThenCast);
    let data = to_bytes(&bits[..8192], Dtype::Bf16);
    let plan = GridPlan { layout: Layout { cols: 1024, k_col: 1024, k_row: 1 }, bits: 8, zero_point: false, ..plan };
    let chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data).unwrap();
    eprintln!("int8 rows: {} escapes, scales {:?}", chunk.escapes.len(), &chunk.scales[..4]);
    for &(p, b) in chunk.escapes.iter().take(10) {
        eprintln!("escape at {p}: {b:#06x} = {}", super::fit::value_of(b, Dtype::Bf16));
    }
}

/// Writes the fuzz seeds of `grid_decode` (as fuzz/src/bin/make_seeds.rs does) into
/// fuzz/corpus/grid_decode: `CKPT_WRITE_SEEDS=1 cargo test --lib write_grid_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes fuzz seeds"]
fn write_grid_fuzz_seeds() {
    if std::env::var_os("CKPT_WRITE_SEEDS").is_none() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/grid_decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (dtype, k, qmax, name, choice) in
        [(Dtype::Bf16, 64usize, 7i32, "int4-bf16", 0u8), (Dtype::F32, 256, 127, "int8-f32", 1)]
    {
        let n = 4096usize;
        let mut bits: Vec<u32> = (0..n)
            .map(|i| {
                let scale = 1e-3 * (1.0 + (i / k) as f32 * 0.37);
                let q = ((i * 7919) % (2 * qmax as usize + 1)) as i32 - qmax;
                element_bits(q as f32, scale, dtype, Arithmetic::ProductF32)
            })
            .collect();
        bits[100] ^= 1;
        let data = to_bytes(&bits, dtype);
        let plan = detect(&data, dtype, Some(k as u64)).expect("a grid");
        let payload = encode(&fit_tensor(&data, &plan), 0, &data, &Options::default()).unwrap().unwrap();
        let mut seed = vec![choice];
        seed.extend_from_slice(&(n as u16).to_le_bytes());
        seed.extend_from_slice(&payload);
        std::fs::write(dir.join(format!("{name}.grid")), seed).unwrap();
    }
}

#[test]
fn dense_weights_have_no_grid() {
    let mut rng = xorshift(6);
    let bits: Vec<u32> = (0..1 << 16)
        .map(|_| {
            let v = ((rng.next().unwrap() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            u32::from(f32_to_bf16(v.to_bits(), Rounding::NearestEven))
        })
        .collect();
    assert_eq!(detect(&to_bytes(&bits, Dtype::Bf16), Dtype::Bf16, Some(256)), None);
}

#[test]
fn codes_at_the_ends_of_their_range_round_trip() {
    // Every group holds the extreme codes: −128 and 127 (signed), 0 and 255 (offset), ±448 (fp8).
    let scale = 0.001f32;
    let signed: Vec<u32> =
        (0..8192).map(|i| dequant([-128.0, 127.0, 0.0, 5.0][i % 4], scale, Dtype::F32, Dequant::Exact)).collect();
    round_trip(&signed, Dtype::F32, Some(128), Level::Default);
    let fp8: Vec<u32> = (0..8192)
        .map(|i| dequant([448.0, -448.0, 0.015625, 1.0][i % 4], scale, Dtype::Bf16, Dequant::F32ThenCast))
        .collect();
    round_trip(&fp8, Dtype::Bf16, Some(256), Level::Default);
    let plan = GridPlan {
        dtype: Dtype::F32,
        layout: Layout { cols: 128, k_col: 128, k_row: 1 },
        arithmetic: Arithmetic::ProductExact,
        codes: Codes::Offset,
        bits: 8,
        zero_point: true,
    };
    let offset: Vec<u32> =
        (0..8192).map(|i| dequant([0.0, 255.0, 17.0][i % 3] - 3.0, scale, Dtype::F32, Dequant::Exact)).collect();
    let data = to_bytes(&offset, Dtype::F32);
    let chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data).unwrap();
    assert!(chunk.escapes.is_empty(), "{} escapes", chunk.escapes.len());
    let mut payload = Vec::new();
    encode_payload(&chunk, &Options::default(), &mut payload).unwrap();
    let mut out = vec![0u8; data.len()];
    decode(&payload, 4, &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn special_scales_and_values_round_trip() {
    // Groups whose scale is zero, subnormal, infinite or NaN (values 0, tiny, inf, NaN).
    let mut bits = int_tensor(7, (16, 1024, 128), 4, true, Dtype::Bf16, Dequant::F32ThenCast);
    let specials = [0.0f32, f32::from_bits(3), f32::INFINITY, f32::NAN, -0.0];
    for (g, s) in specials.iter().enumerate() {
        for (j, b) in bits[g * 128..(g + 1) * 128].iter_mut().enumerate() {
            *b = dequant((j % 15) as f32 - 7.0, *s, Dtype::Bf16, Dequant::F32ThenCast);
        }
    }
    round_trip(&bits, Dtype::Bf16, Some(1024), Level::Default);
    // A decoder given a non-finite scale refuses it.
    let plan = detect(&to_bytes(&bits, Dtype::Bf16), Dtype::Bf16, Some(1024)).expect("still a grid");
    let data = to_bytes(&bits, Dtype::Bf16);
    let mut chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data[..4096]).unwrap();
    chunk.scales[0] = f32::NAN;
    let mut payload = Vec::new();
    encode_payload(&chunk, &Options::default(), &mut payload).unwrap();
    let err = decode(&payload, 2, &mut vec![0u8; 4096]).unwrap_err();
    assert!(err.to_string().contains("a scale of NaN"), "{err}");
}

#[test]
fn payload_and_stats_describe_the_grid() {
    let bits = int_tensor(8, (32, 512, 128), 4, true, Dtype::Bf16, Dequant::F32ThenCast);
    let data = to_bytes(&bits, Dtype::Bf16);
    let plan = detect(&data, Dtype::Bf16, Some(512)).unwrap();
    let chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data[..8192]).unwrap();
    let mut payload = Vec::new();
    encode_payload(&chunk, &Options::default(), &mut payload).unwrap();
    let info = info(&payload, 2, 4096).unwrap();
    assert_eq!(info.describe(32 * 512), "int4, group 128, zero point");
    assert_eq!(info.escapes, 0);
}

fn mutate(payload: &[u8], seed: u64) -> Vec<u8> {
    let mut p = payload.to_vec();
    let mut rng = xorshift(seed);
    for _ in 0..1 + seed % 4 {
        let r = rng.next().unwrap();
        let at = (r as usize) % p.len().max(1);
        if let Some(b) = p.get_mut(at) {
            *b ^= (r >> 32) as u8 | 1;
        }
    }
    if seed.is_multiple_of(5) {
        p.truncate((seed as usize).wrapping_mul(7) % (p.len() + 1));
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Grids of every kind round-trip bit-exactly, with a few values off the grid.
    #[test]
    fn gridded_tensors_round_trip(
        seed in any::<u64>(),
        dtype in prop::sample::select(vec![Dtype::Bf16, Dtype::F16, Dtype::F32]),
        bits in 2u32..=8,
        zero_point in any::<bool>(),
        k in prop::sample::select(vec![32usize, 64, 128, 256]),
        exact in any::<bool>(),
        off_grid in 0usize..20,
    ) {
        let how = if exact { Dequant::Exact } else { Dequant::F32ThenCast };
        let mut values = int_tensor(seed, (16, 256, k), bits, zero_point, dtype, how);
        for (j, r) in xorshift(seed ^ 1).take(off_grid).enumerate() {
            let i = r as usize % values.len();
            values[i] ^= 1 << (j % 7);
        }
        round_trip(&values, dtype, Some(256), Level::Default);
    }

    /// A tensor that merely looks gridded (a sample of its values on a grid, the rest not)
    /// round-trips whatever the detector makes of it.
    #[test]
    fn tensors_that_look_gridded_round_trip(seed in any::<u64>(), on_grid in 0usize..4096) {
        let grid = int_tensor(seed, (16, 512, 128), 4, false, Dtype::Bf16, Dequant::F32ThenCast);
        let mut rng = xorshift(seed ^ 2);
        let values: Vec<u32> = grid.iter().enumerate().map(|(i, &g)| {
            let r = rng.next().unwrap();
            if i < on_grid { g } else { (r >> 48) as u32 & 0xBFFF }
        }).collect();
        round_trip(&values, Dtype::Bf16, Some(512), Level::Default);
    }

    /// Damaged grid payloads are errors, never panics.
    #[test]
    fn damaged_payloads_never_panic(seed in any::<u64>(), width in prop::sample::select(vec![2usize, 4])) {
        let dtype = if width == 2 { Dtype::Bf16 } else { Dtype::F32 };
        let bits = int_tensor(seed, (8, 512, 64), 4, seed % 2 == 0, dtype, Dequant::F32ThenCast);
        let data = to_bytes(&bits, dtype);
        let plan = detect(&data, dtype, Some(512)).unwrap();
        let chunk = fit_chunk(&fit_tensor(&data, &plan), 0, &data).unwrap();
        let mut payload = Vec::new();
        encode_payload(&chunk, &Options::default(), &mut payload).unwrap();
        let mut out = vec![0u8; data.len()];
        let _ = decode(&mutate(&payload, seed), width, &mut out);
        let _ = decode(&payload, width, &mut out[..width * 100]);
    }

    /// Arbitrary bytes as a grid payload: errors, never panics.
    #[test]
    fn arbitrary_payloads_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), width in prop::sample::select(vec![2usize, 4])) {
        let mut out = vec![0u8; width * 64];
        let _ = decode(&bytes, width, &mut out);
    }
}
