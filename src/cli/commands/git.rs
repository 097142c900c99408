//! `ckpt git ...`: the git filter driver's set-up and the filter itself (`filter-process`, run
//! by git; `clean`/`smudge`, one-shot fallbacks). In filter mode stdout carries only what git
//! reads; messages go to stderr.

use crate::cli::ui::Ui;
use crate::git_filter::{self, attributes, process, GitFilter};
use crate::repo::{CommitOptions, Compaction};
use anyhow::{Context, Result};
use std::path::Path;

/// Arguments of `ckpt git`.
#[derive(clap::Args, Debug)]
pub struct GitArgs {
    #[command(subcommand)]
    command: GitCommand,
}

#[derive(clap::Subcommand, Debug)]
enum GitCommand {
    /// Write the ckpt filter driver into git config (this repository's, or with --global the
    /// user's). Idempotent.
    Install {
        /// Write to the user's global git config instead of the repository's.
        #[arg(long)]
        global: bool,
    },
    /// Remove what `install` wrote.
    Uninstall {
        /// Remove from the user's global git config instead of the repository's.
        #[arg(long)]
        global: bool,
    },
    /// Store files matching PATTERN through ckpt (adds `PATTERN filter=ckpt diff=ckpt -text` to
    /// .gitattributes); without a pattern, list the tracked patterns.
    Track {
        /// gitattributes patterns, such as `*.safetensors`.
        patterns: Vec<String>,
    },
    /// Stop storing files matching PATTERN through ckpt (removes its .gitattributes line).
    Untrack {
        /// Patterns given to `track`.
        #[arg(required = true)]
        patterns: Vec<String>,
    },
    /// Write the real files in place of pointers left by CKPT_SKIP_SMUDGE=1 (all, or those at
    /// or under PATH), and refresh git's index.
    Checkout {
        /// Files or directories, relative to the working tree root.
        paths: Vec<String>,
    },
    /// The diff driver's textconv (diff.ckpt.textconv): a per-tensor summary of FILE (a pointer
    /// or the real file) for `git diff` and `git log -p`.
    Textconv {
        /// The file git passes.
        file: std::path::PathBuf,
    },
    /// List the weight files (ckpt pointers) in a revision's tree: raw size, what their objects
    /// take in the store now, path.
    LsFiles {
        /// A git revision (default HEAD).
        #[arg(default_value = "HEAD")]
        rev: String,
    },
    /// Check that every ckpt pointer any ref, reflog entry, the stash or the index reaches
    /// resolves to a file that verifies (decoded and hashed); exit 1 naming those that do not.
    Fsck,
    /// The long-running filter git starts (filter.ckpt.process): protocol on stdin/stdout.
    FilterProcess,
    /// One-shot clean: content on stdin, pointer on stdout.
    Clean {
        /// The path of the file in the working tree (git's %f).
        path: String,
    },
    /// One-shot smudge: pointer on stdin, content on stdout.
    Smudge {
        /// The path of the file in the working tree (git's %f).
        path: String,
    },
}

/// Runs `ckpt git`.
pub fn run(_ui: &Ui, base: &Path, args: GitArgs) -> Result<()> {
    match args.command {
        GitCommand::Install { global } => {
            git_filter::install(base, global)?;
            eprintln!(
                "ckpt filter installed in the {} git config; `ckpt git track PATTERN` selects the files",
                if global { "global" } else { "repository's" }
            );
            Ok(())
        }
        GitCommand::Uninstall { global } => {
            git_filter::uninstall(base, global)?;
            Ok(())
        }
        GitCommand::Track { patterns } => track(base, &patterns),
        GitCommand::Untrack { patterns } => untrack(base, &patterns),
        GitCommand::Checkout { paths } => checkout(base, &paths),
        GitCommand::Textconv { file } => {
            let (filter, _) = open_filter(base)?;
            let text = filter.textconv(&base.join(&file)).map_err(|m| anyhow::anyhow!("{}: {m}", file.display()))?;
            print!("{text}");
            Ok(())
        }
        GitCommand::LsFiles { rev } => {
            let git = git_filter::discover(base)?;
            let store = git_filter::open_store(&git)?;
            for f in git_filter::ls_files(&git, &store, &rev)? {
                let stored = f.stored.map_or_else(|| "missing".to_string(), crate::cli::ui::bytes);
                outln!("{:>12}  {:>12}  {}", crate::cli::ui::bytes(f.pointer.size), stored, f.path)?;
            }
            Ok(())
        }
        GitCommand::Fsck => fsck(base),
        GitCommand::FilterProcess => filter_process(base),
        GitCommand::Clean { path } => one_shot(base, process::Command::Clean, &path),
        GitCommand::Smudge { path } => one_shot(base, process::Command::Smudge, &path),
    }
}

