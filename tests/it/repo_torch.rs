//! `torch.save` archives in a repository: committed storage by storage, checked out bit-exactly,
//! delta-coded between epochs; anything the reader does not understand is kept as opaque bytes.
//! The fixtures were written by real torch (tests/fixtures/torch/make_fixtures.py).

use crate::support::repo_util::{stderr, TestRepo};
use ckpt::repo::{Config, DeltaPolicy, FileFormat, Storage};

const CHUNK: usize = 4096;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch").join(name)).unwrap()
}

const FIXTURES: [&str; 9] = [
    "model_epoch1.pt",
    "model_epoch2.pt",
    "optimizer_epoch1.pt",
    "optimizer_epoch2.pt",
    "dtypes.pt",
    "lightning.ckpt",
    "shared.pt",
    "malicious.pt",
    "legacy.pt",
];

#[test]
fn fixtures_are_committed_as_tensors_and_checked_out_bit_exactly() {
    let t = TestRepo::init();
    let repo = t.open();
    let files: Vec<(&str, Vec<u8>)> = FIXTURES.iter().map(|n| (*n, fixture(n))).collect();
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    t.commit_files(&repo, &refs, "fixtures");
    let shown = repo.show("HEAD").unwrap();
    for f in &shown.files {
        let expected = match f.path.as_str() {
            "malicious.pt" | "legacy.pt" => FileFormat::Bytes,
            _ => FileFormat::Torch,
        };
        assert_eq!(f.kind, expected, "{}", f.path);
    }
    let dtypes = shown.files.iter().find(|f| f.path == "dtypes.pt").unwrap();
    let tensors: Vec<(&str, &str)> = dtypes
        .segments
        .iter()
        .filter(|s| s.is_tensor)
        .map(|s| (s.name.as_str(), s.dtype.as_deref().unwrap()))
        .collect();
    for (name, dtype) in [("bf16", "BF16"), ("fp16", "F16"), ("fp32", "F32"), ("int64", "I64"), ("bool", "BOOL")] {
        assert!(tensors.contains(&(name, dtype)), "{name}: {tensors:?}");
    }
    // Nothing in the malicious pickle ran (the reader never executes; this checks nothing did).
    assert!(!std::path::Path::new("/tmp/ckpt-torch-fixture-was-executed").exists());

    // Overwrite the working files, then check out: every byte comes back.
    for (n, _) in &files {
        t.write(n, b"overwritten");
    }
    let out = t.checkout_all(&repo, "HEAD");
    for (n, bytes) in &files {
        let got = &out.iter().find(|(p, _)| p == n).unwrap().1;
        assert!(got == bytes, "{n} differs after checkout");
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

#[test]
fn the_second_epoch_stores_deltas_against_the_first() {
    let config = Config { chunk_size: CHUNK, delta_policy: DeltaPolicy::Previous, ..Config::default() };
    let t = TestRepo::with_config(&config);
    let repo = t.open();
    t.commit_files(
        &repo,
        &[("model.pt", &fixture("model_epoch1.pt")), ("optim.pt", &fixture("optimizer_epoch1.pt"))],
        "1",
    );
    let e2 = [("model.pt", fixture("model_epoch2.pt")), ("optim.pt", fixture("optimizer_epoch2.pt"))];
    t.commit_files(&repo, &[(e2[0].0, &e2[0].1), (e2[1].0, &e2[1].1)], "2");
    let shown = repo.show("HEAD").unwrap();
    for f in &shown.files {
        let deltas: Vec<&str> =
            f.segments.iter().filter(|s| s.storage == Storage::Delta).map(|s| s.name.as_str()).collect();
        // The largest storages changed between the epochs and are stored as deltas.
        let wanted = if f.path == "model.pt" { "fc1.weight" } else { "state.1.exp_avg_sq" };
        assert!(deltas.contains(&wanted), "{}: deltas {deltas:?}", f.path);
    }
    let out = t.checkout_all(&repo, "HEAD~1");
    assert!(out.iter().any(|(p, b)| p == "model.pt" && *b == fixture("model_epoch1.pt")));
    let out = t.checkout_all(&repo, "HEAD");
    assert!(out.iter().any(|(p, b)| p == "optim.pt" && *b == e2[1].1));
}

#[test]
fn a_new_path_finds_its_reference_among_torch_files() {
    // `epoch_2.pt` next to `epoch_1.pt`: the tensors are matched by name, dtype and shape.
    let config = Config { chunk_size: CHUNK, delta_policy: DeltaPolicy::Previous, ..Config::default() };
    let t = TestRepo::with_config(&config);
    let repo = t.open();
    t.commit_files(&repo, &[("epoch_1.pt", &fixture("optimizer_epoch1.pt"))], "1");
    t.commit_files(&repo, &[("epoch_2.pt", &fixture("optimizer_epoch2.pt"))], "2");
    let shown = repo.show("HEAD").unwrap();
    let f = shown.files.iter().find(|f| f.path == "epoch_2.pt").unwrap();
    assert!(f.segments.iter().any(|s| s.storage == Storage::Delta), "no deltas for a new path");
}

#[test]
fn damaged_archives_are_committed_as_bytes_and_restored() {
    let t = TestRepo::init();
    let repo = t.open();
    let model = fixture("model_epoch1.pt");
    let truncated = model[..model.len() / 2].to_vec();
    let mut flipped = model.clone();
    let pkl = 100; // inside data.pkl, which torch writes first
    flipped[pkl] ^= 0xff;
    t.commit_files(&repo, &[("truncated.pt", &truncated), ("flipped.pt", &flipped)], "damaged");
    let shown = repo.show("HEAD").unwrap();
    let truncated_entry = shown.files.iter().find(|f| f.path == "truncated.pt").unwrap();
    assert_eq!(truncated_entry.kind, FileFormat::Bytes);
    let out = t.checkout_all(&repo, "HEAD");
    assert!(out.iter().any(|(p, b)| p == "truncated.pt" && *b == truncated));
    assert!(out.iter().any(|(p, b)| p == "flipped.pt" && *b == flipped));
}

#[test]
fn status_agrees_with_commit_and_show_lists_storages() {
    let t = TestRepo::init();
    let repo = t.open();
    t.commit_files(&repo, &[("opt.pt", &fixture("optimizer_epoch1.pt"))], "1");
    let status = t.ckpt(&["status", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(!text.contains("modified"), "a just-committed torch file shows as modified: {text}");
    let show = t.ckpt(&["show"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("state.0.exp_avg_sq") && text.contains("torch"), "{text}");
}

#[test]
fn compress_codes_storages_with_their_dtypes_and_round_trips() {
    use ckpt::codec::container::{Container, FileKind};
    use ckpt::file_codec::{self, Format};
    for name in ["optimizer_epoch1.pt", "dtypes.pt", "malicious.pt"] {
        let file = fixture(name);
        let (kind, segments) = file_codec::plan_segments(&file, Format::Detect).unwrap();
        let typed = segments.iter().filter(|(_, d, _)| d.is_some()).count();
        if name == "malicious.pt" {
            assert_eq!((kind, typed), (FileKind::Bytes, 0));
        } else {
            assert_eq!(kind, FileKind::Torch, "{name}");
            assert!(typed >= 10, "{name}: {typed} typed segments");
        }
        let options = ckpt::codec::Options { chunk_size: CHUNK, ..Default::default() };
        let (packed, _) = file_codec::compress(&file, Format::Detect, &options, Vec::new(), &mut |_| {}).unwrap();
        assert_eq!(Container::open(&packed).unwrap().kind(), kind);
        let mut out = Vec::new();
        file_codec::decompress(&packed, &mut out, &mut |_| {}).unwrap();
        assert!(out == file, "{name}");
    }
}
