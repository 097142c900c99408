//! Issue 39, item 9: a forged manifest naming one blob in 70,000 segments is checked out with
//! the blob mapped once (one map per segment ran into `vm.max_map_count`), and `ckpt gc
//! --remote` takes a directory path outside a repository, as `remote add` does.

use crate::support::remote::{directory, trained};
use crate::support::repo_util::{ckpt_in, stderr, TestRepo};
use crate::support::util::noise;
use ckpt::repo::{file_hash, FileEntry, FileFormat, Manifest, Segment};
use ckpt::store::ObjectKind;
use ckpt::ObjectId;

/// More segments than Linux's default `vm.max_map_count` (65,530) allows maps.
const SEGMENTS: usize = 70_000;

#[test]
fn a_manifest_naming_one_blob_in_70000_segments_maps_it_once() {
    let t = TestRepo::init();
    let repo = t.open();
    let content = noise(7, 100);
    let head = t.commit_files(&repo, &[("a.bin", &content)], "1");
    let blob = ObjectId::hash(&content);
    assert!(repo.store().contains(&blob), "the file is one blob");
    let segments: Vec<Segment> = (0..SEGMENTS).map(|_| Segment::whole(content.len() as u64, blob, None)).collect();
    let len = (content.len() * SEGMENTS) as u64;
    let hash = file_hash(len, segments.iter().map(|s| (s.len, s.blob.unwrap())));
    let manifest = Manifest::new(FileFormat::Bytes, len, hash, vec![], segments);
    let written =
        repo.store().write_data(ObjectKind::Manifest, &manifest.to_bytes(), &ckpt::codec::Options::default()).unwrap();
    let mut version = repo.version(&head).unwrap();
    version.parents = vec![head];
    version.files = vec![FileEntry { path: "many.bin".into(), manifest: written.id, len, hash }];
    version.message = "one blob, 70,000 times".into();
    let v =
        repo.store().write_data(ObjectKind::Version, &version.to_bytes(), &ckpt::codec::Options::default()).unwrap();
    drop(repo);

    let out = tempfile::tempdir().unwrap();
    let o = t.ckpt(&["checkout", &v.id.to_hex(), "--output", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "checkout: {}", stderr(&o));
    let many = std::fs::read(out.path().join("many.bin")).unwrap();
    assert_eq!(many.len(), content.len() * SEGMENTS);
    assert!(many.chunks(content.len()).all(|c| c == content.as_slice()), "every segment is the blob");
}

#[test]
fn gc_remote_takes_a_directory_path_outside_a_repository() {
    let r = directory().unwrap();
    let a = trained(&r, 3, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let elsewhere = tempfile::tempdir().unwrap();
    // An absolute path, and one relative to the current directory.
    let o = ckpt_in(elsewhere.path(), &["gc", "--remote", &r.url, "--dry-run", "--json"]);
    assert!(o.status.success(), "gc --remote PATH: {}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["refs"], 1, "{report}");
    let remote = std::path::Path::new(&r.url);
    let o = ckpt_in(remote.parent().unwrap(), &["gc", "--remote", "./remote", "--dry-run", "--json"]);
    assert!(o.status.success(), "gc --remote ./PATH: {}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["refs"], 1, "{report}");
}
