//! gc's grace period: unreferenced objects younger than `gc_grace_seconds` (and temp files) are
//! kept, because a save in flight (the lockless ranks of a distributed save, a `git add` before
//! git writes its index) has stored them before any version names them. A writer that reuses an
//! existing object renews its time.

use crate::support::repo_util::{ok, stderr, synthetic_checkpoint, TestRepo, TRAINING_MODEL};
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

/// Sets the mtime of `path` to `age` ago.
fn age_file(path: &Path, age: Duration) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(SystemTime::now() - age).unwrap();
}

/// A save announced in `.ckpt/saves/` (`Repo::begin_save`, what `ckpt.dcp.Writer`'s coordinator
/// does before any rank stores an object) keeps what it writes through `gc --prune=now` and
/// past the grace period, however long it takes; older garbage still goes, and once the save
/// ends (or its record stops being renewed: a killed save) its leftovers are garbage again.
#[test]
fn a_save_record_keeps_what_the_save_writes_through_prune_now() {
    let t = TestRepo::init();
    let repo = t.open();
    let spool = tempfile::tempdir().unwrap();
    store(&repo, spool.path(), "old.distcp", &[4u8; 100_000]);
    age_objects(&t, Duration::from_secs(3 * 3600));
    let old_garbage = t.object_files();

    let record = repo.begin_save("a test save").unwrap();
    assert!(record.path().starts_with(t.path(".ckpt/saves")) && record.path().is_file());
    let a = store(&repo, spool.path(), "__0_0.distcp", &[5u8; 300_000]);
    let written: Vec<_> = t.object_files().into_iter().filter(|f| !old_garbage.contains(f)).collect();
    assert!(!written.is_empty());
    // The save is slow: it began two hours ago, and what it wrote first is as old.
    for f in &written {
        age_file(f, Duration::from_secs(2 * 3600));
    }
    let text = std::fs::read_to_string(record.path()).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["started"] = (json["started"].as_u64().unwrap() - 2 * 3600 - 60).into();
    std::fs::write(record.path(), json.to_string()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&ok(&t, &["gc", "--prune=now", "--json"])).unwrap();
    assert_eq!(json["saves_in_flight"], 1, "{json}");
    assert_eq!(json["deleted"].as_u64().unwrap(), old_garbage.len() as u64, "{json}");
    assert!(written.iter().all(|f| f.exists()), "gc took what the save in flight wrote");
    assert!(old_garbage.iter().all(|f| !f.exists()), "garbage older than the save went");
    let out = ok(&t, &["gc", "--prune=now"]);
    assert!(out.contains("a save is in flight"), "{out}");
    repo.commit_stored("main", None, vec![a], "save", &CommitOptions::default()).unwrap();
    record.end();
    assert_eq!(std::fs::read_dir(t.path(".ckpt/saves")).unwrap().count(), 0, "ended: removed");
    assert!(repo.verify().unwrap().is_ok());

    // A killed save: its record (as a writer wrote it) is no longer renewed; ten minutes on, gc
    // ignores and removes it, and the save's leftovers are ordinary garbage.
    let path = t.path(".ckpt/saves/0123456789abcdef0123456789abcdef.json");
    let started = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    std::fs::write(&path, format!("{{\"started\":{started},\"pid\":1,\"what\":\"killed\"}}\n")).unwrap();
    let before = t.object_files().len();
    store(&repo, spool.path(), "__0_0.distcp", &[9u8; 200_000]);
    let after = t.object_files().len();
    assert!(after > before);
    assert_eq!(repo.gc_with(&GcOptions::now()).unwrap().deleted, 0, "live");
    age_file(&path, ckpt::repo::SAVE_LAPSE + Duration::from_secs(1));
    let report = repo.gc_with(&GcOptions::now()).unwrap();
    assert_eq!((report.saves_in_flight, report.deleted), (0, after - before));
    assert!(!path.exists(), "the dead record is removed");
    assert_eq!(t.object_files().len(), before);
}

