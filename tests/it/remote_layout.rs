//! Remote layouts (docs/format.md, "Remotes"), through the `ckpt` binary against a directory
//! remote and a real S3-protocol server (`s3s-fs`; skipped with a message when it is not
//! installed, a failure with `CKPT_REQUIRE_S3S=1`): in the mirror layout (the default) the
//! remote's newest version is whole and older ones are reverse deltas, so `clone --depth 1`
//! downloads one checkpoint; in the deltas layout new blobs go up as forward deltas and nothing
//! is replaced. Both: a full clone is bit-exact for every version, a second push uploads
//! nothing. Mirror recodes under concurrency: two pushers of branches sharing tensors, a reader
//! cloning while a pusher recodes, and a push that fails between uploading the new blobs and
//! replacing the parent's (the journal lets the rerun finish).

use crate::support::git::{model as git_model, GitEnv};
use crate::support::layout::{remote_objects, version_blobs, version_objects};
use crate::support::remote::{directory, json, s3, NoRecodes, Served};
use crate::support::repo_util::{read_tree, stderr, synthetic_checkpoint, TRAINING_MODEL};
use ckpt::remote::local::DirRemote;
use ckpt::repo::Repo;
use ckpt::sync::PushOptions;
use ckpt::Dtype;
use std::path::Path;

/// Blobs smaller than this may stay whole (a recode must save a 4 KiB block).
const BIG: u64 = 64 << 10;

fn model(epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(26, Dtype::Bf16, TRAINING_MODEL, epoch)
}

fn commit(r: &Served, dir: &Path, bytes: &[u8], message: &str) {
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    r.ok(dir, &["commit", "-m", message, "model.safetensors"]);
}

/// The checkout of `rev` in the repository at `dir`.
fn checkout(r: &Served, dir: &Path, rev: &str) -> Vec<(String, Vec<u8>)> {
    let out = tempfile::tempdir().unwrap();
    r.ok(dir, &["checkout", rev, "--output", out.path().to_str().unwrap()]);
    read_tree(out.path())
}

/// A fresh full clone of the remote, verified; returned for more checks.
fn fresh_clone(r: &Served) -> tempfile::TempDir {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("c");
    r.ok(parent.path(), &["clone", &r.url, dir.to_str().unwrap()]);
    r.ok(&dir, &["verify"]);
    parent
}

/// Epochs 0..4 pushed one by one in `layout`; then the remote's forms, the clones and the
/// second push are checked.
fn series(r: &Served, layout: &str) {
    const EPOCHS: u32 = 4;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    r.ok(dir, &["init"]);
    r.ok(dir, &["remote", "add", "origin", &r.url, "--layout", layout]);
    let listed = String::from_utf8_lossy(&r.ok(dir, &["remote", "-v"]).stdout).into_owned();
    assert!(listed.contains(&format!("layout={layout}")), "{listed}");
    let stored = std::fs::read_to_string(dir.join(".ckpt/remotes")).unwrap();
    assert_eq!(stored.contains("layout"), layout != "mirror", "the default is not written: {stored}");
    for e in 0..EPOCHS {
        commit(r, dir, &model(e), &format!("epoch {e}"));
        let report = json(&r.ok(dir, &["push", "--json"]));
        assert!(report["objects_sent"].as_u64().unwrap() > 0, "{report}");
    }
    let again = json(&r.ok(dir, &["push", "--json"]));
    assert_eq!((again["objects_sent"].as_u64(), again["bytes_sent"].as_u64()), (Some(0), Some(0)), "{again}");

    let objects = remote_objects(&r.objects);
    let big = |id: &ckpt::ObjectId| objects[id].header.raw_len >= BIG;
    let tip = version_blobs(dir, "main");
    match layout {
        "mirror" => {
            for b in &tip {
                assert!(objects[b].header.reference.is_none(), "the newest version's blob {b} is whole");
            }
            for n in 1..EPOCHS {
                let newer = version_blobs(dir, &format!("main~{}", n - 1));
                for b in version_blobs(dir, &format!("main~{n}")).iter().filter(|b| big(b)) {
                    let reference = objects[b].header.reference;
                    assert!(
                        reference.is_some_and(|x| newer.contains(&x)),
                        "main~{n}'s blob {b} is a reverse delta against main~{}'s",
                        n - 1
                    );
                }
            }
            // `clone --depth 1`: one version, whole.
            let whole: u64 = version_objects(dir, "main").iter().map(|id| objects[id].size).sum();
            let parent = tempfile::tempdir().unwrap();
            let shallow = parent.path().join("s");
            let out = r.ok(parent.path(), &["clone", &r.url, shallow.to_str().unwrap(), "--depth", "1", "--json"]);
            let received = json(&out)["bytes_received"].as_u64().unwrap();
            assert!(received * 10 <= whole * 11, "clone --depth 1 took {received} bytes for a version of {whole}");
            assert_eq!(checkout(r, &shallow, "main"), vec![("model.safetensors".to_string(), model(EPOCHS - 1))]);
        }
        _ => {
            assert!(
                tip.iter().filter(|b| big(b)).all(|b| objects[b].header.reference.is_some()),
                "deltas: the newest version went up as forward deltas"
            );
            for b in version_blobs(dir, &format!("main~{}", EPOCHS - 1)) {
                assert!(objects[&b].header.reference.is_none(), "deltas: the first version stays whole");
            }
        }
    }
    let clone = fresh_clone(r);
    for n in 0..EPOCHS {
        let want = vec![("model.safetensors".to_string(), model(EPOCHS - 1 - n))];
        assert!(checkout(r, &clone.path().join("c"), &format!("main~{n}")) == want, "main~{n} differs in the clone");
    }
}

