//! `ckpt git ...`: the git filter driver's set-up and the filter itself (`filter-process`, run
//! by git; `clean`/`smudge`, one-shot fallbacks). In filter mode stdout carries only what git
//! reads; messages go to stderr.

use crate::cli::ui::{printable, Ui};
use anyhow::{Context, Result};
use ckpt::git_filter::{self, attributes, ckpt_remote, process, GitFilter};
use ckpt::repo::{format_time, CommitOptions, Compaction};
use std::path::{Path, PathBuf};

/// Arguments of `ckpt git`.
#[derive(clap::Args, Debug)]
pub struct GitArgs {
    #[command(subcommand)]
    command: GitCommand,
}

#[derive(clap::Subcommand, Debug)]
enum GitCommand {
    /// Write the ckpt filter and diff drivers into the user's global git config (as `git lfs
    /// install` does: every repository, clones included, then runs the filter), or with --local
    /// into this repository's; and, inside a repository, put ckpt's part into its pre-push hook
    /// (chained with any other tool's: both get the pushed refs, either failing fails the
    /// push). Other repositories get the hook the first time the filter runs in them.
    /// Idempotent.
    Install(ConfigScope),
    /// Remove what `install` wrote: the global config entries (or with --local this
    /// repository's), and ckpt's part of the current repository's pre-push hook.
    Uninstall(ConfigScope),
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
    /// `ckpt report` of the weight files kept through the filter: one column per git commit
    /// (along first parents) that changed them; REV or git's FROM..TO.
    Report(crate::cli::commands::report::ReportArgs),
    /// Delete the store's objects that no ckpt pointer git still reaches needs (reached: from any
    /// ref, reflog entry, the stash or the index; delta bases of what is kept stay).
    Gc {
        /// Report what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Delete unreachable objects older than this (`now`, `30m`, `2h`, ...). Default: the
        /// store's `gc_grace_seconds` (one hour): a `git add` stores objects before git writes
        /// its index, so younger ones may still be needed.
        #[arg(long, value_name = "WHEN", value_parser = crate::cli::commands::gc::parse_prune)]
        prune: Option<std::time::Duration>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Unregister a git repository as a user of this repository's shared ckpt store
    /// (`git config ckpt.store`): `ckpt git gc` keeps what every registered repository
    /// reaches, and every stored file while one of them is missing (moved, deleted, on a disk
    /// not mounted). Use this once a missing repository is known to be gone or moved.
    Forget {
        /// The repository's git directory as `ckpt git gc` prints it, or its working tree.
        path: PathBuf,
    },
    /// The pre-push hook's work (run by the hook git calls): upload to the ckpt remote the
    /// objects of the weight files in the pushed commits that it lacks. Reads git's lines
    /// `<local ref> <local sha> <remote ref> <remote sha>` on stdin.
    PrePush {
        /// The git remote's name.
        remote: String,
        /// The git remote's URL.
        url: Option<String>,
        /// Machine-readable summary on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The external diff driver (diff.ckpt.command) git runs with both sides of a weight
    /// file: per tensor, changed or not, % of elements changed, max |delta|.
    #[command(name = "diff-driver")]
    DiffDriver {
        /// git's arguments: PATH [OLD-FILE OLD-HEX OLD-MODE NEW-FILE NEW-HEX NEW-MODE [NEW-PATH INFO]].
        #[arg(required = true, num_args = 1..=9, allow_hyphen_values = true)]
        args: Vec<String>,
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

/// Where `ckpt git install` and `uninstall` write.
#[derive(clap::Args, Debug)]
pub struct ConfigScope {
    /// The user's global git config (the default).
    #[arg(long, conflicts_with = "local")]
    global: bool,
    /// This repository's git config only.
    #[arg(long)]
    local: bool,
    /// Do not touch the current repository's hook (with the global config).
    #[arg(long, conflicts_with = "local")]
    skip_repo: bool,
}

/// Runs `ckpt git`.
pub fn run(ui: &Ui, base: &Path, args: GitArgs) -> Result<()> {
    match args.command {
        GitCommand::Install(ConfigScope { local, skip_repo, .. }) => install(base, local, skip_repo),
        GitCommand::Uninstall(ConfigScope { local, skip_repo, .. }) => {
            let scope = if local { git_filter::Scope::Local } else { git_filter::Scope::Global };
            git_filter::uninstall(base, scope)?;
            if local || !skip_repo {
                if let Some(git) = current_repository(base, local)? {
                    if git_filter::hook::uninstall(&git)? {
                        eprintln!("ckpt's part of the pre-push hook removed");
                    }
                }
            }
            Ok(())
        }
        GitCommand::Gc { dry_run, prune, json } => gc(ui, base, dry_run, prune, json),
        GitCommand::Forget { path } => {
            let git = git_filter::discover(base)?;
            let store = git_filter::open_store(&git)?;
            let forgotten = git_filter::forget_user(&store, &base.join(&path))?;
            eprintln!(
                "forgot {}: the next `ckpt git gc` keeps nothing for it",
                printable(&forgotten.display().to_string())
            );
            Ok(())
        }
        GitCommand::PrePush { remote, url, json } => pre_push(ui, base, &remote, url.as_deref(), json),
        GitCommand::DiffDriver { args } => diff_driver(base, &args),
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
        GitCommand::Report(args) => crate::cli::commands::report::run_git(base, args),
        GitCommand::Fsck => fsck(base),
        GitCommand::FilterProcess => filter_process(base),
        GitCommand::Clean { path } => one_shot(base, process::Command::Clean, &path),
        GitCommand::Smudge { path } => one_shot(base, process::Command::Smudge, &path),
    }
}

/// The repository at `base` with a working tree, for the hook: required with `--local`; with
/// the global config, `None` outside one (or in a bare one).
fn current_repository(base: &Path, local: bool) -> Result<Option<git2::Repository>> {
    if local {
        return Ok(Some(git_filter::discover(base)?));
    }
    Ok(git_filter::discover(base).ok().filter(|g| g.workdir().is_some()))
}

fn install(base: &Path, local: bool, skip_repo: bool) -> Result<()> {
    let scope = if local { git_filter::Scope::Local } else { git_filter::Scope::Global };
    git_filter::install(base, scope)?;
    eprintln!(
        "ckpt filter installed in the {} git config; `ckpt git track PATTERN` selects the files",
        if local { "repository's" } else { "global" }
    );
    let git = if skip_repo { None } else { current_repository(base, local)? };
    match git {
        Some(git) => {
            let done = git_filter::hook::install(&git)?;
            let what = match done {
                git_filter::hook::HookInstall::Written(_) => "pre-push hook installed",
                git_filter::hook::HookInstall::Chained(_) => "ckpt chained first into the existing pre-push hook",
                git_filter::hook::HookInstall::Updated(_) => "ckpt's part of the pre-push hook updated",
                git_filter::hook::HookInstall::Present(_) => "pre-push hook already runs ckpt",
            };
            eprintln!("{what}: {}", done.path().display());
        }
        None => eprintln!(
            "each repository gets ckpt's pre-push hook the first time the filter runs in it (git add, checkout, clone)"
        ),
    }
    Ok(())
}

/// Puts ckpt's part into the pre-push hook of the repository the filter runs in, as Git LFS's
/// filter does with its hooks: so a clone made after a global install pushes its weights. A
/// failure does not stop the filter; it is said on stderr, with what it costs.
fn ensure_hook(base: &Path) {
    let result = git_filter::discover(base).and_then(|git| git_filter::hook::install(&git));
    match result {
        Ok(git_filter::hook::HookInstall::Present(_)) => {}
        Ok(done) => {
            eprintln!("ckpt: pre-push hook set up so that git push uploads the weights: {}", done.path().display())
        }
        Err(e) => eprintln!("ckpt: {e}; until it is, git push does not upload this repository's weights"),
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
    let store = git_filter::with_env_lock_timeout(git_filter::open_store(&git)?)?;
    let compaction = Compaction::from_env_or(store.config().compact).map_err(anyhow::Error::msg)?;
    let options = CommitOptions { defer_deltas: compaction != Compaction::Inline, ..CommitOptions::default() };
    let fallbacks = git_filter::driver::origin_store(&git).into_iter().collect();
    let mut filter = GitFilter::new(store, fallbacks, options);
    filter.set_skip_smudge(git_filter::skip_smudge(&git));
    // A broken `.ckptconfig` must not stop `git add` (clean never needs the remote): said
    // once, and smudge then reports files it cannot find as missing, naming the remote setting.
    match ckpt_remote::remote_url(&git) {
        Ok(url) => filter.set_remote(url.map(|r| r.url)),
        Err(e) => eprintln!("ckpt: ignoring the ckpt remote setting: {e}"),
    }
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
    // Each distinct pointer once (the same content under several paths or commits is one
    // check; a pointer naming the same manifest with another size or hash is one more).
    let mut checked = std::collections::HashSet::new();
    for (path, p) in &pointers {
        if !checked.insert(p.clone()) {
            continue;
        }
        let dest = tmp.path().join("file");
        match filter.read_from_stores(p, &dest) {
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
    ensure_hook(base);
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
    ensure_hook(base);
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

fn gc(ui: &Ui, base: &Path, dry_run: bool, prune: Option<std::time::Duration>, json: bool) -> Result<()> {
    let git = git_filter::discover(base)?;
    let mut store = git_filter::with_env_lock_timeout(git_filter::open_store(&git)?)?;
    store.set_progress(std::sync::Arc::new(crate::cli::ui::BarProgress::new(ui)));
    // The live set is read under the store's writer lock: no file stored meanwhile is missed.
    let mut users = git_filter::LiveSet::default();
    let mut r = store.gc_keeping_with(
        || {
            users = git_filter::live_set(&git, &store, dry_run)?;
            Ok::<_, anyhow::Error>(std::mem::take(&mut users.manifests))
        },
        &prune.map(|grace| ckpt::repo::GcOptions { grace }).unwrap_or_else(|| store.gc_options()),
        dry_run,
    )?;
    r.repositories = users.repositories.iter().map(|p| p.display().to_string()).collect();
    r.pruned = users.pruned.iter().map(|p| p.display().to_string()).collect();
    let secs = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    r.missing = users
        .missing
        .iter()
        .map(|m| ckpt::repo::MissingRepository {
            path: m.path.display().to_string(),
            missing_since: secs(m.since),
            forgotten_after: secs(m.forgotten_after),
        })
        .collect();
    r.kept_for_missing = users.kept_for_missing;
    if !json {
        for p in &r.pruned {
            eprintln!(
                "{} {p}: it no longer uses this store, or was missing for {} days",
                if dry_run { "would forget" } else { "forgot" },
                git_filter::MISSING_USER_GRACE.as_secs() / 86400
            );
        }
        for m in &r.missing {
            eprintln!(
                "{}: this registered repository is missing since {} (moved, deleted, or on a disk not mounted?); \
                 kept every file the store holds for it ({} not reached from the repositories found) until {}. \
                 If it was deleted or moved, run `ckpt git forget {}` (a moved one registers again at its new \
                 place when ckpt next runs in it)",
                printable(&m.path),
                format_time(m.missing_since as i64),
                r.kept_for_missing,
                format_time(m.forgotten_after as i64),
                printable(&m.path),
            );
        }
        if r.repositories.len() > 1 {
            eprintln!("the store is shared: kept what {} git repositories reach", r.repositories.len());
        }
    }
    if json {
        crate::cli::ui::print_json(&r)?;
    } else {
        outln!(
            "{} files reachable from git ({} not in the store); kept {} objects, {} {} ({})",
            r.files_kept + r.files_missing,
            r.files_missing,
            r.kept,
            if dry_run { "would delete" } else { "deleted" },
            r.deleted,
            crate::cli::ui::bytes(r.bytes_freed)
        )?;
        if r.recent > 0 {
            outln!("kept {} unreachable objects younger than the grace period (--prune=now deletes them)", r.recent)?;
        }
    }
    Ok(())
}

fn pre_push(ui: &Ui, base: &Path, remote_name: &str, url: Option<&str>, json: bool) -> Result<()> {
    let git = git_filter::discover(base)?;
    let refs = ckpt_remote::parse_pushed_refs(std::io::stdin().lock())?;
    let pointers = ckpt_remote::pushed_pointers(&git, &refs)?;
    let Some(remote_url) = ckpt_remote::remote_url(&git)? else {
        if !pointers.is_empty() {
            eprintln!(
                "ckpt: no ckpt remote configured (git config ckpt.remote URL, or ckpt.remote in .ckptconfig): \
                 the weights of {} pushed file(s) stay in this machine's store only",
                pointers.len()
            );
        }
        return Ok(());
    };
    if pointers.is_empty() {
        return Ok(());
    }
    let mut store = git_filter::with_env_lock_timeout(git_filter::open_store(&git)?)?;
    store.set_progress(std::sync::Arc::new(crate::cli::ui::BarProgress::new(ui)));
    let remote = ckpt_remote::open_for_push(&remote_url.url)
        .with_context(|| format!("opening the ckpt remote {} (from {})", remote_url.url, remote_url.source))?;
    // git runs the hook with the remote's name, or its URL when pushing to one unnamed.
    let previous = ckpt_remote::previous_files(&git, &refs, Some(remote_name), &pointers)?;
    let layout = ckpt_remote::layout(&git)?;
    let report =
        ckpt_remote::push_pointers(&store, remote.as_ref(), &pointers, &previous, layout).with_context(|| {
            format!(
                "uploading weights to the ckpt remote {} (from {}) before pushing to {remote_name}{}",
                remote_url.url,
                remote_url.source,
                url.map(|u| format!(" ({u})")).unwrap_or_default()
            )
        })?;
    if json {
        crate::cli::ui::print_json(&report)?;
    } else {
        let t = &report.transfer;
        eprintln!(
            "ckpt: {} weight file(s) in the pushed commits; {} already on {}; uploaded {} objects ({})",
            t.files,
            t.files_present,
            t.remote,
            t.objects,
            crate::cli::ui::bytes(t.bytes)
        );
    }
    Ok(())
}

/// git's external diff: `PATH OLD-FILE OLD-HEX OLD-MODE NEW-FILE NEW-HEX NEW-MODE [NEW-PATH
/// INFO]`, or `PATH` alone for an unmerged path. A side that cannot be read is shown as a
/// message in the diff (and on stderr), so that `git log -p --ext-diff` goes on past a file
/// whose objects are gone.
fn diff_driver(base: &Path, args: &[String]) -> Result<()> {
    let path = &args[0];
    if args.len() == 1 {
        outln!("* Unmerged path {path}")?;
        return Ok(());
    }
    if args.len() < 7 {
        anyhow::bail!("ckpt git diff-driver: expected 1, 7 or 9 arguments from git, got {}", args.len());
    }
    let new_path = args.get(7).unwrap_or(path);
    let side = |file: &str| (file != "/dev/null").then(|| base.join(file));
    let (old, new) = (side(&args[1]), side(&args[4]));
    outln!("diff --ckpt a/{path} b/{new_path}")?;
    if args[2] != args[5] || args[3] != args[6] {
        outln!("index {}..{} {}", short(&args[2]), short(&args[5]), args[6])?;
    }
    let (filter, _) = open_filter(base)?;
    match git_filter::weight_diff::compare(&filter, old.as_deref(), new.as_deref()) {
        Ok(text) => outln!("{}", text.trim_end())?,
        Err(e) => {
            eprintln!("ckpt git diff-driver: {path}: {e}");
            outln!("ckpt: cannot compare {path}: {e}")?;
        }
    }
    Ok(())
}

fn short(hex: &str) -> &str {
    hex.get(..12).unwrap_or(hex)
}
