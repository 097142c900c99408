//! `ckpt prune --keep-last N`: the newest versions of a branch stay (bit-exact), the rest of
//! its history goes and its space is freed, except what another root (a tag, another branch,
//! a remote-tracking ref) still needs; walks over history stop where it was pruned.

use crate::support::repo_util::{ok, refused, synthetic_checkpoint, TestRepo, SMALL_MODEL};
use ckpt::repo::{CommitOptions, Config, DeltaPolicy, Error, GcOptions, PruneOptions, PruneReport, Repo, VersionId};
use ckpt::Dtype;
use std::path::PathBuf;

const FILE: &str = "model.safetensors";

/// Commits `n` epochs of a small model (one version each); returns each version with its file.
fn epochs(t: &TestRepo, repo: &Repo, n: u32, options: &CommitOptions) -> Vec<(VersionId, Vec<u8>)> {
    (0..n)
        .map(|e| {
            let bytes = synthetic_checkpoint(7, Dtype::F32, SMALL_MODEL, e);
            t.write(FILE, &bytes);
            let options = CommitOptions { time: Some(1_700_000_000 + e as i64), ..options.clone() };
            (repo.commit(&[FILE], &format!("epoch {e}"), &options).unwrap(), bytes)
        })
        .collect()
}

/// Bytes of all object files.
fn store_bytes(t: &TestRepo) -> u64 {
    t.object_files().iter().map(|f| std::fs::metadata(f).unwrap().len()).sum()
}

fn now(branches: &[&str]) -> PruneOptions {
    PruneOptions {
        branches: branches.iter().map(|b| b.to_string()).collect(),
        dry_run: false,
        gc: Some(GcOptions::now()),
    }
}

/// Asserts `id` checks out as `bytes`.
fn checks_out(t: &TestRepo, repo: &Repo, id: &VersionId, bytes: &[u8]) {
    let files = t.checkout_all(repo, &id.to_hex());
    assert_eq!(files, vec![(FILE.to_string(), bytes.to_vec())], "version {id}");
}

fn assert_dropped(repo: &Repo, id: &VersionId) {
    let out = tempfile::tempdir().unwrap();
    match repo.checkout(&id.to_hex(), None, Some(out.path()), None) {
        Err(Error::VersionPruned { version }) => assert_eq!(version, *id),
        other => panic!("checkout of dropped {id}: {other:?}"),
    }
}

fn dropped_ids(r: &PruneReport) -> Vec<VersionId> {
    r.dropped.iter().map(|v| v.id).collect()
}

#[test]
fn keep_last_keeps_the_newest_bit_exact_and_frees_the_rest() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 6, &CommitOptions::default());
    let before = store_bytes(&t);

    let r = repo.prune(3, &now(&[])).unwrap();
    // Newest first, in history order.
    assert_eq!(dropped_ids(&r), vec![v[2].0, v[1].0, v[0].0]);
    assert!(r.kept_by.is_empty());
    assert_eq!(r.branches[0].cut, Some(v[3].0));
    assert_eq!(r.branches[0].kept, 3);
    assert!(r.gc.bytes_freed > 0);
    let after = store_bytes(&t);
    assert!(after < before, "{after} >= {before}");
    assert_eq!(before - after, r.gc.bytes_freed + r.recoded_bytes_after - r.recoded_bytes_before);

    for (id, bytes) in &v[3..] {
        checks_out(&t, &repo, id, bytes);
    }
    for (id, _) in &v[..3] {
        assert_dropped(&repo, id);
        assert!(!repo.store().contains(id));
    }
    let log: Vec<VersionId> = repo.log("HEAD").unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(log, vec![v[5].0, v[4].0, v[3].0]);
    assert!(repo.history_pruned_at(&v[3].0).unwrap());
    assert!(!repo.history_pruned_at(&v[4].0).unwrap());
    match repo.resolve("HEAD~3") {
        Err(Error::UnknownRevision { reason, .. }) => assert!(reason.contains("ckpt prune"), "{reason}"),
        other => panic!("HEAD~3 after pruning to 3: {other:?}"),
    }
    assert_eq!(repo.resolve("HEAD~2").unwrap(), v[3].0);
    let verify = repo.verify().unwrap();
    assert!(verify.is_ok(), "{verify:?}");
    assert_eq!(verify.versions_checked, 3);

    // The next commit builds on the pruned history as on any other.
    let next = synthetic_checkpoint(7, Dtype::F32, SMALL_MODEL, 6);
    let id = t.commit_files(&repo, &[(FILE, &next)], "epoch 6");
    checks_out(&t, &repo, &id, &next);
    assert_eq!(repo.log("HEAD").unwrap().len(), 4);
    assert!(repo.gc_with(&GcOptions::now()).unwrap().deleted == 0, "gc after prune finds nothing more");
}

