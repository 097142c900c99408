//! Helpers shared by the integration tests.

#![allow(dead_code)]

use ckpt::Dtype;
use std::path::Path;
use std::process::{Command, Output};

/// Runs the `ckpt` binary with `args` in `dir`.
pub fn ckpt(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ckpt")).args(args).current_dir(dir).output().expect("run ckpt")
}

/// Deterministic pseudo-random bytes.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Tensor data that looks like trained weights for float dtypes (normal, std 0.02) and like
/// small integers otherwise.
pub fn tensor_data(seed: u64, dtype: Dtype, elements: usize) -> Vec<u8> {
    let raw = noise(seed, elements * 8);
    let normal = |i: usize| -> f64 {
        let u = (u32::from_le_bytes(raw[i * 8..i * 8 + 4].try_into().unwrap()) as f64 + 0.5) / 4294967296.0;
        let v = (u32::from_le_bytes(raw[i * 8 + 4..i * 8 + 8].try_into().unwrap()) as f64 + 0.5) / 4294967296.0;
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * 0.02
    };
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        let x = normal(i);
        match dtype {
            Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Dtype::F64 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&(((x as f32).to_bits() >> 16) as u16).to_le_bytes()),
            Dtype::F16 => {
                // Crude f16: sign, 5-bit exponent, 10-bit mantissa from the f32 bits.
                let b = (x as f32).to_bits();
                let exp = (((b >> 23) & 0xFF) as i32 - 127 + 15).clamp(0, 31) as u16;
                out.extend_from_slice(
                    &(((b >> 16) & 0x8000) as u16 | exp << 10 | ((b >> 13) & 0x3FF) as u16).to_le_bytes(),
                );
            }
            d => out.extend_from_slice(&raw[i * 8..i * 8 + d.size()]),
        }
    }
    out
}

/// A safetensors file with one tensor per (name, dtype, shape).
pub fn safetensors_file(seed: u64, tensors: &[(&str, Dtype, &[u64])]) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        tensors.iter().map(|(n, d, s)| (n.to_string(), *d, s.to_vec())).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).expect("valid header");
    for (i, (_, dtype, shape)) in tensors.iter().enumerate() {
        let elements: u64 = shape.iter().product();
        file.extend_from_slice(&tensor_data(seed + i as u64, *dtype, elements as usize));
    }
    file
}

/// Every dtype, with a scalar and an empty tensor.
pub fn all_dtypes_file(seed: u64) -> Vec<u8> {
    let mut tensors: Vec<(String, Dtype, Vec<u64>)> = ckpt::dtype::ALL_DTYPES
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("t{i}.{}", d.safetensors_name()), *d, vec![37, 1000 + i as u64]))
        .collect();
    tensors.push(("scalar".into(), Dtype::F32, vec![]));
    tensors.push(("empty".into(), Dtype::Bf16, vec![0, 4]));
    let refs: Vec<(&str, Dtype, &[u64])> = tensors.iter().map(|(n, d, s)| (n.as_str(), *d, s.as_slice())).collect();
    safetensors_file(seed, &refs)
}

/// File names in `dir`, sorted.
pub fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}
