//! `ckpt git gc` with the real `git` binary: it keeps every file a ref, a reflog entry, the
//! index or the stash reaches (and what their deltas are coded against) and frees a deleted
//! branch's files; `--dry-run` deletes nothing and predicts the real run.

use crate::support::git::{model, objects, GitEnv};
use crate::support::repo_util::synthetic_checkpoint;
use ckpt::git_filter::Pointer;
use ckpt::Dtype;

fn other_model(epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(99, Dtype::Bf16, &[("head.weight", &[128, 256]), ("head.bias", &[256])], epoch)
}

fn pointer_at(env: &GitEnv, dir: &std::path::Path, rev: &str) -> Pointer {
    Pointer::parse(env.git(dir, &["show", rev]).as_bytes()).unwrap()
}

fn gc_json(env: &GitEnv, dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["git", "gc", "--prune=now", "--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&env.ckpt(dir, &all)).unwrap()
}

#[test]
fn gc_keeps_what_refs_reflogs_index_and_stash_reach_and_frees_a_deleted_branch() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    let store = dir.join(".git/ckpt");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    for epoch in 0..2 {
        std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
        env.git(&dir, &["add", "model.safetensors"]);
        env.git(&dir, &["commit", "-qm", &format!("epoch {epoch}")]);
    }
    // A branch with other weights.
    env.git(&dir, &["switch", "-q", "-c", "exp"]);
    for epoch in 0..2 {
        std::fs::write(dir.join("model.safetensors"), other_model(epoch)).unwrap();
        env.git(&dir, &["commit", "-qam", &format!("exp {epoch}")]);
    }
    let exp: Vec<Pointer> =
        ["exp:model.safetensors", "exp~1:model.safetensors"].iter().map(|rev| pointer_at(&env, &dir, rev)).collect();
    env.git(&dir, &["switch", "-q", "main"]);
    // The stash holds epoch 5, the index a staged file never committed.
    std::fs::write(dir.join("model.safetensors"), model(5)).unwrap();
    env.git(&dir, &["stash", "-q"]);
    std::fs::write(dir.join("staged.safetensors"), model(7)).unwrap();
    env.git(&dir, &["add", "staged.safetensors"]);

    // Nothing is dead yet: the exp branch and its reflog reach its files.
    let r = gc_json(&env, &dir, &[]);
    assert_eq!(r["files_kept"], 6, "{r}"); // epochs 0, 1, 5, 7 and exp 0, 1
    for p in &exp {
        assert!(store.join(".ckpt/objects").join(&p.manifest.to_hex()[..2]).join(&p.manifest.to_hex()[2..]).exists());
    }

    // Delete the branch and expire the reflogs that still name its commits.
    env.git(&dir, &["branch", "-q", "-D", "exp"]);
    env.git(&dir, &["reflog", "expire", "--expire-unreachable=now", "--all"]);
    let before = objects(&store);
    let dry = gc_json(&env, &dir, &["--dry-run"]);
    assert_eq!(objects(&store), before, "--dry-run deleted something");
    assert_eq!(dry["files_kept"], 4, "{dry}");
    assert!(dry["deleted"].as_u64().unwrap() > 0, "{dry}");
    let real = gc_json(&env, &dir, &[]);
    assert_eq!((&real["deleted"], &real["bytes_freed"]), (&dry["deleted"], &dry["bytes_freed"]), "{dry} {real}");
    let after = objects(&store);
    assert!(after.len() < before.len());
    for p in &exp {
        let hex = p.manifest.to_hex();
        assert!(!store.join(".ckpt/objects").join(&hex[..2]).join(&hex[2..]).exists(), "exp's file kept");
    }

    // Everything still reachable checks out bit-exact: both commits, the index, the stash.
    env.ckpt(&store, &["verify"]);
    env.ckpt(&dir, &["git", "fsck"]);
    std::fs::remove_file(dir.join("staged.safetensors")).unwrap();
    env.git(&dir, &["checkout", "--", "staged.safetensors"]);
    assert_eq!(std::fs::read(dir.join("staged.safetensors")).unwrap(), model(7));
    env.git(&dir, &["commit", "-qm", "staged"]);
    env.git(&dir, &["checkout", "-q", "HEAD~2"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(0));
    env.git(&dir, &["checkout", "-q", "main"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(1));
    env.git(&dir, &["stash", "pop", "-q"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(5));
    // The store keeps working: the next epoch is stored (as a delta chain with the kept ones).
    std::fs::write(dir.join("model.safetensors"), model(6)).unwrap();
    env.git(&dir, &["commit", "-qam", "epoch 6"]);
    env.git(&dir, &["checkout", "-q", "HEAD~1", "--", "model.safetensors"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(1));
    env.ckpt(&store, &["verify"]);
    // A second gc right after frees nothing more than the versions the new clean recorded.
    let again = gc_json(&env, &dir, &[]);
    assert_eq!(again["files_missing"], 0, "{again}");
}
