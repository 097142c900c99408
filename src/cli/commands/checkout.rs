//! `ckpt checkout REV [FILE...] [--output DIR] [--tensor PATTERN] [--force]`.

use crate::cli::ui::{bytes, one_line, open_repo, Ui};
use anyhow::Result;
use ckpt::repo::CheckoutOptions;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt checkout`.
#[derive(clap::Args, Debug)]
pub struct CheckoutArgs {
    /// Version: id (full or unique prefix), tag, branch, HEAD, each optionally with ~N.
    rev: String,
    /// Only these files, or the files under these directories (default: every file of the version).
    files: Vec<PathBuf>,
    /// Write under this directory instead of the working tree.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Into the working tree, also overwrite files with changes the repository does not hold
    /// (modified tracked files, untracked files in the way, a directory where a file goes), and
    /// let --tensor replace whole working files; with --output, overwrite files there that hold
    /// other bytes.
    #[arg(long, short)]
    force: bool,
    /// Only tensors whose name matches: a glob if it contains `*` or `?` (matching the whole
    /// name), else a substring. Writes valid safetensors files holding just those tensors
    /// (into the working tree only with --force: it replaces the whole files).
    #[arg(long, value_name = "PATTERN")]
    tensor: Option<String>,
}

/// Runs `ckpt checkout`.
pub fn run(ui: &Ui, base: &Path, args: CheckoutArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let files: Vec<PathBuf> = args.files.iter().map(|f| base.join(f)).collect();
    let output = args.output.map(|o| base.join(o));
    let options = CheckoutOptions {
        files: (!files.is_empty()).then_some(files),
        output,
        tensor: args.tensor.clone(),
        force: args.force,
    };
    // In a partial clone, a version outside its history is downloaded first.
    let rev = if repo.partial_clone()?.is_some() {
        ckpt::sync::fetch_revision(&repo, &args.rev, crate::cli::ui::transfers())?.to_hex()
    } else {
        args.rev.clone()
    };
    let summary = repo.checkout_with(&rev, &options).map_err(one_line)?;
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
