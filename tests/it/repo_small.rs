//! Files of many small tensors (biases, norms; MoE and per-channel quantized models): bundled
//! into a few blobs in the repository, coded as runs through `ckpt compress`, and never larger
//! than `zstd -3` makes the whole file.

use crate::support::repo_util::{read_tree, weights, Rng, TestRepo};
use crate::support::util::tensor_data;
use ckpt::codec::Options;
use ckpt::file_codec::{self, Format};
use ckpt::repo::{CommitOptions, Config, DeltaPolicy, Repo};
use ckpt::Dtype;
use proptest::prelude::*;

/// Tensors of the big test file, and elements of each (F32: 128 bytes).
const TENSORS: usize = 20_000;
const ELEMENTS: usize = 32;

/// A name like those of a mixture-of-experts model.
fn name(i: usize) -> String {
    let (layer, e) = (i / 500, i % 500);
    let kind = ["bias", "norm.weight", "gate.bias", "scale"][e % 4];
    format!("model.layers.{layer}.mlp.experts.{}.{kind}", e / 4)
}

/// A safetensors file of 20,000 F32 tensors of 128 bytes, trained-looking weights (std 0.02);
/// the tensors in `changed` are at `epoch` 1, the others at 0.
fn many_small_tensors(changed: &[usize]) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        (0..TENSORS).map(|i| (name(i), Dtype::F32, vec![ELEMENTS as u64])).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).expect("valid header");
    for i in 0..TENSORS {
        let epoch = u32::from(changed.contains(&i));
        for x in weights(i as u64, ELEMENTS, epoch) {
            file.extend_from_slice(&x.to_le_bytes());
        }
    }
    file
}

fn store_bytes(t: &TestRepo) -> u64 {
    t.object_files().iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

#[test]
fn twenty_thousand_small_tensors_take_a_few_objects_and_less_than_zstd() {
    let v1 = many_small_tensors(&[]);
    let zstd3 = zstd::encode_all(&v1[..], 3).unwrap().len() as u64;
    let t = TestRepo::init();
    let repo = t.open();
    let id1 = t.commit_files(&repo, &[("moe.safetensors", &v1)], "v1");
    let files = t.object_files().len();
    let stored = store_bytes(&t);
    eprintln!("v1: {} bytes, zstd -3 {zstd3}, stored {stored} in {files} objects", v1.len());
    assert!(files <= 24, "{files} object files");
    assert!(stored <= zstd3, "stored {stored} > zstd -3 {zstd3}");
    assert_eq!(t.checkout_all(&repo, "HEAD"), vec![("moe.safetensors".to_string(), v1.clone())]);

    // The same file again stores nothing but a version.
    t.commit_files(&repo, &[("moe.safetensors", &v1)], "again");
    assert_eq!(t.object_files().len(), files + 1);

    // A few tensors change: the new bundle is stored whole, the old one becomes a small delta.
    let changed = [3, 4_000, 12_345, 19_999];
    let v2 = many_small_tensors(&changed);
    let id2 = t.commit_files(&repo, &[("moe.safetensors", &v2)], "v2");
    let grown = store_bytes(&t) - stored;
    eprintln!("v2: store grew by {grown} bytes");
    assert!(grown < v1.len() as u64 / 50, "a version changing 4 tensors of 128 bytes grew the store by {grown}");
    assert!(t.object_files().len() <= files + 8);
    for (id, bytes) in [(id1, &v1), (id2, &v2)] {
        assert_eq!(t.checkout_all(&repo, &id.to_hex()), vec![("moe.safetensors".to_string(), bytes.clone())]);
    }

    let show = repo.show("HEAD").unwrap();
    assert_eq!(show.totals.tensors, TENSORS as u64);
    assert_eq!(show.files[0].segments.len(), TENSORS + 1, "every tensor listed, and the header");
    assert_eq!(show.files[0].segments[1].name, name(0));
    let shares: u64 = show.files[0].segments.iter().map(|s| s.stored_bytes).sum();
    assert!(shares <= stored, "bundle shares add up to the objects ({shares})");

    let diff = repo.diff(&id1.to_hex(), &id2.to_hex()).unwrap();
    assert_eq!(diff.tensors.len(), TENSORS);
    let mut moved: Vec<String> = diff.tensors.iter().filter(|d| d.changed > 0).map(|d| d.name.clone()).collect();
    moved.sort();
    let mut expected: Vec<String> = changed.iter().map(|&i| name(i)).collect();
    expected.sort();
    assert_eq!(moved, expected);

    repo.gc_with(&ckpt::repo::GcOptions::now()).unwrap();
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(t.checkout_all(&repo, &id1.to_hex()), vec![("moe.safetensors".to_string(), v1)]);
}

#[test]
fn compress_codes_runs_of_small_tensors_below_zstd() {
    let file = many_small_tensors(&[]);
    let zstd3 = zstd::encode_all(&file[..], 3).unwrap().len();
    let (container, _) =
        file_codec::compress(&file, Format::Detect, &Options::default(), Vec::new(), &mut |_| {}).unwrap();
    eprintln!("compress: {} of {} bytes, zstd -3 {zstd3}", container.len(), file.len());
    assert!(container.len() <= zstd3, "container {} > zstd -3 {zstd3}", container.len());
    let mut back = Vec::new();
    file_codec::decompress(&container, &mut back, &mut |_| {}).unwrap();
    assert_eq!(back, file);
}

/// A file of tensors of random dtypes and sizes around the bundling threshold (4 KiB), in
/// random order, some empty, with a gap.
fn mixed_file(seed: u64, count: usize, epoch: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let dtypes = [Dtype::F32, Dtype::Bf16, Dtype::U8, Dtype::I64];
    let spec: Vec<(String, Dtype, Vec<u64>)> = (0..count)
        .map(|i| {
            let dtype = dtypes[rng.below(dtypes.len() as u64) as usize];
            let bytes = match rng.below(4) {
                0 => 4096 + 8 * rng.below(3) - 8,
                1 => 8 * rng.below(64),
                _ => 8 * rng.below(1024),
            };
            (format!("t{i}"), dtype, vec![bytes / dtype.size() as u64])
        })
        .collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).expect("valid header");
    for (i, (_, dtype, shape)) in spec.iter().enumerate() {
        // Half the tensors change from one epoch to the next.
        let data_seed = seed * 1000 + i as u64 + if i % 2 == 0 { epoch * 7 } else { 0 };
        file.extend_from_slice(&tensor_data(data_seed, *dtype, shape[0] as usize));
    }
    file
}

