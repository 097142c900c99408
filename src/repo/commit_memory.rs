//! Commits of files whose bytes are in memory: the Python package (`python/`) commits a dict of
//! tensors as a safetensors file without writing it to disk first.
//!
//! The bytes live in a [`MemoryFile`]: an anonymous memory file (`memfd_create`), filled by the
//! caller, then sealed against writes and size changes (unless kept for the next capture:
//! [`MemoryFile::keep_for_reuse`]). It is mapped and committed exactly like
//! a file on disk ([`Repo::commit_sources`] feeds it to the same commit path as
//! [`Repo::commit`]: same segments, deltas, dedup, bundles, manifest and file hash), so nothing
//! below this module knows the difference. A memory file rather than a heap buffer because the
//! commit pipeline reads inputs through [`crate::mmap::Map`], which drops pages it has coded
//! (`MADV_DONTNEED`): on a private anonymous buffer that would zero them, on a memory file it
//! only drops them from the resident set, like a mapped file on disk.
//!
//! [`safetensors_image`] lays out a safetensors file for a set of tensors byte-identically to the
//! official writer (`safetensors.numpy.save_file`, `safetensors.torch.save_file`, the
//! `safetensors` crate's `serialize`): tensors sorted by dtype, largest alignment first, then by
//! name; the header from [`crate::safetensors::write_header`].

use super::bundle::BundleCache;
use super::commit::Onto;
use super::cut::{self, Input, Rules};
use super::model::{Manifest, TensorRef};
use super::{CommitOptions, Error, Repo, RepoPath, Result, VersionId};
use crate::safetensors;
use crate::Dtype;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// An anonymous, growable-until-sealed file in memory (`memfd_create`), holding the bytes of one
/// file to commit.
#[derive(Debug)]
pub struct MemoryFile {
    file: File,
    len: u64,
    /// Whether a commit seals it (the default); a file kept for reuse ([`Self::keep_for_reuse`])
    /// is not sealed, so that its pages can take the next capture.
    seal: bool,
}

impl MemoryFile {
    /// Creates a memory file of `len` zero bytes. `name` only shows in `/proc/PID/fd` (debugging).
    pub fn new(name: &str, len: u64) -> std::io::Result<MemoryFile> {
        let c_name = std::ffi::CString::new(name.replace('\0', "_")).unwrap_or_default();
        // SAFETY: `c_name` is a valid NUL-terminated string that outlives the call; the flags
        // are plain integers. The returned descriptor is checked and then owned by `File`.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new, valid descriptor that nothing else owns.
        #[allow(unsafe_code)]
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(len)?;
        Ok(MemoryFile { file, len, seal: true })
    }

    /// A second handle to the same memory, kept by the caller to write the next capture into
    /// after this one's commit has finished ([`Self::reuse`]): writing into pages that exist
    /// costs about a third of writing into new ones (no page allocation and zeroing), which is
    /// most of a background commit's stall. The commit then does not seal the file, and the
    /// memory stays allocated between commits. The caller must not write through the kept
    /// handle before the commit returns (a change would fail it: `FileChanged`).
    pub fn keep_for_reuse(&mut self) -> std::io::Result<MemoryFile> {
        self.seal = false;
        Ok(MemoryFile { file: self.file.try_clone()?, len: self.len, seal: false })
    }