/// Runs `f` when gc's sweep starts (its progress phase "gc"): after gc judged what is garbage,
/// before it deletes anything.
struct AtSweep<F: Fn() + Send + Sync>(F);

impl<F: Fn() + Send + Sync> ckpt::repo::Progress for AtSweep<F> {
    fn start(&self, label: &str, _total: u64) {
        if label == "gc" {
            (self.0)();
        }
    }
}

/// A lockless writer that finds an object gc has judged garbage and renews it (a rank reusing
/// a failed save's object) between the judgement and the delete: the sweep spares it and
/// everything it is coded against, so the writer's save can count on it.
#[test]
fn an_object_renewed_after_gc_judged_it_is_spared_with_its_references() {
    let t = TestRepo::init();
    t.write("a.bin", &[1u8; 5000]);
    ok(&t, &["commit", "-m", "main", "a.bin"]);
    ok(&t, &["branch", "side"]);
    ok(&t, &["switch", "side"]);
    for epoch in 0..2 {
        t.write("m.safetensors", &synthetic_checkpoint(3, ckpt::Dtype::F32, TRAINING_MODEL, epoch));
        ok(&t, &["commit", "-m", "side", "m.safetensors"]);
    }
    ok(&t, &["switch", "main"]);
    ok(&t, &["branch", "-D", "side"]);
    let mut repo = t.open();
    let delta = repo
        .store()
        .list()
        .unwrap()
        .into_iter()
        .find(|id| repo.store().header(id).is_ok_and(|h| h.reference.is_some()))
        .expect("side 1's blob is a reverse delta against side 2's");
    let reference = repo.store().header(&delta).unwrap().reference.unwrap();
    let objects = t.object_files().len();
    let store = ckpt::store::Store::open(&t.path(".ckpt")).unwrap();
    repo.set_progress(std::sync::Arc::new(AtSweep(move || assert!(store.contains_fresh(&delta)))));
    let report = repo.gc_with(&GcOptions::now()).unwrap();
    assert!(report.deleted >= 2, "side's versions and manifests went: {report:?}");
    assert_eq!(t.object_files().len(), objects - report.deleted);
    assert!(repo.store().contains(&delta) && repo.store().contains(&reference), "{report:?}");
    repo.store().verify(&delta).unwrap();
    ok(&t, &["verify"]);
}

/// Records that do not parse, and files that are not records, in `.ckpt/saves/`: a live
/// record that does not parse counts as a save begun a day before its mtime (gc keeps more,
/// never less); an editor's or NFS's file there is not a record.
#[test]
fn a_damaged_save_record_keeps_more_and_other_files_are_not_records() {
    let t = TestRepo::init();
    let repo = t.open();
    let spool = tempfile::tempdir().unwrap();
    store(&repo, spool.path(), "old.distcp", &[4u8; 100_000]);
    age_objects(&t, Duration::from_secs(3 * 3600));
    let garbage = t.object_files().len();
    let saves = t.path(".ckpt/saves");
    std::fs::create_dir_all(&saves).unwrap();
    std::fs::write(saves.join(".nfs000123"), b"not a record").unwrap();
    std::fs::write(saves.join("notes.json"), b"{\"started\":0}").unwrap();
    std::fs::create_dir(saves.join("0123456789abcdef0123456789abcdef.json.d")).unwrap();
    let damaged = saves.join("0123456789abcdef0123456789abcdef.json");
    std::fs::write(&damaged, vec![0xff; 10_000]).unwrap();
    let report = repo.gc_with(&GcOptions::now()).unwrap();
    assert_eq!((report.saves_in_flight, report.deleted), (1, 0), "{report:?}");
    assert_eq!(t.object_files().len(), garbage);
    std::fs::remove_file(&damaged).unwrap();
    let report = repo.gc_with(&GcOptions::now()).unwrap();
    assert_eq!((report.saves_in_flight, report.deleted), (0, garbage), "{report:?}");
}
