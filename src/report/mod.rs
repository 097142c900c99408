//! `ckpt report`: what a run did, version by version, as numbers ([`Report`]) and as one
//! self-contained HTML page ([`html::render`]).
//!
//! A report has one column per version and holds: what each version takes in the store now,
//! per file (the totals are `ckpt log`'s, [`Repo::sizes_now`]), against its raw size; and per
//! tensor (a row) and version (a column) how the tensor changed from the previous version:
//! relative change ‖w_v − w_{v−1}‖₂ / ‖w_{v−1}‖₂ and the fraction of elements changed
//! ([`Change`]), computed from the store stream by stream (`compute.rs`) and cached in the index.
//! A tensor that appears, disappears or changes dtype or shape leaves a gap, not an error.
//!
//! This module sits above [`crate::repo`] and reads the repository through its public API (log,
//! versions, manifests, blobs) and the index for its cache; it never writes the store. Columns
//! can come from anywhere that names files by manifest: versions ([`report`]) or, for
//! `ckpt git report`, git commits of weight files kept through the git filter ([`build`]).

mod binning;
mod change;
mod compute;
pub mod html;

pub use change::{is_float, Change};

use crate::dtype::Dtype;
use crate::object_id::ObjectId;
use crate::repo::{FileEntry, Manifest, Repo, TensorFilter};
use compute::TensorAt;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// Errors of a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading the repository failed.
    #[error(transparent)]
    Repo(#[from] crate::repo::Error),
    /// `FROM..TO` where `FROM` is not on `TO`'s first-parent history.
    #[error("{from} is not on the first-parent history of {to}")]
    NotAnAncestor {
        /// The range's start as given.
        from: String,
        /// The range's end as given.
        to: String,
    },
}

impl From<crate::store::Error> for Error {
    fn from(e: crate::store::Error) -> Error {
        Error::Repo(e.into())
    }
}

/// Shorthand for report results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Largest page [`html::render`] aims for by default: above it, tensors (and then versions) are
/// binned ([`Binning`]).
pub const HTML_BUDGET: u64 = 5_000_000;

/// What a report covers and how large its page may grow.
#[derive(Clone, Debug)]
pub struct Options {
    /// Only tensors whose name this selects (as `checkout --tensor`).
    pub tensor: Option<TensorFilter>,
    /// At most this many versions (the newest).
    pub max_versions: Option<usize>,
    /// Largest page in bytes; past it rows, then columns, are binned.
    pub budget: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options { tensor: None, max_versions: None, budget: HTML_BUDGET }
    }
}

/// The numbers a report draws (its `--json` form).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// What the report covers, as given (`HEAD`, `A..B`).
    pub title: String,
    /// One per version, oldest first.
    pub columns: Vec<Column>,
    /// The columns the heatmap draws (indices into `columns`): all of them, or the last of
    /// each bin of versions.
    pub heat_columns: Vec<usize>,
    /// The heatmap's rows, in model order (by file, then as the newest version lists them).
    pub rows: Vec<Row>,
    /// One per (row, column) where the tensor exists, row by row.
    pub cells: Vec<Cell>,
    /// For `FROM..TO`: every tensor's change from `FROM` to `TO` directly (the picture of
    /// `ckpt diff`).
    pub comparison: Option<Comparison>,
    /// How rows and columns were binned to keep the page light, if they were.
    pub binning: Option<Binning>,
    /// Tensor pairs decoded for this report.
    pub computed: u64,
    /// Tensor pairs read from the index's cache instead.
    pub cached: u64,
}

/// One version (or git commit) of a report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Column {
    /// Full id.
    pub id: String,
    /// The short id `ckpt log --oneline` prints.
    pub short: String,
    /// Commit time, seconds since the Unix epoch.
    pub time: i64,
    /// `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// Commit message.
    pub message: String,
    /// Tags on it.
    pub tags: Vec<String>,
    /// Per file, its raw size and what its objects first held here take in the store now.
    pub files: Vec<FileSize>,
    /// Sum of the files' raw sizes.
    pub raw_bytes: u64,
    /// What the version takes in the store now: its files' shares and `metadata_bytes`
    /// (`ckpt log`'s figure).
    pub stored_bytes: u64,
    /// The version object itself.
    pub metadata_bytes: u64,
    /// Raw bytes of every version up to this one (the store if each checkpoint were kept whole).
    pub cumulative_raw: u64,
    /// Stored bytes of every version up to this one.
    pub cumulative_stored: u64,
}

