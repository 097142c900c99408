//! Fuzzes the `torch.save` archive reader: it must never panic, and every storage map it accepts must
//! cover the input in order with storages whose byte lengths match their dtype and shape.
#![no_main]

use std::collections::HashSet;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // Also the pickle reader on its own, with any bytes.
    let _ = ckpt::torch_zip::pickle::read(data);
    let Ok(map) = ckpt::torch_zip::parse(data) else {
        return;
    };
    assert_eq!(map.len, data.len() as u64);
    let mut at = 0;
    let mut names = HashSet::new();
    for (range, storage) in map.segments() {
        assert_eq!(range.start, at);
        assert!(range.end <= map.len);
        if let Some(s) = storage {
            assert!(names.insert(s.name.clone()), "duplicate name {:?}", s.name);
            let elements = s.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            assert_eq!(elements.and_then(|e| e.checked_mul(s.dtype.size() as u64)), Some(range.end - range.start));
        } else {
            assert!(range.end > range.start);
        }
        at = range.end;
    }
    assert_eq!(at, map.len);
});
