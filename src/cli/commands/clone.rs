//! `ckpt clone URL [DIR] [--depth N] [--endpoint URL] [--region R] [--allow-http]`.

use crate::cli::ui::{BarProgress, Ui};
use crate::remote::S3Options;
use crate::repo::Repo;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Arguments of `ckpt clone`.
#[derive(clap::Args, Debug)]
pub struct CloneArgs {
    /// The remote: a directory (path or file:///path) or s3://BUCKET/PREFIX.
    url: String,
    /// Where to create the repository (default: the URL's last component).
    // Its own id, as in `init`: `dir` would merge with the global `-C DIR`.
    #[arg(id = "clone_dir", value_name = "DIR")]
    dir: Option<PathBuf>,
    #[command(flatten)]
    s3: super::remote::S3Args,
    /// Machine-readable summary of the fetch.
    #[arg(long)]
    json: bool,
    /// A partial clone: only the newest N versions of the cloned branch (main, or the first)
    /// and what they need; `ckpt checkout` of an older version downloads it then.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    depth: Option<u64>,
}

/// Runs `ckpt clone`.
pub fn run(ui: &Ui, base: &Path, args: CloneArgs) -> Result<()> {
    let dir = match args.dir {
        Some(d) => base.join(d),
        None => {
            let last = args.url.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
            anyhow::ensure!(!last.is_empty() && !last.contains(':'), "name the directory to clone into");
            base.join(last)
        }
    };
    let s3: S3Options = args.s3.into();
    let progress = std::sync::Arc::new(BarProgress::new(ui));
    let depth = args.depth.map(|d| usize::try_from(d).unwrap_or(usize::MAX));
    let (repo, report) = Repo::clone_with_depth(&args.url, &dir, s3, super::push::transfers(), Some(progress), depth)
        .with_context(|| format!("cloning {}", args.url))?;
    super::fetch::print(&report, args.json)?;
    eprintln!("cloned into {}", repo.root().display());
    Ok(())
}
