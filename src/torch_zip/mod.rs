//! `torch.save` archives read as tensors: this module finds the storages of a zip-format
//! `torch.save` file (PyTorch ≥ 1.6) and returns its storage map, a list of byte ranges covering the
//! file in order: each storage's raw bytes (a `data/<key>` entry stored uncompressed) with its
//! dtype, shape and a name, and everything else (zip headers, `data.pkl`, other entries,
//! padding) as opaque ranges. The pickle is read by a restricted interpreter that never executes
//! anything ([`pickle`]). It is pure (bytes in, storage map out, no paths, no I/O) and must never
//! panic or allocate beyond fixed bounds on hostile input: any archive it does not fully
//! understand is an error, and callers keep such a file as opaque bytes.

pub mod dcp;
pub mod pickle;
pub mod zip;

use crate::dtype::Dtype;
use pickle::Value;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// Largest `data.pkl` read. The pickle of a state dict takes about 100 bytes per tensor, so this
/// is far beyond real checkpoints and bounds what a hostile archive can make the reader do.
pub(crate) const MAX_PICKLE_LEN: u64 = 64 << 20;

/// Why a file is not read as a `torch.save` archive.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not a zip archive (the legacy `torch.save` format is not one) or a damaged one.
    #[error("zip archive: {0}")]
    Zip(String),
    /// A zip archive, but not laid out as `torch.save` writes it.
    #[error("not a torch.save archive: {0}")]
    Archive(String),
    /// `data.pkl` holds something the restricted reader does not interpret.
    #[error("data.pkl at byte {offset}: {reason}")]
    Pickle {
        /// Offset in `data.pkl` of the opcode.
        offset: usize,
        /// What was not understood.
        reason: String,
    },
}

/// One storage of the archive: the raw bytes of entry `<prefix>/data/<key>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Storage {
    /// Where the storage's bytes lie in the file.
    pub range: Range<u64>,
    /// Element type.
    pub dtype: Dtype,
    /// The shape of the first tensor that views the whole storage contiguously from offset 0,
    /// else `[numel]`: the product is always the storage's element count.
    pub shape: Vec<u64>,
    /// The path of the first tensor viewing the storage in the pickled object
    /// (`state.0.exp_avg`, `model.fc1.weight`: dict keys and list indices joined by `.`), which
    /// stays the same between checkpoints of one training run; `data/<key>` for a storage no
    /// tensor reaches. Unique within the archive.
    pub name: String,
}

/// Where a `torch.save` archive's storages lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageMap {
    /// File length.
    pub len: u64,
    /// The storages, in file order, pairwise disjoint.
    pub storages: Vec<Storage>,
}

impl StorageMap {
    /// The file cut into consecutive ranges: storages (with `Some`) and the opaque bytes
    /// between them (`None`). Empty storages are zero-length ranges; no opaque range is empty.
    pub fn segments(&self) -> Vec<(Range<u64>, Option<&Storage>)> {
        let mut out = Vec::with_capacity(2 * self.storages.len() + 1);
        let mut at = 0;
        for s in &self.storages {
            if s.range.start > at {
                out.push((at..s.range.start, None));
            }
            out.push((s.range.clone(), Some(s)));
            at = s.range.end;
        }
        if at < self.len {
            out.push((at..self.len, None));
        }
        out
    }
}

/// Whether `file` starts like a zip archive (a local file header). Cheap: callers test this
/// before [`parse`].
pub(crate) fn looks_like_zip(file: &[u8]) -> bool {
    file.starts_with(b"PK\x03\x04")
}

