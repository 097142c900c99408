//! Cross-precision references (docs/format.md, "Derived blobs"): a bf16 copy of fp32 weights
//! stored as a residual against them, through commit, show, checkout, compaction, gc, verify,
//! push and clone (whole and depth 1), and a damaged reference.

use crate::support::repo_util::{ckpt_in, read_tree, stderr, weights, TestRepo};
use ckpt::repo::{CommitOptions, Config, DeltaPolicy, Repo};
use ckpt::store::ObjectKind;
use ckpt::{Dtype, ObjectId};
use std::collections::BTreeMap;
use std::path::Path;

/// Tensors large enough to be blobs of their own (not bundled): 64 KiB of f32 and more.
const SHAPES: &[(&str, &[u64])] = &[("layer.w", &[128, 256]), ("layer.v", &[64, 512]), ("head", &[96, 200])];

fn f32_to_bf16_nearest(x: f32) -> u16 {
    ckpt::codec::cross_precision::f32_to_bf16(x.to_bits(), ckpt::codec::cross_precision::Rounding::NearestEven)
}

/// A safetensors file of `SHAPES` at `epoch` in `dtype` (bf16 by rounding to nearest even, as
/// `.to(torch.bfloat16)` does), under names with `prefix`.
fn model(dtype: Dtype, epoch: u32, prefix: &str) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        SHAPES.iter().map(|(n, s)| (format!("{prefix}{n}"), dtype, s.to_vec())).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).expect("valid header");
    for (i, (_, shape)) in SHAPES.iter().enumerate() {
        let n: u64 = shape.iter().product();
        for x in weights(900 + i as u64, n as usize, epoch) {
            match dtype {
                Dtype::F32 => file.extend_from_slice(&x.to_le_bytes()),
                Dtype::Bf16 => file.extend_from_slice(&f32_to_bf16_nearest(x).to_le_bytes()),
                other => panic!("{other:?}"),
            }
        }
    }
    file
}

fn epoch_files(epoch: u32) -> Vec<(String, Vec<u8>)> {
    vec![
        ("model_bf16.safetensors".to_string(), model(Dtype::Bf16, epoch, "")),
        // The master weights under a DDP wrapper prefix: they still pair.
        ("model_fp32.safetensors".to_string(), model(Dtype::F32, epoch, "module.")),
    ]
}

fn config() -> Config {
    Config { delta_policy: DeltaPolicy::Reverse, base_every: 20, chunk_size: 64 << 10, ..Config::default() }
}

fn commit_epoch(t: &TestRepo, repo: &Repo, epoch: u32) -> (ObjectId, Vec<(String, Vec<u8>)>) {
    let files = epoch_files(epoch);
    t.write_files(&files);
    let id = repo
        .commit(
            &["model_bf16.safetensors", "model_fp32.safetensors"],
            &format!("epoch {epoch}"),
            &CommitOptions::default(),
        )
        .unwrap();
    (id, files)
}

/// The blobs of `file` in version `rev`, by tensor name.
fn tensor_blobs(repo: &Repo, rev: &str, file: &str) -> BTreeMap<String, ObjectId> {
    let v = repo.version(&repo.resolve(rev).unwrap()).unwrap();
    let m = repo.manifest(&v.file(file).unwrap().manifest).unwrap();
    m.tensors().map(|(t, s)| (t.name.clone(), s.blob.unwrap())).collect()
}

fn assert_checks_out(repo: &Repo, id: &ObjectId, files: &[(String, Vec<u8>)]) {
    let out = tempfile::tempdir().unwrap();
    repo.checkout(&id.to_hex(), None, Some(out.path()), None).unwrap();
    assert_eq!(read_tree(out.path()), files, "version {id}");
}

fn store_size(repo: &Repo) -> u64 {
    let store = repo.store();
    store.list().unwrap().iter().map(|id| store.stored_len(id).unwrap()).sum()
}

