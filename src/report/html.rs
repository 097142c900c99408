//! The page of a [`Report`]: one self-contained HTML file (inline SVG, CSS and a little script
//! for hover, collapsing groups and switching the heatmap's view), opened from disk with no
//! network: a Content-Security-Policy of `default-src 'none'` forbids every request, and the
//! markup names no URL.
//!
//! Every figure carries its numbers in `data-*` attributes (docs/guide/report.md lists them),
//! shown on hover, and in a table below it. Every name from the repository (paths, tensor
//! names, messages, tags) is escaped.

use super::{Cell, Column, Report, Status};
use std::fmt::Write;

/// The page's Content-Security-Policy: nothing is fetched, inline style and script run.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'";

/// Colour stops of the heatmap's scale (viridis), low to high.
const RAMP: [(u8, u8, u8); 5] = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)];
/// A tensor that did not change.
const UNCHANGED: &str = "#e4e4e4";
/// A tensor holding NaN or infinity (in either version).
const NON_FINITE: &str = "#ff00c8";
/// A tensor with nothing to compare against (first version, reshaped).
const EMPTY: &str = "#ffffff";
/// Colours of the files in the store chart.
const FILE_COLOURS: [&str; 8] =
    ["#3b6fb6", "#e1812c", "#3a923a", "#c03d3e", "#9372b2", "#845b53", "#d684bd", "#7f7f7f"];

/// Escapes `s` for HTML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `x` as a plain decimal (no exponent) of 6 significant digits.
fn plain(x: f64) -> String {
    let rounded: f64 = format!("{x:.5e}").parse().unwrap_or(x);
    format!("{rounded}")
}

fn plain_opt(x: Option<f64>) -> String {
    x.map(plain).unwrap_or_default()
}

/// Bytes for people: `1.5 GiB`.
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The log-scale domain of relative change: (lowest, highest) positive finite value drawn,
/// at most six decades apart.
fn domain(report: &Report) -> (f64, f64) {
    let values = report.cells.iter().filter(|c| c.non_finite == 0).filter_map(|c| c.rel_change).filter(|&x| x > 0.0);
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if hi <= 0.0 {
        return (1e-6, 1.0);
    }
    let lo = lo.max(hi * 1e-6);
    if lo >= hi {
        (hi / 10.0, hi)
    } else {
        (lo, hi)
    }
}