/// Reads the storage map of a `torch.save` archive.
pub fn parse(file: &[u8]) -> Result<StorageMap, Error> {
    if !looks_like_zip(file) {
        return Err(Error::Zip("no zip signature at the start".into()));
    }
    let entries = zip::entries(file)?;
    let archive = |reason: String| Error::Archive(reason);
    // torch writes every entry under one top-level folder (`archive/` or the file's stem).
    let pkl = entries
        .iter()
        .filter(|e| e.name.ends_with("/data.pkl") && e.name.matches('/').count() == 1)
        .collect::<Vec<_>>();
    let [pkl] = pkl[..] else {
        return Err(archive(format!("{} top-level data.pkl entries", pkl.len())));
    };
    let prefix = &pkl.name[..pkl.name.len() - "data.pkl".len()];
    let stored_bytes = |e: &zip::Entry| -> Result<&[u8], Error> {
        if e.method != 0 || e.size != e.data.end - e.data.start {
            return Err(archive(format!("entry {:?} is compressed", e.name)));
        }
        Ok(&file[e.data.start as usize..e.data.end as usize])
    };
    if pkl.size > MAX_PICKLE_LEN {
        return Err(archive(format!("data.pkl of {} bytes (at most {MAX_PICKLE_LEN} read)", pkl.size)));
    }
    let by_name: HashMap<&str, &zip::Entry> = entries.iter().map(|e| (e.name.as_str(), e)).collect();
    if let Some(order) = by_name.get(format!("{prefix}byteorder").as_str()) {
        if stored_bytes(order)? != b"little" {
            return Err(archive("byte order is not little-endian".into()));
        }
    }
    let pickle = pickle::read(stored_bytes(pkl)?)?;
    let names = name_storages(&pickle);
    let mut storages = Vec::with_capacity(pickle.storages.len());
    for (i, s) in pickle.storages.iter().enumerate() {
        let entry_name = format!("{prefix}data/{}", s.key);
        let entry = by_name.get(entry_name.as_str()).ok_or_else(|| archive(format!("no entry {entry_name:?}")))?;
        let bytes = stored_bytes(entry)?;
        if Some(bytes.len() as u64) != s.numel.checked_mul(s.dtype.size() as u64) {
            return Err(archive(format!(
                "entry {entry_name:?} holds {} bytes, not {} elements of {}",
                bytes.len(),
                s.numel,
                s.dtype
            )));
        }
        let (name, shape) = names[i].clone().unwrap_or_else(|| (format!("data/{}", s.key), vec![s.numel]));
        storages.push(Storage { range: entry.data.clone(), dtype: s.dtype, shape, name });
    }
    storages.sort_by_key(|s| (s.range.start, s.range.end));
    if storages.windows(2).any(|w| w[0].range.end > w[1].range.start) {
        return Err(archive("storage entries overlap".into()));
    }
    // Names must be unique (they identify tensors across versions); a collision, such as keys
    // `a.b` and `a` → `b` in one dict, keeps the first and names the others by key.
    let mut seen = HashSet::new();
    for (s, p) in storages.iter_mut().zip(0..) {
        if !seen.insert(s.name.clone()) {
            s.name = format!("{}#{p}", s.name);
            if !seen.insert(s.name.clone()) {
                return Err(archive(format!("storage name {:?} is not unique", s.name)));
            }
        }
    }
    Ok(StorageMap { len: file.len() as u64, storages })
}

/// For each storage of `pickle`, the path and shape of the first tensor viewing it (depth
/// first, in pickle order); `None` when no tensor reaches it.
fn name_storages(pickle: &pickle::Pickle) -> Vec<Option<(String, Vec<u64>)>> {
    let mut names = vec![None; pickle.storages.len()];
    let mut path = Vec::new();
    walk(&pickle.root, &mut path, pickle, &mut names);
    names
}

fn walk(v: &Value, path: &mut Vec<String>, pickle: &pickle::Pickle, names: &mut [Option<(String, Vec<u64>)>]) {
    let joined = |path: &[String]| if path.is_empty() { "tensor".to_string() } else { path.join(".") };
    match v {
        Value::Seq(items, _) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                walk(item, path, pickle, names);
                path.pop();
            }
        }
        Value::Dict(items, _) => {
            for (k, item) in items {
                path.push(match k {
                    Value::Str(s) => s.clone(),
                    Value::Int(n) => n.to_string(),
                    _ => "?".to_string(),
                });
                walk(item, path, pickle, names);
                path.pop();
            }
        }
        Value::Storage(s) => {
            if let Some(slot @ None) = names.get_mut(*s) {
                *slot = Some((joined(path), vec![pickle.storages[*s].numel]));
            }
        }
        Value::Tensor { storage, offset, shape, stride } => {
            let Some(slot @ None) = names.get_mut(*storage) else { return };
            let numel = pickle.storages[*storage].numel;
            // Row-major contiguous strides for `shape`.
            let mut expected = Vec::with_capacity(shape.len());
            let mut step = 1u64;
            for &d in shape.iter().rev() {
                expected.push(step);
                step = step.saturating_mul(d);
            }
            expected.reverse();
            let whole = *offset == 0 && shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) == Some(numel);
            let shape = if whole && (expected == *stride || numel <= 1) { shape.clone() } else { vec![numel] };
            *slot = Some((joined(path), shape));
        }
        Value::Leaf | Value::Int(_) | Value::Str(_) | Value::Global(_) | Value::Object { .. } => {}
    }
}

#[cfg(test)]
mod tests;
