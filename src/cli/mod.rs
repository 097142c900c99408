//! The command-line interface: clap parsing, one file per command in `commands/`, shared output
//! helpers in `ui`. This is the only module that uses clap and anyhow.

/// `println!` that returns the write's error instead of panicking: a closed stdout (`ckpt log
/// | head -1`) must end the command quietly ([`ui::is_broken_pipe`]), and `println!` panics on
/// it (Rust ignores SIGPIPE, so the write fails with EPIPE).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod commands;
pub mod ui;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// ckpt: version control for machine-learning checkpoints.
#[derive(Parser, Debug)]
#[command(name = "ckpt", version, about, propagate_version = true)]
pub struct Cli {
    /// Hide progress bars (they are also hidden when stderr is not a terminal).
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', global = true)]
    pub jobs: Option<usize>,
    /// Run as if started in DIR (the repository is found from there; relative paths too).
    #[arg(short = 'C', global = true, value_name = "DIR")]
    pub dir: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compress one file (safetensors and torch.save tensor by tensor, anything else as bytes).
    Compress(commands::compress::CompressArgs),
    /// Decompress a container written by `ckpt compress`, verifying its hash.
    Decompress(commands::decompress::DecompressArgs),
    /// Show where the bytes of a file go: per dtype and byte group, methods, sizes, entropy.
    Stats(commands::stats::StatsArgs),
    /// Create a repository (.ckpt) in DIR or the current directory.
    Init(commands::init::InitArgs),
    /// Store files as a new version (safetensors and torch.save tensor by tensor, with deltas).
    Commit(commands::commit::CommitArgs),
    /// Write a version's files (all or some, whole or some tensors), verified by hash.
    Checkout(commands::checkout::CheckoutArgs),
    /// Show history, newest first.
    Log(commands::log::LogArgs),
    /// Show how a version is stored: per tensor base, delta or duplicate, bytes, method mix.
    Show(commands::show::ShowArgs),
    /// Compare two versions tensor by tensor: elements and bytes changed, max |Δ|.
    Diff(commands::diff::DiffArgs),
    /// Draw a run as one self-contained HTML page: the store over time, which layers moved.
    Report(commands::report::ReportArgs),
    /// Compare the working files with the current version.
    Status(commands::status::StatusArgs),
    /// Create a tag, or list tags.
    Tag(commands::tag::TagArgs),
    /// Create a branch, or list branches.
    Branch(commands::branch::BranchArgs),
    /// Switch to a branch and check out its files.
    Switch(commands::switch::SwitchArgs),
    /// Stop tracking files from the next version on.
    Rm(commands::rm::RmArgs),
    /// Delete objects no branch, tag or HEAD reaches.
    Gc(commands::gc::GcArgs),
    /// Keep the newest N versions of a branch, drop the rest of its history, free the space.
    Prune(commands::prune::PruneArgs),
    /// Rewrite the blobs of earlier versions as deltas against newer ones (commit starts this
    /// in the background).
    Compact(commands::compact::CompactArgs),
    /// Re-hash every object and version; exit 1 if anything is damaged.
    Verify(commands::verify::VerifyArgs),
    /// Maintain the index (a rebuildable cache).
    Index(commands::index::IndexArgs),
    /// Keep weight files in git: install the filter driver, track patterns, run the filter.
    Git(commands::git::GitArgs),

    /// Commit each checkpoint (file or folder) that appears in a directory, once it is finished.
    Watch(commands::watch::WatchArgs),

    /// List, add or remove remotes (a directory, s3://, gs:// or az://BUCKET/PREFIX).
    Remote(commands::remote::RemoteArgs),
    /// Send versions (and the objects they need) to a remote and move its refs.
    Push(commands::push::PushArgs),
    /// Receive a remote's versions (verified) and update refs/remotes/REMOTE/BRANCH.
    Fetch(commands::fetch::FetchArgs),
    /// Fetch, then fast-forward the current branch and check it out.
    Pull(commands::pull::PullArgs),
    /// Create a repository from a remote and check out its main branch.
    Clone(commands::clone::CloneArgs),
}

/// The directory commands run in: `-C DIR` (relative to the current directory) or the current
/// directory. Repository discovery and relative file arguments start here.
fn base_dir(dir: Option<&std::path::Path>) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    Ok(match dir {
        Some(d) => cwd.join(d),
        None => cwd,
    })
}

/// Runs the CLI and returns the process exit code: 0 on success (and on a closed stdout pipe),
/// 1 when the command failed, 130 when a signal stopped it (`ckpt gc --remote`).
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let ui = ui::Ui::new(cli.quiet);
    let result = base_dir(cli.dir.as_deref()).and_then(|base| {
        let base = base.as_path();
        ui::thread_pool(cli.jobs).and_then(|pool| {
            pool.install(|| match cli.command {
                Command::Compress(args) => commands::compress::run(&ui, args),
                Command::Decompress(args) => commands::decompress::run(&ui, args),
                Command::Stats(args) => commands::stats::run(&ui, args),
                Command::Init(args) => commands::init::run(&ui, base, args),
                Command::Commit(args) => commands::commit::run(&ui, base, args),
                Command::Checkout(args) => commands::checkout::run(&ui, base, args),
                Command::Log(args) => commands::log::run(&ui, base, args),
                Command::Show(args) => commands::show::run(&ui, base, args),
                Command::Diff(args) => commands::diff::run(&ui, base, args),
                Command::Report(args) => commands::report::run(&ui, base, args),
                Command::Status(args) => commands::status::run(&ui, base, args),
                Command::Tag(args) => commands::tag::run(&ui, base, args),
                Command::Branch(args) => commands::branch::run(&ui, base, args),
                Command::Switch(args) => commands::switch::run(&ui, base, args),
                Command::Rm(args) => commands::rm::run(&ui, base, args),
                Command::Gc(args) => commands::gc::run(&ui, base, args),
                Command::Prune(args) => commands::prune::run(&ui, base, args, cli.quiet),
                Command::Compact(args) => commands::compact::run(&ui, base, args),
                Command::Verify(args) => commands::verify::run(&ui, base, args),
                Command::Index(args) => commands::index::run(&ui, base, args),
                Command::Git(args) => commands::git::run(&ui, base, args),

                Command::Watch(args) => commands::watch::run(&ui, base, args),

                Command::Remote(args) => commands::remote::run(&ui, base, args),
                Command::Push(args) => commands::push::run(&ui, base, args),
                Command::Fetch(args) => commands::fetch::run(&ui, base, args),
                Command::Pull(args) => commands::pull::run(&ui, base, args),
                Command::Clone(args) => commands::clone::run(&ui, base, args),
            })
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if ui::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Paths, names and messages in an error can come from a remote's versions.
            eprintln!("error: {}", ui::printable_text(&error_message(&e)));
            match e.downcast_ref() {
                // As a shell reports a command ended by Ctrl-C.
                Some(ckpt::sync::Error::RemoteGcInterrupted { .. }) => ExitCode::from(130),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// The error and its causes on one line, each cause once: the library's errors already quote
/// their source in their message (`opening FILE: No such file…`), which anyhow's `{:#}` would
/// repeat.
fn error_message(e: &anyhow::Error) -> String {
    let mut message = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}
