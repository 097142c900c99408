//! Damage and contention: flipped bytes in the store, malformed input, a second writer.

use crate::support::repo_util::{read_tree, stderr, synthetic_checkpoint, Files, Rng, TestRepo, SMALL_MODEL};
use ckpt::repo::{CommitOptions, Config, Repo, VersionId};
use ckpt::{Dtype, ObjectId};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Object ids (as named in the store) from object file paths.
fn id_of(path: &Path) -> ObjectId {
    let fan = path.parent().unwrap().file_name().unwrap().to_str().unwrap();
    format!("{fan}{}", path.file_name().unwrap().to_str().unwrap()).parse().unwrap()
}

#[test]
fn a_flipped_byte_anywhere_is_detected_by_verify_and_checkout() {
    let t = TestRepo::with_config(&Config { base_every: 3, chunk_size: 4096, ..Config::default() });
    let repo = t.open();
    let model: &[(&str, &[u64])] = &[("a", &[48, 40]), ("b", &[40])];
    let mut history: Vec<(VersionId, Files)> = Vec::new();
    for e in 0..4 {
        let m = synthetic_checkpoint(4, Dtype::Bf16, model, e);
        let id = t.commit_files(&repo, &[("m.safetensors", &m), ("n.txt", b"notes")], "e");
        history.push((id, vec![("m.safetensors".into(), m), ("n.txt".into(), b"notes".to_vec())]));
    }
    drop(repo);
    let repo = Repo::open(t.root()).unwrap();
    let mut rng = Rng::new(7);
    let mut trials = 0;
    for path in t.object_files() {
        let id = id_of(&path);
        let good = std::fs::read(&path).unwrap();
        // Header bytes, the last bytes, and random positions in between.
        let mut positions: BTreeSet<usize> = [0, 9, 40, 71, 72, 100, good.len() - 1, good.len() - 60].into();
        while positions.len() < 14 {
            positions.insert(rng.below(good.len() as u64) as usize);
        }
        for at in positions.into_iter().filter(|&a| a < good.len()) {
            trials += 1;
            let mut bad = good.clone();
            bad[at] ^= 1 << rng.below(8);
            std::fs::write(&path, &bad).unwrap();
            let report = repo.verify().unwrap();
            assert!(!report.is_ok(), "flip at {at} of {id} went unnoticed");
            assert!(
                report.bad_objects.iter().any(|b| b.id == id),
                "verify names the damaged object {id}: {:?}",
                report.bad_objects
            );
            assert!(!report.bad_versions.is_empty(), "every object here is needed by some version");
            for bad_version in &report.bad_versions {
                let out = tempfile::tempdir().unwrap();
                let result = repo.checkout(&bad_version.id.to_hex(), None, Some(out.path()), None);
                assert!(result.is_err(), "checkout of affected version {} succeeded", bad_version.id);
                // Whatever was written is correct; the damaged file is not there.
                let expected = &history.iter().find(|h| h.0 == bad_version.id).expect("known version").1;
                let written = read_tree(out.path());
                assert!(written.len() < expected.len() || expected.is_empty());
                for (name, bytes) in written {
                    assert!(!name.contains(".ckpt-tmp-"), "temp file left behind: {name}");
                    assert_eq!(&expected.iter().find(|e| e.0 == name).unwrap().1, &bytes, "{name}");
                }
            }
            std::fs::write(&path, &good).unwrap();
        }
    }
    assert!(trials > 100, "{trials} trials");
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
    // The CLI exits 1 and names the object.
    let path = t.object_files()[0].clone();
    let mut bad = std::fs::read(&path).unwrap();
    let n = bad.len();
    bad[n / 2] ^= 0x20;
    std::fs::write(&path, &bad).unwrap();
    drop(repo);
    let o = t.ckpt(&["verify"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&id_of(&path).to_hex()), "{out}");
}

/// An object that decodes cleanly to the wrong bytes (blob `b`'s object under `a`'s name, its
/// recorded hash and checksums rewritten to match `a`: what a codec bug would leave) is caught
/// only by hashing what it decodes to: checkout must fail naming it and write nothing, and
/// verify must name it.
#[test]
fn a_well_formed_object_under_another_id_fails_checkout_by_hash() {
    let t = TestRepo::init();
    let repo = t.open();
    let model = synthetic_checkpoint(9, Dtype::Bf16, &[("a", &[64, 32]), ("b", &[64, 32])], 0);
    t.commit_files(&repo, &[("m.safetensors", &model)], "one");
    let header = ckpt::safetensors::parse(&model).unwrap();
    let blob_of = |name: &str| {
        let t = header.tensors.iter().find(|t| t.name == name).unwrap();
        ObjectId::hash(&model[t.begin as usize..t.end as usize])
    };
    let (a, b) = (blob_of("a"), blob_of("b"));
    let mut object = std::fs::read(repo.store().object_path(&b)).unwrap();
    // docs/format.md: a 72-byte object header, then the container; its 64-byte footer holds the
    // index length (8..16), the original's blake3 (16..48) and a checksum of header, index
    // and footer bytes 0..48 (48..56).
    let container = &mut object[72..];
    let n = container.len();
    let index_len = u64::from_le_bytes(container[n - 56..n - 48].try_into().unwrap()) as usize;
    container[n - 48..n - 16].copy_from_slice(&a.0);
    let mut check = blake3::Hasher::new();
    check.update(&container[..32]);
    check.update(&container[n - 64 - index_len..n - 64]);
    check.update(&container[n - 64..n - 16]);
    let check = check.finalize();
    container[n - 16..n - 8].copy_from_slice(&check.as_bytes()[..8]);
    std::fs::write(repo.store().object_path(&a), &object).unwrap();
    let out = t.path("out");
    let err = repo.checkout("HEAD", None, Some(&out), None).unwrap_err().to_string();
    assert!(err.contains(&a.to_hex()), "the error names the object: {err}");
    assert!(read_tree(&out).is_empty(), "nothing written");
    let report = repo.verify().unwrap();
    assert!(report.bad_objects.iter().any(|o| o.id == a), "{report:?}");
}

