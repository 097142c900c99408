//! The format pin: fixed inputs committed twice (so deltas and the reverse-delta rewrite
//! happen) must give the object ids, manifest ids, on-disk object bytes and CLI output recorded
//! from the code of 2026-11-26 (main at 259a362, before the issue-25 refactor). A change here is
//! a change of format or CLI: it needs a format note in docs/format.md, not a new pin.
//!
//! The inputs are built here, not with the shared helpers, so that a change to a helper cannot
//! move the pins. Everything pinned is deterministic: commit times and messages are fixed
//! (version ids hash both), and the store's bytes depend only on the inputs and the codec.

use ckpt::repo::{CommitOptions, CompactOptions, Repo};
use ckpt::Dtype;
use std::path::Path;
use std::process::Command;

/// xorshift64: the inputs' only source of variety.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `elements` values of `dtype`: floats near zero (std about 0.02) that drift by a small step
/// per `epoch` on every fourth element, integers from the raw bits.
fn values(seed: u64, dtype: Dtype, elements: usize, epoch: u32) -> Vec<u8> {
    let mut bits = Bits(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(elements * dtype.size());
    for i in 0..elements {
        let r = bits.next();
        let base = ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.07;
        let x = if i % 4 == 0 { base + epoch as f64 * 1e-4 } else { base };
        match dtype {
            Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Dtype::F64 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&(((x as f32).to_bits() >> 16) as u16).to_le_bytes()),
            d => out.extend_from_slice(&r.wrapping_add(epoch as u64 * (i % 4 == 0) as u64).to_le_bytes()[..d.size()]),
        }
    }
    out
}

/// A safetensors model at `epoch`: large tensors of four dtypes (own blobs), small ones that
/// are bundled (two bf16, two f32), a scalar, and an unchanged int tensor (deduplicated).
fn model(epoch: u32) -> Vec<u8> {
    let tensors: &[(&str, Dtype, &[u64])] = &[
        ("embed.weight", Dtype::Bf16, &[128, 96]),
        ("layers.0.w", Dtype::F32, &[96, 64]),
        ("layers.0.b", Dtype::F32, &[64]),
        ("layers.1.w", Dtype::F64, &[32, 40]),
        ("layers.1.b", Dtype::F32, &[40]),
        ("norm.a", Dtype::Bf16, &[96]),
        ("norm.b", Dtype::Bf16, &[96]),
        ("step", Dtype::I64, &[]),
        ("vocab.ids", Dtype::I32, &[1500]),
        ("mask", Dtype::U8, &[5000]),
    ];
    let spec: Vec<(String, Dtype, Vec<u64>)> =
        tensors.iter().map(|(n, d, s)| (n.to_string(), *d, s.to_vec())).collect();
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let mut file = ckpt::safetensors::write_header(&spec, Some(&meta)).expect("valid header");
    for (i, (name, dtype, shape)) in tensors.iter().enumerate() {
        let elements: u64 = shape.iter().product();
        // The int tensors stay the same across epochs; "step" counts them.
        let e = if matches!(*name, "vocab.ids" | "mask") { 0 } else { epoch };
        file.extend_from_slice(&values(1000 + i as u64, *dtype, elements as usize, e));
    }
    file
}

/// An opaque file (no tensor format): text-like bytes with one line changed per epoch.
fn notes(epoch: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for line in 0..400 {
        let stamp = if line == 200 { epoch } else { 0 };
        out.extend_from_slice(format!("line {line:04} of the run notes, stamp {stamp}\n").as_bytes());
    }
    out
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch").join(name)).expect("fixture")
}

/// Version `epoch`'s files: (path, bytes).
fn files(epoch: u32) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("model.safetensors", model(epoch)),
        ("model.pt", fixture(&format!("model_epoch{epoch}.pt"))),
        ("notes.txt", notes(epoch)),
    ]
}

