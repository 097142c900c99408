//! `ckpt status [--json]`.

use crate::cli::ui::{open_repo, printable, printable_text, Ui};
use anyhow::Result;
use ckpt::repo::FileState;
use std::io::Write;
use std::path::Path;

/// Arguments of `ckpt status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt status`.
pub fn run(ui: &Ui, base: &Path, args: StatusArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let status = repo.status()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        crate::cli::ui::print_json(&status)?;
        return Ok(());
    }
    match (&status.branch, &status.head) {
        (Some(b), Some(id)) => writeln!(out, "On branch {b}, version {}", id.short(12))?,
        (Some(b), None) => writeln!(out, "On branch {b}, no version yet")?,
        (None, Some(id)) => writeln!(out, "HEAD detached at version {}", id.short(12))?,
        (None, None) => {}
    }
    let mut unchanged = 0;
    for f in &status.files {
        let label = match f.state {
            FileState::Unchanged => {
                unchanged += 1;
                continue;
            }
            FileState::Modified => "modified",
            FileState::Missing => "missing",
            FileState::Removed => "removed",
        };
        writeln!(out, "  {label:<9} {}", printable(&f.path))?;
    }
    writeln!(out, "{unchanged} of {} tracked files unchanged", status.files.len())?;
    for w in &status.in_the_way {
        let s = if w.branches.len() == 1 { "" } else { "es" };
        writeln!(
            out,
            "  untracked {} (tracked by branch{s} {}: a switch there needs --force unless the content is the same)",
            printable(&w.path),
            w.branches.join(", ")
        )?;
    }
    for path in &status.untracked {
        writeln!(
            out,
            "  untracked {} (beside tracked files: `ckpt commit` of its directory adds it)",
            printable(path)
        )?;
    }
    if status.pending_deltas > 0 {
        let n = status.pending_deltas;
        let s = if n == 1 { "" } else { "s" };
        writeln!(
            out,
            "{n} version{s} still to be turned into deltas (by the background compaction, or `ckpt compact`)"
        )?;
    }
    if let Some(log) = &status.compaction_log {
        writeln!(out, "compaction reported (.ckpt/compact.log; retried by the next compaction):")?;
        for line in printable_text(log).lines() {
            writeln!(out, "  {line}")?;
        }
    }
    Ok(())
}
