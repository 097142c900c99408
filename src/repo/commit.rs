//! `commit`: files → blobs (deduplicated, delta-coded where it pays) → manifests → version →
//! ref. All inputs are parsed before anything is written, so an invalid file changes nothing.

use super::model::{FileEntry, FileFormat, Manifest, Segment, TensorRef, Version, MODEL_FORMAT};
use super::{now_secs, DeltaPolicy, Error, Head, RefKind, Repo, RepoPath, Result, VersionId};
use crate::index::StatRecord;
use crate::mmap::{self, Map};
use crate::object_id::ObjectId;
use crate::safetensors;
use crate::store::{self, DeltaOutcome, ObjectKind};
use crate::Dtype;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;

/// Settings of one commit. `Default` takes everything from the repository config.
#[derive(Clone, Debug, Default)]
pub struct CommitOptions {
    /// Commit time in seconds since the Unix epoch (default: now).
    pub time: Option<i64>,
    /// Overrides the config's `delta_policy`.
    pub delta_policy: Option<DeltaPolicy>,
    /// Overrides the config's `base_every`.
    pub base_every: Option<u32>,
}

/// A file to commit, mapped and parsed.
struct Input {
    path: RepoPath,
    map: Map,
    header: Option<safetensors::Header>,
    metadata: std::fs::Metadata,
}

/// One planned segment: byte range, dtype, tensor identity.
struct Planned {
    range: Range<u64>,
    dtype: Option<Dtype>,
    tensor: Option<TensorRef>,
}

/// Counts for the version record.
#[derive(Default)]
struct Tally {
    stored_bytes: u64,
}

impl Repo {
    /// Commits `paths` (absolute, or relative to the repository root) as a new version on top
    /// of `HEAD`, with every file of the parent version that is not named again and not
    /// `rm`-ed. Returns the new version's id.
    ///
    /// Files named `*.safetensors` must be valid safetensors; other files are stored tensor by
    /// tensor if they parse as safetensors and as opaque bytes otherwise.
    pub fn commit<P: AsRef<Path>>(&self, paths: &[P], message: &str, options: &CommitOptions) -> Result<VersionId> {
        let _lock = self.lock()?;
        let policy = options.delta_policy.unwrap_or(self.config.delta_policy);
        let base_every = options.base_every.unwrap_or(self.config.base_every).max(1);
        let head = self.refs.head()?;
        let parent_id = self.refs.head_version()?;
        let parent = parent_id.map(|id| self.version(&id)).transpose()?;
        let removals = self.pending_removals()?;

        let inputs = self.read_inputs(paths)?;
        if inputs.is_empty() && removals.is_empty() {
            return Err(Error::NothingToCommit);
        }

        let since_base = match &parent {
            Some(p) if p.since_base + 1 < base_every => p.since_base + 1,
            _ => 0,
        };
        let reference = match (since_base, policy, &parent) {
            (0, _, _) | (_, _, None) => None,
            (_, DeltaPolicy::Previous, Some(p)) => Some(p.clone()),
            (_, DeltaPolicy::Base, Some(p)) => self.last_base(p, base_every),
        };

        let total: u64 = inputs.iter().map(|i| i.map.len() as u64).sum();
        self.progress.start("commit", total);
        let mut tally = Tally::default();
        let mut files: BTreeMap<String, FileEntry> =
            parent.iter().flat_map(|p| p.files.iter()).map(|f| (f.path.clone(), f.clone())).collect();
        for r in &removals {
            files.remove(r);
        }
        let mut offset = 0;
        for input in &inputs {
            let path = input.path.to_string();
            let reference_manifest =
                reference.as_ref().and_then(|v| v.file(&path)).and_then(|f| self.manifest(&f.manifest).ok());
            let entry =
                self.commit_file(input, reference_manifest.as_ref(), base_every, offset, &mut tally).map_err(|e| {
                    match e {
                        Error::Store(store::Error::ChangedWhileWriting { .. }) => {
                            Error::FileChanged { path: path.clone() }
                        }
                        other => Error::File { path: path.clone(), source: Box::new(other) },
                    }
                })?;
            offset += input.map.len() as u64;
            files.insert(path, entry);
        }
        self.progress.finish();

        let files: Vec<FileEntry> = files.into_values().collect();
        let version = Version {
            format: MODEL_FORMAT,
            parents: parent_id.into_iter().collect(),
            time: options.time.unwrap_or_else(now_secs),
            message: message.to_string(),
            since_base,
            raw_bytes: files.iter().map(|f| f.len).sum(),
            stored_bytes: tally.stored_bytes,
            files,
        };
        let written = self.store.write_data(ObjectKind::Version, &version.to_bytes(), &self.config.codec_options())?;
        self.index_object(&written);
        self.index_version(&written.id, &version);
        // The ref moves last: until here, the new objects are unreferenced.
        match head {
            Head::Branch(b) => self.refs.set(RefKind::Branch, &b, &written.id)?,
            Head::Detached(_) => self.refs.set_head(&Head::Detached(written.id))?,
        }
        self.write_removals(&[])?;
        self.record_stats(&inputs, &version);
        self.flush_index();
        Ok(written.id)
    }