/// One file's part of a column.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FileSize {
    /// Path in the version.
    pub path: String,
    /// File length.
    pub raw_bytes: u64,
    /// What its manifest and the blobs first held by this version take in the store now.
    pub stored_bytes: u64,
}

/// One heatmap row: a tensor of a file (or a bin of consecutive tensors of one file).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    /// Path of the file holding it.
    pub file: String,
    /// The tensor's name (for a bin: `first … last`).
    pub tensor: String,
    /// The prefix rows are grouped (and collapsed) by: the name up to its last `.`.
    pub group: String,
    /// Tensors in the row (1 unless binned).
    pub tensors: usize,
}

/// How a cell's tensor relates to the previous version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Compared with the previous version.
    Compared,
    /// The previous version does not hold it (or there is no previous version).
    First,
    /// The previous version holds it with another dtype or shape.
    Reshaped,
}

/// One heatmap cell: a tensor in a version.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Cell {
    /// Index into [`Report::rows`].
    pub row: usize,
    /// Index into [`Report::columns`].
    pub column: usize,
    /// safetensors dtype name.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// How it relates to the previous version.
    pub status: Status,
    /// ‖w_v − w_{v−1}‖₂ / ‖w_{v−1}‖₂ over finite elements (float dtypes; `None` when not
    /// compared, for other dtypes, and from an all-zero tensor).
    pub rel_change: Option<f64>,
    /// Fraction of elements whose bits changed (`None` when not compared).
    pub frac_changed: Option<f64>,
    /// Elements where either version holds NaN or an infinity.
    pub non_finite: u64,
    /// What its blob takes in the store now, if this version is the first to hold it (a share
    /// of the bundle for a bundled tensor); 0 otherwise.
    pub stored_bytes: u64,
}

/// `FROM..TO` compared directly.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Comparison {
    /// Full id of `FROM`.
    pub from: String,
    /// Full id of `TO`.
    pub to: String,
    /// One per tensor held by both, in row order.
    pub bars: Vec<Bar>,
}

/// One tensor of a [`Comparison`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Bar {
    /// Path of the file holding it.
    pub file: String,
    /// The tensor's name.
    pub tensor: String,
    /// Compared, or reshaped (no figures).
    pub status: Status,
    /// As [`Cell::rel_change`].
    pub rel_change: Option<f64>,
    /// As [`Cell::frac_changed`].
    pub frac_changed: Option<f64>,
    /// As [`Cell::non_finite`].
    pub non_finite: u64,
}

/// How a report was binned to fit its page budget.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Binning {
    /// Consecutive tensors of one file per row.
    pub tensors_per_row: usize,
    /// Consecutive versions per heatmap column.
    pub versions_per_column: usize,
    /// What a binned cell shows.
    pub note: String,
}

/// One state a report reads: a version (or git commit) and its files.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Full id.
    pub id: String,
    /// Short id.
    pub short: String,
    /// Commit time, seconds since the Unix epoch.
    pub time: i64,
    /// Commit message.
    pub message: String,
    /// Tags on it.
    pub tags: Vec<String>,
    /// Its files (path, manifest, length).
    pub files: Vec<FileEntry>,
    /// The object recording it in the store (a version), counted in its stored size.
    pub object: Option<ObjectId>,
}

/// The report of `range` (`REV`: its first-parent history; `FROM..TO`, as git reads it: the
/// versions after `FROM` up to `TO` along `TO`'s first parents, and `TO` compared with `FROM`).
pub fn report(repo: &Repo, range: &str, options: &Options) -> Result<Report> {
    let (from, to) = match range.split_once("..") {
        Some((a, b)) => (Some(a), if b.is_empty() { "HEAD" } else { b }),
        None => (None, range),
    };
    let history = repo.log(to)?;
    let mut tags: HashMap<ObjectId, Vec<String>> = HashMap::new();
    for (name, id) in repo.tags()? {
        tags.entry(id).or_default().push(name);
    }
    let mut snapshots = Vec::with_capacity(history.len());
    for info in history.iter().rev() {
        let v = repo.version(&info.id)?;
        snapshots.push(Snapshot {
            id: info.id.to_hex(),
            short: info.id.short(12),
            time: v.time,
            message: v.message,
            tags: tags.remove(&info.id).unwrap_or_default(),
            files: v.files,
            object: Some(info.id),
        });
    }
    let mut shown = 0..snapshots.len();
    if let Some(a) = from.filter(|a| !a.is_empty()) {
        let start = repo.resolve(a)?.to_hex();
        shown.start = 1 + snapshots
            .iter()
            .position(|s| s.id == start)
            .ok_or_else(|| Error::NotAnAncestor { from: a.to_string(), to: to.to_string() })?;
    }
    build(repo, range, &snapshots, shown, from.is_some(), options)
}