fn gitattributes(base: &Path) -> Result<std::path::PathBuf> {
    let git = git_filter::discover(base)?;
    Ok(git_filter::workdir(&git)?.join(".gitattributes"))
}

fn track(base: &Path, patterns: &[String]) -> Result<()> {
    let path = gitattributes(base)?;
    let text = attributes::read(&path)?;
    if patterns.is_empty() {
        for p in attributes::tracked(&text) {
            outln!("{p}")?;
        }
        return Ok(());
    }
    let (new, added) = attributes::track(&text, patterns)?;
    if new != text {
        attributes::write(&path, &new)?;
    }
    for p in patterns {
        let what = if added.contains(p) { "tracking" } else { "already tracked" };
        eprintln!("{what} {p}");
    }
    Ok(())
}

fn untrack(base: &Path, patterns: &[String]) -> Result<()> {
    let path = gitattributes(base)?;
    let text = attributes::read(&path)?;
    let (new, removed) = attributes::untrack(&text, patterns);
    if new != text {
        attributes::write(&path, &new)?;
    }
    for p in patterns {
        let what = if removed.contains(p) { "untracked" } else { "was not tracked:" };
        eprintln!("{what} {p}");
    }
    Ok(())
}

/// The filter for the git repository at `base`, and whether its commits defer their deltas.
fn open_filter(base: &Path) -> Result<(GitFilter, Compaction)> {
    let git = git_filter::discover(base)?;
    let store = git_filter::open_store(&git)?;
    let compaction = Compaction::from_env_or(store.config().compact).map_err(anyhow::Error::msg)?;
    let options = CommitOptions { defer_deltas: compaction != Compaction::Inline, ..CommitOptions::default() };
    let fallbacks = git_filter::driver::origin_store(&git).into_iter().collect();
    let mut filter = GitFilter::new(store, fallbacks, options);
    filter.set_skip_smudge(git_filter::skip_smudge(&git));
    Ok((filter, compaction))
}

/// After the filter stored new versions: rewrite the previous ones as deltas in the
/// background, as `ckpt commit` does.
fn compact_later(filter: GitFilter, compaction: Compaction) {
    let store = filter.store();
    if compaction != Compaction::Background || !store.has_pending_deltas() {
        return;
    }
    let root = store.root().to_path_buf();
    drop(filter);
    if let Err(e) = super::compact::start_in_background(&root) {
        eprintln!("ckpt: could not start the background compaction ({e}); run `ckpt -C {} compact`", root.display());
    }
}

fn checkout(base: &Path, paths: &[String]) -> Result<()> {
    let git = git_filter::discover(base)?;
    let (mut filter, _) = open_filter(base)?;
    filter.set_skip_smudge(false);
    let written = git_filter::checkout_pointers(&git, &filter, paths)?;
    eprintln!("{} file{} written", written.len(), if written.len() == 1 { "" } else { "s" });
    Ok(())
}

fn fsck(base: &Path) -> Result<()> {
    let git = git_filter::discover(base)?;
    let (filter, _) = open_filter(base)?;
    let pointers = git_filter::reachable_pointers(&git)?;
    let tmp = tempfile::tempdir_in(filter.store().ckpt_dir().join("tmp")).context("creating a temporary directory")?;
    let mut bad = 0;
    // Each distinct file once (the same content under several paths or commits is one check).
    let mut checked = std::collections::HashSet::new();
    for (path, p) in &pointers {
        if !checked.insert(p.manifest) {
            continue;
        }
        let dest = tmp.path().join("file");
        match filter.write_from_stores(p, &dest) {
            Ok(()) => {}
            Err(e) => {
                bad += 1;
                eprintln!("{path}: {e}");
            }
        }
        let _ = std::fs::remove_file(&dest);
    }
    outln!("{} pointers, {} distinct files checked, {bad} bad", pointers.len(), checked.len())?;
    if bad > 0 {
        anyhow::bail!("{bad} file{} cannot be restored", if bad == 1 { "" } else { "s" });
    }
    Ok(())
}

fn filter_process(base: &Path) -> Result<()> {
    let (mut filter, compaction) = open_filter(base).context("ckpt git filter-process")?;
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    let served = process::serve(stdin, stdout, &mut filter, &mut |message| eprintln!("ckpt git filter: {message}"));
    compact_later(filter, compaction);
    served.context("ckpt git filter-process")?;
    Ok(())
}

fn one_shot(base: &Path, command: process::Command, path: &str) -> Result<()> {
    use std::io::Write;
    let (filter, compaction) = open_filter(base)?;
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let result = match command {
        process::Command::Clean => filter.clean(path, &mut stdin, &mut stdout),
        process::Command::Smudge => filter.smudge(path, &mut stdin, &mut stdout),
    };
    compact_later(filter, compaction);
    result.map_err(|m| anyhow::anyhow!("{path}: {m}"))?;
    stdout.flush().context("writing to git")?;
    Ok(())
}
