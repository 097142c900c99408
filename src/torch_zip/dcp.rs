//! `torch.distributed.checkpoint` (DCP) directories read item by item. `dcp.save` with the
//! default `FileSystemWriter` writes `.metadata` (a pickle of DCP's `Metadata` dataclass) and one
//! `__<rank>_0.distcp` file per rank, each a run of complete `torch.save` archives back to back:
//! one per tensor shard (a chunk of a DTensor, or a whole plain tensor) and one per pickled
//! non-tensor value. This module reads `.metadata` with the restricted pickle reader (nothing is
//! executed: the dataclasses are only names, see [`METADATA_CLASSES`]) into a table of items,
//! and cuts one `.distcp` file into its items and, inside each, the tensor payloads that
//! [`super::parse`] finds, so a caller can store each shard as a tensor named by its fqn and
//! chunk offsets. Without `.metadata`, [`walk_archives`] finds the archives by their zip
//! structure alone. Pure: bytes in, items out, never a path or I/O. Anything it does not fully
//! understand is an error (the whole file) or an opaque item (one archive), never a panic, and
//! callers keep such bytes as they are.

use super::pickle::{self, Value};
use super::{Storage, StorageMap};
use crate::dtype::Dtype;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// Largest `.metadata` read: DCP's pickle takes a few hundred bytes per item, so this allows
/// some 100,000 items and bounds what a hostile file can make the reader do.
pub const MAX_METADATA_LEN: usize = 64 << 20;

/// How `torch.distributed.checkpoint`'s `FileSystemWriter` names each rank's file.
pub const DISTCP_SUFFIX: &str = ".distcp";

/// Most items accepted in one `.metadata`.
pub(crate) const MAX_ITEMS: usize = 1 << 20;

/// Most tensor dimensions accepted (torch allows 64).
pub(crate) const MAX_DIMS: usize = 64;

/// Most cells a tensor's rows are cut into (a power of two; see [`cell_rows`]).
pub const MAX_CELLS: u64 = 64;
/// Smallest cell a tensor chunk is cut into, in bytes (see [`cell_rows`]): each cell is an
/// object of its own, so cells are kept large enough for one to cost about what a tensor costs.
pub const CELL_MIN_BYTES: u64 = 4 << 20;
/// Candidate ends tried per archive by [`walk_archives`] before giving up: a zip end record
/// whose sizes agree by chance inside tensor data is rare; many of them is a hostile file.
const MAX_END_CANDIDATES: usize = 16;

/// The globals a `.metadata` pickle of torch 2.x names: DCP's dataclasses and enum, `torch.Size`,
/// the layout helper, the path class of `StorageMeta.checkpoint_id`, and the dtypes. Only ever
/// names ([`pickle::read_with_classes`]).
pub const METADATA_CLASSES: &[&str] = &[
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.Size",
    "torch.serialization._get_layout",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePosixPath",
    "torch.float32",
    "torch.float64",
    "torch.float16",
    "torch.bfloat16",
    "torch.int64",
    "torch.int32",
    "torch.int16",
    "torch.int8",
    "torch.uint8",
    "torch.uint16",
    "torch.uint32",
    "torch.uint64",
    "torch.bool",
    "torch.float8_e4m3fn",
    "torch.float8_e5m2",
    "torch.float8_e4m3fnuz",
    "torch.float8_e5m2fnuz",
    "torch.float8_e8m0fnu",
    "torch.complex32",
    "torch.complex64",
    "torch.complex128",
];

const MODULE: &str = "torch.distributed.checkpoint.metadata.";

/// Why a `.metadata` file or a `.distcp` file is not read item by item. The caller keeps the
/// file as opaque bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The pickle holds an opcode or global the restricted reader does not interpret, or is
    /// damaged.
    #[error(".metadata pickle: {0}")]
    Pickle(#[from] super::Error),
    /// The pickle reads, but its values are not DCP's `Metadata` as torch writes it.
    #[error(".metadata: {0}")]
    Metadata(String),
    /// The items `.metadata` places in a `.distcp` file do not fit it.
    #[error("{file}: {reason}")]
    Items {
        /// The file's path relative to the checkpoint directory.
        file: String,
        /// What does not fit.
        reason: String,
    },
    /// A `.distcp` file read without metadata is not a run of `torch.save` archives.
    #[error("not a run of torch.save archives at byte {offset}: {reason}")]
    Archives {
        /// Where the archive that could not be read starts.
        offset: u64,
        /// What went wrong.
        reason: String,
    },
}

fn bad(reason: impl Into<String>) -> Error {
    Error::Metadata(reason.into())
}

