//! `ckpt rm FILE...`.

use crate::cli::ui::{open_repo, printable, Ui};
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt rm`.
#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// Files, or directories (every file tracked under them), to stop tracking from the next
    /// version on (the files themselves are kept).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Runs `ckpt rm`.
pub fn run(ui: &Ui, base: &Path, args: RmArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let files: Vec<PathBuf> = args.files.iter().map(|f| base.join(f)).collect();
    for p in repo.rm(&files)? {
        outln!("rm {} (untracked from the next commit on)", printable(p.as_str()))?;
    }
    Ok(())
}