/// Another branch and a detached HEAD keep their history; a tag keeps its own version (it
/// marks one checkpoint: tagging saves must not make a prune keep everything).
#[test]
fn tags_keep_their_version_other_branches_and_a_detached_head_their_history() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 8, &CommitOptions::default());
    repo.tag("best", Some(&v[4].0.to_hex())).unwrap();
    repo.create_branch("side", Some(&v[2].0.to_hex())).unwrap();
    // A detached HEAD, as `ckpt checkout` of a version leaves it.
    std::fs::write(t.path(".ckpt/HEAD"), format!("{}\n", v[0].0)).unwrap();
    let err = refused(&t, &["prune", "--keep-last", "2"]);
    assert!(err.contains("HEAD is detached"), "{err}");

    let dry = ok(&t, &["prune", "--keep-last", "2", "--branch", "main", "--dry-run"]);
    assert!(
        dry.contains(&format!("kept {} ", v[4].0.short(12))) && dry.contains("(needed by refs/tags/best)"),
        "{dry}"
    );
    assert!(dry.contains("(needed by HEAD)"), "{dry}");
    let r = repo.prune(2, &now(&["main"])).unwrap();
    assert_eq!(dropped_ids(&r), vec![v[5].0, v[3].0]);
    let kept: Vec<(VersionId, &str)> = r.kept_by.iter().map(|k| (k.id, k.root.as_str())).collect();
    assert_eq!(
        kept,
        vec![(v[4].0, "refs/tags/best"), (v[2].0, "refs/heads/side"), (v[1].0, "refs/heads/side"), (v[0].0, "HEAD"),]
    );
    for (id, bytes) in [&v[0], &v[1], &v[2], &v[4], &v[6], &v[7]] {
        checks_out(&t, &repo, id, bytes);
    }
    assert_dropped(&repo, &v[5].0);
    assert_dropped(&repo, &v[3].0);
    // The branches' histories are whole; main's ends at its oldest kept version, the tag's at
    // its version.
    assert_eq!(repo.log("best").unwrap().len(), 1);
    assert_eq!(repo.log("side").unwrap().len(), 3);
    assert_eq!(repo.log("HEAD").unwrap().len(), 1);
    assert_eq!(repo.log("main").unwrap().len(), 2);
    assert!(repo.verify().unwrap().is_ok());
}

/// A remote-tracking ref names a version its remote holds with its history: it keeps that
/// version here, not the history (a branch that was pushed prunes like one that was not).
#[test]
fn a_remote_tracking_ref_keeps_its_version_and_leaves_the_history_to_its_remote() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 4, &CommitOptions::default());
    let tracking = t.path(".ckpt/refs/remotes/origin/main");
    std::fs::create_dir_all(tracking.parent().unwrap()).unwrap();
    std::fs::write(&tracking, format!("{}\n", v[2].0)).unwrap();
    let before = store_bytes(&t);
    let r = repo.prune(1, &now(&[])).unwrap();
    assert_eq!(dropped_ids(&r), vec![v[1].0, v[0].0]);
    let kept: Vec<(VersionId, &str)> = r.kept_by.iter().map(|k| (k.id, k.root.as_str())).collect();
    assert_eq!(kept, vec![(v[2].0, "refs/remotes/origin/main")]);
    assert!(store_bytes(&t) < before);
    // main's history now ends at the version the remote-tracking ref keeps.
    assert_eq!(repo.log("HEAD").unwrap().len(), 2);
    assert_eq!(repo.log("origin/main").unwrap().len(), 1);
    checks_out(&t, &repo, &v[2].0, &v[2].1);
    checks_out(&t, &repo, &v[3].0, &v[3].1);
    assert!(repo.verify().unwrap().is_ok());
}