fn ramp(t: f64) -> String {
    let t = t.clamp(0.0, 1.0) * (RAMP.len() - 1) as f64;
    let i = (t.floor() as usize).min(RAMP.len() - 2);
    let f = t - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (RAMP[i], RAMP[i + 1]);
    format!("#{:02x}{:02x}{:02x}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// A cell's colour in the relative-change view.
fn fill(c: &Cell, (lo, hi): (f64, f64)) -> String {
    if c.non_finite > 0 {
        return NON_FINITE.into();
    }
    match (c.rel_change, c.frac_changed) {
        (_, Some(0.0)) => UNCHANGED.into(),
        (Some(x), _) if x <= 0.0 => UNCHANGED.into(),
        (Some(x), _) => ramp((x.log10() - lo.log10()) / (hi.log10() - lo.log10()).max(1e-9)),
        // No relative change (a dtype other than float, or from all zeros): by fraction.
        (None, Some(f)) => ramp(f),
        (None, None) => EMPTY.into(),
    }
}

/// The whole page of `report`.
pub fn render(report: &Report) -> String {
    let mut out = String::with_capacity(super::binning::estimate(report) as usize);
    let title = escape(&report.title);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>ckpt report: {title}</title><style>{STYLE}</style></head><body>\n\
         <h1>ckpt report <code>{title}</code></h1>\n"
    );
    summary(&mut out, report);
    if report.columns.is_empty() {
        out.push_str("<p class=\"note\">No versions to show: the repository has no commits in this range.</p>\n");
    } else {
        store_chart(&mut out, &report.columns);
        heatmap(&mut out, report);
        if report.comparison.is_some() {
            comparison(&mut out, report);
        }
        version_table(&mut out, &report.columns);
    }
    let _ = write!(out, "<div id=\"tip\" role=\"tooltip\" hidden></div>\n<script>{SCRIPT}</script>\n</body></html>\n");
    out
}

fn summary(out: &mut String, r: &Report) {
    let tensors: usize = r.rows.iter().map(|row| row.tensors).sum();
    let _ = writeln!(
        out,
        "<p class=\"summary\">{} versions, {} tensors. Tensor pairs decoded for this report: {}; read from the \
         index's cache: {}.</p>",
        r.columns.len(),
        tensors,
        r.computed,
        r.cached
    );
    if let Some(b) = &r.binning {
        let _ = writeln!(out, "<p class=\"note binned\">{}</p>", escape(&b.note));
    }
}

/// Per version: the raw size behind, what the store holds for it now in front, stacked by file;
/// below, the cumulative store against every checkpoint kept whole.
fn store_chart(out: &mut String, columns: &[Column]) {
    let mut files: Vec<&str> = Vec::new();
    for c in columns {
        for f in &c.files {
            if !files.contains(&f.path.as_str()) {
                files.push(&f.path);
            }
        }
    }
    let colour = |path: &str| FILE_COLOURS[files.iter().position(|f| *f == path).unwrap_or(0) % FILE_COLOURS.len()];
    let bar = (720.0 / columns.len() as f64).clamp(3.0, 28.0);
    let (w, h, pad) = (bar * columns.len() as f64 + 70.0, 180.0, 60.0);
    let top = columns.iter().map(|c| c.raw_bytes.max(c.stored_bytes)).max().unwrap_or(1).max(1) as f64;
    let y = |v: u64| h - (v as f64 / top) * (h - 10.0);
    let _ = write!(
        out,
        "<section id=\"store\"><h2>Store over time</h2>\
         <p>Per version: the checkpoint's raw bytes (grey) and what the store holds for it now, by file \
         (the totals are <code>ckpt log</code>'s). Top of the scale: {}.</p>\n\
         <svg class=\"chart\" width=\"{w:.0}\" height=\"{:.0}\" role=\"img\" aria-label=\"store over time\">",
        human(top as u64),
        h + 4.0
    );
    for (i, c) in columns.iter().enumerate() {
        let x = pad + i as f64 * bar;
        let _ = write!(
            out,
            "<g class=\"store-bar\" data-version=\"{}\" data-raw=\"{}\" data-stored=\"{}\">\
             <rect class=\"raw\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"/>",
            c.short,
            c.raw_bytes,
            c.stored_bytes,
            y(c.raw_bytes),
            bar * 0.9,
            h - y(c.raw_bytes)
        );
        let mut at = 0u64;
        let parts = c.files.iter().map(|f| (f.path.as_str(), f.stored_bytes));
        for (path, stored) in parts.chain(std::iter::once(("(version)", c.metadata_bytes))) {
            if stored == 0 {
                continue;
            }
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.2}\" fill=\"{}\" data-file=\"{}\" \
                 data-stored=\"{stored}\"/>",
                x + bar * 0.15,
                y(at + stored),
                bar * 0.6,
                y(at) - y(at + stored),
                colour(path),
                escape(path)
            );
            at += stored;
        }
        out.push_str("</g>");
    }
    let _ =
        writeln!(out, "<text x=\"4\" y=\"12\">{}</text><text x=\"4\" y=\"{h:.0}\">0</text></svg>", human(top as u64));
    out.push_str("<p class=\"legend\">");
    for f in &files {
        let _ = write!(out, "<span><i style=\"background:{}\"></i>{}</span> ", colour(f), escape(f));
    }
    out.push_str("<span><i class=\"rawkey\"></i>raw checkpoint</span></p>\n");
    cumulative_chart(out, columns, bar, pad);
    out.push_str(
        "<details><summary>Numbers</summary><table><thead><tr><th>version</th><th>raw</th><th>stored now</th>",
    );
    out.push_str("<th>cumulative raw</th><th>cumulative stored</th><th>per file (stored)</th></tr></thead><tbody>");
    for c in columns {
        let per_file: Vec<String> =
            c.files.iter().map(|f| format!("{}: {}", escape(&f.path), f.stored_bytes)).collect();
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.short,
            c.raw_bytes,
            c.stored_bytes,
            c.cumulative_raw,
            c.cumulative_stored,
            per_file.join("; ")
        );
    }
    out.push_str("</tbody></table></details></section>\n");
}

