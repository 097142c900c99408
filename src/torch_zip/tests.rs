//! Tests on archives written by real torch (tests/fixtures/torch/, see make_fixtures.py there).

use super::*;

const MODEL: &[u8] = include_bytes!("../../tests/fixtures/torch/model_epoch1.pt");
const OPTIMIZER: &[u8] = include_bytes!("../../tests/fixtures/torch/optimizer_epoch1.pt");
const DTYPES: &[u8] = include_bytes!("../../tests/fixtures/torch/dtypes.pt");
const LIGHTNING: &[u8] = include_bytes!("../../tests/fixtures/torch/lightning.ckpt");
const SHARED: &[u8] = include_bytes!("../../tests/fixtures/torch/shared.pt");
const MALICIOUS: &[u8] = include_bytes!("../../tests/fixtures/torch/malicious.pt");
const LEGACY: &[u8] = include_bytes!("../../tests/fixtures/torch/legacy.pt");

/// The storages as (name, dtype, shape), sorted by name (the file order is torch's choice).
fn table(map: &StorageMap) -> Vec<(String, Dtype, Vec<u64>)> {
    let mut t: Vec<_> = map.storages.iter().map(|s| (s.name.clone(), s.dtype, s.shape.clone())).collect();
    t.sort();
    t
}

fn sorted(mut rows: Vec<(String, Dtype, Vec<u64>)>) -> Vec<(String, Dtype, Vec<u64>)> {
    rows.sort();
    rows
}

fn row(name: &str, dtype: Dtype, shape: &[u64]) -> (String, Dtype, Vec<u64>) {
    (name.to_string(), dtype, shape.to_vec())
}

/// The segments cover the file in order, and each storage's bytes are its zip entry's data.
fn check_cover(file: &[u8], map: &StorageMap) {
    let mut at = 0;
    for (range, storage) in map.segments() {
        assert_eq!(range.start, at);
        if let Some(s) = storage {
            let elements: u64 = s.shape.iter().product();
            assert_eq!(range.end - range.start, elements * s.dtype.size() as u64, "{}", s.name);
        } else {
            assert!(range.end > range.start);
        }
        at = range.end;
    }
    assert_eq!(at, file.len() as u64);
}

#[test]
fn model_state_dict_storages_are_named_by_their_keys() {
    let map = parse(MODEL).unwrap();
    check_cover(MODEL, &map);
    assert_eq!(
        table(&map),
        sorted(vec![
            row("embed.weight", Dtype::F32, &[16, 8]),
            row("fc1.weight", Dtype::F32, &[32, 8]),
            row("fc1.bias", Dtype::F32, &[32]),
            row("fc2.weight", Dtype::F32, &[4, 32]),
            row("fc2.bias", Dtype::F32, &[4]),
            row("steps", Dtype::I64, &[]),
        ])
    );
}

#[test]
fn adamw_state_is_named_by_parameter_index() {
    let map = parse(OPTIMIZER).unwrap();
    check_cover(OPTIMIZER, &map);
    let mut names: Vec<String> = map.storages.iter().map(|s| s.name.clone()).collect();
    names.sort();
    let mut expected = Vec::new();
    for p in 0..5 {
        for k in ["step", "exp_avg", "exp_avg_sq"] {
            expected.push(format!("state.{p}.{k}"));
        }
    }
    expected.sort();
    assert_eq!(names, expected);
    let exp_avg = map.storages.iter().find(|s| s.name == "state.0.exp_avg").unwrap();
    assert_eq!(exp_avg.shape, vec![16, 8]);
    assert!(map.storages.iter().all(|s| s.dtype == Dtype::F32));
}

#[test]
fn every_storage_type_maps_to_its_dtype() {
    let map = parse(DTYPES).unwrap();
    check_cover(DTYPES, &map);
    assert_eq!(
        table(&map),
        sorted(vec![
            row("bf16", Dtype::Bf16, &[5, 3]),
            row("fp16", Dtype::F16, &[7]),
            row("fp32", Dtype::F32, &[2, 2, 2]),
            row("fp64", Dtype::F64, &[3]),
            row("int64", Dtype::I64, &[2, 3]),
            row("int32", Dtype::I32, &[4]),
            row("int16", Dtype::I16, &[4]),
            row("int8", Dtype::I8, &[4]),
            row("uint8", Dtype::U8, &[5]),
            row("bool", Dtype::Bool, &[3]),
        ])
    );
}

#[test]
fn lightning_checkpoint_with_plain_values_is_read() {
    let map = parse(LIGHTNING).unwrap();
    check_cover(LIGHTNING, &map);
    let names: Vec<&str> = map.storages.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"state_dict.fc1.weight"), "{names:?}");
    assert!(names.contains(&"optimizer_states.0.state.4.exp_avg_sq"), "{names:?}");
    assert_eq!(names.len(), 6 + 15);
}

#[test]
fn shared_storage_is_one_storage_named_by_its_first_tensor() {
    let map = parse(SHARED).unwrap();
    check_cover(SHARED, &map);
    assert_eq!(table(&map), vec![row("whole", Dtype::F32, &[24])]);
}

#[test]
fn code_running_pickles_and_legacy_files_are_refused() {
    let err = parse(MALICIOUS).unwrap_err().to_string();
    assert!(err.contains("unknown global posix.system"), "{err}");
    assert!(matches!(parse(LEGACY), Err(Error::Zip(_))));
}

#[test]
fn truncations_and_byte_flips_never_panic() {
    for file in [MODEL, OPTIMIZER, LIGHTNING] {
        for len in (0..file.len()).step_by(7) {
            let _ = parse(&file[..len]);
        }
        // Any truncation loses the end of central directory record.
        assert!(parse(&file[..file.len() - 1]).is_err());
        let mut copy = file.to_vec();
        for i in 0..copy.len() {
            for bit in [0x01, 0x80] {
                copy[i] ^= bit;
                if let Ok(map) = parse(&copy) {
                    check_cover(&copy, &map);
                }
                copy[i] ^= bit;
            }
        }
    }
}

#[test]
fn zip64_archives_are_read() {
    // data.pkl of the model fixture, repacked by hand with ZIP64 records.
    let entries = zip::entries(MODEL).unwrap();
    let files: Vec<(&str, &[u8])> =
        entries.iter().map(|e| (e.name.as_str(), &MODEL[e.data.start as usize..e.data.end as usize])).collect();
    let repacked = zip::tests::archive(&files, true);
    let map = parse(&repacked).unwrap();
    check_cover(&repacked, &map);
    assert_eq!(table(&map), table(&parse(MODEL).unwrap()));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

    /// Random multi-byte damage anywhere (mostly in data.pkl and the directory, where the reader
    /// looks) never panics, and whatever is accepted still covers the file.
    #[test]
    fn random_mutations_never_panic(
        edits in proptest::collection::vec((0usize..1 << 20, proptest::prelude::any::<u8>()), 1..16),
        in_pickle in proptest::prelude::any::<bool>(),
    ) {
        for fixture in [OPTIMIZER, LIGHTNING] {
            let mut file = fixture.to_vec();
            for &(at, byte) in &edits {
                // Half the runs aim at data.pkl (the first entry, right after its local header).
                let at = if in_pickle { 60 + at % 1000 } else { at % file.len() };
                if let Some(b) = file.get_mut(at) {
                    *b = byte;
                }
            }
            if let Ok(map) = parse(&file) {
                check_cover(&file, &map);
            }
        }
    }
}
