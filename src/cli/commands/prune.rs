//! `ckpt prune --keep-last N`: keep the newest versions of a branch, drop the rest of its
//! history and free the space (the library's `Repo::prune`).

use crate::cli::ui::{bytes, open_repo, printable, Ui};
use anyhow::Result;
use ckpt::repo::{format_time, GcOptions, PruneOptions, PruneReport};
use std::path::Path;

/// Arguments of `ckpt prune`.
#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// Keep this many of the newest versions of each branch, along first parents (at least 1).
    #[arg(long, value_name = "N")]
    keep_last: usize,
    /// The branch to prune (repeatable); default: the current one.
    #[arg(long = "branch", short = 'b', value_name = "BRANCH")]
    branches: Vec<String>,
    /// Say what would be dropped and freed; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Grace period of the gc that frees the space, as `ckpt gc --prune` takes it (`now`,
    /// `30m`, `2h`; default: the config's `gc_grace_seconds`). The dropped versions themselves
    /// go at once; objects of theirs younger than this stay until a later gc.
    #[arg(long, value_name = "WHEN", value_parser = super::gc::parse_prune)]
    prune: Option<std::time::Duration>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt prune`; `quiet` (the global `--quiet`) prints only the summary line.
pub fn run(ui: &Ui, base: &Path, args: PruneArgs, quiet: bool) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let options = PruneOptions {
        branches: args.branches,
        dry_run: args.dry_run,
        gc: args.prune.map(|grace| GcOptions { grace }),
    };
    let r = repo.prune(args.keep_last, &options)?;
    if args.json {
        return crate::cli::ui::print_json(&r);
    }
    if !quiet {
        print_details(&r)?;
    }
    outln!("{}", summary(&r))?;
    Ok(())
}

/// What was dropped, what another root kept, and the recodes.
fn print_details(r: &PruneReport) -> Result<()> {
    let (drop, recode) = if r.dry_run { ("would drop", "would recode") } else { ("dropped", "recoded") };
    for v in &r.dropped {
        outln!("{drop} {} {} {}", v.id.short(12), format_time(v.time), subject(&v.message))?;
    }
    for k in &r.kept_by {
        outln!("kept {} {} {} (needed by {})", k.id.short(12), format_time(k.time), subject(&k.message), k.root)?;
    }
    for b in &r.branches {
        match b.cut {
            Some(cut) => {
                outln!("branch {}: kept its newest {}; history now ends at {}", b.name, b.kept, cut.short(12))?
            }
            None if r.dropped.is_empty() => outln!("branch {}: {} versions kept, nothing to drop", b.name, b.kept)?,
            None => {}
        }
    }
    if r.recoded > 0 {
        let after = if r.dry_run { String::new() } else { format!(" -> {}", bytes(r.recoded_bytes_after)) };
        outln!(
            "{recode} {} blob{} of kept versions ({}{after}): they were deltas against blobs of dropped versions",
            r.recoded,
            if r.recoded == 1 { "" } else { "s" },
            bytes(r.recoded_bytes_before)
        )?;
    }
    if r.base_bytes_kept > 0 {
        outln!("{} of dropped versions' blobs stay: kept versions are coded against them", bytes(r.base_bytes_kept))?;
    }
    if r.pending_forgotten > 0 {
        outln!(
            "forgot {} pending delta rewrite{} of dropped versions",
            r.pending_forgotten,
            plural(r.pending_forgotten)
        )?;
    }
    if r.gc.recent > 0 {
        outln!(
            "kept {} unreferenced object{} younger than the grace period ({} s; a later gc frees them, --prune=now does it now)",
            r.gc.recent,
            plural(r.gc.recent),
            r.gc.grace_seconds
        )?;
    }
    Ok(())
}

/// The one line `--quiet` keeps.
fn summary(r: &PruneReport) -> String {
    let n = r.dropped.len();
    let verb = if r.dry_run { "would drop" } else { "dropped" };
    let freed = if r.dry_run { "would free" } else { "freed" };
    let kept =
        if r.kept_by.is_empty() { String::new() } else { format!(", {} older kept by other refs", r.kept_by.len()) };
    format!("{verb} {n} version{}{kept}; {freed} {} ({} objects)", plural(n), bytes(r.gc.bytes_freed), r.gc.deleted)
}

fn subject(message: &str) -> String {
    printable(message.lines().next().unwrap_or("")).into_owned()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
