//! What `gc` keeps and `verify` checks: one root set (`Repo::roots`: every ref in any namespace,
//! remote-tracking refs included, a detached `HEAD`, the records that name versions), and the
//! kinds and lengths of what reachable versions name.

use crate::support::remote::{directory, model, trained, Served};
use crate::support::repo_util::{read_tree, stderr, TestRepo};
use ckpt::repo::{file_hash, FileEntry, FileFormat, Manifest, Segment, Version};
use ckpt::store::ObjectKind;
use ckpt::ObjectId;
use std::path::{Path, PathBuf};

/// A remote holding `main` (2 versions) and `side` (a third version of its own), and a clone
/// of it, which has `main` as a branch and `side` only as `origin/side`. Returns the remote,
/// the original, and the clone's parent directory and path.
fn clone_with_a_remote_branch() -> (Served, tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let r = directory().unwrap();
    let a = trained(&r, 7, 2);
    r.ok(a.path(), &["branch", "side"]);
    r.ok(a.path(), &["switch", "side"]);
    std::fs::write(a.path().join("model.safetensors"), model(8, 5)).unwrap();
    std::fs::write(a.path().join("notes.txt"), b"only on side").unwrap();
    r.ok(a.path(), &["commit", "-m", "side", "model.safetensors", "notes.txt"]);
    r.ok(a.path(), &["switch", "main"]);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push", "--all"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    assert!(b.join(".ckpt/refs/remotes/origin/side").is_file(), "the clone tracks origin/side");
    assert!(!b.join(".ckpt/refs/heads/side").exists(), "side is only a remote-tracking branch");
    (r, a, parent, b)
}

fn checkout_to(r: &Served, repo: &Path, rev: &str) -> Vec<(String, Vec<u8>)> {
    let out = tempfile::tempdir().unwrap();
    r.ok(repo, &["checkout", rev, "--output", out.path().to_str().unwrap()]);
    read_tree(out.path())
}

#[test]
fn gc_in_a_clone_keeps_what_remote_tracking_refs_reach() {
    let (r, a, _parent, b) = clone_with_a_remote_branch();
    let expected = checkout_to(&r, a.path(), "side");
    assert!(expected.iter().any(|(p, _)| p == "notes.txt"));
    r.ok(&b, &["gc", "--prune=now"]);
    assert!(checkout_to(&r, &b, "origin/side") == expected, "origin/side after gc");
    r.ok(&b, &["verify"]);
    // A detached HEAD and a ref in a namespace of its own are roots too.
    let side = std::fs::read_to_string(b.join(".ckpt/refs/remotes/origin/side")).unwrap();
    std::fs::write(b.join(".ckpt/HEAD"), &side).unwrap();
    std::fs::remove_dir_all(b.join(".ckpt/refs/remotes")).unwrap();
    r.ok(&b, &["gc", "--prune=now"]);
    assert!(checkout_to(&r, &b, "HEAD") == expected, "detached HEAD after gc");
    std::fs::create_dir_all(b.join(".ckpt/refs/kept")).unwrap();
    std::fs::write(b.join(".ckpt/refs/kept/x"), &side).unwrap();
    r.ok(&b, &["switch", "main"]);
    r.ok(&b, &["gc", "--prune=now"]);
    assert!(checkout_to(&r, &b, side.trim()) == expected, "a ref under refs/kept/ after gc");
    // Nothing names it any more: now gc may delete it.
    std::fs::remove_dir_all(b.join(".ckpt/refs/kept")).unwrap();
    r.ok(&b, &["gc", "--prune=now"]);
    assert!(!r.ckpt(&b, &["checkout", side.trim(), "--output", b.join("x").to_str().unwrap()]).status.success());
    r.ok(&b, &["verify"]);
}