    /// This memory resized to `len` bytes (its pages up to the shorter length kept, with their
    /// old contents: the caller overwrites them), for a new capture.
    pub fn reuse(mut self, len: u64) -> std::io::Result<MemoryFile> {
        self.file.set_len(len)?;
        self.len = len;
        self.seal = true;
        Ok(self)
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `bytes` at `offset`; refused past the end (the length is fixed at creation).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let end = offset.checked_add(bytes.len() as u64);
        if end.is_none_or(|e| e > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("write of {} bytes at {offset} past the end ({} bytes)", bytes.len(), self.len),
            ));
        }
        self.file.write_all_at(bytes, offset)
    }

    /// The descriptor, for writers that fill the file themselves (Python's `os.pwrite`, which
    /// copies straight from a tensor's buffer). Valid while `self` lives.
    pub fn raw_fd(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
    }

    /// Forbids any further write and size change (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK`),
    /// so what the commit maps is what was captured.
    ///
    /// `F_SEAL_WRITE` fails with `EBUSY` while a page of the file has an extra reference, and
    /// the kernel's wait for such references (`memfd_wait_for_pins`) gives up after about 150 ms:
    /// on a loaded machine a page just written by `pwrite` can still sit in another CPU's LRU
    /// batch that long (seen in CI-like runs under load). Nothing else can write the file (the
    /// caller captured it and holds no writable mapping when sealing is asked), so EBUSY is
    /// transient here and retried for up to about 5 s before it is reported.
    fn seal(&self) -> std::io::Result<()> {
        let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        let mut pause = std::time::Duration::from_millis(5);
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            // SAFETY: fcntl on a descriptor we own, with an integer argument.
            #[allow(unsafe_code)]
            let r = unsafe { libc::fcntl(self.raw_fd(), libc::F_ADD_SEALS, seals) };
            if r >= 0 {
                return Ok(());
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EBUSY) || std::time::Instant::now() >= give_up {
                return Err(error);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
        }
    }
}

/// One file of a [`Repo::commit_sources`] commit.
#[derive(Debug)]
pub enum CommitSource {
    /// A file on disk (absolute, or relative to the repository root), as [`Repo::commit`] takes.
    Disk(PathBuf),
    /// A file anywhere on disk, committed under `path` (repository-relative, `/`-separated): a
    /// trainer's `checkpoint-500/optimizer.pt` as `optimizer.pt`.
    DiskAs {
        /// Where the file goes in the version.
        path: String,
        /// The file.
        disk: PathBuf,
    },
    /// Bytes in memory, committed under `path` (repository-relative, `/`-separated).
    Memory {
        /// Where the file goes in the version.
        path: String,
        /// Its bytes.
        file: MemoryFile,
    },
    /// A file on disk opened when the commit was asked for ([`OpenedFile::open`]), committed
    /// under `path` (repository-relative, `/`-separated): what a background commit of a path
    /// reads, whatever happens to the name meanwhile.
    Opened {
        /// Where the file goes in the version.
        path: String,
        /// The open file.
        file: OpenedFile,
    },
}

/// A file on disk, opened (and its size and modification time taken) when a commit is asked
/// for, to be read later by a commit on another thread. The open descriptor keeps the file's
/// bytes however the name changes: deleted (a trainer's `save_total_limit`), or replaced by a
/// rename (an atomic save). A rewrite of the same file in place (`open(..., "wb")`) after it was
/// opened changes its size or modification time, and the commit fails with an error saying so:
/// what it would read is no longer what was asked for.
#[derive(Debug)]
pub struct OpenedFile {
    file: File,
    disk: PathBuf,
    /// The canonical path when opened: whether it is the working-tree file of its path.
    canonical: Option<PathBuf>,
    /// Size and modification time when opened. (Not the change time, which deleting or renaming
    /// the file changes.)
    stamp: (u64, i64, i64),
}

impl OpenedFile {
    /// Opens `disk` for a later commit: a regular file (a named pipe, socket, device or
    /// directory is refused, naming it).
    pub fn open(disk: &Path) -> Result<OpenedFile> {
        let (file, metadata) = cut::open_regular(disk, Rules::Commit)?;
        Ok(OpenedFile {
            file,
            disk: disk.to_path_buf(),
            canonical: disk.canonicalize().ok(),
            stamp: stamp_of(&metadata),
        })
    }
}

impl OpenedFile {
    /// Whether its size and modification time are still those it was opened with: a commit that
    /// saw it change saw it deleted, renamed (or its mode changed), which changes the change
    /// time the commit compares, not its bytes.
    fn only_renamed(&self) -> bool {
        self.file.metadata().is_ok_and(|m| stamp_of(&m) == self.stamp)
    }
}

/// Size and modification time of `metadata`.
fn stamp_of(metadata: &std::fs::Metadata) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (metadata.len(), metadata.mtime(), metadata.mtime_nsec())
}

/// A tensor of a safetensors file to lay out with [`safetensors_image`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
}

