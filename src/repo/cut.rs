//! A file's cut: how an input file is opened and parsed ([`Input`]), cut into segments
//! (safetensors header, tensors and gaps; a `torch.save` archive's storages; a `.distcp` file's
//! tensor items, cut by its directory's `.metadata`; or one opaque segment), grouped into
//! bundles ([`super::bundle::plan`]), hashed, and described by a manifest. `commit`, `status` (which hashes working files) and the git filter's store all go
//! through here, so they agree on what a file's segments, ids and hash are.

use super::model::{Bundle, FileFormat, Manifest, Segment, TensorRef};
use super::{Error, RepoPath, Result};
use crate::mmap::{self, Map};
use crate::object_id::ObjectId;
use crate::safetensors;
use crate::torch_zip;
use crate::Dtype;
use rayon::prelude::*;
use std::fs::{File, Metadata};
use std::ops::Range;
use std::path::Path;

/// How [`Input::open`] opens and parses a file, per caller (each keeps the errors it always gave).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rules {
    /// As a commit reads a file: a named pipe, socket, device or directory is
    /// [`Error::InvalidPath`] naming it; a file named `*.safetensors` must be valid safetensors
    /// (see [`Input::parse`]).
    Commit,
    /// As the git filter's store reads a spooled file: any content is accepted (an invalid
    /// `*.safetensors` is opaque bytes); any failure to open is an `opening` I/O error.
    AnyContent,
    /// As `status` hashes a working file: [`Self::AnyContent`], with a failure to open reported
    /// as a `reading` I/O error.
    Hash,
}

/// A file to commit, mapped and parsed.
pub(super) struct Input {
    pub(super) path: RepoPath,
    pub(super) map: Map,
    pub(super) header: Option<safetensors::Header>,
    /// The storages of a `torch.save` archive, or the tensor items of a `.distcp` file (when
    /// `header` is `None`).
    pub(super) torch: Option<torch_zip::StorageMap>,
    /// Whether `torch` is a `.distcp` file cut into its items ([`distcp_cut`]).
    pub(super) distcp: bool,
    pub(super) metadata: Metadata,
    /// The open file, whose metadata is compared with `metadata` once it is read
    /// ([`Input::check_unchanged`]).
    pub(super) file: File,
    /// Whether the file is the working-tree file at `path`, whose size and times `status`
    /// remembers; not for bytes committed from memory (`commit_memory`).
    pub(super) in_working_tree: bool,
    /// Segments whose blob id is known without reading them, by exact range: tensors a save
    /// handed over and stored while it wrote the file, whose bytes the file itself lacks
    /// ([`super::pieces`]), sorted by start. Empty for every other input.
    pub(super) known: Vec<(Range<u64>, ObjectId)>,
}

impl Input {
    /// Opens the file at `disk` (refusing a named pipe, socket or device before anything blocks
    /// on it), maps it (a guarded map: a file truncated meanwhile is reported by
    /// [`Input::check_unchanged`], not a SIGBUS) and parses it under `rules`, as the content of
    /// `path`. A `.distcp` file is cut by `written`, the items its writer reports having written
    /// into it, when given ([`torch_zip::dcp::cut_by_written_items`]: the file of a rank of
    /// `ckpt.dcp.Writer`, stored before any `.metadata` exists), else by the `.metadata` next to
    /// `disk` ([`distcp_cut`]).
    pub(super) fn open(
        disk: &Path,
        path: RepoPath,
        rules: Rules,
        written: Option<&[torch_zip::dcp::Item]>,
    ) -> Result<Input> {
        let (file, metadata) = open_regular(disk, rules)?;
        Input::from_file(disk, path, file, metadata, rules, true, written)
    }

