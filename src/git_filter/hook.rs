//! The `pre-push` hook that uploads the weights of pushed commits to the ckpt remote, and how
//! it shares the hook file with other tools (docs/architecture.md, "Installing the git driver").
//!
//! git runs one `pre-push` file and gives it the pushed refs once, on stdin. ckpt's part is a
//! delimited block placed first in that file: it saves stdin to a temporary file, runs `ckpt
//! git pre-push` on it (the push fails if that fails), then makes the saved copy the stdin of
//! the rest of the script. So whatever follows (another tool's lines, Git LFS's, added before
//! or after ckpt's) reads the same refs, and either failing fails the push. ckpt never
//! overwrites a hook it did not write: it inserts its block after the `#!` line of a shell
//! script, and refuses (naming the file) a hook in another language.
//!
//! Git LFS's installer refuses a hook it did not write, and its filter (which installs its
//! hooks lazily, as ckpt's does) then silently skips it. So a hook ckpt writes itself also runs
//! `git lfs pre-push` when Git LFS is configured, as LFS's own hook would; and ckpt's filter
//! re-inserts its block whenever it runs and finds it gone (after `git lfs update --force`, say).

use super::{Error, Result};
use std::path::{Path, PathBuf};

/// The line that opens ckpt's block in a hook.
pub const BEGIN: &str = "# >>> ckpt pre-push (managed by `ckpt git install`; keep this block first) >>>";
/// The line that closes ckpt's block.
pub const END: &str = "# <<< ckpt pre-push <<<";

/// ckpt's block, between [`BEGIN`] and [`END`]: refs saved once, handed to ckpt, then to the
/// rest of the script as its stdin.
const BLOCK_BODY: &str = "\
# Uploads the weights of the pushed commits to the ckpt remote (git config ckpt.remote, or
# .ckptconfig). git's list of pushed refs is read once, given to ckpt, then to the rest of
# this script as its stdin; the push fails if ckpt fails.
ckpt_refs=$(mktemp \"${TMPDIR:-/tmp}/ckpt-pre-push.XXXXXX\") || exit 1
cat >\"$ckpt_refs\" || { rm -f \"$ckpt_refs\"; exit 1; }
if ! command -v ckpt >/dev/null 2>&1; then
    rm -f \"$ckpt_refs\"
    echo >&2 \"ckpt pre-push hook: ckpt is not on PATH; install it, or remove ckpt's block from $0 to push without the weights\"
    exit 2
fi
ckpt git pre-push \"$@\" <\"$ckpt_refs\" || { ckpt_status=$?; rm -f \"$ckpt_refs\"; exit \"$ckpt_status\"; }
# Two reads of the refs: stdin for the rest of the script, fd 9 for the Git LFS lines ckpt adds.
exec <\"$ckpt_refs\" 9<\"$ckpt_refs\"
rm -f \"$ckpt_refs\" 2>/dev/null
unset ckpt_refs
";

/// Lines a hook ckpt writes itself ends with when Git LFS is configured. LFS reads its own
/// copy of the refs (fd 9, opened by ckpt's block), so lines added after these still get them.
const LFS_LINES: &str = "\
# Git LFS is configured: its pre-push runs here too (its installer leaves a hook it did not
# write alone, so it would not add itself here).
command -v git-lfs >/dev/null 2>&1 || { echo >&2 \"pre-push hook: Git LFS is configured but git-lfs is not on PATH; install it, or delete these lines from $0\"; exit 2; }
git lfs pre-push \"$@\" <&9
";

/// [`LFS_LINES`] without ckpt's block before them (what `uninstall` leaves): LFS reads stdin.
const LFS_LINES_ALONE: &str = "\
command -v git-lfs >/dev/null 2>&1 || { echo >&2 \"pre-push hook: Git LFS is configured but git-lfs is not on PATH; install it, or delete these lines from $0\"; exit 2; }
git lfs pre-push \"$@\"
";

/// The hook ckpt 0.x wrote before hooks were chained; replaced as a whole when found.
const LEGACY_MARKER: &str = "#!/bin/sh\n# ckpt pre-push hook";

fn block() -> String {
    format!("{BEGIN}\n{BLOCK_BODY}{END}\n")
}

/// The whole hook ckpt writes where there is none, with Git LFS's part if `lfs`.
pub(crate) fn own_hook(lfs: bool) -> String {
    let mut s = format!("#!/bin/sh\n{}", block());
    if lfs {
        s.push_str(LFS_LINES);
    }
    s
}

/// Where git looks for hooks: `core.hooksPath` (relative to the working tree), else `hooks/`
/// in the common git directory.
pub(crate) fn hooks_dir(git: &git2::Repository) -> Result<PathBuf> {
    let config = git.config().map_err(super::git("reading git config"))?;
    if let Ok(p) = config.get_path("core.hooksPath") {
        return Ok(git.workdir().unwrap_or_else(|| git.path()).join(p));
    }
    Ok(git.commondir().join("hooks"))
}

/// Whether Git LFS's filter is configured for `git`, as git itself reads its config (so
/// `GIT_CONFIG_NOSYSTEM` and `GIT_CONFIG_GLOBAL` count as they do for git).
fn lfs_configured(git: &git2::Repository) -> bool {
    let dir = git.workdir().unwrap_or_else(|| git.path());
    std::process::Command::new("git")
        .args(["config", "--get-regexp", r"^filter\.lfs\.(process|clean)$"])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.trim_ascii().is_empty())
}

/// What [`install`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookInstall {
    /// There was no hook: ckpt's was written.
    Written(PathBuf),
    /// Another tool's hook was there: ckpt's block was put first in it.
    Chained(PathBuf),
    /// ckpt's block was there, out of date or not first: it was rewritten.
    Updated(PathBuf),
    /// ckpt's block was there, current and first.
    Present(PathBuf),
}