/// A safetensors file laid out in a [`MemoryFile`]: the header written, the tensors' bytes still
/// to be written at `ranges`.
#[derive(Debug)]
pub struct SafetensorsImage {
    /// The file, `header` + every tensor's bytes long.
    pub file: MemoryFile,
    /// Where each tensor's bytes go, in the order the tensors were given.
    pub ranges: Vec<Range<u64>>,
}

/// Lays out a safetensors file of `tensors` (and `metadata`) in a new [`MemoryFile`], writes the
/// header and returns where each tensor's bytes go. The layout is the official writer's, so the
/// file, once filled, is byte-identical to what `safetensors.numpy.save_file` or
/// `safetensors.torch.save_file` writes for the same dict, except when `metadata` has two keys
/// or more: the official writer emits those in hash-map order, which varies between runs.
///
/// Errors: as [`safetensors::write_header`] (duplicate or reserved names, sizes beyond 2^64,
/// a header over 100 MB), naming `path`; and I/O errors creating the memory file.
pub fn safetensors_image(
    path: &str,
    tensors: &[TensorSpec],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<SafetensorsImage> {
    safetensors_image_in(path, tensors, metadata, None)
}

/// [`safetensors_image`] in `reuse` (resized; see [`MemoryFile::reuse`]) when given, else in a
/// new memory file.
pub fn safetensors_image_in(
    path: &str,
    tensors: &[TensorSpec],
    metadata: Option<&BTreeMap<String, String>>,
    reuse: Option<MemoryFile>,
) -> Result<SafetensorsImage> {
    // The official order: dtype descending (its enum lists dtypes by increasing alignment, in the
    // same order as ckpt's dtype codes), then name (byte order).
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&tensors[a], &tensors[b]);
        (b.dtype as u8).cmp(&(a.dtype as u8)).then_with(|| a.name.cmp(&b.name))
    });
    let sorted: Vec<(String, Dtype, Vec<u64>)> =
        order.iter().map(|&i| (tensors[i].name.clone(), tensors[i].dtype, tensors[i].shape.clone())).collect();
    let header = safetensors::write_header(&sorted, metadata)
        .map_err(|source| Error::Safetensors { path: path.to_string(), source })?;
    let mut ranges = vec![0..0; tensors.len()];
    let mut at = header.len() as u64;
    for (&i, (_, dtype, shape)) in order.iter().zip(&sorted) {
        // `write_header` checked that every size and their sum fit in u64.
        let len = shape.iter().product::<u64>() * dtype.size() as u64;
        ranges[i] = at..at + len;
        at += len;
    }
    let io = |source| Error::Io { action: "creating a memory file for", path: PathBuf::from(path), source };
    let file = match reuse {
        Some(f) => f.reuse(at),
        None => MemoryFile::new(path, at),
    }
    .map_err(io)?;
    file.write_at(0, &header).map_err(io)?;
    Ok(SafetensorsImage { file, ranges })
}