    /// Maps the open `file` (with its `metadata`, read from `disk`) and parses it under `rules`.
    /// `disk_is_real`: `disk` is where the file lies (not a name given to bytes from memory), so
    /// the `.metadata` of a `.distcp` file is read next to it. `written`: see
    /// [`Input::open`].
    pub(super) fn from_file(
        disk: &Path,
        path: RepoPath,
        file: File,
        metadata: Metadata,
        rules: Rules,
        disk_is_real: bool,
        written: Option<&[torch_zip::dcp::Item]>,
    ) -> Result<Input> {
        let map = mmap::map_input(&file).map_err(|source| Error::Io {
            action: "reading",
            path: disk.to_path_buf(),
            source,
        })?;
        let mut input = Input {
            path,
            map,
            header: None,
            torch: None,
            distcp: false,
            metadata,
            file,
            in_working_tree: true,
            known: Vec::new(),
        };
        match rules {
            Rules::Commit => input.parse()?,
            Rules::AnyContent | Rules::Hash => input.header = safetensors::parse(&input.map).ok(),
        }
        if input.header.is_none() {
            match distcp_name(disk.file_name(), &input.path) {
                Some(name) => {
                    input.distcp = true;
                    let sibling = disk_is_real && disk.file_name().is_some_and(|n| n.to_str() == Some(name.as_str()));
                    input.torch = match written {
                        Some(items) => torch_zip::dcp::cut_by_written_items(&input.map, &name, items)
                            .ok()
                            .map(|cut| cut.storage_map()),
                        None => distcp_cut(&input.map, sibling.then_some(disk), &name),
                    };
                }
                None => input.torch = torch_cut(&input.map),
            }
        }
        Ok(input)
    }

    /// Parses the mapped file as a commit reads it: a file named `*.safetensors` must be valid
    /// safetensors; any other file is safetensors if it parses as such, else (in
    /// [`Input::from_file`]) a `.distcp` file or a `torch.save` archive if it is one, else opaque
    /// bytes.
    fn parse(&mut self) -> Result<()> {
        let parsed = safetensors::parse(&self.map);
        if parsed.is_err() {
            // A header cut short by a rewrite is the change, not an invalid file.
            self.check_unchanged()?;
        }
        self.header = if self.path.as_str().ends_with(".safetensors") {
            Some(parsed.map_err(|source| Error::Safetensors { path: self.path.to_string(), source })?)
        } else {
            parsed.ok()
        };
        Ok(())
    }

    /// Fails with [`Error::FileChanged`] if the file shrank (its map read zeros past the new end:
    /// see [`crate::mmap`]) or was rewritten since it was opened: what was read may mix two
    /// versions of it, so nothing read from it may become a version.
    pub(super) fn check_unchanged(&self) -> Result<()> {
        if mmap::FileStamp::of(&self.metadata).changed(&self.file, &self.map) {
            return Err(Error::FileChanged { path: self.path.to_string() });
        }
        Ok(())
    }

    /// The file's segments and bundles, hashed, and its file hash ([`hash_content`]).
    pub(super) fn hash(&self) -> (HashedSegments, ObjectId) {
        hash_content(&self.map, self.header.as_ref(), self.torch.as_ref(), &self.known)
    }

    /// The non-empty tensor segments of the file's cut, with their dtypes, in file order.
    pub(super) fn tensor_ranges(&self) -> Vec<(Range<u64>, Dtype)> {
        plan(self.map.len() as u64, self.header.as_ref(), self.torch.as_ref())
            .into_iter()
            .filter(|p| p.tensor.is_some() && p.range.start < p.range.end)
            .filter_map(|p| Some((p.range, p.dtype?)))
            .collect()
    }

    /// The manifest a commit writes for this input (computed, not stored).
    pub(super) fn manifest(&self) -> Manifest {
        let (hashed, hash) = self.hash();
        manifest_of(self, &hashed.segments, &hashed.bundles, hash)
    }
}

