//! A read-only handle on a remote, without a repository ([`RemoteReader`]: `ckpt.open(URL)`,
//! `ckpt.safe_open`, `ckpt checkout --from URL`). It resolves revisions on the remote, lists
//! versions, files and tensors, and reads a tensor, or rows of one, downloading only what that
//! needs: the version, the file's manifest, and the tensor's blob with its delta chain (on a
//! `deltas` layout), each verified against its id. For rows of a tensor it does not hold, it
//! reads the blob's chunk index and then only the chunks holding those rows, of every blob of
//! the chain, by ranged reads (`blob_ranges.rs`); those are checked by the chunk checksums and
//! the container's recorded hash, the whole tensor's hash only when the whole is read.
//!
//! Everything downloaded goes into a cache (a [`RankCache`], as `ckpt.dcp.Reader`'s: a
//! repository used as an object store, kept between runs under the cache root): versions,
//! manifests and whole blobs into its store, partial blobs into `partial/` beside it. A second
//! read of the same tensor or rows sends no object request (a branch or tag is still read, as
//! it may have moved). A file whose every blob is in the cache is noted as read, so that
//! [`RemoteReader::close`] with `prune` keeps the newest file of each path, as the DCP reader's
//! cache does; without it (the default of the CLI and Python) nothing is deleted, so that rows
//! read stay for the next run.
//!
//! It must not write to the remote, nor decide what an object means beyond what the store and
//! the manifests say: the store's code opens and decodes every object.

use super::blob_ranges::PartialCopies;
use super::file_objects::fetch_blobs;
use super::remote_view::{download_data, remote_refs, resolve_remote};
use super::{fetch_version, Error, RankCache, Result, StoredFileReader};
use crate::object_id::ObjectId;
use crate::remote::Remote;
use crate::repo::{
    split_ancestry, CheckoutOptions, CheckoutSummary, Error as RepoError, FileEntry, FileFormat, Manifest, RefKind,
    Repo, TensorFilter, TensorRef, Version, VersionId,
};
use crate::store::{ObjectKind, Store, MAX_CHAIN_DEPTH};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// A read-only handle on a remote: the remote and the cache its reads go through.
pub struct RemoteReader {
    remote: Box<dyn Remote>,
    cache: RankCache,
    partial: PartialCopies,
}

/// A tensor of a file of a remote version ([`RemoteReader::tensor`]): where it lies, and its
/// name, dtype and shape. Its rows are the slices of its first dimension (a scalar is one row).
#[derive(Clone, Debug)]
pub struct RemoteTensor {
    /// Its name, safetensors dtype name and shape.
    pub info: TensorRef,
    manifest: Arc<Manifest>,
    manifest_id: ObjectId,
    path: String,
    segment: usize,
    /// Where its bytes start in the file.
    offset: u64,
    rows: u64,
    row_len: u64,
}

impl RemoteTensor {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.rows * self.row_len
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Its rows: the length of its first dimension (1 for a scalar).
    pub fn rows(&self) -> u64 {
        self.rows
    }
    /// The bytes of one row.
    pub fn row_len(&self) -> u64 {
        self.row_len
    }
}

fn unreadable(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Unreadable { what: what.into(), reason: reason.into() }
}

/// Where a [`RemoteReader`] keeps what it downloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ReaderCache {
    /// The kept cache of this remote under the cache root ([`super::default_cache_root`]), as
    /// `ckpt.dcp.Reader` keeps one; a temporary one when another process uses it or there is
    /// no cache root.
    #[default]
    Kept,
    /// This directory, used as it is.
    At(PathBuf),
    /// A temporary directory, deleted when the reader is dropped.
    Temporary,
}

