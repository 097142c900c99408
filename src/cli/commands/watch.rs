//! `ckpt watch DIR [--pattern GLOB] [--settle SECONDS]`.

use crate::cli::ui::{open_repo, Ui};
use anyhow::{Context, Result};
use ckpt::watch::{watch, WatchEvent, WatchOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `ckpt watch`.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Directory (inside the working tree) where checkpoints appear. (Not called `dir`: that
    /// id is the global `-C DIR`, which clap would fill with this value too.)
    #[arg(value_name = "DIR")]
    directory: PathBuf,
    /// Commit only entries of DIR whose name matches: a glob (`*`, `?`) or a substring. Default:
    /// every file and folder except hidden ones and `*.tmp`, `*.part`, `*.partial`, `*~`.
    #[arg(long, value_name = "GLOB")]
    pattern: Option<String>,
    /// A checkpoint is committed once nothing in it changed for this long (and, where
    /// file-system events tell, no file in it is still open for writing).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    settle: f64,
}

/// Runs `ckpt watch` until interrupted.
pub fn run(ui: &Ui, base: &Path, args: WatchArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let settle = Duration::try_from_secs_f64(args.settle)
        .ok()
        .with_context(|| format!("--settle {}: not a number of seconds", args.settle))?;
    let options = WatchOptions { pattern: args.pattern, settle, ..WatchOptions::default() };
    let dir = base.join(&args.directory);
    eprintln!("watching {} (settle {:.1} s; Ctrl-C stops)", dir.display(), settle.as_secs_f64());
    watch(&repo, &dir, &options, &|| false, &mut |e| match e {
        WatchEvent::Committed { path, version, files } => {
            // A closed stdout does not stop the watcher: the versions are committed either way.
            let _ =
                outln!("{path}: version {} ({files} file{})", version.short(12), if *files == 1 { "" } else { "s" });
        }
        WatchEvent::AlreadyCommitted { path } => eprintln!("{path}: already in HEAD"),
        WatchEvent::Retrying { path } => eprintln!("{path}: changed while being committed; retrying once it settles"),
        WatchEvent::Failed { path, reason } => eprintln!("{path}: not committed: {reason}"),
        WatchEvent::Skipped { path, reason } => eprintln!("warning: {path}: skipped: {reason}"),
        WatchEvent::Polling { reason } => eprintln!("file-system events unavailable ({reason}); polling"),
    })
    .with_context(|| format!("watching {}", dir.display()))
}
