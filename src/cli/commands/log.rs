//! `ckpt log [REV] [-n N] [--oneline | --json]`.

use crate::cli::ui::{bytes, open_repo, printable, printable_text, Ui};
use anyhow::Result;
use ckpt::repo::{format_time, Head, Repo, VersionId};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Arguments of `ckpt log`.
#[derive(clap::Args, Debug)]
pub struct LogArgs {
    /// Where history starts (default: HEAD).
    #[arg(default_value = "HEAD")]
    rev: String,
    /// Show at most N versions (the newest).
    #[arg(short = 'n', long = "max-count", value_name = "N")]
    max_count: Option<usize>,
    /// One line per version: short id, date, stored (now)/raw bytes, refs, first line of the message.
    #[arg(long, conflicts_with = "json")]
    oneline: bool,
    /// A JSON array of versions, newest first.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct JsonVersion<'a> {
    id: String,
    parents: Vec<String>,
    date: String,
    time: i64,
    message: &'a str,
    files: &'a [String],
    raw_bytes: u64,
    /// What the store grew by at commit time.
    stored_bytes: u64,
    /// What the version's own objects take now ([`Repo::sizes_now`]).
    stored_now_bytes: u64,
    refs: Vec<String>,
}

/// Branch and tag names per version, `HEAD -> branch` first.
fn decorations(repo: &Repo) -> Result<HashMap<VersionId, Vec<String>>> {
    let mut out: HashMap<VersionId, Vec<String>> = HashMap::new();
    let head = repo.head()?;
    if let Head::Detached(id) = &head {
        out.entry(*id).or_default().push("HEAD".into());
    }
    for b in repo.branches()? {
        let names = out.entry(b.id).or_default();
        if b.current {
            names.insert(0, format!("HEAD -> {}", b.name));
        } else {
            names.push(b.name);
        }
    }
    for (name, id) in repo.tags()? {
        out.entry(id).or_default().push(format!("tag: {name}"));
    }
    Ok(out)
}

/// Runs `ckpt log`.
pub fn run(ui: &Ui, base: &Path, args: LogArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let mut versions = repo.log(&args.rev)?;
    // Over the whole history: what a version was the first to hold needs the ones before it.
    let mut sizes = repo.sizes_now(&versions);
    if let Some(n) = args.max_count {
        versions.truncate(n);
        sizes.truncate(n);
    }
    let refs = decorations(&repo)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let list: Vec<JsonVersion> = versions
            .iter()
            .zip(&sizes)
            .map(|(v, &now)| JsonVersion {
                id: v.id.to_hex(),
                parents: v.parents.iter().map(|p| p.to_hex()).collect(),
                date: format_time(v.time),
                time: v.time,
                message: &v.message,
                files: &v.files,
                raw_bytes: v.raw_bytes,
                stored_bytes: v.stored_bytes,
                stored_now_bytes: now,
                refs: refs.get(&v.id).cloned().unwrap_or_default(),
            })
            .collect();
        crate::cli::ui::print_json(&list)?;
        return Ok(());
    }
    for (v, &now) in versions.iter().zip(&sizes) {
        let decoration = refs.get(&v.id).map(|r| format!(" ({})", r.join(", "))).unwrap_or_default();
        if args.oneline {
            let subject = printable(v.message.lines().next().unwrap_or(""));
            let stored = format!("{}/{}", bytes(now), bytes(v.raw_bytes));
            writeln!(out, "{} {} {stored:>21}{decoration} {subject}", v.id.short(12), format_time(v.time))?;
            continue;
        }
        writeln!(out, "version {}{decoration}", v.id)?;
        writeln!(out, "date    {}", format_time(v.time))?;
        let files: Vec<_> = v.files.iter().map(|f| printable(f)).collect();
        writeln!(out, "files   {}", files.join(" "))?;
        writeln!(
            out,
            "stored  {} for {} ({:.1}%){}",
            bytes(now),
            bytes(v.raw_bytes),
            100.0 * now as f64 / v.raw_bytes.max(1) as f64,
            if bytes(now) == bytes(v.stored_bytes) {
                String::new()
            } else {
                format!("; {} added at commit", bytes(v.stored_bytes))
            }
        )?;
        writeln!(out)?;
        for line in printable_text(&v.message).lines() {
            writeln!(out, "    {line}")?;
        }
        writeln!(out)?;
    }
    // A partial clone (`clone --depth`) or a prune: say where the history held here ends.
    if let Some(last) = versions.last().filter(|_| args.max_count.is_none_or(|n| versions.len() < n)) {
        if repo.history_pruned_at(&last.id)? {
            writeln!(out, "(history pruned here: `ckpt prune` dropped the versions before {})", last.id.short(12))?;
        } else if repo.history_cut_at(&last.id)? {
            let remote = repo.partial_clone()?.map(|p| p.remote).unwrap_or_default();
            writeln!(
                out,
                "(history cut here: a partial clone of remote {remote}; `ckpt checkout {}~1` downloads older versions)",
                last.id.short(12)
            )?;
        }
    }
    Ok(())
}
