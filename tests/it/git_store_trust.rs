//! The git filter's store under the habits of git users (issue #24), against the real `git`:
//! `ckpt git gc` keeps what linked worktrees and the other repositories sharing the store
//! reach, two gcs in one second leave a working store, a clean writes what its own file needs
//! (not a listing of every path stored before), first uses of a new shared store race safely,
//! a damaged object in the origin's store is refused in favour of the ckpt remote's copy, and
//! `git log -p` / `git diff` in a clone leave the store as it was.

use crate::support::git::three_epochs_with_origin;
use crate::support::git::{model, objects, GitEnv};
use ckpt::git_filter::Pointer;
use std::path::{Path, PathBuf};

fn pointer_at(env: &GitEnv, dir: &Path, rev: &str) -> Pointer {
    Pointer::parse(env.git(dir, &["show", rev]).as_bytes()).unwrap()
}

fn object_file(store: &Path, id: &ckpt::ObjectId) -> PathBuf {
    let hex = id.to_hex();
    store.join(".ckpt/objects").join(&hex[..2]).join(&hex[2..])
}

fn bytes_of(files: &[PathBuf]) -> u64 {
    files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum()
}

/// A repository at `rel` with `.gitattributes` and epoch 0 committed.
fn repo_with_epoch0(env: &GitEnv, rel: &str) -> PathBuf {
    let dir = env.repo(rel);
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", ".gitattributes", "model.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 0"]);
    dir
}

/// Two repositories at `names` whose `ckpt.store` is `shared`, each with a weight file
/// committed (epochs 0 and 5).
fn sharing_a_store(env: &GitEnv, shared: &Path, names: [&str; 2]) -> Vec<PathBuf> {
    names
        .into_iter()
        .zip([0, 5])
        .map(|(rel, epoch)| {
            let dir = env.repo(rel);
            env.git(&dir, &["config", "ckpt.store", shared.to_str().unwrap()]);
            std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
            env.git(&dir, &["add", ".gitattributes", "model.safetensors"]);
            env.git(&dir, &["commit", "-qm", "weights"]);
            dir
        })
        .collect()
}

fn restores(env: &GitEnv, dir: &Path, file: &str, expected: &[u8]) {
    std::fs::remove_file(dir.join(file)).unwrap();
    env.git(dir, &["checkout", "--", file]);
    assert_eq!(std::fs::read(dir.join(file)).unwrap(), expected, "{file} in {}", dir.display());
}

#[test]
fn gc_keeps_what_linked_worktrees_stage_or_commit_on_a_detached_head() {
    let env = GitEnv::new();
    let dir = repo_with_epoch0(&env, "r");
    let store = dir.join(".git/ckpt");
    let (wt1, wt2) = (env.path("wt1"), env.path("wt2"));
    env.git(&dir, &["worktree", "add", "-q", "--detach", wt1.to_str().unwrap()]);
    env.git(&dir, &["worktree", "add", "-q", "-b", "side", wt2.to_str().unwrap()]);
    // wt1: a commit on a detached HEAD (no branch, no reflog of the main worktree names it).
    std::fs::write(wt1.join("model.safetensors"), model(1)).unwrap();
    env.git(&wt1, &["commit", "-qam", "detached"]);
    // wt2: a file staged, never committed.
    std::fs::write(wt2.join("staged.safetensors"), model(2)).unwrap();
    env.git(&wt2, &["add", "staged.safetensors"]);
    let detached = pointer_at(&env, &wt1, "HEAD:model.safetensors");
    let staged = pointer_at(&env, &wt2, ":staged.safetensors");

    env.ckpt(&dir, &["git", "gc", "--prune=now"]);
    for p in [&detached, &staged] {
        assert!(object_file(&store, &p.manifest).exists(), "gc deleted a worktree's file");
    }
    restores(&env, &wt1, "model.safetensors", &model(1));
    restores(&env, &wt2, "staged.safetensors", &model(2));
    // From a linked worktree, gc keeps what the main one reaches too.
    std::fs::write(dir.join("main-staged.safetensors"), model(3)).unwrap();
    env.git(&dir, &["add", "main-staged.safetensors"]);
    env.ckpt(&wt2, &["git", "gc", "--prune=now"]);
    restores(&env, &dir, "main-staged.safetensors", &model(3));
    restores(&env, &wt1, "model.safetensors", &model(1));
    env.ckpt(&store, &["verify"]);
}

