//! `ckpt compress INPUT -o OUTPUT`.

use crate::cli::ui::{map_file, write_atomically, Ui};
use anyhow::{Context, Result};
use ckpt::codec::Options;
use ckpt::file_codec::{self, Format};
use std::path::PathBuf;

/// Arguments of `ckpt compress`.
#[derive(clap::Args, Debug)]
pub struct CompressArgs {
    /// File to compress.
    input: PathBuf,
    /// Where to write the container (default: INPUT.ckz).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// How to read the input: safetensors (must be valid), bytes, or auto (safetensors if the
    /// name ends in .safetensors, else detected from the content).
    #[arg(long, default_value = "auto", value_parser = ["auto", "safetensors", "bytes"])]
    format: String,
    /// zstd level for groups coded with zstd.
    #[arg(long, default_value_t = Options::default().zstd_level)]
    zstd_level: i32,
    /// Chunk size in KiB: a power of two from 4 to 4096.
    #[arg(long, default_value_t = Options::default().chunk_size / 1024)]
    chunk_kib: usize,
    /// Compression level: default, or max (rANS with context on every byte group: smaller,
    /// slower to compress).
    #[arg(long, default_value = "default", value_parser = ["default", "max"])]
    level: String,
}

/// Runs `ckpt compress`.
pub fn run(ui: &Ui, args: CompressArgs) -> Result<()> {
    let input = map_file(&args.input)?;
    let format = match args.format.as_str() {
        "safetensors" => Format::Safetensors,
        "bytes" => Format::Bytes,
        _ if args.input.extension().is_some_and(|e| e == "safetensors") => Format::Safetensors,
        _ => Format::Detect,
    };
    let options = Options {
        zstd_level: args.zstd_level,
        chunk_size: args.chunk_kib.saturating_mul(1024),
        level: args.level.parse()?,
        ..Options::default()
    };
    let output = args.output.unwrap_or_else(|| {
        let mut name = args.input.clone().into_os_string();
        name.push(".ckz");
        PathBuf::from(name)
    });
    // Validate before creating any output file.
    let planned = file_codec::plan_segments(&input, format);
    input.check_unchanged()?;
    planned.with_context(|| format!("{}", args.input.display()))?;
    let bar = ui.bytes_bar(input.len() as u64, "compress");
    write_atomically(&output, |w| {
        // Off only for benchmarks (benches/duplicates.py): the container without copies and
        // derived tensors, from the same binary.
        let references = std::env::var_os("CKPT_REFERENCE_SEGMENTS").is_none_or(|v| v != "off");
        let coded =
            file_codec::compress_with(&input, format, &options, references, w, &mut |done| bar.set_position(done));
        // A file that shrank meanwhile read as zeros past its new end: say so (and write
        // nothing) rather than keep a container of bytes the file never held.
        input.check_unchanged()?;
        coded.map(|_| ()).with_context(|| format!("compressing {}", args.input.display()))
    })?;
    bar.finish_and_clear();
    Ok(())
}