    /// Maps and parses every input; fails on the first invalid one before anything is stored.
    fn read_inputs<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Vec<Input>> {
        let mut seen = HashSet::new();
        let mut inputs = Vec::new();
        for p in paths {
            let path = self.repo_path(p.as_ref())?;
            if !seen.insert(path.clone()) {
                continue;
            }
            let abs = path.under(&self.root);
            let file = std::fs::File::open(&abs).map_err(|source| Error::Io {
                action: "opening",
                path: abs.clone(),
                source,
            })?;
            let metadata =
                file.metadata().map_err(|source| Error::Io { action: "reading", path: abs.clone(), source })?;
            if !metadata.is_file() {
                return Err(Error::InvalidPath { path: abs, reason: "not a regular file".into() });
            }
            let map = mmap::map(&file).map_err(|source| Error::Io { action: "reading", path: abs.clone(), source })?;
            let header = if path.as_str().ends_with(".safetensors") {
                Some(safetensors::parse(&map).map_err(|source| Error::Safetensors { path: path.to_string(), source })?)
            } else {
                safetensors::parse(&map).ok()
            };
            inputs.push(Input { path, map, header, metadata });
        }
        Ok(inputs)
    }

    /// The nearest full-base version at or before `v` along first parents.
    fn last_base(&self, v: &Version, base_every: u32) -> Option<Version> {
        let mut v = v.clone();
        for _ in 0..=base_every.max(v.since_base) {
            if v.since_base == 0 {
                return Some(v);
            }
            v = self.version(v.parents.first()?).ok()?;
        }
        None
    }