/// The report of `snapshots[shown]` (oldest first): `snapshots` back to the history's root, so
/// that stored sizes count each object once, where it first appears, as `ckpt log` does; the one
/// before `shown` (if any) is what its first column is compared with. With `compare` (a
/// `FROM..TO` range, which shows the states after `FROM`), the last shown is also compared
/// directly with the one before the first ([`Report::comparison`]).
pub fn build(
    repo: &Repo,
    title: &str,
    snapshots: &[Snapshot],
    mut shown: Range<usize>,
    compare: bool,
    options: &Options,
) -> Result<Report> {
    if let Some(n) = options.max_versions {
        shown.start = shown.start.max(shown.end.saturating_sub(n));
    }
    // States read for tensors: the shown ones and the one before them.
    let base = shown.start.saturating_sub(1);
    let mut reader = Reader::new(repo, options.tensor.clone());
    let mut columns = Vec::with_capacity(shown.len());
    let (mut cumulative_raw, mut cumulative_stored) = (0u64, 0u64);
    for (i, snap) in snapshots.iter().enumerate().take(shown.end) {
        let sizes = reader.read(snap, i >= base, i - base.min(i))?;
        cumulative_raw += sizes.raw_bytes;
        cumulative_stored += sizes.stored_bytes;
        if i >= shown.start {
            columns.push(Column {
                id: snap.id.clone(),
                short: snap.short.clone(),
                time: snap.time,
                date: crate::repo::format_time(snap.time),
                message: snap.message.clone(),
                tags: snap.tags.clone(),
                files: sizes.files,
                raw_bytes: sizes.raw_bytes,
                stored_bytes: sizes.stored_bytes,
                metadata_bytes: sizes.metadata_bytes,
                cumulative_raw,
                cumulative_stored,
            });
        }
    }
    let hidden = usize::from(shown.start > base);
    let states = reader.states;
    let changes = compute::compute(repo, &reader.series, 1..states)?;
    let (mut rows, mut order) = reader.rows.ordered();
    // A tensor only the state before the first column holds has no cell: no row either.
    let drawn: Vec<bool> = order.iter().map(|&r| reader.series[r][hidden..].iter().any(Option::is_some)).collect();
    let mut keep = drawn.iter();
    rows.retain(|_| *keep.next().expect("one flag per row"));
    let mut keep = drawn.iter();
    order.retain(|_| *keep.next().expect("one flag per row"));
    let mut cells = Vec::new();
    for (row, &r) in order.iter().enumerate() {
        for s in hidden..states {
            let Some(Some(t)) = reader.series[r].get(s) else { continue };
            let prev = if s == 0 { None } else { reader.series[r][s - 1].as_ref() };
            let change = changes.by_cell.get(&(r, s));
            let status = match prev {
                None => Status::First,
                Some(p) if !p.comparable(t) => Status::Reshaped,
                Some(_) => Status::Compared,
            };
            cells.push(Cell {
                row,
                column: s - hidden,
                dtype: t.dtype.safetensors_name().to_string(),
                shape: t.shape.clone(),
                status,
                rel_change: change.and_then(|c| c.rel_change(t.dtype)),
                frac_changed: change.and_then(Change::frac_changed),
                non_finite: change.map_or(0, |c| c.non_finite),
                stored_bytes: reader.stored.get(&(r, s)).copied().unwrap_or(0),
            });
        }
    }
    let first = (compare && hidden == 1 && !columns.is_empty()).then_some(0);
    let comparison = match first {
        Some(first) => {
            let ids = (snapshots[base + first].id.clone(), snapshots[shown.end - 1].id.clone());
            Some(compare_ends(repo, &reader, (&rows, &order), (first, states - 1), ids)?)
        }
        None => None,
    };
    let report = Report {
        title: title.to_string(),
        heat_columns: (0..columns.len()).collect(),
        columns,
        rows,
        cells,
        comparison,
        binning: None,
        computed: changes.computed,
        cached: changes.cached,
    };
    Ok(binning::fit(report, options.budget))
}

