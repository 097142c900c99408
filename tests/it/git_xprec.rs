//! The git filter's cross-precision references (issue #43 item 4): a bf16 copy cleaned after
//! its fp32 master in one `git add`, or whose master is in git's `HEAD`, is stored derived
//! from it, as `ckpt commit` stores it; smudge, a fresh clone and both garbage collections
//! keep it exact.

use crate::support::git::GitEnv;
use crate::support::repo_util::weights;
use ckpt::git_filter::Pointer;
use ckpt::repo::Repo;
use ckpt::{Dtype, ObjectId};
use std::collections::BTreeMap;
use std::path::Path;

const SHAPES: &[(&str, &[u64])] = &[("layer.w", &[128, 256]), ("head", &[96, 200])];

/// The weights of `epoch` as safetensors in `dtype` (bf16: rounded to nearest even).
fn model(dtype: Dtype, epoch: u32) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> = SHAPES.iter().map(|(n, s)| (n.to_string(), dtype, s.to_vec())).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).unwrap();
    for (i, (_, shape)) in SHAPES.iter().enumerate() {
        for x in weights(700 + i as u64, shape.iter().product::<u64>() as usize, epoch) {
            match dtype {
                Dtype::F32 => file.extend_from_slice(&x.to_le_bytes()),
                _ => {
                    let rule = ckpt::codec::cross_precision::Rounding::NearestEven;
                    file.extend_from_slice(&ckpt::codec::cross_precision::f32_to_bf16(x.to_bits(), rule).to_le_bytes())
                }
            }
        }
    }
    file
}

/// Tensor name → blob of the file `rev:path` points to.
fn blobs(env: &GitEnv, dir: &Path, store: &Repo, rev_path: &str) -> BTreeMap<String, ObjectId> {
    let pointer = Pointer::parse(env.git(dir, &["show", rev_path]).as_bytes()).unwrap();
    let manifest = store.manifest(&pointer.manifest).unwrap();
    manifest.tensors().filter_map(|(t, seg)| Some((t.name.clone(), seg.blob?))).collect()
}

/// Asserts every tensor of the bf16 file is derived from the same tensor of the fp32 one.
fn assert_derived(store: &Repo, bf16: &BTreeMap<String, ObjectId>, fp32: &BTreeMap<String, ObjectId>) {
    assert_eq!(bf16.len(), SHAPES.len());
    for (name, blob) in bf16 {
        let h = store.store().header(blob).unwrap();
        assert!(h.conversion.is_some(), "{name} is not derived");
        assert_eq!(h.reference, Some(fp32[name]), "{name}");
        assert!(store.store().stored_len(blob).unwrap() < 2048, "{name}");
    }
}