/// What an item holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// A chunk of a tensor: its bytes are `torch.save(chunk)`.
    Tensor {
        /// torch's name of the element type (`float32`, `bfloat16`, `float8_e4m3fn`, ...).
        torch_dtype: String,
        /// The element type, when ckpt knows it.
        dtype: Option<Dtype>,
        /// The whole tensor's shape.
        size: Vec<u64>,
        /// Where the chunk starts in the whole tensor, per dimension.
        offsets: Vec<u64>,
        /// The chunk's shape.
        sizes: Vec<u64>,
    },
    /// A non-tensor value (an int, a string, ...): its bytes are `torch.save(value)`.
    Bytes,
}

/// One item of a DCP checkpoint, as `.metadata` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The fully qualified name in the flattened state dict (`model.fc1.weight`).
    pub fqn: String,
    /// Tensor chunk or bytes.
    pub kind: ItemKind,
    /// The file holding it, relative to the checkpoint directory (`__0_0.distcp`).
    pub file: String,
    /// Where its bytes lie in that file.
    pub range: Range<u64>,
    /// Whether DCP transformed the bytes on the way (`transform_descriptors`, e.g. a
    /// compression extension): they are then not a plain `torch.save` archive.
    pub transformed: bool,
}

/// A chunk's name: the fqn and its range in the whole tensor per dimension
/// (`model.fc1.weight[0:16,0:8]`; `[]` for a 0-dimensional tensor).
fn chunk_name(fqn: &str, offsets: &[u64], sizes: &[u64]) -> String {
    let dims: Vec<String> = offsets.iter().zip(sizes).map(|(o, s)| format!("{o}:{}", o.saturating_add(*s))).collect();
    format!("{fqn}[{}]", dims.join(","))
}

/// The row ranges (of dimension 0, in the whole tensor) a tensor chunk is cut into, in order and
/// covering the chunk's rows; one range (the chunk's own) when it is not cut.
///
/// Why: after a change of rank count every chunk of a sharded tensor has a new range, so a
/// name (fqn and range) of one save matches nothing of the save before, and nothing pairs for a
/// delta or dedups. So the rows of a tensor are divided into `g` equal **cells**, `g` a power
/// of two up to [`MAX_CELLS`] that divides the row count, the largest whose cells hold at least
/// [`CELL_MIN_BYTES`] of the whole tensor; and each chunk is cut at every cell boundary inside
/// it. A chunk of a `Shard(0)` DTensor on `r` ranks, `r` dividing `g`, is whole cells, so the
/// same rows give the same cells, under the same names, at every such rank count: 4 ranks
/// after 2, 8 after 4 or 2 after 8 pair cell by cell. The cut depends only on the tensor's
/// shape and the chunk's range, never on another save, so a file's segments (and its hash)
/// stay a function of its bytes and `.metadata`. A chunk is not cut when a cell of it would be
/// under [`CELL_MIN_BYTES`] (a chunk narrower than the tensor in another dimension), which also
/// bounds the pieces to one per [`CELL_MIN_BYTES`] of the file, plus two; nor when it holds no
/// whole cell (an uneven shard across a cell boundary), since only whole cells recur.
pub fn cell_rows(size: &[u64], offsets: &[u64], sizes: &[u64], elem_bytes: u64) -> Vec<Range<u64>> {
    cell_rows_of(size, offsets, sizes, elem_bytes, CELL_MIN_BYTES)
}

/// Where [`cell_rows`] cuts a chunk, as byte offsets into the chunk's bytes (row-major, `elem_bytes`
/// per element), increasing and strictly inside it: what a writer storing the chunk's bytes
/// before the file is cut (`ckpt.dcp.Writer`'s pieces) needs to store each cell on its own.
pub fn cell_cuts(size: &[u64], offsets: &[u64], sizes: &[u64], elem_bytes: u64) -> Vec<u64> {
    let cells = cell_rows(size, offsets, sizes, elem_bytes);
    if cells.len() < 2 {
        return Vec::new();
    }
    // Cut means the chunk's row size did not overflow (`cell_rows_of`).
    // Cut means the chunk's bytes were counted without overflow (`cell_rows_of`).
    let row_bytes = block_bytes(&sizes[1..], elem_bytes).unwrap_or(0);
    cells[1..].iter().map(|r| (r.start - offsets[0]) * row_bytes).collect()
}