impl HookInstall {
    /// The hook file.
    pub fn path(&self) -> &Path {
        match self {
            HookInstall::Written(p) | HookInstall::Chained(p) | HookInstall::Updated(p) | HookInstall::Present(p) => p,
        }
    }
}

/// The hook's interpreter from its `#!` line (basename, through `env`); `None` without one.
fn interpreter(first_line: &str) -> Option<String> {
    let rest = first_line.strip_prefix("#!")?;
    let mut words = rest.split_whitespace();
    let mut program = words.next()?.rsplit('/').next()?.to_string();
    if program == "env" {
        program = words.find(|w| !w.starts_with('-'))?.rsplit('/').next()?.to_string();
    }
    Some(program)
}

fn is_shell(program: &str) -> bool {
    matches!(program, "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" | "busybox")
}

/// A call of ckpt's hook command written by hand (as earlier versions advised): with ckpt's
/// block first, it would run a second time, so it is removed when the block goes in.
fn is_hand_chained_call(line: &str) -> bool {
    let t = line.trim_start();
    let t = t.strip_prefix("exec ").unwrap_or(t).trim_start();
    t.starts_with("ckpt git pre-push")
}

/// `text` without ckpt's block (every copy of it) and without hand-written calls of ckpt's
/// hook command; also whether a block was found.
fn strip_ckpt(text: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    let mut found = false;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == BEGIN {
            inside = true;
            found = true;
            continue;
        }
        if inside {
            if bare == END {
                inside = false;
            }
            continue;
        }
        if is_hand_chained_call(bare) {
            continue;
        }
        out.push_str(line);
    }
    (out, found)
}

