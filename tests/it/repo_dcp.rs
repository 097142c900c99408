//! `torch.distributed.checkpoint` directories in a repository: each `.distcp` file committed
//! item by item (tensor shards as tensors named by fqn and chunk offsets, cut by the sibling
//! `.metadata`), delta-coded against the same items of the previous version in any `.distcp`
//! file, checked out bit-exactly; a missing or damaged `.metadata` only changes the names. The
//! fixtures were written by real torch (tests/fixtures/dcp/make_fixtures.py).

use crate::support::repo_util::{stderr, TestRepo};
use ckpt::repo::{
    CommitOptions, Config, DeltaPolicy, FileEntry, FileFormat, FileShow, Repo, RepoPath, Storage, VersionId,
};
use ckpt::torch_zip::dcp;
use std::path::Path;

/// The files of fixture directory `name` (`.metadata` and the `.distcp` files), sorted.
fn fixture_dir(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dcp").join(name);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Writes `files` under `under/` in the working tree and commits them.
fn commit_under(t: &TestRepo, repo: &Repo, files: &[(String, Vec<u8>)], under: &str) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = files.iter().map(|(n, b)| (format!("{under}/{n}"), b.clone())).collect();
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    t.commit_files(repo, &refs, under);
    files
}

fn delta_config() -> Config {
    Config { chunk_size: 4096, delta_policy: DeltaPolicy::Previous, ..Config::default() }
}

/// `rev`'s file at `path`, as `show` lists it.
fn shown(repo: &Repo, rev: &str, path: &str) -> FileShow {
    let report = repo.show(rev).unwrap();
    report.files.into_iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path} not in {rev}"))
}

/// The non-empty tensor segments of `f`: name and storage.
fn tensors(f: &FileShow) -> Vec<(&str, Storage)> {
    f.segments.iter().filter(|s| s.is_tensor && s.raw_bytes > 0).map(|s| (s.name.as_str(), s.storage)).collect()
}

/// Every file of `files` comes back byte for byte from `rev`.
fn assert_checks_out(t: &TestRepo, repo: &Repo, rev: &str, files: &[(String, Vec<u8>)]) {
    let out = t.checkout_all(repo, rev);
    for (path, bytes) in files {
        let got = out.iter().find(|(p, _)| p == path).unwrap_or_else(|| panic!("{path} not checked out"));
        assert!(got.1 == *bytes, "{path} differs after checking out {rev}");
    }
}

/// The bytes the store adds for `rev`'s files whose path ends with `suffix`.
fn added(repo: &Repo, rev: &str, suffix: &str) -> u64 {
    repo.show(rev).unwrap().files.iter().filter(|f| f.path.ends_with(suffix)).map(|f| f.added_bytes).sum()
}

/// `files` with each `.distcp` file renamed to `.bin`: stored as opaque bytes.
fn as_opaque(files: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    files.iter().map(|(n, b)| (n.replace(".distcp", ".bin"), b.clone())).collect()
}