#[test]
fn gc_keeps_what_every_repository_sharing_the_store_reaches_and_missing_ones_until_forgotten() {
    let env = GitEnv::new();
    let shared = env.path("shared");
    let repos = sharing_a_store(&env, &shared, ["a", "b"]);
    let (a, b) = (&repos[0], &repos[1]);
    let b_file = pointer_at(&env, b, "HEAD:model.safetensors");

    let r: serde_json::Value = serde_json::from_str(&env.ckpt(a, &["git", "gc", "--prune=now", "--json"])).unwrap();
    assert!(object_file(&shared, &b_file.manifest).exists(), "gc in a deleted b's file");
    restores(&env, b, "model.safetensors", &model(5));
    assert_eq!(r["repositories"].as_array().map(Vec::len), Some(2), "{r}");

    // b exists but cannot be read: gc refuses, naming it, and deletes nothing.
    let b_git = b.join(".git");
    std::fs::rename(&b_git, b.join("git.moved")).unwrap();
    std::fs::write(&b_git, "not a repository").unwrap();
    // An unreachable file of a's, which a gc would delete.
    std::fs::write(a.join("model.safetensors"), model(1)).unwrap();
    env.git(a, &["add", "model.safetensors"]);
    env.git(a, &["reset", "-q", "--hard"]);
    let before = objects(&shared);
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), a, &["git", "gc", "--prune=now"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot be read") && err.contains("/b/.git"), "{err}");
    assert_eq!(objects(&shared), before, "a refused gc deleted something");
    std::fs::remove_file(&b_git).unwrap();
    std::fs::rename(b.join("git.moved"), &b_git).unwrap();

    // b deleted: a missing path is no proof (issue 39: a move looks the same), so gc keeps
    // every stored file for it and says so, until `ckpt git forget` unregisters it.
    std::fs::remove_dir_all(b).unwrap();
    let r: serde_json::Value = serde_json::from_str(&env.ckpt(a, &["git", "gc", "--prune=now", "--json"])).unwrap();
    assert!(object_file(&shared, &b_file.manifest).exists(), "a missing repository's file deleted");
    assert_eq!(r["missing"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["pruned"].as_array().map(Vec::len), Some(0), "{r}");
    env.ckpt(a, &["git", "forget", b_git.to_str().unwrap()]);
    let r: serde_json::Value = serde_json::from_str(&env.ckpt(a, &["git", "gc", "--prune=now", "--json"])).unwrap();
    assert!(!object_file(&shared, &b_file.manifest).exists(), "a forgotten repository's file kept");
    assert_eq!(r["missing"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(r["repositories"].as_array().map(Vec::len), Some(1), "{r}");
    restores(&env, a, "model.safetensors", &model(0));
    env.ckpt(&shared, &["verify"]);
}

/// Two repositories share a store (issue 39, item 1): moving one must not lose its weights to
/// a gc run in the other. gc keeps every stored file while a registered repository is missing,
/// names it, and forgets it only when told (`ckpt git forget`) or after the stated grace period.
#[test]
fn moving_a_repository_that_shares_the_store_keeps_its_weights() {
    let env = GitEnv::new();
    let shared = env.path("shared");
    let repos = sharing_a_store(&env, &shared, ["sA", "sB"]);
    let (a, b) = (&repos[0], &repos[1]);
    let b_file = pointer_at(&env, b, "HEAD:model.safetensors");
    let moved = env.path("sB2");
    std::fs::rename(b, &moved).unwrap();

    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), a, &["git", "gc", "--prune=now"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("/sB/.git") && err.contains("missing since") && err.contains("ckpt git forget"), "{err}");
    assert!(object_file(&shared, &b_file.manifest).exists(), "gc deleted the moved repository's weights");
    restores(&env, &moved, "model.safetensors", &model(5));

    // Used at its new place, it registers again; the old path is forgotten on request, and
    // what the repository reaches from its new path is kept.
    env.ckpt(&moved, &["git", "forget", b.join(".git").to_str().unwrap()]);
    let r: serde_json::Value = serde_json::from_str(&env.ckpt(a, &["git", "gc", "--prune=now", "--json"])).unwrap();
    assert_eq!(r["missing"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(r["repositories"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(object_file(&shared, &b_file.manifest).exists(), "gc deleted the moved repository's weights");
    restores(&env, &moved, "model.safetensors", &model(5));

    // A repository that exists and uses the store is not forgotten.
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), a, &["git", "forget", moved.to_str().unwrap()]);
    assert!(!o.status.success(), "forgot a live user");
    // Nor is a path no repository was registered at.
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), a, &["git", "forget", "/nowhere/.git"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("not registered"));

    // Missing for longer than the grace period: forgotten, and its file freed.
    std::fs::remove_dir_all(&moved).unwrap();
    env.ckpt(a, &["git", "gc", "--dry-run"]);
    let users = shared.join(".ckpt").join(ckpt::git_filter::USERS_DIR);
    assert!(
        std::fs::read_dir(&users).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".missing")),
        "a dry run wrote"
    );
    env.ckpt(a, &["git", "gc", "--prune=now"]);
    let records: Vec<PathBuf> = std::fs::read_dir(&users)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".missing"))
        .collect();
    assert_eq!(records.len(), 1, "the time it went missing is recorded");
    assert!(object_file(&shared, &b_file.manifest).exists());
    let long_ago = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        - ckpt::git_filter::MISSING_USER_GRACE.as_secs()
        - 60;
    std::fs::write(&records[0], format!("{long_ago}\n")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&env.ckpt(a, &["git", "gc", "--prune=now", "--json"])).unwrap();
    assert_eq!(r["pruned"].as_array().map(Vec::len), Some(1), "{r}");
    assert!(!object_file(&shared, &b_file.manifest).exists(), "kept past the grace period");
    assert!(!records[0].exists());
    env.ckpt(&shared, &["verify"]);
}

