//! The integration test binary: one module per area.

mod cli_trust;
mod cli_trust2;
mod codec_cli;
mod dcp_cache;
mod dcp_read;
mod dcp_remote;
mod format_pin;
mod gc_grace;
mod gc_trust;
mod git_filter;
mod git_gc;
mod git_remote;
mod git_setup_trust;
mod git_store_trust;
mod git_xprec;

mod push_trust2;
mod refs_trust2;
mod remote;
mod remote_crash;
mod remote_faults;
mod remote_gc;
mod remote_layout;
mod remote_trust;
mod remote_trust2;
mod remote_wire;
mod repo_compact;
mod repo_crash;
mod repo_dcp;
mod repo_faults;
mod repo_history;
mod repo_inspect;
mod repo_model;
mod repo_prune;
mod repo_small;
mod repo_xprec;
mod report;

mod repo_torch;
mod repo_watch;
mod robustness;
mod support;
mod watch_trust;
mod worktree_safety;
mod worktree_trust2;
