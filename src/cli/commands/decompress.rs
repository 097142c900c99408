//! `ckpt decompress INPUT -o OUTPUT`.

use crate::cli::ui::{map_file, write_atomically, Ui};
use crate::file_codec;
use anyhow::{Context, Result};
use std::path::PathBuf;

/// Arguments of `ckpt decompress`.
#[derive(clap::Args, Debug)]
pub struct DecompressArgs {
    /// Container written by `ckpt compress`.
    input: PathBuf,
    /// Where to write the original (default: INPUT without its .ckz suffix).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// Runs `ckpt decompress`.
pub fn run(_ui: &Ui, args: DecompressArgs) -> Result<()> {
    let output = match args.output {
        Some(o) => o,
        None => {
            anyhow::ensure!(
                args.input.extension().is_some_and(|e| e == "ckz"),
                "{}: name the output with -o (the input does not end in .ckz)",
                args.input.display()
            );
            args.input.with_extension("")
        }
    };
    let input = map_file(&args.input)?;
    write_atomically(&output, |w| {
        file_codec::decompress(&input, w).with_context(|| format!("{}", args.input.display()))
    })?;
    Ok(())
}
