//! `ckpt diff REV1 REV2 [--json]`.

use crate::cli::ui::{bytes, open_repo, printable, Ui};
use anyhow::Result;
use std::io::Write;
use std::path::Path;

/// Arguments of `ckpt diff`.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The older version.
    rev1: String,
    /// The newer version.
    rev2: String,
    /// One JSON object: per-tensor changes, tensors and files added, removed, reshaped.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt diff`.
pub fn run(ui: &Ui, base: &Path, args: DiffArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let r = repo.diff(&args.rev1, &args.rev2)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        // Serialized first: a closed pipe then surfaces as an io::Error (exit 0, like log).
        return crate::cli::ui::print_json(&r);
    }
    writeln!(out, "diff {} {}", r.from.short(12), r.to.short(12))?;
    // Sizes of the files added, removed or changed, from the two versions.
    let (va, vb) = (repo.version(&r.from)?, repo.version(&r.to)?);
    let len_in = |v: &ckpt::repo::Version, path: &str| v.file(path).map_or(0, |f| f.len);
    let mut file = "";
    for t in &r.tensors {
        if t.file != file {
            file = &t.file;
            writeln!(out, "{}", printable(file))?;
        }
        let groups: Vec<String> = t.byte_groups.iter().map(|g| format!("{:.2}", g.percent)).collect();
        let max = match t.max_abs_delta {
            Some(m) => format!("  max|Δ| {m:.3e}"),
            None => String::new(),
        };
        let non_finite = if t.non_finite > 0 { format!(" ({} non-finite)", t.non_finite) } else { String::new() };
        writeln!(
            out,
            "  {:<32} {:<5} {:>7.2}% changed  bytes% [{}]{max}{non_finite}",
            printable(&t.name),
            t.dtype,
            t.percent_changed,
            groups.join(" ")
        )?;
    }
    for f in &r.files_added {
        writeln!(out, "file added    {} ({})", printable(f), bytes(len_in(&vb, f)))?;
    }
    for f in &r.files_removed {
        writeln!(out, "file removed  {} ({})", printable(f), bytes(len_in(&va, f)))?;
    }
    // Every file whose bytes differ, tensors or not (opaque files, torch archives' other
    // records, safetensors headers): the tensor lines above do not show those bytes.
    for f in &r.files_changed {
        let in_tensors = r.tensors.iter().any(|t| t.file == *f && t.changed > 0)
            || r.added.iter().chain(&r.removed).any(|t| t.file == *f)
            || r.reshaped.iter().any(|t| t.file == *f);
        writeln!(
            out,
            "file changed  {} ({} -> {}){}",
            printable(f),
            bytes(len_in(&va, f)),
            bytes(len_in(&vb, f)),
            if in_tensors { "" } else { ": no tensor changed; other bytes differ" }
        )?;
    }
    for t in &r.added {
        writeln!(out, "added    {} [{}] {} {:?}", printable(&t.file), printable(&t.name), t.dtype, t.shape)?;
    }
    for t in &r.removed {
        writeln!(out, "removed  {} [{}] {} {:?}", printable(&t.file), printable(&t.name), t.dtype, t.shape)?;
    }
    for t in &r.reshaped {
        writeln!(
            out,
            "reshaped {} [{}] {} {:?} -> {} {:?}",
            printable(&t.file),
            printable(&t.name),
            t.from_dtype,
            t.from_shape,
            t.to_dtype,
            t.to_shape
        )?;
    }
    let changed = r.tensors.iter().filter(|t| t.changed > 0).count();
    writeln!(
        out,
        "{} tensors compared, {changed} changed; {} added, {} removed, {} reshaped; files: {} changed, {} added, {} removed",
        r.tensors.len(),
        r.added.len(),
        r.removed.len(),
        r.reshaped.len(),
        r.files_changed.len(),
        r.files_added.len(),
        r.files_removed.len()
    )?;
    Ok(())
}