#[test]
fn missing_object_is_reported_with_its_versions() {
    let t = TestRepo::init();
    let repo = t.open();
    t.commit_files(&repo, &[("a.bin", b"first")], "1");
    t.commit_files(&repo, &[("b.bin", b"second")], "2");
    let blob = ObjectId::hash(b"first");
    std::fs::remove_file(repo.store().object_path(&blob)).unwrap();
    let report = repo.verify().unwrap();
    assert_eq!(report.bad_versions.len(), 2, "{report:?}");
    assert!(report.bad_objects.iter().any(|b| b.id == blob && b.problem.contains("missing")));
    assert!(repo.checkout("HEAD", None, Some(&t.path("out")), None).is_err());
    // gc refuses to run on a history it cannot read completely? Blobs are only read by
    // header, so a missing blob stops gc before it deletes anything.
    assert!(repo.gc_with(&ckpt::repo::GcOptions::now()).is_err());
    // History stays readable: log counts the missing blob as 0 bytes.
    let o = t.ckpt(&["log", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(log.as_array().unwrap().len(), 2);
    // A damaged manifest too.
    let manifest = repo.version(&repo.resolve("HEAD").unwrap()).unwrap().files[0].manifest;
    std::fs::write(repo.store().object_path(&manifest), b"not a manifest").unwrap();
    let o = t.ckpt(&["log"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn malformed_safetensors_commit_fails_and_changes_nothing() {
    let t = TestRepo::init();
    let good = synthetic_checkpoint(1, Dtype::F32, SMALL_MODEL, 0);
    t.write("good.safetensors", &good);
    assert!(t.ckpt(&["commit", "-m", "ok", "good.safetensors"]).status.success());
    let objects = t.object_files();
    let log = t.ckpt(&["log", "--json"]).stdout;
    let head = std::fs::read(t.path(".ckpt/refs/heads/main")).unwrap();

    // The second tensor moved 4 bytes back, into the first.
    let mut overlapping = good.clone();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let json = String::from_utf8(good[8..8 + header_len].to_vec()).unwrap();
    let (begin, end) = (64 * 96 * 4, 64 * 96 * 4 + 96 * 96 * 4);
    let patched = json.replacen(&format!("[{begin},{end}]"), &format!("[{},{}]", begin - 4, end - 4), 1);
    assert_ne!(patched, json);
    overlapping.splice(8..8 + header_len, patched.bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short.safetensors", vec![1, 2, 3], "too short"),
        ("json.safetensors", [&8u64.to_le_bytes()[..], b"{\"a\":1,}"].concat(), "JSON"),
        ("overlap.safetensors", overlapping, "overlap"),
        ("huge.safetensors", [&u64::MAX.to_le_bytes()[..], b"{}"].concat(), "header"),
    ];
    for (name, bytes, problem) in cases {
        t.write(name, &bytes);
        t.write("other.bin", b"also named");
        let o = t.ckpt(&["commit", "-m", "bad", "other.bin", name]);
        assert_eq!(o.status.code(), Some(1), "{name}");
        let err = stderr(&o);
        assert!(err.contains(name), "error names the file: {err}");
        assert!(err.to_lowercase().contains(&problem.to_lowercase()), "error says what is wrong ({problem}): {err}");
        assert_eq!(t.object_files(), objects, "{name}: the store is unchanged");
        assert_eq!(t.ckpt(&["log", "--json"]).stdout, log);
        assert_eq!(std::fs::read(t.path(".ckpt/refs/heads/main")).unwrap(), head);
    }
    // A file that is not named *.safetensors and does not parse is stored as bytes.
    t.write("weird.bin", b"\x05\0\0\0\0\0\0\0{bad}");
    assert!(t.ckpt(&["commit", "-m", "bytes", "weird.bin"]).status.success());
}

#[test]
fn a_second_writer_waits_or_fails_cleanly() {
    let t = TestRepo::init();
    t.write("a.bin", b"a");
    t.write("b.bin", b"b");
    // Hold the writer lock from "another process" (this test) while a commit starts.
    let lock = std::fs::File::options().write(true).open(t.path(".ckpt/lock")).unwrap();
    lock.lock().unwrap();
    let started = std::time::Instant::now();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(["commit", "-m", "blocked", "a.bin"])
        .current_dir(t.root())
        .env("CKPT_LOCK_TIMEOUT", "0.5")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert!(stderr(&o).contains("another ckpt process is writing"), "{}", stderr(&o));
    assert!(t.object_files().is_empty());

    // A writer that waits gets through once the lock is released.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(["commit", "-m", "waited", "a.bin"])
        .current_dir(t.root())
        .env("CKPT_LOCK_TIMEOUT", "30")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lock.unlock().unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // Two writers at once: both commits land, one after the other.
    let spawn = |file: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ckpt"))
            .args(["commit", "-m", file, file])
            .current_dir(t.root())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (x, y) = (spawn("a.bin"), spawn("b.bin"));
    for c in [x, y] {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let repo = t.open();
    assert_eq!(repo.log("HEAD").unwrap().len(), 3);
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
    let v = repo.version(&repo.resolve("HEAD").unwrap()).unwrap();
    assert_eq!(v.files.len(), 2);
    let _ = repo.commit(&["a.bin"], "library", &CommitOptions::default()).unwrap();
}