    fn commit_file(
        &self,
        input: &Input,
        reference: Option<&Manifest>,
        base_every: u32,
        offset: u64,
        tally: &mut Tally,
    ) -> Result<FileEntry> {
        let data: &[u8] = &input.map;
        let plan = plan(input);
        let reference_tensors: HashMap<&TensorRef, ObjectId> =
            reference.map(|m| m.tensors().map(|(t, s)| (t, s.blob)).collect()).unwrap_or_default();
        let options = self.config.codec_options();
        let mut file_hasher = blake3::Hasher::new();
        let mut segments = Vec::with_capacity(plan.len());
        for p in plan {
            let bytes = &data[p.range.start as usize..p.range.end as usize];
            let id = hash_segment(bytes, &mut file_hasher);
            let progress = |done: u64| self.progress.set(offset + p.range.start + done);
            if !self.store.contains(&id) {
                let reference = p.tensor.as_ref().and_then(|t| reference_tensors.get(t)).filter(|r| **r != id);
                let mut written = None;
                if let Some(r) = reference {
                    // A damaged or missing reference only means no delta: store standalone.
                    if let Ok(chain) = self.store.open_blob(r) {
                        if chain.depth() + 1 < base_every && chain.len() == bytes.len() as u64 {
                            let limit = chain.base_stored_len();
                            match self.store.write_blob_delta(id, bytes, &chain, limit, &options, &progress) {
                                Ok(DeltaOutcome::Written(w)) => written = Some(w),
                                Ok(DeltaOutcome::NotSmaller { .. }) => {}
                                Err(store::Error::Corrupt { .. } | store::Error::Missing { .. }) => {}
                                Err(e) => return Err(e.into()),
                            }
                        }
                    }
                }
                let w = match written {
                    Some(w) => w,
                    None => self.store.write_blob(id, bytes, p.dtype, &options, &progress)?,
                };
                self.index_object(&w);
                tally.stored_bytes += w.stored_len;
            }
            progress(bytes.len() as u64);
            segments.push(Segment { len: bytes.len() as u64, blob: id, tensor: p.tensor });
        }
        let hash = ObjectId(*file_hasher.finalize().as_bytes());
        let manifest = Manifest {
            format: MODEL_FORMAT,
            kind: if input.header.is_some() { FileFormat::Safetensors } else { FileFormat::Bytes },
            len: data.len() as u64,
            hash,
            segments,
        };
        let bytes = manifest.to_bytes();
        let manifest_id = ObjectId::hash(&bytes);
        if !self.store.contains(&manifest_id) {
            let w = self.store.write_data(ObjectKind::Manifest, &bytes, &self.config.codec_options())?;
            self.index_object(&w);
            tally.stored_bytes += w.stored_len;
        }
        Ok(FileEntry { path: input.path.to_string(), manifest: manifest_id, len: data.len() as u64, hash })
    }

    /// Remembers size, mtime and hash of the committed files for `status`.
    fn record_stats(&self, inputs: &[Input], version: &Version) {
        let Some(ix) = &self.index else { return };
        let now = now_ns();
        for input in inputs {
            let Some(entry) = version.file(input.path.as_str()) else { continue };
            let record = StatRecord {
                len: input.metadata.len(),
                mtime_ns: mtime_ns(&input.metadata),
                recorded_ns: now,
                hash: entry.hash,
            };
            let _ = ix.put_stat(input.path.as_str(), &record);
        }
    }
}

/// Segments of a file: a safetensors file as header, tensors (empty ones as zero-length
/// segments) and gaps, in file order; anything else as one opaque segment.
fn plan(input: &Input) -> Vec<Planned> {
    let len = input.map.len() as u64;
    let Some(header) = &input.header else {
        return vec![Planned { range: 0..len, dtype: None, tensor: None }];
    };
    let mut out = vec![Planned { range: 0..header.data_start, dtype: None, tensor: None }];
    let mut at = header.data_start;
    for t in &header.tensors {
        let tensor = Some(TensorRef {
            name: t.name.clone(),
            dtype: t.dtype.safetensors_name().to_string(),
            shape: t.shape.clone(),
        });
        if t.is_empty() {
            out.push(Planned { range: at..at, dtype: Some(t.dtype), tensor });
            continue;
        }
        if t.begin > at {
            out.push(Planned { range: at..t.begin, dtype: None, tensor: None });
        }
        out.push(Planned { range: t.begin..t.end, dtype: Some(t.dtype), tensor });
        at = t.end;
    }
    if at < len {
        out.push(Planned { range: at..len, dtype: None, tensor: None });
    }
    out
}

/// blake3 of `bytes` (the segment's id), feeding the whole-file hasher in the same pass.
fn hash_segment(bytes: &[u8], file_hasher: &mut blake3::Hasher) -> ObjectId {
    let mut hasher = blake3::Hasher::new();
    for block in bytes.chunks(16 << 20) {
        if block.len() >= 1 << 20 && rayon::current_num_threads() > 1 {
            rayon::join(|| hasher.update_rayon(block), || file_hasher.update_rayon(block));
        } else {
            hasher.update(block);
            file_hasher.update(block);
        }
    }
    ObjectId(*hasher.finalize().as_bytes())
}

/// Nanoseconds since the Unix epoch, now.
pub(super) fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

/// A file's modification time in nanoseconds since the Unix epoch.
pub(super) fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    match m.modified() {
        Ok(t) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(e) => -(e.duration().as_nanos() as i128),
        },
        Err(_) => 0,
    }
}
