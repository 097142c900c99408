//! Writes a small synthetic checkpoint (safetensors) for trying ckpt without downloads:
//! a two-layer MLP trained for a few steps of plain SGD on a synthetic regression task, stored
//! as BF16 weights plus F32 master copies and an I64 step counter.
//!
//! `cargo run --release --example make_checkpoint -- OUT.safetensors [STEPS]`

use ckpt::Dtype;
use std::io::Write;

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args.next().ok_or("usage: make_checkpoint OUT.safetensors [STEPS]")?;
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    let (inputs, hidden) = (256usize, 1024usize);
    let mut rng = Rng(0x5EED);
    let scale = (2.0 / inputs as f32).sqrt();
    let mut w1: Vec<f32> = (0..inputs * hidden).map(|_| rng.normal() * scale).collect();
    let mut w2: Vec<f32> = (0..hidden).map(|_| rng.normal() * 0.05).collect();
    let target: Vec<f32> = (0..inputs).map(|_| rng.normal()).collect();
    let lr = 1e-3;
    for _ in 0..steps {
        // One SGD step on a random input x with target y = <target, x>.
        let x: Vec<f32> = (0..inputs).map(|_| rng.normal()).collect();
        let y: f32 = x.iter().zip(&target).map(|(a, b)| a * b).sum();
        let h: Vec<f32> =
            (0..hidden).map(|j| (0..inputs).map(|i| w1[j * inputs + i] * x[i]).sum::<f32>().max(0.0)).collect();
        let pred: f32 = h.iter().zip(&w2).map(|(a, b)| a * b).sum();
        let err = (pred - y).clamp(-10.0, 10.0);
        for j in 0..hidden {
            if h[j] > 0.0 {
                for i in 0..inputs {
                    w1[j * inputs + i] -= lr * err * w2[j] * x[i];
                }
            }
            w2[j] -= lr * err * h[j];
        }
    }
    let bf16 = |w: &[f32]| -> Vec<u8> {
        w.iter()
            .flat_map(|x| ((x.to_bits().wrapping_add(0x7FFF + ((x.to_bits() >> 16) & 1)) >> 16) as u16).to_le_bytes())
            .collect()
    };
    let f32b = |w: &[f32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = vec![
        ("layers.0.weight".into(), Dtype::Bf16, vec![hidden as u64, inputs as u64], bf16(&w1)),
        ("layers.1.weight".into(), Dtype::Bf16, vec![1, hidden as u64], bf16(&w2)),
        ("master.layers.0.weight".into(), Dtype::F32, vec![hidden as u64, inputs as u64], f32b(&w1)),
        ("master.layers.1.weight".into(), Dtype::F32, vec![1, hidden as u64], f32b(&w2)),
        ("step".into(), Dtype::I64, vec![], (steps as i64).to_le_bytes().to_vec()),
    ];
    let spec: Vec<(String, Dtype, Vec<u64>)> = tensors.iter().map(|(n, d, s, _)| (n.clone(), *d, s.clone())).collect();
    let header = ckpt::safetensors::write_header(&spec, None)?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(&out)?);
    file.write_all(&header)?;
    for (_, _, _, data) in &tensors {
        file.write_all(data)?;
    }
    file.flush()?;
    println!("wrote {out}: {} tensors after {steps} SGD steps", tensors.len());
    Ok(())
}
