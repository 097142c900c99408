//! `ckpt report [REV | FROM..TO] [-o FILE.html] [--json] [--tensor PATTERN] [--max-versions N]`.

use crate::cli::ui::{bytes, open_repo, write_atomically, Ui};
use anyhow::Result;
use ckpt::git_filter;
use ckpt::repo::{FileEntry, TensorFilter};
use ckpt::report::{self, Options, Report, Snapshot};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where the page goes when no `-o` is given.
const DEFAULT_PAGE: &str = "ckpt-report.html";

/// Arguments of `ckpt report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A version (the report covers its first-parent history) or FROM..TO (as git reads it: the
    /// versions after FROM up to TO along TO's first parents; TO is also compared with FROM).
    #[arg(default_value = "HEAD")]
    range: String,
    /// Write the page (or with --json the numbers) to FILE; `-` for stdout. Default: the page to
    /// ckpt-report.html, the numbers to stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The numbers the page draws, as JSON, instead of the page.
    #[arg(long)]
    json: bool,
    /// Only tensors whose name matches PATTERN (a glob with `*` and `?`, else a substring).
    #[arg(long, value_name = "PATTERN")]
    tensor: Option<String>,
    /// At most N versions (the newest).
    #[arg(long, value_name = "N")]
    max_versions: Option<usize>,
}

impl ReportArgs {
    fn options(&self) -> Options {
        Options {
            tensor: self.tensor.as_deref().map(TensorFilter::new),
            max_versions: self.max_versions,
            ..Options::default()
        }
    }
}

/// Runs `ckpt report`.
pub fn run(ui: &Ui, base: &Path, args: ReportArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let r = report::report(&repo, &args.range, &args.options())?;
    emit(base, &r, args.json, args.output.as_deref())
}

/// Runs `ckpt git report`: the columns are the git commits that changed weight files.
pub fn run_git(base: &Path, args: ReportArgs) -> Result<()> {
    let git = git_filter::discover(base)?;
    let store = git_filter::open_store(&git)?;
    let (commits, shown) = git_filter::history::pointer_commits(&git, &args.range)?;
    let snapshots: Vec<Snapshot> = commits
        .into_iter()
        .map(|c| Snapshot {
            short: c.id.get(..12).unwrap_or(&c.id).to_string(),
            id: c.id,
            time: c.time,
            message: c.message,
            tags: Vec::new(),
            files: c
                .pointers
                .into_iter()
                .map(|(path, p)| FileEntry { path, manifest: p.manifest, len: p.size, hash: p.hash })
                .collect(),
            object: None,
        })
        .collect();
    let range = shown..snapshots.len();
    let r = report::build(&store, &args.range, &snapshots, range, args.range.contains(".."), &args.options())?;
    emit(base, &r, args.json, args.output.as_deref())
}

/// Writes `r` as JSON or as the page, where `output` says (shared with `ckpt git report`).
pub fn emit(base: &Path, r: &Report, json: bool, output: Option<&Path>) -> Result<()> {
    let text = if json { serde_json::to_string_pretty(r)? + "\n" } else { report::html::render(r) };
    let target = match output {
        Some(p) if p == Path::new("-") => None,
        Some(p) => Some(base.join(p)),
        None if json => None,
        None => Some(base.join(DEFAULT_PAGE)),
    };
    let Some(path) = target else {
        std::io::stdout().lock().write_all(text.as_bytes())?;
        return Ok(());
    };
    write_atomically(&path, |w| Ok(w.write_all(text.as_bytes())?))?;
    outln!(
        "wrote {} ({}): {} versions, {} tensor pairs decoded, {} from the index{}",
        path.display(),
        bytes(text.len() as u64),
        r.columns.len(),
        r.computed,
        r.cached,
        if r.binning.is_some() { ", binned to keep the page light" } else { "" }
    )?;
    Ok(())
}
