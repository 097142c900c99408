//! `show` and `diff`: how each tensor is stored, and what changed between versions.

use crate::support::repo_util::{stderr, synthetic_checkpoint, TestRepo, SMALL_MODEL};
use crate::support::util::tensor_data;
use ckpt::repo::{Config, DeltaPolicy, Storage};
use ckpt::Dtype;

const CHUNK: usize = 4096;

/// Forward deltas (`previous`), so that each version's new tensors are deltas against its parent's.
fn config() -> Config {
    Config { base_every: 4, chunk_size: CHUNK, delta_policy: DeltaPolicy::Previous, ..Config::default() }
}

/// A safetensors file from (name, dtype, shape, data).
fn file_of(tensors: &[(&str, Dtype, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        tensors.iter().map(|(n, d, s, _)| (n.to_string(), *d, s.clone())).collect();
    let mut file = ckpt::safetensors::write_header(&spec, None).unwrap();
    for (_, _, _, data) in tensors {
        file.extend_from_slice(data);
    }
    file
}

#[test]
fn show_reports_base_delta_duplicate_and_method_counts() {
    let t = TestRepo::with_config(&config());
    let repo = t.open();
    let notes = b"notes\n".to_vec();
    let v0 = synthetic_checkpoint(3, Dtype::Bf16, SMALL_MODEL, 0);
    t.commit_files(&repo, &[("m.safetensors", &v0), ("notes.txt", &notes)], "epoch 0");
    let first = repo.show("HEAD").unwrap();
    assert_eq!(first.parents.len(), 0);
    assert_eq!(first.message, "epoch 0");
    assert_eq!(first.totals.files, 2);
    assert_eq!(first.totals.tensors, SMALL_MODEL.len() as u64);
    for f in &first.files {
        for s in &f.segments {
            assert_eq!(s.storage, Storage::Base, "{} {}", f.path, s.name);
            assert_eq!((s.reference, s.depth), (None, 0));
        }
    }
    assert_eq!(first.totals.delta + first.totals.duplicate, 0);

    let v1 = synthetic_checkpoint(3, Dtype::Bf16, SMALL_MODEL, 1);
    let id1 = t.commit_files(&repo, &[("m.safetensors", &v1), ("notes.txt", &notes)], "epoch 1");
    let second = repo.show(&id1.to_hex()[..8]).unwrap();
    assert_eq!(second.id, id1);
    assert_eq!(second.parents, vec![first.id]);
    let model = second.files.iter().find(|f| f.path == "m.safetensors").unwrap();
    let deltas: Vec<_> = model.segments.iter().filter(|s| s.storage == Storage::Delta).collect();
    assert!(!deltas.is_empty(), "epoch 1 stores deltas");
    for s in &deltas {
        assert_eq!(s.depth, 1);
        let base = first.files[0].segments.iter().find(|b| b.name == s.name).unwrap();
        assert_eq!(s.reference, Some(base.blob), "{}", s.name);
    }
    let notes_file = second.files.iter().find(|f| f.path == "notes.txt").unwrap();
    assert_eq!(notes_file.segments[0].storage, Storage::Duplicate);
    assert_eq!(notes_file.added_bytes, 0);

    // Two identical tensors in one file: the second is a duplicate of the first.
    let data = tensor_data(9, Dtype::F32, 3000);
    let twins = file_of(&[("a", Dtype::F32, vec![3000], data.clone()), ("b", Dtype::F32, vec![3000], data)]);
    t.commit_files(&repo, &[("twins.safetensors", &twins)], "twins");
    let third = repo.show("HEAD").unwrap();
    let tw = third.files.iter().find(|f| f.path == "twins.safetensors").unwrap();
    let by_name = |n: &str| tw.segments.iter().find(|s| s.name == n).unwrap();
    assert_eq!(by_name("a").storage, Storage::Base);
    assert_eq!(by_name("b").storage, Storage::Duplicate);
    // Files carried over from the parent are duplicates throughout.
    assert!(third.files.iter().filter(|f| f.path != "twins.safetensors").all(|f| f.added_bytes == 0));

    // Method counts add up to chunks × groups, chunks to the chunk size.
    for report in [&first, &second, &third] {
        let mut total = 0;
        for f in &report.files {
            for s in &f.segments {
                assert_eq!(s.methods.total(), s.chunks * s.groups_per_chunk, "{} {}", f.path, s.name);
                assert_eq!(s.chunks, s.raw_bytes.div_ceil(CHUNK as u64), "{} {}", f.path, s.name);
                if let Some(d) = &s.dtype {
                    let size = Dtype::from_safetensors_name(d).unwrap().size() as u64;
                    assert_eq!(s.groups_per_chunk, size);
                }
                total += s.methods.total();
            }
        }
        assert_eq!(report.totals.methods.total(), total);
        assert_eq!(report.totals.raw_bytes, report.files.iter().map(|f| f.raw_bytes).sum::<u64>());
    }

    // The CLI: text and JSON.
    drop(repo);
    let out = t.ckpt(&["show", "HEAD~1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("delta vs") && text.contains("duplicate") && text.contains("total"), "{text}");
    let out = t.ckpt(&["show", "HEAD~1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["id"], id1.to_hex());
    let segments = json["files"][0]["segments"].as_array().unwrap();
    assert!(segments.iter().any(|s| s["storage"] == "delta" && s["depth"] == 1));
    assert!(json["totals"]["methods"]["huffman"].is_u64());
}

fn set(data: &mut [u8], i: usize, bytes: &[u8]) {
    data[i * bytes.len()..(i + 1) * bytes.len()].copy_from_slice(bytes);
}

/// Byte-group changes as the codec sees them: XOR, move the exponent into the top byte and the
/// sign below it (docs/format.md, "Exponent extraction"), count bytes.
fn expected_groups_f32(a: &[u8], b: &[u8]) -> Vec<u64> {
    let mut g = vec![0u64; 4];
    for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        let d = u32::from_le_bytes(x.try_into().unwrap()) ^ u32::from_le_bytes(y.try_into().unwrap());
        let d = ((d << 1) & 0xFF00_0000) | ((d >> 8) & 0x0080_0000) | (d & 0x007F_FFFF);
        for (k, byte) in d.to_le_bytes().iter().enumerate() {
            g[k] += u64::from(*byte != 0);
        }
    }
    g
}

#[test]
fn diff_reports_exact_changes() {
    let t = TestRepo::with_config(&config());
    let repo = t.open();
    let n = 3000usize;
    let w0 = tensor_data(1, Dtype::F32, n);
    let mut h0 = tensor_data(2, Dtype::Bf16, 2000);
    set(&mut h0, 0, &0x3F80u16.to_le_bytes()); // 1.0
    let mut f0 = tensor_data(3, Dtype::F16, 1000);
    set(&mut f0, 3, &0x4000u16.to_le_bytes()); // 2.0
    let i0 = tensor_data(4, Dtype::I32, 500);
    let gone = tensor_data(5, Dtype::F32, 10);
    let shaped = tensor_data(6, Dtype::F32, 12);
    let a = file_of(&[
        ("w", Dtype::F32, vec![30, 100], w0.clone()),
        ("h", Dtype::Bf16, vec![2000], h0.clone()),
        ("f", Dtype::F16, vec![1000], f0.clone()),
        ("i", Dtype::I32, vec![500], i0.clone()),
        ("gone", Dtype::F32, vec![10], gone),
        ("shaped", Dtype::F32, vec![3, 4], shaped.clone()),
    ]);
    let ida = t.commit_files(&repo, &[("m.safetensors", &a)], "a");

    // Known changes: three sign flips and one +0.5 in w, one element each in h, f and i.
    let mut w1 = w0.clone();
    let val = |d: &[u8], i: usize| f32::from_le_bytes(d[i * 4..i * 4 + 4].try_into().unwrap());
    let mut max = 0f64;
    for i in [5usize, 100, 2999] {
        let x = val(&w0, i);
        set(&mut w1, i, &(-x).to_le_bytes());
        max = max.max((2.0 * x as f64).abs());
    }
    let x = val(&w0, 7);
    let y = x + 0.5;
    set(&mut w1, 7, &y.to_le_bytes());
    max = max.max((y as f64 - x as f64).abs());
    let mut h1 = h0.clone();
    set(&mut h1, 0, &0xC040u16.to_le_bytes()); // -3.0
    let mut f1 = f0.clone();
    set(&mut f1, 3, &0x3C00u16.to_le_bytes()); // 1.0
    let mut i1 = i0.clone();
    set(&mut i1, 1, &7i32.to_le_bytes());
    assert_ne!(i0[4..8], i1[4..8]);
    let b = file_of(&[
        ("w", Dtype::F32, vec![30, 100], w1.clone()),
        ("h", Dtype::Bf16, vec![2000], h1),
        ("f", Dtype::F16, vec![1000], f1),
        ("i", Dtype::I32, vec![500], i1),
        ("new", Dtype::F32, vec![4], tensor_data(7, Dtype::F32, 4)),
        ("shaped", Dtype::F32, vec![4, 3], shaped),
    ]);
    let idb = t.commit_files(&repo, &[("m.safetensors", &b), ("extra.safetensors", &file_of(&[]))], "b");

    let d = repo.diff(&ida.to_hex(), "HEAD").unwrap();
    assert_eq!((d.from, d.to), (ida, idb));
    let get = |name: &str| d.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name}"));
    let w = get("w");
    assert_eq!((w.elements, w.changed), (3000, 4));
    assert!((w.percent_changed - 400.0 / 3000.0).abs() < 1e-12);
    let groups: Vec<u64> = w.byte_groups.iter().map(|g| g.changed).collect();
    assert_eq!(groups, expected_groups_f32(&w0, &w1));
    assert!(groups[2] >= 3, "sign flips land in byte group 2: {groups:?}");
    assert!((w.byte_groups[2].percent - 100.0 * groups[2] as f64 / 3000.0).abs() < 1e-12);
    assert_eq!(w.max_abs_delta, Some(max));
    let h = get("h");
    assert_eq!((h.changed, h.max_abs_delta), (1, Some(4.0)));
    // 1.0 (0x3F80) vs -3.0 (0xC040) rotated: 0x7F00 vs 0x8081: both bytes differ.
    assert_eq!(h.byte_groups.iter().map(|g| g.changed).collect::<Vec<_>>(), vec![1, 1]);
    let f = get("f");
    assert_eq!((f.changed, f.max_abs_delta), (1, Some(1.0)));
    let i = get("i");
    assert_eq!((i.changed, i.max_abs_delta), (1, None));
    assert_eq!(i.byte_groups.len(), 4);
    assert_eq!(d.tensors.len(), 4);
    assert_eq!(d.added.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["new"]);
    assert_eq!(d.removed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["gone"]);
    assert_eq!(d.reshaped.len(), 1);
    assert_eq!((d.reshaped[0].from_shape.clone(), d.reshaped[0].to_shape.clone()), (vec![3, 4], vec![4, 3]));
    assert_eq!(d.files_added, vec!["extra.safetensors".to_string()]);
    assert_eq!(d.files_changed, vec!["m.safetensors".to_string()]);

    // Identical versions: nothing changed.
    for (x, y) in [("HEAD", "HEAD"), ("HEAD~1", "HEAD~1")] {
        let same = repo.diff(x, y).unwrap();
        assert!(same.tensors.iter().all(|t| t.changed == 0 && t.byte_groups.iter().all(|g| g.changed == 0)));
        assert!(same.tensors.iter().all(|t| t.max_abs_delta.is_none_or(|m| m == 0.0)));
        assert!(same.added.is_empty() && same.removed.is_empty() && same.reshaped.is_empty());
        assert!(same.files_changed.is_empty());
    }
    // The same bytes committed again dedup to the same blobs: nothing changed.
    let id_c = t.commit_files(&repo, &[("m.safetensors", &a)], "a again");
    let again = repo.diff(&ida.to_hex(), &id_c.to_hex()).unwrap();
    assert!(again.tensors.iter().all(|t| t.changed == 0) && again.files_changed.is_empty());

    // The CLI: JSON parses and matches; a bad revision fails with exit code 1.
    drop(repo);
    let out = t.ckpt(&["diff", &ida.to_hex(), &idb.to_hex(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let wj = json["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "w").unwrap();
    assert_eq!(wj["changed"], 4);
    assert_eq!(wj["max_abs_delta"].as_f64(), Some(max));
    let out = t.ckpt(&["diff", "HEAD~2", "HEAD~1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8(out.stdout).unwrap().contains("4 tensors compared"));
    for args in [&["diff", "HEAD", "nosuch"][..], &["diff", "HEAD~9", "HEAD"], &["show", "deadbeef"]] {
        let out = t.ckpt(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains("unknown revision"), "{args:?}: {err}");
    }
}