/// Bytes of `elem_bytes`-byte elements in a block of shape `dims` (a row: the dimensions after
/// the first), or `None` if that overflows.
fn block_bytes(dims: &[u64], elem_bytes: u64) -> Option<u64> {
    dims.iter().try_fold(elem_bytes, |a, &d| a.checked_mul(d))
}

/// [`cell_rows`] with cells of at least `cell_min` bytes (tests cut small fixtures).
fn cell_rows_of(size: &[u64], offsets: &[u64], sizes: &[u64], elem_bytes: u64, cell_min: u64) -> Vec<Range<u64>> {
    let whole = || match (offsets.first(), sizes.first()) {
        (Some(&o), Some(&s)) => std::iter::once(o..o.saturating_add(s)).collect(),
        _ => Vec::new(),
    };
    let (Some(&rows), Some(&start), Some(&len)) = (size.first(), offsets.first(), sizes.first()) else {
        return whole();
    };
    if offsets.len() != size.len() || sizes.len() != size.len() || len == 0 {
        return whole();
    }
    // A chunk inside its tensor whose bytes can be counted (callers check this against real
    // bytes; here it bounds the loop below to `g + 1` rounds and every product to the chunk's
    // length).
    let (Some(total), Some(chunk_row), Some(_), Some(end)) = (
        block_bytes(size, elem_bytes),
        block_bytes(&sizes[1..], elem_bytes),
        block_bytes(sizes, elem_bytes),
        start.checked_add(len),
    ) else {
        return whole();
    };
    if end > rows {
        return whole();
    }
    let mut g = MAX_CELLS;
    while g > 1 && (rows % g != 0 || total / g < cell_min) {
        g /= 2;
    }
    let cell = rows / g.max(1);
    if g == 1 || cell.checked_mul(chunk_row).is_none_or(|b| b < cell_min) {
        return whole();
    }
    let mut out = Vec::new();
    let mut at = start;
    // The first boundary after `start`: at most `end <= rows` while the loop runs, so no
    // addition below overflows before the loop ends.
    let mut next = start - start % cell + cell;
    while next < end {
        out.push(at..next);
        at = next;
        next += cell;
    }
    out.push(at..end);
    // Only a whole cell can be found again at another rank count: a chunk that holds none (an
    // uneven shard across a cell boundary) gains nothing from a cut.
    if out.iter().any(|r| r.end - r.start == cell) {
        out
    } else {
        whole()
    }
}

impl Item {
    /// The item's name, unique in its checkpoint and the same in every save of one training
    /// run with the same sharding: the fqn, and for a tensor chunk its range in the whole tensor
    /// per dimension (`model.fc1.weight[0:16,0:8]`; `[]` for a 0-dimensional tensor).
    pub fn name(&self) -> String {
        match &self.kind {
            ItemKind::Bytes => self.fqn.clone(),
            ItemKind::Tensor { offsets, sizes, .. } => chunk_name(&self.fqn, offsets, sizes),
        }
    }
}

/// The items of a DCP checkpoint, from its `.metadata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Every item, sorted by file and offset ([`Metadata::items_in`] relies on it).
    pub items: Vec<Item>,
}

impl Metadata {
    /// The items stored in `file` (a path relative to the checkpoint directory), in file order.
    pub fn items_in<'a>(&'a self, file: &'a str) -> impl Iterator<Item = &'a Item> + 'a {
        // Sorted by file: the file's items are one run, found by binary search.
        let start = self.items.partition_point(|i| i.file.as_str() < file);
        self.items[start..].iter().take_while(move |i| i.file == file)
    }

    /// The files holding items, each once, sorted.
    pub fn files(&self) -> Vec<&str> {
        let mut files: Vec<&str> = self.items.iter().map(|i| i.file.as_str()).collect();
        files.dedup();
        files
    }
}

/// The state of a dataclass instance of DCP: `(class name, fields)`.
fn fields<'a>(v: &'a Value, class: &str) -> Result<&'a [(Value, Value)], Error> {
    match v {
        Value::Object { class: c, state, .. } if c.strip_prefix(MODULE) == Some(class) || *c == class => {
            match state.as_deref() {
                Some(Value::Dict(items, _)) => Ok(items),
                None => Ok(&[]),
                Some(_) => Err(bad(format!("{class} with a state that is not a dict"))),
            }
        }
        _ => Err(bad(format!("expected a {class}"))),
    }
}

/// Field `name` of a dataclass's fields, if set.
fn field<'a>(items: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    items.iter().find(|(k, _)| matches!(k, Value::Str(s) if s == name)).map(|(_, v)| v)
}

fn required<'a>(items: &'a [(Value, Value)], name: &str, of: &str) -> Result<&'a Value, Error> {
    field(items, name).ok_or_else(|| bad(format!("{of} without {name}")))
}

