//! `ckpt compress`, `decompress` and `stats` as a user runs them.

use crate::support::util::{all_dtypes_file, ckpt, list, noise, safetensors_file};
use ckpt::Dtype;
use std::path::Path;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn round_trip(dir: &Path, name: &str, data: &[u8], jobs: &str) -> Vec<u8> {
    std::fs::write(dir.join(name), data).unwrap();
    let o = ckpt(dir, &["-j", jobs, "compress", name, "-o", "c.ckz"]);
    assert!(o.status.success(), "compress: {}", stderr(&o));
    let o = ckpt(dir, &["-j", jobs, "decompress", "c.ckz", "-o", "back"]);
    assert!(o.status.success(), "decompress: {}", stderr(&o));
    assert_eq!(std::fs::read(dir.join("back")).unwrap(), data, "{name} round trip");
    std::fs::read(dir.join("c.ckz")).unwrap()
}

#[test]
fn every_dtype_round_trips_and_compresses_floats() {
    let dir = tempfile::tempdir().unwrap();
    let file = all_dtypes_file(1);
    let one = round_trip(dir.path(), "m.safetensors", &file, "1");
    let two = round_trip(dir.path(), "m.safetensors", &file, "2");
    assert_eq!(one, two, "output does not depend on the thread count");

    let bf16 = safetensors_file(2, &[("w", Dtype::Bf16, &[512, 512])]);
    let packed = round_trip(dir.path(), "b.safetensors", &bf16, "2");
    let pct = packed.len() as f64 / bf16.len() as f64;
    assert!(pct < 0.75, "bf16 weights compress to {pct:.3} of their size");
}

#[test]
fn other_files_round_trip_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in [
        ("empty.bin", Vec::new()),
        ("noise.bin", noise(3, 1_000_003)),
        ("zeros.bin", vec![0u8; 3_000_000]),
        ("text.txt", b"hello checkpoint ".repeat(10_000)),
    ] {
        let packed = round_trip(dir.path(), name, &data, "2");
        if name == "zeros.bin" {
            assert!(packed.len() < 2000, "zeros: {}", packed.len());
        }
    }
}

