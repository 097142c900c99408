//! `ckpt tag [NAME [REV]]`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt tag`.
#[derive(clap::Args, Debug)]
pub struct TagArgs {
    /// Tag to create (without it: list tags).
    name: Option<String>,
    /// Version to tag (default: HEAD).
    rev: Option<String>,
}

/// Runs `ckpt tag`.
pub fn run(ui: &Ui, base: &Path, args: TagArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    match args.name {
        Some(name) => {
            let id = repo.tag(&name, args.rev.as_deref())?;
            outln!("tag {name} -> {}", id.short(12))?;
        }
        None => {
            for (name, id) in repo.tags()? {
                outln!("{name}\t{id}")?;
            }
        }
    }
    Ok(())
}