/// A `torch.Size` (or a plain tuple of non-negative integers).
fn size(v: &Value) -> Result<Vec<u64>, Error> {
    let tuple = match v {
        Value::Object { class: "torch.Size", args, state: None, .. } => match &args[..] {
            [t] => t,
            _ => return Err(bad("torch.Size with other than one argument")),
        },
        other => other,
    };
    let Value::Seq(dims, _) = tuple else { return Err(bad("a size that is not a tuple")) };
    if dims.len() > MAX_DIMS {
        return Err(bad(format!("a size of {} dimensions", dims.len())));
    }
    dims.iter()
        .map(|d| match d {
            Value::Int(n) => u64::try_from(*n).map_err(|_| bad("a negative size")),
            _ => Err(bad("a size that is not integers")),
        })
        .collect()
}

fn string(v: &Value, what: &str) -> Result<String, Error> {
    match v {
        Value::Str(s) => Ok(s.clone()),
        _ => Err(bad(format!("{what} is not a string"))),
    }
}

fn int(v: &Value, what: &str) -> Result<u64, Error> {
    match v {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(format!("{what} is negative"))),
        _ => Err(bad(format!("{what} is not an integer"))),
    }
}

/// The element type of a `TensorProperties`: the first field of the tuple its `__getstate__`
/// returns (or its `dtype` field, if it was pickled as a plain dataclass).
fn dtype_name(properties: &Value) -> Result<String, Error> {
    let Value::Object { class, state, .. } = properties else { return Err(bad("properties are not an object")) };
    if class.strip_prefix(MODULE) != Some("TensorProperties") {
        return Err(bad(format!("properties of class {class}")));
    }
    let dtype = match state.as_deref() {
        Some(Value::Seq(items, _)) => items.first(),
        Some(Value::Dict(items, _)) => field(items, "dtype"),
        _ => None,
    };
    let Some(Value::Global(g)) = dtype else { return Err(bad("TensorProperties without a dtype")) };
    let name = g.class().and_then(|c| c.strip_prefix("torch.")).ok_or_else(|| bad("dtype is not a torch dtype"))?;
    Ok(name.to_string())
}

/// ckpt's dtype of a torch dtype name.
pub fn dtype_of_torch(name: &str) -> Option<Dtype> {
    Some(match name {
        "float32" => Dtype::F32,
        "float64" => Dtype::F64,
        "float16" => Dtype::F16,
        "bfloat16" => Dtype::Bf16,
        "int64" => Dtype::I64,
        "int32" => Dtype::I32,
        "int16" => Dtype::I16,
        "int8" => Dtype::I8,
        "uint8" => Dtype::U8,
        "uint16" => Dtype::U16,
        "uint32" => Dtype::U32,
        "uint64" => Dtype::U64,
        "bool" => Dtype::Bool,
        "float8_e4m3fn" => Dtype::F8E4M3,
        "float8_e5m2" => Dtype::F8E5M2,
        _ => return None,
    })
}

/// Whether `path` is a plain relative path inside the checkpoint directory.
fn plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.contains('\0')
        && path.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// What `.metadata` says of one tensor.
struct TensorInfo {
    torch_dtype: String,
    size: Vec<u64>,
    /// Chunk sizes by chunk offsets.
    chunks: HashMap<Vec<u64>, Vec<u64>>,
}