#[test]
fn a_bf16_copy_derives_from_its_master_cleaned_before_it_or_in_head() {
    let env = GitEnv::new();
    // Global install: a clone has the filter before its first checkout.
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    let dir = env.repo("r");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    // One `git add`: git cleans in path order, the master first.
    std::fs::write(dir.join("a_master.safetensors"), model(Dtype::F32, 0)).unwrap();
    std::fs::write(dir.join("b_copy.safetensors"), model(Dtype::Bf16, 0)).unwrap();
    env.git(&dir, &["add", "a_master.safetensors", "b_copy.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 0"]);
    let store = Repo::open(&dir.join(".git/ckpt")).unwrap();
    let fp32 = blobs(&env, &dir, &store, "HEAD:a_master.safetensors");
    assert_derived(&store, &blobs(&env, &dir, &store, "HEAD:b_copy.safetensors"), &fp32);

    // The next epoch's master in one commit, its copy in a later `git add` (another filter
    // process): the master is in git's HEAD.
    std::fs::write(dir.join("a_master.safetensors"), model(Dtype::F32, 1)).unwrap();
    env.git(&dir, &["commit", "-qam", "master 1"]);
    std::fs::write(dir.join("b_copy.safetensors"), model(Dtype::Bf16, 1)).unwrap();
    env.git(&dir, &["commit", "-qam", "copy 1"]);
    let fp32 = blobs(&env, &dir, &store, "HEAD:a_master.safetensors");
    assert_derived(&store, &blobs(&env, &dir, &store, "HEAD:b_copy.safetensors"), &fp32);

    // Smudge restores both exactly, here and in a fresh clone.
    for f in ["a_master.safetensors", "b_copy.safetensors"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    env.git(&dir, &["checkout", "--", "."]);
    assert_eq!(std::fs::read(dir.join("b_copy.safetensors")).unwrap(), model(Dtype::Bf16, 1));
    assert_eq!(std::fs::read(dir.join("a_master.safetensors")).unwrap(), model(Dtype::F32, 1));
    env.git(env.tmp.path(), &["clone", "-q", dir.to_str().unwrap(), "clone"]);
    let clone = env.path("clone");
    assert_eq!(std::fs::read(clone.join("b_copy.safetensors")).unwrap(), model(Dtype::Bf16, 1));
    env.git(&clone, &["checkout", "-q", "HEAD~2"]);
    assert_eq!(std::fs::read(clone.join("b_copy.safetensors")).unwrap(), model(Dtype::Bf16, 0));
    env.ckpt(&clone.join(".git/ckpt"), &["verify"]);

    // Only the copy stays live (a new root commit, the old history and its reflogs gone): both
    // collections keep the master's blobs, which the copy is derived from.
    let master = Pointer::parse(env.git(&dir, &["show", "HEAD:a_master.safetensors"]).as_bytes()).unwrap();
    env.git(&dir, &["checkout", "-q", "--orphan", "fresh"]);
    env.git(&dir, &["rm", "-q", "--cached", "a_master.safetensors"]);
    env.git(&dir, &["commit", "-qm", "copy alone"]);
    env.git(&dir, &["branch", "-q", "-D", "main"]);
    env.git(&dir, &["reflog", "expire", "--expire-unreachable=now", "--all"]);
    env.git(&dir, &["gc", "-q", "--prune=now"]);
    env.ckpt(&dir, &["git", "gc", "--prune=now"]);
    let store = Repo::open(&dir.join(".git/ckpt")).unwrap();
    assert!(store.manifest(&master.manifest).is_err(), "the master's file is dead and collected");
    assert!(fp32.values().all(|b| store.store().header(b).is_ok()), "its blobs are kept");
    env.ckpt(&dir.join(".git/ckpt"), &["verify"]);
    std::fs::remove_file(dir.join("b_copy.safetensors")).unwrap();
    env.git(&dir, &["checkout", "--", "b_copy.safetensors"]);
    assert_eq!(std::fs::read(dir.join("b_copy.safetensors")).unwrap(), model(Dtype::Bf16, 1));
}

#[test]
fn a_bf16_copy_cleaned_before_its_master_is_derived_once_the_master_is_stored() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    for epoch in 0..3 {
        // git cleans model_bf16 first: its master comes later in the same `git add`.
        std::fs::write(dir.join("model_bf16.safetensors"), model(Dtype::Bf16, epoch)).unwrap();
        std::fs::write(dir.join("model_fp32.safetensors"), model(Dtype::F32, epoch)).unwrap();
        env.git(&dir, &["add", "model_bf16.safetensors", "model_fp32.safetensors"]);
        env.git(&dir, &["commit", "-qm", &format!("epoch {epoch}")]);
        let store = Repo::open(&dir.join(".git/ckpt")).unwrap();
        let fp32 = blobs(&env, &dir, &store, "HEAD:model_fp32.safetensors");
        assert_derived(&store, &blobs(&env, &dir, &store, "HEAD:model_bf16.safetensors"), &fp32);
    }
    env.ckpt(&dir.join(".git/ckpt"), &["verify"]);
    for (back, epoch) in [(2, 0), (1, 1), (0, 2)] {
        env.git(&dir, &["checkout", "-q", &format!("main~{back}")]);
        assert_eq!(std::fs::read(dir.join("model_bf16.safetensors")).unwrap(), model(Dtype::Bf16, epoch));
        assert_eq!(std::fs::read(dir.join("model_fp32.safetensors")).unwrap(), model(Dtype::F32, epoch));
    }
}
