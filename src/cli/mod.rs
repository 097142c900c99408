//! The command-line interface: clap parsing, one file per command in `commands/`, shared output
//! helpers in `ui`. This is the only module that uses clap and anyhow.

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compress one file (safetensors tensor by tensor, anything else as bytes).
    Compress(commands::compress::CompressArgs),
    /// Decompress a container written by `ckpt compress`, verifying its hash.
    Decompress(commands::decompress::DecompressArgs),
    /// Show where the bytes of a file go: per dtype and byte group, methods, sizes, entropy.
    Stats(commands::stats::StatsArgs),
}

/// Runs the CLI and returns the process exit code: 0 on success (and on a closed stdout pipe),
/// 1 when the command failed.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let ui = ui::Ui::new(cli.quiet);
    let result = ui::thread_pool(cli.jobs).and_then(|pool| {
        pool.install(|| match cli.command {
            Command::Compress(args) => commands::compress::run(&ui, args),
            Command::Decompress(args) => commands::decompress::run(&ui, args),
            Command::Stats(args) => commands::stats::run(&ui, args),
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if ui::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
