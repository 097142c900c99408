//! `ckpt checkout REV [FILE...] [--output DIR] [--tensor PATTERN]`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt checkout`.
#[derive(clap::Args, Debug)]
pub struct CheckoutArgs {
    /// Version: id (full or unique prefix), tag, branch, HEAD, each optionally with ~N.
    rev: String,
    /// Only these files (default: every file of the version).
    files: Vec<PathBuf>,
    /// Write under this directory instead of the working tree.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Only tensors whose name matches: a glob if it contains `*` or `?` (matching the whole
    /// name), else a substring. Writes valid safetensors files holding just those tensors.
    #[arg(long, value_name = "PATTERN")]
    tensor: Option<String>,
}

/// Runs `ckpt checkout`.
pub fn run(ui: &Ui, base: &Path, args: CheckoutArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let files: Vec<PathBuf> = args.files.iter().map(|f| base.join(f)).collect();
    let output = args.output.map(|o| base.join(o));
    let summary = repo.checkout(
        &args.rev,
        (!files.is_empty()).then_some(files.as_slice()),
        output.as_deref(),
        args.tensor.as_deref(),
    )?;
    if summary.files.is_empty() && args.tensor.is_some() {
        anyhow::bail!("no tensor matches {:?}", args.tensor.unwrap_or_default());
    }
    eprintln!(
        "checked out {} file{} ({}) of version {}",
        summary.files.len(),
        if summary.files.len() == 1 { "" } else { "s" },
        bytes(summary.bytes),
        summary.version.short(12)
    );
    Ok(())
}
