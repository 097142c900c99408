//! The integration test binary: one module per area.

mod codec_cli;
mod remote;
mod repo_compact;
mod repo_crash;
mod repo_faults;
mod repo_history;
mod repo_inspect;
mod repo_model;
mod repo_util;
mod util;
