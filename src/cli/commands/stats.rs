//! `ckpt stats FILE [--json]`: where every byte goes.

use crate::cli::ui::{map_file, Ui};
use anyhow::{Context, Result};
use ckpt::codec::container::{is_container, Container};
use ckpt::codec::{Method, Options};
use ckpt::file_codec::{self, Format, Report};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `ckpt stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// A container (.ckz), or any file: it is compressed in memory first.
    file: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt stats`.
pub fn run(_ui: &Ui, args: StatsArgs) -> Result<()> {
    let input = map_file(&args.file)?;
    let owned;
    let bytes: &[u8] = if is_container(&input) {
        &input
    } else {
        let format = if args.file.extension().is_some_and(|e| e == "safetensors") {
            Format::Safetensors
        } else {
            Format::Detect
        };
        let coded = file_codec::compress(&input, format, &Options::default(), Vec::new(), &mut |_| {});
        input.check_unchanged()?;
        let (out, _) = coded.with_context(|| format!("{}", args.file.display()))?;
        owned = out;
        &owned
    };
    let container = Container::open(bytes).with_context(|| format!("{}", args.file.display()))?;
    let report = file_codec::analyze(&container);
    // A file that shrank while it was read gave zeros past its new end: no statistics of it.
    input.check_unchanged()?;
    let report = report.with_context(|| format!("{}", args.file.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        crate::cli::ui::print_json(&report)?;
    } else {
        print_table(&mut out, &report)?;
    }
    Ok(())
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part / whole
    } else {
        0.0
    }
}

fn print_table(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    write!(
        out,
        "{:<8} {:>5} {:>14} {:>14} {:>8} {:>9} {:>9} {:>9}",
        "dtype", "group", "raw bytes", "stored bytes", "stored%", "entropy%", "order1%", "adapt1%"
    )?;
    for m in Method::ALL {
        write!(out, " {:>7}", m.name())?;
    }
    writeln!(out)?;
    for g in &r.groups {
        write!(
            out,
            "{:<8} {:>5} {:>14} {:>14} {:>7.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
            g.dtype,
            g.group,
            g.raw_bytes,
            g.stored_bytes,
            pct(g.stored_bytes as f64, g.raw_bytes as f64),
            pct(g.entropy_bytes, g.raw_bytes as f64),
            pct(g.order1_entropy_bytes, g.raw_bytes as f64),
            pct(g.order1_adaptive_bytes, g.raw_bytes as f64),
        )?;
        // `methods` is indexed by method tag, which is `Method::ALL`'s order.
        for count in g.methods {
            write!(out, " {count:>7}")?;
        }
        writeln!(out)?;
    }
    for structure in &r.structures {
        writeln!(out, "{structure}")?;
    }
    writeln!(out, "index and framing: {} bytes", r.overhead_bytes)?;
    if r.copied_bytes > 0 {
        writeln!(out, "copied: {} bytes stored as copies of earlier tensors", r.copied_bytes)?;
    }
    writeln!(
        out,
        "total: {} -> {} bytes ({:.2}% of the original)",
        r.original_bytes,
        r.stored_bytes,
        pct(r.stored_bytes as f64, r.original_bytes as f64)
    )
}