#[test]
fn dry_run_changes_nothing_and_says_what_the_prune_does() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 5, &CommitOptions::default());
    let objects = t.object_files();
    let dry = repo.prune(2, &PruneOptions { dry_run: true, ..now(&[]) }).unwrap();
    assert!(dry.dry_run);
    assert_eq!(t.object_files(), objects);
    assert!(!t.path(".ckpt/pruned").exists());
    assert_eq!(repo.log("HEAD").unwrap().len(), 5);
    let out = ok(&t, &["prune", "--keep-last", "2", "--dry-run", "--prune=now"]);
    assert!(out.contains("would drop 3 versions"), "{out}");
    assert_eq!(t.object_files(), objects);

    let real = repo.prune(2, &now(&[])).unwrap();
    assert_eq!(dropped_ids(&dry), dropped_ids(&real));
    assert_eq!(dropped_ids(&real), vec![v[2].0, v[1].0, v[0].0]);
    assert_eq!((dry.gc.deleted, dry.gc.bytes_freed), (real.gc.deleted, real.gc.bytes_freed));
}

#[test]
fn previous_policy_recodes_the_oldest_kept_version_whole_so_the_dropped_bases_go() {
    let config = Config { delta_policy: DeltaPolicy::Previous, ..Config::default() };
    let t = TestRepo::with_config(&config);
    let repo = t.open();
    let v = epochs(&t, &repo, 6, &CommitOptions::default());
    let before = store_bytes(&t);
    let r = repo.prune(2, &now(&[])).unwrap();
    assert_eq!(r.dropped.len(), 4);
    assert!(r.recoded > 0, "the oldest kept version was coded against the one before it");
    assert!(r.recoded_bytes_after > r.recoded_bytes_before);
    assert_eq!(r.base_bytes_kept, 0, "no dropped blob stays as a base");
    assert!(store_bytes(&t) < before);
    // Nothing a dropped version listed is left.
    for (id, bytes) in &v[4..] {
        checks_out(&t, &repo, id, bytes);
    }
    for (id, _) in &v[..4] {
        assert_dropped(&repo, id);
    }
    let verify = repo.verify().unwrap();
    assert!(verify.is_ok(), "{verify:?}");
}

/// Under `base`, every kept version is coded against one old full base: the oldest kept
/// version's blobs are recoded whole, the newer ones as deltas against those.
#[test]
fn base_policy_rebases_the_kept_versions_on_the_oldest_kept_one() {
    let config = Config { delta_policy: DeltaPolicy::Base, ..Config::default() };
    let t = TestRepo::with_config(&config);
    let repo = t.open();
    let v = epochs(&t, &repo, 6, &CommitOptions::default());
    let before = store_bytes(&t);
    let r = repo.prune(3, &now(&[])).unwrap();
    assert_eq!(r.dropped.len(), 3);
    assert_eq!(r.base_bytes_kept, 0);
    assert!(store_bytes(&t) < before);
    let oldest_kept: std::collections::HashSet<_> = repo
        .version(&v[3].0)
        .unwrap()
        .files
        .iter()
        .flat_map(|f| repo.manifest(&f.manifest).unwrap().blobs().collect::<Vec<_>>())
        .collect();
    let newest = repo.version(&v[5].0).unwrap();
    let rebased = newest
        .files
        .iter()
        .flat_map(|f| repo.manifest(&f.manifest).unwrap().blobs().collect::<Vec<_>>())
        .filter(|b| repo.store().header(b).unwrap().reference.is_some_and(|r| oldest_kept.contains(&r)))
        .count();
    assert!(rebased > 0, "the newest version is coded against the oldest kept one");
    assert!(r.recoded > rebased);
    for (id, bytes) in &v[3..] {
        checks_out(&t, &repo, id, bytes);
    }
    assert!(repo.verify().unwrap().is_ok());
}

