//! One module per command: `<Verb>Args` (clap) and `run`.

pub mod compress;
pub mod decompress;
pub mod stats;