#[test]
fn mirror_layout_on_a_directory_keeps_the_newest_version_whole() {
    series(&directory().unwrap(), "mirror");
}

#[test]
fn mirror_layout_on_s3_keeps_the_newest_version_whole() {
    let Some(r) = s3() else { return };
    series(&r, "mirror");
}

#[test]
fn deltas_layout_on_a_directory_sends_forward_deltas() {
    series(&directory().unwrap(), "deltas");
}

#[test]
fn deltas_layout_on_s3_sends_forward_deltas() {
    let Some(r) = s3() else { return };
    series(&r, "deltas");
}

/// A file of three f32 tensors, tensor `i` at epoch `epochs[i]`.
fn mixed(epochs: [u32; 3]) -> Vec<u8> {
    let shape: &[u64] = &[128, 256];
    let spec: Vec<(String, Dtype, Vec<u64>)> = (0..3).map(|i| (format!("t{i}"), Dtype::F32, shape.to_vec())).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).unwrap();
    for (i, e) in epochs.iter().enumerate() {
        for x in crate::support::repo_util::weights(100 + i as u64, 128 * 256, *e) {
            file.extend_from_slice(&x.to_le_bytes());
        }
    }
    file
}

/// Runs `ckpt push` in each `(dir, args)` at once; all must succeed.
fn push_at_once(r: &Served, pushes: &[(&Path, &[&str])]) {
    let children: Vec<_> = pushes
        .iter()
        .map(|(dir, args)| {
            let mut c = crate::support::repo_util::ckpt_command(dir, args);
            for (k, v) in &r.env {
                c.env(k, v);
            }
            c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "push failed: {}", stderr(&out));
    }
}