impl Repo {
    /// [`Repo::commit`] of files on disk and files in memory together: one version on top of
    /// `HEAD` holding them all and, unless `exact`, every file of the parent not named again and
    /// not `rm`-ed (with `exact`, only these files). A memory file is committed exactly as the
    /// equal file on disk would be (same manifest and file hash, same deltas and dedup); it is
    /// sealed first, so its bytes cannot change any more. Paths may not repeat.
    ///
    /// The writer lock is taken once every input is open and parsed, for the write itself: a
    /// bad path or file fails before it, and nothing is written. An [`CommitSource::Opened`]
    /// file deleted or renamed while it is read (which changes its change time, not its bytes)
    /// is read again, up to twice.
    pub fn commit_sources(
        &self,
        sources: Vec<CommitSource>,
        message: &str,
        exact: bool,
        options: &CommitOptions,
    ) -> Result<VersionId> {
        // Each source checked (its path parsed, a memory file sealed), from which the commit's
        // input is made: once, or again when an opened file was renamed while it was read.
        let mut seen = HashSet::new();
        let mut prepared = Vec::with_capacity(sources.len());
        for source in sources {
            let path = match &source {
                CommitSource::Disk(p) => self.repo_path(p)?,
                CommitSource::DiskAs { path, .. } | CommitSource::Opened { path, .. } => parse_path(path)?,
                CommitSource::Memory { path, file } => {
                    let repo_path = parse_path(path)?;
                    if file.seal {
                        file.seal().map_err(|source| Error::Io {
                            action: "sealing the memory file of",
                            path: PathBuf::from(path),
                            source,
                        })?;
                    }
                    repo_path
                }
            };
            if !seen.insert(path.clone()) {
                return Err(Error::InvalidPath {
                    path: PathBuf::from(path.as_str()),
                    reason: "named twice in one commit".into(),
                });
            }
            prepared.push((path, source));
        }
        let mut inputs = self.inputs_of(&prepared)?;
        let _lock = self.lock()?;
        // Every other file of the parent is dropped with `exact`, through the pending removals
        // the commit applies (and clears); restored if the commit fails.
        let before = if exact { Some(self.pending_removals()?) } else { None };
        if let Some(before) = &before {
            let mut removals = before.clone();
            if let Some(parent) = self.refs.head_version()? {
                let parent = self.version(&parent)?;
                let named: HashSet<&str> = prepared.iter().map(|(p, _)| p.as_str()).collect();
                for f in &parent.files {
                    if !named.contains(f.path.as_str()) && !removals.contains(&f.path) {
                        removals.push(f.path.clone());
                    }
                }
            }
            self.write_removals(&removals)?;
        }
        let mut attempts = 1;
        let committed = loop {
            let committed = self.commit_inputs(inputs, Onto::Head { dropped: &[] }, message, options);
            let renamed = match &committed {
                Err(Error::FileChanged { path }) => prepared.iter().any(|(p, source)| {
                    p.as_str() == path && matches!(source, CommitSource::Opened { file, .. } if file.only_renamed())
                }),
                _ => false,
            };
            if !renamed || attempts == 3 {
                break committed;
            }
            attempts += 1;
            inputs = match self.inputs_of(&prepared) {
                Ok(inputs) => inputs,
                Err(e) => break Err(e),
            };
        };
        if let (Err(_), Some(before)) = (&committed, &before) {
            let _ = self.write_removals(before);
        }
        committed
    }

    /// The commit's inputs, opened (a path), mapped and parsed.
    fn inputs_of(&self, prepared: &[(RepoPath, CommitSource)]) -> Result<Vec<Input>> {
        prepared.iter().map(|(path, source)| self.input_of(path, source)).collect()
    }

    fn input_of(&self, path: &RepoPath, source: &CommitSource) -> Result<Input> {
        let (disk, file, metadata, in_working_tree) = match source {
            CommitSource::Disk(disk) => return self.read_input(disk),
            CommitSource::DiskAs { disk, .. } => {
                let (file, metadata) = cut::open_regular(disk, Rules::Commit)?;
                let in_working_tree = disk.canonicalize().ok() == Some(path.under(self.root()));
                (disk.clone(), file, metadata, in_working_tree)
            }
            CommitSource::Memory { file, .. } => {
                let io = |source| Error::Io { action: "reading", path: PathBuf::from(path.as_str()), source };
                let file = file.file.try_clone().map_err(io)?;
                let metadata = file.metadata().map_err(io)?;
                // Not a working-tree file: `status` has no stat record to keep for it.
                (PathBuf::from(path.as_str()), file, metadata, false)
            }
            CommitSource::Opened { file, .. } => {
                let io = |source| Error::Io { action: "reading", path: file.disk.clone(), source };
                let handle = file.file.try_clone().map_err(io)?;
                let metadata = handle.metadata().map_err(io)?;
                if stamp_of(&metadata) != file.stamp {
                    return Err(Error::InvalidPath {
                        path: file.disk.clone(),
                        reason: "rewritten in place after the commit was asked for (its size or modification \
                                 time changed); not committed, as what is there now is not what was handed over"
                            .into(),
                    });
                }
                let in_working_tree = file.canonical.as_ref() == Some(&path.under(self.root()));
                (file.disk.clone(), handle, metadata, in_working_tree)
            }
        };
        // Bytes from memory have no directory to find a `.distcp` file's `.metadata` in.
        let disk_is_real = !matches!(source, CommitSource::Memory { .. });
        let mut input = Input::from_file(&disk, path.clone(), file, metadata, Rules::Commit, disk_is_real, None)?;
        input.in_working_tree = in_working_tree;
        Ok(input)
    }

