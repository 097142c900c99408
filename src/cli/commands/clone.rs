//! `ckpt clone URL [DIR] [--depth N] [--endpoint URL] [--region R] [--allow-http]`.

use crate::cli::ui::{BarProgress, Ui};
use anyhow::{Context, Result};
use ckpt::remote::S3Options;
use std::path::{Path, PathBuf};

/// Arguments of `ckpt clone`.
#[derive(clap::Args, Debug)]
pub struct CloneArgs {
    /// The remote: a directory (path or file:///path), s3://BUCKET/PREFIX, gs://BUCKET/PREFIX
    /// (Google Cloud Storage) or az://CONTAINER/PREFIX (Azure Blob Storage).
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

/// The directory a clone of `url` goes to when none is named, as `git clone` derives its
/// "humanish" name: the URL's last path component (without a query, a fragment or trailing
/// slashes, and without a `.ckpt` suffix). `None` when that is not a plain name (empty, `.`,
/// `..`, or holding a character that a directory name should not: then the user names it).
pub fn humanish_dir(url: &str) -> Option<String> {
    let (rest, has_scheme) = match url.split_once("://") {
        Some((_, rest)) => (rest.split(['?', '#']).next().unwrap_or_default(), true),
        None => (url, false),
    };
    let trimmed = rest.trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/.ckpt").unwrap_or(trimmed).trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or_default();
    let last = last.strip_suffix(".ckpt").filter(|l| !l.is_empty()).unwrap_or(last);
    let plain = !last.is_empty()
        && last != "."
        && last != ".."
        && !last.chars().any(|c| c.is_control() || c == ':' || c == '\\')
        && !(has_scheme && last.contains('@'));
    plain.then(|| last.to_string())
}

/// Runs `ckpt clone`.
pub fn run(ui: &Ui, base: &Path, args: CloneArgs) -> Result<()> {
    ckpt::remote::check_no_secrets(&args.url)?;
    let dir = match args.dir {
        Some(d) => base.join(d),
        None => {
            let Some(name) = humanish_dir(&args.url) else {
                anyhow::bail!(
                    "cannot derive a directory name from {}; name one: ckpt clone URL DIR",
                    ckpt::remote::redact_url(&args.url)
                );
            };
            base.join(name)
        }
    };
    let s3: S3Options = args.s3.into();
    let progress = std::sync::Arc::new(BarProgress::new(ui));
    let depth = args.depth.map(|d| usize::try_from(d).unwrap_or(usize::MAX));
    // A relative directory remote is relative to where the command runs (`-C` included).
    let url = ckpt::sync::absolute_dir_url(&args.url, base);
    let (repo, report) =
        ckpt::sync::clone_with_depth(&url, &dir, s3, crate::cli::ui::transfers(), Some(progress), depth)
            .with_context(|| format!("cloning {}", ckpt::remote::redact_url(&args.url)))?;
    super::fetch::print(&report, args.json)?;
    eprintln!("cloned into {}", repo.root().display());
    Ok(())
}
