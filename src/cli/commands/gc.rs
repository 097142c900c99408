//! `ckpt gc`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use std::path::Path;

/// Arguments of `ckpt gc`.
#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// Delete unreferenced objects older than this: `now`, or a number with a unit `s`, `m`,
    /// `h`, `d`, `w` (`30m`, `2h`). Default: the config's `gc_grace_seconds` (one hour), so
    /// that the objects of a save still in flight are kept. `now` is safe only when no save is
    /// running (a `ckpt.dcp.Writer` save, a `git add`).
    #[arg(long, value_name = "WHEN", value_parser = parse_prune)]
    prune: Option<std::time::Duration>,
    /// Collect the remote NAME (or URL: `s3://bucket/prefix`, `gs://…`, `az://…`, `file:///dir`,
    /// or a directory path, with no repository needed) instead of this store: delete the
    /// objects no ref of the remote reaches (those of a failed or refused save or push) once
    /// older than the grace period, one day unless `--prune` says otherwise (docs/format.md,
    /// "Garbage on a remote"). A shorter grace is safe only while nothing pushes or saves to the remote.
    #[arg(long, value_name = "NAME|URL")]
    remote: Option<String>,
    /// With `--remote`: report what would be deleted, delete nothing.
    #[arg(long, requires = "remote")]
    dry_run: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt gc`.
pub fn run(ui: &Ui, base: &Path, args: GcArgs) -> Result<()> {
    if let Some(name) = &args.remote {
        // A URL or a directory path (as `remote add` takes them: a remote's name has no `/`):
        // a remote written by ranks that have no repository. A scratch repository serves as
        // the walk's object cache.
        if name.contains("://") || name.contains('/') {
            let url = ckpt::sync::absolute_dir_url(name, base);
            let scratch = tempfile::tempdir()?;
            let mut repo = ckpt::repo::Repo::init(scratch.path())?;
            repo.set_progress(std::sync::Arc::new(crate::cli::ui::BarProgress::new(ui)));
            let remote = ckpt::remote::open(&url, &ckpt::remote::S3Options::default())?;
            return run_remote(&repo, remote.as_ref(), &args);
        }
        let repo = open_repo(ui, base)?;
        let remote = ckpt::sync::open_remote(&repo, name)?;
        return run_remote(&repo, remote.as_ref(), &args);
    }
    let repo = open_repo(ui, base)?;
    // Deltas still pending make the store smaller too: finish them first.
    repo.compact(&ckpt::repo::CompactOptions::default())?;
    let options = match args.prune {
        Some(grace) => ckpt::repo::GcOptions { grace },
        None => repo.gc_options(),
    };
    let r = repo.gc_with(&options)?;
    if args.json {
        crate::cli::ui::print_json(&r)?;
    } else {
        outln!(
            "{} versions reachable; kept {} objects, deleted {} ({}), removed {} temp files",
            r.versions,
            r.kept,
            r.deleted,
            bytes(r.bytes_freed),
            r.temp_files
        )?;
        if r.saves_in_flight > 0 {
            outln!(
                "kept {} unreferenced objects: a save is in flight ({} in .ckpt/saves/), and what it wrote \
                 stays until it ends or stops renewing its record for 10 minutes",
                r.recent,
                r.saves_in_flight
            )?;
        } else if r.recent > 0 {
            outln!(
                "kept {} unreferenced objects younger than {} (a save may still be writing them; --prune=now deletes them)",
                r.recent,
                grace_text(r.grace_seconds)
            )?;
        }
    }
    Ok(())
}

/// `ckpt gc --remote NAME|URL`.
fn run_remote(repo: &ckpt::repo::Repo, remote: &dyn ckpt::remote::Remote, args: &GcArgs) -> Result<()> {
    let options = ckpt::sync::RemoteGcOptions {
        grace: args.prune.unwrap_or(ckpt::sync::REMOTE_GRACE),
        dry_run: args.dry_run,
        interrupt: Some(interrupt_on_signals()?),
        ..ckpt::sync::RemoteGcOptions::default()
    };
    let r = ckpt::sync::gc_remote(repo, remote, &options)?;
    if args.json {
        return crate::cli::ui::print_json(&r);
    }
    outln!(
        "{}: {} refs reach {} versions; kept {} of {} objects, {} {} ({})",
        r.remote,
        r.refs,
        r.versions,
        r.kept,
        r.listed,
        if r.dry_run { "would delete" } else { "deleted" },
        r.deleted,
        bytes(r.bytes_freed)
    )?;
    if r.recent > 0 {
        outln!(
            "kept {} objects no ref reaches because they are younger than {} (a save or push may still be writing them)",
            r.recent,
            grace_text(r.grace_seconds)
        )?;
    }
    Ok(())
}

/// A flag that SIGINT, SIGTERM and SIGHUP set, so that the gc stops between deletes and
/// removes its record (a record left behind makes writers wait 10 minutes before they take it
/// for dead). A second signal ends the process at once, with 130 as the shell's Ctrl-C does.
fn interrupt_on_signals() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM, SIGHUP] {
        if ignored(signal) {
            // `nohup ckpt gc --remote`, or a script's background job: left as the user set it.
            continue;
        }
        // In this order: the exit sees the flag only once the first signal has set it.
        signal_hook::flag::register_conditional_shutdown(signal, 130, flag.clone())?;
        signal_hook::flag::register(signal, flag.clone())?;
    }
    Ok(flag)
}

/// Whether `signal` is set to be ignored (`SIG_IGN`) in this process.
fn ignored(signal: i32) -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

pub(crate) fn parse_prune(text: &str) -> std::result::Result<std::time::Duration, String> {
    ckpt::repo::parse_grace(text)
        .ok_or_else(|| format!("{text:?}: expected `now` or a duration such as 90s, 30m, 2h, 1d"))
}

/// `3600` as `1h`, `90` as `90s`.
fn grace_text(secs: u64) -> String {
    match secs {
        0 => "0s".into(),
        s if s % 86400 == 0 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
