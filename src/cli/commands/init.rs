//! `ckpt init [DIR]`.

use crate::cli::ui::Ui;
use anyhow::Result;
use ckpt::repo::Repo;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt init`.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Directory to create the repository in (default: the current directory).
    // Its own id: named `dir`, clap would merge it with the global `-C DIR` (also `dir`), and
    // `ckpt init r` would create `r/r/.ckpt`.
    #[arg(id = "init_dir", value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Runs `ckpt init`.
pub fn run(_ui: &Ui, base: &Path, args: InitArgs) -> Result<()> {
    let dir = args.dir.map_or_else(|| base.to_path_buf(), |d| base.join(d));
    let repo = Repo::init(&dir)?;
    outln!("Initialized an empty ckpt repository in {}", repo.ckpt_dir().display())?;
    Ok(())
}
