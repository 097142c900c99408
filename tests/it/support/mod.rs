//! Helpers shared by the integration tests (no tests here): the `ckpt` binary and synthetic
//! checkpoints (`util`, `repo_util`), remotes under test (`remote`, cloud emulators in `clouds`)
//! and what their stores hold (`layout`), a fault-injecting proxy (`proxy`), a git environment
//! (`git`), a small tmpfs (`tmpfs`), and [`skip`].

pub mod clouds;
pub mod git;
pub mod layout;
pub mod proxy;
pub mod remote;
pub mod repo_util;
pub mod tmpfs;
pub mod util;

use std::io::Write;

/// Reports that the calling test cannot run here (the caller then returns): a failure when the
/// environment variable `require` is set (CI sets it where the test can run), else a line
/// `SKIPPED: reason` on stderr. Written to the process's stderr directly, not through
/// `eprintln!`, which the test harness captures and shows only for failing tests.
#[track_caller]
pub fn skip(reason: &str, require: &str) {
    assert!(std::env::var_os(require).is_none(), "{require} is set, but this test cannot run: {reason}");
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {} ({reason}; {require}=1 makes this a failure)",
        std::thread::current().name().unwrap_or("a test")
    );
}
