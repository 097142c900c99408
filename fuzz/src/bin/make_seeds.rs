//! Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/) from real ckpt output:
//! synthetic safetensors checkpoints (two epochs, so that deltas occur), what `ckpt compress`
//! makes of them, the objects a real commit stores (blobs, manifests, versions), the pointers
//! and filter-protocol sessions of a real `git add`/`git checkout` through `ckpt git
//! filter-process`, the torch.save fixtures and their pickles, the torch.distributed.checkpoint
//! fixtures' `.metadata` and `.distcp` files, and Huffman, sparse and rANS streams.
//! Deterministic except for the git transcripts' temp paths (none are recorded).
//!
//! Usage: make_seeds OUT_DIR CKPT_BINARY (fuzz/make_seeds.sh builds both and passes them).

use ckpt::codec::container::{ContainerWriter, FileKind};
use ckpt::codec::{byte_group, huffman, paired, rans, select::GroupStats, sparse, Grouping, Options};
use ckpt::file_codec::{self, Format};
use ckpt::repo::{CommitOptions, Repo};
use ckpt::store::{ObjectHeader, ObjectKind, Store, HEADER_LEN};
use ckpt::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

type Error = Box<dyn std::error::Error>;

/// Largest seed written (the corpus is checked in; libFuzzer also caps what it mutates).
const MAX_SEED: usize = 48 << 10;

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Roughly normal, scaled: weights look like trained weights (exponents concentrated).
    fn weight(&mut self, scale: f32) -> f32 {
        let s: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (s - 2.0) * scale
    }
}

/// One tensor of a synthetic checkpoint.
struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<u64>,
    bytes: Vec<u8>,
}

fn tensor(name: &str, dtype: &'static str, shape: &[u64], values: impl Iterator<Item = f32>) -> Tensor {
    let bytes = match dtype {
        "F32" => values.flat_map(f32::to_le_bytes).collect(),
        // Truncated f32: bf16.
        "BF16" => values.flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect(),
        "F16" => values.flat_map(|v| f16_bits(v).to_le_bytes()).collect(),
        "I64" => values.flat_map(|v| (v as i64).to_le_bytes()).collect(),
        "U8" => values.map(|v| v as u8).collect(),
        other => unreachable!("dtype {other}"),
    };
    Tensor { name: name.into(), dtype, shape: shape.to_vec(), bytes }
}

/// IEEE half of `v` (normal range, truncated), enough for test data.
fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    sign | ((exp.min(30) as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// A safetensors file of `tensors` in order, with `metadata`, header padded to 8 bytes.
fn safetensors(tensors: &[Tensor], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, serde_json::Value> =
            metadata.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect();
        header.insert("__metadata__".into(), m.into());
    }
    let mut at = 0usize;
    for t in tensors {
        let info = serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, at + t.bytes.len()]});
        header.insert(t.name.clone(), info);
        at += t.bytes.len();
    }
    let mut json = serde_json::to_vec(&header).expect("plain data");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut file = (json.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&json);
    for t in tensors {
        file.extend_from_slice(&t.bytes);
    }
    file
}

/// The synthetic model at `epoch` (1 or 2; epoch 2 changes a few elements, as a training step
/// does, so that a commit of it stores XOR deltas).
fn model(epoch: u32) -> Vec<Tensor> {
    let mut rng = Rng(42);
    let mut values = |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| rng.weight(scale)).collect() };
    let (mut embed, mut fc, bias) = (values(48 * 32, 0.05), values(16 * 32, 0.2), values(16, 0.01));
    let norms: Vec<Vec<f32>> = (0..6).map(|_| values(8, 1.0)).collect();
    if epoch > 1 {
        let mut rng = Rng(u64::from(epoch));
        for w in [&mut embed, &mut fc] {
            let n = w.len();
            for _ in 0..n / 30 {
                let i = (rng.next() % n as u64) as usize;
                w[i] *= 1.0 + rng.weight(0.01);
            }
        }
    }
    let mut tensors = vec![
        tensor("embed.weight", "BF16", &[48, 32], embed.into_iter()),
        tensor("fc.bias", "F16", &[16], bias.into_iter()),
        tensor("fc.weight", "F32", &[16, 32], fc.into_iter()),
    ];
    // A run of small tensors of one dtype: a bundle in the manifest, one segment in a container.
    for (i, n) in norms.into_iter().enumerate() {
        tensors.push(tensor(&format!("norm.{i}.weight"), "F32", &[8], n.into_iter()));
    }
    tensors.push(tensor("step", "I64", &[], std::iter::once(epoch as f32 * 1000.0)));
    tensors
}