impl RemoteReader {
    /// Opens the remote at `url` (`s3://BUCKET/PREFIX` with `s3`'s settings and the `AWS_*`
    /// environment, or a directory) for reading through `cache`.
    pub fn open(url: &str, s3: &crate::remote::S3Options, cache: ReaderCache) -> Result<RemoteReader> {
        let remote = crate::remote::open(url, s3)?;
        // What tells two remotes apart: the URL as opened (no credentials) and an S3 endpoint.
        let endpoint = s3.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().find_map(|v| std::env::var(v).ok().filter(|e| !e.is_empty()))
        });
        let identity = match endpoint {
            Some(endpoint) if url.starts_with("s3://") => format!("read {} {endpoint}", remote.url()),
            _ => format!("read {}", remote.url()),
        };
        let cache = match (cache, super::default_cache_root()) {
            (ReaderCache::At(dir), _) => RankCache::at(&dir)?,
            (ReaderCache::Temporary, _) => RankCache::temporary()?,
            (ReaderCache::Kept, Some(root)) => RankCache::kept(&root, &identity, 0)?,
            (ReaderCache::Kept, None) => {
                RankCache::temporary_because(Some(format!("no cache directory (set {})", super::CACHE_DIR_VAR)))?
            }
        };
        Ok(RemoteReader::new(remote, cache))
    }

    /// A reader of `remote` through `cache`.
    pub fn new(remote: Box<dyn Remote>, cache: RankCache) -> RemoteReader {
        let partial = PartialCopies::new(cache.dir().join("partial"));
        RemoteReader { remote, cache, partial }
    }

    /// The remote.
    pub fn remote(&self) -> &dyn Remote {
        &*self.remote
    }

    /// The cache.
    pub fn cache(&self) -> &RankCache {
        &self.cache
    }

    fn repo(&self) -> Arc<Repo> {
        self.cache.repo()
    }

    /// The version `rev` names on the remote: `HEAD` (`main`, else the first branch), a branch,
    /// a tag, a full or unique short (4 hex digits or more) version id, each optionally followed
    /// by `~N` (N first parents back), as a repository resolves one.
    pub fn resolve(&self, rev: &str) -> Result<VersionId> {
        let unknown = |reason: String| Error::from(RepoError::UnknownRevision { rev: rev.to_string(), reason });
        let (base, steps) = split_ancestry(rev).ok_or_else(|| unknown("bad ~N suffix".into()))?;
        let mut id = resolve_remote(&*self.remote, base)?;
        for n in 0..steps {
            let version = self.version(&id)?;
            id = *version.parents.first().ok_or_else(|| {
                unknown(format!("{base} has only {n} version{} before it", if n == 1 { "" } else { "s" }))
            })?;
        }
        Ok(id)
    }

    /// Version `id`, from the cache or downloaded (verified) into it.
    pub fn version(&self, id: &VersionId) -> Result<Version> {
        fetch_version(&self.repo(), &*self.remote, id)
    }

    /// The branches and tags of the remote, sorted by kind and name.
    pub fn refs(&self) -> Result<Vec<(RefKind, String, VersionId)>> {
        Ok(remote_refs(&*self.remote, None)?.into_iter().map(|r| (r.kind, r.name, r.id)).collect())
    }

    /// The history from `rev` along first parents, newest first, at most `max` versions.
    pub fn log(&self, rev: &str, max: Option<usize>) -> Result<Vec<(VersionId, Version)>> {
        let mut next = Some(self.resolve(rev)?);
        let mut out = Vec::new();
        while let Some(id) = next.filter(|_| max.is_none_or(|m| out.len() < m)) {
            let version = self.version(&id)?;
            next = version.parents.first().copied();
            out.push((id, version));
        }
        Ok(out)
    }

    /// The entry and manifest of `path` in version `id`, the manifest from the cache or
    /// downloaded (verified) into it, and checked against the entry.
    pub fn file(&self, id: &VersionId, path: &str) -> Result<(FileEntry, Manifest)> {
        let version = self.version(id)?;
        let entry = version
            .file(path)
            .cloned()
            .ok_or_else(|| Error::from(RepoError::NotInVersion { path: path.to_string(), version: *id }))?;
        let repo = self.repo();
        let manifest = if repo.store().contains(&entry.manifest) {
            repo.manifest(&entry.manifest)?
        } else {
            let (tmp, data) = download_data(&repo, &*self.remote, &entry.manifest, ObjectKind::Manifest)?;
            let manifest = Manifest::parse(entry.manifest, &data)?;
            let _lock = repo.lock()?;
            repo.import_object(&entry.manifest, ObjectKind::Manifest, tmp)?;
            manifest
        };
        if manifest.len != entry.len || manifest.hash != entry.hash {
            return Err(Error::from(RepoError::CorruptMetadata {
                id: entry.manifest,
                reason: "manifest length or hash differs from the version's file entry".into(),
            }));
        }
        Ok((entry, manifest))
    }

    /// The tensors of `path` in version `id`, in file order.
    pub fn tensors(&self, id: &VersionId, path: &str) -> Result<Vec<TensorRef>> {
        Ok(self.file(id, path)?.1.segments.into_iter().filter_map(|s| s.tensor).collect())
    }

    /// The tensor `name` of `path` in version `id`; a tensor whose bytes are not its shape's
    /// is refused here, before anything is read or allocated.
    pub fn tensor(&self, id: &VersionId, path: &str, name: &str) -> Result<RemoteTensor> {
        let (entry, manifest) = self.file(id, path)?;
        let mut offset = 0u64;
        for (i, s) in manifest.segments.iter().enumerate() {
            if let Some(t) = s.tensor.as_ref().filter(|t| t.name == name) {
                let what = format!("{path}: tensor {name}");
                let dtype = t.dtype().ok_or_else(|| unreadable(&what, format!("dtype {}", t.dtype)))?;
                let rows = t.shape.first().copied().unwrap_or(1);
                let row_len = t.shape.iter().skip(1).try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d));
                if row_len.and_then(|r| r.checked_mul(rows)) != Some(s.len) {
                    return Err(unreadable(
                        what,
                        format!("{} bytes do not hold a {:?} of {:?}", s.len, dtype, t.shape),
                    ));
                }
                let (info, row_len) = (t.clone(), row_len.unwrap_or(0));
                let manifest_id = entry.manifest;
                let path = path.to_string();
                return Ok(RemoteTensor {
                    info,
                    manifest: Arc::new(manifest),
                    manifest_id,
                    path,
                    segment: i,
                    offset,
                    rows,
                    row_len,
                });
            }
            offset = offset.saturating_add(s.len);
        }
        Err(unreadable(format!("{path} of {}", id.short(12)), format!("no tensor named {name:?}")))
    }

    /// The `__metadata__` of the safetensors file `path` in version `id` (its header's blob
    /// downloaded, verified, parsed).
    pub fn metadata(&self, id: &VersionId, path: &str) -> Result<Option<BTreeMap<String, String>>> {
        let (entry, manifest) = self.file(id, path)?;
        let first =
            manifest.segments.first().filter(|s| s.tensor.is_none() && manifest.kind == FileFormat::Safetensors);
        let Some(first) = first else { return Err(unreadable(path, "not a safetensors file")) };
        let len = first.len.min(crate::safetensors::MAX_HEADER_LEN + 8);
        let repo = self.repo();
        fetch_blobs(&repo, &*self.remote, vec![manifest.location(first).0])?;
        let raw = StoredFileReader::open(&repo, &entry.manifest)?.read(&repo, 0, len)?;
        let header = crate::safetensors::parse_header(&raw, manifest.len)
            .map_err(|e| unreadable(path, format!("stored safetensors header: {e}")))?;
        Ok(header.metadata)
    }

    /// Downloads what reading rows `rows` of `t` needs, unless the cache holds it: the whole
    /// blob (with its chain) for all rows or a tensor in a bundle, else the blob's chunk index
    /// and the chunks holding those rows, of each blob of its chain. Nothing is allocated for
    /// the rows themselves: the caller does that once this succeeded. Returns the bytes
    /// `rows` take.
    pub fn fetch_rows(&self, t: &RemoteTensor, rows: Range<u64>) -> Result<u64> {
        let bytes = self.row_bytes(t, &rows)?;
        let len = bytes.end - bytes.start;
        let segment = &t.manifest.segments[t.segment];
        let (blob, _) = t.manifest.location(segment);
        let repo = self.repo();
        if len == 0 {
            return Ok(0);
        }
        let whole = len == t.len() || segment.blob.is_none();
        if !repo.store().contains(&blob) {
            if !whole {
                let members = self.start_chain(&repo, &blob, segment.len)?;
                let (chunk_size, chunk_count) = self.partial.layout(&blob)?;
                let chunks = chunks_of(&bytes, chunk_size, chunk_count);
                for id in &members {
                    self.partial.fill(&*self.remote, id, chunks.clone())?;
                }
                return Ok(len);
            }
            fetch_blobs(&repo, &*self.remote, vec![blob])?;
            self.partial.forget(&blob);
        }
        // The blob is what its header says (verified when it was stored); the manifest must
        // say the same before the caller allocates what it claims.
        let stored = repo.store().header(&blob)?.raw_len;
        let expected = match segment.bundle {
            Some(b) if segment.blob.is_none() => t.manifest.bundles.get(b as usize).map_or(0, |b| b.len),
            _ => segment.len,
        };
        if stored != expected {
            let reason = format!("a blob of {stored} bytes where its manifest says {expected}");
            return Err(crate::store::Error::Corrupt { id: blob, reason }.into());
        }
        if whole {
            self.note_if_whole(t);
        }
        Ok(len)
    }

    /// The blobs of the chain of `blob` (the manifest's word for its length: `len`) that the
    /// cache's store lacks, each with its partial copy started, `blob` first.
    fn start_chain(&self, repo: &Repo, blob: &ObjectId, len: u64) -> Result<Vec<ObjectId>> {
        let mut members = Vec::new();
        let mut next = Some(*blob);
        while let Some(id) = next.filter(|id| !repo.store().contains(id)) {
            if members.len() as u32 > MAX_CHAIN_DEPTH || members.contains(&id) {
                return Err(crate::store::Error::Corrupt { id: *blob, reason: "delta chain too long".into() }.into());
            }
            let header = self.partial.start(&*self.remote, &id, members.is_empty().then_some(len))?;
            members.push(id);
            next = header.reference;
        }
        Ok(members)
    }

    /// Reads rows `rows` of `t` into `out` (exactly their bytes) once [`Self::fetch_rows`]
    /// fetched them: all rows, or rows of a bundled tensor, through the file's segments (the
    /// blob verified against its id); other rows chunk by chunk through the blob's chain, the
    /// store's objects or the partial copies (each payload checked against its checksum).
    pub fn read_rows_into(&self, t: &RemoteTensor, rows: Range<u64>, out: &mut [u8]) -> Result<()> {
        let bytes = self.row_bytes(t, &rows)?;
        if out.len() as u64 != bytes.end - bytes.start {
            return Err(unreadable(&t.path, format!("{} bytes for rows {rows:?} of {}", out.len(), t.info.name)));
        }
        let segment = &t.manifest.segments[t.segment];
        let repo = self.repo();
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.end - bytes.start == t.len() || segment.blob.is_none() {
            let mut reader = StoredFileReader::open(&repo, &t.manifest_id)?;
            return reader.read_into(&repo, t.offset + bytes.start, out);
        }
        let (blob, _) = t.manifest.location(segment);
        let store = repo.store();
        let read = |id: &ObjectId| if store.contains(id) { store.raw(id) } else { self.partial.raw(id) };
        let decoded = Store::open_blob_with(&blob, &read).and_then(|chain| {
            if chain.len() != segment.len {
                let reason = format!("a blob of {} bytes where its manifest says {}", chain.len(), segment.len);
                return Err(crate::store::Error::Corrupt { id: blob, reason });
            }
            let decoder = chain.decoder()?;
            let chunks = chunks_of(&bytes, chain.chunk_size(), decoder.chunk_count());
            let span = decoder.byte_range(chunks.clone());
            let mut buf = vec![0u8; span.len()];
            decoder.decode_into_parallel(chunks, &mut buf)?;
            let from = (bytes.start - span.start as u64) as usize;
            out.copy_from_slice(&buf[from..from + out.len()]);
            Ok(())
        });
        if decoded.is_err() {
            // A damaged copy is fetched again next time; the remote's own damage fails again.
            for id in self.start_chain_ids(&repo, &blob) {
                self.partial.forget(&id);
            }
        }
        Ok(decoded?)
    }

    /// The ids of the chain of `blob` that have partial copies (for forgetting them).
    fn start_chain_ids(&self, repo: &Repo, blob: &ObjectId) -> Vec<ObjectId> {
        let mut ids = Vec::new();
        let mut next = Some(*blob);
        while let Some(id) = next.filter(|id| !repo.store().contains(id) && ids.len() as u32 <= MAX_CHAIN_DEPTH) {
            next = self.partial.raw(&id).ok().and_then(|raw| raw.header.reference);
            ids.push(id);
        }
        ids
    }

    /// The bytes of rows `rows` of `t`, within its blob's content (relative to the tensor).
    fn row_bytes(&self, t: &RemoteTensor, rows: &Range<u64>) -> Result<Range<u64>> {
        if rows.start > rows.end || rows.end > t.rows {
            let what = format!("{}: tensor {}", t.path, t.info.name);
            return Err(unreadable(what, format!("rows {rows:?} of a tensor of {} rows", t.rows)));
        }
        Ok(rows.start * t.row_len..rows.end * t.row_len)
    }

    /// Notes the file of `t` as read if the cache now holds every blob of it.
    fn note_if_whole(&self, t: &RemoteTensor) {
        let repo = self.repo();
        if t.manifest.blobs().all(|b| repo.store().contains(&b)) {
            self.cache.note_file(&t.path, t.manifest_id);
        }
    }

    /// Writes the files of `rev` (all, or those at `paths` and under them) as
    /// [`CheckoutOptions`] say into `options.output` (required), downloading only what they
    /// need: each file's manifest and its blobs, or with `options.tensor` the safetensors
    /// header and the matching tensors' blobs. The checkout itself is the repository's
    /// (verified, staged, all or nothing), run on the cache.
    pub fn checkout(&self, rev: &str, paths: &[String], options: &CheckoutOptions) -> Result<CheckoutSummary> {
        let Some(output) = options.output.as_ref() else {
            return Err(unreadable("checkout from a remote", "an output directory is needed"));
        };
        let id = self.resolve(rev)?;
        let version = self.version(&id)?;
        let mut selected: Vec<&FileEntry> = Vec::new();
        for p in paths {
            let files = version.files_at(p.trim_end_matches('/'));
            if files.is_empty() {
                return Err(RepoError::NotInVersion { path: p.clone(), version: id }.into());
            }
            for f in files {
                if !selected.iter().any(|s| s.path == f.path) {
                    selected.push(f);
                }
            }
        }
        if paths.is_empty() {
            selected = version.files.iter().collect();
        }
        let filter = options.tensor.as_deref().map(TensorFilter::new);
        let repo = self.repo();
        for entry in &selected {
            let (_, manifest) = self.file(&id, &entry.path)?;
            let blobs: Vec<ObjectId> = match &filter {
                None => manifest.blobs().collect(),
                Some(_) if manifest.kind != FileFormat::Safetensors => continue,
                Some(f) => {
                    let wanted = |s: &crate::repo::Segment| s.tensor.as_ref().is_none_or(|t| f.matches(&t.name));
                    manifest.segments.iter().filter(|s| wanted(s)).map(|s| manifest.location(s).0).collect()
                }
            };
            fetch_blobs(&repo, &*self.remote, blobs)?;
            if manifest.blobs().all(|b| repo.store().contains(&b)) {
                self.cache.note_file(&entry.path, entry.manifest);
            }
        }
        let files: Vec<PathBuf> = selected.iter().map(|f| repo.root().join(&f.path)).collect();
        let options = CheckoutOptions { files: Some(files), output: Some(output.clone()), ..options.clone() };
        Ok(repo.checkout_with(&id.to_hex(), &options)?)
    }

    /// Releases the cache: with `prune`, a kept cache first deletes everything but the newest
    /// file of each path read whole ([`RankCache::prune`]).
    pub fn close(self, prune: bool) -> Result<()> {
        if prune {
            self.cache.prune()?;
        }
        Ok(())
    }
}

/// The chunks (of `chunk_size` bytes, `count` in all) holding `bytes`.
fn chunks_of(bytes: &Range<u64>, chunk_size: usize, count: usize) -> Range<usize> {
    let size = chunk_size.max(1) as u64;
    let first = usize::try_from(bytes.start / size).unwrap_or(usize::MAX).min(count);
    let end = usize::try_from(bytes.end.div_ceil(size)).unwrap_or(usize::MAX).min(count);
    first..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_holding_a_byte_range() {
        assert_eq!(chunks_of(&(0..10), 4, 3), 0..3);
        assert_eq!(chunks_of(&(4..8), 4, 3), 1..2);
        assert_eq!(chunks_of(&(5..9), 4, 3), 1..3);
        assert_eq!(chunks_of(&(3..3), 4, 3), 0..1);
        assert_eq!(chunks_of(&(0..100), 4, 3), 0..3);
    }
}