/// Two pushers of two branches whose files share tensors, one branch going back to tensor
/// contents the other moved on from, pushing at the same time, round after round: after each
/// round a fresh clone verifies and holds both tips exactly.
fn concurrent_pushers(r: &Served) {
    let a_work = tempfile::tempdir().unwrap();
    let a = a_work.path();
    r.ok(a, &["init"]);
    r.ok(a, &["remote", "add", "origin", &r.url]);
    commit(r, a, &mixed([0, 0, 0]), "base");
    r.ok(a, &["push"]);
    let b_parent = tempfile::tempdir().unwrap();
    let b = b_parent.path().join("b");
    r.ok(b_parent.path(), &["clone", &r.url, b.to_str().unwrap()]);
    for (dir, branch) in [(a, "a"), (b.as_path(), "b")] {
        r.ok(dir, &["branch", branch]);
        r.ok(dir, &["switch", branch]);
    }
    for round in 1..=3u32 {
        // `a` moves t0 and t1 forward; `b` sets t0 to contents `a` had or will have, and t2.
        let a_file = mixed([round, round, 0]);
        let b_file = mixed([round ^ 1, 0, round]);
        commit(r, a, &a_file, &format!("a {round}"));
        commit(r, &b, &b_file, &format!("b {round}"));
        push_at_once(r, &[(a, &["push", "origin", "a"]), (&b, &["push", "origin", "b"])]);
        let clone = fresh_clone(r);
        let c = clone.path().join("c");
        let file = |bytes: Vec<u8>| vec![("model.safetensors".to_string(), bytes)];
        assert!(checkout(r, &c, "origin/a") == file(a_file), "round {round}: branch a differs");
        assert!(checkout(r, &c, "origin/b") == file(b_file), "round {round}: branch b differs");
    }
    assert!(std::fs::read_dir(r.objects.parent().unwrap().join("pending")).map_or(true, |d| d.count() == 0));
}

#[test]
fn concurrent_pushers_of_branches_sharing_tensors_keep_a_directory_remote_valid() {
    concurrent_pushers(&directory().unwrap());
}

#[test]
fn concurrent_pushers_of_branches_sharing_tensors_keep_an_s3_remote_valid() {
    let Some(r) = s3() else { return };
    concurrent_pushers(&r);
}

/// Readers clone in a loop while a pusher commits and pushes (recoding the previous version
/// each time): every clone verifies and holds one of the pushed versions exactly.
#[test]
fn readers_racing_recodes_always_clone_an_exact_version() {
    let r = directory().unwrap();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_path_buf();
    r.ok(&dir, &["init"]);
    r.ok(&dir, &["remote", "add", "origin", &r.url]);
    commit(&r, &dir, &model(0), "epoch 0");
    r.ok(&dir, &["push"]);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for e in 1..5 {
                commit(&r, &dir, &model(e), &format!("epoch {e}"));
                r.ok(&dir, &["push"]);
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut clones = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) || clones < 2 {
            let clone = fresh_clone(&r);
            let got = checkout(&r, &clone.path().join("c"), "main");
            assert!(
                (0..5).any(|e| got == vec![("model.safetensors".to_string(), model(e))]),
                "clone {clones} is exact"
            );
            clones += 1;
        }
    });
}

/// A push that dies between uploading the new version and replacing the parent's blobs leaves
/// a valid remote and a journal; the next push (with nothing new to send) finishes the recode.
#[test]
fn a_push_killed_before_its_recodes_leaves_a_valid_remote_and_the_rerun_finishes() {
    let r = directory().unwrap();
    let root = r.objects.parent().unwrap().to_path_buf();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let repo = Repo::init(dir).unwrap();
    let remote = DirRemote::create(&r.url).unwrap();
    let options = PushOptions { transfers: 2, ..PushOptions::default() };
    for e in 0..2 {
        std::fs::write(dir.join("model.safetensors"), model(e)).unwrap();
        repo.commit(&["model.safetensors"], &format!("epoch {e}"), &Default::default()).unwrap();
        if e == 0 {
            ckpt::sync::push_to(&repo, &remote, &options).unwrap();
        }
    }
    let killed = NoRecodes(Box::new(DirRemote::open(&r.url).unwrap()));
    assert!(ckpt::sync::push_to(&repo, &killed, &options).is_err(), "the push dies at its first recode");
    let tip = repo.resolve("main").unwrap();
    assert_eq!(std::fs::read_to_string(root.join("refs/heads/main")).unwrap(), format!("{tip}\n"));
    assert!(root.join("pending").join(tip.to_hex()).is_file(), "the journal is there");
    let parent_blobs: Vec<_> = version_blobs(dir, "main~1");
    let objects = remote_objects(&r.objects);
    assert!(parent_blobs.iter().all(|b| objects[b].header.reference.is_none()), "nothing was recoded");
    drop(fresh_clone(&r));

    let rerun = ckpt::sync::push_to(&repo, &remote, &options).unwrap();
    assert!(rerun.objects_recoded > 0, "{rerun:?}");
    let objects = remote_objects(&r.objects);
    for b in parent_blobs.iter().filter(|b| objects[b].header.raw_len >= BIG) {
        assert!(objects[b].header.reference.is_some(), "the parent's blob {b} is a delta after the rerun");
    }
    assert!(!root.join("pending").join(tip.to_hex()).exists(), "the journal is gone");
    let again = ckpt::sync::push_to(&repo, &remote, &options).unwrap();
    assert_eq!((again.objects_sent, again.bytes_sent), (0, 0), "{again:?}");
    let clone = fresh_clone(&r);
    let c = clone.path().join("c");
    for (n, e) in [(0, 1), (1, 0)] {
        let want = vec![("model.safetensors".to_string(), model(e))];
        assert!(checkout(&r, &c, &format!("main~{n}")) == want);
    }
}

