//! Reverse deltas done after the commit: `defer_deltas` and `Repo::compact`, and `ckpt commit`
//! running the compaction in a background process.

use crate::support::repo_util::{
    ckpt_command, read_tree, stderr, synthetic_checkpoint, Files, TestRepo, TRAINING_MODEL, TRAINING_OPTIM,
};
use ckpt::repo::{CommitOptions, CompactOptions, Config, DeltaPolicy, Repo};
use ckpt::store::ObjectKind;
use ckpt::{Dtype, ObjectId};
use std::time::{Duration, Instant};

fn files_for(epoch: u32) -> Files {
    vec![
        ("model.safetensors".to_string(), synthetic_checkpoint(31, Dtype::Bf16, TRAINING_MODEL, epoch)),
        ("optim.safetensors".to_string(), synthetic_checkpoint(32, Dtype::F32, TRAINING_OPTIM, epoch)),
    ]
}

fn config() -> Config {
    Config { delta_policy: DeltaPolicy::Reverse, base_every: 20, chunk_size: 16 << 10, ..Config::default() }
}

/// Every blob and manifest of the store: id, what it references, size. (Version objects differ
/// between repositories by their time and recorded sizes.)
fn layout(t: &TestRepo) -> Vec<(ObjectId, Option<ObjectId>, u64)> {
    let repo = t.open();
    let store = repo.store();
    let mut out: Vec<_> = store
        .list()
        .unwrap()
        .into_iter()
        .map(|id| (id, store.header(&id).unwrap(), store.stored_len(&id).unwrap()))
        .filter(|(_, header, _)| header.kind != ObjectKind::Version)
        .map(|(id, header, len)| (id, header.reference, len))
        .collect();
    out.sort();
    out
}

fn commit_epochs(t: &TestRepo, epochs: std::ops::Range<u32>, options: &CommitOptions) -> Vec<(ckpt::ObjectId, Files)> {
    let repo = t.open();
    epochs
        .map(|e| {
            let files = files_for(e);
            t.write_files(&files);
            let id = repo.commit(&["model.safetensors", "optim.safetensors"], &format!("epoch {e}"), options).unwrap();
            (id, files)
        })
        .collect()
}