#[test]
fn bf16_copies_are_derived_from_fp32_and_survive_compaction_and_gc() {
    let t = TestRepo::with_config(&config());
    let repo = t.open();
    let history: Vec<_> = (0..3).map(|e| commit_epoch(&t, &repo, e)).collect();
    let store = repo.store();
    for (rev, (id, files)) in history.iter().enumerate() {
        let bf16 = tensor_blobs(&repo, &id.to_hex(), "model_bf16.safetensors");
        let fp32 = tensor_blobs(&repo, &id.to_hex(), "model_fp32.safetensors");
        for (name, blob) in &bf16 {
            let h = store.header(blob).unwrap();
            let conversion = h.conversion.unwrap_or_else(|| panic!("{name} of version {rev} is not derived"));
            assert_eq!(conversion.name(), "round-nearest-even");
            assert_eq!(h.reference, Some(fp32[&format!("module.{name}")]));
            // A perfect rounding costs the container's index, not the tensor.
            assert!(store.stored_len(blob).unwrap() < 2048, "{name}: {}", store.stored_len(blob).unwrap());
        }
        assert_checks_out(&repo, id, files);
    }
    // Reverse deltas rewrote the older fp32 blobs (which the derived blobs reference) as deltas.
    let old_fp32 = tensor_blobs(&repo, &history[0].0.to_hex(), "model_fp32.safetensors");
    assert!(old_fp32.values().all(|b| store.header(b).unwrap().reference.is_some()), "older fp32 is compacted");
    let old_bf16 = tensor_blobs(&repo, &history[0].0.to_hex(), "model_bf16.safetensors");
    assert!(old_bf16.values().all(|b| store.open_blob(b).unwrap().depth() >= 2), "derived over a delta");
    assert!(repo.verify().unwrap().is_ok());

    // The store holds about one fp32 series: the bf16 copies add almost nothing.
    let without_bf16 = {
        let u = TestRepo::with_config(&config());
        let r = u.open();
        for e in 0..3 {
            let files = epoch_files(e);
            u.write_files(&files[1..].to_vec());
            r.commit(&["model_fp32.safetensors"], "fp32 only", &CommitOptions::default()).unwrap();
        }
        store_size(&r)
    };
    let with_bf16 = store_size(&repo);
    assert!(with_bf16 < without_bf16 + 40_000, "{with_bf16} vs {without_bf16} without the bf16 copies");

    // `ckpt show` names the reference tensor and the rule, in text and JSON.
    let shown = ckpt_in(t.root(), &["show", "HEAD"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("derived from module.layer.w (round-nearest-even)"), "{text}");
    let json = ckpt_in(t.root(), &["show", "HEAD", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let seg = v["files"][0]["segments"].as_array().unwrap().iter().find(|s| s["name"] == "layer.w").unwrap().clone();
    assert_eq!(seg["derived_from"]["tensor"], "module.layer.w", "{seg}");
    assert_eq!(seg["derived_from"]["rule"], "round-nearest-even");
    assert_eq!(seg["derived_from"]["dtype"], "F32");

    // gc after the branch that held the reference versions is gone: a new branch keeps only
    // the newest version's bf16, derived from fp32 blobs it also holds; older chains go.
    repo.create_branch("keep", Some("HEAD")).unwrap();
    repo.switch("keep", false).unwrap();
    repo.delete_branch("main", true).unwrap();
    repo.gc().unwrap();
    assert!(repo.verify().unwrap().is_ok());
    let (id, files) = &history[2];
    assert_checks_out(&repo, id, files);
}

#[test]
fn a_version_of_only_bf16_derives_from_the_previous_fp32_which_a_depth_1_clone_keeps() {
    let t = TestRepo::with_config(&Config { delta_policy: DeltaPolicy::Previous, ..config() });
    let repo = t.open();
    // Version 1: fp32 master weights only.
    t.write("model_fp32.safetensors", &model(Dtype::F32, 4, ""));
    let v1 = repo.commit(&["model_fp32.safetensors"], "fp32", &CommitOptions::default()).unwrap();
    // Version 2: the bf16 copy, with the fp32 file removed from the version.
    let bf16 = model(Dtype::Bf16, 4, "");
    t.write("model_bf16.safetensors", &bf16);
    repo.rm(&[t.path("model_fp32.safetensors")]).unwrap();
    let v2 = repo.commit(&["model_bf16.safetensors"], "bf16", &CommitOptions::default()).unwrap();
    assert!(repo.version(&v2).unwrap().file("model_fp32.safetensors").is_none());
    let blobs = tensor_blobs(&repo, &v2.to_hex(), "model_bf16.safetensors");
    let fp32 = tensor_blobs(&repo, &v1.to_hex(), "model_fp32.safetensors");
    for (name, blob) in &blobs {
        assert_eq!(repo.store().header(blob).unwrap().reference, Some(fp32[name]), "{name}");
    }

    // A depth-1 clone holds v2 only; its blobs need v1's fp32 blobs, which it fetches, and
    // its gc (v1 is not even in its history) keeps them.
    let remote = tempfile::tempdir().unwrap();
    let url = remote.path().join("r");
    let ok = |dir: &Path, args: &[&str]| {
        let o = ckpt_in(dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    };
    ok(t.root(), &["remote", "add", "origin", url.to_str().unwrap()]);
    ok(t.root(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    let clone = parent.path().join("c");
    ok(parent.path(), &["clone", url.to_str().unwrap(), clone.to_str().unwrap(), "--depth", "1"]);
    let cloned = Repo::open(&clone).unwrap();
    assert!(!cloned.store().contains(&v1), "v1 is past the cut");
    cloned.gc().unwrap();
    for b in fp32.values() {
        assert!(cloned.store().contains(b), "the reference {b} was collected");
    }
    let out = tempfile::tempdir().unwrap();
    cloned.checkout(&v2.to_hex(), None, Some(out.path()), None).unwrap();
    assert_eq!(std::fs::read(out.path().join("model_bf16.safetensors")).unwrap(), bf16);
    assert!(cloned.verify().unwrap().is_ok());
}

#[test]
fn fp32_after_its_bf16_copy_is_widened_and_a_truncated_copy_is_detected() {
    let t = TestRepo::with_config(&Config { delta_policy: DeltaPolicy::Previous, ..config() });
    let repo = t.open();
    // A bf16 copy made by truncation (the top half of each fp32 element).
    let fp32 = model(Dtype::F32, 2, "");
    let header_len = 8 + u64::from_le_bytes(fp32[..8].try_into().unwrap()) as usize;
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        SHAPES.iter().map(|(n, s)| (n.to_string(), Dtype::Bf16, s.to_vec())).collect();
    let mut truncated = ckpt::safetensors::write_header(&spec, None).unwrap();
    for w in fp32[header_len..].chunks_exact(4) {
        truncated.extend_from_slice(&w[2..4]);
    }
    t.write("model_bf16.safetensors", &truncated);
    repo.commit(&["model_bf16.safetensors"], "bf16 first", &CommitOptions::default()).unwrap();
    t.write("model_fp32.safetensors", &fp32);
    let v2 = repo.commit(&["model_fp32.safetensors"], "fp32 next", &CommitOptions::default()).unwrap();
    let store = repo.store();
    let blobs = tensor_blobs(&repo, &v2.to_hex(), "model_fp32.safetensors");
    for (name, blob) in &blobs {
        let h = store.header(blob).unwrap();
        assert_eq!(h.conversion.map(|c| c.name()), Some("widen"), "{name}");
        // The top half is predicted exactly: about half the raw size is left at most.
        assert!(store.stored_len(blob).unwrap() < h.raw_len * 6 / 10, "{name}");
    }
    let out = tempfile::tempdir().unwrap();
    repo.checkout(&v2.to_hex(), None, Some(out.path()), None).unwrap();
    assert_eq!(std::fs::read(out.path().join("model_fp32.safetensors")).unwrap(), fp32);
    assert_eq!(std::fs::read(out.path().join("model_bf16.safetensors")).unwrap(), truncated);

    // The same two files committed together: the bf16 copy is derived by truncation.
    let u = TestRepo::with_config(&config());
    let r = u.open();
    u.write("a/model_bf16.safetensors", &truncated);
    u.write("b/model_fp32.safetensors", &fp32);
    let id = r.commit(&["a/model_bf16.safetensors", "b/model_fp32.safetensors"], "both", &CommitOptions::default());
    let blobs = tensor_blobs(&r, &id.unwrap().to_hex(), "a/model_bf16.safetensors");
    for blob in blobs.values() {
        assert_eq!(r.store().header(blob).unwrap().conversion.map(|c| c.name()), Some("truncate"));
    }
    assert!(r.verify().unwrap().is_ok());
}

#[test]
fn a_damaged_reference_is_named_by_checkout_and_verify() {
    let t = TestRepo::with_config(&config());
    let repo = t.open();
    let (id, _) = commit_epoch(&t, &repo, 1);
    let bf16 = tensor_blobs(&repo, &id.to_hex(), "model_bf16.safetensors");
    let fp32 = tensor_blobs(&repo, &id.to_hex(), "model_fp32.safetensors");
    let reference = fp32["module.layer.w"];
    assert_eq!(repo.store().header(&bf16["layer.w"]).unwrap().reference, Some(reference));
    // Flip a payload byte of the fp32 reference.
    let path = repo.store().object_path(&reference);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[ckpt::store::HEADER_LEN + 40] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = repo.checkout(&id.to_hex(), None, Some(out.path()), None).unwrap_err();
    assert!(format!("{err:#}").contains(&reference.to_hex()[..12]), "{err:#}");
    let report = repo.verify().unwrap();
    assert!(!report.is_ok());
    let text = format!("{report:?}");
    assert!(text.contains(&reference.to_hex()), "{text}");
    // A missing reference: the derived blob's error names the missing id.
    std::fs::remove_file(&path).unwrap();
    let err = repo.store().open_blob(&bf16["layer.w"]).err().unwrap();
    assert!(
        err.to_string().contains("cross-precision reference") && err.to_string().contains(&reference.to_hex()),
        "{err}"
    );
}

fn push_and_clone(depth: Option<&str>) {
    let t = TestRepo::with_config(&config());
    let repo = t.open();
    let history: Vec<_> = (0..3).map(|e| commit_epoch(&t, &repo, e)).collect();
    let remote = tempfile::tempdir().unwrap();
    let url = remote.path().join("r");
    let ok = |dir: &Path, args: &[&str]| {
        let o = ckpt_in(dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    };
    ok(t.root(), &["remote", "add", "origin", url.to_str().unwrap()]);
    ok(t.root(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    let clone = parent.path().join("c");
    let mut args = vec!["clone", url.to_str().unwrap(), clone.to_str().unwrap()];
    if let Some(d) = depth {
        args.extend(["--depth", d]);
    }
    ok(parent.path(), &args);
    let cloned = Repo::open(&clone).unwrap();
    let newest = &history[2];
    assert_eq!(read_tree(&clone).into_iter().filter(|(p, _)| !p.starts_with(".ckpt")).collect::<Vec<_>>(), newest.1);
    let bf16 = tensor_blobs(&cloned, "HEAD", "model_bf16.safetensors");
    assert!(bf16.values().all(|b| cloned.store().header(b).unwrap().conversion.is_some()), "still derived");
    let versions = if depth.is_some() { 1 } else { 3 };
    for (id, files) in &history[3 - versions..] {
        assert_checks_out(&cloned, id, files);
    }
    assert!(cloned.verify().unwrap().is_ok());
    assert!(cloned
        .store()
        .list()
        .unwrap()
        .iter()
        .all(|id| cloned.store().header(id).unwrap().kind != ObjectKind::Blob || cloned.store().open_blob(id).is_ok()));
}

#[test]
fn push_and_clone_carry_the_references() {
    push_and_clone(None);
}

#[test]
fn a_depth_1_clone_fetches_the_references() {
    push_and_clone(Some("1"));
}

/// Little-endian bytes of `values` in `dtype` (bf16/f16 by rounding to nearest even).
fn float_bytes(values: &[f32], dtype: Dtype) -> Vec<u8> {
    use ckpt::codec::cross_precision::{f32_to_bf16, f32_to_f16, Rounding};
    let mut out = Vec::new();
    for v in values {
        match dtype {
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&f32_to_bf16(v.to_bits(), Rounding::NearestEven).to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&f32_to_f16(v.to_bits(), Rounding::NearestEven).to_le_bytes()),
            other => panic!("{other:?}"),
        }
    }
    out
}

#[test]
fn chains_through_derived_blobs_decode_exactly_in_every_direction() {
    use ckpt::codec::Options;
    use ckpt::store::{DeltaOutcome, DerivedTarget, Feedback};
    let t = TestRepo::init();
    let repo = t.open();
    let store = repo.store();
    let options = Options { chunk_size: 16 << 10, ..Options::default() };
    let n = 20_000;
    let mut a0 = weights(5, n, 0);
    // Special values: NaNs, infinities, signed zeros, subnormals of f32 and of f16, f16 overflow.
    let special = [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, -3e-39, 5.9e-8, 7e4];
    a0[..special.len()].copy_from_slice(&special);
    let a1: Vec<f32> = a0.iter().enumerate().map(|(i, x)| if i % 7 == 0 { x * 1.01 } else { *x }).collect();
    let write = |data: &[u8], dtype| {
        let id = ObjectId::hash(data);
        store.write_blob(id, data, Some(dtype), &options, &Feedback::NONE).unwrap();
        id
    };
    let delta = |data: &[u8], reference: ObjectId| {
        let id = ObjectId::hash(data);
        let chain = store.open_blob(&reference).unwrap();
        match store.write_blob_delta(id, data, &chain, u64::MAX, &options, &Feedback::NONE).unwrap() {
            DeltaOutcome::Written(_) => id,
            other => panic!("{other:?}"),
        }
    };
    let derive = |data: &[u8], dtype, reference: ObjectId| {
        let id = ObjectId::hash(data);
        let chain = store.open_blob(&reference).unwrap();
        let coded = store.code_blob_derived(
            DerivedTarget { id, data, dtype, limit: u64::MAX },
            &chain,
            &options,
            &Feedback::NONE,
        );
        store.keep(coded.unwrap().unwrap()).unwrap();
        id
    };
    let read = |id: &ObjectId| {
        let mut out = Vec::new();
        store.open_blob(id).unwrap().copy_to(&mut out).unwrap();
        out
    };
    let f0 = write(&float_bytes(&a0, Dtype::F32), Dtype::F32);
    let f1 = delta(&float_bytes(&a1, Dtype::F32), f0);
    // bf16 from a delta chain, with a few elements that are not roundings of the reference.
    let mut b1 = float_bytes(&a1, Dtype::Bf16);
    for i in (0..b1.len()).step_by(997) {
        b1[i] ^= 0x5A;
    }
    let d1 = derive(&b1, Dtype::Bf16, f1);
    assert_eq!(read(&d1), b1);
    // The next bf16 as a delta of the derived one: its chain ends at a derived blob.
    let mut b2 = b1.clone();
    b2[100..140].fill(7);
    let d2 = delta(&b2, d1);
    assert_eq!(read(&d2), b2);
    let chain = store.open_blob(&d2).unwrap();
    assert_eq!(chain.depth(), 3, "d2 -> d1 -> f1 -> f0");
    assert_eq!(chain.ids(), vec![d2, d1, f1, f0]);
    chain.verify_members(2).unwrap();
    let decoder = chain.decoder().unwrap();
    let mut part = vec![0u8; decoder.byte_range(1..2).len()];
    decoder.decode_into(1..2, &mut part).unwrap();
    assert_eq!(part, b2[decoder.byte_range(1..2)]);
    // f16 by rounding, and f32 widened from the f16 copy (the low bits coded).
    let h = float_bytes(&a1, Dtype::F16);
    let dh = derive(&h, Dtype::F16, f1);
    assert_eq!(read(&dh), h);
    // The f32 content of a blob in dh's own chain cannot be derived from it (a cycle).
    let wide = float_bytes(&a0, Dtype::F32);
    let chain = store.open_blob(&dh).unwrap();
    let refused = store.code_blob_derived(
        DerivedTarget { id: f0, data: &wide, dtype: Dtype::F32, limit: u64::MAX },
        &chain,
        &options,
        &Feedback::NONE,
    );
    assert!(matches!(refused, Err(ckpt::store::Error::Encode { .. })));
    let a2: Vec<f32> = a1.iter().map(|x| x * 0.999).collect();
    let wide = float_bytes(&a2, Dtype::F32);
    let dw = derive(&wide, Dtype::F32, dh);
    assert_eq!(read(&dw), wide);
    assert_eq!(store.header(&dw).unwrap().conversion.map(|c| c.name()), Some("widen"));
    // A reference whose chunks cannot line up (4 KiB of f32 would need 2 KiB chunks of bf16).
    let small = Options { chunk_size: 4096, ..options.clone() };
    let other: Vec<f32> = a0.iter().map(|x| x * 3.0).collect();
    let g = ObjectId::hash(&float_bytes(&other, Dtype::F32));
    store.write_blob(g, &float_bytes(&other, Dtype::F32), Some(Dtype::F32), &small, &Feedback::NONE).unwrap();
    let narrow = float_bytes(&other, Dtype::Bf16);
    let refused = store.code_blob_derived(
        DerivedTarget { id: ObjectId::hash(&narrow), data: &narrow, dtype: Dtype::Bf16, limit: u64::MAX },
        &store.open_blob(&g).unwrap(),
        &options,
        &Feedback::NONE,
    );
    assert!(matches!(refused, Err(ckpt::store::Error::Encode { .. })));
    // Element counts that differ are refused too.
    let short = &narrow[..narrow.len() - 2];
    let chain = store.open_blob(&f1).unwrap();
    let refused = store.code_blob_derived(
        DerivedTarget { id: ObjectId::hash(short), data: short, dtype: Dtype::Bf16, limit: u64::MAX },
        &chain,
        &options,
        &Feedback::NONE,
    );
    assert!(refused.is_err());
}

/// The bf16 copy of `fp32` (a `model(F32, ..)` file without prefix) by truncation.
fn truncated_copy(fp32: &[u8]) -> Vec<u8> {
    let header_len = 8 + u64::from_le_bytes(fp32[..8].try_into().unwrap()) as usize;
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        SHAPES.iter().map(|(n, s)| (n.to_string(), Dtype::Bf16, s.to_vec())).collect();
    let mut truncated = ckpt::safetensors::write_header(&spec, None).unwrap();
    for w in fp32[header_len..].chunks_exact(4) {
        truncated.extend_from_slice(&w[2..4]);
    }
    truncated
}

/// Every derived blob of `file` in `HEAD` is byte for byte the object the store codes from its
/// reference decoded out of the store (`Store::code_blob_derived`, what commits did before
/// they predicted from the input's bytes): recoded that way over the same id, the object file
/// is unchanged. Returns the header depths of the blobs compared.
fn derived_objects_match_decoded_path(repo: &Repo, config: &Config, file: &str) -> Vec<u32> {
    use ckpt::store::{DerivedTarget, Feedback};
    let store = repo.store();
    let mut depths = Vec::new();
    for (name, blob) in tensor_blobs(repo, "HEAD", file) {
        let header = store.header(&blob).unwrap();
        if header.conversion.is_none() {
            continue;
        }
        let mut content = Vec::new();
        store.open_blob(&blob).unwrap().copy_to(&mut content).unwrap();
        let path = store.object_path(&blob);
        let written = std::fs::read(&path).unwrap();
        let reference = store.open_blob(&header.reference.unwrap()).unwrap();
        let options = config.codec_options();
        let dtype = header.dtype.unwrap();
        let coded = store.code_blob_derived(
            DerivedTarget { id: blob, data: &content, dtype, limit: u64::MAX },
            &reference,
            &options,
            &Feedback::NONE,
        );
        store.remove(&blob).unwrap();
        store.keep(coded.unwrap().unwrap()).unwrap();
        assert!(std::fs::read(&path).unwrap() == written, "{file} {name}: the object differs");
        depths.push(header.depth);
    }
    depths
}

#[test]
fn blobs_derived_from_the_input_are_the_objects_decoding_the_reference_gives() {
    for policy in [DeltaPolicy::Previous, DeltaPolicy::Reverse] {
        // Previous: the fp32 reference is itself a version delta (the depth the derived
        // header records counts it); reverse: it is standalone when the bf16 copy is coded.
        let config = Config { delta_policy: policy, base_every: 20, chunk_size: 64 << 10, ..Config::default() };
        let t = TestRepo::with_config(&config);
        let repo = t.open();
        let mut depths = Vec::new();
        for epoch in 0..3 {
            commit_epoch(&t, &repo, epoch);
            depths.extend(derived_objects_match_decoded_path(&repo, &config, "model_bf16.safetensors"));
        }
        // The fp32 file again, unchanged (its blobs stored already, so their form is read from
        // the store), with a bf16 copy by truncation: derived from the input's fp32 bytes too.
        let fp32 = model(Dtype::F32, 2, "");
        t.write("model_fp32.safetensors", &fp32);
        t.write("model_bf16.safetensors", &truncated_copy(&fp32));
        repo.commit(&["model_bf16.safetensors", "model_fp32.safetensors"], "truncated", &CommitOptions::default())
            .unwrap();
        let stored_before = derived_objects_match_decoded_path(&repo, &config, "model_bf16.safetensors");
        assert_eq!(stored_before.len(), SHAPES.len(), "{policy:?}: every truncated copy is derived");
        depths.extend(stored_before);
        assert!(depths.len() >= 3 * SHAPES.len(), "{policy:?}: {depths:?}");
        if policy == DeltaPolicy::Previous {
            assert!(depths.iter().any(|d| *d > 1), "no reference was a delta: {depths:?}");
        }
        assert!(repo.verify().unwrap().is_ok());
    }
}

/// Rewrites `path` in place (same length, no truncation: a map of it sees the new bytes) with
/// `bytes` when the commit phase starts, once.
struct RewriteWhenCommitting {
    path: std::path::PathBuf,
    bytes: Vec<u8>,
    done: std::sync::atomic::AtomicBool,
}

impl ckpt::repo::Progress for RewriteWhenCommitting {
    fn start(&self, label: &str, _total: u64) {
        if label == "commit" && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&self.path).unwrap();
            f.write_all(&self.bytes).unwrap();
            f.sync_all().unwrap();
        }
    }
}

/// The fp32 file a bf16 copy is predicted from changes after it was hashed, before the copy is
/// coded: the residual is taken against other bytes than its reference's content. The commit
/// fails, and no such blob is kept, whether the fp32 blobs are new in this commit (removed
/// with the file's blobs) or were stored before (the file's blobs are not this commit's to
/// remove: the derived ones still are). Every blob left in the store decodes to its id.
#[test]
fn a_copy_predicted_from_a_file_that_changed_is_never_kept() {
    for fp32_stored_before in [true, false] {
        let t = TestRepo::with_config(&config());
        let mut repo = t.open();
        let fp32 = model(Dtype::F32, 0, "");
        let copy = truncated_copy(&fp32);
        if fp32_stored_before {
            t.write("model_fp32.safetensors", &fp32);
            repo.commit(&["model_fp32.safetensors"], "fp32", &CommitOptions::default()).unwrap();
        }
        t.write("model_fp32.safetensors", &fp32);
        t.write("model_bf16.safetensors", &copy);
        let changed = model(Dtype::F32, 1, "");
        assert_eq!(changed.len(), fp32.len());
        repo.set_progress(std::sync::Arc::new(RewriteWhenCommitting {
            path: t.path("model_fp32.safetensors"),
            bytes: changed,
            done: Default::default(),
        }));
        let result =
            repo.commit(&["model_bf16.safetensors", "model_fp32.safetensors"], "racing", &CommitOptions::default());
        assert!(
            matches!(result, Err(ckpt::repo::Error::FileChanged { ref path }) if path == "model_fp32.safetensors"),
            "{result:?}"
        );
        let store = repo.store();
        let header_len = 8 + u64::from_le_bytes(copy[..8].try_into().unwrap()) as usize;
        let mut offset = header_len;
        for (name, shape) in SHAPES {
            let len = shape.iter().product::<u64>() as usize * 2;
            let id = ObjectId::hash(&copy[offset..offset + len]);
            assert!(!store.contains(&id), "fp32 stored before: {fp32_stored_before}; {name}'s copy was kept");
            offset += len;
        }
        for id in store.list().unwrap() {
            if store.header(&id).unwrap().kind == ObjectKind::Blob {
                store.open_blob(&id).unwrap().copy_to(&mut std::io::sink()).unwrap();
            }
        }
        // The retry, with the file as it is now, commits exactly the files.
        repo.set_progress(std::sync::Arc::new(RewriteWhenCommitting {
            path: t.path("unused"),
            bytes: Vec::new(),
            done: true.into(),
        }));
        let id = repo.commit(&["model_bf16.safetensors", "model_fp32.safetensors"], "retry", &CommitOptions::default());
        let files = vec![
            ("model_bf16.safetensors".to_string(), copy.clone()),
            ("model_fp32.safetensors".to_string(), model(Dtype::F32, 1, "")),
        ];
        assert_checks_out(&repo, &id.unwrap(), &files);
        assert!(repo.verify().unwrap().is_ok());
    }
}
