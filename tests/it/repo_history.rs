//! Commit and check out histories: bit-exact round trips, dedup, the delta policies, files
//! carried over and removed, tensor filters, revisions, refs, status, log and the index.

use crate::support::repo_util::{
    ckpt_in, read_tree, stderr, synthetic_checkpoint, Files, TestRepo, SMALL_MODEL, TRAINING_MODEL,
};
use ckpt::repo::{
    CheckoutOptions, CommitOptions, Config, DeltaPolicy, FileState, Repo, SegmentShow, Storage, VersionId,
};
use ckpt::store::ObjectKind;
use ckpt::Dtype;
use std::path::PathBuf;

/// Chain depth of every blob in the store, as it is now.
fn blob_depths(repo: &Repo) -> Vec<u32> {
    let store = repo.store();
    store
        .list()
        .unwrap()
        .iter()
        .filter(|id| store.header(id).is_ok_and(|h| h.kind == ObjectKind::Blob))
        .map(|id| store.chain_depth(id).unwrap())
        .collect()
}

/// Commits `epochs` epochs of a model (and an opaque notes file); returns the version ids and
/// the files each version should have.
fn commit_epochs(t: &TestRepo, repo: &Repo, dtype: Dtype, epochs: u32) -> Vec<(VersionId, Files)> {
    let mut out = Vec::new();
    for e in 0..epochs {
        let model = synthetic_checkpoint(11, dtype, SMALL_MODEL, e);
        let notes = format!("epoch {e}\n").into_bytes();
        let id =
            t.commit_files(repo, &[("ckpt/model.safetensors", &model), ("notes.txt", &notes)], &format!("epoch {e}"));
        out.push((id, vec![("ckpt/model.safetensors".to_string(), model), ("notes.txt".to_string(), notes)]));
    }
    out
}

#[test]
fn epochs_check_out_bit_exactly_and_deltas_pay() {
    for dtype in [Dtype::Bf16, Dtype::F32] {
        let t = TestRepo::with_config(&Config {
            base_every: 4,
            chunk_size: 8192,
            delta_policy: DeltaPolicy::Previous,
            ..Config::default()
        });
        let repo = t.open();
        let history = commit_epochs(&t, &repo, dtype, 7);
        for (id, files) in &history {
            assert_eq!(&t.checkout_all(&repo, &id.to_hex()), files, "{dtype} version {id:?}");
        }
        let log = repo.log("HEAD").unwrap();
        assert_eq!(log.len(), 7);
        assert_eq!(log.iter().map(|v| v.id).rev().collect::<Vec<_>>(), history.iter().map(|h| h.0).collect::<Vec<_>>());
        // Epoch 0 and 4 store full bases; the others only deltas, which must be much smaller.
        let stored: Vec<u64> = log.iter().rev().map(|v| v.stored_bytes).collect();
        for e in [1, 2, 3, 5, 6] {
            assert!(stored[e] * 2 < stored[0], "{dtype}: epoch {e} stored {} vs base {}", stored[e], stored[0]);
        }
        assert!(stored[4] * 2 > stored[0], "{dtype}: epoch 4 is a full base: {stored:?}");
        let depths = blob_depths(&repo);
        assert!(depths.iter().all(|&d| d <= 3), "chains bounded by base_every - 1: {depths:?}");
        assert!(depths.contains(&3));
        // The working tree matches HEAD.
        assert!(repo.status().unwrap().files.iter().all(|f| f.state == FileState::Unchanged));
        let report = repo.verify().unwrap();
        assert!(report.is_ok(), "verify: {report:?}");
    }
}

#[test]
fn base_policy_deltas_have_depth_one() {
    let t = TestRepo::with_config(&Config {
        base_every: 4,
        chunk_size: 8192,
        delta_policy: DeltaPolicy::Base,
        ..Config::default()
    });
    let repo = t.open();
    let history = commit_epochs(&t, &repo, Dtype::Bf16, 6);
    for (id, files) in &history {
        assert_eq!(&t.checkout_all(&repo, &id.to_hex()), files);
    }
    let depths = blob_depths(&repo);
    assert!(depths.iter().all(|&d| d <= 1), "{depths:?}");
    assert!(depths.contains(&1));
    // The same history with a per-commit override of the policy.
    let t2 = TestRepo::with_config(&Config { base_every: 4, chunk_size: 8192, ..Config::default() });
    let repo2 = t2.open();
    let options = CommitOptions { delta_policy: Some(DeltaPolicy::Base), ..CommitOptions::default() };
    for e in 0..3 {
        t2.write("m.safetensors", &synthetic_checkpoint(3, Dtype::F32, SMALL_MODEL, e));
        repo2.commit(&["m.safetensors"], "e", &options).unwrap();
    }
    assert!(blob_depths(&repo2).iter().all(|&d| d <= 1));
}

