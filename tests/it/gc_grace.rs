//! gc's grace period: unreferenced objects younger than `gc_grace_seconds` (and temp files) are
//! kept, because a save in flight (the lockless ranks of a distributed save, a `git add` before
//! git writes its index) has stored them before any version names them. A writer that reuses an
//! existing object renews its time.

use crate::support::repo_util::{ok, stderr, TestRepo};
use ckpt::repo::{CommitOptions, GcOptions, Repo, RepoPath};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Sets the mtime of every object file of the store to `age` ago.
fn age_objects(t: &TestRepo, age: Duration) {
    for f in t.object_files() {
        std::fs::File::open(&f).unwrap().set_modified(SystemTime::now() - age).unwrap();
    }
}

/// A repository on `main` with one version, and a branch `side` holding a second version of
/// its own, then deleted: its objects are unreferenced. Returns how many objects `side` alone had.
fn with_garbage() -> (TestRepo, usize) {
    let t = TestRepo::init();
    t.write("a.bin", &[1u8; 5000]);
    ok(&t, &["commit", "-m", "one", "a.bin"]);
    let before = t.object_files().len();
    ok(&t, &["branch", "side"]);
    ok(&t, &["switch", "side"]);
    t.write("a.bin", &[2u8; 7000]);
    ok(&t, &["commit", "-m", "two", "a.bin"]);
    let garbage = t.object_files().len() - before;
    ok(&t, &["switch", "main"]);
    ok(&t, &["branch", "-D", "side"]);
    (t, garbage)
}

#[test]
fn young_unreferenced_objects_are_kept_until_the_grace_period_or_prune_now() {
    let (t, garbage) = with_garbage();
    assert!(garbage >= 2, "the side version and its file");
    let total = t.object_files().len();

    // Default grace (one hour): nothing written seconds ago goes, and the output says why.
    let out = ok(&t, &["gc"]);
    assert_eq!(t.object_files().len(), total, "{out}");
    assert!(out.contains(&format!("kept {garbage} unreferenced objects younger than 1h")), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(&t, &["gc", "--json"])).unwrap();
    assert_eq!(json["recent"], garbage);
    assert_eq!(json["deleted"], 0);
    assert_eq!(json["grace_seconds"], 3600);

    // A shorter grace than their age, on the command line: they go, what main needs stays.
    age_objects(&t, Duration::from_secs(600));
    ok(&t, &["gc", "--prune=15m"]);
    assert_eq!(t.object_files().len(), total, "15m is longer than their age");
    ok(&t, &["gc", "--prune=5m"]);
    assert_eq!(t.object_files().len(), total - garbage);
    ok(&t, &["verify"]);
    let out = tempfile::tempdir().unwrap();
    ok(&t, &["checkout", "HEAD", "--output", out.path().to_str().unwrap()]);
    assert_eq!(std::fs::read(out.path().join("a.bin")).unwrap(), vec![1u8; 5000]);
}

#[test]
fn the_configured_grace_applies_and_old_garbage_goes_by_default() {
    let (t, garbage) = with_garbage();
    let total = t.object_files().len();
    // Older than the default hour: a plain gc deletes them.
    age_objects(&t, Duration::from_secs(2 * 3600));
    let report = t.open().gc().unwrap();
    assert_eq!((report.deleted, report.recent), (garbage, 0));
    assert_eq!(t.object_files().len(), total - garbage);

    // A repository configured for a day keeps two-hour-old garbage.
    let config = ckpt::repo::Config { gc_grace_seconds: 86400, ..Default::default() };
    let t = TestRepo::with_config(&config);
    t.write("a.bin", &[1u8; 5000]);
    ok(&t, &["commit", "-m", "one", "a.bin"]);
    ok(&t, &["branch", "side"]);
    ok(&t, &["switch", "side"]);
    t.write("a.bin", &[3u8; 6000]);
    ok(&t, &["commit", "-m", "two", "a.bin"]);
    ok(&t, &["switch", "main"]);
    ok(&t, &["branch", "-D", "side"]);
    age_objects(&t, Duration::from_secs(2 * 3600));
    let total = t.object_files().len();
    let report = t.open().gc().unwrap();
    assert_eq!(report.deleted, 0);
    assert!(report.recent >= 2, "{report:?}");
    assert_eq!(t.object_files().len(), total);
}

#[test]
fn a_bad_prune_value_is_refused_naming_it() {
    let (t, _) = with_garbage();
    let total = t.object_files().len();
    let o = t.ckpt(&["gc", "--prune=soon"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("soon") && err.contains("now"), "{err}");
    assert_eq!(t.object_files().len(), total);
}

fn store(repo: &Repo, dir: &Path, path: &str, bytes: &[u8]) -> ckpt::repo::FileEntry {
    let disk = dir.join("spool");
    std::fs::write(&disk, bytes).unwrap();
    repo.store_objects(&disk, &RepoPath::parse(path).unwrap(), None, None, None).unwrap()
}

#[test]
fn a_save_in_flight_keeps_its_objects_through_a_gc_also_those_it_reuses() {
    let t = TestRepo::init();
    let repo = t.open();
    let spool = tempfile::tempdir().unwrap();
    // A failed save's leftovers, two hours old: garbage a plain gc may take.
    let rank0 = vec![5u8; 300_000];
    store(&repo, spool.path(), "__0_0.distcp", &rank0);
    age_objects(&t, Duration::from_secs(2 * 3600));
    let old = t.object_files();

    // A new save: rank 1 writes new objects, rank 0 stores the same bytes again (its objects
    // exist: no write, but their time is renewed). A gc runs before the coordinator commits.
    let b = store(&repo, spool.path(), "__1_0.distcp", &[6u8; 200_000]);
    let a = store(&repo, spool.path(), "__0_0.distcp", &rank0);
    let report = repo.gc().unwrap();
    assert_eq!(report.deleted, 0, "{report:?}");
    for f in &old {
        assert!(f.exists(), "gc deleted {} that the save in flight reuses", f.display());
    }
    repo.commit_stored("main", None, vec![a, b], "save", &CommitOptions::default()).unwrap();
    assert_eq!(repo.read_file_bytes("HEAD", "__0_0.distcp", 1 << 20).unwrap(), rank0);
    assert!(repo.verify().unwrap().is_ok());
}

#[test]
fn a_young_temp_file_of_a_lockless_writer_is_kept_an_old_one_removed() {
    let t = TestRepo::init();
    let repo = t.open();
    let tmp = t.path(".ckpt/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let young = tmp.join("obj-young");
    let old = tmp.join("obj-old");
    std::fs::write(&young, b"being written").unwrap();
    std::fs::write(&old, b"left by a kill").unwrap();
    std::fs::File::open(&old).unwrap().set_modified(SystemTime::now() - Duration::from_secs(7200)).unwrap();
    let report = repo.gc().unwrap();
    assert_eq!(report.temp_files, 1);
    assert!(young.exists() && !old.exists());
    let report = repo.gc_with(&GcOptions::now()).unwrap();
    assert_eq!(report.temp_files, 1);
    assert!(!young.exists());
}
