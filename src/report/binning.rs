//! Keeping a report's page within its budget: with more tensors or versions than a page can
//! carry (200 versions × 2,000 tensors is 400,000 cells, some 80 MB of markup), consecutive
//! tensors of a file share a row, then consecutive versions a column, and a binned cell shows
//! the largest change among what it holds. The page says so ([`super::Binning`]).

use super::{Binning, Cell, Report, Row, Status};
use std::collections::BTreeMap;

/// Page bytes besides rows and cells (styles, script, store chart, version table).
const PAGE_BYTES: u64 = 40_000;
/// Markup of one cell besides its names: the rect, its attributes, its table cell and its share
/// of the group summaries.
const CELL_BYTES: u64 = 190;
/// Markup of one column (store bar, table rows) besides its cells.
const COLUMN_BYTES: u64 = 900;
/// Markup of one row besides its cells.
const ROW_BYTES: u64 = 200;
/// Rows a binned heatmap keeps before versions are binned too.
const MIN_ROWS: usize = 60;

/// The page size `report` would render to, roughly (within ~20%, from above).
pub(super) fn estimate(report: &Report) -> u64 {
    let mut bytes = PAGE_BYTES + COLUMN_BYTES * report.columns.len() as u64;
    for row in &report.rows {
        bytes += ROW_BYTES + 2 * (row.file.len() + row.tensor.len()) as u64;
    }
    for c in &report.cells {
        let row = &report.rows[c.row];
        bytes += CELL_BYTES + (row.file.len() + row.tensor.len() + report.columns[c.column].short.len()) as u64;
    }
    if let Some(cmp) = &report.comparison {
        bytes += cmp.bars.iter().map(|b| 2 * ROW_BYTES + 2 * (b.file.len() + b.tensor.len()) as u64).sum::<u64>();
    }
    bytes
}

/// `report` itself if it fits `budget`, else binned until it does (or until a row per file
/// and one column are left).
pub(super) fn fit(report: Report, budget: u64) -> Report {
    let mut size = estimate(&report);
    if size <= budget {
        return report;
    }
    let (rows, columns) = (report.rows.len().max(1), report.columns.len().max(1));
    let (mut per_row, mut per_column) = (1usize, 1usize);
    loop {
        let factor = (size as f64 / budget as f64).max(1.05);
        if rows / per_row > MIN_ROWS {
            per_row = ((per_row as f64 * factor).ceil() as usize).min(rows);
        } else if per_column < columns {
            per_column = ((per_column as f64 * factor).ceil() as usize).min(columns);
        } else if per_row < rows {
            per_row = ((per_row as f64 * factor).ceil() as usize).min(rows);
        }
        let binned = bin(&report, per_row, per_column);
        size = estimate(&binned);
        if size <= budget || (per_row >= rows && per_column >= columns) {
            return binned;
        }
    }
}

/// `report` with up to `per_row` consecutive tensors of a file per row and `per_column`
/// consecutive versions per heatmap column.
fn bin(report: &Report, per_row: usize, per_column: usize) -> Report {
    // Rows: runs of one file cut every `per_row` tensors.
    let mut rows: Vec<Row> = Vec::new();
    let mut row_of = Vec::with_capacity(report.rows.len());
    let mut run = 0;
    for (i, r) in report.rows.iter().enumerate() {
        let continues = i > 0 && report.rows[i - 1].file == r.file && run < per_row;
        if continues {
            let last = rows.last_mut().expect("a row started");
            let first = last.tensor.split(" … ").next().unwrap_or_default().to_string();
            last.tensor = format!("{first} … {}", r.tensor);
            last.tensors += 1;
            run += 1;
        } else {
            rows.push(Row { tensors: 1, ..r.clone() });
            run = 1;
        }
        row_of.push(rows.len() - 1);
    }
    // Columns: the last version of each run of `per_column`.
    let n = report.columns.len();
    let column_of: Vec<usize> = (0..n).map(|c| ((c / per_column + 1) * per_column).min(n) - 1).collect();
    let mut heat_columns: Vec<usize> = column_of.clone();
    heat_columns.dedup();
    let mut cells: BTreeMap<(usize, usize), Cell> = BTreeMap::new();
    for c in &report.cells {
        let key = (row_of[c.row], column_of[c.column]);
        match cells.get_mut(&key) {
            None => {
                cells.insert(key, Cell { row: key.0, column: key.1, ..c.clone() });
            }
            Some(into) => {
                into.rel_change = max(into.rel_change, c.rel_change);
                into.frac_changed = max(into.frac_changed, c.frac_changed);
                into.non_finite += c.non_finite;
                into.stored_bytes += c.stored_bytes;
                if c.status == Status::Compared {
                    into.status = Status::Compared;
                }
            }
        }
    }
    let binning = Binning {
        tensors_per_row: per_row,
        versions_per_column: per_column,
        note: format!(
            "Binned to keep this page light: each row holds up to {per_row} consecutive tensors of one file and \
             each heatmap column up to {per_column} consecutive versions (shown under the last); a cell shows \
             the largest relative change and fraction changed among them, and the sum of their stored bytes."
        ),
    };
    Report {
        title: report.title.clone(),
        columns: report.columns.clone(),
        heat_columns,
        rows,
        cells: cells.into_values().collect(),
        comparison: report.comparison.clone(),
        binning: Some(binning),
        computed: report.computed,
        cached: report.cached,
    }
}

fn max(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}