/// Reads a `.metadata` file: every item with its kind, chunk geometry and location. Nothing in
/// it is executed; any value not shaped as torch 2.x writes it is an error.
pub fn parse_metadata(bytes: &[u8]) -> Result<Metadata, Error> {
    if bytes.len() > MAX_METADATA_LEN {
        return Err(bad(format!("{} bytes (at most {MAX_METADATA_LEN} read)", bytes.len())));
    }
    let pickle = pickle::read_with_classes(bytes, METADATA_CLASSES)?;
    if !pickle.storages.is_empty() {
        return Err(bad("persistent ids (storages) in .metadata"));
    }
    let root = fields(&pickle.root, "Metadata")?;
    let Value::Dict(state_dict, _) = required(root, "state_dict_metadata", "Metadata")? else {
        return Err(bad("state_dict_metadata is not a dict"));
    };
    let Value::Dict(storage_data, _) = required(root, "storage_data", "Metadata")? else {
        return Err(bad("storage_data is not a dict (not written by FileSystemWriter)"));
    };
    if storage_data.len() > MAX_ITEMS {
        return Err(bad(format!("{} items (at most {MAX_ITEMS})", storage_data.len())));
    }
    // fqn → None for bytes, Some(tensor) for tensors.
    let mut kinds: HashMap<String, Option<TensorInfo>> = HashMap::with_capacity(state_dict.len());
    for (fqn, meta) in state_dict {
        let fqn = string(fqn, "an fqn")?;
        let kind = match meta {
            Value::Object { class, .. } if class.strip_prefix(MODULE) == Some("BytesStorageMetadata") => None,
            _ => {
                let f = fields(meta, "TensorStorageMetadata")?;
                let torch_dtype = dtype_name(required(f, "properties", "TensorStorageMetadata")?)?;
                let size = size(required(f, "size", "TensorStorageMetadata")?)?;
                let Value::Seq(list, _) = required(f, "chunks", "TensorStorageMetadata")? else {
                    return Err(bad(format!("{fqn}: chunks is not a list")));
                };
                let mut chunks = HashMap::with_capacity(list.len());
                for c in list {
                    let c = fields(c, "ChunkStorageMetadata")?;
                    let offsets = self::size(required(c, "offsets", "ChunkStorageMetadata")?)?;
                    let sizes = self::size(required(c, "sizes", "ChunkStorageMetadata")?)?;
                    let inside = offsets.len() == size.len()
                        && sizes.len() == size.len()
                        && offsets
                            .iter()
                            .zip(&sizes)
                            .zip(&size)
                            .all(|((o, s), t)| o.checked_add(*s).is_some_and(|e| e <= *t));
                    if !inside {
                        return Err(bad(format!("{fqn}: chunk {offsets:?}+{sizes:?} outside {size:?}")));
                    }
                    if chunks.insert(offsets, sizes).is_some() {
                        return Err(bad(format!("{fqn}: two chunks at one offset")));
                    }
                }
                Some(TensorInfo { torch_dtype, size, chunks })
            }
        };
        if kinds.insert(fqn.clone(), kind).is_some() {
            return Err(bad(format!("{fqn} listed twice")));
        }
    }
    let mut items = Vec::with_capacity(storage_data.len());
    for (index, info) in storage_data {
        let index = fields(index, "MetadataIndex")?;
        let fqn = string(required(index, "fqn", "MetadataIndex")?, "MetadataIndex.fqn")?;
        let offset = match field(index, "offset") {
            None | Some(Value::Leaf) => None,
            Some(v) => Some(size(v)?),
        };
        let info = fields(info, "torch.distributed.checkpoint.filesystem._StorageInfo")?;
        let file = string(required(info, "relative_path", "_StorageInfo")?, "relative_path")?;
        if !plain_relative(&file) {
            return Err(bad(format!("{fqn}: file {file:?} is not a plain relative path")));
        }
        let start = int(required(info, "offset", "_StorageInfo")?, "offset")?;
        let length = int(required(info, "length", "_StorageInfo")?, "length")?;
        let end = start.checked_add(length).ok_or_else(|| bad(format!("{fqn}: offset + length overflows")))?;
        let transformed = match field(info, "transform_descriptors") {
            None | Some(Value::Leaf) => false,
            Some(Value::Seq(d, _)) => !d.is_empty(),
            Some(_) => return Err(bad(format!("{fqn}: transform_descriptors is not a list"))),
        };
        let kind = match (kinds.get(&fqn), offset) {
            (None, _) => return Err(bad(format!("{fqn}: stored but not in state_dict_metadata"))),
            (Some(None), None) => ItemKind::Bytes,
            (Some(Some(t)), Some(offsets)) => {
                let sizes = t
                    .chunks
                    .get(&offsets)
                    .ok_or_else(|| bad(format!("{fqn}: no chunk at offsets {offsets:?}")))?
                    .clone();
                ItemKind::Tensor {
                    dtype: dtype_of_torch(&t.torch_dtype),
                    torch_dtype: t.torch_dtype.clone(),
                    size: t.size.clone(),
                    offsets,
                    sizes,
                }
            }
            (Some(None), Some(_)) => return Err(bad(format!("{fqn}: bytes item stored with chunk offsets"))),
            (Some(Some(_)), None) => return Err(bad(format!("{fqn}: tensor item stored without chunk offsets"))),
        };
        items.push(Item { fqn, kind, file, range: start..end, transformed });
    }
    let mut names = HashSet::with_capacity(items.len());
    for item in &items {
        if !names.insert(item.name()) {
            return Err(bad(format!("item {} stored twice", item.name())));
        }
    }
    items.sort_by(|a, b| (&a.file, a.range.start, a.range.end).cmp(&(&b.file, b.range.start, b.range.end)));
    Ok(Metadata { items })
}

