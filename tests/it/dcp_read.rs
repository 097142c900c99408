//! Byte ranges of a stored file read straight from the store (`sync::StoredFileReader`, what
//! `ckpt.dcp.Reader` reads each item through): a range that covers a segment whole is decoded
//! chunk-parallel into place, one that covers part of it window by window; either way the bytes
//! are the file's, at every chunk and segment edge, through delta chains too, and a damaged
//! object is an error, never other bytes. Ranges read ahead (`sync::ReadAhead`) are the same.

use crate::support::repo_util::{synthetic_checkpoint, TestRepo};
use ckpt::repo::{Config, DeltaPolicy, Repo};
use ckpt::sync::{ReadAhead, ReadAheadLimits, StoredFileReader};
use ckpt::Dtype;

const CHUNK: u64 = 4096;

/// Tensors of 16 chunks and of 2.5 chunks (a short last chunk), and a small one.
const SHAPES: &[(&str, &[u64])] = &[("w.a", &[64, 256]), ("w.b", &[10, 256]), ("bias", &[64])];

/// A repository (chunks of 4 KiB, deltas against the previous version) with `m.safetensors`
/// committed at epochs 1 and 2: the second's tensors are deltas against the first's.
fn two_epochs() -> (TestRepo, Repo, Vec<Vec<u8>>) {
    let t = TestRepo::with_config(&Config {
        chunk_size: CHUNK as usize,
        delta_policy: DeltaPolicy::Previous,
        ..Config::default()
    });
    let repo = t.open();
    let files: Vec<Vec<u8>> = (1..=2).map(|epoch| synthetic_checkpoint(3, Dtype::F32, SHAPES, epoch)).collect();
    for (i, bytes) in files.iter().enumerate() {
        t.commit_files(&repo, &[("m.safetensors", bytes)], &format!("epoch {}", i + 1));
    }
    (t, repo, files)
}

fn reader(repo: &Repo, rev: &str) -> StoredFileReader {
    let id = repo.resolve(rev).unwrap();
    let entry = repo.version(&id).unwrap().file("m.safetensors").unwrap().clone();
    StoredFileReader::open(repo, &entry.manifest).unwrap()
}

/// Where each segment of `rev`'s file starts, and the file's length.
fn segment_starts(repo: &Repo, rev: &str) -> Vec<u64> {
    let id = repo.resolve(rev).unwrap();
    let entry = repo.version(&id).unwrap().file("m.safetensors").unwrap().clone();
    let manifest = repo.manifest(&entry.manifest).unwrap();
    let mut at = 0;
    let mut starts = Vec::new();
    for s in &manifest.segments {
        starts.push(at);
        at += s.len;
    }
    starts.push(at);
    starts
}

#[test]
fn ranges_at_chunk_and_segment_edges_are_the_file_s_bytes() {
    let (_t, repo, files) = two_epochs();
    for (rev, bytes) in [("HEAD~1", &files[0]), ("HEAD", &files[1])] {
        let mut r = reader(&repo, rev);
        let n = bytes.len() as u64;
        let starts = segment_starts(&repo, rev);
        assert!(starts.len() >= 4, "header and tensors are segments of their own");
        let mut ranges = vec![(0, n), (0, 0), (n, 0)];
        // Every segment whole, and the ranges between neighbouring segments' edges.
        for w in starts.windows(2) {
            ranges.push((w[0], w[1] - w[0]));
        }
        for w in starts.windows(3) {
            ranges.push((w[0], w[2] - w[0]));
        }
        // Inside the tensor of 16 chunks (the biggest segment): at chunk edges, one byte either
        // side of them, and across them.
        let (big, _) = starts.windows(2).map(|w| (w[0], w[1] - w[0])).max_by_key(|(_, len)| *len).unwrap();
        for (from, to) in [(0, CHUNK), (CHUNK, 2 * CHUNK), (CHUNK - 1, CHUNK + 1), (1, 3 * CHUNK - 1)] {
            ranges.push((big + from, to - from));
        }
        ranges.push((big + 15 * CHUNK, CHUNK)); // the last chunk
        ranges.push((big + 15 * CHUNK + 1, CHUNK)); // past the segment into the next
        for (offset, len) in ranges {
            let want = &bytes[offset as usize..(offset + len) as usize];
            assert!(r.read(&repo, offset, len).unwrap() == want, "{rev}: bytes {offset}+{len}");
            let mut out = vec![0xAAu8; len as usize];
            r.read_into(&repo, offset, &mut out).unwrap();
            assert!(out == want, "{rev}: bytes {offset}+{len} into a buffer");
        }
        assert!(r.read(&repo, n - 1, 2).is_err());
        assert!(r.read_into(&repo, n, &mut [0u8; 1]).is_err());
        assert!(r.read(&repo, u64::MAX, 2).is_err());
    }
}