#[test]
fn verify_log_and_checkout_after_a_prune_through_the_cli() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 4, &CommitOptions::default());
    drop(repo);
    let out = ok(&t, &["prune", "--keep-last", "2", "--prune=now"]);
    assert!(out.contains("dropped 2 versions; freed"), "{out}");
    assert!(out.contains(&format!("history now ends at {}", v[2].0.short(12))), "{out}");
    let log = ok(&t, &["log", "--oneline"]);
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(log.lines().last().unwrap().contains("history pruned here"), "{log}");
    ok(&t, &["verify"]);
    let err = refused(&t, &["checkout", &v[1].0.to_hex(), "--output", "out"]);
    assert!(err.contains(&format!("version {} was dropped by `ckpt prune`", v[1].0)), "{err}");
    let err = refused(&t, &["checkout", &v[0].0.short(10), "--output", "out"]);
    assert!(err.contains("dropped by `ckpt prune`"), "{err}");
    let err = refused(&t, &["checkout", "HEAD~2", "--output", "out"]);
    assert!(err.contains("past the history `ckpt prune` kept"), "{err}");
    ok(&t, &["checkout", "HEAD~1", "--output", "out"]);
    assert_eq!(t.read(&format!("out/{FILE}")), v[2].1);
    let json: serde_json::Value = serde_json::from_str(&ok(&t, &["prune", "--keep-last", "2", "--json"])).unwrap();
    assert_eq!(json["dropped"].as_array().unwrap().len(), 0);
}

#[test]
fn prune_twice_moves_the_cut() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 6, &CommitOptions::default());
    repo.prune(4, &now(&[])).unwrap();
    assert_eq!(repo.pruned_history().unwrap().cut, vec![v[2].0]);
    let r = repo.prune(2, &now(&[])).unwrap();
    assert_eq!(dropped_ids(&r), vec![v[3].0, v[2].0]);
    let record = repo.pruned_history().unwrap();
    assert_eq!(record.cut, vec![v[4].0], "the first cut is dropped now");
    assert_eq!(record.dropped.len(), 4);
    for (id, bytes) in &v[4..] {
        checks_out(&t, &repo, id, bytes);
    }
    assert_dropped(&repo, &v[2].0);
    assert!(repo.verify().unwrap().is_ok());
    // The same again changes nothing.
    let objects = t.object_files();
    let r = repo.prune(2, &now(&[])).unwrap();
    assert!(r.dropped.is_empty() && r.gc.deleted == 0);
    assert_eq!(t.object_files(), objects);
}

#[test]
fn keep_last_beyond_the_history_is_a_no_op_and_zero_is_refused() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 3, &CommitOptions::default());
    let objects = t.object_files();
    let r = repo.prune(3, &now(&[])).unwrap();
    assert!(r.dropped.is_empty());
    let r = repo.prune(100, &now(&[])).unwrap();
    assert!(r.dropped.is_empty() && r.gc.deleted == 0);
    assert_eq!(r.branches[0].kept, 3);
    assert_eq!(t.object_files(), objects);
    assert!(!t.path(".ckpt/pruned").exists());

    assert!(matches!(repo.prune(0, &now(&[])), Err(Error::KeepLastZero)));
    let err = refused(&t, &["prune", "--keep-last", "0"]);
    assert!(err.contains("--keep-last 0"), "{err}");
    assert!(matches!(repo.prune(1, &now(&["nope"])), Err(Error::NoSuchBranch { .. })));
    // A git filter's store keeps objects for git's pointers, not for its branch.
    std::fs::create_dir(t.path(".ckpt/git-paths")).unwrap();
    assert!(matches!(repo.prune(1, &now(&[])), Err(Error::GitFilterStore { .. })));
    std::fs::remove_dir(t.path(".ckpt/git-paths")).unwrap();
    assert_eq!(t.object_files(), objects);
    assert_eq!(repo.log("HEAD").unwrap()[2].id, v[0].0);
}

#[test]
fn pending_delta_rewrites_of_dropped_versions_are_forgotten_not_kept_alive() {
    let t = TestRepo::init();
    let repo = t.open();
    let deferred = CommitOptions { defer_deltas: true, ..CommitOptions::default() };
    let v = epochs(&t, &repo, 5, &deferred);
    assert!(repo.has_pending_deltas());
    let r = repo.prune(2, &now(&[])).unwrap();
    assert_eq!(dropped_ids(&r), vec![v[2].0, v[1].0, v[0].0]);
    // Versions 1, 2 (dropped) and 3 (its parent dropped) pending: forgotten (the first version
    // has no parent to rewrite); 4 was compacted.
    assert_eq!(r.pending_forgotten, 3);
    assert!(!repo.has_pending_deltas());
    for (id, _) in &v[..3] {
        assert!(!repo.store().contains(id));
    }
    for (id, bytes) in &v[3..] {
        checks_out(&t, &repo, id, bytes);
    }
    assert!(repo.verify().unwrap().is_ok());
}

