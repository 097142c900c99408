//! One module per command: `<Verb>Args` (clap) and `run`.

pub mod branch;
pub mod checkout;
pub mod clone;
pub mod commit;
pub mod compact;
pub mod compress;
pub mod decompress;
pub mod diff;
pub mod fetch;
pub mod gc;
pub mod git;
pub mod index;
pub mod init;
pub mod log;
pub mod prune;
pub mod pull;
pub mod push;
pub mod remote;
pub mod rm;
pub mod show;
pub mod stats;
pub mod status;
pub mod switch;
pub mod tag;
pub mod verify;
pub mod watch;
