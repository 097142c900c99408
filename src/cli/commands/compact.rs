//! `ckpt compact`: rewrite the blobs of versions whose children are committed as deltas
//! against the children's (the second half of a `reverse` commit, which `ckpt commit` runs in
//! the background).

use crate::cli::ui::{bytes, open_repo, Ui};
use anyhow::Result;
use ckpt::repo::CompactOptions;
use std::path::Path;
use std::process::{Command, Stdio};

/// Arguments of `ckpt compact`.
#[derive(clap::Args, Debug)]
pub struct CompactArgs {
    /// Run as the background job `ckpt commit` starts: stop between two rewrites when another
    /// writer waits for the repository, and print nothing.
    #[arg(long, hide = true)]
    background: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt compact`.
pub fn run(ui: &Ui, base: &Path, args: CompactArgs) -> Result<()> {
    let repo = open_repo(ui, base)?;
    let r = repo.compact(&CompactOptions { yield_to_writers: args.background });
    if args.background {
        // Its stderr is `.ckpt/compact.log`, where the library has recorded a failed
        // compaction already; other errors (the lock not free in time) are printed there.
        return match r {
            Err(ckpt::repo::Error::CompactionFailed { .. }) | Ok(_) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    let r = r?;
    if args.json {
        crate::cli::ui::print_json(&r)?;
    } else if r.versions == 0 && r.pending == 0 {
        outln!("nothing to compact")?;
    } else {
        outln!(
            "{} version{} compacted: {} blob{} of their parents rewritten as deltas ({} -> {}){}",
            r.versions,
            if r.versions == 1 { "" } else { "s" },
            r.rewritten,
            if r.rewritten == 1 { "" } else { "s" },
            bytes(r.bytes_before),
            bytes(r.bytes_after),
            if r.pending > 0 { format!("; {} still pending", r.pending) } else { String::new() }
        )?;
    }
    Ok(())
}

/// Starts `ckpt compact --background` for the repository at `root` in a process of its own, not
/// waited for (git runs `gc --auto` after a commit the same way). Its own process group keeps a
/// Ctrl-C meant for the command that started it from killing it; it runs at nice 10, so that it
/// takes the cores the training loop leaves idle rather than slowing the loop down; its errors go
/// are appended to `.ckpt/compact.log`.
pub fn start_in_background(root: &Path) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    // Appended to, not truncated: failures recorded there stay until a compaction leaves
    // nothing pending (which empties it), so `ckpt status` shows them meanwhile.
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(root.join(ckpt::repo::DIR_NAME).join(ckpt::repo::COMPACTION_LOG))?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("-C")
        .arg(root)
        .args(["--quiet", "compact", "--background"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0);
    // SAFETY: runs in the forked child before exec, where only async-signal-safe calls are
    // allowed; setpriority is a plain system call. Every thread the child starts inherits the
    // priority. A failure only leaves the default priority.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE);
            Ok(())
        });
    }
    command.spawn().map(drop)
}

/// Nice value of the background compaction.
const BACKGROUND_NICE: libc::c_int = 10;
