//! Weights through a ckpt remote with the real `git` binary: `git push` runs the pre-push hook,
//! which uploads the objects of the pushed pointers; a clone with no store of its own smudges
//! them from the remote (named by a committed `.ckptconfig`), verified and bit-exact. Also a
//! push failing when the remote cannot be reached, and the same round trip through a real
//! S3-protocol server (`s3s-fs`).

use crate::support::git::three_epochs_with_origin;
use crate::support::git::{model, status_is_clean, GitEnv};
use std::path::Path;
use std::process::Stdio;

fn object_files(root: &Path) -> usize {
    let Ok(fans) = std::fs::read_dir(root) else { return 0 };
    fans.flatten()
        .filter(|f| f.path().is_dir())
        .map(|f| std::fs::read_dir(f.path()).map_or(0, |d| d.flatten().filter(|e| e.path().is_file()).count()))
        .sum()
}

/// Pushes from a repository, clones into `b` with no shared store, and checks every epoch
/// bit-exact there. `extra_env` is the remote's environment (S3 settings).
fn push_then_clone(env: &GitEnv, remote_url: &str, extra_env: &[(&str, String)], remote_objects: &Path) {
    let git = |dir: &Path, args: &[&str]| {
        let mut c = env.command("git", dir, args);
        for (k, v) in extra_env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let a = three_epochs_with_origin(env, "a", remote_url);
    let pushed = git(&a, &["push", "-q", "origin", "main"]);
    assert!(pushed.contains("uploaded"), "{pushed}");
    // Three versions' worth of objects: whole newest, deltas or wholes for the older ones.
    let uploaded = object_files(remote_objects);
    assert!(uploaded >= 3 * 2, "{uploaded} objects on the remote");
    // Pushing again sends nothing (a new branch at the same commit: every commit is "new" to
    // the hook, the remote already has every file).
    let again = git(&a, &["push", "-q", "origin", "main:other"]);
    assert!(again.contains("3 already on") && again.contains("uploaded 0 objects"), "{again}");
    assert_eq!(object_files(remote_objects), uploaded);

    // A clone: the filter installed globally (a fresh clone has no config of its own), the
    // origin a bare repository (no store there to read), so every object comes from the remote.
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    git(env.tmp.path(), &["clone", "-q", env.path("origin.git").to_str().unwrap(), "b"]);
    let b = env.path("b");
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(2));
    status_is_clean(env, &b);
    for (rev, epoch) in [("main~1", 1), ("main~2", 0)] {
        git(&b, &["checkout", "-q", rev]);
        assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(epoch), "{rev}");
        status_is_clean(env, &b);
    }
    env.ckpt(&b.join(".git/ckpt"), &["verify"]);

    // A clone that leaves pointers (CKPT_SKIP_SMUDGE=1): `ckpt git checkout` fetches the file.
    let mut c = env.command("git", env.tmp.path(), &["clone", "-q", env.path("origin.git").to_str().unwrap(), "c"]);
    c.env("CKPT_SKIP_SMUDGE", "1");
    assert!(c.output().unwrap().status.success());
    let c_dir = env.path("c");
    assert!(std::fs::read(c_dir.join("model.safetensors")).unwrap().starts_with(b"version ckpt/1\n"));
    let mut checkout = env.command(env!("CARGO_BIN_EXE_ckpt"), &c_dir, &["git", "checkout"]);
    for (k, v) in extra_env {
        checkout.env(k, v);
    }
    let o = checkout.output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read(c_dir.join("model.safetensors")).unwrap(), model(2));
    status_is_clean(env, &c_dir);
}

