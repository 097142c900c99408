//! Reading a remote without a repository (`ckpt::sync::RemoteReader`, `ckpt checkout --from`):
//! only what a request needs is downloaded (counted on the wire by a wrapper remote), a second
//! read comes from the cache, and hostile answers (lying ranges, a chunk index past its blob,
//! a swapped blob, a manifest naming a huge tensor) are clear errors, never wrong bytes.

use crate::support::remote::{directory, open_remote, remote_suite, s3, Served};
use crate::support::repo_util::{ckpt_command, stderr, synthetic_checkpoint};
use ckpt::remote::{Listed, Remote, Small};
use ckpt::store::{ObjectHeader, HEADER_LEN};
use ckpt::sync::{RankCache, RemoteReader};
use ckpt::{Dtype, ObjectId};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

const PATH: &str = "model.safetensors";
/// Chunk size of the pushing repository: small, so that a 2 MiB tensor has 128 chunks.
const CHUNK: u64 = 16 << 10;
const MODEL: &[(&str, &[u64])] = &[("embed.weight", &[512, 1024]), ("head.bias", &[1024]), ("layers.0.q", &[64, 64])];

fn model(epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(7, Dtype::F32, MODEL, epoch)
}

/// The bytes of tensor `name` of a safetensors file.
fn tensor_bytes(file: &[u8], name: &str) -> Vec<u8> {
    safetensors::SafeTensors::deserialize(file).unwrap().tensor(name).unwrap().data().to_vec()
}

/// A repository that pushed epochs `0..epochs` of the model to `r` in `layout`.
fn pushed(r: &Served, layout: &str, epochs: u32) -> tempfile::TempDir {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    r.ok(dir, &["init"]);
    std::fs::write(dir.join(".ckpt/config"), format!("{{\"chunk_size\": {CHUNK}}}")).unwrap();
    r.ok(dir, &["remote", "add", "origin", &r.url, "--layout", layout]);
    for e in 0..epochs {
        std::fs::write(dir.join(PATH), model(e)).unwrap();
        r.ok(dir, &["commit", "-m", &format!("epoch {e}"), PATH]);
        r.ok(dir, &["push"]);
    }
    work
}

/// What a [`Metered`] remote saw, and how it lies.
#[derive(Default)]
struct Meter {
    /// Bytes of objects that came (downloads, heads and ranges).
    bytes: AtomicU64,
    /// Requests for objects (keys under `objects/`).
    object_requests: AtomicU64,
    /// 0: honest; 1: a range answer one byte short; 2: one byte long.
    lie: AtomicU8,
}

/// A remote that counts the object bytes and requests on the wire, and can lie about ranges.
struct Metered {
    inner: Box<dyn Remote>,
    meter: Arc<Meter>,
}