#[test]
fn several_branches_at_once() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 4, &CommitOptions::default());
    repo.create_branch("exp", Some(&v[1].0.to_hex())).unwrap();
    repo.switch("exp", true).unwrap();
    let bytes = synthetic_checkpoint(9, Dtype::F32, SMALL_MODEL, 1);
    let e = t.commit_files(&repo, &[(FILE, &bytes)], "exp 1");
    // main keeps 3, 2; exp keeps e, 1; 0 goes.
    let r = repo.prune(2, &now(&["main", "exp", "main"])).unwrap();
    assert_eq!(r.branches.len(), 2);
    assert_eq!(dropped_ids(&r), vec![v[0].0]);
    assert_eq!(r.kept_by.iter().map(|k| k.id).collect::<Vec<_>>(), vec![v[1].0]);
    checks_out(&t, &repo, &e, &bytes);
    for (id, bytes) in &v[1..] {
        checks_out(&t, &repo, id, bytes);
    }
    assert!(repo.verify().unwrap().is_ok());
    assert_eq!(repo.log("exp").unwrap().len(), 2);
}

/// A prune killed at any point: the record is written before anything is deleted, so a store
/// holding any subset of what the prune deletes (here: all of it put back, or some of it) is
/// consistent, and the next gc finishes the job.
#[test]
fn a_prune_interrupted_at_any_point_leaves_a_consistent_store() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 5, &CommitOptions::default());
    let saved = tempfile::tempdir().unwrap();
    let copy = |from: &PathBuf, to: &PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    };
    let objects = t.path(".ckpt/objects");
    let before: Vec<PathBuf> = t.object_files();
    for f in &before {
        copy(f, &saved.path().join(f.strip_prefix(&objects).unwrap()));
    }
    repo.prune(2, &now(&[])).unwrap();
    let deleted: Vec<PathBuf> = before.iter().filter(|f| !f.exists()).cloned().collect();
    assert!(deleted.len() > 3);
    // Killed after the record, before deleting (every object back), then half-way through
    // the sweep, which deletes deltas before their references: only the deltas gone.
    let saved_of = |f: &PathBuf| saved.path().join(f.strip_prefix(&objects).unwrap());
    let is_delta = |f: &PathBuf| std::fs::read(saved_of(f)).unwrap()[12] & 1 == 1;
    let deltas = deleted.iter().filter(|f| is_delta(f)).count();
    assert!(deltas > 0, "reverse deltas of the dropped versions");
    for back in [deleted.len(), deleted.len() - deltas] {
        for f in deleted.iter().filter(|f| back == deleted.len() || !is_delta(f)) {
            copy(&saved_of(f), f);
        }
        let repo = Repo::open(t.root()).unwrap();
        let verify = repo.verify().unwrap();
        assert!(verify.is_ok(), "{verify:?}");
        assert_eq!(repo.log("HEAD").unwrap().len(), 2, "history ends at the cut while its parents are on disk");
        for (id, bytes) in &v[3..] {
            checks_out(&t, &repo, id, bytes);
        }
        let gc = repo.gc_with(&GcOptions::now()).unwrap();
        assert_eq!(gc.deleted, back, "gc does not keep them alive through the parent link");
    }

    // And a real process killed at a few moments.
    for delay_ms in [0u64, 5, 20, 60] {
        let t = TestRepo::init();
        let repo = t.open();
        let v = epochs(&t, &repo, 5, &CommitOptions::default());
        drop(repo);
        let mut child =
            crate::support::repo_util::ckpt_command(t.root(), &["prune", "--keep-last", "2", "--prune=now"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        child.wait().unwrap();
        let repo = Repo::open(t.root()).unwrap();
        let verify = repo.verify().unwrap();
        assert!(verify.is_ok(), "killed after {delay_ms} ms: {verify:?}");
        for (id, bytes) in &v[3..] {
            checks_out(&t, &repo, id, bytes);
        }
        // Running it again finishes it.
        repo.prune(2, &now(&[])).unwrap();
        assert_eq!(repo.log("HEAD").unwrap().len(), 2);
        assert!(repo.verify().unwrap().is_ok());
    }
}

/// What a remote-tracking ref's version lacks on the remote (versions committed since the
/// last push) stays: dropped, the branch could no longer be pushed there.
#[test]
fn versions_not_pushed_yet_are_kept_and_the_push_still_works() {
    let r = crate::support::remote::directory().unwrap();
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 3, &CommitOptions::default());
    ok(&t, &["remote", "add", "origin", &r.url]);
    ok(&t, &["push", "origin"]);
    let more = epochs_from(&t, &repo, 3, 6);
    let pr = repo.prune(1, &now(&[])).unwrap();
    // What the remote holds goes here, but for the version its ref names.
    assert_eq!(dropped_ids(&pr), vec![v[1].0, v[0].0], "{pr:?}");
    let unpushed: Vec<&str> = pr.kept_by.iter().map(|k| k.root.as_str()).collect();
    assert_eq!(unpushed[..2], ["refs/remotes/origin/main (not pushed there yet)"; 2]);
    assert_eq!(unpushed[2..], ["refs/remotes/origin/main"]);
    ok(&t, &["push", "origin"]);
    assert_eq!(more.len() + 1, repo.log("HEAD").unwrap().len());
    // The remote still has every version.
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let clone = Repo::open(&parent.path().join("b")).unwrap();
    assert_eq!(clone.log("HEAD").unwrap().len(), v.len() + more.len());
    assert!(clone.verify().unwrap().is_ok());
}

