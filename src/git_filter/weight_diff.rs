//! `git diff` of a weight file, tensor by tensor: the external diff driver
//! (`diff.ckpt.command`), which git gives both sides at once, unlike a textconv.
//!
//! Each side is a pointer (what git stores; its file is written from the store into a
//! temporary file, verified) or the real file. Both are mapped and their tensors matched by
//! name; a tensor of the same dtype and shape on both sides is compared element by element, a
//! window at a time (pages released behind the window, so memory stays bounded whatever the
//! file size): how many elements changed and, for float dtypes, the largest absolute change.

use super::pointer::{self, Pointer};
use super::{Error, GitFilter, Result};
use crate::safetensors::{self, Header};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Bytes compared between two releases of the mapped pages.
const WINDOW: usize = 8 << 20;

/// One side of a diff, ready to read.
struct Side {
    /// Holds a file written from the store until the diff is done.
    _tmp: Option<tempfile::TempDir>,
    map: crate::mmap::Map,
    header: Option<Header>,
    len: u64,
    hash: Option<crate::ObjectId>,
}

impl Side {
    /// Opens `path`: a pointer's file is written from `filter`'s stores first.
    fn open(filter: &GitFilter, path: &Path) -> Result<Side> {
        let meta = std::fs::metadata(path).map_err(|source| Error::Unreadable { path: path.to_path_buf(), source })?;
        let small = meta.len() <= pointer::MAX_LEN as u64;
        let pointer = if small { std::fs::read(path).ok().and_then(|b| Pointer::parse(&b).ok()) } else { None };
        let (tmp, file, hash) = match pointer {
            Some(p) => {
                let tmp_dir = filter.store().ckpt_dir().join("tmp");
                let dir = tempfile::Builder::new()
                    .prefix("git-diff-")
                    .tempdir_in(&tmp_dir)
                    .map_err(|source| Error::Io { action: "creating a directory in", path: tmp_dir.clone(), source })?;
                let file = dir.path().join("file");
                filter.read_from_stores(&p, &file)?;
                (Some(dir), file, Some(p.hash))
            }
            None => (None, path.to_path_buf(), None),
        };
        let f = crate::mmap::open_regular(&file).map_err(|source| Error::Io {
            action: "opening",
            path: file.clone(),
            source,
        })?;
        let map =
            crate::mmap::map_input(&f).map_err(|source| Error::Io { action: "reading", path: file.clone(), source })?;
        let header = safetensors::parse(&map).ok();
        Ok(Side { _tmp: tmp, len: map.len() as u64, header, map, hash })
    }

    fn describe(&self) -> String {
        let kind = if self.header.is_some() { "safetensors" } else { "not safetensors" };
        match &self.hash {
            Some(h) => format!("{kind}, {} bytes, file hash {}", self.len, h.short(16)),
            None => format!("{kind}, {} bytes", self.len),
        }
    }
}

/// How one tensor differs.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Same dtype and shape on both sides.
    Compared {
        /// Elements.
        elements: u64,
        /// Elements whose bytes differ.
        changed: u64,
        /// Largest absolute change of a float element (finite values only); `None` for other
        /// dtypes.
        max_abs_delta: Option<f64>,
    },
    /// Only on the new side.
    Added,
    /// Only on the old side.
    Removed,
    /// Another dtype or shape on the new side.
    Reshaped {
        /// The new dtype.
        dtype: String,
        /// The new shape.
        shape: Vec<u64>,
    },
}

/// One tensor's line of the diff.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorChange {
    /// The tensor's name.
    pub name: String,
    /// Its dtype (the old side's, if it has one).
    pub dtype: String,
    /// Its shape (likewise).
    pub shape: Vec<u64>,
    /// How it differs.
    pub change: Change,
}