#[test]
fn epochs_are_committed_item_by_item_and_the_second_as_deltas() {
    let t = TestRepo::with_config(&delta_config());
    let repo = t.open();
    let e1 = commit_under(&t, &repo, &fixture_dir("mlp_2ranks_epoch1"), "ck");
    let e2 = commit_under(&t, &repo, &fixture_dir("mlp_2ranks_epoch2"), "ck");

    let first = shown(&repo, "HEAD~1", "ck/__0_0.distcp");
    assert_eq!(first.kind, FileFormat::Distcp);
    let fc1 =
        first.segments.iter().find(|s| s.name == "model.fc1.weight[0:16,0:8]").expect("item named by fqn and chunk");
    assert_eq!((fc1.dtype.as_deref(), fc1.shape.as_deref()), (Some("F32"), Some(&[16u64, 8][..])));
    assert_eq!(tensors(&first).len(), 15, "{:?}", tensors(&first));
    assert_eq!(shown(&repo, "HEAD~1", "ck/.metadata").kind, FileFormat::Bytes);

    // Every item changed between the epochs: each is stored as a delta against itself.
    for path in ["ck/__0_0.distcp", "ck/__1_0.distcp"] {
        let f = shown(&repo, "HEAD", path);
        assert_eq!(f.kind, FileFormat::Distcp);
        let items = tensors(&f);
        assert!(items.len() >= 15 && items.iter().all(|(_, s)| *s == Storage::Delta), "{path}: {items:?}");
    }
    // So are the items' zip framing and pickles (the same but for a random serialization id
    // and the CRCs), each against the same item's.
    let f = shown(&repo, "HEAD", "ck/__1_0.distcp");
    let framing: Vec<Storage> = f.segments.iter().filter(|s| !s.is_tensor).map(|s| s.storage).collect();
    let deltas = framing.iter().filter(|s| **s == Storage::Delta).count();
    assert!(deltas + 1 >= framing.len(), "framing: {framing:?}");
    assert_checks_out(&t, &repo, "HEAD~1", &e1);
    assert_checks_out(&t, &repo, "HEAD", &e2);
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");

    // The same two saves as opaque bytes take more.
    let o = TestRepo::with_config(&delta_config());
    let opaque = o.open();
    commit_under(&o, &opaque, &as_opaque(&fixture_dir("mlp_2ranks_epoch1")), "ck");
    commit_under(&o, &opaque, &as_opaque(&fixture_dir("mlp_2ranks_epoch2")), "ck");
    let (items, bytes) = (added(&repo, "HEAD", ".distcp"), added(&opaque, "HEAD", ".bin"));
    assert!(items < bytes, "epoch 2 item by item: {items} bytes stored, as opaque bytes {bytes}");
}

/// `.metadata` with the rank files' names `__0_0.distcp` and `__1_0.distcp` swapped (same
/// length, so the pickle stays valid): the same save, each rank writing the other's items.
fn swap_ranks(metadata: &[u8]) -> Vec<u8> {
    let (a, b) = (b"__0_0.distcp", b"__1_0.distcp");
    let mut out = metadata.to_vec();
    let mut swapped = 0;
    for i in 0..out.len().saturating_sub(a.len() - 1) {
        if &metadata[i..i + a.len()] == a {
            out[i..i + a.len()].copy_from_slice(b);
            swapped += 1;
        } else if &metadata[i..i + b.len()] == b {
            out[i..i + b.len()].copy_from_slice(a);
            swapped += 1;
        }
    }
    assert!(swapped >= 2, "file names not found in .metadata");
    out
}

