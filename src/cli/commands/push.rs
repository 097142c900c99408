//! `ckpt push [REMOTE] [BRANCH|TAG...] [--all] [--repair] [--json]`.

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::{Context, Result};
use ckpt::sync::PushOptions;
use std::path::Path;

/// Arguments of `ckpt push`.
#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// The remote (default: origin, or the only remote).
    remote: Option<String>,
    /// Branches and tags to push (default: the current branch).
    refs: Vec<String>,
    /// Push every branch and tag.
    #[arg(long, conflicts_with = "refs")]
    all: bool,
    /// Also download and check the remote's copy of everything the pushed refs need (their
    /// whole history), and replace each damaged one by an intact copy from this repository.
    #[arg(long)]
    repair: bool,
    /// Machine-readable summary.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt push`.
pub fn run(ui: &Ui, base: &Path, args: PushArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let remote = crate::cli::ui::remote_or_default(&repo, args.remote)?;
    let options = PushOptions {
        refs: args.refs,
        all: args.all,
        repair: args.repair,
        transfers: crate::cli::ui::transfers(),
        ..PushOptions::default()
    };
    let report = ckpt::sync::push(&repo, &remote, &options).with_context(|| format!("pushing to {remote}"))?;
    if args.json {
        return crate::cli::ui::print_json(&report);
    }
    crate::cli::ui::print_updated(&report.updated);
    for name in &report.up_to_date {
        eprintln!("{name}: up to date");
    }
    for id in &report.repaired {
        eprintln!("version {}: the remote lacked some of its objects; uploaded them again", &id[..12]);
    }
    if args.repair {
        for id in &report.replaced_damaged {
            eprintln!("object {id}: the remote's copy was damaged; replaced it with an intact one");
        }
        let unchecked = if report.remote_unchecked > 0 {
            format!(
                ", {} could not be checked here (deltas against objects this repository lacks) and were left alone",
                report.remote_unchecked
            )
        } else {
            String::new()
        };
        eprintln!(
            "{}: checked {} objects there ({}): {} damaged{unchecked}",
            report.remote,
            report.remote_checked,
            bytes(report.remote_bytes_checked),
            report.replaced_damaged.len()
        );
    }
    let recoded = if report.objects_recoded > 0 {
        format!(", {} older blobs recoded there as deltas against the new ones", report.objects_recoded)
    } else {
        String::new()
    };
    eprintln!(
        "{}: sent {} objects ({}; {} as deltas against what it had{recoded}), {} already there, {} requests",
        report.remote,
        report.objects_sent,
        bytes(report.bytes_sent),
        report.objects_sent_as_deltas,
        report.objects_present,
        report.requests
    );
    Ok(())
}
