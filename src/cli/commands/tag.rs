//! `ckpt tag [NAME [REV]] | -f NAME [REV] | -d NAME [--json]`.

use crate::cli::ui::{open_repo, printable, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt tag`.
#[derive(clap::Args, Debug)]
pub struct TagArgs {
    /// Tag to create (without it: list tags).
    name: Option<String>,
    /// Version to tag (default: HEAD).
    rev: Option<String>,
    /// Delete tag NAME.
    #[arg(short = 'd', long = "delete", conflicts_with = "force")]
    delete: bool,
    /// Move tag NAME to REV if it exists (create it otherwise).
    #[arg(short = 'f', long = "force")]
    force: bool,
    /// List tags as a JSON array of {name, id}.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct JsonTag {
    name: String,
    id: String,
}

/// Runs `ckpt tag`.
pub fn run(ui: &Ui, base: &Path, args: TagArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    anyhow::ensure!(!((args.delete || args.force) && args.name.is_none()), "name the tag (ckpt tag -d NAME)");
    anyhow::ensure!(!(args.json && args.name.is_some()), "--json lists tags; it takes no NAME");
    match args.name {
        Some(name) if args.delete => {
            anyhow::ensure!(args.rev.is_none(), "ckpt tag -d takes one name");
            let deleted = repo.delete_tag(&name)?;
            outln!("deleted tag {name} (was {})", deleted.id.short(12))?;
        }
        Some(name) if args.force => {
            let (id, old) = repo.move_tag(&name, args.rev.as_deref())?;
            match old {
                Some(old) if old != id => outln!("tag {name} -> {} (was {})", id.short(12), old.short(12))?,
                _ => outln!("tag {name} -> {}", id.short(12))?,
            }
        }
        Some(name) => {
            let id = repo.tag(&name, args.rev.as_deref())?;
            outln!("tag {name} -> {}", id.short(12))?;
        }
        None if args.json => {
            let tags: Vec<JsonTag> =
                repo.tags()?.into_iter().map(|(name, id)| JsonTag { name, id: id.to_hex() }).collect();
            crate::cli::ui::print_json(&tags)?;
        }
        None => {
            for (name, id) in repo.tags()? {
                outln!("{}\t{id}", printable(&name))?;
            }
        }
    }
    Ok(())
}