fn cumulative_chart(out: &mut String, columns: &[Column], bar: f64, pad: f64) {
    let (w, h) = (bar * columns.len() as f64 + 70.0, 110.0);
    let last = columns.last().expect("columns");
    let top = last.cumulative_raw.max(last.cumulative_stored).max(1) as f64;
    let point =
        |i: usize, v: u64| format!("{:.1},{:.1}", pad + (i as f64 + 0.45) * bar, h - v as f64 / top * (h - 10.0));
    let line = |f: &dyn Fn(&Column) -> u64| columns.iter().enumerate().map(|(i, c)| point(i, f(c))).collect::<Vec<_>>();
    let _ = writeln!(
        out,
        "<p>Cumulative: the store ({}) against every checkpoint kept whole ({}).</p>\
         <svg class=\"chart\" width=\"{w:.0}\" height=\"{:.0}\" role=\"img\" aria-label=\"cumulative store\">\
         <polyline class=\"whole\" points=\"{}\"/><polyline class=\"cum\" points=\"{}\"/>\
         <text x=\"4\" y=\"12\">{}</text></svg>",
        human(last.cumulative_stored),
        human(last.cumulative_raw),
        h + 4.0,
        line(&|c| c.cumulative_raw).join(" "),
        line(&|c| c.cumulative_stored).join(" "),
        human(top as u64)
    );
}

/// One row per tensor (grouped by prefix, collapsible), one cell per version holding it.
fn heatmap(out: &mut String, r: &Report) {
    let (lo, hi) = domain(r);
    let cols = r.heat_columns.len().max(1);
    let cw = (900.0 / cols as f64).clamp(3.0, 22.0);
    let x_of: std::collections::HashMap<usize, f64> =
        r.heat_columns.iter().enumerate().map(|(i, &c)| (c, i as f64 * cw)).collect();
    let width = cw * cols as f64;
    let _ = write!(
        out,
        "<section id=\"drift\"><h2>Layer drift</h2>\
         <p>Per tensor and version: the relative change against the previous version, \
         ‖w<sub>v</sub> − w<sub>v−1</sub>‖₂ / ‖w<sub>v−1</sub>‖₂ (log colour scale), or the fraction of \
         elements changed. Relative change is computed for bf16, fp16, fp32 and fp64; other dtypes show the \
         fraction changed only. NaN or infinity in a tensor has its own colour; a tensor that appears, \
         disappears or changes shape leaves a gap.</p>\n\
         <p class=\"controls\"><label><input type=\"radio\" name=\"view\" value=\"rel\" checked> relative change</label> \
         <label><input type=\"radio\" name=\"view\" value=\"frac\"> fraction changed</label> \
         <button type=\"button\" id=\"collapse-all\">collapse all</button> \
         <button type=\"button\" id=\"expand-all\">expand all</button></p>\n\
         <p class=\"legend\"><span class=\"scale\" data-lo=\"{}\" data-hi=\"{}\"><b>{}</b><i class=\"grad\"></i><b>{}</b></span> \
         <span><i style=\"background:{UNCHANGED}\"></i>unchanged</span> \
         <span><i style=\"background:{NON_FINITE}\"></i>NaN or ∞</span> \
         <span><i class=\"empty\"></i>no previous version (first, or reshaped)</span></p>\n\
         <div class=\"heat\" style=\"--w:{width:.0}px\">",
        plain(lo),
        plain(hi),
        plain(lo),
        plain(hi)
    );
    // Cells by row (they come row by row).
    let mut by_row: Vec<&[Cell]> = vec![&[]; r.rows.len()];
    let mut start = 0;
    while start < r.cells.len() {
        let row = r.cells[start].row;
        let end = start + r.cells[start..].iter().take_while(|c| c.row == row).count();
        by_row[row] = &r.cells[start..end];
        start = end;
    }
    let mut group_id = 0;
    let mut i = 0;
    while i < r.rows.len() {
        let key = (&r.rows[i].file, &r.rows[i].group);
        let n = r.rows[i..].iter().take_while(|row| (&row.file, &row.group) == key).count();
        group_id += 1;
        if n >= 2 && !key.1.is_empty() {
            group_header(out, r, &by_row[i..i + n], (group_id, key.0, key.1, n), (&x_of, cw, (lo, hi)));
        }
        for (row, cells) in r.rows[i..i + n].iter().zip(&by_row[i..i + n]) {
            let label = escape(&row.tensor);
            let _ = write!(
                out,
                "<div class=\"hrow\" data-g=\"{group_id}\"><span class=\"lab\" title=\"{}: {label}\">{label}</span>\
                 <svg width=\"{width:.0}\" height=\"12\">",
                escape(&row.file)
            );
            let (file, tensor) = (escape(&row.file), label);
            for c in cells.iter() {
                let col = &r.columns[c.column];
                let _ = write!(
                    out,
                    "<rect x=\"{:.1}\" width=\"{:.1}\" height=\"12\" fill=\"{}\" data-file=\"{file}\" data-tensor=\"{tensor}\" \
                     data-version=\"{}\" data-rel-change=\"{}\" data-frac-changed=\"{}\" data-stored=\"{}\"",
                    x_of.get(&c.column).copied().unwrap_or(0.0),
                    (cw - 1.0).max(1.0),
                    fill(c, (lo, hi)),
                    col.short,
                    plain_opt(c.rel_change),
                    plain_opt(c.frac_changed),
                    c.stored_bytes
                );
                if c.non_finite > 0 {
                    let _ = write!(out, " data-non-finite=\"{}\"", c.non_finite);
                }
                if c.status != Status::Compared {
                    let _ = write!(out, " data-status=\"{}\"", status_name(c.status));
                }
                out.push_str("/>");
            }
            out.push_str("</svg></div>\n");
        }
        i += n;
    }
    out.push_str("</div>\n");
    heat_table(out, r, &by_row);
    out.push_str("</section>\n");
}

