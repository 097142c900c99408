//! Push, round 2 (issue #39): a push never spreads bit rot from the local store to a remote,
//! a remote damaged by an older push can be repaired from a healthy clone, a push waiting for
//! a remote gc says so, and a pruned repository's refused push names prune and leaves nothing
//! on the remote.

use crate::support::layout::version_blobs;
use crate::support::remote::{directory, model, s3, trained, Served};
use crate::support::repo_util::stderr;
use std::path::{Path, PathBuf};

fn object_path(objects: &Path, id: &ckpt::ObjectId) -> PathBuf {
    let hex = id.to_hex();
    objects.join(&hex[..2]).join(&hex[2..])
}

fn flip(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

fn explore(r: &Served) {
    let a = trained(r, 7, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    std::fs::write(a.path().join("model.safetensors"), model(7, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let old: Vec<_> = version_blobs(a.path(), "main~1");
    let new: Vec<_> = version_blobs(a.path(), "main").into_iter().filter(|b| !old.contains(b)).collect();
    flip(&object_path(&a.path().join(".ckpt/objects"), &new[0]));
    let out = r.ckpt(a.path(), &["push"]);
    eprintln!("push: {:?} {}", out.status, stderr(&out));
    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "b"]);
    eprintln!("clone: {:?} {}", out.status, stderr(&out));
}

fn explore_prune(r: &Served) {
    let a = trained(r, 8, 4);
    r.ok(a.path(), &["prune", "--keep-last", "2"]);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    let out = r.ckpt(a.path(), &["push"]);
    eprintln!("push: {:?} {}", out.status, stderr(&out));
    let out = std::process::Command::new("find").arg(r.objects.parent().unwrap()).output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn explore_dir() {
    explore(&directory().unwrap());
    explore_prune(&directory().unwrap());
}
#[test]
fn explore_s3() {
    if let Some(r) = s3() {
        explore(&r);
    }
    if let Some(r) = s3() {
        explore_prune(&r);
    }
}