/// The hook with ckpt's block first: after the `#!` line (or at the top without one). Errors
/// for a hook that is not a shell script.
fn with_block(path: &Path, existing: &str) -> Result<String> {
    let (rest, _) = strip_ckpt(existing);
    let (first, body) = match rest.split_once('\n') {
        Some((first, body)) if first.starts_with("#!") => (Some(first), body),
        _ if rest.starts_with("#!") => (Some(rest.as_str()), ""),
        _ => (None, rest.as_str()),
    };
    if let Some(first) = first {
        let program = interpreter(first).unwrap_or_default();
        if !is_shell(&program) {
            return Err(Error::HookNotShell { path: path.to_path_buf(), interpreter: program });
        }
    }
    let mut out = String::new();
    if let Some(first) = first {
        out.push_str(first);
        out.push('\n');
    }
    out.push_str(&block());
    out.push_str(body);
    Ok(out)
}

/// Installs ckpt's part of the `pre-push` hook (see the module documentation): writes the hook
/// where there is none, puts ckpt's block first in another tool's shell hook, brings an old
/// block up to date. A hook that is not a shell script is left alone: an error naming it.
pub fn install(git: &git2::Repository) -> Result<HookInstall> {
    let dir = hooks_dir(git)?;
    let path = dir.join("pre-push");
    let lfs = lfs_configured(git);
    let existing = match std::fs::read(&path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(Error::Io { action: "reading", path, source }),
    };
    let Some(existing) = existing else {
        write_hook(&dir, &path, &own_hook(lfs), None)?;
        return Ok(HookInstall::Written(path));
    };
    let Ok(text) = String::from_utf8(existing) else {
        return Err(Error::HookNotShell { path, interpreter: "(not UTF-8 text)".into() });
    };
    // A hook ckpt wrote whole (now or in an earlier version) is ckpt's to rewrite: it gets Git
    // LFS's lines exactly when LFS is configured.
    if text == own_hook(false) || text == own_hook(true) || text.starts_with(LEGACY_MARKER) {
        let want = own_hook(lfs);
        if text == want {
            return Ok(HookInstall::Present(path));
        }
        write_hook(&dir, &path, &want, None)?;
        return Ok(HookInstall::Updated(path));
    }
    let (_, had_block) = strip_ckpt(&text);
    let want = with_block(&path, &text)?;
    if want == text {
        return Ok(HookInstall::Present(path));
    }
    let mode = existing_mode(&path);
    write_hook(&dir, &path, &want, mode)?;
    Ok(if had_block { HookInstall::Updated(path) } else { HookInstall::Chained(path) })
}

/// Removes ckpt's part of the `pre-push` hook: the file if nothing else is left in it, else
/// ckpt's block only. Returns whether anything was removed.
pub fn uninstall(git: &git2::Repository) -> Result<bool> {
    let dir = hooks_dir(git)?;
    let path = dir.join("pre-push");
    let text = match std::fs::read(&path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(_) => return Ok(false),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(Error::Io { action: "reading", path, source }),
    };
    match without_ckpt(&text) {
        None => Ok(false),
        Some(None) => {
            std::fs::remove_file(&path).map_err(|source| Error::Io { action: "removing", path, source })?;
            Ok(true)
        }
        Some(Some(rest)) => {
            let mode = existing_mode(&path);
            write_hook(&dir, &path, &rest, mode)?;
            Ok(true)
        }
    }
}

/// The hook `text` without ckpt's part: `None` if it has none, `Some(None)` if nothing else is
/// left (the file goes), else what is left.
fn without_ckpt(text: &str) -> Option<Option<String>> {
    let whole = text == own_hook(false) || text.starts_with(LEGACY_MARKER);
    let (rest, had_block) = strip_ckpt(text);
    if !whole && !had_block && rest == text {
        return None;
    }
    // ckpt's Git LFS lines read fd 9, which only ckpt's block opens.
    let rest = rest.replace(LFS_LINES, LFS_LINES_ALONE);
    let only_shebang = rest.lines().all(|l| l.trim().is_empty() || l.starts_with("#!"));
    Some((!whole && !only_shebang).then_some(rest))
}

#[cfg(unix)]
fn existing_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