/// Compares two versions of a weight file (`None`: the side does not exist, git's
/// `/dev/null`), tensor by tensor, and returns the text `git diff` shows: each side's kind,
/// size and hash, then [`render`]'s table. When a side is not safetensors, only whether the
/// bytes differ.
pub fn compare(filter: &GitFilter, old: Option<&Path>, new: Option<&Path>) -> Result<String> {
    let old = old.map(|p| Side::open(filter, p)).transpose()?;
    let new = new.map(|p| Side::open(filter, p)).transpose()?;
    let mut out = String::new();
    let describe = |s: &Option<Side>| s.as_ref().map_or_else(|| "absent".to_string(), Side::describe);
    let _ = writeln!(out, "ckpt: old: {}", describe(&old));
    let _ = writeln!(out, "ckpt: new: {}", describe(&new));
    let empty = Header { raw: Vec::new(), data_start: 0, file_len: 0, tensors: Vec::new(), metadata: None };
    fn tensors_of(s: &Option<Side>) -> Option<Option<&Header>> {
        s.as_ref().map(|s| s.header.as_ref())
    }
    let (old_h, new_h) = match (tensors_of(&old), tensors_of(&new)) {
        (Some(None), _) | (_, Some(None)) => {
            let same = old.as_ref().zip(new.as_ref()).is_some_and(|(a, b)| a.map[..] == b.map[..]);
            let _ = writeln!(out, "ckpt: no tensor comparison: {}", if same { "same bytes" } else { "bytes differ" });
            return Ok(out);
        }
        (a, b) => (a.flatten().unwrap_or(&empty), b.flatten().unwrap_or(&empty)),
    };
    let empty_map: &[u8] = &[];
    let changes = compare_tensors(
        (old_h, old.as_ref().map_or(empty_map, |s| &s.map[..]), old.as_ref().map(|s| &s.map)),
        (new_h, new.as_ref().map_or(empty_map, |s| &s.map[..]), new.as_ref().map(|s| &s.map)),
    );
    out.push_str(&render(&changes));
    Ok(out)
}

type SideRef<'a> = (&'a Header, &'a [u8], Option<&'a crate::mmap::Map>);

fn compare_tensors((old_h, old_bytes, old_map): SideRef, (new_h, new_bytes, new_map): SideRef) -> Vec<TensorChange> {
    let new_by_name: BTreeMap<&str, &safetensors::TensorInfo> =
        new_h.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let old_names: std::collections::HashSet<&str> = old_h.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::new();
    let mut old_sorted: Vec<_> = old_h.tensors.iter().collect();
    old_sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for t in old_sorted {
        let change = match new_by_name.get(t.name.as_str()) {
            None => Change::Removed,
            Some(n) if n.dtype != t.dtype || n.shape != t.shape => {
                Change::Reshaped { dtype: n.dtype.to_string(), shape: n.shape.clone() }
            }
            Some(n) => {
                let a = slice(old_bytes, t.begin, t.end);
                let b = slice(new_bytes, n.begin, n.end);
                compare_elements(t.dtype, a, b, |done| {
                    // Pages behind the window leave the resident set.
                    let (ab, bb) = (t.begin as usize, n.begin as usize);
                    if let Some(m) = old_map {
                        m.release(ab..ab + done);
                    }
                    if let Some(m) = new_map {
                        m.release(bb..bb + done);
                    }
                })
            }
        };
        out.push(TensorChange { name: t.name.clone(), dtype: t.dtype.to_string(), shape: t.shape.clone(), change });
    }
    for (name, t) in new_by_name {
        if !old_names.contains(name) {
            out.push(TensorChange {
                name: name.to_string(),
                dtype: t.dtype.to_string(),
                shape: t.shape.clone(),
                change: Change::Added,
            });
        }
    }
    out
}

/// `bytes[begin..end]`, empty where the header's offsets do not fit (parse checked them).
fn slice(bytes: &[u8], begin: u64, end: u64) -> &[u8] {
    usize::try_from(begin).ok().zip(usize::try_from(end).ok()).and_then(|(b, e)| bytes.get(b..e)).unwrap_or(&[])
}

/// Element-wise comparison of two tensors of `dtype` (same length), window by window;
/// `released(n)` is called after the first `n` bytes are done.
fn compare_elements(dtype: crate::Dtype, a: &[u8], b: &[u8], released: impl Fn(usize)) -> Change {
    let width = dtype.size().max(1);
    let len = a.len().min(b.len());
    let elements = (a.len() / width) as u64;
    let window = WINDOW / width * width;
    let mut changed = 0u64;
    let mut max_abs: Option<f64> = None;
    let float = crate::repo::to_f64(dtype, &vec![0u8; width]).is_some();
    let mut at = 0;
    while at < len {
        let end = (at + window).min(len);
        let (wa, wb) = (&a[at..end], &b[at..end]);
        if wa != wb {
            for (ea, eb) in wa.chunks_exact(width).zip(wb.chunks_exact(width)) {
                if ea == eb {
                    continue;
                }
                changed += 1;
                if let (Some(x), Some(y)) = (crate::repo::to_f64(dtype, ea), crate::repo::to_f64(dtype, eb)) {
                    let d = (y - x).abs();
                    if d.is_finite() {
                        max_abs = Some(max_abs.map_or(d, |m: f64| m.max(d)));
                    }
                }
            }
        }
        at = end;
        released(at);
    }
    Change::Compared { elements, changed, max_abs_delta: if float { Some(max_abs.unwrap_or(0.0)) } else { None } }
}

