//! Trains a small two-layer MLP in plain Rust (SGD with momentum on a synthetic regression
//! task) and commits a checkpoint to a ckpt repository after every epoch: BF16 weights, their
//! F32 master copies and the momentum buffers. Then checks out an early epoch, confirms it is
//! bit-exact, and prints what each epoch cost in the store.
//!
//! `cargo run --release --example train_and_commit -- [DIR] [EPOCHS]` (default: a temp dir, 10)

use ckpt::repo::{CommitOptions, Repo};
use ckpt::Dtype;
use std::io::Write;
use std::path::PathBuf;

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

const INPUTS: usize = 256;
const HIDDEN: usize = 1024;

struct Model {
    w1: Vec<f32>,
    w2: Vec<f32>,
    m1: Vec<f32>,
    m2: Vec<f32>,
}

impl Model {
    /// One SGD-with-momentum step on a random input x with target y = <target, x>.
    fn step(&mut self, rng: &mut Rng, target: &[f32], lr: f32) {
        let x: Vec<f32> = (0..INPUTS).map(|_| rng.normal()).collect();
        let y: f32 = x.iter().zip(target).map(|(a, b)| a * b).sum();
        let h: Vec<f32> = (0..HIDDEN)
            .map(|j| self.w1[j * INPUTS..(j + 1) * INPUTS].iter().zip(&x).map(|(w, x)| w * x).sum::<f32>().max(0.0))
            .collect();
        let pred: f32 = h.iter().zip(&self.w2).map(|(a, b)| a * b).sum();
        let err = (pred - y).clamp(-10.0, 10.0);
        for (j, &hj) in h.iter().enumerate() {
            if hj > 0.0 {
                let g = err * self.w2[j];
                let row = j * INPUTS..(j + 1) * INPUTS;
                for ((w, m), xi) in self.w1[row.clone()].iter_mut().zip(&mut self.m1[row]).zip(&x) {
                    *m = 0.9 * *m + g * xi;
                    *w -= lr * *m;
                }
            }
            self.m2[j] = 0.9 * self.m2[j] + err * hj;
            self.w2[j] -= lr * self.m2[j];
        }
    }

    fn safetensors(&self, step: u64) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let bf16 = |w: &[f32]| -> Vec<u8> {
            w.iter()
                .flat_map(|x| {
                    ((x.to_bits().wrapping_add(0x7FFF + ((x.to_bits() >> 16) & 1)) >> 16) as u16).to_le_bytes()
                })
                .collect()
        };
        let f32b = |w: &[f32]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (h, i) = (HIDDEN as u64, INPUTS as u64);
        let tensors: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = vec![
            ("layers.0.weight".into(), Dtype::Bf16, vec![h, i], bf16(&self.w1)),
            ("layers.1.weight".into(), Dtype::Bf16, vec![1, h], bf16(&self.w2)),
            ("master.layers.0.weight".into(), Dtype::F32, vec![h, i], f32b(&self.w1)),
            ("master.layers.1.weight".into(), Dtype::F32, vec![1, h], f32b(&self.w2)),
            ("momentum.layers.0.weight".into(), Dtype::F32, vec![h, i], f32b(&self.m1)),
            ("momentum.layers.1.weight".into(), Dtype::F32, vec![1, h], f32b(&self.m2)),
            ("step".into(), Dtype::I64, vec![], step.to_le_bytes().to_vec()),
        ];
        let spec: Vec<(String, Dtype, Vec<u64>)> =
            tensors.iter().map(|(n, d, s, _)| (n.clone(), *d, s.clone())).collect();
        let mut file = ckpt::safetensors::write_header(&spec, None)?;
        for (_, _, _, data) in &tensors {
            file.extend_from_slice(data);
        }
        Ok(file)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let temp = tempfile::tempdir()?;
    let dir = args.next().map_or_else(|| temp.path().to_path_buf(), PathBuf::from);
    let epochs: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let repo = match Repo::open(&dir) {
        Ok(repo) => repo,
        Err(_) => Repo::init(&dir)?,
    };
    let mut rng = Rng(0x5EED);
    let scale = (2.0 / INPUTS as f32).sqrt();
    let mut model = Model {
        w1: (0..INPUTS * HIDDEN).map(|_| rng.normal() * scale).collect(),
        w2: (0..HIDDEN).map(|_| rng.normal() * 0.05).collect(),
        m1: vec![0.0; INPUTS * HIDDEN],
        m2: vec![0.0; HIDDEN],
    };
    let target: Vec<f32> = (0..INPUTS).map(|_| rng.normal()).collect();
    let path = dir.join("model.safetensors");
    let mut saved = Vec::new();
    let mut step = 0;
    for epoch in 0..epochs {
        // The learning rate decays, so later epochs change fewer bits.
        let lr = 2e-5 * 0.5f32.powi(epoch as i32);
        for _ in 0..20 {
            model.step(&mut rng, &target, lr);
            step += 1;
        }
        let bytes = model.safetensors(step)?;
        std::fs::write(&path, &bytes)?;
        let id = repo.commit(&[&path], &format!("epoch {epoch}"), &CommitOptions::default())?;
        saved.push((id, bytes));
    }

    let (old_id, old_bytes) = &saved[saved.len().min(3) - 1];
    let out = temp.path().join("checkout");
    repo.checkout(&old_id.to_hex(), None, Some(&out), None)?;
    let restored = std::fs::read(out.join("model.safetensors"))?;
    assert!(restored == *old_bytes, "checkout is not bit-exact");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "repository: {}", repo.root().display())?;
    writeln!(stdout, "checked out version {} (epoch {}): bit-exact", old_id.short(12), saved.len().min(3) - 1)?;
    writeln!(stdout, "{:>5}  {:>12}  {:>12}  {:>6}  message", "epoch", "raw bytes", "stored", "%")?;
    for (n, v) in repo.log("HEAD")?.iter().rev().enumerate() {
        let pct = 100.0 * v.stored_bytes as f64 / v.raw_bytes.max(1) as f64;
        writeln!(stdout, "{n:>5}  {:>12}  {:>12}  {pct:>6.1}  {}", v.raw_bytes, v.stored_bytes, v.message)?;
    }
    Ok(())
}