/// Skip-deltas: version `s` after the base deltas against `s` with its lowest one bit cleared,
/// so the deepest tensor chain of each version is the number of one bits of `s`.
#[test]
fn skip_policy_bounds_depth_by_one_bits() {
    let t = TestRepo::with_config(&Config {
        base_every: 16,
        chunk_size: 8192,
        delta_policy: DeltaPolicy::Skip,
        ..Config::default()
    });
    let repo = t.open();
    let history = commit_epochs(&t, &repo, Dtype::Bf16, 9);
    for (s, (id, files)) in history.iter().enumerate() {
        assert_eq!(&t.checkout_all(&repo, &id.to_hex()), files, "version {s}");
        let show = repo.show(&id.to_hex()).unwrap();
        // Tensors this version added (unchanged ones are duplicates of an earlier version's).
        let added: Vec<u32> = show
            .files
            .iter()
            .flat_map(|f| &f.segments)
            .filter(|seg| seg.storage != Storage::Duplicate && seg.is_tensor)
            .map(|seg| seg.depth)
            .collect();
        assert!(!added.is_empty(), "version {s} adds tensors");
        assert!(added.iter().all(|&d| d == (s as u32).count_ones()), "version {s}: depths {added:?}");
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

/// Total size of the object files.
fn store_size(t: &TestRepo) -> u64 {
    let repo = t.open();
    let store = repo.store();
    store.list().unwrap().iter().map(|id| store.stored_len(id).unwrap()).sum()
}

/// Reverse deltas: after every commit the newest version's tensors are whole, and each older
/// version's are deltas against the next version's, up to the pinned version (`since_base` 0
/// with a parent: version 5 under `base_every` 5), which keeps its blobs whole. Every version
/// checks out bit-exactly throughout, and the store holds about what `previous` stores.
#[test]
fn reverse_policy_keeps_the_newest_version_whole() {
    let config = |delta_policy| Config { base_every: 5, chunk_size: 8192, delta_policy, ..Config::default() };
    let t = TestRepo::with_config(&config(DeltaPolicy::Reverse));
    let repo = t.open();
    let mut history: Vec<(VersionId, Files)> = Vec::new();
    for e in 0..8u32 {
        let model = synthetic_checkpoint(11, Dtype::Bf16, SMALL_MODEL, e);
        let id = t.commit_files(&repo, &[("model.safetensors", &model)], &format!("epoch {e}"));
        history.push((id, vec![("model.safetensors".to_string(), model)]));
        for (s, (id, files)) in history.iter().enumerate() {
            let s = s as u32;
            assert_eq!(&t.checkout_all(&repo, &id.to_hex()), files, "epoch {e}: version {s}");
            let expected = match s {
                0..=4 => e.min(5) - s,
                5 => 0,
                _ => e - s,
            };
            let show = repo.show(&id.to_hex()).unwrap();
            let added: Vec<_> = show
                .files
                .iter()
                .flat_map(|f| &f.segments)
                .filter(|seg| seg.is_tensor && seg.storage != Storage::Duplicate)
                .collect();
            // A blob of one file-system block stays whole: a delta could not free any space. (In
            // SMALL_MODEL that is the 192-byte bias; the others are 12 KiB or more.)
            let (small, large): (Vec<&&SegmentShow>, Vec<&&SegmentShow>) =
                added.iter().partition(|seg| seg.raw_bytes < 4096);
            assert!(!large.is_empty(), "version {s} adds tensors");
            assert!(small.iter().all(|seg| seg.depth == 0), "epoch {e}: version {s}: a small blob is a delta");
            let depths: Vec<u32> = large.iter().map(|seg| seg.depth).collect();
            assert!(depths.iter().all(|&d| d == expected), "epoch {e}: version {s}: depths {depths:?}, not {expected}");
        }
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
    drop(repo);

    let previous = TestRepo::with_config(&config(DeltaPolicy::Previous));
    let repo = previous.open();
    for (_, files) in &history {
        previous.commit_files(&repo, &[("model.safetensors", &files[0].1)], "epoch");
    }
    drop(repo);
    let (reverse_size, previous_size) = (store_size(&t), store_size(&previous));
    assert!(reverse_size * 20 < previous_size * 21, "reverse stores {reverse_size} bytes, previous {previous_size}");
}

/// After a change of `chunk_size` the parent's blobs cannot be deltas against the new ones
/// (chunk i must line up with chunk i): the commit succeeds and keeps both whole.
#[test]
fn reverse_policy_skips_blobs_of_another_chunk_size() {
    let config = |chunk_size| Config { chunk_size, delta_policy: DeltaPolicy::Reverse, ..Config::default() };
    let t = TestRepo::with_config(&config(8192));
    let v0 = synthetic_checkpoint(5, Dtype::F32, SMALL_MODEL, 0);
    let v1 = synthetic_checkpoint(5, Dtype::F32, SMALL_MODEL, 1);
    let first = t.commit_files(&t.open(), &[("m.safetensors", &v0)], "8 KiB chunks");
    t.write(".ckpt/config", &serde_json::to_vec(&config(16384)).unwrap());
    let repo = t.open();
    t.commit_files(&repo, &[("m.safetensors", &v1)], "16 KiB chunks");
    assert!(blob_depths(&repo).iter().all(|&d| d == 0), "{:?}", blob_depths(&repo));
    assert_eq!(t.checkout_all(&repo, &first.to_hex()), vec![("m.safetensors".to_string(), v0)]);
    assert_eq!(t.checkout_all(&repo, "HEAD"), vec![("m.safetensors".to_string(), v1)]);
}

/// A delta that does not pay leaves the parent's blob whole, and the new version's too.
#[test]
fn reverse_policy_keeps_unrelated_tensors_whole() {
    let t =
        TestRepo::with_config(&Config { chunk_size: 8192, delta_policy: DeltaPolicy::Reverse, ..Config::default() });
    let repo = t.open();
    let a = synthetic_checkpoint(1, Dtype::F32, SMALL_MODEL, 0);
    let b = synthetic_checkpoint(2, Dtype::F32, SMALL_MODEL, 0);
    let first = t.commit_files(&repo, &[("m.safetensors", &a)], "a");
    t.commit_files(&repo, &[("m.safetensors", &b)], "b");
    assert_eq!(t.checkout_all(&repo, &first.to_hex()), vec![("m.safetensors".to_string(), a)]);
    assert!(blob_depths(&repo).iter().all(|&d| d == 0), "{:?}", blob_depths(&repo));
}

/// Training loops that write every epoch under a new path (`epoch_3.safetensors`,
/// `checkpoint-1500/model.safetensors`) still get deltas: a path the reference version lacks is
/// matched to its safetensors file holding the same tensors, the newest one first.
#[test]
fn new_paths_delta_against_the_file_with_the_same_tensors() {
    for policy in [DeltaPolicy::Previous, DeltaPolicy::Reverse] {
        new_paths_delta_against_the_file_with_the_same_tensors_with(policy);
    }
}

fn new_paths_delta_against_the_file_with_the_same_tensors_with(delta_policy: DeltaPolicy) {
    let t = TestRepo::with_config(&Config { chunk_size: 8192, delta_policy, ..Config::default() });
    let repo = t.open();
    // An unrelated model with other tensor names, carried along in every version.
    let other = synthetic_checkpoint(9, Dtype::Bf16, &[("other.weight", &[64, 64])], 0);
    t.commit_files(&repo, &[("other.safetensors", &other)], "unrelated");
    let mut history = Vec::new();
    for e in 0..4u32 {
        let path = format!("run/checkpoint-{}/model.safetensors", 100 * (e + 1));
        let model = synthetic_checkpoint(11, Dtype::Bf16, SMALL_MODEL, e);
        let id = t.commit_files(&repo, &[(&path, &model)], &format!("epoch {e}"));
        history.push((id, path, model));
    }
    for (e, (id, path, model)) in history.iter().enumerate() {
        let show = repo.show(&id.to_hex()).unwrap();
        let file = show.files.iter().find(|f| &f.path == path).unwrap();
        let tensors: Vec<_> = file.segments.iter().filter(|seg| seg.is_tensor).collect();
        for seg in &tensors {
            // `previous`: against the previous epoch's file (depth e), not the first one (depth
            // 1). `reverse`: against the next epoch's file, up to the newest, which is whole.
            // (`reverse` leaves blobs of one file-system block whole.)
            let depth = match delta_policy {
                DeltaPolicy::Reverse if seg.raw_bytes < 4096 => 0,
                DeltaPolicy::Reverse => 3 - e as u32,
                _ => e as u32,
            };
            if depth == 0 {
                assert_eq!(seg.storage, Storage::Base, "epoch {e}: {delta_policy:?}");
            } else {
                assert_eq!(
                    (seg.storage, seg.depth),
                    (Storage::Delta, depth),
                    "epoch {e} {}: {delta_policy:?}",
                    seg.name
                );
            }
        }
        let out = t.checkout_all(&repo, &id.to_hex());
        assert!(out.contains(&(path.clone(), model.clone())), "epoch {e} checks out bit-exactly");
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");

    // Two files with the same tensors under new paths: each deltas against the file of the same
    // name (an EMA copy and the model), not both against whichever sorts first.
    let t = TestRepo::with_config(&Config { chunk_size: 8192, delta_policy, ..Config::default() });
    let repo = t.open();
    for e in 0..2u32 {
        let model = synthetic_checkpoint(11, Dtype::Bf16, SMALL_MODEL, e);
        let ema = synthetic_checkpoint(12, Dtype::Bf16, SMALL_MODEL, e);
        let (m, a) = (format!("ckpt-{e}/model.safetensors"), format!("ckpt-{e}/ema.safetensors"));
        let id = t.commit_files(&repo, &[(&m, &model), (&a, &ema)], &format!("step {e}"));
        if e == 1 {
            let show = repo.show(&id.to_hex()).unwrap();
            let previous = repo.show("HEAD~1").unwrap();
            for name in ["model", "ema"] {
                let now = show.files.iter().find(|f| f.path == format!("ckpt-1/{name}.safetensors")).unwrap();
                let before = previous.files.iter().find(|f| f.path == format!("ckpt-0/{name}.safetensors")).unwrap();
                // (`reverse` leaves the one-block bias whole.)
                let compared =
                    |s: &&SegmentShow| s.is_tensor && (delta_policy != DeltaPolicy::Reverse || s.raw_bytes >= 4096);
                for (seg, old) in now.segments.iter().zip(&before.segments).filter(|(s, _)| compared(s)) {
                    // The delta runs from the newer tensor to the older one with `reverse`.
                    let (delta, reference) =
                        if delta_policy == DeltaPolicy::Reverse { (old, seg.blob) } else { (seg, old.blob) };
                    assert_eq!(delta.storage, Storage::Delta, "{name} {}", seg.name);
                    assert_eq!(
                        delta.reference,
                        Some(reference),
                        "{name} {} deltas against the same file's tensor",
                        seg.name
                    );
                }
            }
        }
    }
}

#[test]
fn identical_tensors_are_stored_once() {
    let t = TestRepo::init();
    let repo = t.open();
    let a = synthetic_checkpoint(5, Dtype::Bf16, &[("x", &[128, 64])], 0);
    // The same tensor bytes under other names, in another file, next to a different tensor.
    let b = synthetic_checkpoint(5, Dtype::Bf16, &[("x", &[128, 64]), ("y", &[128, 64])], 0);
    let c = {
        let spec = vec![("renamed".to_string(), Dtype::Bf16, vec![128u64, 64])];
        let mut f = ckpt::safetensors::write_header(&spec, None).unwrap();
        f.extend_from_slice(&a[a.len() - 128 * 64 * 2..]);
        f
    };
    t.commit_files(&repo, &[("a.safetensors", &a), ("b.safetensors", &b), ("c.safetensors", &c)], "v1");
    let blobs = repo
        .store()
        .list()
        .unwrap()
        .into_iter()
        .filter(|id| repo.store().header(id).unwrap().kind == ObjectKind::Blob)
        .count();
    // Three distinct headers + tensor x (shared by all three files) + tensor y.
    assert_eq!(blobs, 5);
    // Committing the same files again adds nothing but the version object.
    let before = t.object_files().len();
    let v2 =
        repo.commit(&["a.safetensors", "b.safetensors", "c.safetensors"], "again", &CommitOptions::default()).unwrap();
    assert_eq!(t.object_files().len(), before + 1);
    assert_eq!(repo.version_info(&v2).unwrap().stored_bytes, 0);
    assert_eq!(
        t.checkout_all(&repo, "HEAD"),
        vec![("a.safetensors".to_string(), a), ("b.safetensors".to_string(), b), ("c.safetensors".to_string(), c)]
    );
}

#[test]
fn unrelated_data_is_stored_standalone() {
    let t = TestRepo::with_config(&Config { chunk_size: 8192, ..Config::default() });
    let repo = t.open();
    for e in 0..3 {
        // Fresh random weights every epoch (same names and shapes): a delta cannot pay.
        let m = synthetic_checkpoint(100 + e as u64, Dtype::F32, SMALL_MODEL, 0);
        t.commit_files(&repo, &[("m.safetensors", &m)], "fresh");
    }
    assert!(blob_depths(&repo).iter().all(|&d| d == 0));
}

#[test]
fn files_carry_over_until_removed() {
    let t = TestRepo::init();
    let repo = t.open();
    t.commit_files(&repo, &[("a.bin", b"a1"), ("sub/b.bin", b"b1")], "one");
    t.commit_files(&repo, &[("c.bin", b"c1")], "two");
    let names = |rev: &str| {
        repo.version(&repo.resolve(rev).unwrap()).unwrap().files.iter().map(|f| f.path.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names("HEAD"), ["a.bin", "c.bin", "sub/b.bin"]);
    repo.rm(&[t.path("a.bin")]).unwrap();
    assert_eq!(repo.status().unwrap().files[0].state, FileState::Removed);
    assert!(repo.rm(&[t.path("nope.bin")]).is_err());
    // A commit naming no file still applies the removal.
    repo.commit::<&str>(&[], "drop a", &CommitOptions::default()).unwrap();
    assert_eq!(names("HEAD"), ["c.bin", "sub/b.bin"]);
    assert!(t.path("a.bin").exists(), "rm keeps the working file");
    assert_eq!(names("HEAD~1"), ["a.bin", "c.bin", "sub/b.bin"]);
    assert!(matches!(
        repo.commit::<&str>(&[], "empty", &CommitOptions::default()),
        Err(ckpt::repo::Error::NothingToCommit)
    ));
    // Checking out one file of an old version, into the working tree: refused over changes
    // the repository does not hold, unless forced.
    std::fs::write(t.path("sub/b.bin"), b"changed").unwrap();
    let only_b = [PathBuf::from("sub/b.bin")];
    let refused = repo.checkout("HEAD~2", Some(&only_b), None, None).unwrap_err();
    assert!(matches!(&refused, ckpt::repo::Error::DirtyWorkingTree { paths, .. } if paths == &["sub/b.bin"]));
    assert_eq!(t.read("sub/b.bin"), b"changed");
    let options = CheckoutOptions { files: Some(only_b.to_vec()), force: true, ..CheckoutOptions::default() };
    repo.checkout_with("HEAD~2", &options).unwrap();
    assert_eq!(t.read("sub/b.bin"), b"b1");
    assert!(repo.checkout("HEAD~2", Some(&[PathBuf::from("c.bin")]), None, None).is_err());
}

#[test]
fn tensor_filter_writes_valid_subsets() {
    let t = TestRepo::init();
    let repo = t.open();
    let model = synthetic_checkpoint(9, Dtype::Bf16, SMALL_MODEL, 2);
    t.commit_files(&repo, &[("m.safetensors", &model), ("notes.txt", b"n")], "v");
    let original = safetensors::SafeTensors::deserialize(&model).unwrap();
    for (pattern, expected) in [
        ("layers.*", vec!["layers.0.attn.q", "layers.0.mlp.up"]),
        ("attn", vec!["layers.0.attn.q"]),
        ("*.bias", vec!["head.bias"]),
        ("h?ad*", vec!["head.bias"]),
    ] {
        let out = tempfile::tempdir().unwrap();
        let summary = repo.checkout("HEAD", None, Some(out.path()), Some(pattern)).unwrap();
        assert_eq!(summary.files, ["m.safetensors"], "non-safetensors files are skipped");
        let bytes = std::fs::read(out.path().join("m.safetensors")).unwrap();
        let subset = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let mut names: Vec<String> = subset.names().into_iter().map(|n| n.to_string()).collect();
        names.sort();
        assert_eq!(names, expected, "{pattern}");
        for name in &names {
            assert_eq!(subset.tensor(name).unwrap().data(), original.tensor(name).unwrap().data());
        }
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap().get("epoch").unwrap(), "2");
    }
    let out = tempfile::tempdir().unwrap();
    assert!(repo.checkout("HEAD", None, Some(out.path()), Some("nothing-matches")).unwrap().files.is_empty());
}

#[test]
fn revisions_resolve() {
    let t = TestRepo::init();
    let repo = t.open();
    assert!(repo.log("HEAD").unwrap().is_empty());
    assert!(repo.resolve("HEAD").is_err());
    let ids: Vec<VersionId> = (0..4).map(|i| t.commit_files(&repo, &[("f", format!("{i}").as_bytes())], "v")).collect();
    assert_eq!(repo.resolve("HEAD").unwrap(), ids[3]);
    assert_eq!(repo.resolve("HEAD~").unwrap(), ids[2]);
    assert_eq!(repo.resolve("HEAD~3").unwrap(), ids[0]);
    assert_eq!(repo.resolve("main~2").unwrap(), ids[1]);
    assert_eq!(repo.resolve(&ids[1].to_hex()).unwrap(), ids[1]);
    assert_eq!(repo.resolve(&ids[2].short(8)).unwrap(), ids[2]);
    assert_eq!(repo.resolve(&ids[2].short(8).to_uppercase()).unwrap(), ids[2]);
    assert_eq!(repo.resolve(&format!("{}~1", ids[2].short(10))).unwrap(), ids[1]);
    repo.tag("first", Some(&ids[0].to_hex())).unwrap();
    assert_eq!(repo.resolve("first").unwrap(), ids[0]);
    assert!(matches!(repo.tag("first", None), Err(ckpt::repo::Error::RefExists { .. })));
    let err = repo.resolve("HEAD~4").unwrap_err().to_string();
    assert!(err.contains("only 3 versions"), "{err}");
    for bad in ["nope", "first~x", "abc", "~1"] {
        assert!(repo.resolve(bad).is_err(), "{bad}");
    }
    // A blob id is not a version.
    let blob =
        repo.store().list().unwrap().into_iter().find(|id| repo.store().header(id).unwrap().kind == ObjectKind::Blob);
    assert!(repo.resolve(&blob.unwrap().to_hex()).is_err());
}

#[test]
fn branches_switch_and_status() {
    let t = TestRepo::init();
    let repo = t.open();
    t.commit_files(&repo, &[("w.bin", b"main-1"), ("x.bin", b"x")], "m1");
    repo.create_branch("exp", None).unwrap();
    t.commit_files(&repo, &[("w.bin", b"main-2")], "m2");
    repo.switch("exp", false).unwrap();
    assert_eq!(t.read("w.bin"), b"main-1");
    t.commit_files(&repo, &[("w.bin", b"exp-1")], "e1");
    let branches = repo.branches().unwrap();
    assert_eq!(
        branches.iter().map(|b| (b.name.as_str(), b.current)).collect::<Vec<_>>(),
        [("exp", true), ("main", false)]
    );
    assert_eq!(repo.log("main").unwrap().len(), 2);
    assert_eq!(repo.log("HEAD").unwrap().len(), 2);

    // Status: modified (same size too), missing, unchanged.
    std::fs::write(t.path("w.bin"), b"exp-X").unwrap();
    std::fs::remove_file(t.path("x.bin")).unwrap();
    let status = repo.status().unwrap();
    assert_eq!(status.branch.as_deref(), Some("exp"));
    let states: Vec<FileState> = status.files.iter().map(|f| f.state).collect();
    assert_eq!(states, [FileState::Modified, FileState::Missing]);
    assert!(matches!(repo.switch("main", false), Err(ckpt::repo::Error::DirtyWorkingTree { .. })));
    repo.switch("main", true).unwrap();
    assert_eq!(t.read("w.bin"), b"main-2");
    assert_eq!(t.read("x.bin"), b"x");
    assert!(repo.status().unwrap().files.iter().all(|f| f.state == FileState::Unchanged));
    assert!(repo.switch("nope", false).is_err());
    assert!(repo.create_branch("bad/name", None).is_err());
}

#[test]
fn cli_log_json_ids_check_out() {
    let t = TestRepo::init();
    for e in 0..3 {
        t.write("sub/m.safetensors", &synthetic_checkpoint(1, Dtype::Bf16, SMALL_MODEL, e));
        // Relative paths from a subdirectory, through -C.
        let o = ckpt_in(t.root(), &["-C", "sub", "commit", "-m", &format!("epoch {e}"), "m.safetensors"]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = t.ckpt(&["log", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let versions = log.as_array().unwrap();
    assert_eq!(versions.len(), 3);
    assert_eq!(versions[0]["message"], "epoch 2");
    assert_eq!(versions[2]["files"][0], "sub/m.safetensors");
    assert!(versions[1]["stored_bytes"].as_u64().unwrap() < versions[1]["raw_bytes"].as_u64().unwrap());
    let oldest = versions[2]["id"].as_str().unwrap();
    let o = t.ckpt(&["checkout", oldest, "--output", "out"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        read_tree(&t.path("out")),
        vec![("sub/m.safetensors".to_string(), synthetic_checkpoint(1, Dtype::Bf16, SMALL_MODEL, 0))]
    );
    for args in [
        &["status", "--json"][..],
        &["tag", "v0", oldest],
        &["tag"],
        &["branch", "b"],
        &["branch"],
        &["gc", "--prune=now"],
        &["verify"],
    ] {
        let o = t.ckpt(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let o = t.ckpt(&["log"]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("(HEAD -> main, b)") && text.contains("tag: v0"), "{text}");
    // One line per version, newest first, starting with an id prefix that resolves.
    let o = t.ckpt(&["log", "--oneline"]);
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].ends_with("epoch 2") && lines[0].contains("(HEAD -> main, b)"), "{text}");
    assert!(lines[2].ends_with("epoch 0") && lines[2].contains("tag: v0"), "{text}");
    let short = lines[2].split(' ').next().unwrap();
    assert!(oldest.starts_with(short) && short.len() == 12, "{short}");
    let o = t.ckpt(&["log", "-n", "1", "--json"]);
    let newest: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(newest.as_array().unwrap().len(), 1);
    assert_eq!(newest[0]["message"], "epoch 2");
    let o = t.ckpt(&["checkout", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown revision"), "{}", stderr(&o));
}

#[test]
fn index_is_rebuilt_when_missing_or_damaged() {
    let t = TestRepo::init();
    let expected = {
        let repo = t.open();
        for e in 0..3 {
            t.commit_files(&repo, &[("m.safetensors", &synthetic_checkpoint(2, Dtype::F32, SMALL_MODEL, e))], "e");
        }
        repo.log("HEAD").unwrap()
    };
    std::fs::remove_dir_all(t.path(".ckpt/index")).unwrap();
    {
        let repo = t.open();
        assert!(repo.has_index());
        assert_eq!(repo.log("HEAD").unwrap(), expected);
    }
    // Damage the database files; opening rebuilds.
    for entry in walk(&t.path(".ckpt/index")) {
        std::fs::write(&entry, b"garbage").unwrap();
    }
    {
        let repo = t.open();
        assert!(repo.has_index());
        assert_eq!(repo.log("HEAD").unwrap(), expected);
    }
    let o = t.ckpt(&["index", "rebuild"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(t.open().log("HEAD").unwrap(), expected);
    // While one process holds the index, another works without it.
    let holder = t.open();
    let other = t.open();
    assert!(holder.has_index() && !other.has_index());
    assert_eq!(other.log("HEAD").unwrap(), expected);
    t.write("n.bin", b"x");
    other.commit(&["n.bin"], "no index", &CommitOptions::default()).unwrap();
    assert_eq!(holder.log("HEAD").unwrap().len(), 4);
}

/// A commit does not open the index: it appends the committed files' identities (size, mtime,
/// ctime, inode, hash) to `.ckpt/index-journal`, which the next process to open the index
/// replays into its `stat` records.
#[test]
fn a_commit_records_file_identities_through_the_index_journal() {
    use std::os::unix::fs::MetadataExt;
    // The `stat` record of a.bin once a process has opened the index (and replayed the journal).
    let record_after_open = |t: &TestRepo| {
        assert!(t.open().has_index());
        ckpt::index::Index::open(&t.path(".ckpt/index")).unwrap().stat("a.bin").unwrap()
    };
    let commit = |t: &TestRepo| {
        t.write("a.bin", b"first content");
        t.open().commit(&["a.bin"], "v", &CommitOptions::default()).unwrap();
    };

    let t = TestRepo::init();
    commit(&t);
    assert!(t.path(".ckpt/index-journal").is_file());
    let record = record_after_open(&t).expect("replayed from the journal");
    assert!(!t.path(".ckpt/index-journal").exists(), "replayed and deleted");
    let meta = std::fs::metadata(t.path("a.bin")).unwrap();
    let committed = t.open().version(&t.open().resolve("HEAD").unwrap()).unwrap().files[0].hash;
    assert_eq!(record.hash, committed);
    assert_eq!((record.len, record.ino), (meta.len(), meta.ino()));
    assert_eq!(record.ctime_ns, meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128);
    assert_eq!(t.open().status().unwrap().files[0].state, FileState::Unchanged);

    // Without the journal the index has no record (status then hashes the file).
    let t = TestRepo::init();
    commit(&t);
    std::fs::remove_file(t.path(".ckpt/index-journal")).unwrap();
    assert_eq!(record_after_open(&t), None);
    assert_eq!(t.open().status().unwrap().files[0].state, FileState::Unchanged);
}

/// An object rewritten while the index was closed (the parent's blob becoming a reverse delta
/// in a commit) reaches the index through the journal: the next open re-reads its header, so
/// the cached record is not left saying "standalone".
#[test]
fn a_blob_rewritten_while_the_index_was_closed_is_re_read_from_the_store() {
    // Commits epoch 0, indexes every object as it is then (standalone) in a process that closes
    // the index again, and commits epoch 1, which rewrites epoch 0's blobs as deltas against
    // epoch 1's without opening the index. Returns one rewritten blob.
    let two_commits = |t: &TestRepo| {
        let v0 = t.commit_files(
            &t.open(),
            &[("m.safetensors", &synthetic_checkpoint(5, Dtype::F32, TRAINING_MODEL, 0))],
            "e0",
        );
        assert!(t.open().rebuild_index().is_ok());
        let repo = t.open();
        let blob = repo.manifest(&repo.version(&v0).unwrap().files[0].manifest).unwrap().segments[1].blob.unwrap();
        assert_eq!(repo.object_record(&blob).unwrap().depth, 0);
        drop(repo);
        t.commit_files(&t.open(), &[("m.safetensors", &synthetic_checkpoint(5, Dtype::F32, TRAINING_MODEL, 1))], "e1");
        assert_eq!(t.open().store().header(&blob).unwrap().depth, 1, "the commit made it a delta");
        blob
    };
    let t = TestRepo::init();
    let blob = two_commits(&t);
    assert_eq!(t.open().object_record(&blob).unwrap().depth, 1, "replayed from the journal");
    // Without the journal, the index would still answer with the old record.
    let t = TestRepo::init();
    let blob = two_commits(&t);
    std::fs::remove_file(t.path(".ckpt/index-journal")).unwrap();
    assert_eq!(t.open().object_record(&blob).unwrap().depth, 0, "stale without the journal");
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[cfg(unix)]
#[test]
fn checkout_does_not_write_through_symlinked_directories() {
    let t = TestRepo::init();
    let repo = t.open();
    t.commit_files(&repo, &[("d/f.bin", b"data")], "v");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), out.path().join("d")).unwrap();
    let err = repo.checkout("HEAD", None, Some(out.path()), None).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(std::fs::read_dir(elsewhere.path()).unwrap().next().is_none());
}

/// Checked-out files get the mode of any newly created file (0666 minus the umask), not the
/// owner-only mode of a temporary file; the same for `--tensor` subsets.
#[cfg(unix)]
#[test]
fn checked_out_files_get_the_usual_mode() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestRepo::init();
    let repo = t.open();
    let model = synthetic_checkpoint(1, Dtype::Bf16, SMALL_MODEL, 0);
    t.commit_files(&repo, &[("m.safetensors", &model), ("n.bin", b"notes")], "v");
    let out = tempfile::tempdir().unwrap();
    let probe = out.path().join("probe");
    std::fs::File::create(&probe).unwrap();
    let expected = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777;
    repo.checkout("HEAD", None, Some(out.path()), None).unwrap();
    for name in ["m.safetensors", "n.bin"] {
        let mode = std::fs::metadata(out.path().join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, expected, "{name}: {mode:o} vs {expected:o}");
    }
}

#[test]
fn init_takes_a_directory_relative_to_the_current_one_or_to_dash_c() {
    let top = tempfile::tempdir().unwrap();
    let o = ckpt_in(top.path(), &["init", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(top.path().join("r/.ckpt/HEAD").is_file(), "init r creates r/.ckpt");
    assert!(!top.path().join("r/r").exists(), "and nothing below it");
    std::fs::create_dir(top.path().join("outer")).unwrap();
    let o = ckpt_in(top.path(), &["-C", "outer", "init", "inner"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(top.path().join("outer/inner/.ckpt/HEAD").is_file(), "-C outer init inner");
    let o = ckpt_in(&top.path().join("r"), &["init"]);
    assert_eq!(o.status.code(), Some(1), "a second init in the same place fails");
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
}

#[test]
fn an_io_error_is_reported_once_with_the_file() {
    let t = TestRepo::init();
    let o = t.ckpt(&["commit", "-m", "x", "missing.safetensors"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("missing.safetensors"), "{err}");
    let os_error = "os error 2";
    assert_eq!(err.matches(os_error).count(), 1, "the cause once: {err}");
}

/// Checkout hashes each run of chunks in the worker that decodes it and joins the runs' subtree
/// hashes into the blob's blake3 (`RangeHashes`): tensors of exactly one run, just over one,
/// just under three, exactly five, and tiny ones must all check out, as bases and as deltas.
#[test]
fn tensors_around_unit_boundaries_check_out() {
    // 4 KiB chunks: a checkout work unit (hashed by its worker) is 8 chunks = 32 KiB = 16384
    // bf16 values.
    let t = TestRepo::with_config(&Config { base_every: 3, chunk_size: 4096, ..Config::default() });
    let repo = t.open();
    let p = 16384u64;
    let shapes: &[(&str, &[u64])] =
        &[("one", &[p]), ("one_plus", &[p + 1]), ("three_minus", &[3 * p - 1]), ("five", &[5, p]), ("tiny", &[7])];
    let mut history = Vec::new();
    for e in 0..3 {
        let model = synthetic_checkpoint(21, Dtype::Bf16, shapes, e);
        history.push((t.commit_files(&repo, &[("m.safetensors", &model)], "e"), model));
    }
    assert!(blob_depths(&repo).contains(&2), "the later epochs are deltas");
    for (id, model) in history {
        assert_eq!(t.checkout_all(&repo, &id.to_hex()), vec![("m.safetensors".to_string(), model)]);
    }
}

/// A directory named to `commit` stands for every file under it: nested files, a symbolic link
/// to a file (its content, as when named), not `.git`; files tracked under it that are gone
/// leave the version, files elsewhere stay. A link to a directory and an empty directory are
/// refused, naming the path, with nothing committed.
#[test]
fn a_directory_commits_the_files_under_it_as_they_are_now() {
    use crate::support::repo_util::{ok, refused};
    let t = TestRepo::init();
    let file = synthetic_checkpoint(1, Dtype::F32, SMALL_MODEL, 0);
    t.write("run/checkpoint-500/model.safetensors", &file);
    t.write("run/checkpoint-500/trainer_state.json", b"{\"step\": 500}");
    t.write("run/checkpoint-500/extra/notes.txt", b"notes");
    t.write("run/.git/HEAD", b"ref: refs/heads/main\n");
    t.write("elsewhere.txt", b"kept");
    std::os::unix::fs::symlink(t.path("elsewhere.txt"), t.path("run/link.txt")).unwrap();
    ok(&t, &["commit", "-q", "-m", "outside", "elsewhere.txt"]);
    ok(&t, &["commit", "-q", "-m", "run", "run"]);
    let files = |t: &TestRepo| -> Vec<String> {
        let repo = t.open();
        repo.version(&repo.resolve("HEAD").unwrap()).unwrap().files.iter().map(|f| f.path.clone()).collect()
    };
    assert_eq!(
        files(&t),
        [
            "elsewhere.txt",
            "run/checkpoint-500/extra/notes.txt",
            "run/checkpoint-500/model.safetensors",
            "run/checkpoint-500/trainer_state.json",
            "run/link.txt"
        ]
    );

    // Files gone from the directory leave the version; the one outside it stays.
    std::fs::remove_dir_all(t.path("run/checkpoint-500/extra")).unwrap();
    std::fs::remove_file(t.path("run/link.txt")).unwrap();
    ok(&t, &["commit", "-q", "-m", "again", "run/checkpoint-500"]);
    assert_eq!(
        files(&t),
        [
            "elsewhere.txt",
            "run/checkpoint-500/model.safetensors",
            "run/checkpoint-500/trainer_state.json",
            "run/link.txt"
        ],
        "link.txt is outside the directory named: it stays"
    );
    // The whole tree: `.` at the root (the link is gone from it, so it leaves too).
    ok(&t, &["commit", "-q", "-m", "root", "."]);
    assert_eq!(
        files(&t),
        ["elsewhere.txt", "run/checkpoint-500/model.safetensors", "run/checkpoint-500/trainer_state.json"]
    );
    let repo = t.open();
    let out = t.checkout_all(&repo, "HEAD");
    assert!(out.iter().any(|(p, b)| p == "run/checkpoint-500/model.safetensors" && *b == file));
    drop(repo);

    // Refused, nothing committed: a link to a directory, an empty directory.
    let before = files(&t);
    std::os::unix::fs::symlink(t.path("run/checkpoint-500"), t.path("run/latest")).unwrap();
    let err = refused(&t, &["commit", "-q", "-m", "loop", "run"]);
    assert!(err.contains("run/latest") && err.contains("symbolic link to a directory"), "{err}");
    std::fs::remove_file(t.path("run/latest")).unwrap();
    std::fs::create_dir_all(t.path("empty")).unwrap();
    let err = refused(&t, &["commit", "-q", "-m", "empty", "empty"]);
    assert!(err.contains("empty") && err.contains("no file under it"), "{err}");
    assert_eq!(files(&t), before);
    assert_eq!(t.open().log("HEAD").unwrap().len(), 4);
}

/// `checkout REV DIR` writes every file the version holds under DIR (a file named with its
/// directory once); a path holding neither a file nor one under it is an error, writing nothing.
#[test]
fn checkout_and_rm_of_a_directory_take_the_files_under_it() {
    use crate::support::repo_util::{ok, refused};
    let t = TestRepo::init();
    t.write("ck/a.txt", b"a1");
    t.write("ck/sub/b.txt", b"b1");
    t.write("other.txt", b"o1");
    ok(&t, &["commit", "-q", "-m", "one", "ck", "other.txt"]);
    t.write("ck/a.txt", b"a2");
    t.write("ck/sub/b.txt", b"b2");
    t.write("other.txt", b"o2");
    ok(&t, &["commit", "-q", "-m", "two", "ck", "other.txt"]);
    let out = t.path("out");
    ok(&t, &["checkout", "-q", "HEAD~1", "ck", "ck/sub/b.txt", "--output", out.to_str().unwrap()]);
    let written = read_tree(&out);
    assert_eq!(written, [("ck/a.txt".to_string(), b"a1".to_vec()), ("ck/sub/b.txt".to_string(), b"b1".to_vec())]);
    ok(&t, &["checkout", "-q", "HEAD~1", "ck/sub"]);
    assert_eq!(std::fs::read(t.path("ck/sub/b.txt")).unwrap(), b"b1");
    assert_eq!(std::fs::read(t.path("ck/a.txt")).unwrap(), b"a2", "outside ck/sub: untouched");
    let err = refused(&t, &["checkout", "-q", "HEAD~1", "c"]);
    assert!(err.contains("c: not in version"), "{err}");

    // `rm` of a directory: every file tracked under it leaves the next version.
    ok(&t, &["rm", "ck"]);
    ok(&t, &["commit", "-q", "-m", "three", "other.txt"]);
    let repo = t.open();
    let files: Vec<String> =
        repo.version(&repo.resolve("HEAD").unwrap()).unwrap().files.into_iter().map(|f| f.path).collect();
    assert_eq!(files, ["other.txt"]);
    drop(repo);
    let err = refused(&t, &["rm", "ck"]);
    assert!(err.contains("ck"), "{err}");
}

/// `status` lists the untracked files beside tracked ones (what `ckpt commit DIR` would add):
/// one listing per directory of a tracked file, not the root, not recursive.
#[test]
fn status_lists_untracked_files_beside_tracked_ones() {
    use crate::support::repo_util::ok;
    let t = TestRepo::init();
    t.write("ck/a.txt", b"a");
    t.write("top.txt", b"t");
    ok(&t, &["commit", "-q", "-m", "one", "ck", "top.txt"]);
    t.write("ck/__2_0.distcp", b"new rank file");
    t.write("ck/deeper/x.txt", b"not listed: not recursive");
    t.write("train.py", b"not listed: the root");
    let status = t.open().status().unwrap();
    assert_eq!(status.untracked, ["ck/__2_0.distcp"]);
    let text = ok(&t, &["status"]);
    assert!(text.contains("untracked ck/__2_0.distcp"), "{text}");
    ok(&t, &["commit", "-q", "-m", "two", "ck"]);
    assert_eq!(t.open().status().unwrap().untracked, Vec::<String>::new());
}