impl Metered {
    fn saw(&self, key: &str, bytes: u64) {
        if key.starts_with("objects/") {
            self.meter.object_requests.fetch_add(1, Ordering::Relaxed);
            self.meter.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

impl Remote for Metered {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> ckpt::remote::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> ckpt::remote::Result<Vec<Listed>> {
        self.inner.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> ckpt::remote::Result<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn exists(&self, key: &str) -> ckpt::remote::Result<bool> {
        self.saw(key, 0);
        self.inner.exists(key)
    }
    fn get_small(&self, key: &str) -> ckpt::remote::Result<Option<Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, _: &str, _: &[u8], _: &ckpt::remote::Expect) -> ckpt::remote::Result<()> {
        panic!("a reader wrote a ref")
    }
    fn upload(
        &self,
        _: &str,
        _: &std::fs::File,
        _: &Path,
        _: u64,
        _: ckpt::remote::UploadMode,
    ) -> ckpt::remote::Result<ckpt::remote::Uploaded> {
        panic!("a reader uploaded")
    }
    fn replace(&self, _: &str, _: &std::fs::File, _: &Path, _: u64) -> ckpt::remote::Result<()> {
        panic!("a reader replaced an object")
    }
    fn delete(&self, _: &str) -> ckpt::remote::Result<()> {
        panic!("a reader deleted")
    }
    fn read_head(&self, key: &str, len: u64) -> ckpt::remote::Result<(Vec<u8>, u64)> {
        let got = self.inner.read_head(key, len)?;
        self.saw(key, got.0.len() as u64);
        Ok(got)
    }
    fn read_range(&self, key: &str, range: std::ops::Range<u64>) -> ckpt::remote::Result<Vec<u8>> {
        let mut got = self.inner.read_range(key, range)?;
        match self.meter.lie.load(Ordering::Relaxed) {
            1 => {
                got.pop();
            }
            2 => got.push(0),
            _ => {}
        }
        self.saw(key, got.len() as u64);
        Ok(got)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> ckpt::remote::Result<u64> {
        let mut counted = crate::support::remote::Counting(out, 0);
        let done = self.inner.download(key, &mut counted, limit);
        self.saw(key, counted.1);
        done
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

/// A reader of `r` through the cache in `cache`, metered.
fn reader(r: &Served, cache: &Path) -> (RemoteReader, Arc<Meter>) {
    let meter = Arc::new(Meter::default());
    let remote = Metered { inner: open_remote(r), meter: meter.clone() };
    (RemoteReader::new(Box::new(remote), RankCache::at(cache).unwrap()), meter)
}

/// The object file of `id` on `r`.
fn object_file(r: &Served, id: &ObjectId) -> std::path::PathBuf {
    let hex = id.to_hex();
    r.objects.join(&hex[..2]).join(&hex[2..])
}

/// The header of `id` on `r`.
fn remote_header(r: &Served, id: &ObjectId) -> ObjectHeader {
    let bytes = std::fs::read(object_file(r, id)).unwrap();
    ObjectHeader::decode(*id, &bytes[..HEADER_LEN]).unwrap()
}

/// The blob of tensor `name` at `rev` and its chain's ids and object sizes on `r`.
fn chain_on(r: &Served, reader: &RemoteReader, rev: &str, name: &str) -> (ObjectId, Vec<(ObjectId, u64)>) {
    let id = reader.resolve(rev).unwrap();
    let (_, manifest) = reader.file(&id, PATH).unwrap();
    let segment = manifest.segments.iter().find(|s| s.tensor.as_ref().is_some_and(|t| t.name == name)).unwrap();
    let blob = segment.blob.expect("a tensor of its own blob");
    let mut chain = Vec::new();
    let mut next = Some(blob);
    while let Some(b) = next {
        chain.push((b, std::fs::metadata(object_file(r, &b)).unwrap().len()));
        next = remote_header(r, &b).reference;
    }
    (blob, chain)
}

fn read_rows(
    reader: &RemoteReader,
    rev: &str,
    name: &str,
    rows: Option<std::ops::Range<u64>>,
) -> ckpt::sync::Result<Vec<u8>> {
    let id = reader.resolve(rev)?;
    let t = reader.tensor(&id, PATH, name)?;
    let rows = rows.unwrap_or(0..t.rows());
    let len = reader.fetch_rows(&t, rows.clone())?;
    let mut out = vec![0u8; len as usize];
    reader.read_rows_into(&t, rows, &mut out)?;
    Ok(out)
}

/// A cold start costs at most 4 requests; a whole tensor costs its blob and its chain (on the
/// deltas layout) and little more; a second read, by a new reader on the same cache, sends no
/// object request.
fn whole_tensor_downloads_its_chain_only(r: &Served) {
    let _work = pushed(r, "deltas", 2);
    let cache = tempfile::tempdir().unwrap();
    let (reader, meter) = reader(r, cache.path());
    let before = reader.remote().requests();
    let id = reader.resolve("main").unwrap();
    let (_, manifest) = reader.file(&id, PATH).unwrap();
    assert_eq!(manifest.len, model(1).len() as u64);
    let cold = reader.remote().requests() - before;
    assert!(cold <= 4, "a cold start took {cold} requests");

    let (_, chain) = chain_on(r, &reader, "main", "embed.weight");
    assert_eq!(chain.len(), 2, "the deltas layout stores the newest epoch as a delta: {chain:?}");
    let stored: u64 = chain.iter().map(|(_, n)| n).sum();
    meter.bytes.store(0, Ordering::Relaxed);
    let got = read_rows(&reader, "main", "embed.weight", None).unwrap();
    assert_eq!(got, tensor_bytes(&model(1), "embed.weight"));
    let bytes = meter.bytes.load(Ordering::Relaxed);
    assert!(bytes as f64 <= 1.1 * stored as f64 + 65536.0, "{bytes} bytes for a chain of {stored}");
    // The older epoch too, through what the cache holds.
    assert_eq!(read_rows(&reader, "main~1", "embed.weight", None).unwrap(), tensor_bytes(&model(0), "embed.weight"));
    drop(reader);

    let (again, meter) = self::reader(r, cache.path());
    let got = read_rows(&again, "main", "embed.weight", None).unwrap();
    assert_eq!(got, tensor_bytes(&model(1), "embed.weight"));
    assert_eq!(meter.object_requests.load(Ordering::Relaxed), 0, "a second read went to the remote");
}

/// Rows of a tensor download the chunk index and the chunks holding them, of each blob of its
/// chain: at most 1.2 × their share of the stored chain and one chunk; read again, nothing.
fn rows_download_their_chunks_only(r: &Served) {
    let _work = pushed(r, "deltas", 2);
    let cache = tempfile::tempdir().unwrap();
    let (reader, meter) = reader(r, cache.path());
    let (_, chain) = chain_on(r, &reader, "main", "embed.weight");
    let stored: u64 = chain.iter().map(|(_, n)| n).sum();
    let expected = tensor_bytes(&model(1), "embed.weight");
    let row = expected.len() / 512;
    for (rows, fresh) in [(100..228u64, true), (100..228, false), (0..1, true), (511..512, true), (7..7, true)] {
        meter.bytes.store(0, Ordering::Relaxed);
        meter.object_requests.store(0, Ordering::Relaxed);
        let got = read_rows(&reader, "main", "embed.weight", Some(rows.clone())).unwrap();
        assert_eq!(got, expected[rows.start as usize * row..rows.end as usize * row], "rows {rows:?}");
        let (bytes, requests) = (meter.bytes.load(Ordering::Relaxed), meter.object_requests.load(Ordering::Relaxed));
        let share = stored as f64 * (rows.end - rows.start) as f64 / 512.0;
        if fresh {
            assert!(bytes as f64 <= 1.2 * share + CHUNK as f64, "rows {rows:?}: {bytes} bytes, share {share}");
        } else {
            assert_eq!((bytes, requests), (0, 0), "rows {rows:?} read again went to the remote");
        }
    }
    // All rows now: the whole blob, verified, replaces the partial copies.
    assert_eq!(read_rows(&reader, "main", "embed.weight", None).unwrap(), expected);
    assert_eq!(read_rows(&reader, "main", "embed.weight", Some(3..9)).unwrap(), expected[3 * row..9 * row]);
}

/// `ckpt checkout --from URL` writes what a repository's checkout writes, with no repository.
fn checkout_from_a_remote(r: &Served) {
    let work = pushed(r, "mirror", 2);
    let (outside, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let run = |args: &[&str]| {
        let mut c = ckpt_command(outside.path(), args);
        c.env("CKPT_CACHE_DIR", cache.path());
        for (k, v) in &r.env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = run(&["checkout", "--from", &r.url, "main~1", "--output", "whole"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(outside.path().join("whole").join(PATH)).unwrap(), model(0));

    let out = run(&["checkout", "--from", &r.url, "main", PATH, "--tensor", "embed*", "--output", "some"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let local = tempfile::tempdir().unwrap();
    let l = local.path().to_str().unwrap();
    r.ok(work.path(), &["checkout", "main", "--tensor", "embed*", "--output", l]);
    assert_eq!(
        std::fs::read(outside.path().join("some").join(PATH)).unwrap(),
        std::fs::read(local.path().join(PATH)).unwrap()
    );
    let out = run(&["checkout", "--from", &r.url, "main", "--tensor", "nothing-matches", "--output", "none"]);
    assert!(!out.status.success() && stderr(&out).contains("no tensor matches"), "{}", stderr(&out));
    let out = run(&["checkout", "--from", &r.url, "no-such-branch", "--output", "none"]);
    assert!(!out.status.success() && stderr(&out).contains("no-such-branch"), "{}", stderr(&out));
}

remote_suite!(whole_tensor_downloads_its_chain_only, rows_download_their_chunks_only, checkout_from_a_remote);

/// A range answer one byte short or long is refused, whichever the read.
#[test]
fn a_range_answer_of_another_length_is_refused() {
    let r = directory().unwrap();
    let _work = pushed(&r, "deltas", 2);
    for lie in [1, 2] {
        let cache = tempfile::tempdir().unwrap();
        let (reader, meter) = reader(&r, cache.path());
        meter.lie.store(lie, Ordering::Relaxed);
        let e = read_rows(&reader, "main", "embed.weight", Some(10..20)).unwrap_err().to_string();
        assert!(e.contains("asked for bytes"), "{e}");
        // Honest again: the rows read right (nothing of the lie was kept).
        meter.lie.store(0, Ordering::Relaxed);
        let got = read_rows(&reader, "main", "embed.weight", Some(10..20)).unwrap();
        let expected = tensor_bytes(&model(1), "embed.weight");
        assert_eq!(got, expected[10 * 4096..20 * 4096]);
    }
}

/// A blob replaced on the remote by another valid blob is refused, read whole or in rows.
#[test]
fn a_swapped_blob_is_refused() {
    let r = directory().unwrap();
    let _work = pushed(&r, "mirror", 1);
    let cache = tempfile::tempdir().unwrap();
    let (reader, _) = reader(&r, cache.path());
    let (embed, _) = chain_on(&r, &reader, "main", "embed.weight");
    let (q, _) = chain_on(&r, &reader, "main", "layers.0.q");
    std::fs::copy(object_file(&r, &q), object_file(&r, &embed)).unwrap();
    for rows in [Some(1..3), None] {
        let e = read_rows(&reader, "main", "embed.weight", rows.clone()).unwrap_err().to_string();
        assert!(e.contains(&embed.to_hex()[..12]), "rows {rows:?}: {e}");
    }
}

/// A chunk index whose stored lengths run past the payload area is refused before any payload
/// is read.
#[test]
fn a_chunk_index_past_the_blob_is_refused() {
    let r = directory().unwrap();
    let _work = pushed(&r, "mirror", 1);
    let cache = tempfile::tempdir().unwrap();
    let (reader, _) = reader(&r, cache.path());
    let (embed, _) = chain_on(&r, &reader, "main", "embed.weight");
    let path = object_file(&r, &embed);
    let mut bytes = std::fs::read(&path).unwrap();
    let container = &mut bytes[HEADER_LEN..];
    let n = container.len();
    let index_offset = u64::from_le_bytes(container[n - 64..n - 56].try_into().unwrap()) as usize;
    // The first chunk's first group entry (after the segment count and the first segment
    // record): its stored length grows by a megabyte, with the checksum made to match.
    let entry = index_offset + 4 + 9;
    let len = u32::from_le_bytes(container[entry + 1..entry + 5].try_into().unwrap());
    container[entry + 1..entry + 5].copy_from_slice(&(len + (1 << 20)).to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&container[..32]);
    h.update(&container[index_offset..n - 64]);
    h.update(&container[n - 64..n - 16]);
    let sum = *h.finalize().as_bytes();
    container[n - 16..n - 8].copy_from_slice(&sum[..8]);
    std::fs::write(&path, &bytes).unwrap();
    let e = read_rows(&reader, "main", "embed.weight", Some(1..2)).unwrap_err().to_string();
    assert!(e.contains(&embed.to_hex()[..12]) && e.contains("chunk"), "{e}");
    let e = read_rows(&reader, "main", "embed.weight", None).unwrap_err().to_string();
    assert!(e.contains(&embed.to_hex()[..12]), "{e}");
}

/// A version whose manifest names a tensor of 2^46 bytes stored in a small blob: refused
/// before anything that size is allocated, whole or in rows.
#[test]
fn a_manifest_naming_a_huge_tensor_is_refused() {
    let r = directory().unwrap();
    let work = pushed(&r, "mirror", 1);
    let repo = ckpt::repo::Repo::open(work.path()).unwrap();
    let id = repo.resolve("main").unwrap();
    let mut version = repo.version(&id).unwrap();
    let mut manifest = repo.manifest(&version.files[0].manifest).unwrap();
    let huge: u64 = 1 << 46;
    let i = manifest.segments.iter().position(|s| s.tensor.as_ref().is_some_and(|t| t.name == "embed.weight")).unwrap();
    let s = &mut manifest.segments[i];
    manifest.len = manifest.len - s.len + huge;
    s.len = huge;
    s.tensor.as_mut().unwrap().shape = vec![huge / 4096, 1024];
    // A consistent forgery: the file hash of the new segments (no tensor here is bundled).
    manifest.hash = ckpt::repo::file_hash(manifest.len, manifest.segments.iter().map(|s| (s.len, s.blob.unwrap())));
    let options = ckpt::codec::Options::default();
    let forged = repo.store().write_data(ckpt::store::ObjectKind::Manifest, &manifest.to_bytes(), &options).unwrap();
    version.files[0].manifest = forged.id;
    version.files[0].len = manifest.len;
    version.files[0].hash = manifest.hash;
    let forged_version =
        repo.store().write_data(ckpt::store::ObjectKind::Version, &version.to_bytes(), &options).unwrap();
    for object in [forged.id, forged_version.id] {
        let to = object_file(&r, &object);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo.store().object_path(&object), to).unwrap();
    }
    let refs = Path::new(&r.url).join("refs/heads/evil");
    std::fs::write(refs, format!("{}\n", forged_version.id)).unwrap();

    let cache = tempfile::tempdir().unwrap();
    let (reader, _) = reader(&r, cache.path());
    for rows in [None, Some(0..1), Some(0..(huge / 4096))] {
        match read_rows(&reader, "evil", "embed.weight", rows.clone()) {
            Ok(_) => panic!("rows {rows:?} of a forged tensor were read"),
            Err(e) => assert!(e.to_string().contains("manifest says"), "rows {rows:?}: {e}"),
        }
    }
}