/// Writes seeds into one target's corpus directory, skipping any over [`MAX_SEED`].
struct Corpus {
    root: PathBuf,
    written: BTreeMap<String, usize>,
}

impl Corpus {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) -> Result<(), Error> {
        if bytes.len() > MAX_SEED {
            eprintln!("skipped {target}/{name}: {} bytes", bytes.len());
            return Ok(());
        }
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
        *self.written.entry(target.to_string()).or_default() += 1;
        Ok(())
    }
}

fn compress(file: &[u8], format: Format, chunk_size: usize) -> Result<Vec<u8>, Error> {
    let options = Options { chunk_size, ..Options::default() };
    Ok(file_codec::compress(file, format, &options, Vec::new(), &mut |_| {})?.0)
}

/// Byte groups of `bytes` grouped as `grouping` (each group `len / width` bytes).
fn groups(bytes: &[u8], reference: Option<&[u8]>, grouping: Grouping) -> Result<Vec<Vec<u8>>, Error> {
    let mut grouped = vec![0u8; bytes.len()];
    byte_group::split(bytes, reference, grouping, &mut grouped)?;
    Ok(grouped.chunks(bytes.len() / grouping.width).map(<[u8]>::to_vec).collect())
}

/// An object of `kind` whose content is `len` zero bytes, in 4 MiB chunks: a few bytes per
/// chunk on the wire, `len` bytes once decoded.
fn zeros_object(kind: ObjectKind, len: usize) -> Result<Vec<u8>, Error> {
    let zeros = vec![0u8; len];
    let options = Options { chunk_size: 4 << 20, ..Options::default() };
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, len as u64, options)?;
    w.segment(&zeros, None)?;
    let header = ObjectHeader { kind, dtype: None, reference: None, conversion: None, depth: 0, raw_len: len as u64 };
    Ok([&header.encode()[..], &w.finish()?.0].concat())
}

fn length_prefixed(len: usize, payload: &[u8]) -> Vec<u8> {
    let mut seed = (len as u32).to_le_bytes().to_vec();
    seed.extend_from_slice(payload);
    seed
}

fn run(cmd: &mut Command) -> Result<Vec<u8>, Error> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(out.stdout)
}