#[test]
fn gc_refuses_to_run_when_a_ref_cannot_be_read() {
    let (r, _a, _parent, b) = clone_with_a_remote_branch();
    std::fs::write(b.join(".ckpt/refs/remotes/origin/side"), b"not a version id\n").unwrap();
    let before = std::fs::read_dir(b.join(".ckpt/objects")).unwrap().count();
    let out = r.ckpt(&b, &["gc", "--prune=now"]);
    assert!(!out.status.success(), "gc ran with an unreadable ref");
    assert!(stderr(&out).contains("origin/side"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(b.join(".ckpt/objects")).unwrap().count(), before);
}

#[test]
fn verify_checks_what_remote_tracking_refs_need_and_names_the_ref() {
    let (r, _a, _parent, b) = clone_with_a_remote_branch();
    let repo = ckpt::repo::Repo::open(&b).unwrap();
    let side = repo.resolve("origin/side").unwrap();
    let main = repo.resolve("main").unwrap();
    // The blob of notes.txt: needed by origin/side only.
    let blob = ObjectId::hash(b"only on side");
    assert!(repo.store().contains(&blob));
    std::fs::remove_file(repo.store().object_path(&blob)).unwrap();
    let report = repo.verify().unwrap();
    assert!(!report.is_ok(), "{report:?}");
    let bad = report.bad_objects.iter().find(|o| o.id == blob).expect("the missing blob is named");
    assert!(bad.problem.contains("missing") && bad.problem.contains("refs/remotes/origin/side"), "{}", bad.problem);
    let v = report.bad_versions.iter().find(|v| v.id == side).expect("origin/side's version is bad");
    assert_eq!(v.reached_from, "refs/remotes/origin/side");
    assert!(report.bad_versions.iter().all(|v| v.id != main), "main does not need it: {report:?}");
    let out = r.ckpt(&b, &["verify"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&blob.to_hex()) && text.contains("refs/remotes/origin/side"), "{text}");
    // gc refuses too: it cannot see what the missing object needs.
    assert!(repo.gc_with(&ckpt::repo::GcOptions::now()).is_err());
}

/// Writes `version` as a store object and points tag `name` at it (what a fetch of a hostile
/// remote's ref would leave).
fn plant(t: &TestRepo, repo: &ckpt::repo::Repo, name: &str, version: &Version) -> ObjectId {
    let written =
        repo.store().write_data(ObjectKind::Version, &version.to_bytes(), &ckpt::codec::Options::default()).unwrap();
    std::fs::write(t.path(".ckpt/refs/tags").join(name), format!("{}\n", written.id)).unwrap();
    written.id
}

#[test]
fn verify_rejects_a_parent_of_the_wrong_kind() {
    let t = TestRepo::init();
    let repo = t.open();
    let head = t.commit_files(&repo, &[("a.bin", b"first")], "1");
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
    let mut evil = repo.version(&head).unwrap();
    let manifest = evil.files[0].manifest;
    evil.parents = vec![manifest];
    evil.message = "my parent is a manifest".into();
    let id = plant(&t, &repo, "evil", &evil);
    let report = repo.verify().unwrap();
    assert!(!report.is_ok(), "a version whose parent is a manifest passed: {report:?}");
    let bad = report.bad_objects.iter().find(|o| o.id == id).expect("the version is named");
    assert!(bad.problem.contains("parent") && bad.problem.contains("manifest"), "{}", bad.problem);
    assert!(report.bad_versions.iter().any(|v| v.id == id && v.reached_from == "refs/tags/evil"), "{report:?}");
    // A file entry naming a version instead of a manifest, likewise.
    let mut evil = repo.version(&head).unwrap();
    evil.files[0].manifest = head;
    evil.message = "my manifest is a version".into();
    std::fs::remove_file(t.path(".ckpt/refs/tags/evil")).unwrap();
    let id = plant(&t, &repo, "evil2", &evil);
    let report = repo.verify().unwrap();
    let bad = report.bad_objects.iter().find(|o| o.id == id).expect("the version is named");
    assert!(bad.problem.contains("not a manifest"), "{}", bad.problem);
}

#[test]
fn verify_rejects_a_segment_length_its_blob_does_not_have() {
    let t = TestRepo::init();
    let repo = t.open();
    let head = t.commit_files(&repo, &[("a.bin", b"first")], "1");
    let blob = ObjectId::hash(b"first");
    // A manifest (parsed fine: its lengths and file hash agree with each other) that says the
    // 5-byte blob holds 3 bytes.
    let segments = vec![Segment::whole(3, blob, None)];
    let hash = file_hash(3, segments.iter().map(|s| (s.len, s.blob.unwrap())));
    let manifest = Manifest::new(FileFormat::Bytes, 3, hash, vec![], segments);
    let written =
        repo.store().write_data(ObjectKind::Manifest, &manifest.to_bytes(), &ckpt::codec::Options::default()).unwrap();
    repo.manifest(&written.id).expect("a well-formed manifest");
    let mut evil = repo.version(&head).unwrap();
    evil.parents = vec![head];
    evil.files = vec![FileEntry { path: "a.bin".into(), manifest: written.id, len: 3, hash }];
    evil.message = "short".into();
    let id = plant(&t, &repo, "short", &evil);
    let report = repo.verify().unwrap();
    assert!(!report.is_ok(), "a segment length its blob does not have passed: {report:?}");
    let bad = report.bad_objects.iter().find(|o| o.id == written.id).expect("the manifest is named");
    assert!(bad.problem.contains("3 bytes") && bad.problem.contains("5 bytes"), "{}", bad.problem);
    assert!(report.bad_versions.iter().any(|v| v.id == id), "{report:?}");
    assert!(report.bad_versions.iter().all(|v| v.id != head), "the good version is fine: {report:?}");
}

/// The working tree's stat records vouch that a file's content is in the store (so checkout may
/// overwrite it without reading it). After gc deleted that content, the file may be its only
/// copy: a checkout must refuse to overwrite it, not destroy it.
#[test]
fn gc_does_not_leave_records_vouching_for_deleted_content() {
    let t = TestRepo::init();
    let run = |args: &[&str]| {
        let o = t.ckpt(args);
        assert!(o.status.success(), "ckpt {args:?}: {}", stderr(&o));
    };
    t.write("a.bin", b"on main");
    run(&["commit", "-m", "1", "a.bin"]);
    run(&["branch", "tmp"]);
    run(&["switch", "tmp"]);
    t.write("a.bin", b"only on tmp, and in the working tree");
    run(&["commit", "-m", "2", "a.bin"]);
    // The branch goes (deleted by hand here), the working tree stays: HEAD on main.
    std::fs::write(t.path(".ckpt/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::remove_file(t.path(".ckpt/refs/heads/tmp")).unwrap();
    run(&["gc", "--prune=now"]);
    let out = t.ckpt(&["checkout", "main", "a.bin"]);
    assert_eq!(t.read("a.bin"), b"only on tmp, and in the working tree", "the only copy was overwritten");
    assert!(!out.status.success(), "checkout overwrote a file whose content gc deleted");
    assert!(stderr(&out).contains("a.bin"), "{}", stderr(&out));
}

#[test]
fn gc_removes_the_staging_directory_a_killed_checkout_left_and_spares_a_young_one() {
    let t = TestRepo::init();
    let repo = ckpt::repo::Repo::open(t.dir.path()).unwrap();
    let tmp = t.dir.path().join(".ckpt/tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // What a checkout killed mid-way leaves: a staging directory with a staged file in it.
    let old = tmp.join(".ckpt-checkout-old");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("model.safetensors"), vec![7u8; 4096]).unwrap();
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 24 * 3600);
    std::fs::File::open(&old).unwrap().set_modified(two_days_ago).unwrap();
    // A checkout still writing (checkouts take no lock): its directory is young.
    let young = tmp.join(".ckpt-checkout-young");
    std::fs::create_dir_all(&young).unwrap();
    std::fs::write(young.join("model.safetensors"), vec![7u8; 4096]).unwrap();
    let report = repo.gc_with(&ckpt::repo::GcOptions::now()).unwrap();
    assert!(!old.exists(), "the leftover staging directory is still there");
    assert!(young.join("model.safetensors").exists(), "gc deleted a running checkout's staging");
    assert_eq!(report.temp_files, 1);
}
