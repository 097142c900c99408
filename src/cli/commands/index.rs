//! `ckpt index rebuild`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt index`.
#[derive(clap::Args, Debug)]
pub struct IndexArgs {
    #[command(subcommand)]
    action: IndexAction,
}

#[derive(clap::Subcommand, Debug)]
enum IndexAction {
    /// Rebuild the index from the object store.
    Rebuild,
}

/// Runs `ckpt index`.
pub fn run(ui: &Ui, base: &Path, args: IndexArgs) -> Result<()> {
    let mut repo = open_repo(ui, base)?;
    match args.action {
        IndexAction::Rebuild => {
            let n = repo.rebuild_index()?;
            outln!("indexed {n} objects")?;
        }
    }
    Ok(())
}