/// Pointers and filter-protocol sessions from real git: `git add` (clean) and a fresh checkout
/// (smudge) through `ckpt git filter-process`, with what git sends the filter recorded by `tee`.
fn git_seeds(corpus: &mut Corpus, ckpt: &Path, files: &[(&str, &[u8])]) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let git = |args: &[&str]| run(Command::new("git").current_dir(dir.path()).args(args));
    git(&["init", "-q", "-b", "main"])?;
    git(&["config", "user.name", "seeds"])?;
    git(&["config", "user.email", "seeds@example.com"])?;
    let transcript = dir.path().join("protocol.bin");
    let filter = format!("tee -a '{}' | '{}' git filter-process", transcript.display(), ckpt.display());
    git(&["config", "filter.ckpt.process", &filter])?;
    git(&["config", "filter.ckpt.required", "true"])?;
    std::fs::write(dir.path().join(".gitattributes"), "*.safetensors filter=ckpt -text\n*.pt filter=ckpt -text\n")?;
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes)?;
    }
    git(&["add", "."])?;
    git(&["commit", "-q", "-m", "weights"])?;
    corpus.put("git_filter_input", "protocol-clean.bin", &std::fs::read(&transcript)?)?;
    for (name, _) in files {
        let pointer = git(&["cat-file", "blob", &format!("HEAD:{name}")])?;
        corpus.put("git_filter_input", &format!("pointer-{name}.txt"), &pointer)?;
    }
    std::fs::remove_file(&transcript)?;
    for (name, _) in files {
        std::fs::remove_file(dir.path().join(name))?;
    }
    git(&["checkout", "--", "."])?;
    corpus.put("git_filter_input", "protocol-smudge.bin", &std::fs::read(&transcript)?)?;
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, kind, mib, file] = &args[..] {
        if flag == "--zeros-object" {
            // Not a seed: a bigger bomb, to measure what fetch allocates for one.
            let kind = if kind == "version" { ObjectKind::Version } else { ObjectKind::Manifest };
            std::fs::write(file, zeros_object(kind, mib.parse::<usize>()? << 20)?)?;
            return Ok(());
        }
    }
    let [_, out, ckpt] = &args[..] else {
        return Err("usage: make_seeds OUT_DIR CKPT_BINARY, or make_seeds --zeros-object KIND MIB FILE".into());
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/torch");
    let mut corpus = Corpus { root: PathBuf::from(out), written: BTreeMap::new() };

    // safetensors files.
    let (m1, m2) = (model(1), model(2));
    let st1 = safetensors(&m1, &[("format", "pt"), ("epoch", "1")]);
    let st2 = safetensors(&m2, &[("format", "pt"), ("epoch", "2")]);
    let small = safetensors(&m1[1..2], &[]);
    let empty = safetensors(&[], &[]);
    let scalars = safetensors(
        &[
            tensor("empty", "F32", &[0, 4], std::iter::empty()),
            tensor("flags", "U8", &[5], [1.0, 0.0, 1.0, 1.0, 0.0].into_iter()),
        ],
        &[("note", "a zero-sized tensor")],
    );
    for (name, file) in
        [("epoch1", &st1), ("epoch2", &st2), ("one-tensor", &small), ("empty", &empty), ("zero-sized", &scalars)]
    {
        ckpt::safetensors::parse(file).map_err(|e| format!("synthetic {name}: {e}"))?;
        corpus.put("safetensors_parse", &format!("{name}.safetensors"), file)?;
    }

    // torch.save archives and their pickles.
    let mut torch = Vec::new();
    for entry in std::fs::read_dir(&fixtures)? {
        let path = entry?.path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("pt" | "ckpt")) {
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).ok_or("fixture name")?.to_string();
        let bytes = std::fs::read(&path)?;
        corpus.put("torch_zip_parse", &name, &bytes)?;
        if let Ok(entries) = ckpt::torch_zip::zip::entries(&bytes) {
            for e in entries.iter().filter(|e| e.name.ends_with("data.pkl") && e.method == 0) {
                corpus.put(
                    "torch_zip_parse",
                    &format!("{name}.data.pkl"),
                    &bytes[e.data.start as usize..e.data.end as usize],
                )?;
            }
        }
        torch.push((name, bytes));
    }
    torch.sort();

    // torch.distributed.checkpoint directories: every `.metadata` and `.distcp` file of the
    // tests/fixtures/dcp checkpoints (written by real torch ranks).
    let dcp_fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/dcp");
    let mut checkpoints: Vec<PathBuf> =
        std::fs::read_dir(&dcp_fixtures)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    checkpoints.sort();
    for dir in checkpoints.iter().filter(|p| p.join(".metadata").is_file()) {
        let checkpoint = dir.file_name().and_then(|n| n.to_str()).ok_or("fixture name")?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
        files.sort();
        for file in files {
            let name = file.file_name().and_then(|n| n.to_str()).ok_or("fixture name")?;
            corpus.put("dcp_metadata", &format!("{checkpoint}{name}"), &std::fs::read(&file)?)?;
        }
    }

    // Containers: what `ckpt compress` writes, with the default chunk size and the smallest
    // (several chunks per segment), plus an XOR delta container.
    let text = b"epoch 1: loss 0.25\nepoch 2: loss 0.125\n".repeat(40);
    corpus.put("container_decode", "epoch1.safetensors.container", &compress(&st1, Format::Detect, 256 << 10)?)?;
    corpus.put(
        "container_decode",
        "epoch2-4k-chunks.safetensors.container",
        &compress(&st2, Format::Detect, 4 << 10)?,
    )?;
    corpus.put("container_decode", "text.container", &compress(&text, Format::Bytes, 256 << 10)?)?;
    corpus.put("container_decode", "empty.container", &compress(b"", Format::Bytes, 256 << 10)?)?;
    // Reference segments (format 7): a tensor saved twice, and the bf16 copy of an f32 one.
    let master: Vec<u8> = (0..4096u32).flat_map(|i| ((i as f32).sin() * 0.02).to_le_bytes()).collect();
    let rule = ckpt::codec::cross_precision::Rounding::NearestEven;
    let copy: Vec<u8> = master
        .chunks_exact(4)
        .flat_map(|c| {
            ckpt::codec::cross_precision::f32_to_bf16(u32::from_le_bytes([c[0], c[1], c[2], c[3]]), rule).to_le_bytes()
        })
        .collect();
    let spec = [("w", Dtype::F32), ("w_tied", Dtype::F32), ("w_bf16", Dtype::Bf16)]
        .map(|(n, d)| (n.to_string(), d, vec![4096]));
    let mut references = ckpt::safetensors::write_header(&spec, None)?;
    for bytes in [&master, &master, &copy] {
        references.extend_from_slice(bytes);
    }
    corpus.put("container_decode", "references.container", &compress(&references, Format::Safetensors, 4 << 10)?)?;
    for (name, bytes) in torch.iter().filter(|(n, _)| n.starts_with("model_epoch1") || n.starts_with("dtypes")) {
        corpus.put("container_decode", &format!("{name}.container"), &compress(bytes, Format::Detect, 4 << 10)?)?;
    }
    let (e1, e2) = (&m1[0].bytes, &m2[0].bytes);
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, e2.len() as u64, Options::default())?;
    w.segment_delta(e2, Some(e1), Some(Dtype::Bf16))?;
    corpus.put("container_decode", "delta-bf16.container", &w.finish()?.0)?;

    // Objects of a real commit: two epochs of the safetensors file, a torch file and a text
    // file, committed twice (the second commit stores deltas).
    let repo_dir = tempfile::tempdir()?;
    let repo = Repo::init(repo_dir.path())?;
    let options = CommitOptions { time: Some(1_764_000_000), ..CommitOptions::default() };
    let model1 = torch.iter().find(|(n, _)| n == "model_epoch1.pt").ok_or("model_epoch1.pt fixture")?;
    let model2 = torch.iter().find(|(n, _)| n == "model_epoch2.pt").ok_or("model_epoch2.pt fixture")?;
    for (epoch, st, pt) in [(1, &st1, &model1.1), (2, &st2, &model2.1)] {
        std::fs::write(repo_dir.path().join("model.safetensors"), st)?;
        std::fs::write(repo_dir.path().join("model.pt"), pt)?;
        std::fs::write(repo_dir.path().join("log.txt"), &text[..text.len() * epoch / 2])?;
        repo.commit(&["model.safetensors", "model.pt", "log.txt"], &format!("epoch {epoch}"), &options)?;
    }
    let store = Store::open(&repo_dir.path().join(ckpt::repo::DIR_NAME))?;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for id in store.list()? {
        let raw = store.raw(&id)?;
        let kind = raw.header.kind;
        let n = counts.entry(kind.name()).or_default();
        *n += 1;
        let name = format!("{}-{}-{}", kind.name(), n, &id.to_hex()[..12]);
        match kind {
            ObjectKind::Blob => {
                let delta = if raw.header.reference.is_some() { "delta-" } else { "" };
                corpus.put("container_decode", &format!("{delta}{name}.container"), &raw.bytes()[HEADER_LEN..])?;
            }
            ObjectKind::Manifest | ObjectKind::Version => {
                corpus.put("remote_objects", &format!("{name}.object"), raw.bytes())?;
                corpus.put("remote_objects", &format!("{name}.json"), &store.read_data(&id, kind)?)?;
            }
        }
    }

    // A remote's decompression bomb: a manifest object of a few hundred bytes whose content is
    // 64 MiB of zeros (valid container, valid hash; the content is not JSON).
    corpus.put("remote_objects", "zeros-64mib-manifest.object", &zeros_object(ObjectKind::Manifest, 64 << 20)?)?;

    // Huffman streams: byte groups of real tensors (the exponent group is skewed, so it codes).
    let bf16 = Grouping::for_dtype(Some(Dtype::Bf16));
    let f32 = Grouping::for_dtype(Some(Dtype::F32));
    let mut coded_groups = 0;
    for (tname, bytes, grouping) in [("embed", e1, bf16), ("fc", &m1[2].bytes, f32)] {
        for (g, group) in groups(bytes, None, grouping)?.iter().enumerate() {
            let mut coded = Vec::new();
            if huffman::encode(group, &mut coded)? {
                corpus.put(
                    "huffman_decode",
                    &format!("{tname}-group{g}.huff"),
                    &length_prefixed(group.len(), &coded),
                )?;
                coded_groups += 1;
            }
        }
    }
    if coded_groups == 0 {
        return Err("no byte group Huffman-coded".into());
    }
    // A long run of few symbols (several blocks of the stream).
    let long: Vec<u8> = (0..150_000u32).map(|i| (i * 7 % 13 % 4) as u8).collect();
    let mut coded = Vec::new();
    if huffman::encode(&long, &mut coded)? {
        corpus.put("huffman_decode", "four-symbols-150k.huff", &length_prefixed(long.len(), &coded))?;
    }

    // Sparse streams: the XOR of two epochs' byte groups (mostly zero).
    let mut sparse_groups = 0;
    for (tname, a, b, grouping) in [("embed", e1, e2, bf16), ("fc", &m1[2].bytes, &m2[2].bytes, f32)] {
        for (g, group) in groups(b, Some(a), grouping)?.iter().enumerate() {
            let mut coded = Vec::new();
            if sparse::encode(group, 1, &mut coded)? {
                corpus.put(
                    "sparse_decode",
                    &format!("{tname}-xor-group{g}.sparse"),
                    &length_prefixed(group.len(), &coded),
                )?;
                sparse_groups += 1;
            }
        }
    }
    if sparse_groups == 0 {
        return Err("no XOR byte group sparse-coded".into());
    }

    // rANS streams: plain byte groups (exponents: with contexts) and XOR groups (order-0).
    let mut rans_groups = 0;
    for (tname, a, b, grouping) in [("embed", e1, e2, bf16), ("fc", &m1[2].bytes, &m2[2].bytes, f32)] {
        for (kind, reference, contexts) in [("plain", None, rans::MAX_CONTEXTS), ("xor", Some(&a[..]), 0)] {
            for (g, group) in groups(b, reference, grouping)?.iter().enumerate() {
                let mut coded = Vec::new();
                if rans::encode(group, contexts, &mut coded)? {
                    corpus.put(
                        "rans_decode",
                        &format!("{tname}-{kind}-group{g}.rans"),
                        &length_prefixed(group.len(), &coded),
                    )?;
                    rans_groups += 1;
                }
            }
        }
    }
    if rans_groups == 0 {
        return Err("no byte group rANS-coded".into());
    }
    // rANS streams whose contexts come from a source (format 5): the max level's candidates,
    // the same element's higher groups and, for XOR groups, the reference's groups.
    let mut sourced = 0;
    for (tname, a, b, grouping) in [("embed", e1, e2, bf16), ("fc", &m1[2].bytes, &m2[2].bytes, f32)] {
        for (kind, reference) in [("plain", None), ("xor", Some(&a[..]))] {
            let own = groups(b, reference, grouping)?;
            let reference_groups = match reference {
                Some(r) => groups(r, None, grouping)?,
                None => Vec::new(),
            };
            for (g, group) in own.iter().enumerate() {
                let mut candidates: Vec<(rans::Source, &[u8])> =
                    (g + 1..own.len()).map(|j| (rans::Source::Group(j as u8), &own[j][..])).collect();
                candidates.extend(
                    reference_groups.iter().enumerate().map(|(j, r)| (rans::Source::Reference(j as u8), &r[..])),
                );
                let mut coded = Vec::new();
                if rans::encode_with_sources(group, rans::MAX_CONTEXTS, &candidates, &mut coded)?
                    && rans::payload_source(&coded).is_some()
                {
                    corpus.put(
                        "rans_decode",
                        &format!("{tname}-{kind}-group{g}-sourced.rans"),
                        &length_prefixed(group.len(), &coded),
                    )?;
                    sourced += 1;
                }
            }
        }
    }
    // The corpus tensors are too small for a source's tables to pay: synthetic groups whose
    // spread depends on a context byte (exponent-like), coded with it as the same element's
    // group and as the reference's, and one wide enough for binned tables and nibble contexts.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let context: Vec<u8> = (0..12_000).map(|_| 120 + (next() % 6) as u8).collect();
    let narrow: Vec<u8> = context.iter().map(|&c| if c % 2 == 0 { (next() % 8) as u8 } else { next() as u8 }).collect();
    let wide_context: Vec<u8> = (0..40_000).map(|_| next() as u8).collect();
    let wide: Vec<u8> = wide_context.iter().map(|&c| (c & 0xF0) | (next() % 16) as u8 >> (c >> 6)).collect();
    for (name, group, source, bytes) in [
        ("synthetic-group", &narrow, rans::Source::Group(1), &context),
        ("synthetic-reference", &narrow, rans::Source::Reference(3), &context),
        ("synthetic-nibble", &wide, rans::Source::Group(2), &wide_context),
    ] {
        let mut coded = Vec::new();
        if rans::encode_with_sources(group, rans::MAX_CONTEXTS, &[(source, &bytes[..])], &mut coded)?
            && rans::payload_source(&coded) == Some(source)
        {
            corpus.put("rans_decode", &format!("{name}-sourced.rans"), &length_prefixed(group.len(), &coded))?;
            sourced += 1;
        }
    }
    if sourced < 3 {
        return Err("too few byte groups rANS-coded with a context source".into());
    }

    // Pairs (format 6): the exponent group and the group below it of the bf16 and f32 tensors
    // coded together, with the `k` their values give and with every smaller one.
    let mut pairs = 0;
    for (tname, bytes, grouping) in [("embed", e1, bf16), ("fc", &m1[2].bytes, f32)] {
        let own = groups(bytes, None, grouping)?;
        let (upper, lower) = (&own[own.len() - 1], &own[own.len() - 2]);
        let histogram = GroupStats::of(upper).histogram;
        let Some(plan) = paired::Plan::for_histogram(&histogram) else { continue };
        let mut symbols = vec![0u8; upper.len()];
        plan.symbols(upper, lower, &mut symbols);
        let (mut up, mut low) = (Vec::new(), Vec::new());
        if paired::encode(&plan, &symbols, None, lower, &mut up, &mut low)? {
            let mut seed = length_prefixed(upper.len(), &(up.len() as u32).to_le_bytes());
            seed.extend_from_slice(&up);
            seed.extend_from_slice(&low);
            corpus.put("paired_decode", &format!("{tname}-k{}.paired", plan.k()), &seed)?;
            pairs += 1;
        }
    }
    if pairs == 0 {
        return Err("no pair of byte groups coded".into());
    }

    // Grids (format 7): quantized weights dequantized into bf16 and f32, as Grid payloads.
    for (seed, (name, choice)) in grid_seeds().into_iter().zip([("int4-bf16", 0u8), ("int8-f32", 1)]) {
        let mut bytes = vec![choice];
        bytes.extend_from_slice(&seed.0.to_le_bytes());
        bytes.extend_from_slice(&seed.1);
        corpus.put("grid_decode", &format!("{name}.grid"), &bytes)?;
    }

    // encode -> decode inputs: selector (width bits 0-1, exponent bit 2, delta bit 3, max level bit 4), then
    // the input and the reference, each half of the rest.
    let pair = |selector: u8, a: &[u8], b: &[u8]| [&[selector][..], b, a].concat();
    corpus.put("codec_round_trip", "bf16-delta.bin", &pair(1 | 4 | 8, e1, e2))?;
    corpus.put("codec_round_trip", "f32-delta.bin", &pair(2 | 4 | 8, &m1[2].bytes, &m2[2].bytes))?;
    corpus.put("codec_round_trip", "f32-plain.bin", &pair(2 | 4, &m1[2].bytes, &m1[2].bytes))?;
    corpus.put("codec_round_trip", "bytes.bin", &[&[0u8][..], &text].concat())?;
    // The same at the max level (selector bit 4): rANS contexts from other groups and the reference.
    corpus.put("codec_round_trip", "bf16-delta-max.bin", &pair(1 | 4 | 8 | 16, e1, e2))?;
    corpus.put("codec_round_trip", "f32-delta-max.bin", &pair(2 | 4 | 8 | 16, &m1[2].bytes, &m2[2].bytes))?;
    corpus.put("codec_round_trip", "f32-plain-max.bin", &pair(2 | 4 | 16, &m1[2].bytes, &m1[2].bytes))?;

    // git pointers and filter-protocol sessions.
    git_seeds(&mut corpus, Path::new(ckpt), &[("model.safetensors", &st1), ("model.pt", &model1.1)])?;

    for (target, n) in &corpus.written {
        println!("{target}: {n} seeds");
    }
    Ok(())
}

