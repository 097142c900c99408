//! `ckpt pull [REMOTE] [--json]`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::{Context, Result};
use ckpt::sync::PullOutcome;
use std::path::Path;

/// Arguments of `ckpt pull`.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// The remote (default: origin, or the only remote).
    remote: Option<String>,
    /// If the branch has diverged, put its own versions (same files and messages) on top of
    /// the remote's instead of failing.
    #[arg(long)]
    rebase: bool,
    /// Machine-readable summary of the fetch.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt pull`.
pub fn run(ui: &Ui, base: &Path, args: PullArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let remote = crate::cli::ui::remote_or_default(&repo, args.remote)?;
    let (report, outcome) = ckpt::sync::pull(&repo, &remote, crate::cli::ui::transfers(), args.rebase)
        .with_context(|| format!("pulling from {remote}"))?;
    super::fetch::print(&report, args.json)?;
    match outcome {
        PullOutcome::UpToDate => eprintln!("already up to date"),
        PullOutcome::Ahead => eprintln!("the branch is ahead of {remote}: nothing to pull (push it)"),
        PullOutcome::Rebased { from, onto, to } => {
            eprintln!("rebased {} onto {}: now {} (same files; push it)", from.short(12), onto.short(12), to.short(12))
        }
        PullOutcome::FastForwarded { from, to } => eprintln!(
            "fast-forwarded {} -> {} and checked it out",
            from.map_or_else(|| "(no version)".to_string(), |f| f.short(12)),
            to.short(12)
        ),
    }
    Ok(())
}
