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

/// A pointer only a tag of a tree or of a blob reaches, and one only an autostash holds (a
/// `git rebase --autostash` stopped on a conflict), survive `ckpt git gc --prune=now` and
/// `git gc --prune=now`, and check out afterwards.
#[test]
fn gc_keeps_pointers_that_tags_of_trees_and_blobs_and_an_autostash_reach() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "model.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 0"]);
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["commit", "-qam", "epoch 1"]);
    env.git(&dir, &["tag", "tree-1", "HEAD^{tree}"]);
    env.git(&dir, &["tag", "-a", "blob-1", "-m", "pin", "HEAD:model.safetensors"]);
    env.git(&dir, &["reset", "-q", "--hard", "HEAD~1"]);
    // An uncommitted epoch 2 autostashed by a rebase that stops on a conflict.
    env.git(&dir, &["switch", "-q", "-c", "side"]);
    std::fs::write(dir.join("notes.txt"), "side\n").unwrap();
    env.git(&dir, &["add", "notes.txt"]);
    env.git(&dir, &["commit", "-qm", "side"]);
    env.git(&dir, &["switch", "-q", "main"]);
    std::fs::write(dir.join("notes.txt"), "main\n").unwrap();
    env.git(&dir, &["add", "notes.txt"]);
    env.git(&dir, &["commit", "-qm", "main"]);
    std::fs::write(dir.join("model.safetensors"), model(2)).unwrap();
    let rebase = env.command("git", &dir, &["rebase", "--autostash", "side"]).output().unwrap();
    assert!(!rebase.status.success(), "the rebase stops on the conflict");
    assert!(dir.join(".git/rebase-merge/autostash").exists());
    env.git(&dir, &["reflog", "expire", "--expire-unreachable=now", "--all"]);
    env.git(&dir, &["gc", "-q", "--prune=now"]);
    gc_json(&env, &dir, &[]);
    env.ckpt(&dir.join(".git/ckpt"), &["verify"]);
    // The rebase goes on and the autostash comes back with epoch 2.
    std::fs::write(dir.join("notes.txt"), "both\n").unwrap();
    env.git(&dir, &["add", "notes.txt"]);
    let resumed = env.command("git", &dir, &["rebase", "--continue"]).env("GIT_EDITOR", "true").output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(2));
    // The tags give epoch 1 back through the filter.
    for spec in ["tree-1:model.safetensors", "blob-1^{blob}"] {
        let blob = env.git(&dir, &["rev-parse", spec]);
        let out = env
            .command("git", &dir, &["cat-file", "--filters", "--path=model.safetensors", blob.trim()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{spec}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, model(1), "{spec}");
    }
}

/// A relative `ckpt.store` names one store for every worktree: relative to the main working
/// tree, not to each linked worktree's own directory (where a worktree added next to nothing
/// found an empty store and its checkout failed, and its commits went to a store of its own).
#[test]
fn a_relative_store_is_the_same_for_every_worktree() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    env.git(&dir, &["config", "ckpt.store", "../shared-store"]);
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "model.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 0"]);
    env.git(&dir, &["worktree", "add", "-q", "-b", "feat", ".wt/feat"]);
    let wt = dir.join(".wt/feat");
    assert_eq!(std::fs::read(wt.join("model.safetensors")).unwrap(), model(0));
    std::fs::write(wt.join("model.safetensors"), model(1)).unwrap();
    env.git(&wt, &["commit", "-qam", "epoch 1 in the worktree"]);
    assert!(!dir.join(".wt/shared-store").exists(), "no second store beside the worktree");
    env.ckpt(&dir, &["git", "fsck"]);
    env.git(&dir, &["checkout", "-q", "feat", "--", "model.safetensors"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(1));
}

/// `ckpt git fsck` checks each distinct pointer: one that names a stored file's manifest with
/// another size is bad even when a good pointer to the same manifest was checked first.
#[test]
fn fsck_checks_a_stale_pointer_to_a_manifest_it_checked_already() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    std::fs::write(dir.join("a.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "a.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 0"]);
    let good = pointer_at(&env, &dir, "HEAD:a.safetensors");
    let stale = Pointer::new(good.hash, good.manifest, good.size + 1);
    // Committed past the filter, as a hand-made or stale pointer would be.
    let mut blob = env.command("git", &dir, &["hash-object", "-w", "--stdin", "--no-filters"]);
    let mut child = blob.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &stale.to_bytes()).unwrap();
    let oid = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    env.git(&dir, &["update-index", "--add", "--cacheinfo", &format!("100644,{},b.safetensors", oid.trim())]);
    env.git(&dir, &["commit", "-qm", "a stale pointer"]);
    let fsck = env.run(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "fsck"]);
    assert!(!fsck.status.success(), "{}", String::from_utf8_lossy(&fsck.stderr));
    let text = format!("{}{}", String::from_utf8_lossy(&fsck.stdout), String::from_utf8_lossy(&fsck.stderr));
    assert!(text.contains("b.safetensors") && text.contains("1 bad"), "{text}");
}

/// `git --work-tree=DIR checkout` (the deploy idiom: the repository here, the files written
/// elsewhere) runs the filter with `GIT_DIR` and `GIT_WORK_TREE` set and its directory outside
/// the repository: the filter opens the repository git names and writes the weights.
#[test]
fn a_checkout_into_another_work_tree_writes_the_weights() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    // A relative store: still the repository's, not one beside the other work tree.
    env.git(&dir, &["config", "ckpt.store", ".ckptstore"]);
    env.git(&dir, &["add", ".gitattributes"]);
    std::fs::write(dir.join("model.safetensors"), model(3)).unwrap();
    env.git(&dir, &["add", "model.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 3"]);
    let deploy = env.path("srv-app");
    std::fs::create_dir_all(&deploy).unwrap();
    let tree = format!("--work-tree={}", deploy.display());
    env.git(&dir, &[tree.as_str(), "checkout", "-f", "HEAD", "--", "."]);
    assert_eq!(std::fs::read(deploy.join("model.safetensors")).unwrap(), model(3));
    // From elsewhere, both named: `GIT_DIR` is absolute, `GIT_WORK_TREE` relative.
    std::fs::remove_file(deploy.join("model.safetensors")).unwrap();
    let git_dir = format!("--git-dir={}", dir.join(".git").display());
    env.git(&env.path(""), &[git_dir.as_str(), "--work-tree=srv-app", "checkout", "-f", "HEAD", "--", "."]);
    assert_eq!(std::fs::read(deploy.join("model.safetensors")).unwrap(), model(3));
    assert!(!dir.join(".git/.ckptstore").exists() && !deploy.join(".ckptstore").exists());
}