fn status_name(s: Status) -> &'static str {
    match s {
        Status::Compared => "compared",
        Status::First => "first",
        Status::Reshaped => "reshaped",
    }
}

/// The header of a group of rows sharing a prefix: a toggle and, per version, the group's
/// largest change (what stays visible when it is collapsed).
fn group_header(
    out: &mut String,
    r: &Report,
    rows: &[&[Cell]],
    (id, file, group, n): (usize, &str, &str, usize),
    (x_of, cw, domain): (&std::collections::HashMap<usize, f64>, f64, (f64, f64)),
) {
    let width = cw * r.heat_columns.len().max(1) as f64;
    let _ = write!(
        out,
        "<div class=\"ghead\" data-g=\"{id}\"><span class=\"lab\" title=\"{}\"><button type=\"button\" \
         aria-expanded=\"true\">▾</button> {}.* ({n})</span><svg width=\"{width:.0}\" height=\"12\">",
        escape(file),
        escape(group)
    );
    let mut top: std::collections::BTreeMap<usize, Cell> = std::collections::BTreeMap::new();
    for c in rows.iter().flat_map(|cells| cells.iter()) {
        let e = top.entry(c.column).or_insert_with(|| c.clone());
        if c.rel_change > e.rel_change || c.non_finite > 0 {
            *e = c.clone();
        }
    }
    for (col, c) in top {
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" width=\"{:.1}\" height=\"12\" fill=\"{}\"/>",
            x_of.get(&col).copied().unwrap_or(0.0),
            (cw - 1.0).max(1.0),
            fill(&c, domain)
        );
    }
    out.push_str("</svg></div>\n");
}

