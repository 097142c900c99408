//! `ckpt gc`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt gc`.
#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt gc`.
pub fn run(ui: &Ui, base: &Path, args: GcArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    // Deltas still pending make the store smaller too: finish them first.
    repo.compact(&ckpt::repo::CompactOptions::default())?;
    let r = repo.gc()?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&r)?)?;
    } else {
        outln!(
            "{} versions reachable; kept {} objects, deleted {} ({}), removed {} temp files",
            r.versions,
            r.kept,
            r.deleted,
            bytes(r.bytes_freed),
            r.temp_files
        )?;
    }
    Ok(())
}