#[test]
fn two_gcs_in_the_same_second_leave_a_store_git_can_use() {
    let env = GitEnv::new();
    let dir = repo_with_epoch0(&env, "r");
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    // Two gcs of the same files build the same root version when they run in the same second.
    let mut same_second = false;
    for _ in 0..10 {
        let t0 = now();
        env.ckpt(&dir, &["git", "gc", "--prune=now"]);
        env.ckpt(&dir, &["git", "gc", "--prune=now"]);
        if now() == t0 {
            same_second = true;
            break;
        }
    }
    assert!(same_second, "never two gcs in one second (a very slow machine)");
    env.git(&dir, &["status", "--porcelain"]);
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["add", "model.safetensors"]);
    env.git(&dir, &["commit", "-qm", "epoch 1"]);
    env.git(&dir, &["stash", "list"]);
    env.ckpt(&dir.join(".git/ckpt"), &["verify"]);
    restores(&env, &dir, "model.safetensors", &model(1));
}

#[test]
fn a_clean_writes_what_its_file_needs_not_a_listing_of_every_path() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    let n = 150;
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i:03}.bin")), format!("small file {i}\n").repeat(8)).unwrap();
    }
    env.git(&dir, &["add", "-A"]);
    let store = dir.join(".git/ckpt");
    let files = objects(&store);
    // Per file: its blob, its manifest, one version naming it (each a few hundred bytes).
    let largest = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).max().unwrap();
    assert!(largest < 2048, "an object of {largest} bytes: a version lists every path stored before");
    let total = bytes_of(&files);
    assert!(total < n * 1500, "{total} bytes of objects for {n} small files");
    // Each file restores, and a second content of one of them is stored and restored too.
    env.git(&dir, &["commit", "-qm", "files"]);
    restores(&env, &dir, "f007.bin", "small file 7\n".repeat(8).as_bytes());
    std::fs::write(dir.join("f007.bin"), "changed").unwrap();
    env.git(&dir, &["commit", "-qam", "changed"]);
    restores(&env, &dir, "f007.bin", b"changed");
    env.ckpt(&dir, &["git", "gc", "--prune=now"]);
    restores(&env, &dir, "f100.bin", "small file 100\n".repeat(8).as_bytes());
    env.git(&dir, &["checkout", "-q", "HEAD~1"]);
    assert_eq!(std::fs::read(dir.join("f007.bin")).unwrap(), "small file 7\n".repeat(8).as_bytes());
    env.ckpt(&store, &["verify"]);
}

