//! `ckpt branch [NAME [REV]]`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt branch`.
#[derive(clap::Args, Debug)]
pub struct BranchArgs {
    /// Branch to create (without it: list branches, `*` marking the current one).
    name: Option<String>,
    /// Where the branch starts (default: HEAD).
    rev: Option<String>,
}

/// Runs `ckpt branch`.
pub fn run(ui: &Ui, base: &Path, args: BranchArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    match args.name {
        Some(name) => {
            let id = repo.create_branch(&name, args.rev.as_deref())?;
            outln!("branch {name} -> {}", id.short(12))?;
        }
        None => {
            for b in repo.branches()? {
                outln!("{} {}\t{}", if b.current { '*' } else { ' ' }, b.name, b.id)?;
            }
        }
    }
    Ok(())
}