    /// The bytes `path` holds in the version `rev` resolves to, for a file of at most `limit`
    /// bytes: small files (a JSON state, a config) read without a checkout. Larger files are
    /// refused (check them out instead).
    pub fn read_file_bytes(&self, rev: &str, path: &str, limit: u64) -> Result<Vec<u8>> {
        let id = self.resolve(rev)?;
        let version = self.version(&id)?;
        let entry = version.file(path).ok_or_else(|| Error::NotInVersion { path: path.to_string(), version: id })?;
        if entry.len > limit {
            return Err(Error::InvalidPath {
                path: PathBuf::from(path),
                reason: format!("{} bytes, over the {limit} bytes read into memory; check it out instead", entry.len),
            });
        }
        let dir =
            tempfile::Builder::new().prefix("read-").tempdir_in(self.ckpt_dir().join("tmp")).map_err(|source| {
                Error::Io { action: "creating a directory in", path: self.ckpt_dir().join("tmp"), source }
            })?;
        let dest = dir.path().join("file");
        self.write_stored_file(&entry.manifest, entry.len, &entry.hash, &dest)?;
        std::fs::read(&dest).map_err(|source| Error::Io { action: "reading", path: dest.clone(), source })
    }
}

/// Reads the tensors of one stored file straight from the store, without writing the file
/// ([`Repo::tensor_reader`]). Each tensor is decoded through its delta chain and checked against
/// its id (a bundled one: its bundle, decoded whole once and checked against the bundle's id).
pub struct TensorReader<'r> {
    repo: &'r Repo,
    manifest: Manifest,
    /// Indices in `manifest.segments` of the tensor segments, in file order.
    tensors: Vec<usize>,
    bundles: BundleCache,
}

impl std::fmt::Debug for TensorReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorReader").field("tensors", &self.tensors.len()).finish()
    }
}

impl TensorReader<'_> {
    /// The file's tensors (safetensors tensors, or `torch.save` storages), in file order.
    pub fn tensors(&self) -> Vec<&TensorRef> {
        self.tensors.iter().filter_map(|&s| self.manifest.segments[s].tensor.as_ref()).collect()
    }

    /// The byte length of tensor `i`.
    pub fn len_of(&self, i: usize) -> Option<u64> {
        Some(self.manifest.segments[*self.tensors.get(i)?].len)
    }

    /// Decodes tensor `i` (an index into [`Self::tensors`]) into `out`, which must be exactly
    /// its length.
    pub fn read_into(&mut self, i: usize, out: &mut [u8]) -> Result<()> {
        let segment = self.tensors.get(i).map(|&s| &self.manifest.segments[s]);
        let Some(segment) = segment else {
            return Err(Error::InvalidPath {
                path: PathBuf::from(format!("tensor #{i}")),
                reason: "no such tensor".into(),
            });
        };
        let name = segment.tensor.as_ref().map_or("", |t| t.name.as_str());
        if out.len() as u64 != segment.len {
            return Err(Error::InvalidPath {
                path: PathBuf::from(name),
                reason: format!("buffer of {} bytes for a tensor of {}", out.len(), segment.len),
            });
        }
        if let Some(bytes) = self.bundles.segment(self.repo, &self.manifest, segment)? {
            out.copy_from_slice(bytes);
            return Ok(());
        }
        let (blob, _) = self.manifest.location(segment);
        let chain = self.repo.store.open_blob(&blob)?;
        let mut cursor = std::io::Cursor::new(out);
        chain.copy_to(&mut cursor)?;
        Ok(())
    }
}

/// `path` as a repository path, or an error naming it.
fn parse_path(path: &str) -> Result<RepoPath> {
    RepoPath::parse(path).map_err(|reason| Error::InvalidPath { path: PathBuf::from(path), reason: reason.into() })
}