#[test]
fn the_pre_push_hook_uploads_weights_and_a_clone_smudges_them_from_a_directory_remote() {
    let env = GitEnv::new();
    let remote = env.path("weights");
    push_then_clone(&env, remote.to_str().unwrap(), &[], &remote.join("objects"));
    // The pre-push marked the remote as a git filter's: `ckpt gc --remote` refuses it, since
    // no ckpt ref names what git's pointers need.
    assert!(remote.join(ckpt::sync::GIT_FILTER_MARKER).is_file());
    let other = env.path("other");
    std::fs::create_dir(&other).unwrap();
    assert!(env.command(env!("CARGO_BIN_EXE_ckpt"), &other, &["init"]).output().unwrap().status.success());
    let add = ["remote", "add", "weights", remote.to_str().unwrap()];
    assert!(env.command(env!("CARGO_BIN_EXE_ckpt"), &other, &add).output().unwrap().status.success());
    let before = object_files(&remote.join("objects"));
    let gc = ["gc", "--remote", "weights", "--prune=now"];
    let o = env.command(env!("CARGO_BIN_EXE_ckpt"), &other, &gc).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("git repository"), "{o:?}");
    assert_eq!(object_files(&remote.join("objects")), before);
    // A file the remote lost: the checkout fails naming the file and the remote, and leaves no
    // wrong bytes.
    let b = env.path("b");
    std::fs::remove_dir_all(b.join(".git/ckpt")).unwrap();
    std::fs::remove_dir_all(remote.join("objects")).unwrap();
    std::fs::create_dir(remote.join("objects")).unwrap();
    std::fs::remove_file(b.join("model.safetensors")).unwrap();
    let o = env.run("git", &b, &["checkout", "--", "model.safetensors"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("model.safetensors") && err.contains("ckpt remote") && err.contains("does not exist"),
        "{err}"
    );
    assert!(!b.join("model.safetensors").exists() || std::fs::read(b.join("model.safetensors")).unwrap().len() < 300);
}

