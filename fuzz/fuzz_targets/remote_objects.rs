//! Fuzzes what `fetch`, `pull` and `clone` do with a version or manifest object a remote sends
//! (`Repo::download` in src/repo/remote.rs): `Store::read_received` (object header, kind, size
//! cap, container, content hash) and then `Version::parse` or `Manifest::parse` on the content.
//! None may panic; what they accept must satisfy what the rest of ckpt relies on without
//! checking again (segments cover the file, every segment has a place, paths are sorted and
//! unique), and must serialize back to bytes that parse to the same value.
//!
//! Input: an object file as downloaded (starting with the object magic), whose checksums are
//! repaired first (`ckpt_fuzz::repair_object`: a remote can send any bytes, but only bytes with
//! valid checksums get past them); or any other bytes, taken as the content (JSON) of a
//! version and of a manifest.
//!
//! Memory: run with `-rss_limit_mb` and `-malloc_limit_mb` (fuzz/run.sh does) so that an input
//! that makes ckpt allocate far more than its own size is reported as a crash.
#![no_main]

use ckpt::repo::{Manifest, Version};
use ckpt::store::{ObjectKind, Store, OBJECT_MAGIC};
use ckpt::ObjectId;
use std::io::Write;
use std::sync::OnceLock;

/// The store received objects are written into, as `fetch` does (its `tmp/`), created once per
/// process in the system temp directory.
fn store() -> &'static Store {
    static STORE: OnceLock<(tempfile::TempDir, Store)> = OnceLock::new();
    &STORE
        .get_or_init(|| {
            let dir = tempfile::Builder::new().prefix("ckpt-fuzz-remote-").tempdir().expect("a temp directory");
            let store = Store::init(dir.path()).expect("a store in a new temp directory");
            (dir, store)
        })
        .1
}

/// The checks a version `fetch` accepted must pass: what checkout, log and gc assume.
fn check_version(id: ObjectId, v: &Version) {
    assert!(v.files.windows(2).all(|w| w[0].path < w[1].path), "paths not sorted and unique");
    for f in &v.files {
        assert_eq!(v.file(&f.path).map(|e| &e.path), Some(&f.path));
        assert!(ckpt::repo::RepoPath::parse(&f.path).is_ok(), "path {:?} accepted", f.path);
    }
    assert!(!v.parents.contains(&id), "its own parent");
    let again = Version::parse(id, &v.to_bytes()).expect("its canonical bytes parse");
    assert_eq!(&again, v, "canonical bytes parse to another version");
}

/// The checks a manifest `fetch` accepted must pass: what checkout and verify assume.
fn check_manifest(id: ObjectId, m: &Manifest) {
    let mut total = 0u64;
    for s in &m.segments {
        total = total.checked_add(s.len).expect("parse checked the sum");
        // Panics (index or unreachable) if a segment has no place.
        let (blob, range) = m.location(s);
        assert_eq!(range.end - range.start, s.len);
        if let Some(b) = s.bundle {
            let bundle = &m.bundles[b as usize];
            assert_eq!(blob, bundle.blob);
            assert!(range.end <= bundle.len, "segment past the end of bundle {b}");
        }
        if let Some(t) = &s.tensor {
            assert!(t.dtype().is_some(), "tensor {:?} with dtype {:?} accepted", t.name, t.dtype);
        }
    }
    assert_eq!(total, m.len, "segments do not cover the file");
    let members = m.bundle_members();
    assert_eq!(members.len(), m.bundles.len());
    assert!(members.iter().all(|v| !v.is_empty()), "an empty bundle accepted");
    assert_eq!(m.bundle_keys().len(), m.bundles.len());
    assert_eq!(m.blobs().count(), m.segments.iter().filter(|s| s.blob.is_some()).count() + m.bundles.len());
    let again = Manifest::parse(id, &m.to_bytes()).expect("its canonical bytes parse");
    assert_eq!(&again, m, "canonical bytes parse to another manifest");
}

/// The content of a version or manifest object, as `fetch` parses it after `read_received`.
fn parse_content(id: ObjectId, kind: ObjectKind, content: &[u8]) {
    match kind {
        ObjectKind::Version => {
            if let Ok(v) = Version::parse(id, content) {
                check_version(id, &v);
            }
        }
        ObjectKind::Manifest => {
            if let Ok(m) = Manifest::parse(id, content) {
                check_manifest(id, &m);
            }
        }
        ObjectKind::Blob => unreachable!("only versions and manifests are parsed"),
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if !data.starts_with(&OBJECT_MAGIC) {
        let id = ObjectId::hash(data);
        parse_content(id, ObjectKind::Version, data);
        parse_content(id, ObjectKind::Manifest, data);
        return;
    }
    let mut object = data.to_vec();
    // The id fetch asks for: the one the container records (the version or manifest naming
    // this object chose it); any id if the container does not open.
    let id = ckpt_fuzz::repair_object(&mut object).unwrap_or(ObjectId([7; 32]));
    let store = store();
    let mut tmp = store.receive_file().expect("a temp file in the store");
    tmp.write_all(&object).expect("writing the received object");
    for kind in [ObjectKind::Version, ObjectKind::Manifest] {
        if let Ok(content) = store.read_received(&id, kind, &tmp) {
            assert_eq!(ObjectId::hash(&content), id, "read_received returned content of another id");
            parse_content(id, kind, &content);
        }
    }
});