fn assert_checkouts(t: &TestRepo, history: &[(ckpt::ObjectId, Files)]) {
    let repo = t.open();
    for (id, files) in history {
        let out = tempfile::tempdir().unwrap();
        repo.checkout(&id.to_hex(), None, Some(out.path()), None).unwrap();
        assert_eq!(&read_tree(out.path()), files, "version {id}");
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

#[test]
fn deferred_deltas_compacted_later_store_what_inline_commits_store() {
    let inline = TestRepo::with_config(&config());
    let deferred = TestRepo::with_config(&config());
    let history = commit_epochs(&inline, 0..5, &CommitOptions::default());
    let history_deferred =
        commit_epochs(&deferred, 0..5, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    assert!(history.iter().zip(&history_deferred).all(|(a, b)| a.1 == b.1), "the same files");
    // Until compacted, every version is stored whole: the store is larger, and correct.
    let whole: u64 = layout(&deferred).iter().map(|o| o.2).sum();
    let compacted: u64 = layout(&inline).iter().map(|o| o.2).sum();
    assert!(whole > compacted * 2, "{whole} vs {compacted}");
    assert!(layout(&deferred).iter().all(|o| o.1.is_none()), "nothing is a delta before compaction");
    assert_checkouts(&deferred, &history_deferred);

    let repo = deferred.open();
    assert!(repo.has_pending_deltas());
    let report = repo.compact(&CompactOptions::default()).unwrap();
    assert_eq!((report.versions, report.pending), (4, 0), "{report:?}");
    assert!(report.rewritten >= 4 && report.bytes_after < report.bytes_before, "{report:?}");
    assert!(!repo.has_pending_deltas());
    drop(repo);
    assert!(layout(&deferred) == layout(&inline), "the same objects, the same deltas");
    assert_checkouts(&deferred, &history_deferred);
    // Nothing left to do: a second compaction changes nothing.
    let report = deferred.open().compact(&CompactOptions::default()).unwrap();
    assert_eq!((report.versions, report.rewritten), (0, 0));
}

#[test]
fn compaction_steps_aside_for_a_waiting_writer_and_resumes() {
    let t = TestRepo::with_config(&config());
    let history = commit_epochs(&t, 0..4, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    // A writer waiting for the lock, as `WriterLock` marks it: the marker file, with a shared
    // lock held on it for as long as the writer waits.
    let waiter = std::fs::File::create(t.path(".ckpt/lock.waiting")).unwrap();
    waiter.lock_shared().unwrap();
    let repo = t.open();
    let report = repo.compact(&CompactOptions { yield_to_writers: true }).unwrap();
    assert_eq!((report.versions, report.rewritten, report.pending), (0, 0, 3), "{report:?}");
    // An explicit compaction does not step aside; nor does one once nobody waits.
    std::fs::remove_file(t.path(".ckpt/lock.waiting")).unwrap();
    drop(waiter);
    let report = repo.compact(&CompactOptions { yield_to_writers: true }).unwrap();
    assert_eq!((report.versions, report.pending), (3, 0), "{report:?}");
    drop(repo);
    assert_checkouts(&t, &history);
}

#[test]
fn pending_versions_that_are_gone_are_dropped() {
    let t = TestRepo::with_config(&config());
    commit_epochs(&t, 0..2, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    // A pending list naming a version that no longer exists (a deleted branch, gc) and garbage.
    let missing = ObjectId::hash(b"no such version");
    let list = std::fs::read_to_string(t.path(".ckpt/pending-deltas")).unwrap();
    let with_missing = list.replacen('[', &format!("[\"{}\",", missing.to_hex()), 1);
    t.write(".ckpt/pending-deltas", with_missing.as_bytes());
    let report = t.open().compact(&CompactOptions::default()).unwrap();
    assert_eq!((report.versions, report.pending), (2, 0), "{report:?}");
    // A damaged list is an error naming the file, not a panic; the commit path still works.
    t.write(".ckpt/pending-deltas", b"[\"zz\"");
    let err = t.open().compact(&CompactOptions::default()).unwrap_err().to_string();
    assert!(err.contains("pending-deltas") && err.contains("pending deltas"), "{err}");
}

#[test]
fn cli_commit_compacts_in_the_background() {
    let t = TestRepo::with_config(&config());
    let inline = TestRepo::with_config(&config());
    let history = commit_epochs(&inline, 0..4, &CommitOptions::default());
    for (e, (_, files)) in history.iter().enumerate() {
        t.write_files(files);
        let o =
            ckpt_command(t.root(), &["commit", "-m", &format!("epoch {e}"), "model.safetensors", "optim.safetensors"])
                .env_remove("CKPT_COMPACT")
                .output()
                .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.contains("the previous version becomes deltas in the background"), e > 0, "epoch {e}: {out}");
    }
    // The background compactions finish on their own (each takes the writer lock, so a commit
    // never races them).
    let start = Instant::now();
    while t.path(".ckpt/pending-deltas").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "the background compaction never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Wait for the last one to let go of the lock, then compare with inline commits.
    let o = ckpt_command(t.root(), &["compact"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "nothing to compact");
    assert!(layout(&t) == layout(&inline), "the same objects, the same deltas");
    let repo = t.open();
    let versions: Vec<_> = repo.log("HEAD").unwrap().into_iter().rev().map(|v| v.id).collect();
    let cli_history: Vec<_> = versions.into_iter().zip(history.into_iter().map(|h| h.1)).collect();
    drop(repo);
    assert_checkouts(&t, &cli_history);
}

#[test]
fn a_bad_ckpt_compact_value_fails_the_commit_before_anything_is_written() {
    let t = TestRepo::with_config(&config());
    t.write_files(&files_for(0));
    let o = ckpt_command(t.root(), &["commit", "-m", "x", "model.safetensors"])
        .env("CKPT_COMPACT", "later")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("CKPT_COMPACT=\"later\": expected \"background\", \"inline\" or \"manual\""),
        "{}",
        stderr(&o)
    );
    assert!(t.object_files().is_empty());
}

#[test]
fn gc_finishes_pending_deltas() {
    let t = TestRepo::with_config(&config());
    let history = commit_epochs(&t, 0..3, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    let before: u64 = layout(&t).iter().map(|o| o.2).sum();
    let o = ckpt_command(t.root(), &["gc", "--prune=now"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let after: u64 = layout(&t).iter().map(|o| o.2).sum();
    assert!(after < before, "{after} vs {before}");
    assert!(!t.open().has_pending_deltas());
    assert_checkouts(&t, &history);
    let repo: Repo = t.open();
    assert_eq!(repo.log("HEAD").unwrap().len(), 3);
}

#[test]
fn manual_compaction_waits_for_ckpt_compact() {
    let t = TestRepo::with_config(&config());
    for e in 0..2 {
        t.write_files(&files_for(e));
        let o = ckpt_command(t.root(), &["commit", "-m", "e", "model.safetensors", "optim.safetensors"])
            .env("CKPT_COMPACT", "manual")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains("background"));
    }
    assert!(!t.path(".ckpt/compact.log").exists(), "no background process was started");
    assert!(t.open().has_pending_deltas());
    let o = ckpt_command(t.root(), &["compact", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["versions"].as_u64(), report["pending"].as_u64()), (Some(1), Some(0)), "{report}");
    assert!(report["rewritten"].as_u64().unwrap() >= 2, "{report}");
    assert!(!t.open().has_pending_deltas());
}

#[test]
fn status_reports_pending_deltas_and_a_failed_background_compaction() {
    let t = TestRepo::with_config(&config());
    commit_epochs(&t, 0..3, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    let status = t.open().status().unwrap();
    assert_eq!((status.pending_deltas, status.compaction_log), (2, None));
    let o = ckpt_command(t.root(), &["status"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 versions still to be turned into deltas"), "{out}");
    // What a failed background run leaves in its log is shown, and only its end.
    let mut log = "x".repeat(10_000);
    log.push_str("\nerror: writing .ckpt/tmp/obj-1: No space left on device\n");
    t.write(".ckpt/compact.log", log.as_bytes());
    let o = ckpt_command(t.root(), &["status", "--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let shown = status["compaction_log"].as_str().unwrap();
    assert!(shown.ends_with("No space left on device") && shown.len() <= 2000, "{shown}");
    assert_eq!(status["pending_deltas"], 2);
    t.open().compact(&CompactOptions::default()).unwrap();
    assert_eq!(t.open().status().unwrap().pending_deltas, 0);
}

#[test]
fn an_inline_commit_finishes_deferred_deltas_first() {
    let inline = TestRepo::with_config(&config());
    let mixed = TestRepo::with_config(&config());
    commit_epochs(&inline, 0..4, &CommitOptions::default());
    commit_epochs(&mixed, 0..3, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    let history = commit_epochs(&mixed, 3..4, &CommitOptions::default());
    assert!(!mixed.open().has_pending_deltas());
    assert!(layout(&mixed) == layout(&inline), "the same objects, the same deltas");
    assert_checkouts(&mixed, &history);
}

#[test]
fn log_shows_what_each_version_takes_now() {
    let t = TestRepo::with_config(&config());
    commit_epochs(&t, 0..3, &CommitOptions { defer_deltas: true, ..CommitOptions::default() });
    let log = |t: &TestRepo| -> Vec<serde_json::Value> {
        let o = ckpt_command(t.root(), &["log", "--json"]).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let now = |v: &serde_json::Value| v["stored_now_bytes"].as_u64().unwrap();
    let before = log(&t);
    t.open().compact(&CompactOptions::default()).unwrap();
    let after = log(&t);
    // Newest first: the newest stays whole, the older ones shrink to deltas; what each recorded
    // at commit time does not change.
    assert_eq!(now(&after[0]), now(&before[0]));
    for (b, a) in before.iter().zip(&after).skip(1) {
        assert!(now(a) * 2 < now(b), "{a} vs {b}");
        assert_eq!(a["stored_bytes"], b["stored_bytes"]);
    }
    // Together they are the store.
    let store: u64 = t.object_files().iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert_eq!(after.iter().map(now).sum::<u64>(), store);
    let o = ckpt_command(t.root(), &["log", "-n", "2"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("added at commit") && text.matches("version ").count() == 2, "{text}");
}

/// A save that stored its tensors uncoded as it wrote them (`Repo::store_piece`, what
/// `ckpt.dcp.Writer` does into a repository) and is pushed before its compaction ran: the push
/// runs the compaction first, so the remote receives the tensors coded, as it would after a
/// `ckpt commit`.
#[test]
fn a_push_before_the_compaction_sends_the_pieces_coded() {
    use ckpt::remote::Remote;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let repo = Repo::init(&dir.path().join("repo")).unwrap();
    let bytes = crate::support::util::safetensors_file(5, &[("w", Dtype::F32, &[256, 256]), ("b", Dtype::F32, &[8])]);
    let header = ckpt::safetensors::parse(&bytes).unwrap();
    let w = header.tensors.iter().find(|t| t.name == "w").unwrap();
    // The file as a save's stream leaves it: the tensor a hole, its bytes stored as a piece.
    let spool = dir.path().join("m.safetensors");
    let file = std::fs::File::create(&spool).unwrap();
    file.set_len(bytes.len() as u64).unwrap();
    file.write_all_at(&bytes[..w.begin as usize], 0).unwrap();
    file.write_all_at(&bytes[w.end as usize..], w.end).unwrap();
    let pieces = ckpt::repo::Pieces::new();
    repo.store_piece(&pieces, "m.safetensors", w.begin, &bytes[w.begin as usize..w.end as usize], Dtype::F32).unwrap();
    let path = ckpt::repo::RepoPath::parse("m.safetensors").unwrap();
    let entry = repo.store_objects(&spool, &path, None, None, Some(&pieces)).unwrap();
    repo.commit_stored("main", None, vec![entry.clone()], "save", &CommitOptions::default()).unwrap();
    let id = repo.manifest(&entry.manifest).unwrap().segments.iter().find(|s| s.len == w.end - w.begin).unwrap().blob;
    let id = id.unwrap();
    let uncoded = repo.store().stored_len(&id).unwrap();
    assert!(repo.store().open_blob(&id).unwrap().is_uncoded().unwrap());

    let remote = ckpt::remote::local::DirRemote::create(dir.path().join("remote").to_str().unwrap()).unwrap();
    ckpt::sync::push_to(&repo, &remote, &ckpt::sync::PushOptions { transfers: 2, ..Default::default() }).unwrap();
    assert!(!repo.has_pending_deltas());
    let mut sent = Vec::new();
    remote.download(&ckpt::remote::object_key(&id), &mut sent, u64::MAX).unwrap();
    assert!((sent.len() as u64) < uncoded * 9 / 10, "{} of {uncoded} bytes", sent.len());
    assert_eq!(sent.len() as u64, repo.store().stored_len(&id).unwrap());
    assert_eq!(repo.read_file_bytes("HEAD", "m.safetensors", 1 << 30).unwrap(), bytes);
}

/// `Writer(keep_last=1)`'s order after a save: prune, then compact. The prune drops the
/// previous save and the new one becomes where history ends; its own blobs, stored uncoded as
/// DCP wrote them, are still coded (they used to stay raw for good: the prune forgot the
/// version's pending entry along with its parent's rewrites).
#[test]
fn a_prune_that_cuts_history_at_a_save_still_codes_its_pieces() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let repo = Repo::init(&dir.path().join("repo")).unwrap();
    let mut last = None;
    let mut piece = None;
    for seed in [5, 6] {
        let bytes = crate::support::util::safetensors_file(seed, &[("w", Dtype::F32, &[256, 256])]);
        let header = ckpt::safetensors::parse(&bytes).unwrap();
        let w = header.tensors.iter().find(|t| t.name == "w").unwrap();
        let spool = dir.path().join(format!("m{seed}.safetensors"));
        let file = std::fs::File::create(&spool).unwrap();
        file.set_len(bytes.len() as u64).unwrap();
        file.write_all_at(&bytes[..w.begin as usize], 0).unwrap();
        let pieces = ckpt::repo::Pieces::new();
        repo.store_piece(&pieces, "m.safetensors", w.begin, &bytes[w.begin as usize..w.end as usize], Dtype::F32)
            .unwrap();
        let path = ckpt::repo::RepoPath::parse("m.safetensors").unwrap();
        let entry = repo.store_objects(&spool, &path, last.as_ref(), None, Some(&pieces)).unwrap();
        let version = repo.commit_stored("main", last, vec![entry.clone()], "save", &CommitOptions::default()).unwrap();
        last = Some(version);
        piece =
            repo.manifest(&entry.manifest).unwrap().segments.iter().find(|s| s.len == w.end - w.begin).unwrap().blob;
    }
    let piece = piece.unwrap();
    assert!(repo.store().open_blob(&piece).unwrap().is_uncoded().unwrap());
    let options = ckpt::repo::PruneOptions { gc: Some(ckpt::repo::GcOptions::now()), ..Default::default() };
    let report = repo.prune(1, &options).unwrap();
    assert_eq!(report.dropped.len(), 1, "{report:?}");
    assert!(!repo.store().open_blob(&piece).unwrap().is_uncoded().unwrap(), "the kept save's tensor is coded");
    assert!(!repo.has_pending_deltas());
    let bytes = crate::support::util::safetensors_file(6, &[("w", Dtype::F32, &[256, 256])]);
    assert_eq!(repo.read_file_bytes("HEAD", "m.safetensors", 1 << 30).unwrap(), bytes);
    assert!(repo.verify().unwrap().is_ok());
}
