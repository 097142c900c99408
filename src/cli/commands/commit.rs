//! `ckpt commit -m MSG FILE...`.

use crate::cli::ui::{bytes, open_repo, Ui};
use crate::repo::CommitOptions;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt commit`.
#[derive(clap::Args, Debug)]
pub struct CommitArgs {
    /// Commit message.
    #[arg(short, long)]
    message: String,
    /// Files to store (files committed before and not named stay in the version).
    files: Vec<PathBuf>,
}

/// Runs `ckpt commit`.
pub fn run(ui: &Ui, base: &Path, args: CommitArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let files: Vec<PathBuf> = args.files.iter().map(|f| base.join(f)).collect();
    let id = repo.commit(&files, &args.message, &CommitOptions::default())?;
    let info = repo.version_info(&id)?;
    println!(
        "version {}: {} file{}, {} stored for {} ({:.1}%)",
        id.short(12),
        info.files.len(),
        if info.files.len() == 1 { "" } else { "s" },
        bytes(info.stored_bytes),
        bytes(info.raw_bytes),
        100.0 * info.stored_bytes as f64 / info.raw_bytes.max(1) as f64
    );
    Ok(())
}
