//! Fuzzes the `torch.distributed.checkpoint` readers: a `.metadata` pickle
//! (`ckpt::torch_zip::dcp::parse_metadata`) and a `.distcp` file, cut into items with that
//! metadata (`file_items`, the input itself as the file) or without (`walk_archives`). None
//! may panic, and every cut accepted must cover its file in order: items disjoint and inside
//! it, storages inside their items with byte lengths matching dtype and shape, names unique.
#![no_main]

use ckpt::torch_zip::dcp::{self, FileItems};
use std::collections::HashSet;

fn check(data: &[u8], found: &FileItems) {
    assert_eq!(found.len, data.len() as u64);
    let mut at = 0;
    let mut names = HashSet::new();
    for item in &found.items {
        assert!(item.range.start >= at && item.range.end >= item.range.start && item.range.end <= found.len);
        assert!(item.opaque.is_none() || item.storages.is_empty());
        for s in &item.storages {
            assert!(item.range.start <= s.range.start && s.range.end <= item.range.end, "{}", s.name);
            assert!(names.insert(s.name.clone()), "duplicate name {:?}", s.name);
        }
        at = item.range.end;
    }
    let mut at = 0;
    for (range, storage) in found.segments() {
        assert_eq!(range.start, at);
        if let Some(s) = storage {
            let elements = s.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            assert_eq!(elements.and_then(|e| e.checked_mul(s.dtype.size() as u64)), Some(range.end - range.start));
        } else {
            assert!(range.end > range.start);
        }
        at = range.end;
    }
    assert_eq!(at, found.len);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(found) = dcp::walk_archives(data) {
        check(data, &found);
    }
    let Ok(metadata) = dcp::parse_metadata(data) else {
        return;
    };
    let mut names = HashSet::new();
    for item in &metadata.items {
        assert!(item.range.start <= item.range.end);
        assert!(names.insert(item.name()), "duplicate item {}", item.name());
        if let dcp::ItemKind::Tensor { size, offsets, sizes, .. } = &item.kind {
            assert!(offsets.len() == size.len() && sizes.len() == size.len());
            assert!(offsets.iter().zip(sizes).zip(size).all(|((o, s), t)| o + s <= *t));
        }
    }
    for file in metadata.files() {
        if let Ok(found) = dcp::file_items(data, &metadata, file) {
            check(data, &found);
        }
    }
});
