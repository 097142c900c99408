//! Helpers for the repository tests: a temporary repository and synthetic checkpoints whose
//! weights drift a little from epoch to epoch, like a converging training run.

#![allow(dead_code)]

use ckpt::repo::{CommitOptions, Repo, VersionId};
use ckpt::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A version's files: (relative path, bytes), sorted by path.
pub type Files = Vec<(String, Vec<u8>)>;

/// A repository in a temporary directory.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
}

impl TestRepo {
    /// A new, empty repository (created through the library).
    pub fn init() -> TestRepo {
        let dir = tempfile::tempdir().expect("temp dir");
        Repo::init(dir.path()).expect("init");
        TestRepo { dir }
    }

    /// A new repository with `config` written to `.ckpt/config`.
    pub fn with_config(config: &ckpt::repo::Config) -> TestRepo {
        let t = TestRepo::init();
        std::fs::write(t.root().join(".ckpt/config"), serde_json::to_vec(config).unwrap()).unwrap();
        t
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// Opens the repository (holding its index until dropped).
    pub fn open(&self) -> Repo {
        Repo::open(self.root()).expect("open")
    }

    pub fn write(&self, rel: &str, bytes: &[u8]) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    /// Writes every file of `files` into the working tree.
    pub fn write_files(&self, files: &Files) {
        for (name, bytes) in files {
            self.write(name, bytes);
        }
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap()
    }

    /// Writes `files` into the working tree and commits them through the library.
    pub fn commit_files(&self, repo: &Repo, files: &[(&str, &[u8])], message: &str) -> VersionId {
        for (name, bytes) in files {
            self.write(name, bytes);
        }
        let paths: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        repo.commit(&paths, message, &CommitOptions::default()).expect("commit")
    }

    /// Runs the `ckpt` binary in the repository root.
    pub fn ckpt(&self, args: &[&str]) -> Output {
        ckpt_in(self.root(), args)
    }

    /// Checks out `rev` into a fresh directory through the library; returns its files.
    pub fn checkout_all(&self, repo: &Repo, rev: &str) -> Vec<(String, Vec<u8>)> {
        let out = tempfile::tempdir().unwrap();
        repo.checkout(rev, None, Some(out.path()), None).expect("checkout");
        read_tree(out.path())
    }

    /// Object files in the store.
    pub fn object_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let objects = self.path(".ckpt/objects");
        for fan in std::fs::read_dir(objects).unwrap() {
            for f in std::fs::read_dir(fan.unwrap().path()).unwrap() {
                out.push(f.unwrap().path());
            }
        }
        out.sort();
        out
    }
}

/// Runs `ckpt` with `args` in `dir`.
/// Runs the `ckpt` binary in `dir`. Commits rewrite the parent's blobs before they return
/// (`CKPT_COMPACT=inline`), so what a test reads next does not race a background compaction;
/// `tests/it/repo_compact.rs` tests the background mode itself.
pub fn ckpt_in(dir: &Path, args: &[&str]) -> Output {
    ckpt_command(dir, args).output().expect("run ckpt")
}

/// The `ckpt` command for [`ckpt_in`], to run some other way.
pub fn ckpt_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ckpt"));
    c.args(args).current_dir(dir).env("CKPT_COMPACT", "inline");
    c
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `ckpt` in the repository and asserts it succeeded; returns its stdout.
pub fn ok(t: &TestRepo, args: &[&str]) -> String {
    let o = t.ckpt(args);
    assert!(o.status.success(), "ckpt {args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `ckpt` in the repository, asserts it failed with exit code 1, returns its stderr.
pub fn refused(t: &TestRepo, args: &[&str]) -> String {
    let o = t.ckpt(args);
    assert_eq!(o.status.code(), Some(1), "ckpt {args:?} should fail: {}", stderr(&o));
    stderr(&o)
}

/// Runs `command`, killing it after `limit`; `None` if it had to be killed.
pub fn output_within(mut command: Command, limit: Duration) -> Option<Output> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(child.wait_with_output().unwrap())
}

/// Every file under `dir` (recursively, paths relative with `/`), sorted.
pub fn read_tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/");
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// xorshift64*.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Approximately normal, mean 0, std 1.
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 3f64.sqrt() - 2.0 * 3f64.sqrt()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn encode(dtype: Dtype, x: f32, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes()),
        Dtype::F64 => out.extend_from_slice(&(x as f64).to_le_bytes()),
        other => panic!("synthetic weights of {other} are not supported"),
    }
}

/// Float weights of one tensor at `epoch`: initial values (std 0.02) plus a drift that shrinks
/// over the epochs, touching a shrinking fraction of the elements, as training converges.
pub fn weights(seed: u64, elements: usize, epoch: u32) -> Vec<f32> {
    let mut init = Rng::new(seed);
    let mut w: Vec<f32> = (0..elements).map(|_| (init.normal() * 0.02) as f32).collect();
    for e in 1..=epoch {
        let mut rng = Rng::new(seed ^ (e as u64) << 40);
        let step = 0.002 / e as f64;
        let touched = 1.0 / (1.0 + e as f64);
        for x in w.iter_mut() {
            if rng.unit() < touched {
                *x += (rng.normal() * step) as f32 * x.abs().max(1e-3);
            }
        }
    }
    w
}

/// A safetensors file of float tensors `(name, shape)` of `dtype` at `epoch`.
pub fn synthetic_checkpoint(seed: u64, dtype: Dtype, shapes: &[(&str, &[u64])], epoch: u32) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> = shapes.iter().map(|(n, s)| (n.to_string(), dtype, s.to_vec())).collect();
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("epoch".to_string(), epoch.to_string());
    let mut file = ckpt::safetensors::write_header(&spec, Some(&meta)).expect("valid header");
    for (i, (_, shape)) in shapes.iter().enumerate() {
        let n: u64 = shape.iter().product();
        for x in weights(seed.wrapping_add(i as u64 * 7919), n as usize, epoch) {
            encode(dtype, x, &mut file);
        }
    }
    file
}

/// A small model: a few matrices and a bias.
/// A small model (bf16) and its optimizer state (f32) as a training loop saves them.
pub const TRAINING_MODEL: &[(&str, &[u64])] = &[("embed", &[256, 512]), ("layer.w", &[512, 512]), ("layer.b", &[512])];
pub const TRAINING_OPTIM: &[(&str, &[u64])] = &[("exp_avg.layer.w", &[512, 256])];

pub const SMALL_MODEL: &[(&str, &[u64])] = &[
    ("embed.weight", &[64, 96]),
    ("layers.0.attn.q", &[96, 96]),
    ("layers.0.mlp.up", &[96, 160]),
    ("head.bias", &[96]),
];