#[cfg(not(unix))]
fn existing_mode(_path: &Path) -> Option<u32> {
    None
}

/// Writes `text` to the hook at `path` (temporary file + rename: git never runs half a hook),
/// executable (`mode`, or 0755; the owner's execute bit always set).
fn write_hook(dir: &Path, path: &Path, text: &str, mode: Option<u32>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { action: "creating", path: dir.to_path_buf(), source })?;
    let tmp = tempfile::Builder::new().prefix(".pre-push.ckpt-").tempfile_in(dir).map_err(|source| Error::Io {
        action: "creating a file in",
        path: dir.to_path_buf(),
        source,
    })?;
    std::fs::write(tmp.path(), text).map_err(|source| Error::Io {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = mode.unwrap_or(0o755) | 0o100;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)).map_err(|source| Error::Io {
            action: "making executable",
            path: path.to_path_buf(),
            source,
        })?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    tmp.persist(path).map_err(|e| Error::Io { action: "writing", path: path.to_path_buf(), source: e.error })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_goes_first_after_the_shebang_and_replaces_hand_written_calls() {
        let p = Path::new("pre-push");
        let foreign = "#!/usr/bin/env bash\nset -e\nckpt git pre-push \"$@\" || exit 1\nother-tool pre-push \"$@\"\n";
        let out = with_block(p, foreign).unwrap();
        assert_eq!(out, format!("#!/usr/bin/env bash\n{}set -e\nother-tool pre-push \"$@\"\n", block()));
        // Idempotent: a second pass changes nothing.
        assert_eq!(with_block(p, &out).unwrap(), out);
        // A block that drifted below other lines moves back to the top.
        let drifted = format!("#!/bin/sh\nother-tool pre-push \"$@\"\n{}", block());
        assert_eq!(with_block(p, &drifted).unwrap(), format!("#!/bin/sh\n{}other-tool pre-push \"$@\"\n", block()));
        // No shebang: git runs it with sh.
        assert_eq!(with_block(p, "other\n").unwrap(), format!("{}other\n", block()));
    }

    #[test]
    fn a_hook_in_another_language_is_refused() {
        for first in ["#!/usr/bin/env python3", "#!/usr/bin/node", "#!/usr/bin/env -S ruby -w"] {
            let e = with_block(Path::new("h"), &format!("{first}\nprint(1)\n")).unwrap_err();
            assert!(matches!(e, Error::HookNotShell { .. }), "{first}: {e}");
        }
        for first in ["#!/bin/sh", "#!/bin/bash -e", "#! /usr/bin/env zsh", "#!/usr/bin/env -S bash"] {
            with_block(Path::new("h"), &format!("{first}\necho\n")).unwrap();
        }
    }

    #[test]
    fn uninstalling_leaves_other_lines_and_git_lfs_working() {
        assert_eq!(without_ckpt(&own_hook(false)), Some(None));
        assert_eq!(without_ckpt("#!/bin/sh\nother\n"), None);
        // ckpt's Git LFS lines stay, reading stdin again (fd 9 is gone with the block).
        assert_eq!(without_ckpt(&own_hook(true)), Some(Some(format!("#!/bin/sh\n{LFS_LINES_ALONE}"))));
        let chained = with_block(Path::new("h"), "#!/bin/bash\nother \"$@\"\n").unwrap();
        assert_eq!(without_ckpt(&chained), Some(Some("#!/bin/bash\nother \"$@\"\n".to_string())));
        assert_eq!(without_ckpt(&format!("{LEGACY_MARKER}: old\nexec ckpt git pre-push \"$@\"\n")), Some(None));
    }

    #[test]
    fn stripping_removes_only_ckpt_s_lines() {
        let text = format!("#!/bin/sh\n{}a\n  exec ckpt git pre-push \"$@\"\nb\n", block());
        assert_eq!(strip_ckpt(&text), ("#!/bin/sh\na\nb\n".to_string(), true));
    }
}