/// A remote that holds the history a prune dropped keeps it; the pruned branch still pushes
/// there, as long as the remote's tip is among the versions kept.
#[test]
fn a_pruned_branch_pushes_to_a_remote_that_keeps_the_older_history() {
    let r = crate::support::remote::directory().unwrap();
    let t = TestRepo::init();
    let repo = t.open();
    epochs(&t, &repo, 5, &CommitOptions::default());
    ok(&t, &["remote", "add", "origin", &r.url]);
    ok(&t, &["push", "origin"]);
    // No remote-tracking ref keeps the pushed versions here (a `remote remove`, a fresh
    // clone's pruned copy): the remote alone holds them.
    std::fs::remove_file(t.path(".ckpt/refs/remotes/origin/main")).unwrap();
    let more = epochs_from(&t, &repo, 5, 7);
    let pr = repo.prune(3, &now(&[])).unwrap();
    assert_eq!(pr.dropped.len(), 4);
    ok(&t, &["push", "origin"]);
    // A clone of the remote has the whole history, the new versions on top.
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let clone = Repo::open(&parent.path().join("b")).unwrap();
    let log = clone.log("HEAD").unwrap();
    assert_eq!(log.len(), 7);
    assert_eq!(log[0].id, more[1].0);
    assert!(clone.verify().unwrap().is_ok());
}

/// Commits epochs `from..to` on top of what is there.
fn epochs_from(t: &TestRepo, repo: &Repo, from: u32, to: u32) -> Vec<(VersionId, Vec<u8>)> {
    (from..to)
        .map(|e| {
            let bytes = synthetic_checkpoint(7, Dtype::F32, SMALL_MODEL, e);
            let id = t.commit_files(repo, &[(FILE, &bytes)], &format!("epoch {e}"));
            (id, bytes)
        })
        .collect()
}