/// The pointer `git` holds for `model.safetensors` at `rev` in `dir`.
fn pointer_at(env: &GitEnv, dir: &Path, rev: &str) -> ckpt::git_filter::Pointer {
    let text = env.git(dir, &["cat-file", "blob", &format!("{rev}:model.safetensors")]);
    ckpt::git_filter::Pointer::parse(text.as_bytes()).unwrap()
}

/// The git pre-push hook in the mirror layout (the default): each push uploads the new file
/// whole and recodes the file the remote had at that path as a delta against it; a clone
/// smudges every epoch bit-exact from the remote, reading one file's size for the newest.
#[test]
fn the_git_pre_push_hook_keeps_the_newest_file_whole_on_the_remote() {
    let env = GitEnv::new();
    let weights = env.path("weights");
    let a = env.repo("a");
    std::fs::write(a.join(".ckptconfig"), format!("[ckpt]\n\tremote = {}\n", weights.display())).unwrap();
    env.git(env.tmp.path(), &["init", "-q", "--bare", "-b", "main", "origin.git"]);
    env.git(&a, &["remote", "add", "origin", env.path("origin.git").to_str().unwrap()]);
    for epoch in 0..3 {
        std::fs::write(a.join("model.safetensors"), git_model(epoch)).unwrap();
        env.git(&a, &["add", "-A"]);
        env.git(&a, &["commit", "-qm", &format!("epoch {epoch}")]);
        env.git(&a, &["push", "-q", "origin", "main"]);
    }
    assert!(std::fs::read_dir(weights.join("pending")).map_or(true, |d| d.count() == 0), "no journal left");
    let store = a.join(".git/ckpt");
    let objects = remote_objects(&weights.join("objects"));
    let blobs = |rev: &str| -> Vec<ckpt::ObjectId> {
        let repo = Repo::open(&store).unwrap();
        repo.manifest(&pointer_at(&env, &a, rev).manifest).unwrap().blobs().collect()
    };
    for b in blobs("main") {
        assert!(objects[&b].header.reference.is_none(), "the newest file's blob {b} is whole");
    }
    for (rev, newer) in [("main~1", "main"), ("main~2", "main~1")] {
        let newer = blobs(newer);
        for b in blobs(rev).iter().filter(|b| objects[*b].header.raw_len >= BIG) {
            let reference = objects[b].header.reference;
            assert!(reference.is_some_and(|x| newer.contains(&x)), "{rev}'s blob {b} is a delta against the next file");
        }
    }
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    env.git(env.tmp.path(), &["clone", "-q", env.path("origin.git").to_str().unwrap(), "b"]);
    let b = env.path("b");
    for (rev, epoch) in [("main", 2), ("main~1", 1), ("main~2", 0)] {
        env.git(&b, &["checkout", "-q", rev]);
        assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), git_model(epoch), "{rev}");
    }
    env.ckpt(&b.join(".git/ckpt"), &["verify"]);
}