/// Every object file under `.ckpt/objects` as "relative path blake3-of-bytes", sorted.
fn object_listing(root: &Path) -> Vec<String> {
    let objects = root.join(".ckpt/objects");
    let mut out = Vec::new();
    for fan in std::fs::read_dir(&objects).expect("objects dir") {
        let fan = fan.expect("entry").path();
        for f in std::fs::read_dir(&fan).expect("fan-out dir") {
            let f = f.expect("entry").path();
            let rel = f.strip_prefix(&objects).expect("under objects").to_string_lossy().replace('\\', "/");
            out.push(format!("{rel} {}", blake3::hash(&std::fs::read(&f).expect("object"))));
        }
    }
    out.sort();
    out
}

fn ckpt_stdout(root: &Path, args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_ckpt")).args(args).current_dir(root).output().expect("run ckpt");
    assert!(o.status.success(), "ckpt {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("utf-8 output")
}

/// Recorded from main at 259a362 (2026-11-26), before the issue-25 refactor; re-recorded once
/// for container format 6 (issue 28's paired groups): a version records its stored bytes, and
/// the bf16 tensors of these files now store fewer (the ids were 6b5e6837… and
/// df000b11…). Manifest ids and file hashes below did not change.
const VERSION_1: &str = "5ba1bb96f4d8a4d7b356164d5b4e9df9e1e9044fdeb3abfdf9f27095f7adb3a9";
const VERSION_2: &str = "9c4125629bde0d84669f13b7c286a8d7cb6d3e8005b15ff88eb293c5ab9ffbf2";
/// (path, manifest id, file hash) per file of version 1, then of version 2.
const MANIFESTS: &[(&str, &str, &str)] = &[
    (
        "model.pt",
        "6c453206ecc4341d0ca5e2c9064cfca18aa908a973f0d9062f745d08be86a3dc",
        "36e66b69f5c516350f596302f0b5c08ee4fd90e9499c57ae584e6d4625ba2bcb",
    ),
    (
        "model.safetensors",
        "3bdbfcea16d476c22e3856cbff7b24dc371529282bb694c528e1c4e7f5dd3af2",
        "9b6498f49ca256647c63ca3430d76895dc6ee7ddb62dc80d1e6430d4877772aa",
    ),
    (
        "notes.txt",
        "d72bfcf278feec5dec7cf7b699f44f99e1676475ba43c3177ef99a81ccf23c85",
        "a1c9e6ce7684e8c7b00aadc2652a1cb4a0a2c992da632bcf98aaffb16a4849dc",
    ),
    (
        "model.pt",
        "0517c7f73ad135ec793b3081839e5b8ef9b4d99912a2772b79d3f8d5c2541a96",
        "138b955452ef6b8802b2b6fb81dfc9daee2e5379d1f31897a4322ebe6dc68e26",
    ),
    (
        "model.safetensors",
        "ac49161b0d19600dc22699423610591dad163f87f058be4ccca01191f27e1217",
        "b58bbcae96815eb7f3c37f230801283a4237893c9070a77acf6e1b8ae7957ca8",
    ),
    (
        "notes.txt",
        "2b12109fc7adf1aca43424d3c5621ed7e695164d98955988c44d9e40b6932164",
        "4ea611fbd49213588d374dd2a763cb7072784927b6a9ced81f6d4c390487ebbb",
    ),
];
/// blake3 of [`object_listing`] after both commits and a compaction, one line per object.
/// Recorded at 259a362 as fcbade84…; re-recorded once for issue 28's container format 4 (the
/// version byte of every container, and rANS for mostly-zero groups), which changes object
/// bytes but no object id, manifest or file hash above; and once (26e8beea… before) for
/// container format 5 (rANS context sources), which at the default level changes only the
/// version byte of every container and so its footer checksum (`ckpt compress` of corpus
/// files before and after differs in exactly those 9 bytes); and once (fc849ed7… before) for
/// format 6, whose paired groups change the bytes of bf16 objects; and once (d050fbbe… before)
/// for format 7 (grids and masks), which finds neither in these inputs and so changes only the
/// version byte of every container.
const OBJECTS: &str = "dd588a8771b22a478abe007d8abfe110bca50ea6aa68134a7ba014727bde60ca";
const OBJECT_COUNT: usize = 43;
/// blake3 of `ckpt show --json` of version 1 and of version 2, and of `ckpt log`. The two `show`
/// figures were re-recorded once for issue 28: its new method adds a `"rans": 0` count to every
/// segment's `methods` (recorded at 259a362 as e460de64… and 773853c0…); and once more for format
/// 6 (a `"paired"` count, and the new version ids and stored sizes; d643c740… and 47c19f26…
/// before); and for format 7 (a `"grid"` count: 76d24446… and b4f9da0a… before). `ckpt log`
/// prints the version ids (05bc2e8d… before).
const SHOW_JSON_1: &str = "be85eb033f7ad020397637e066ec50ef44c7827dd8066167bc888dc0faf520b2";
const SHOW_JSON_2: &str = "1a7f808f370d1cb919232effe9dd9b320bdc97c0a4f875e0649ea54e7cdba311";
const LOG: &str = "18464acd97b09a6863b2c8a38207ce0669f9fc63ccbc0717d03ae65ff02417f7";

#[test]
fn fixed_inputs_give_the_recorded_objects_and_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let repo = Repo::init(root).expect("init");
    let mut versions = Vec::new();
    let mut manifests = Vec::new();
    for epoch in 1..=2u32 {
        let files = files(epoch);
        for (name, bytes) in &files {
            std::fs::write(root.join(name), bytes).expect("write input");
        }
        let paths: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        let options = CommitOptions { time: Some(1_764_115_200 + epoch as i64 * 3600), ..CommitOptions::default() };
        let id = repo.commit(&paths, &format!("epoch {epoch}"), &options).expect("commit");
        for entry in repo.version(&id).expect("version").files {
            manifests.push((entry.path.clone(), entry.manifest.to_hex(), entry.hash.to_hex()));
        }
        versions.push(id);
    }
    // Default settings rewrite the parent's blobs as reverse deltas before a library commit
    // returns; a compaction afterwards must find nothing left to change.
    repo.compact(&CompactOptions::default()).expect("compact");
    let report = repo.verify().expect("verify");
    assert!(report.is_ok(), "verify: {report:?}");
    // Both versions read back bit-exact (version 1 through the rewritten deltas).
    for (epoch, id) in (1..=2u32).zip(&versions) {
        let out = tempfile::tempdir().expect("temp dir");
        repo.checkout(&id.to_hex(), None, Some(out.path()), None).expect("checkout");
        for (name, bytes) in files(epoch) {
            assert!(std::fs::read(out.path().join(name)).expect("checked out") == bytes, "{name} of epoch {epoch}");
        }
    }
    drop(repo);

    let listing = object_listing(root);
    let v1 = versions[0].to_hex();
    let v2 = versions[1].to_hex();
    let show1 = ckpt_stdout(root, &["show", "--json", &v1]);
    let show2 = ckpt_stdout(root, &["show", "--json", &v2]);
    let log = ckpt_stdout(root, &["log"]);
    let got_manifests: Vec<(&str, &str, &str)> =
        manifests.iter().map(|(p, m, h)| (p.as_str(), m.as_str(), h.as_str())).collect();
    let hash = |s: &str| blake3::hash(s.as_bytes()).to_hex().to_string();
    let listing_text = listing.join("\n");

    assert_eq!(v1, VERSION_1, "version 1 id");
    assert_eq!(v2, VERSION_2, "version 2 id");
    assert_eq!(got_manifests, MANIFESTS, "manifest ids and file hashes");
    assert_eq!((hash(&listing_text), listing.len()), (OBJECTS.to_string(), OBJECT_COUNT), "objects:\n{listing_text}");
    assert_eq!(hash(&show1), SHOW_JSON_1, "ckpt show --json {v1}:\n{show1}");
    assert_eq!(hash(&show2), SHOW_JSON_2, "ckpt show --json {v2}:\n{show2}");
    assert_eq!(hash(&log), LOG, "ckpt log:\n{log}");
}