/// Opens `disk` for reading if it is a regular file, with its metadata; a named pipe, socket,
/// device or directory is refused, naming what it is, before anything blocks on it. Errors as
/// `rules` reports them.
pub(super) fn open_regular(disk: &Path, rules: Rules) -> Result<(File, Metadata)> {
    let file = mmap::open_regular(disk).map_err(|source| match (rules, source.kind()) {
        (Rules::Commit, std::io::ErrorKind::InvalidInput) => {
            Error::InvalidPath { path: disk.to_path_buf(), reason: source.to_string() }
        }
        (Rules::Commit | Rules::AnyContent, _) => Error::Io { action: "opening", path: disk.to_path_buf(), source },
        (Rules::Hash, _) => Error::Io { action: "reading", path: disk.to_path_buf(), source },
    })?;
    let metadata =
        file.metadata().map_err(|source| Error::Io { action: "reading", path: disk.to_path_buf(), source })?;
    Ok((file, metadata))
}

/// One planned segment: byte range, dtype, tensor identity.
struct Planned {
    range: Range<u64>,
    dtype: Option<Dtype>,
    tensor: Option<TensorRef>,
}

/// A planned segment with its id.
pub(super) struct HashedSegment {
    pub(super) range: Range<u64>,
    pub(super) dtype: Option<Dtype>,
    pub(super) tensor: Option<TensorRef>,
    pub(super) id: ObjectId,
    /// xxh3-64 of the segment's bytes.
    pub(super) xxh3: u64,
    /// The bundle (index in [`HashedSegments::bundles`]) holding it, if any.
    pub(super) bundle: Option<u32>,
}

/// A planned bundle ([`super::bundle`]) with its id.
pub(super) struct HashedBundle {
    pub(super) dtype: Dtype,
    /// Its segments, in file order.
    pub(super) members: Vec<usize>,
    pub(super) len: u64,
    /// The blake3 of the members' bytes, concatenated.
    pub(super) id: ObjectId,
    /// Their xxh3-64.
    pub(super) xxh3: u64,
    /// The first member's tensor: what the same bundle of the reference file starts with.
    pub(super) key: TensorRef,
}

/// A file's segments and bundles, hashed.
pub(super) struct HashedSegments {
    pub(super) segments: Vec<HashedSegment>,
    pub(super) bundles: Vec<HashedBundle>,
}

/// The manifest of `input` with these hashed segments and bundles: what a commit writes, and
/// what the git filter computes to find a file the store already holds.
pub(super) fn manifest_of(
    input: &Input,
    segments: &[HashedSegment],
    bundles: &[HashedBundle],
    hash: ObjectId,
) -> Manifest {
    let segments = segments
        .iter()
        .map(|s| {
            let len = s.range.end - s.range.start;
            match (s.bundle, &s.tensor) {
                (Some(b), Some(t)) => Segment::bundled(len, t.clone(), b),
                _ => Segment::whole(len, s.id, s.tensor.clone()),
            }
        })
        .collect();
    let bundles = bundles
        .iter()
        .map(|b| Bundle { blob: b.id, dtype: b.dtype.safetensors_name().to_string(), len: b.len })
        .collect();
    let kind = match (&input.header, &input.torch) {
        (Some(_), _) => FileFormat::Safetensors,
        (None, Some(_)) if input.distcp => FileFormat::Distcp,
        (None, Some(_)) => FileFormat::Torch,
        (None, None) => FileFormat::Bytes,
    };
    Manifest::new(kind, input.map.len() as u64, hash, bundles, segments)
}

