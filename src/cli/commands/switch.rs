//! `ckpt switch NAME [--force]`.

use crate::cli::ui::{one_line, open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt switch`.
#[derive(clap::Args, Debug)]
pub struct SwitchArgs {
    /// Branch to switch to; its files are checked out into the working tree.
    name: String,
    /// Overwrite or remove files with changes the repository does not hold (modified tracked
    /// files, untracked files in the way, a directory holding untracked files where the branch
    /// has a file: deleted whole, as with `git checkout -f`).
    #[arg(long, short)]
    force: bool,
}

/// Runs `ckpt switch`.
pub fn run(ui: &Ui, base: &Path, args: SwitchArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    repo.switch(&args.name, args.force).map_err(one_line)?;
    eprintln!("switched to branch {}", args.name);
    Ok(())
}