#[test]
fn a_damaged_blob_is_an_error_whole_or_in_part() {
    let (_t, repo, files) = two_epochs();
    let starts = segment_starts(&repo, "HEAD~1");
    let (big, len) = starts.windows(2).map(|w| (w[0], w[1] - w[0])).max_by_key(|(_, len)| *len).unwrap();
    // The biggest tensor of epoch 1: flip a byte in the middle of its object.
    let id = repo.resolve("HEAD~1").unwrap();
    let entry = repo.version(&id).unwrap().file("m.safetensors").unwrap().clone();
    let manifest = repo.manifest(&entry.manifest).unwrap();
    let blob = manifest.segments.iter().filter_map(|s| s.blob.filter(|_| s.len == len)).next().unwrap();
    let path = repo.store().object_path(&blob);
    let mut object = std::fs::read(&path).unwrap();
    let mid = object.len() / 2;
    object[mid] ^= 0x10;
    std::fs::write(&path, &object).unwrap();

    let mut r = reader(&repo, "HEAD~1");
    assert!(r.read(&repo, big, len).is_err(), "the segment whole");
    assert!(r.read(&repo, big + CHUNK, CHUNK).is_err(), "a chunk of it");
    assert!(r.read(&repo, 0, files[0].len() as u64).is_err(), "the file");
    // Epoch 2's tensor is a delta against it: damaged too, through the chain.
    let id2 = repo.resolve("HEAD").unwrap();
    let entry2 = repo.version(&id2).unwrap().file("m.safetensors").unwrap().clone();
    let manifest2 = repo.manifest(&entry2.manifest).unwrap();
    let blob2 = manifest2.segments.iter().filter_map(|s| s.blob.filter(|_| s.len == len)).next().unwrap();
    assert_eq!(repo.store().open_blob(&blob2).unwrap().ids().get(1), Some(&blob), "a delta against it");
    let mut r2 = reader(&repo, "HEAD");
    assert!(r2.read(&repo, big, len).is_err(), "a delta against it");
    // The segments before it are unharmed.
    assert!(r.read(&repo, 0, big).unwrap() == files[0][..big as usize]);
}

#[test]
fn ranges_read_ahead_out_of_order_are_the_file_s_bytes() {
    let (_t, repo, files) = two_epochs();
    let starts = segment_starts(&repo, "HEAD");
    let items: Vec<(u64, u64)> = starts.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
    let repo = std::sync::Arc::new(repo);
    let mut r = reader(&repo, "HEAD");
    let ahead = {
        let (repo, items) = (repo.clone(), items.clone());
        let limits = ReadAheadLimits { max_items: 2, max_bytes: 1 << 20 };
        ReadAhead::start(items.iter().map(|(_, len)| *len).collect(), limits, move |i| {
            let (offset, len) = items[i];
            r.read(&repo, offset, len)
        })
        .unwrap()
    };
    // Asked for last to first: whatever was not read ahead is the caller's to read.
    let mut direct = reader(&repo, "HEAD");
    for (i, (offset, len)) in items.iter().enumerate().rev() {
        let got: Vec<u8> = match ahead.take(i) {
            Some(read) => read.unwrap(),
            None => direct.read(&repo, *offset, *len).unwrap(),
        };
        assert!(got == files[1][*offset as usize..(offset + len) as usize], "item {i}");
    }
    assert!(ahead.take(0).is_none(), "each item once");
}

#[test]
fn the_tensor_in_a_range_is_found_only_when_it_is_one_tensor() {
    let (_t, repo, files) = two_epochs();
    let r = reader(&repo, "HEAD");
    let id = repo.resolve("HEAD").unwrap();
    let entry = repo.version(&id).unwrap().file("m.safetensors").unwrap().clone();
    let manifest = repo.manifest(&entry.manifest).unwrap();
    let starts = segment_starts(&repo, "HEAD");
    let mut tensors = Vec::new();
    for (i, s) in manifest.segments.iter().enumerate() {
        if let Some(t) = &s.tensor {
            tensors.push((t.name.clone(), starts[i], s.len, t.shape.clone()));
        }
    }
    assert_eq!(tensors.len(), SHAPES.len());
    for (name, start, len, shape) in &tensors {
        // The tensor alone, or with framing around it (a DCP item's archive): found.
        assert_eq!(r.tensor_in(*start, *len), Some((*start, Dtype::F32, shape.clone())), "{name}");
        // Cut short: not found.
        assert_eq!(r.tensor_in(*start, *len - 1), None, "{name}");
    }
    // The whole file holds several; the header alone none; two tensors back to back are not
    // one (other names).
    assert_eq!(r.tensor_in(0, files[1].len() as u64), None);
    assert_eq!(r.tensor_in(0, starts[1]), None);
    let (a, b) = (&tensors[0], &tensors[1]);
    assert_eq!(a.1 + a.2, b.1, "w.a and w.b lie back to back");
    assert_eq!(r.tensor_in(a.1, a.2 + b.2), None);
    // Ranges past the end: none.
    assert_eq!(r.tensor_in(u64::MAX, 2), None);
}