/// States `first` and `last` (ids `from`, `to`) compared directly, one bar per tensor both hold.
fn compare_ends(
    repo: &Repo,
    reader: &Reader,
    (rows, order): (&[Row], &[usize]),
    (first, last): (usize, usize),
    (from, to): (String, String),
) -> Result<Comparison> {
    let pairs: Vec<Vec<Option<TensorAt>>> =
        order.iter().map(|&r| vec![reader.series[r][first].clone(), reader.series[r][last].clone()]).collect();
    let changes = compute::compute(repo, &pairs, 1..2)?;
    let mut bars = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let (Some(a), Some(b)) = (&pairs[i][0], &pairs[i][1]) else { continue };
        let change = changes.by_cell.get(&(i, 1));
        bars.push(Bar {
            file: row.file.clone(),
            tensor: row.tensor.clone(),
            status: if a.comparable(b) { Status::Compared } else { Status::Reshaped },
            rel_change: change.and_then(|c| c.rel_change(b.dtype)),
            frac_changed: change.and_then(Change::frac_changed),
            non_finite: change.map_or(0, |c| c.non_finite),
        });
    }
    Ok(Comparison { from, to, bars })
}

/// What one snapshot takes in the store ([`Column`]'s sizes).
struct Sizes {
    files: Vec<FileSize>,
    raw_bytes: u64,
    stored_bytes: u64,
    metadata_bytes: u64,
}

/// Rows by (file, tensor), in the order tensors were met.
#[derive(Default)]
struct Rows {
    index: HashMap<(String, String), usize>,
    keys: Vec<(String, String)>,
}

impl Rows {
    fn get_or_add(&mut self, file: &str, tensor: &str) -> usize {
        let key = (file.to_string(), tensor.to_string());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        self.keys.push(key.clone());
        self.index.insert(key, self.keys.len() - 1);
        self.keys.len() - 1
    }

    /// The rows in model order: by file path, then in the order the files list their tensors
    /// (met oldest state first; a tensor a later version adds comes after those before it);
    /// and the row ids in that order.
    fn ordered(&self) -> (Vec<Row>, Vec<usize>) {
        let mut order: Vec<usize> = (0..self.keys.len()).collect();
        order.sort_by(|&a, &b| self.keys[a].0.cmp(&self.keys[b].0).then(a.cmp(&b)));
        let rows = order
            .iter()
            .map(|&i| {
                let (file, tensor) = &self.keys[i];
                let group = tensor.rsplit_once('.').map_or("", |(g, _)| g).to_string();
                Row { file: file.clone(), tensor: tensor.clone(), group, tensors: 1 }
            })
            .collect();
        (rows, order)
    }
}

/// Reads snapshots oldest first: their stored sizes (each object counted where it first
/// appears) and, for the states a report compares, where each tensor's bytes are.
struct Reader<'a> {
    repo: &'a Repo,
    filter: Option<TensorFilter>,
    /// Objects met so far.
    seen: HashSet<ObjectId>,
    /// The previous snapshot's manifests (most files do not change between two versions).
    manifests: HashMap<ObjectId, std::rc::Rc<Manifest>>,
    rows: Rows,
    /// Per row, per state: where the tensor is.
    series: Vec<Vec<Option<TensorAt>>>,
    /// Stored bytes per (row, state) of tensors whose blob a state is the first to hold.
    stored: HashMap<(usize, usize), u64>,
    states: usize,
}