#[test]
fn first_uses_of_a_new_shared_store_race_safely() {
    let env = GitEnv::new();
    let n = 6;
    let repos: Vec<PathBuf> = (0..n)
        .map(|i| {
            let dir = env.repo(&format!("r{i}"));
            std::fs::write(dir.join("model.safetensors"), model(i)).unwrap();
            dir
        })
        .collect();
    for round in 0..3 {
        let shared = env.path(&format!("shared{round}"));
        for dir in &repos {
            env.git(dir, &["config", "ckpt.store", shared.to_str().unwrap()]);
        }
        let children: Vec<_> = repos
            .iter()
            .map(|dir| env.command("git", dir, &["add", "-f", "model.safetensors"]).output_async())
            .collect();
        for (c, dir) in children.into_iter().zip(&repos) {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{}: {}", dir.display(), String::from_utf8_lossy(&o.stderr));
        }
        env.ckpt(&shared, &["verify"]);
        for dir in &repos {
            env.git(dir, &["rm", "-q", "--cached", "model.safetensors"]);
        }
    }
}

/// `spawn` with captured output, for processes run at once.
trait OutputAsync {
    fn output_async(self) -> std::process::Child;
}

impl OutputAsync for std::process::Command {
    fn output_async(mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}

/// Flips a byte near the end of every object file larger than 4 KiB under `store` (the
/// blobs of the test's weight tensors), as a bad disk would.
fn damage_blobs(objects_dir: &Path) {
    let mut n = 0;
    let files = std::fs::read_dir(objects_dir).unwrap().flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap());
    for f in files.map(|f| f.unwrap().path()) {
        if std::fs::metadata(&f).unwrap().len() > 4096 {
            let mut bytes = std::fs::read(&f).unwrap();
            let at = bytes.len() - 3;
            bytes[at] ^= 0x40;
            std::fs::write(&f, bytes).unwrap();
            n += 1;
        }
    }
    assert!(n > 0, "no blob damaged");
}

#[test]
fn a_damaged_object_in_the_origin_store_is_refused_and_the_ckpt_remote_copy_used() {
    let env = GitEnv::new();
    let remote = env.path("weights");
    let a = three_epochs_with_origin(&env, "a", remote.to_str().unwrap());
    env.git(&a, &["push", "-q", "origin", "main"]);
    let newest = pointer_at(&env, &a, "HEAD:model.safetensors");
    let a_store = a.join(".git/ckpt");
    damage_blobs(&a_store.join(".ckpt/objects"));
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);

    // A clone of `a` (its store is the first source) smudges from the remote's good copy.
    env.git(env.tmp.path(), &["clone", "-q", a.to_str().unwrap(), "b"]);
    let b = env.path("b");
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(2));
    env.ckpt(&b.join(".git/ckpt"), &["verify"]);

    // No good copy anywhere: a clear error naming the file and both sources, no wrong bytes.
    damage_blobs(&remote.join("objects"));
    let o = env.run("git", env.tmp.path(), &["clone", "-q", a.to_str().unwrap(), "c"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&newest.manifest.to_hex())
            && err.contains(a_store.to_str().unwrap())
            && err.contains("ckpt remote"),
        "{err}"
    );
    let c_file = env.path("c").join("model.safetensors");
    assert!(
        !c_file.exists()
            || std::fs::read(&c_file).unwrap() != model(2) && std::fs::metadata(&c_file).unwrap().len() < 300
    );
}

#[test]
fn git_log_p_and_git_diff_in_a_clone_leave_its_store_as_it_was() {
    let env = GitEnv::new();
    let a = env.repo("a");
    env.git(&a, &["add", ".gitattributes"]);
    env.git(&a, &["commit", "-qm", "attributes"]);
    for epoch in 0..4 {
        std::fs::write(a.join("model.safetensors"), model(epoch)).unwrap();
        env.git(&a, &["add", "model.safetensors"]);
        env.git(&a, &["commit", "-qm", &format!("epoch {epoch}")]);
    }
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    env.git(env.tmp.path(), &["clone", "-q", a.to_str().unwrap(), "b"]);
    let b = env.path("b");
    let store = b.join(".git/ckpt");
    let before = objects(&store);
    env.git(&b, &["log", "-p"]);
    env.git(&b, &["log", "-p", "--ext-diff"]);
    env.git(&b, &["diff", "HEAD~3", "HEAD"]);
    env.git(&b, &["show", "HEAD~2"]);
    assert_eq!(objects(&store), before, "reading history grew the clone's store");
    // A checkout keeps what it wrote (the clone works without its origin afterwards).
    env.git(&b, &["checkout", "-q", "HEAD~3"]);
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(0));
    assert!(objects(&store).len() > before.len());
    std::fs::remove_dir_all(&a).unwrap();
    restores(&env, &b, "model.safetensors", &model(0));
}