/// One item of a `.distcp` file as found in its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileItem {
    /// The item's name ([`Item::name`]; `archive.<n>` for the n-th archive when read without
    /// metadata).
    pub name: String,
    /// Where the item lies in the file.
    pub range: Range<u64>,
    /// The tensor payloads inside it, in file coordinates: for a tensor chunk, its one storage
    /// named as the item, with the chunk's shape, or that storage cut into cells ([`cell_rows`]),
    /// each named as a chunk of its rows; for a bytes item (or any archive read without
    /// metadata) the storages [`super::parse`] finds, named `<item>/<path>` (or the item's name
    /// alone for an archive of one bare tensor). Empty when the item is opaque.
    pub storages: Vec<Storage>,
    /// Why the item's bytes are kept opaque (its archive was not understood, or does not match
    /// `.metadata`), or `None`.
    pub opaque: Option<String>,
}

/// The items of one `.distcp` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileItems {
    /// File length.
    pub len: u64,
    /// The items, in file order, pairwise disjoint.
    pub items: Vec<FileItem>,
}

impl FileItems {
    /// The file's tensor payloads as one `torch.save`-style storage map (storages in file order,
    /// named as in [`FileItem::storages`]): what a commit plans segments from, as for a
    /// single `torch.save` archive. Bytes between storages (zip framing, pickles, non-tensor
    /// items, gaps between items) are its opaque ranges.
    pub fn storage_map(&self) -> StorageMap {
        StorageMap { len: self.len, storages: self.items.iter().flat_map(|i| i.storages.iter().cloned()).collect() }
    }

    /// The file cut into consecutive ranges covering it exactly once, in order: tensor payloads
    /// (with `Some`) and the bytes between them (`None`), as [`StorageMap::segments`].
    pub fn segments(&self) -> Vec<(Range<u64>, Option<Storage>)> {
        self.storage_map().segments().into_iter().map(|(r, s)| (r, s.cloned())).collect()
    }
}

/// The storages of the `torch.save` archive `bytes` (at `base` in its file), renamed under
/// `item`: a lone tensor (`torch.save(t)` names it `tensor`) takes the item's name.
fn item_storages(bytes: &[u8], base: u64, item: &str) -> Result<Vec<Storage>, super::Error> {
    let map = super::parse(bytes)?;
    let lone = map.storages.len() == 1 && map.storages[0].name == "tensor";
    Ok(map
        .storages
        .into_iter()
        .map(|s| Storage {
            range: s.range.start + base..s.range.end + base,
            dtype: s.dtype,
            shape: s.shape,
            name: if lone { item.to_string() } else { format!("{item}/{}", s.name) },
        })
        .collect())
}

/// Cuts `file`, the `.distcp` file at `relative_path` in a checkpoint whose `.metadata` is
/// `metadata`, into its items, a large tensor chunk into cells ([`cell_rows`]). Items that lie
/// outside the file or overlap (or two tensors of one name) make the whole file an error; an
/// item whose archive is not understood, or whose tensor does not match `.metadata` (dtype,
/// element count), is kept as an opaque item.
pub fn file_items(file: &[u8], metadata: &Metadata, relative_path: &str) -> Result<FileItems, Error> {
    file_items_cells(file, metadata, relative_path, CELL_MIN_BYTES)
}

/// [`file_items`] with cells of at least `cell_min` bytes ([`cell_rows`]).
fn file_items_cells(file: &[u8], metadata: &Metadata, relative_path: &str, cell_min: u64) -> Result<FileItems, Error> {
    let len = file.len() as u64;
    let fail = |reason: String| Error::Items { file: relative_path.to_string(), reason };
    let mut out = Vec::new();
    let mut at = 0;
    for item in metadata.items_in(relative_path) {
        let name = item.name();
        if item.range.start < at {
            return Err(fail(format!("item {name} overlaps the one before")));
        }
        if item.range.end > len {
            return Err(fail(format!("item {name} ends at {} past the end ({len})", item.range.end)));
        }
        at = item.range.end;
        let bytes = &file[item.range.start as usize..item.range.end as usize];
        let found = if item.transformed {
            Err("transformed by a storage extension".to_string())
        } else {
            item_storages(bytes, item.range.start, &name).map_err(|e| e.to_string()).and_then(|storages| {
                check_chunk(item, &storages)?;
                Ok(cut_into_cells(item, storages, cell_min))
            })
        };
        let (storages, opaque) = match found {
            Ok(s) => (s, None),
            Err(reason) => (Vec::new(), Some(reason)),
        };
        out.push(FileItem { name, range: item.range.clone(), storages, opaque });
    }
    // Tensor names identify tensors across versions: a bytes item's inner storage named like
    // another item's (only contrived fqns such as `a/b` next to `a` can) makes the file an error.
    let mut names = HashSet::new();
    if let Some(s) = out.iter().flat_map(|i| &i.storages).find(|s| !names.insert(s.name.as_str())) {
        return Err(fail(format!("two tensors named {:?}", s.name)));
    }
    Ok(FileItems { len, items: out })
}

