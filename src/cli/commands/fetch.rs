//! `ckpt fetch [REMOTE] [--json]`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::{Context, Result};
use ckpt::sync::FetchReport;
use std::path::Path;

/// Arguments of `ckpt fetch`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// The remote (default: origin, or the only remote).
    remote: Option<String>,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
}

/// Prints what a fetch did (stderr), or its JSON (stdout).
pub fn print(report: &FetchReport, json: bool) -> Result<()> {
    if json {
        return crate::cli::ui::print_json(report);
    }
    crate::cli::ui::print_updated(&report.updated);
    eprintln!(
        "{}: received {} objects ({}), {} requests",
        report.remote,
        report.objects_received,
        bytes(report.bytes_received),
        report.requests
    );
    Ok(())
}

/// Runs `ckpt fetch`.
pub fn run(ui: &Ui, base: &Path, args: FetchArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let remote = crate::cli::ui::remote_or_default(&repo, args.remote)?;
    let report = ckpt::sync::fetch(&repo, &remote, crate::cli::ui::transfers())
        .with_context(|| format!("fetching from {remote}"))?;
    print(&report, args.json)
}
