//! `ckpt checkout REV [FILE...] [--output DIR] [--tensor PATTERN] [--force]`, and
//! `ckpt checkout --from URL REV [FILE...] --output DIR [--tensor PATTERN]` (no repository).

use crate::cli::ui::{bytes, one_line, open_repo, Ui};
use anyhow::{Context, Result};
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
    /// Read REV from this remote (a directory or s3://BUCKET/PREFIX) instead of a repository:
    /// only what the files (or tensors) need is downloaded, through a cache kept under
    /// $CKPT_CACHE_DIR (else ~/.cache/ckpt). Needs --output.
    #[arg(long, value_name = "URL", requires = "output")]
    from: Option<String>,
    #[command(flatten)]
    s3: super::remote::S3Args,
}

/// Runs `ckpt checkout`.
pub fn run(ui: &Ui, base: &Path, args: CheckoutArgs) -> Result<()> {
    if args.from.is_some() {
        return run_from(base, args);
    }
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
    report(&summary, args.tensor)
}

/// `ckpt checkout --from URL`: the files of REV on the remote, with no repository.
fn run_from(base: &Path, args: CheckoutArgs) -> Result<()> {
    let url = args.from.unwrap_or_default();
    ckpt::remote::check_no_secrets(&url)?;
    let output = args.output.map(|o| base.join(o)).context("--from needs --output DIR")?;
    let paths: Vec<String> = args
        .files
        .iter()
        .map(|f| f.to_str().map(|p| p.trim_start_matches("./").to_string()).context("a path that is not UTF-8"))
        .collect::<Result<_>>()?;
    // A relative directory remote is relative to where the command runs (`-C` included).
    let absolute = ckpt::sync::absolute_dir_url(&url, base);
    let shown = ckpt::remote::redact_url(&url);
    let reader = ckpt::sync::RemoteReader::open(&absolute, &args.s3.into(), ckpt::sync::ReaderCache::Kept)
        .with_context(|| format!("opening {shown}"))?;
    let options = CheckoutOptions { files: None, output: Some(output), tensor: args.tensor.clone(), force: args.force };
    let summary = reader.checkout(&args.rev, &paths, &options).with_context(|| format!("reading {shown}"))?;
    reader.close(false)?;
    report(&summary, args.tensor)
}

/// Prints what a checkout wrote; no file written for a tensor pattern is an error.
fn report(summary: &ckpt::repo::CheckoutSummary, tensor: Option<String>) -> Result<()> {
    if summary.files.is_empty() && tensor.is_some() {
        anyhow::bail!("no tensor matches {:?}", tensor.unwrap_or_default());
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