/// The table `git diff` shows: one line per tensor, then a summary.
pub fn render(changes: &[TensorChange]) -> String {
    let mut out = String::new();
    let name_w = changes.iter().map(|c| c.name.len()).max().unwrap_or(6).clamp(6, 60);
    let shape = |s: &[u64]| format!("{s:?}");
    let shape_w = changes.iter().map(|c| shape(&c.shape).len()).max().unwrap_or(5).clamp(5, 40);
    let _ = writeln!(
        out,
        "  {:name_w$}  {:6}  {:shape_w$}  {:9}  {:>9}  max |delta|",
        "tensor", "dtype", "shape", "", "changed"
    );
    let (mut n_changed, mut n_same, mut added, mut removed, mut reshaped) = (0, 0, 0, 0, 0);
    let (mut elements, mut elements_changed) = (0u64, 0u64);
    for c in changes {
        let head = |mark: char| format!("{mark} {:name_w$}  {:6}  {:shape_w$}", c.name, c.dtype, shape(&c.shape));
        match &c.change {
            Change::Compared { elements: e, changed, max_abs_delta } => {
                elements += e;
                elements_changed += changed;
                let percent = if *e == 0 { 0.0 } else { 100.0 * *changed as f64 / *e as f64 };
                let max = match max_abs_delta {
                    Some(d) => format!("{d:.6e}"),
                    None => "-".to_string(),
                };
                if *changed == 0 {
                    n_same += 1;
                    let _ = writeln!(out, "{}  {:9}  {:>8.2}%  {max}", head(' '), "same", 0.0);
                } else {
                    n_changed += 1;
                    let _ = writeln!(out, "{}  {:9}  {:>8.2}%  {max}", head('~'), "changed", percent);
                }
            }
            Change::Added => {
                added += 1;
                let _ = writeln!(out, "{}  added", head('+'));
            }
            Change::Removed => {
                removed += 1;
                let _ = writeln!(out, "{}  removed", head('-'));
            }
            Change::Reshaped { dtype, shape: s } => {
                reshaped += 1;
                let _ = writeln!(out, "{}  reshaped to {dtype} {}", head('!'), shape(s));
            }
        }
    }
    let percent = if elements == 0 { 0.0 } else { 100.0 * elements_changed as f64 / elements as f64 };
    let _ = writeln!(
        out,
        "ckpt: {n_changed} tensors changed, {n_same} same, {added} added, {removed} removed, {reshaped} reshaped; \
         {elements_changed} of {elements} elements changed ({percent:.2}%)"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    #[test]
    fn elements_are_counted_and_the_largest_float_change_found() {
        // F32: 1.0, 2.0, 3.0, 4.0 -> 1.0, 2.5, 3.0, 3.0
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let a = f(&[1.0, 2.0, 3.0, 4.0]);
        let b = f(&[1.0, 2.5, 3.0, 3.0]);
        let c = compare_elements(Dtype::F32, &a, &b, |_| {});
        assert_eq!(c, Change::Compared { elements: 4, changed: 2, max_abs_delta: Some(1.0) });
        let same = compare_elements(Dtype::F32, &a, &a, |_| {});
        assert_eq!(same, Change::Compared { elements: 4, changed: 0, max_abs_delta: Some(0.0) });
        // Integers: counted, no |delta|.
        let c = compare_elements(Dtype::I32, &a, &b, |_| {});
        assert_eq!(c, Change::Compared { elements: 4, changed: 2, max_abs_delta: None });
    }

    #[test]
    fn windows_cover_every_element() {
        // Larger than one window, one change near the end of the second.
        let n = WINDOW / 2 + 100;
        let a = vec![0u8; n * 2];
        let mut b = a.clone();
        b[n * 2 - 2] = 1; // last bf16 element: a tiny positive value
        let released = std::cell::Cell::new(0);
        let c = compare_elements(Dtype::Bf16, &a, &b, |n| released.set(n));
        let Change::Compared { elements, changed, max_abs_delta } = c else { panic!("{c:?}") };
        assert_eq!((elements, changed), (n as u64, 1));
        assert!(max_abs_delta.unwrap() > 0.0);
        assert_eq!(released.get(), n * 2);
    }
}