impl Repo {
    /// A reader of the tensors of `path` in the version `rev` resolves to.
    pub fn tensor_reader(&self, rev: &str, path: &str) -> Result<TensorReader<'_>> {
        let id = self.resolve(rev)?;
        let version = self.version(&id)?;
        let entry = version.file(path).ok_or_else(|| Error::NotInVersion { path: path.to_string(), version: id })?;
        let manifest = self.manifest(&entry.manifest)?;
        let tensors = (0..manifest.segments.len()).filter(|&s| manifest.segments[s].tensor.is_some()).collect();
        Ok(TensorReader { repo: self, manifest, tensors, bundles: BundleCache::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
        TensorSpec { name: name.into(), dtype, shape: shape.to_vec() }
    }

    /// Fills `image` with `data[i]` for tensor i.
    fn fill(image: &SafetensorsImage, data: &[Vec<u8>]) {
        for (r, d) in image.ranges.iter().zip(data) {
            assert_eq!(r.end - r.start, d.len() as u64);
            image.file.write_at(r.start, d).unwrap();
        }
    }

    fn read_all(f: &MemoryFile) -> Vec<u8> {
        let mut out = vec![0; f.len() as usize];
        f.file.read_exact_at(&mut out, 0).unwrap();
        out
    }

    #[test]
    fn image_matches_the_safetensors_crate_byte_for_byte() {
        use ::safetensors::tensor::{serialize, TensorView};
        let specs = vec![
            spec("b.weight", Dtype::F32, &[3, 5]),
            spec("a", Dtype::Bf16, &[7]),
            spec("step", Dtype::I64, &[]),
            spec("mask", Dtype::Bool, &[2, 3]),
            spec("a.bias", Dtype::F32, &[1]),
            spec("empty", Dtype::F16, &[0, 4]),
        ];
        let data: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n = s.shape.iter().product::<u64>() as usize * s.dtype.size();
                (0..n).map(|j| (i * 31 + j * 7) as u8 % if s.dtype == Dtype::Bool { 2 } else { 255 }).collect()
            })
            .collect();
        let mut metadata = BTreeMap::new();
        metadata.insert("format".to_string(), "pt".to_string());
        for meta in [None, Some(&metadata)] {
            let image = safetensors_image("x.safetensors", &specs, meta).unwrap();
            fill(&image, &data);
            let views: Vec<(String, TensorView<'_>)> = specs
                .iter()
                .zip(&data)
                .map(|(s, d)| {
                    let dtype = match s.dtype {
                        Dtype::F32 => ::safetensors::Dtype::F32,
                        Dtype::Bf16 => ::safetensors::Dtype::BF16,
                        Dtype::I64 => ::safetensors::Dtype::I64,
                        Dtype::Bool => ::safetensors::Dtype::BOOL,
                        Dtype::F16 => ::safetensors::Dtype::F16,
                        _ => unreachable!(),
                    };
                    let shape: Vec<usize> = s.shape.iter().map(|&d| d as usize).collect();
                    (s.name.clone(), TensorView::new(dtype, shape, d).unwrap())
                })
                .collect();
            let info = meta.map(|m| m.clone().into_iter().collect());
            let expected = serialize(views, info).unwrap();
            assert_eq!(read_all(&image.file), expected);
        }
    }

    #[test]
    fn duplicate_names_are_refused_naming_the_file() {
        let specs = vec![spec("w", Dtype::F32, &[1]), spec("w", Dtype::F16, &[1])];
        let e = safetensors_image("m.safetensors", &specs, None).unwrap_err();
        assert!(e.to_string().starts_with("m.safetensors: invalid safetensors file"), "{e}");
    }

