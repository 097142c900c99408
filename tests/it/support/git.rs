//! A git environment for the filter tests: an isolated HOME, a fixed identity, `ckpt` on PATH.

use super::repo_util::synthetic_checkpoint;
use ckpt::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A temporary HOME (so `--global` and the user's own config stay out) and a git repository.
pub(crate) struct GitEnv {
    pub(crate) tmp: tempfile::TempDir,
}

impl GitEnv {
    pub(crate) fn new() -> GitEnv {
        let env = GitEnv { tmp: tempfile::tempdir().unwrap() };
        std::fs::create_dir(env.home()).unwrap();
        env
    }

    pub(crate) fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// `program` with the environment every git or ckpt call of these tests gets: ckpt on PATH,
    /// an isolated HOME, no system config, a fixed identity, inline compaction (no background
    /// process racing the next step).
    pub(crate) fn command(&self, program: &str, dir: &Path, args: &[&str]) -> Command {
        let bin = Path::new(env!("CARGO_BIN_EXE_ckpt")).parent().unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let mut c = Command::new(program);
        c.args(args)
            .current_dir(dir)
            .env("PATH", path)
            .env("HOME", self.home())
            .env_remove("GIT_CONFIG_GLOBAL")
            .env_remove("XDG_CONFIG_HOME")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .env("CKPT_COMPACT", "inline");
        c
    }

    pub(crate) fn run(&self, program: &str, dir: &Path, args: &[&str]) -> Output {
        self.command(program, dir, args).output().expect("run")
    }

    /// Runs git and asserts success.
    pub(crate) fn git(&self, dir: &Path, args: &[&str]) -> String {
        let o = self.run("git", dir, args);
        assert!(o.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs ckpt and asserts success.
    pub(crate) fn ckpt(&self, dir: &Path, args: &[&str]) -> String {
        let o = self.run(env!("CARGO_BIN_EXE_ckpt"), dir, args);
        assert!(o.status.success(), "ckpt {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A new repository at `rel` with the filter installed (in its own config) and `*.safetensors` and `*.bin` tracked.
    pub(crate) fn repo(&self, rel: &str) -> PathBuf {
        let dir = self.path(rel);
        std::fs::create_dir_all(&dir).unwrap();
        self.git(&dir, &["init", "-q", "-b", "main"]);
        self.ckpt(&dir, &["git", "install", "--local"]);
        self.ckpt(&dir, &["git", "track", "*.safetensors", "*.bin"]);
        dir
    }
}

pub(crate) fn model(epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(7, Dtype::Bf16, &[("layer.weight", &[192, 256]), ("layer.bias", &[256])], epoch)
}

pub(crate) fn objects(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(store.join(".ckpt/objects")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

pub(crate) fn status_is_clean(env: &GitEnv, dir: &Path) {
    let s = env.git(dir, &["status", "--porcelain"]);
    assert_eq!(s, "", "git status not clean");
}

/// Commits three epochs of `model.safetensors` in a new repository at `rel` whose
/// `.ckptconfig` names `remote_url`, and a bare repository `origin.git` as its `origin`.
pub(crate) fn three_epochs_with_origin(env: &GitEnv, rel: &str, remote_url: &str) -> PathBuf {
    let dir = env.repo(rel);
    std::fs::write(dir.join(".ckptconfig"), format!("[ckpt]\n\tremote = {remote_url}\n")).unwrap();
    env.git(&dir, &["add", ".gitattributes", ".ckptconfig"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    for epoch in 0..3 {
        std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
        env.git(&dir, &["add", "model.safetensors"]);
        env.git(&dir, &["commit", "-qm", &format!("epoch {epoch}")]);
    }
    env.git(env.tmp.path(), &["init", "-q", "--bare", "-b", "main", "origin.git"]);
    env.git(&dir, &["remote", "add", "origin", env.path("origin.git").to_str().unwrap()]);
    dir
}