#[test]
fn stats_accounts_for_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let file = all_dtypes_file(4);
    round_trip(dir.path(), "m.safetensors", &file, "2");
    let o = ckpt(dir.path(), &["stats", "c.ckz", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let groups = report["groups"].as_array().unwrap();
    let raw: u64 = groups.iter().map(|g| g["raw_bytes"].as_u64().unwrap()).sum();
    let stored: u64 = groups.iter().map(|g| g["stored_bytes"].as_u64().unwrap()).sum();
    assert_eq!(raw, file.len() as u64);
    assert_eq!(
        stored + report["overhead_bytes"].as_u64().unwrap(),
        std::fs::metadata(dir.path().join("c.ckz")).unwrap().len()
    );
    let bf16_exponent = groups.iter().find(|g| g["dtype"] == "BF16" && g["group"] == 1).expect("bf16 exponent group");
    // Method counts are indexed by tag: 2 Huffman, 6 paired (with the group below), 7 remainder.
    let count = |g: &serde_json::Value, tag: usize| g["methods"][tag].as_u64().unwrap();
    assert!(count(bf16_exponent, 2) + count(bf16_exponent, 6) > 0, "exponent stream is Huffman coded");
    let bf16_mantissa = groups.iter().find(|g| g["dtype"] == "BF16" && g["group"] == 0).expect("bf16 mantissa group");
    assert_eq!(count(bf16_exponent, 6), count(bf16_mantissa, 7), "every paired group has its remainder group");
    // Every group carries the three figures, and an adaptive coder never does better than the
    // static order-1 entropy of what it coded.
    for g in groups {
        let figure = |key: &str| g[key].as_f64().unwrap_or_else(|| panic!("{key} in {g}"));
        assert!(figure("order1_adaptive_bytes") + 1e-6 >= figure("order1_entropy_bytes"), "{g}");
    }
    // The table form of the same file, and of the uncompressed input.
    let o = ckpt(dir.path(), &["stats", "m.safetensors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("BF16"));
}

/// Each malformed file: exit code 1, the message names the file and the problem, no output.
#[test]
fn malformed_safetensors_are_rejected_without_output() {
    let good = safetensors_file(5, &[("a", Dtype::F32, &[4, 4]), ("b", Dtype::Bf16, &[8])]);
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let json = String::from_utf8(good[8..8 + header_len].to_vec()).unwrap();
    let with_json = |j: &str| {
        let mut f = (j.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(j.as_bytes());
        f.extend_from_slice(&good[8 + header_len..]);
        f
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short", good[..5].to_vec(), "too short"),
        ("truncated", good[..good.len() - 3].to_vec(), "past the end"),
        (
            "beyond",
            {
                let mut f = good.clone();
                f[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
                f
            },
            "header",
        ),
        ("badjson", with_json("{\"a\": [1,2"), "JSON"),
        (
            "utf8",
            {
                let mut f = good.clone();
                f[9] = 0xFF;
                f
            },
            "UTF-8",
        ),
        ("dtype", with_json(&json.replace("\"F32\"", "\"Q32\"")), "Q32"),
        ("overlap", with_json(&json.replace("[64,80]", "[60,76]")), "overlap"),
        ("shape", with_json(&json.replace("[4,4]", "[4,5]")), "shape"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, data, needle) in cases {
        let file = format!("{name}.safetensors");
        std::fs::write(dir.path().join(&file), &data).unwrap();
        let before = list(dir.path());
        let o = ckpt(dir.path(), &["compress", &file, "-o", "out.ckz"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(&file), "{name}: message names the file: {err}");
        assert!(err.to_lowercase().contains(&needle.to_lowercase()), "{name}: message says {needle:?}: {err}");
        assert_eq!(list(dir.path()), before, "{name}: nothing written");
    }
}

#[test]
fn damaged_containers_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let file = safetensors_file(6, &[("w", Dtype::Bf16, &[300, 700])]);
    let packed = round_trip(dir.path(), "m.safetensors", &file, "2");
    std::fs::remove_file(dir.path().join("back")).unwrap();
    for (name, data) in [
        ("truncated.ckz", packed[..packed.len() / 2].to_vec()),
        ("flipped.ckz", {
            let mut p = packed.clone();
            p[packed.len() / 3] ^= 0x40;
            p
        }),
        ("garbage.ckz", noise(7, 5000)),
    ] {
        std::fs::write(dir.path().join(name), &data).unwrap();
        let before = list(dir.path());
        let o = ckpt(dir.path(), &["decompress", name, "-o", "out"]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stderr(&o));
        assert!(stderr(&o).contains(name), "{name}: {}", stderr(&o));
        assert_eq!(list(dir.path()), before, "{name}: no output left behind");
    }
}

#[test]
fn a_chunk_size_that_is_not_a_power_of_two_is_refused_without_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("n.bin"), noise(8, 100_000)).unwrap();
    let before = list(dir.path());
    let o = ckpt(dir.path(), &["compress", "n.bin", "-o", "n.ckz", "--chunk-kib", "12"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("n.bin") && err.contains("chunk size 12288 is not a power of two"), "{err}");
    assert_eq!(list(dir.path()), before, "no output left behind");
}

/// The output is written by a thread of its own (`WriteBehind`): a write that fails there
/// (a full device) still fails the command, naming the output and the OS error, for
/// decompression and compression alike, with output larger than one of its buffers.
#[test]
fn a_failing_output_write_is_reported() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = noise(9, 3 << 20);
    round_trip(dir.path(), "n.bin", &data, "1");
    for args in [["decompress", "c.ckz", "-o", "/dev/full"], ["compress", "n.bin", "-o", "/dev/full"]] {
        let o = ckpt(dir.path(), &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("/dev/full") && err.contains("No space left on device"), "{args:?}: {err}");
    }
}