#[test]
fn items_are_found_in_other_files_of_the_previous_version() {
    let t = TestRepo::with_config(&delta_config());
    let repo = t.open();
    commit_under(&t, &repo, &fixture_dir("mlp_2ranks_epoch1"), "ck");
    // Epoch 2 with the ranks' files swapped: every item now lies in the other file, whose
    // version of epoch 1 holds none of it; the name index over all files still pairs them.
    let e2 = fixture_dir("mlp_2ranks_epoch2");
    let get = |n: &str| e2.iter().find(|(p, _)| p == n).unwrap().1.clone();
    let swapped = vec![
        (".metadata".to_string(), swap_ranks(&get(".metadata"))),
        ("__0_0.distcp".to_string(), get("__1_0.distcp")),
        ("__1_0.distcp".to_string(), get("__0_0.distcp")),
    ];
    let files = commit_under(&t, &repo, &swapped, "ck");
    let f = shown(&repo, "HEAD", "ck/__0_0.distcp");
    let items = tensors(&f);
    assert!(items.iter().any(|(n, _)| *n == "model.fc1.weight[16:32,0:8]"), "rank 1's items: {items:?}");
    assert!(items.iter().all(|(_, s)| *s == Storage::Delta), "not paired across files: {items:?}");
    assert_checks_out(&t, &repo, "HEAD", &files);

    // Then 4 ranks: new chunks, new names; items whose names the 2-rank save held (the
    // `step` scalars, which DCP's de-duplication spreads over ranks 1-3) and the rest are
    // stored, and every version checks out.
    let e4 = commit_under(&t, &repo, &fixture_dir("mlp_4ranks_epoch2"), "ck");
    for rank in 0..4 {
        let f = shown(&repo, "HEAD", &format!("ck/__{rank}_0.distcp"));
        assert_eq!(f.kind, FileFormat::Distcp);
        assert!(tensors(&f).iter().any(|(n, _)| n.starts_with("model.fc1.weight[") && n.ends_with(",0:8]")));
    }
    let steps: Vec<String> = (1..4)
        .flat_map(|rank| {
            let f = shown(&repo, "HEAD", &format!("ck/__{rank}_0.distcp"));
            f.segments.iter().filter(|s| s.name.ends_with(".step[]")).map(|s| s.name.clone()).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(steps.len(), 5, "{steps:?}");
    assert_checks_out(&t, &repo, "HEAD", &e4);
    assert_checks_out(&t, &repo, "HEAD~1", &files);
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

#[test]
fn non_tensor_items_are_kept_and_checked_out() {
    let t = TestRepo::init();
    let repo = t.open();
    let files = commit_under(&t, &repo, &fixture_dir("objects_2ranks"), "ck");
    for path in ["ck/__0_0.distcp", "ck/__1_0.distcp"] {
        let f = shown(&repo, "HEAD", path);
        assert_eq!(f.kind, FileFormat::Distcp);
        assert!(tensors(&f).len() >= 15, "{path}: {:?}", tensors(&f));
    }
    assert_checks_out(&t, &repo, "HEAD", &files);
}

#[test]
fn a_missing_or_damaged_metadata_still_commits_and_checks_out_exactly() {
    let t = TestRepo::init();
    let repo = t.open();
    let mut e1 = fixture_dir("mlp_2ranks_epoch1");
    let metadata = e1.remove(0).1;
    assert!(!e1.iter().any(|(n, _)| n == ".metadata"));
    // No `.metadata`: the archives are walked, items named by position.
    let files = commit_under(&t, &repo, &e1, "bare");
    let f = shown(&repo, "HEAD", "bare/__0_0.distcp");
    assert_eq!(f.kind, FileFormat::Distcp);
    assert!(tensors(&f).iter().any(|(n, _)| *n == "archive.2"), "{:?}", tensors(&f));
    assert_checks_out(&t, &repo, "HEAD", &files);

    // A damaged `.metadata` (cut short, or a byte flipped inside the pickle) is not trusted.
    let mut flipped = metadata.clone();
    flipped[metadata.len() / 2] ^= 0x5a;
    for (under, bad) in [("short", metadata[..metadata.len() / 3].to_vec()), ("flipped", flipped)] {
        let mut dir = e1.clone();
        dir.push((".metadata".to_string(), bad));
        let files = commit_under(&t, &repo, &dir, under);
        let f = shown(&repo, "HEAD", &format!("{under}/__1_0.distcp"));
        assert_eq!(f.kind, FileFormat::Distcp, "{under}");
        assert!(tensors(&f).len() >= 17, "{under}: {:?}", tensors(&f));
        assert_checks_out(&t, &repo, "HEAD", &files);
    }

    // A `.distcp` file that is no run of archives is opaque bytes, never refused.
    let cut = e1[0].1[..e1[0].1.len() - 100].to_vec();
    let files =
        commit_under(&t, &repo, &[("__0_0.distcp".to_string(), cut), (".metadata".to_string(), metadata)], "cut");
    assert_eq!(shown(&repo, "HEAD", "cut/__0_0.distcp").kind, FileFormat::Bytes);
    assert_checks_out(&t, &repo, "HEAD", &files);
}

#[test]
fn status_agrees_with_commit_and_show_lists_items() {
    let t = TestRepo::init();
    let repo = t.open();
    let files = commit_under(&t, &repo, &fixture_dir("mlp_2ranks_epoch1"), "ck");
    // Rewritten with the same bytes, so that `status` hashes them again (not its stat record).
    let rewrite = || files.iter().for_each(|(p, b)| t.write(p, b));
    rewrite();
    let status = t.ckpt(&["status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(!text.contains("modified"), "a just-committed .distcp file shows as modified: {text}");
    // Without its `.metadata` the file is cut at the same places: still unmodified.
    std::fs::remove_file(t.path("ck/.metadata")).unwrap();
    rewrite();
    std::fs::remove_file(t.path("ck/.metadata")).unwrap();
    let status = t.ckpt(&["status", "--json"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("missing") && !text.contains("modified"), "cut differently without .metadata: {text}");
    let show = t.ckpt(&["show"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("optim.fc1.weight.exp_avg_sq[0:16,0:8]") && text.contains("distcp"), "{text}");
}

#[test]
fn hugging_face_storage_writer_shards_are_committed_tensor_by_tensor() {
    let t = TestRepo::init();
    let repo = t.open();
    let files = commit_under(&t, &repo, &fixture_dir("hf_2ranks"), "hf");
    let f = shown(&repo, "HEAD", "hf/shard-00001-model-00001-of-00001.safetensors");
    assert_eq!(f.kind, FileFormat::Safetensors);
    assert!(tensors(&f).iter().any(|(n, _)| *n == "fc1.weight"), "{:?}", tensors(&f));
    assert_checks_out(&t, &repo, "HEAD", &files);
}

/// A safetensors file of the tensor items of the `.distcp` file `file` (named `name` in a
/// checkpoint whose `.metadata` is `metadata`), under their item names.
fn as_safetensors(file: &[u8], metadata: &[u8], name: &str) -> Vec<u8> {
    use ckpt::torch_zip::dcp;
    let layout = dcp::file_items(file, &dcp::parse_metadata(metadata).unwrap(), name).unwrap().storage_map();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for s in &layout.storages {
        let begin = data.len();
        data.extend_from_slice(&file[s.range.start as usize..s.range.end as usize]);
        header.insert(
            s.name.clone(),
            serde_json::json!({"dtype": s.dtype.safetensors_name(), "shape": s.shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    out.extend(data);
    out
}

/// The size of `t`'s object files.
fn store_size(t: &TestRepo) -> u64 {
    t.object_files().iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

/// docs/BENCHMARKS.md, "torch.distributed.checkpoint files": the fixture series (2 ranks epoch
/// 1, 2 ranks epoch 2, 4 ranks epoch 2) committed item by item, as opaque bytes (renamed
/// `.bin`), and as safetensors files of the same tensors; the store after each commit.
/// `cargo test --test it repo_dcp::store_sizes -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: prints a table"]
fn store_sizes() {
    let reverse = Config { compact: ckpt::repo::Compaction::Inline, ..Config::default() };
    for (policy, config) in [("previous", delta_config()), ("reverse (default)", reverse)] {
        println!("\ndelta policy: {policy}\n");
        store_sizes_with(&config);
    }
}

fn store_sizes_with(config: &Config) {
    let series = ["mlp_2ranks_epoch1", "mlp_2ranks_epoch2", "mlp_4ranks_epoch2"];
    let (items, opaque, safetensors) =
        (TestRepo::with_config(config), TestRepo::with_config(config), TestRepo::with_config(config));
    let (ri, ro, rs) = (items.open(), opaque.open(), safetensors.open());
    println!("| save | raw .distcp + .metadata | item by item | opaque bytes | safetensors (tensors only) | framing raw / stored |");
    println!("|---|---:|---:|---:|---:|---:|");
    for name in series {
        let files = fixture_dir(name);
        let raw: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
        commit_under(&items, &ri, &files, "ck");
        commit_under(&opaque, &ro, &as_opaque(&files), "ck");
        let metadata = &files.iter().find(|(n, _)| n == ".metadata").unwrap().1;
        let shards: Vec<(String, Vec<u8>)> = files
            .iter()
            .filter(|(n, _)| n.ends_with(".distcp"))
            .map(|(n, b)| (n.replace(".distcp", ".safetensors"), as_safetensors(b, metadata, n)))
            .collect();
        commit_under(&safetensors, &rs, &shards, "ck");
        let shown = ri.show("HEAD").unwrap();
        let framing = |f: fn(&ckpt::repo::SegmentShow) -> u64| -> u64 {
            shown
                .files
                .iter()
                .filter(|f| f.kind == FileFormat::Distcp)
                .flat_map(|f| &f.segments)
                .filter(|s| !s.is_tensor)
                .map(f)
                .sum()
        };
        println!(
            "| {name} | {raw} | {} | {} | {} | {} / {} |",
            store_size(&items),
            store_size(&opaque),
            store_size(&safetensors),
            framing(|s| s.raw_bytes),
            framing(|s| if s.storage == Storage::Duplicate { 0 } else { s.stored_bytes }),
        );
    }
}

/// Each file of `files` stored with `Repo::store_objects` from a directory outside the working
/// tree (as the ranks of `ckpt.dcp.Writer` store theirs, the `.metadata` beside them), then
/// listed in one version by `Repo::commit_stored` on top of `previous`.
fn save_stored(repo: &Repo, files: &[(String, Vec<u8>)], under: &str, previous: Option<VersionId>) -> VersionId {
    let spool = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(spool.path().join(name), bytes).unwrap();
    }
    let entries = files
        .iter()
        .map(|(name, _)| {
            let path = RepoPath::parse(&format!("{under}/{name}")).unwrap();
            repo.store_objects(&spool.path().join(name), &path, previous.as_ref(), None, None).unwrap()
        })
        .collect();
    repo.commit_stored("main", previous, entries, under, &CommitOptions::default()).unwrap()
}

#[test]
fn a_version_of_stored_files_reports_what_it_stored_as_commit_does() {
    let (c, s) = (TestRepo::with_config(&delta_config()), TestRepo::with_config(&delta_config()));
    let (committed, stored) = (c.open(), s.open());
    let mut previous = None;
    for fixture in ["mlp_2ranks_epoch1", "mlp_2ranks_epoch2"] {
        let files = fixture_dir(fixture);
        commit_under(&c, &committed, &files, "ck");
        previous = Some(save_stored(&stored, &files, "ck", previous));
    }
    let (by_commit, by_save) = (committed.log("HEAD").unwrap(), stored.log("HEAD").unwrap());
    let figures = |log: &[ckpt::repo::VersionInfo]| log.iter().map(|v| v.stored_bytes).collect::<Vec<_>>();
    // The same objects stored (the same manifests): the same figures, the second save (deltas
    // against the first, framing shared) well below the first.
    assert_eq!(stored.version(&by_save[0].id).unwrap().files, committed.version(&by_commit[0].id).unwrap().files);
    assert_eq!(figures(&by_save), figures(&by_commit));
    assert!(
        by_save[0].stored_bytes > 0 && by_save[0].stored_bytes < by_save[1].stored_bytes,
        "{:?}",
        figures(&by_save)
    );
    // And they are what the store grew by: the first save's objects, then the second's, plus
    // each version object itself.
    let version_len = |id: &VersionId| stored.store().stored_len(id).unwrap();
    let total: u64 = by_save.iter().map(|v| v.stored_bytes + version_len(&v.id)).sum();
    assert_eq!(total, store_size(&s));
    assert_eq!(stored.show("HEAD").unwrap().totals.version_stored_bytes, by_save[0].stored_bytes);
}

/// What a `ckpt.dcp.Writer` rank reports having written into `.distcp` file `name` (DCP's
/// write results: the same fqn, chunk and range `.metadata` lists), from `files`' `.metadata`.
fn report(files: &[(String, Vec<u8>)], name: &str) -> Vec<dcp::Item> {
    let metadata = &files.iter().find(|(n, _)| n == ".metadata").unwrap().1;
    dcp::parse_metadata(metadata).unwrap().items_in(name).cloned().collect()
}

/// Stores `bytes` as `path` from a spool file with no `.metadata` beside it (as a Writer rank
/// stores its memfd), cut by `items` if given.
fn store_spooled(
    repo: &Repo,
    path: &str,
    bytes: &[u8],
    previous: Option<VersionId>,
    items: Option<&[dcp::Item]>,
) -> FileEntry {
    let spool = tempfile::tempdir().unwrap();
    let disk = spool.path().join("spool");
    std::fs::write(&disk, bytes).unwrap();
    repo.store_objects(&disk, &RepoPath::parse(path).unwrap(), previous.as_ref(), items, None).unwrap()
}

/// `files` (a checkpoint directory) stored as a Writer saves them, each `.distcp` file cut by
/// `items_of` its name, then listed in one version on top of `previous`.
fn save_written(
    repo: &Repo,
    files: &[(String, Vec<u8>)],
    previous: Option<VersionId>,
    items_of: impl Fn(&str) -> Option<Vec<dcp::Item>>,
) -> VersionId {
    let entries = files
        .iter()
        .map(|(name, bytes)| store_spooled(repo, &format!("ck/{name}"), bytes, previous, items_of(name).as_deref()))
        .collect();
    repo.commit_stored("main", previous, entries, "save", &CommitOptions::default()).unwrap()
}

#[test]
fn a_writers_items_name_a_stored_file_as_a_commit_of_the_directory_does() {
    let files = fixture_dir("mlp_2ranks_epoch1");
    let c = TestRepo::with_config(&delta_config());
    let committed = c.open();
    commit_under(&c, &committed, &files, "ck");
    let s = TestRepo::with_config(&delta_config());
    let stored = s.open();
    let v = save_written(&stored, &files, None, |name| name.ends_with(".distcp").then(|| report(&files, name)));
    // The same items, names and objects: the same manifests, so the two pair with each other.
    for (name, _) in &files {
        let path = format!("ck/{name}");
        let manifest = |repo: &Repo, rev: &str| {
            let v = repo.version(&repo.resolve(rev).unwrap()).unwrap();
            v.file(&path).unwrap().manifest
        };
        assert_eq!(manifest(&stored, &v.to_hex()), manifest(&committed, "HEAD"), "{name}");
    }
    let f = shown(&stored, "HEAD", "ck/__0_0.distcp");
    let names = tensors(&f);
    assert!(names.iter().any(|(n, _)| *n == "model.fc1.weight[0:16,0:8]"), "{names:?}");
    assert!(names.iter().all(|(n, _)| !n.starts_with("archive.")), "{names:?}");

    // A report that does not fit the file (another rank's items): cut by walking its archives,
    // as without a report; never refused, and it checks out bit-exactly.
    let (name, bytes) = files.iter().find(|(n, _)| n == "__1_0.distcp").unwrap();
    let walked = store_spooled(&stored, "ck/__1_0.distcp", bytes, None, None);
    let foreign = store_spooled(&stored, "ck/__1_0.distcp", bytes, None, Some(&report(&files, "__0_0.distcp")));
    assert_eq!(foreign.manifest, walked.manifest, "{name}");
    let v = stored.commit_stored("main", Some(v), vec![foreign], "foreign", &CommitOptions::default()).unwrap();
    let f = shown(&stored, &v.to_hex(), "ck/__1_0.distcp");
    let names = tensors(&f);
    assert!(!names.is_empty() && names.iter().all(|(n, _)| n.starts_with("archive.")), "{names:?}");
    assert_eq!(stored.read_file_bytes(&v.to_hex(), "ck/__1_0.distcp", 1 << 20).unwrap(), *bytes);
}

#[test]
fn named_items_pair_across_another_file_layout() {
    // Save 1 on 2 ranks; save 2 (the next epoch) on 1 rank: every item of the two files in one,
    // rank 1's first, at other offsets. Named by the writer's report, each pairs with its
    // namesake in either file of save 1, as well as save 2 on the same 2 ranks would; walked,
    // `archive.<n>` meets whatever was n-th in the same path.
    let (e1, e2) = (fixture_dir("mlp_2ranks_epoch1"), fixture_dir("mlp_2ranks_epoch2"));
    let get = |n: &str| e2.iter().find(|(p, _)| p == n).unwrap().1.clone();
    let (rank0, rank1) = (get("__0_0.distcp"), get("__1_0.distcp"));
    let one_file = [rank1.clone(), rank0.clone()].concat();
    let mut items = report(&e2, "__1_0.distcp");
    for mut item in report(&e2, "__0_0.distcp") {
        item.range = item.range.start + rank1.len() as u64..item.range.end + rank1.len() as u64;
        items.push(item);
    }
    let one_rank = vec![(".metadata".to_string(), get(".metadata")), ("__0_0.distcp".to_string(), one_file.clone())];
    let mut figures = Vec::new();
    for (save2, named) in [(&one_rank, true), (&one_rank, false), (&e2, true)] {
        let t = TestRepo::with_config(&delta_config());
        let repo = t.open();
        let v1 = save_written(&repo, &e1, None, |name| name.ends_with(".distcp").then(|| report(&e1, name)));
        let items_of = |name: &str| match (named, name) {
            (true, "__0_0.distcp") if save2.len() == 2 => Some(items.clone()),
            (true, n) if n.ends_with(".distcp") => Some(report(save2, n)),
            _ => None,
        };
        let v2 = save_written(&repo, save2, Some(v1), items_of);
        let stored = |v: &VersionId| repo.version(v).unwrap().stored_bytes;
        figures.push((stored(&v1), stored(&v2)));
        for (name, bytes) in save2.iter() {
            assert_eq!(repo.read_file_bytes(&v2.to_hex(), &format!("ck/{name}"), 1 << 20).unwrap(), *bytes);
        }
        assert!(repo.verify().unwrap().is_ok());
    }
    let [(first, named), (_, walked), (_, same_ranks)] = figures[..] else { unreachable!() };
    println!("save 1: {first} bytes; save 2: on 1 rank {named} named, {walked} walked; on 2 ranks {same_ranks}");
    assert!(named * 2 < first, "save 2 stored {named} bytes, save 1 {first}");
    assert!(named * 10 < same_ranks * 11, "on 1 rank {named}, on the same 2 ranks {same_ranks}");
    // Small tensors: framing (paired by length too) is most of what either stores.
    assert!(named < walked, "named {named}, walked {walked}");
}

/// `ckpt commit DIR` of a DCP checkpoint directory: every file under it (the same names as
/// naming each file), and a save on fewer ranks into the same directory leaves no stale rank
/// file in the version, so checkout gives exactly what `dcp.save` left.
#[test]
fn committing_a_dcp_directory_takes_it_as_it_is_now() {
    use crate::support::repo_util::ok;
    let t = TestRepo::init();
    let four = fixture_dir("mlp_4ranks_epoch2");
    for (name, bytes) in &four {
        t.write(&format!("ck/{name}"), bytes);
    }
    ok(&t, &["commit", "-q", "-m", "4 ranks", "ck"]);
    let paths = |repo: &Repo, rev: &str| -> Vec<String> {
        repo.version(&repo.resolve(rev).unwrap()).unwrap().files.iter().map(|f| f.path.clone()).collect()
    };
    let repo = t.open();
    let want: Vec<String> = four.iter().map(|(n, _)| format!("ck/{n}")).collect();
    assert_eq!(paths(&repo, "HEAD"), want);
    assert!(shown(&repo, "HEAD", "ck/__0_0.distcp").segments.iter().any(|s| s.name.starts_with("model.")));
    drop(repo);

    // The same directory saved again by 2 ranks: __2_0 and __3_0 are gone from it.
    std::fs::remove_dir_all(t.path("ck")).unwrap();
    let two = fixture_dir("mlp_2ranks_epoch2");
    for (name, bytes) in &two {
        t.write(&format!("ck/{name}"), bytes);
    }
    ok(&t, &["commit", "-q", "-m", "2 ranks", "ck"]);
    let repo = t.open();
    let want: Vec<String> = two.iter().map(|(n, _)| format!("ck/{n}")).collect();
    assert_eq!(paths(&repo, "HEAD"), want);
    let four_files: Vec<(String, Vec<u8>)> = four.iter().map(|(n, b)| (format!("ck/{n}"), b.clone())).collect();
    assert!(t.checkout_all(&repo, "HEAD~1") == four_files, "the 4-rank version checks out as it was committed");
    let two_files: Vec<(String, Vec<u8>)> = two.iter().map(|(n, b)| (format!("ck/{n}"), b.clone())).collect();
    assert!(t.checkout_all(&repo, "HEAD") == two_files, "the 2-rank version holds only the 2 ranks' files");
}

/// `diff` compares a DCP item with the same item in any rank file of the other version's
/// directory (a save on 4 ranks after one on 2 moves replicated items to other files); items
/// only one side has (resharded chunks are named by their new offsets) are added or removed.
#[test]
fn diff_pairs_items_across_the_rank_files_of_a_directory() {
    let t = TestRepo::init();
    let repo = t.open();
    commit_under(&t, &repo, &fixture_dir("mlp_2ranks_epoch1"), "ck");
    for f in std::fs::read_dir(t.path("ck")).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    commit_under(&t, &repo, &fixture_dir("mlp_4ranks_epoch2"), "ck");
    let report = repo.diff("HEAD~1", "HEAD").unwrap();
    let names = |v: &[(String, String)]| v.iter().map(|(_, n)| n.clone()).collect::<std::collections::BTreeSet<_>>();
    let items = |rev: &str| -> Vec<(String, String)> {
        let v = repo.version(&repo.resolve(rev).unwrap()).unwrap();
        let mut out = Vec::new();
        for f in v.files.iter().filter(|f| f.path.ends_with(dcp::DISTCP_SUFFIX)) {
            for (t, _) in repo.manifest(&f.manifest).unwrap().tensors() {
                out.push((f.path.clone(), t.name.clone()));
            }
        }
        out
    };
    let (before, after) = (items("HEAD~1"), items("HEAD"));
    let both: Vec<String> = names(&before).intersection(&names(&after)).cloned().collect();
    let moved = both
        .iter()
        .filter(|n| {
            let file_of = |v: &[(String, String)]| v.iter().find(|(_, m)| m == *n).map(|(f, _)| f.clone());
            file_of(&before) != file_of(&after)
        })
        .count();
    assert!(moved > 0, "the fixtures move some item to another rank file");
    let compared: std::collections::BTreeSet<String> = report.tensors.iter().map(|d| d.name.clone()).collect();
    for n in &both {
        assert!(compared.contains(n), "{n} is in both versions: compared, wherever it lies");
    }
    assert!(report.removed.iter().chain(&report.added).all(|r| !both.contains(&r.name)));
    assert!(!report.added.is_empty() && !report.removed.is_empty(), "resharded chunks have new names");
}

/// `show` lists a rank file's items and folds the framing of its archives into one line (the
/// JSON keeps every segment).
#[test]
fn show_folds_the_framing_of_a_rank_file_into_one_line() {
    use crate::support::repo_util::ok;
    let t = TestRepo::init();
    for (name, bytes) in fixture_dir("mlp_2ranks_epoch1") {
        t.write(&format!("ck/{name}"), &bytes);
    }
    ok(&t, &["commit", "-q", "-m", "e1", "ck"]);
    let text = ok(&t, &["show"]);
    let repo = t.open();
    let file = shown(&repo, "HEAD", "ck/__0_0.distcp");
    let framing = file.segments.iter().filter(|s| !s.is_tensor).count();
    assert!(framing > 1, "an archive per item");
    assert!(!text.contains("(archive)"), "{text}");
    assert!(text.contains(&format!("(framing of {framing} archives)")), "{text}");
    for s in file.segments.iter().filter(|s| s.is_tensor) {
        assert!(text.contains(&s.name), "{} listed", s.name);
    }
}