/// Cuts `file`, the `.distcp` file at `relative_path`, by the items its writer reports having
/// written into it (`ckpt.dcp.Writer`: DCP's write results, before any `.metadata` exists), as
/// [`file_items`] cuts it by `.metadata`, so both name the items alike. The report is
/// untrusted: if its items are not valid items (chunk geometry, names given twice, too many)
/// or do not tile the file from its first byte to its last (overlap, a gap, out of bounds), or
/// one of them is not an archive that matches it while the file walks as a run of archives,
/// the file is cut by [`walk_archives`] instead (items named `archive.<n>`). An error only if
/// neither reads it.
pub fn cut_by_written_items(file: &[u8], relative_path: &str, items: &[Item]) -> Result<FileItems, Error> {
    let by_items = written_items(file, relative_path, items);
    match by_items {
        Ok(found) if found.items.iter().all(|i| i.opaque.is_none()) => Ok(found),
        // An archive not understood (or not where the report says) is better found by the walk;
        // a file the walk cannot read keeps the reported cut, its odd items opaque, as a
        // `.metadata` cut keeps them.
        by_items => walk_archives(file).or_else(|walk| by_items.map_err(|_| walk)),
    }
}

/// The cut of [`cut_by_written_items`] by the items alone, or why they do not fit the file.
fn written_items(file: &[u8], relative_path: &str, items: &[Item]) -> Result<FileItems, Error> {
    let fail = |reason: String| Error::Items { file: relative_path.to_string(), reason };
    if items.len() > MAX_ITEMS {
        return Err(fail(format!("{} items (at most {MAX_ITEMS})", items.len())));
    }
    let mut names = HashSet::with_capacity(items.len());
    let mut sorted = Vec::with_capacity(items.len());
    for item in items {
        if let ItemKind::Tensor { size, offsets, sizes, .. } = &item.kind {
            let inside = size.len() <= MAX_DIMS
                && offsets.len() == size.len()
                && sizes.len() == size.len()
                && offsets.iter().zip(sizes).zip(size).all(|((o, s), t)| o.checked_add(*s).is_some_and(|e| e <= *t));
            if !inside {
                return Err(fail(format!("{}: chunk {offsets:?}+{sizes:?} outside {size:?}", item.fqn)));
            }
        }
        if item.range.start > item.range.end {
            return Err(fail(format!("{}: a range that ends before it starts", item.fqn)));
        }
        let name = item.name();
        if !names.insert(name.clone()) {
            return Err(fail(format!("item {name} reported twice")));
        }
        sorted.push(Item { file: relative_path.to_string(), ..item.clone() });
    }
    sorted.sort_by_key(|i| (i.range.start, i.range.end));
    // DCP writes a file's items back to back: anything else is not this file's report.
    let mut at = 0;
    for item in &sorted {
        if item.range.start != at {
            return Err(fail(format!("item {} starts at {}, not at {at}", item.name(), item.range.start)));
        }
        at = item.range.end;
    }
    if at != file.len() as u64 {
        return Err(fail(format!("the items end at {at}, the file at {}", file.len())));
    }
    file_items(file, &Metadata { items: sorted }, relative_path)
}

/// A tensor chunk's one storage (checked by [`check_chunk`]) cut into the cells of
/// [`cell_rows`], each named as a chunk of its rows; as it is when not cut, or when the storage
/// is not the chunk's rows in order (a storage viewed in another shape).
fn cut_into_cells(item: &Item, storages: Vec<Storage>, cell_min: u64) -> Vec<Storage> {
    let ItemKind::Tensor { size, offsets, sizes, .. } = &item.kind else { return storages };
    let [s] = storages.as_slice() else { return storages };
    let elem = s.dtype.size() as u64;
    let cells = cell_rows_of(size, offsets, sizes, elem, cell_min);
    if cells.len() < 2 || s.shape != *sizes {
        return storages;
    }
    let row_bytes = block_bytes(&sizes[1..], elem).unwrap_or(0);
    cells
        .into_iter()
        .map(|rows| {
            let mut cell_offsets = offsets.clone();
            let mut cell_sizes = sizes.clone();
            cell_offsets[0] = rows.start;
            cell_sizes[0] = rows.end - rows.start;
            let start = s.range.start + (rows.start - offsets[0]) * row_bytes;
            Storage {
                range: start..start + cell_sizes[0] * row_bytes,
                dtype: s.dtype,
                name: chunk_name(&item.fqn, &cell_offsets, &cell_sizes),
                shape: cell_sizes,
            }
        })
        .collect()
}