/// Two Grid payloads (element count, payload): 4-bit codes with a zero point per group of 64 in
/// bf16, and 8-bit codes per row of 256 in f32, each with a value off the grid.
fn grid_seeds() -> Vec<(u16, Vec<u8>)> {
    use ckpt::codec::grid::{self, element_bits, Arithmetic};
    use ckpt::dtype::Dtype;
    let mut out = Vec::new();
    for (dtype, k, qmax) in [(Dtype::Bf16, 64usize, 7i32), (Dtype::F32, 256, 127)] {
        let n = 4096usize;
        let mut bits: Vec<u32> = (0..n)
            .map(|i| {
                let scale = 1e-3 * (1.0 + (i / k) as f32 * 0.37);
                let q = ((i * 7919) % (2 * qmax as usize + 1)) as i32 - qmax;
                element_bits(q as f32, scale, dtype, Arithmetic::ProductF32)
            })
            .collect();
        bits[100] ^= 1;
        let data: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()[..dtype.size()].to_vec()).collect();
        let Some(plan) = grid::detect(&data, dtype, Some(k as u64)) else { continue };
        let fitted = grid::fit_tensor(&data, &plan);
        if let Ok(Some(payload)) = grid::encode(&fitted, 0, &data, &Options::default()) {
            out.push((n as u16, payload));
        }
    }
    out
}
