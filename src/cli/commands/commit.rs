//! `ckpt commit -m MSG FILE...`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use ckpt::repo::{CommitOptions, Compaction};
use std::path::{Path, PathBuf};

/// Arguments of `ckpt commit`.
#[derive(clap::Args, Debug)]
pub struct CommitArgs {
    /// Commit message.
    #[arg(short, long)]
    message: String,
    /// Files to store; a directory stands for every file under it, and files tracked under it
    /// that are gone leave the version (files committed before and not named stay in it).
    files: Vec<PathBuf>,
}

/// Runs `ckpt commit`.
pub fn run(ui: &Ui, base: &Path, args: CommitArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let files: Vec<PathBuf> = args.files.iter().map(|f| base.join(f)).collect();
    let compaction = Compaction::from_env_or(repo.config().compact).map_err(anyhow::Error::msg)?;
    let options = CommitOptions { defer_deltas: compaction != Compaction::Inline, ..CommitOptions::default() };
    let id = repo.commit(&files, &args.message, &options)?;
    // From the store, not `version_info`: that would open the index, which the commit avoided.
    let info = repo.version(&id)?;
    let background = compaction == Compaction::Background && repo.has_pending_deltas();
    // A closed stdout must not keep the compaction from starting: its error is returned last.
    let printed = outln!(
        "version {}: {} file{}, {} stored for {} ({:.1}%){}",
        id.short(12),
        info.files.len(),
        if info.files.len() == 1 { "" } else { "s" },
        bytes(info.stored_bytes),
        bytes(info.raw_bytes),
        100.0 * info.stored_bytes as f64 / info.raw_bytes.max(1) as f64,
        if background { "; the previous version becomes deltas in the background" } else { "" }
    );
    if compaction == Compaction::Inline && repo.has_pending_deltas() {
        // Inline compaction failed (a full disk): the version is committed all the same, and
        // the rewrite is left pending for a later compaction.
        eprintln!(
            "warning: version {} is committed, but rewriting its parent as deltas failed; it stays pending \
             (`ckpt compact` retries it):\n{}",
            id.short(12),
            crate::cli::ui::printable_text(&repo.compaction_log().unwrap_or_default())
        );
    }
    if background {
        // Closed first, so that the compaction finds the index free.
        let root = repo.root().to_path_buf();
        drop(repo);
        // The commit is complete without it: a failure to start only leaves the work pending
        // for the next commit or `ckpt compact`.
        if let Err(e) = super::compact::start_in_background(&root) {
            eprintln!("warning: could not start the background compaction ({e}); run `ckpt compact`");
        }
    }
    Ok(printed?)
}