/// The heatmap's numbers as a table: relative change (or, where there is none, the fraction
/// changed in brackets) per tensor and version.
fn heat_table(out: &mut String, r: &Report, by_row: &[&[Cell]]) {
    out.push_str("<details><summary>Numbers (relative change; [fraction changed] where there is none)</summary>");
    out.push_str("<table class=\"nums\"><thead><tr><th>tensor</th>");
    for &c in &r.heat_columns {
        let _ = write!(out, "<th><code>{}</code></th>", &r.columns[c].short);
    }
    out.push_str("</tr></thead><tbody>");
    for (row, cells) in r.rows.iter().zip(by_row) {
        let _ = write!(out, "<tr><th>{}</th>", escape(&row.tensor));
        let mut cells = cells.iter().peekable();
        for &col in &r.heat_columns {
            out.push_str("<td>");
            if let Some(c) = cells.next_if(|c| c.column == col) {
                match (c.rel_change, c.frac_changed) {
                    (Some(x), _) => out.push_str(&plain(x)),
                    (None, Some(f)) => {
                        let _ = write!(out, "[{}]", plain(f));
                    }
                    (None, None) => {}
                }
                if c.non_finite > 0 {
                    out.push_str(" NaN/∞");
                }
            }
            out.push_str("</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></details>\n");
}

/// `FROM..TO` compared directly: one bar per tensor (log scale of relative change).
fn comparison(out: &mut String, r: &Report) {
    let cmp = r.comparison.as_ref().expect("a comparison");
    let short = |id: &str| id.get(..12).unwrap_or(id).to_string();
    let values = cmp.bars.iter().filter_map(|b| b.rel_change).filter(|&x| x > 0.0);
    let (lo, hi) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if hi > 0.0 { (lo.max(hi * 1e-6).min(hi / 10.0), hi) } else { (1e-6, 1.0) };
    let scale = |x: f64| ((x.log10() - lo.log10()) / (hi.log10() - lo.log10())).clamp(0.0, 1.0);
    let _ = write!(
        out,
        "<section id=\"compare\"><h2>From <code>{}</code> to <code>{}</code></h2>\
         <p>Each tensor's relative change between the two versions directly (log scale, {} to {}); the number \
         after it is the fraction of elements changed.</p>\n<div class=\"bars\">",
        short(&cmp.from),
        short(&cmp.to),
        plain(lo),
        plain(hi)
    );
    for b in &cmp.bars {
        let len = b.rel_change.filter(|&x| x > 0.0).map_or(0.0, |x| 4.0 + 396.0 * scale(x));
        let colour = if b.non_finite > 0 {
            NON_FINITE.to_string()
        } else {
            b.rel_change.filter(|&x| x > 0.0).map_or(UNCHANGED.to_string(), |x| ramp(scale(x)))
        };
        let name = escape(&b.tensor);
        let _ = writeln!(
            out,
            "<div class=\"brow\"><span class=\"lab\" title=\"{}: {name}\">{name}</span><svg width=\"400\" height=\"12\">\
             <rect class=\"bar\" width=\"{len:.1}\" height=\"12\" fill=\"{colour}\" data-file=\"{}\" data-tensor=\"{name}\" \
             data-rel-change=\"{}\" data-frac-changed=\"{}\"/></svg><span class=\"val\">{} {}</span></div>",
            escape(&b.file),
            escape(&b.file),
            plain_opt(b.rel_change),
            plain_opt(b.frac_changed),
            if b.status == Status::Reshaped { "reshaped".to_string() } else { plain_opt(b.rel_change) },
            plain_opt(b.frac_changed)
        );
    }
    out.push_str("</div></section>\n");
}

fn version_table(out: &mut String, columns: &[Column]) {
    out.push_str(
        "<section id=\"versions\"><h2>Versions</h2><table><thead><tr><th>id</th><th>date</th><th>message</th>\
         <th>tags</th><th>files</th><th>raw</th><th>stored now</th></tr></thead><tbody>",
    );
    for c in columns.iter().rev() {
        let files: Vec<String> = c.files.iter().map(|f| escape(&f.path)).collect();
        let tags: Vec<String> = c.tags.iter().map(|t| escape(t)).collect();
        let _ = write!(
            out,
            "<tr data-version=\"{}\"><td><code title=\"{}\">{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td data-raw=\"{}\">{}</td><td data-stored=\"{}\">{}</td></tr>",
            c.short,
            c.id,
            c.short,
            c.date,
            escape(&c.message),
            tags.join(", "),
            files.join(" "),
            c.raw_bytes,
            human(c.raw_bytes),
            c.stored_bytes,
            human(c.stored_bytes)
        );
    }
    out.push_str("</tbody></table></section>\n");
}

const STYLE: &str = "body{font:13px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px}code{font-size:12px}\
.note{background:#fff6d8;padding:6px 10px;border-left:3px solid #e0b000}\
.chart{display:block;margin:6px 0}.chart text{font-size:10px;fill:#555}\
.raw{fill:#d6d6d6}.whole{fill:none;stroke:#aaa;stroke-width:2}.cum{fill:none;stroke:#3b6fb6;stroke-width:2}\
.legend span{margin-right:12px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:12px;\
vertical-align:middle;margin-right:4px;border:1px solid #bbb}.legend i.rawkey{background:#d6d6d6}\
.legend i.empty{background:#fff}.legend i.grad{width:120px;margin:0 4px;\
background:linear-gradient(90deg,#440154,#3b528b,#21918c,#5ec962,#fde725)}\
.heat,.bars{overflow-x:auto}.hrow,.ghead,.brow{display:flex;align-items:center;height:13px;white-space:nowrap}\
.lab{flex:0 0 340px;overflow:hidden;text-overflow:ellipsis;font:11px ui-monospace,monospace;padding-right:6px}\
.ghead .lab{font-weight:bold}.ghead button{font-size:9px;padding:0 3px;line-height:11px}\
.hrow .lab{padding-left:14px}.hrow rect[data-status]{stroke:#ccc;stroke-width:.5}\
.val{font:11px ui-monospace,monospace;padding-left:6px}\
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;\
font-size:11px}.nums td{text-align:right}\
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;padding:4px 8px;\
border-radius:3px;white-space:pre;z-index:9}";

const SCRIPT: &str = r#"(function(){
var tip=document.getElementById('tip');
function human(n){n=Number(n);var u=['B','KiB','MiB','GiB','TiB'],i=0;while(n>=1024&&i<4){n/=1024;i++;}return (i?n.toFixed(1):n)+' '+u[i];}
function val(s){return s===''||s===undefined?'\u2014':s;}
function text(el){var d=el.dataset;
 if(d.tensor!==undefined&&d.version!==undefined){return d.file+'\n'+d.tensor+'\nversion '+d.version+'\nrelative change '+val(d.relChange)+'\nfraction changed '+val(d.fracChanged)+(d.nonFinite?'\nNaN or \u221e in '+d.nonFinite+' elements':'')+(d.status?'\n('+d.status+')':'')+'\nstored '+human(d.stored);}
 if(d.tensor!==undefined){return d.file+'\n'+d.tensor+'\nrelative change '+val(d.relChange)+'\nfraction changed '+val(d.fracChanged);}
 var g=el.closest('.store-bar');if(g){var t='version '+g.dataset.version+'\nraw '+human(g.dataset.raw)+'\nstored now '+human(g.dataset.stored);if(d.file){t+='\n'+d.file+': '+human(d.stored);}return t;}
 return null;}
document.addEventListener('mousemove',function(e){var t=e.target&&e.target.closest?text(e.target):null;
 if(!t){tip.hidden=true;return;}tip.textContent=t;tip.hidden=false;
 tip.style.left=Math.min(e.clientX+14,window.innerWidth-260)+'px';tip.style.top=(e.clientY+14)+'px';});
var stops=[[68,1,84],[59,82,139],[33,145,140],[94,201,98],[253,231,37]];
function ramp(t){t=Math.max(0,Math.min(1,t))*(stops.length-1);var i=Math.min(Math.floor(t),stops.length-2),f=t-i,a=stops[i],b=stops[i+1];
 return 'rgb('+[0,1,2].map(function(k){return Math.round(a[k]+(b[k]-a[k])*f);}).join(',')+')';}
var cells=document.querySelectorAll('#drift rect[data-tensor]');
document.querySelectorAll('input[name=view]').forEach(function(r){r.addEventListener('change',function(){
 var frac=this.value==='frac';cells.forEach(function(c){if(c.dataset.f0===undefined){c.dataset.f0=c.getAttribute('fill');}
  if(!frac||c.dataset.nonFinite){c.setAttribute('fill',c.dataset.f0);return;}
  var f=c.dataset.fracChanged;c.setAttribute('fill',f===''?'#ffffff':Number(f)===0?'#e4e4e4':ramp(Number(f)));});});});
function toggle(head,open){var b=head.querySelector('button');b.setAttribute('aria-expanded',open);b.textContent=open?'\u25be':'\u25b8';
 document.querySelectorAll('.hrow[data-g="'+head.dataset.g+'"]').forEach(function(r){r.hidden=!open;});}
document.querySelectorAll('.ghead button').forEach(function(b){b.addEventListener('click',function(){
 var h=this.closest('.ghead');toggle(h,this.getAttribute('aria-expanded')!=='true');});});
var ca=document.getElementById('collapse-all'),ea=document.getElementById('expand-all');
if(ca){ca.addEventListener('click',function(){document.querySelectorAll('.ghead').forEach(function(h){toggle(h,false);});});}
if(ea){ea.addEventListener('click',function(){document.querySelectorAll('.ghead').forEach(function(h){toggle(h,true);});});}
})();"#;