    #[test]
    fn a_memory_file_is_committed_like_the_same_file_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let specs: Vec<TensorSpec> =
            (0..6).map(|i| spec(&format!("layer{i}.weight"), Dtype::F32, &[64, 50 + i])).collect();
        let data: Vec<Vec<u8>> = specs
            .iter()
            .map(|s| {
                let n = s.shape.iter().product::<u64>() as usize;
                (0..n).flat_map(|j| ((j as f32).sin() * 0.02).to_le_bytes()).collect()
            })
            .collect();
        // A few small tensors too, so that bundles are part of the comparison.
        let mut specs = specs;
        let mut data = data;
        for i in 0..4 {
            specs.push(spec(&format!("norm{i}"), Dtype::F32, &[8]));
            data.push(vec![i as u8; 32]);
        }
        let image = safetensors_image("a.safetensors", &specs, None).unwrap();
        fill(&image, &data);
        let bytes = read_all(&image.file);
        std::fs::write(dir.path().join("b.safetensors"), &bytes).unwrap();
        let id = repo
            .commit_sources(
                vec![
                    CommitSource::Memory { path: "a.safetensors".into(), file: image.file },
                    CommitSource::Disk("b.safetensors".into()),
                ],
                "both",
                false,
                &CommitOptions::default(),
            )
            .unwrap();
        let version = repo.version(&id).unwrap();
        let (a, b) = (version.file("a.safetensors").unwrap(), version.file("b.safetensors").unwrap());
        assert_eq!((a.manifest, a.hash, a.len), (b.manifest, b.hash, b.len));
        // And it checks out as that file.
        let out = tempfile::tempdir().unwrap();
        repo.checkout_with(
            "HEAD",
            &super::super::CheckoutOptions { output: Some(out.path().to_path_buf()), ..Default::default() },
        )
        .unwrap();
        assert_eq!(std::fs::read(out.path().join("a.safetensors")).unwrap(), bytes);
        assert_eq!(repo.read_file_bytes("HEAD", "a.safetensors", 1 << 20).unwrap(), bytes);
        assert!(repo.read_file_bytes("HEAD", "a.safetensors", 100).is_err());
    }

    #[test]
    fn a_memory_file_that_is_not_safetensors_under_that_name_is_refused_and_nothing_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let file = MemoryFile::new("bad", 16).unwrap();
        file.write_at(0, &[0xff; 16]).unwrap();
        let e = repo
            .commit_sources(
                vec![CommitSource::Memory { path: "bad.safetensors".into(), file }],
                "bad",
                false,
                &CommitOptions::default(),
            )
            .unwrap_err();
        assert!(e.to_string().starts_with("bad.safetensors: invalid safetensors file"), "{e}");
        assert!(repo.head_version().unwrap().is_none());
        let e = MemoryFile::new("short", 4).unwrap().write_at(2, &[0; 4]).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
    }

    #[test]
    fn exact_commits_hold_only_their_files_and_tensors_read_back_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let specs = vec![spec("w", Dtype::F32, &[300, 7]), spec("b", Dtype::F32, &[3]), spec("c", Dtype::F32, &[5])];
        let data: Vec<Vec<u8>> = vec![(0..8400).map(|i| (i % 251) as u8).collect(), vec![1; 12], vec![2; 20]];
        let mut versions = Vec::new();
        for step in 0..2u8 {
            let folder = outside.path().join(format!("checkpoint-{step}"));
            std::fs::create_dir(&folder).unwrap();
            std::fs::write(folder.join("state.json"), format!("{{\"step\": {step}}}")).unwrap();
            let image = safetensors_image("model.safetensors", &specs, None).unwrap();
            fill(&image, &data);
            let mut sources = vec![
                CommitSource::Memory { path: "model.safetensors".into(), file: image.file },
                CommitSource::DiskAs { path: "state.json".into(), disk: folder.join("state.json") },
            ];
            if step == 0 {
                std::fs::write(folder.join("extra.txt"), "only in step 0").unwrap();
                sources.push(CommitSource::DiskAs { path: "extra.txt".into(), disk: folder.join("extra.txt") });
            }
            versions
                .push(repo.commit_sources(sources, &format!("step {step}"), true, &CommitOptions::default()).unwrap());
        }
        let files = |id| repo.version(&id).unwrap().files.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        assert_eq!(files(versions[0]), ["extra.txt", "model.safetensors", "state.json"]);
        assert_eq!(files(versions[1]), ["model.safetensors", "state.json"]);
        assert_eq!(repo.read_file_bytes("HEAD~1", "state.json", 100).unwrap(), b"{\"step\": 0}");
        let mut reader = repo.tensor_reader("HEAD", "model.safetensors").unwrap();
        let names: Vec<String> = reader.tensors().iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, ["b", "c", "w"]);
        for (i, want) in [(0, &data[1]), (1, &data[2]), (2, &data[0])] {
            let mut out = vec![0; reader.len_of(i).unwrap() as usize];
            reader.read_into(i, &mut out).unwrap();
            assert_eq!(&out, want);
        }
        assert!(reader.read_into(0, &mut [0; 3]).is_err());
        assert!(reader.read_into(9, &mut []).is_err());
        // A failed exact commit leaves the pending removals as they were.
        let e = repo
            .commit_sources(
                vec![CommitSource::DiskAs { path: "x".into(), disk: outside.path().join("missing") }],
                "missing",
                true,
                &CommitOptions::default(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(repo.pending_removals().unwrap().is_empty());
    }

    #[test]
    fn an_opened_file_is_committed_as_it_was_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let at = |name: &str| outside.path().join(name);
        for (name, text) in [("deleted", "first"), ("replaced", "second"), ("rewritten", "third")] {
            std::fs::write(at(name), text).unwrap();
        }
        let opened =
            |name: &str| CommitSource::Opened { path: name.into(), file: OpenedFile::open(&at(name)).unwrap() };
        let (deleted, replaced, rewritten) = (opened("deleted"), opened("replaced"), opened("rewritten"));
        std::fs::remove_file(at("deleted")).unwrap();
        std::fs::write(at("new"), "other bytes").unwrap();
        std::fs::rename(at("new"), at("replaced")).unwrap();
        std::fs::write(at("rewritten"), "in place, longer").unwrap();
        let id = repo.commit_sources(vec![deleted, replaced], "opened", false, &CommitOptions::default()).unwrap();
        assert_eq!(repo.read_file_bytes("HEAD", "deleted", 100).unwrap(), b"first");
        assert_eq!(repo.read_file_bytes("HEAD", "replaced", 100).unwrap(), b"second");
        let e = repo.commit_sources(vec![rewritten], "rewritten", false, &CommitOptions::default()).unwrap_err();
        assert!(e.to_string().contains("rewritten in place after the commit was asked for"), "{e}");
        assert_eq!(repo.head_version().unwrap(), Some(id));
        // Refused when opened: nothing to open, or not a regular file.
        assert!(OpenedFile::open(&at("deleted")).unwrap_err().to_string().contains("No such file"));
        assert!(OpenedFile::open(outside.path()).unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn memory_kept_for_reuse_takes_the_next_capture() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let specs = vec![spec("w", Dtype::F32, &[1000])];
        let mut kept = None;
        let mut expected = Vec::new();
        for step in 0..3u8 {
            let data = vec![vec![step; 4000]];
            let mut image = safetensors_image_in("m.safetensors", &specs, None, kept.take()).unwrap();
            fill(&image, &data);
            expected.push(read_all(&image.file));
            kept = Some(image.file.keep_for_reuse().unwrap());
            let source = CommitSource::Memory { path: "m.safetensors".into(), file: image.file };
            repo.commit_sources(vec![source], &format!("step {step}"), false, &CommitOptions::default()).unwrap();
        }
        // A smaller capture in the same memory: resized, not left with the old tail.
        let small = vec![spec("w", Dtype::F32, &[10])];
        let image = safetensors_image_in("m.safetensors", &small, None, kept.take()).unwrap();
        fill(&image, &[vec![9; 40]]);
        assert_eq!(image.file.len(), read_all(&image.file).len() as u64);
        let source = CommitSource::Memory { path: "m.safetensors".into(), file: image.file };
        repo.commit_sources(vec![source], "small", false, &CommitOptions::default()).unwrap();
        for (i, bytes) in expected.iter().enumerate() {
            let mut reader = repo.tensor_reader(&format!("HEAD~{}", 3 - i), "m.safetensors").unwrap();
            let mut out = vec![0; 4000];
            reader.read_into(0, &mut out).unwrap();
            assert_eq!(out, bytes[bytes.len() - 4000..]);
        }
    }
}