/// Where `a` and `b` first differ (`None`: equal), without printing megabytes.
fn first_difference(a: &[u8], b: &[u8]) -> Option<(usize, usize, usize)> {
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    (at.is_some() || a.len() != b.len()).then(|| (at.unwrap_or(a.len().min(b.len())), a.len(), b.len()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, max_shrink_iters: 20, ..ProptestConfig::default() })]

    /// Bundles round-trip: whole files, `--tensor` selections, and a second version delta-coded
    /// against the first, under both delta directions.
    #[test]
    fn bundles_round_trip(seed in 0u64..1_000_000, count in 1usize..60, reverse in any::<bool>()) {
        let delta_policy = if reverse { DeltaPolicy::Reverse } else { DeltaPolicy::Previous };
        let t = TestRepo::with_config(&Config { chunk_size: 4096, delta_policy, ..Config::default() });
        let repo = Repo::open(t.root()).unwrap();
        let v1 = mixed_file(seed, count, 0);
        let v2 = mixed_file(seed, count, 1);
        t.write("m.safetensors", &v1);
        let id1 = repo.commit(&["m.safetensors"], "v1", &CommitOptions::default()).unwrap();
        t.write("m.safetensors", &v2);
        let id2 = repo.commit(&["m.safetensors"], "v2", &CommitOptions::default()).unwrap();
        for (id, bytes) in [(id1, &v1), (id2, &v2)] {
            let files = t.checkout_all(&repo, &id.to_hex());
            prop_assert_eq!(files.len(), 1);
            prop_assert_eq!(first_difference(&files[0].1, bytes), None);
            // Odd-numbered tensors only, through `--tensor`.
            let out = tempfile::tempdir().unwrap();
            repo.checkout(&id.to_hex(), None, Some(out.path()), Some("t*1")).ok();
            for (_, selected) in read_tree(out.path()) {
                let header = ckpt::safetensors::parse(&selected).unwrap();
                let original = ckpt::safetensors::parse(bytes).unwrap();
                for tensor in &header.tensors {
                    prop_assert!(tensor.name.ends_with('1'));
                    let o = original.tensors.iter().find(|o| o.name == tensor.name).unwrap();
                    prop_assert_eq!(&selected[tensor.begin as usize..tensor.end as usize], &bytes[o.begin as usize..o.end as usize]);
                }
            }
        }
        let diff = repo.diff(&id1.to_hex(), &id2.to_hex()).unwrap();
        prop_assert_eq!(diff.tensors.len(), count);
        repo.gc_with(&ckpt::repo::GcOptions::now()).unwrap();
        let report = repo.verify().unwrap();
        prop_assert!(report.is_ok(), "verify: {:?}", report);
    }
}
