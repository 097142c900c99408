//! `ckpt branch [NAME [REV]] | -d NAME | -D NAME | -m OLD NEW [--json]`.

use crate::cli::ui::{open_repo, printable, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt branch`.
#[derive(clap::Args, Debug)]
pub struct BranchArgs {
    /// Branch to create (without it: list branches, `*` marking the current one).
    name: Option<String>,
    /// Where the branch starts (default: HEAD); with -m, the new name.
    rev: Option<String>,
    /// Delete branch NAME; refused for the current branch, and for a branch whose versions no
    /// other branch, tag or HEAD reaches (the next gc would delete them).
    #[arg(short = 'd', long = "delete", conflicts_with_all = ["force_delete", "rename"])]
    delete: bool,
    /// Delete branch NAME even if no other ref reaches its versions.
    #[arg(short = 'D', conflicts_with = "rename")]
    force_delete: bool,
    /// Rename branch NAME to the second argument (HEAD follows).
    #[arg(short = 'm', long = "move")]
    rename: bool,
    /// List branches as a JSON array of {name, id, current}.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt branch`.
pub fn run(ui: &Ui, base: &Path, args: BranchArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let needs_name = args.delete || args.force_delete || args.rename;
    anyhow::ensure!(!(needs_name && args.name.is_none()), "name the branch (ckpt branch -d NAME, -m OLD NEW)");
    anyhow::ensure!(!(args.json && args.name.is_some()), "--json lists branches; it takes no NAME");
    match args.name {
        Some(name) if args.delete || args.force_delete => {
            anyhow::ensure!(args.rev.is_none(), "ckpt branch -d takes one name");
            let deleted = repo.delete_branch(&name, args.force_delete)?;
            outln!("deleted branch {name} (was {})", deleted.id.short(12))?;
        }
        Some(old) if args.rename => {
            let new = args.rev.ok_or_else(|| anyhow::anyhow!("ckpt branch -m OLD NEW: name the new branch"))?;
            let id = repo.rename_branch(&old, &new)?;
            outln!("renamed branch {old} to {new} ({})", id.short(12))?;
        }
        Some(name) => {
            let id = repo.create_branch(&name, args.rev.as_deref())?;
            outln!("branch {name} -> {}", id.short(12))?;
        }
        None if args.json => {
            crate::cli::ui::print_json(&repo.branches()?)?;
        }
        None => {
            for b in repo.branches()? {
                outln!("{} {}\t{}", if b.current { '*' } else { ' ' }, printable(&b.name), b.id)?;
            }
        }
    }
    Ok(())
}