/// Bytes of the object files under `root` (a directory remote's `objects/`).
fn object_bytes(root: &Path) -> u64 {
    let Ok(fans) = std::fs::read_dir(root) else { return 0 };
    fans.flatten()
        .filter(|f| f.path().is_dir())
        .flat_map(|f| std::fs::read_dir(f.path()).unwrap().flatten())
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Bytes the hook reports it uploaded (`git push` shows the hook's stderr).
fn uploaded_bytes(env: &GitEnv, dir: &Path, args: &[&str]) -> String {
    let o = env.run("git", dir, args);
    assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_pre_push_hook_sends_the_next_epoch_as_deltas_and_a_clone_smudges_both_bit_exact() {
    let env = GitEnv::new();
    let remote = env.path("weights");
    let objects = remote.join("objects");
    let a = env.repo("a");
    std::fs::write(a.join(".ckptconfig"), format!("[ckpt]\n\tremote = {}\n", remote.display())).unwrap();
    env.git(env.tmp.path(), &["init", "-q", "--bare", "-b", "main", "origin.git"]);
    env.git(&a, &["remote", "add", "origin", env.path("origin.git").to_str().unwrap()]);
    // Forward deltas on the wire: the deltas layout (the mirror layout's hook is tested in
    // remote_layout.rs).
    env.git(&a, &["config", "ckpt.layout", "deltas"]);
    let commit_epoch = |epoch: u32| {
        std::fs::write(a.join("model.safetensors"), model(epoch)).unwrap();
        env.git(&a, &["add", "-A"]);
        env.git(&a, &["commit", "-qm", &format!("epoch {epoch}")]);
    };

    commit_epoch(0);
    let first_log = uploaded_bytes(&env, &a, &["push", "-q", "origin", "main"]);
    let first = object_bytes(&objects);
    assert!(first > 0, "{first_log}");

    // The next epoch: git gives the hook the remote's commit, whose pointer names the file the
    // remote holds; the changed tensors go up as deltas against it.
    commit_epoch(1);
    let second_log = uploaded_bytes(&env, &a, &["push", "-q", "origin", "main"]);
    let second = object_bytes(&objects) - first;
    assert!(second > 0 && second * 2 < first, "second push {second} bytes, first {first}: {second_log}");

    // A new branch: no remote commit for it, so the file of refs/remotes/origin/main (epoch 1)
    // is the reference.
    env.git(&a, &["checkout", "-qb", "feature"]);
    commit_epoch(2);
    let before = object_bytes(&objects);
    let third_log = uploaded_bytes(&env, &a, &["push", "-q", "origin", "feature"]);
    let third = object_bytes(&objects) - before;
    assert!(third > 0 && third * 2 < first, "new-branch push {third} bytes, first {first}: {third_log}");

    // A fresh clone (no store to share) smudges every epoch from the remote, bit-exact, each
    // delta fetched after the blob it is coded against.
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    env.git(env.tmp.path(), &["clone", "-q", "-b", "feature", env.path("origin.git").to_str().unwrap(), "b"]);
    let b = env.path("b");
    for (rev, epoch) in [("feature", 2), ("main", 1), ("main~1", 0)] {
        env.git(&b, &["checkout", "-q", rev]);
        assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(epoch), "{rev}");
        status_is_clean(&env, &b);
    }
    env.ckpt(&b.join(".git/ckpt"), &["verify"]);
    // Another clone that smudges the newest epoch alone fetches its chain with it.
    env.git(env.tmp.path(), &["clone", "-q", "-b", "feature", env.path("origin.git").to_str().unwrap(), "c"]);
    assert_eq!(std::fs::read(env.path("c").join("model.safetensors")).unwrap(), model(2));
}

#[test]
fn a_push_fails_when_the_ckpt_remote_cannot_be_reached_and_no_remote_is_a_note() {
    let env = GitEnv::new();
    // A directory remote under a regular file: it cannot be created.
    std::fs::write(env.path("not-a-dir"), b"x").unwrap();
    let a = three_epochs_with_origin(&env, "a", env.path("not-a-dir/weights").to_str().unwrap());
    let o = env.run("git", &a, &["push", "-q", "origin", "main"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ckpt remote") && err.contains("not-a-dir/weights"), "{err}");
    // git aborted the push: the bare repository has no branch.
    assert_eq!(env.git(&env.path("origin.git"), &["branch", "--list"]), "");

    // No ckpt remote at all: the push goes through, with a note.
    env.git(&a, &["rm", "-q", ".ckptconfig"]);
    env.git(&a, &["commit", "-qm", "no remote"]);
    let o = env.run("git", &a, &["push", "-q", "origin", "main"]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no ckpt remote configured"), "{o:?}");
    // git config ckpt.remote overrides .ckptconfig (here: supplies it).
    let remote = env.path("weights");
    env.git(&a, &["config", "ckpt.remote", remote.to_str().unwrap()]);
    std::fs::write(a.join("model.safetensors"), model(9)).unwrap();
    env.git(&a, &["commit", "-qam", "epoch 9"]);
    env.git(&a, &["push", "-q", "origin", "main"]);
    assert!(object_files(&remote.join("objects")) > 0);
}

#[test]
fn pre_push_input_that_is_not_git_s_is_a_clear_error() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    for (input, message) in [
        ("refs/heads/main abc refs/heads/main def\n", "a bad object id"),
        ("one two three\n", "expected `<local ref> <local sha> <remote ref> <remote sha>`"),
    ] {
        let mut c = env.command(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "pre-push", "origin", "x"]);
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("pre-push input line 1") && err.contains(message), "{err}");
    }
}

// ---- the same through S3 --------------------------------------------------------------------

#[test]
fn the_pre_push_hook_and_smudge_work_through_s3() {
    // The s3s-fs server of tests/it/support/remote.rs, with its credentials in `served.env`.
    let Some(served) = crate::support::remote::s3() else { return };
    let env = GitEnv::new();
    push_then_clone(&env, &served.url, &served.env, &served.objects);
}