/// In a partial clone, `ckpt checkout` of a dropped version downloads it again from the
/// remote that still holds it, as it does for any version outside the clone's depth.
#[test]
fn a_partial_clone_fetches_a_dropped_version_back_on_checkout() {
    let r = crate::support::remote::directory().unwrap();
    let a = TestRepo::init();
    let repo = a.open();
    epochs(&a, &repo, 3, &CommitOptions::default());
    ok(&a, &["remote", "add", "origin", &r.url]);
    ok(&a, &["push", "origin"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", "--depth", "2", &r.url, "b"]);
    let b = TestRepo { dir: tempfile::tempdir().unwrap() };
    std::fs::remove_dir(b.root()).unwrap();
    std::fs::rename(parent.path().join("b"), b.root()).unwrap();
    let clone = b.open();
    let mine = epochs_from(&b, &clone, 3, 6);
    ok(&b, &["push", "origin"]);
    // The remote holds everything; here only a tracking ref would keep it.
    std::fs::remove_file(b.path(".ckpt/refs/remotes/origin/main")).unwrap();
    let pr = clone.prune(2, &now(&[])).unwrap();
    assert_eq!(dropped_ids(&pr), vec![mine[0].0, pr.dropped[1].id]);
    assert_eq!(pr.kept_by.len(), 1, "{pr:?}");
    assert_eq!(pr.kept_by[0].root, ".ckpt/partial");
    assert!(!clone.store().contains(&mine[0].0));
    drop(clone);
    ok(&b, &["checkout", &mine[0].0.to_hex(), "--output", "out"]);
    assert_eq!(b.read(&format!("out/{FILE}")), mine[0].1);
    ok(&b, &["verify"]);
}

/// Under the grace period, a young delta of a dropped version stays, and so does the older
/// blob it is coded against: no sweep leaves a delta without its reference.
#[test]
fn objects_kept_for_their_age_keep_their_delta_references() {
    let config = Config { delta_policy: DeltaPolicy::Previous, ..Config::default() };
    let t = TestRepo::with_config(&config);
    let repo = t.open();
    epochs(&t, &repo, 2, &CommitOptions::default());
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    for f in t.object_files() {
        std::fs::File::options().append(true).open(&f).unwrap().set_modified(two_hours_ago).unwrap();
    }
    let v = epochs_from(&t, &repo, 2, 5);
    let pr = repo
        .prune(2, &PruneOptions { gc: Some(GcOptions { grace: std::time::Duration::from_secs(3600) }), ..now(&[]) })
        .unwrap();
    assert_eq!(pr.dropped.len(), 3);
    assert!(pr.gc.recent > 0, "{pr:?}");
    let verify = repo.verify().unwrap();
    assert!(verify.is_ok(), "{verify:?}");
    for (id, bytes) in &v[1..] {
        checks_out(&t, &repo, id, bytes);
    }
    let gc = repo.gc_with(&GcOptions::now()).unwrap();
    assert!(gc.deleted > 0);
    assert!(repo.verify().unwrap().is_ok());
}

/// Under `reverse` (the default) an older version is a delta against the next one: a tag on
/// an old version kept that chain through every dropped version, and the prune freed almost
/// nothing. The tagged version's blobs are recoded (whole) so the dropped ones go.
#[test]
fn a_tag_on_an_old_version_does_not_keep_the_dropped_versions_as_its_bases() {
    let t = TestRepo::init();
    let repo = t.open();
    let v = epochs(&t, &repo, 6, &CommitOptions::default());
    repo.compact(&Default::default()).unwrap();
    repo.tag("first", Some(&v[0].0.to_hex())).unwrap();
    let blobs = |ids: &[&VersionId]| -> std::collections::HashSet<ckpt::ObjectId> {
        let mut out = std::collections::HashSet::new();
        for id in ids {
            for f in repo.version(id).unwrap().files {
                out.extend(repo.manifest(&f.manifest).unwrap().blobs());
            }
        }
        out
    };
    let kept = blobs(&[&v[0].0, &v[4].0, &v[5].0]);
    let only_dropped: Vec<ckpt::ObjectId> =
        blobs(&[&v[1].0, &v[2].0, &v[3].0]).into_iter().filter(|b| !kept.contains(b)).collect();
    assert!(!only_dropped.is_empty());
    let r = repo.prune(2, &now(&["main"])).unwrap();
    assert_eq!(dropped_ids(&r), vec![v[3].0, v[2].0, v[1].0]);
    assert!(r.recoded > 0 && r.base_bytes_kept == 0, "{r:?}");
    // Every blob only the dropped versions listed is gone: none stays as a base.
    let left: Vec<_> = only_dropped.iter().filter(|b| repo.store().contains(b)).collect();
    assert!(left.is_empty(), "{} of {} still stored", left.len(), only_dropped.len());
    for (id, bytes) in [&v[0], &v[4], &v[5]] {
        checks_out(&t, &repo, id, bytes);
    }
    assert!(repo.verify().unwrap().is_ok());
}