impl<'a> Reader<'a> {
    fn new(repo: &'a Repo, filter: Option<TensorFilter>) -> Reader<'a> {
        Reader {
            repo,
            filter,
            seen: HashSet::new(),
            manifests: HashMap::new(),
            rows: Rows::default(),
            series: Vec::new(),
            stored: HashMap::new(),
            states: 0,
        }
    }

    /// Reads `snap`: its sizes, and with `tensors` its tensors as state `state`.
    fn read(&mut self, snap: &Snapshot, tensors: bool, state: usize) -> Result<Sizes> {
        let repo = self.repo;
        let size = |id: &ObjectId| repo.store().stored_len(id).unwrap_or(0);
        let metadata_bytes = snap.object.filter(|id| self.seen.insert(*id)).map_or(0, |id| size(&id));
        let mut sizes = Sizes { files: Vec::new(), raw_bytes: 0, stored_bytes: metadata_bytes, metadata_bytes };
        if tensors {
            self.states = state + 1;
        }
        let mut manifests = HashMap::new();
        let mut claimed: HashSet<ObjectId> = HashSet::new();
        for f in &snap.files {
            let m = match self.manifests.get(&f.manifest) {
                Some(m) => m.clone(),
                None => std::rc::Rc::new(
                    repo.manifest(&f.manifest)
                        .map_err(|e| crate::repo::Error::File { path: f.path.clone(), source: Box::new(e) })?,
                ),
            };
            let mut stored = 0;
            let mut new_blobs = HashSet::new();
            if self.seen.insert(f.manifest) {
                stored += size(&f.manifest);
                for blob in m.blobs() {
                    if self.seen.insert(blob) {
                        stored += size(&blob);
                        new_blobs.insert(blob);
                    }
                }
            }
            if tensors {
                self.read_tensors(f, &m, state, &new_blobs, &mut claimed);
            }
            sizes.files.push(FileSize { path: f.path.clone(), raw_bytes: f.len, stored_bytes: stored });
            sizes.raw_bytes += f.len;
            sizes.stored_bytes += stored;
            manifests.insert(f.manifest, m);
        }
        self.manifests = manifests;
        if tensors {
            // Rows this state does not hold: gaps.
            for cells in &mut self.series {
                cells.resize(state + 1, None);
            }
        }
        Ok(sizes)
    }

    /// Records where each selected tensor of file `f` (manifest `m`) is in state `state`, and
    /// the stored bytes of those whose blob is among `new_blobs` (first claim only).
    fn read_tensors(
        &mut self,
        f: &FileEntry,
        m: &Manifest,
        state: usize,
        new_blobs: &HashSet<ObjectId>,
        claimed: &mut HashSet<ObjectId>,
    ) {
        for (t, seg) in m.tensors() {
            if self.filter.as_ref().is_some_and(|p| !p.matches(&t.name)) {
                continue;
            }
            let Some(dtype) = Dtype::from_safetensors_name(&t.dtype) else { continue };
            let (blob, range) = m.location(seg);
            let row = self.rows.get_or_add(&f.path, &t.name);
            if row == self.series.len() {
                self.series.push(Vec::new());
            }
            let cells = &mut self.series[row];
            cells.resize(state + 1, None);
            let bundled = seg.bundle.is_some();
            cells[state] = Some(TensorAt { dtype, shape: t.shape.clone(), blob, range: range.clone(), bundled });
            if new_blobs.contains(&blob) && (bundled || claimed.insert(blob)) {
                let object = self.repo.store().stored_len(&blob).unwrap_or(0);
                let share = match seg.bundle.and_then(|b| m.bundles.get(b as usize)) {
                    Some(bundle) => {
                        let of = |at: u64| (u128::from(object) * u128::from(at) / u128::from(bundle.len.max(1))) as u64;
                        of(range.end) - of(range.start)
                    }
                    None => object,
                };
                self.stored.insert((row, state), share);
            }
        }
    }
}

/// One dict per heatmap cell, for scripts and notebooks: its file, tensor, version and numbers.
pub fn flat_cells(report: &Report) -> Vec<serde_json::Value> {
    report
        .cells
        .iter()
        .map(|c| {
            let (row, col) = (&report.rows[c.row], &report.columns[c.column]);
            serde_json::json!({
                "file": row.file,
                "tensor": row.tensor,
                "version": col.id,
                "short": col.short,
                "dtype": c.dtype,
                "shape": c.shape,
                "status": c.status,
                "rel_change": c.rel_change,
                "frac_changed": c.frac_changed,
                "non_finite": c.non_finite,
                "stored_bytes": c.stored_bytes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
