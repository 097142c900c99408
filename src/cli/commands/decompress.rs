//! `ckpt decompress INPUT -o OUTPUT`.

use crate::cli::ui::{map_file, write_atomically, Ui};
use anyhow::{Context, Result};
use ckpt::codec::container::Container;
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
pub fn run(ui: &Ui, args: DecompressArgs) -> Result<()> {
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
    // Open (and check header and index) before creating the output file.
    let container = Container::open(&input);
    input.check_unchanged()?;
    let container = container.with_context(|| format!("{}", args.input.display()))?;
    let bar = ui.bytes_bar(container.original_len(), "decompress");
    write_atomically(&output, |w| {
        let decoded = container.decode_to_reporting(None, w, &mut |done| bar.set_position(done));
        input.check_unchanged()?;
        decoded.with_context(|| format!("{}", args.input.display()))
    })?;
    bar.finish_and_clear();
    Ok(())
}
