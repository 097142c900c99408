//! `ckpt show REV [--json]`.

use crate::cli::ui::{bytes, open_repo, printable, printable_text, Ui};
use anyhow::Result;
use ckpt::repo::{FileFormat, MethodCounts, SegmentShow, Storage};
use std::io::Write;
use std::path::Path;

/// Arguments of `ckpt show`.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// The version (default: HEAD).
    #[arg(default_value = "HEAD")]
    rev: String,
    /// One JSON object: the version, its files and segments, totals.
    #[arg(long)]
    json: bool,
}

fn mix(m: &MethodCounts) -> String {
    let parts: Vec<String> = [
        ("raw", m.raw),
        ("zero", m.zero),
        ("huff", m.huffman),
        ("zstd", m.zstd),
        ("sparse", m.sparse),
        ("rans", m.rans),
        ("paired", m.paired),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(name, n)| format!("{name} {n}"))
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

fn how(s: &SegmentShow) -> String {
    let form = match (&s.derived_from, s.reference) {
        (Some(d), _) => format!("derived from {} ({}) d={}", d.tensor, d.rule, s.depth),
        (None, Some(r)) => format!("delta vs {} d={}", r.short(8), s.depth),
        (None, None) => "base".into(),
    };
    match s.storage {
        Storage::Duplicate => format!("duplicate ({form})"),
        _ => form,
    }
}

/// Runs `ckpt show`.
pub fn run(ui: &Ui, base: &Path, args: ShowArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let r = repo.show(&args.rev)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        // Serialized first: a closed pipe then surfaces as an io::Error (exit 0, like log).
        return crate::cli::ui::print_json(&r);
    }
    writeln!(out, "version {}", r.id)?;
    let parents: Vec<String> = r.parents.iter().map(|p| p.to_hex()).collect();
    writeln!(out, "parents {}", if parents.is_empty() { "-".into() } else { parents.join(" ") })?;
    writeln!(out, "date    {}", r.date)?;
    writeln!(out)?;
    for line in printable_text(&r.message).lines() {
        writeln!(out, "    {line}")?;
    }
    writeln!(out)?;
    for f in &r.files {
        writeln!(
            out,
            "{} ({}, {}, {} stored, {} added)",
            printable(&f.path),
            format!("{:?}", f.kind).to_lowercase(),
            bytes(f.raw_bytes),
            bytes(f.stored_bytes),
            bytes(f.added_bytes)
        )?;
        // A DCP rank file has a `torch.save` archive's framing before every item: listed as one
        // line after the items (`--json` has each).
        let fold_framing = f.kind == FileFormat::Distcp;
        let mut framing = (0u64, 0u64, 0u64, 0u64, MethodCounts::default());
        for s in &f.segments {
            if fold_framing && !s.is_tensor {
                framing.0 += 1;
                framing.1 += s.raw_bytes;
                framing.2 += s.stored_bytes;
                framing.3 += u64::from(s.reference.is_some() || s.derived_from.is_some());
                framing.4.add(&s.methods);
                continue;
            }
            let kind = match (&s.dtype, &s.shape) {
                (Some(d), Some(shape)) => format!("{d} {shape:?}"),
                _ => String::new(),
            };
            writeln!(
                out,
                "  {:<32} {:<18} {:>10} -> {:>10}  {:<28} {}",
                printable(&s.name),
                kind,
                bytes(s.raw_bytes),
                bytes(s.stored_bytes),
                how(s),
                mix(&s.methods)
            )?;
        }
        let (count, raw, stored, deltas, methods) = framing;
        if count > 0 {
            writeln!(
                out,
                "  {:<32} {:<18} {:>10} -> {:>10}  {:<28} {}",
                format!("(framing of {count} archives)"),
                "",
                bytes(raw),
                bytes(stored),
                format!("{deltas} as deltas"),
                mix(&methods)
            )?;
        }
    }
    let t = &r.totals;
    writeln!(out)?;
    writeln!(
        out,
        "total   {} files, {} tensors: {} base, {} delta, {} duplicate",
        t.files, t.tensors, t.base, t.delta, t.duplicate
    )?;
    writeln!(
        out,
        "bytes   {} raw, {} stored ({:.1}%), {} added by this version",
        bytes(t.raw_bytes),
        bytes(t.stored_bytes),
        100.0 * t.stored_bytes as f64 / t.raw_bytes.max(1) as f64,
        bytes(t.added_bytes)
    )?;
    writeln!(out, "methods {}", mix(&t.methods))?;
    Ok(())
}
