//! Fuzzes the strict safetensors parser: it must never panic, and every header it accepts must
//! satisfy the documented invariants.
#![no_main]

use std::collections::HashSet;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(header) = ckpt::safetensors::parse(data) else {
        return;
    };
    let file_len = data.len() as u64;
    assert_eq!(header.file_len, file_len);
    assert_eq!(header.data_start, header.raw.len() as u64);
    assert!(header.data_start <= file_len);
    assert_eq!(data.get(..header.raw.len()), Some(&header.raw[..]));

    let mut names = HashSet::new();
    let mut previous: Option<&ckpt::safetensors::TensorInfo> = None;
    let mut max_end = header.data_start;
    for t in &header.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate name {:?}", t.name);
        assert!(header.data_start <= t.begin && t.begin <= t.end && t.end <= file_len);
        assert_eq!(t.len(), t.end - t.begin);
        assert_eq!(Some(t.len()), t.num_elements().checked_mul(t.dtype.size() as u64));
        if let Some(p) = previous {
            assert!((p.begin, &p.name) < (t.begin, &t.name), "tensors not sorted");
        }
        previous = Some(t);
        if !t.is_empty() {
            assert!(t.begin >= max_end, "tensor {:?} overlaps an earlier one", t.name);
            max_end = t.end;
        }
    }
});