/// Plans `map`'s segments (safetensors when `header` is given, a `torch.save` archive's
/// storages and the bytes between them when `torch` is, else one opaque segment) and
/// bundles ([`super::bundle::plan`]), hashes each segment (its blob id) and bundle, and derives
/// the file hash from the segments ([`super::model::file_hash`]). Each segment's pages are
/// dropped from the resident set once hashed. A segment whose range is in `known` (sorted by
/// start) takes the id
/// given there and is not read (its xxh3 is 0: its blob is stored already). `status` hashes
/// working files with this too, so both agree on what a file's hash is.
pub(super) fn hash_content(
    map: &Map,
    header: Option<&safetensors::Header>,
    torch: Option<&torch_zip::StorageMap>,
    known: &[(Range<u64>, ObjectId)],
) -> (HashedSegments, ObjectId) {
    let planned = plan(map.len() as u64, header, torch);
    let bundle_plan = super::bundle::plan(
        planned.iter().map(|p| (p.range.end - p.range.start, p.dtype.filter(|_| p.tensor.is_some()))),
    );
    let mut bundle_of: Vec<Option<u32>> = vec![None; planned.len()];
    for (b, (_, members)) in bundle_plan.iter().enumerate() {
        for &m in members {
            bundle_of[m] = Some(b as u32);
        }
    }
    // Segments in parallel: a checkpoint of many small tensors leaves blake3's own tree
    // parallelism little to split (45 MB of MiniLM, 105 segments: 10-14 ms one after the
    // other, ~10 ms side by side in the same phase timestamps; the pass is memory-bound).
    // Bundled ones are hashed with their bundle, below.
    let mut segments: Vec<HashedSegment> = planned
        .into_par_iter()
        .zip(bundle_of)
        .map(|(p, bundle)| {
            let given = known
                .binary_search_by_key(&p.range.start, |(r, _)| r.start)
                .ok()
                .filter(|&i| known[i].0 == p.range)
                .map(|i| (known[i].1, 0));
            let (id, xxh3) = match (bundle, given) {
                (Some(_), _) => (ObjectId([0; 32]), 0),
                (None, Some(given)) => given,
                (None, None) => hash_segment(map, p.range.start as usize..p.range.end as usize),
            };
            HashedSegment { range: p.range, dtype: p.dtype, tensor: p.tensor, id, xxh3, bundle }
        })
        .collect();
    // Each member is copied once and hashed from the copy, as itself (its id) and as part of
    // the bundle, so the two agree even if the file changes meanwhile (the store then finds
    // that the bundle's bytes are not those hashed).
    let hashed_bundles: Vec<(HashedBundle, Vec<ObjectId>)> = bundle_plan
        .into_par_iter()
        .map(|(dtype, members)| {
            let mut blake3 = blake3::Hasher::new();
            let mut xxh3 = xxhash_rust::xxh3::Xxh3::new();
            let mut copy = Vec::with_capacity(super::bundle::BUNDLE_BELOW as usize);
            let mut ids = Vec::with_capacity(members.len());
            let mut len = 0;
            for &m in &members {
                let r = &segments[m].range;
                copy.clear();
                copy.extend_from_slice(&map[r.start as usize..r.end as usize]);
                ids.push(ObjectId::hash(&copy));
                blake3.update(&copy);
                xxh3.update(&copy);
                len += copy.len() as u64;
            }
            let key = segments[members[0]].tensor.clone().expect("bundles hold tensors");
            (HashedBundle { dtype, members, len, id: blake3.finalize().into(), xxh3: xxh3.digest(), key }, ids)
        })
        .collect();
    let mut bundles = Vec::with_capacity(hashed_bundles.len());
    for (bundle, ids) in hashed_bundles {
        for (&m, id) in bundle.members.iter().zip(ids) {
            segments[m].id = id;
        }
        bundles.push(bundle);
    }
    let hash = super::model::file_hash(map.len() as u64, segments.iter().map(|s| (s.range.end - s.range.start, s.id)));
    (HashedSegments { segments, bundles }, hash)
}

/// The blake3 (its id) and xxh3-64 (which lets the store check that the bytes it codes are
/// these, without a second blake3 pass: `Feedback::input_xxh3`) of `map[range]`. Block by block,
/// so both read each block while it is in cache, and each block's pages leave the resident set
/// once hashed (segments are hashed in parallel: without this, two 1 GiB tensors would be
/// resident at once).
fn hash_segment(map: &Map, range: Range<usize>) -> (ObjectId, u64) {
    const BLOCK: usize = 8 << 20;
    let mut blake3 = blake3::Hasher::new();
    let mut xxh3 = xxhash_rust::xxh3::Xxh3::new();
    for start in range.clone().step_by(BLOCK) {
        let block = start..(start + BLOCK).min(range.end);
        let bytes = &map[block.clone()];
        // Side by side: the pool splits blake3's tree while one worker runs xxh3 over the block.
        rayon::join(|| crate::object_id::hash_update(&mut blake3, bytes), || xxh3.update(bytes));
        map.release(block);
    }
    (blake3.finalize().into(), xxh3.digest())
}