/// A tensor chunk's archive holds one tensor of the chunk's dtype and element count; its shape
/// is then the chunk's.
fn check_chunk(item: &Item, storages: &[Storage]) -> Result<(), String> {
    let ItemKind::Tensor { dtype, sizes, torch_dtype, .. } = &item.kind else { return Ok(()) };
    let [s] = storages else { return Err(format!("{} storages in a tensor chunk's archive", storages.len())) };
    if Some(s.dtype) != *dtype {
        return Err(format!("archive holds {}, .metadata says {torch_dtype}", s.dtype));
    }
    let numel: u64 = s.shape.iter().product();
    if sizes.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) != Some(numel) {
        return Err(format!("archive holds {numel} elements, .metadata says {sizes:?}"));
    }
    Ok(())
}

/// The end of the zip archive that starts at `file[start]` (exclusive), found from its end of
/// central directory record: the first record after `from` whose central directory lies right
/// before it, relative to `start`.
fn archive_end(file: &[u8], start: usize, from: usize) -> Option<(usize, usize)> {
    const EOCD: &[u8] = b"PK\x05\x06";
    let mut p = from;
    while let Some(found) = memchr::memmem::find(file.get(p..)?, EOCD) {
        let eocd = p + found;
        p = eocd + 1;
        let u16_at = |at: usize| file.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let u32_at = |at: usize| file.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64);
        let (Some(comment), Some(cd_size), Some(cd_offset)) = (u16_at(eocd + 20), u32_at(eocd + 12), u32_at(eocd + 16))
        else {
            return None;
        };
        let end = eocd + 22 + comment;
        if end > file.len() {
            continue;
        }
        let rel = (eocd - start) as u64;
        let u64_at = |at: usize| file.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])));
        // torch writes ZIP64 records into every archive: a locator right before the end record
        // points at the ZIP64 record (relative to the archive's start), whose central directory
        // lies right before it.
        let locator = eocd.checked_sub(20).filter(|&l| file.get(l..l + 4) == Some(b"PK\x06\x07"));
        let fits = match locator {
            Some(l) => u64_at(l + 8)
                .and_then(|r| usize::try_from(r).ok()?.checked_add(start))
                .filter(|&record| record < l && file.get(record..record + 4) == Some(b"PK\x06\x06"))
                .and_then(|record| {
                    let (size, offset) = (u64_at(record + 40)?, u64_at(record + 48)?);
                    Some(offset.checked_add(size) == Some((record - start) as u64))
                })
                .unwrap_or(false),
            None => cd_offset.checked_add(cd_size) == Some(rel),
        };
        if fits {
            return Some((end, p));
        }
    }
    None
}

/// Cuts a `.distcp` file into its `torch.save` archives without `.metadata`: each archive
/// starts where the previous one ends and ends with its zip end record. Items are named
/// `archive.<n>` in file order. Any byte not inside an archive that [`super::parse`] reads makes
/// the file an error.
pub fn walk_archives(file: &[u8]) -> Result<FileItems, Error> {
    let mut items = Vec::new();
    let mut start = 0usize;
    while start < file.len() {
        let fail = |reason: String| Error::Archives { offset: start as u64, reason };
        if !file[start..].starts_with(b"PK\x03\x04") {
            return Err(fail("no zip local header".into()));
        }
        let name = format!("archive.{}", items.len());
        let mut from = start;
        let mut last = String::from("no zip end record");
        let mut found = None;
        for _ in 0..MAX_END_CANDIDATES {
            let Some((end, next)) = archive_end(file, start, from) else { break };
            match item_storages(&file[start..end], start as u64, &name) {
                Ok(storages) => {
                    found = Some((end, storages));
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            from = next;
        }
        let (end, storages) = found.ok_or_else(|| fail(last))?;
        items.push(FileItem { name, range: start as u64..end as u64, storages, opaque: None });
        start = end;
    }
    Ok(FileItems { len: file.len() as u64, items })
}

#[cfg(test)]
mod tests;
