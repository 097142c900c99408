//! Writes a synthetic series of large bf16 checkpoints for the commit/checkout benchmark
//! (`benches/big_checkpoint.sh`): no downloads, deterministic, any size.
//!
//! Every epoch file holds SIZE / 128 MiB tensors of 8192 × 8192 bf16 (128 MiB each). Epoch 0
//! draws weights from a bell-shaped distribution with standard deviation 0.02 (the sum of four
//! uniforms, which is close enough to normal for the exponent statistics and far cheaper);
//! epoch e + 1 adds an update about 1/500 of a weight to every weight in f32 and rounds to
//! bf16 (round to nearest even), so a varying fraction of the low mantissa bits changes, as in
//! a real fine-tune. The update shrinks by DECAY every epoch (default 0.5), like a decaying
//! learning rate; with a slower decay (0.8) bits keep changing for 20 epochs and more, which is
//! what `benches/deep_chain.sh` needs.
//!
//! `cargo run --release --example synthetic_series -- OUT_DIR SIZE [EPOCHS] [DECAY]`, where
//! SIZE is GiB (`2`) or MiB with an `M` suffix (`256M`, a multiple of 128), writes
//! `OUT_DIR/epoch_0.safetensors` … `epoch_{EPOCHS-1}.safetensors` (default 2 epochs).
//! Memory: one tensor in f32 plus one in bf16 (768 MiB); the files are streamed.

use ckpt::Dtype;
use std::io::Write;

const SIDE: u64 = 8192;

/// xorshift64: fast and deterministic; statistical quality is irrelevant here.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Mean 0, standard deviation 1 (Irwin–Hall with four 16-bit uniforms).
    fn bell(&mut self) -> f32 {
        let r = self.next();
        let sum: u64 = (0..4).map(|i| (r >> (16 * i)) & 0xFFFF).sum();
        // Sum of 4 uniforms on [0, 1): mean 2, variance 4/12.
        (sum as f32 / 65536.0 - 2.0) * 3f32.sqrt()
    }
}

fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let round = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: synthetic_series OUT_DIR SIZE [EPOCHS] [DECAY]";
    let dir = std::path::PathBuf::from(args.next().ok_or(usage)?);
    let size = args.next().ok_or(usage)?;
    let mib: u64 = match size.strip_suffix('M') {
        Some(m) => m.parse()?,
        None => size.parse::<u64>()? * 1024,
    };
    let epochs: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let decay: f32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0.5);
    std::fs::create_dir_all(&dir)?;
    let count = (mib / 128).max(1);
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        (0..count).map(|i| (format!("layers.{i}.weight"), Dtype::Bf16, vec![SIDE, SIDE])).collect();
    let header = ckpt::safetensors::write_header(&spec, None)?;
    let mut files = (0..epochs)
        .map(|e| {
            let mut f = std::io::BufWriter::with_capacity(
                1 << 22,
                std::fs::File::create(dir.join(format!("epoch_{e}.safetensors")))?,
            );
            f.write_all(&header)?;
            Ok(f)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let n = (SIDE * SIDE) as usize;
    let mut weights = vec![0f32; n];
    let mut bytes = vec![0u8; 2 * n];
    for t in 0..count {
        let mut rng = Rng(0x5EED ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        weights.iter_mut().for_each(|w| *w = rng.bell() * 0.02);
        for (e, file) in files.iter_mut().enumerate() {
            if e > 0 {
                let step = 0.002 * decay.powi(e as i32 - 1);
                weights.iter_mut().for_each(|w| *w += *w * step * rng.bell());
            }
            for (w, out) in weights.iter().zip(bytes.chunks_exact_mut(2)) {
                out.copy_from_slice(&to_bf16(*w).to_le_bytes());
            }
            file.write_all(&bytes)?;
        }
    }
    for mut f in files {
        f.flush()?;
    }
    println!("wrote {epochs} epochs of {count} bf16 tensors ({} MiB each) to {}", count * 128, dir.display());
    Ok(())
}