/// The storages of `map` if it is a `torch.save` archive (the caller found no safetensors
/// header). Anything the reader does not fully understand (a pickle with other globals or
/// opcodes, a damaged or compressed archive) is `None`: the file is then stored as opaque
/// bytes, never refused.
fn torch_cut(map: &Map) -> Option<torch_zip::StorageMap> {
    if !torch_zip::looks_like_zip(map) {
        return None;
    }
    torch_zip::parse(map).ok()
}

/// The name a `.distcp` file has in its checkpoint directory (as `.metadata` names it): the file
/// name on disk if it ends with `.distcp` (`status` hashes a working file under a placeholder
/// path), else the repository path's file name if that does (the git filter's spooled copy).
/// `None`: not a `.distcp` file.
fn distcp_name(disk_name: Option<&std::ffi::OsStr>, path: &RepoPath) -> Option<String> {
    let disk_name = disk_name.and_then(|n| n.to_str()).filter(|n| n.ends_with(DISTCP_SUFFIX));
    let path_name = path.as_str().rsplit('/').next().filter(|n| n.ends_with(DISTCP_SUFFIX));
    disk_name.or(path_name).map(str::to_string)
}

pub(super) use crate::torch_zip::dcp::DISTCP_SUFFIX;

/// The checkpoint directory's metadata file, next to its `.distcp` files.
const DCP_METADATA: &str = ".metadata";

/// The tensor items of the `.distcp` file `map`, named `name` in its checkpoint directory, as
/// one `torch.save`-style layout ([`torch_zip::dcp`]): cut by the `.metadata` next to `disk`
/// (when given) if it reads and places items in this file, else by walking the file's
/// concatenated archives; `None` (opaque bytes) if neither reads it. Never an error: a missing,
/// unreadable or foreign `.metadata` only changes how the file is cut. Commit and `status` both
/// call this, so both cut a file the same way; without `.metadata` the cut ranges are the same,
/// only the names differ (`archive.<n>` instead of fqn and chunk offsets).
fn distcp_cut(map: &Map, disk: Option<&Path>, name: &str) -> Option<torch_zip::StorageMap> {
    use torch_zip::dcp;
    let metadata = disk.and_then(|d| read_dcp_metadata(&d.with_file_name(DCP_METADATA)));
    let cut = metadata
        .and_then(|m| dcp::file_items(map, &m, name).ok())
        .filter(|l| !l.items.is_empty())
        .or_else(|| dcp::walk_archives(map).ok())?;
    Some(cut.storage_map())
}

/// The parsed `.metadata` at `path`, if it is a regular file of at most
/// [`torch_zip::dcp::MAX_METADATA_LEN`] bytes that parses.
fn read_dcp_metadata(path: &Path) -> Option<torch_zip::dcp::Metadata> {
    use std::io::Read;
    let file = mmap::open_regular(path).ok()?;
    let limit = torch_zip::dcp::MAX_METADATA_LEN as u64;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > limit {
        return None;
    }
    torch_zip::dcp::parse_metadata(&bytes).ok()
}

/// The segments of a file of `len` bytes ([`crate::file_codec::cut`]: the one cut), each with
/// the tensor it holds as a manifest names it.
fn plan(len: u64, header: Option<&safetensors::Header>, torch: Option<&torch_zip::StorageMap>) -> Vec<Planned> {
    crate::file_codec::cut(len, header, torch)
        .into_iter()
        .map(|(range, tensor)| Planned {
            range,
            dtype: tensor.map(|t| t.dtype),
            tensor: tensor.map(|t| TensorRef {
                name: t.name.to_string(),
                dtype: t.dtype.safetensors_name().to_string(),
                shape: t.shape.to_vec(),
            }),
        })
        .collect()
}
